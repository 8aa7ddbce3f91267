//! K1 note 3 (step 125, the cable probe) as a pure decision: every variant of the cable bed
//! — a link, a QSFP's two addresses as one machine, a crossed cable, a missing cable, a cable
//! looped between node0's own ports, a LAN in a QSFP port, a login failure, a self-pair, a
//! silent port — and the numbering kept once recorded. The same variants run on real
//! containers in `crates/byo-agent/tests/it/cabled.rs`.

use std::collections::BTreeMap;

use byo_core::probe::{
    Decision, Found, Login, Machine, Observation, PortSeen, PortVerdict, Retry, decide, judge_port,
    scoped, self_pair,
};
use byo_core::redeem::{self, Rejection};
use byo_wire::enroll::{EnrollRequest, NodeReport, RailPort};
use byo_wire::peers::PeerFile;
use byo_wire::profile::ProfilePlan;

const P0: &str = "enp1s0f0np0";
const P1: &str = "enP2p1s0f0np0";

fn report(hw: &str, ports: &[&str]) -> NodeReport {
    NodeReport {
        gpu_model: Some("GB10".into()),
        gpu_count: Some(1),
        gpu_mem_mib: Some(122_880),
        arch: Some("aarch64".into()),
        machine_id: Some("cloned-machine-id".into()),
        hardware_id: Some(hw.into()),
        rails: ports
            .iter()
            .map(|p| RailPort {
                iface: (*p).into(),
                mtu: Some(1500),
                ..RailPort::default()
            })
            .collect(),
        ..NodeReport::default()
    }
}

fn machine(hw: &str, ports: &[(&str, &[&str])]) -> Machine {
    Machine {
        report: report(hw, &ports.iter().map(|(p, _)| *p).collect::<Vec<_>>()),
        host_key: format!("ssh-ed25519 KEY-{hw}"),
        mgmt_addr: Some(format!("10.0.0.{}", hw.len())),
        ports: ports
            .iter()
            .map(|(p, a)| ((*p).to_owned(), a.iter().map(|s| (*s).to_owned()).collect()))
            .collect(),
        heard: Vec::new(),
    }
}

fn port(iface: &str, answered: &[&str]) -> PortSeen {
    PortSeen {
        iface: iface.into(),
        device: Some(format!("roce-{iface}")),
        mtu: Some(1500),
        active_mtu: None,
        carrier: true,
        answered: answered.iter().map(|s| (*s).to_owned()).collect(),
    }
}

/// node0 (hardware "node0") with its two rails at fe80::a0 and fe80::a1, each port also
/// hearing itself, as the all-nodes multicast does.
fn node0(ports: Vec<PortSeen>, logins: Vec<(&str, &str, Login)>) -> Observation {
    let own = vec![
        (P0.to_owned(), "fe80::a0".to_owned()),
        (P1.to_owned(), "fe80::a1".to_owned()),
        ("eth0".to_owned(), "fe80::e0".to_owned()),
    ];
    let ports = ports
        .into_iter()
        .map(|mut p| {
            let me = own.iter().find(|(i, _)| *i == p.iface).unwrap().1.clone();
            p.answered.push(me);
            p
        })
        .collect();
    Observation {
        hardware_id: "node0".into(),
        ports,
        own,
        logins: logins
            .into_iter()
            .map(|(a, i, l)| (scoped(a, i), l))
            .collect::<BTreeMap<_, _>>(),
        beyond: Vec::new(),
    }
}

fn found(d: Decision) -> Found {
    match d {
        Decision::Enroll(f) => f,
        Decision::Retry { retry, verdicts } => panic!("a retry: {retry} ({verdicts:?})"),
    }
}

fn verdict(f: &[(String, PortVerdict)], iface: &str) -> PortVerdict {
    f.iter().find(|(i, _)| i == iface).unwrap().1.clone()
}

fn pair_plan() -> ProfilePlan {
    serde_json::from_value(serde_json::json!({
        "node_count": 2, "gpu_model": "GB10", "gpu_count": 1, "arch": "aarch64",
        "rails": [
            {"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000},
            {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000}
        ]
    }))
    .unwrap()
}

fn evidence(f: &Found) -> EnrollRequest {
    let mut node = report("node0", &[]);
    node.rails = f.rails.clone();
    EnrollRequest {
        node,
        peers: f.peers.clone(),
    }
}

/// node1 with the two functions of each QSFP: f0 and its enP2 twin per cable.
fn node1() -> Machine {
    machine(
        "node1",
        &[
            ("enp1s0f0np0", &["fe80::10"]),
            ("enP2p1s0f0np0", &["fe80::11"]),
            ("enp1s0f1np1", &["fe80::12"]),
            ("enP2p1s0f1np1", &["fe80::13"]),
        ],
    )
}

#[test]
fn k1_125_a_cable_showing_two_addresses_is_one_machine_and_the_pair_enrols() {
    // Each cable shows node1's two PCIe functions; node0 logs in through one address per
    // cable and counts one machine per port.
    let obs = node0(
        vec![
            port(P0, &["fe80::10", "fe80::11"]),
            port(P1, &["fe80::12", "fe80::13"]),
        ],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(node1()))),
            ("fe80::12", P1, Login::Machine(Box::new(node1()))),
        ],
    );
    let f = found(decide(&obs, &[0, 1], None));
    // Ports in name order: enP2… sorts before enp1…; the rails follow that order once.
    assert_eq!(
        verdict(&f.verdicts, P0),
        PortVerdict::Link {
            hardware_id: "node1".into(),
            remote: vec!["enp1s0f0np0".into(), "enP2p1s0f0np0".into()],
            addr: scoped("fe80::10", P0),
        }
    );
    let rails: Vec<(String, u32, Option<u32>)> = f
        .rails
        .iter()
        .map(|r| (r.iface.clone(), r.neighbours_discovered, r.index))
        .collect();
    assert_eq!(
        rails,
        vec![(P1.into(), 1, Some(0)), (P0.into(), 1, Some(1))]
    );
    assert_eq!(f.peers.len(), 1);
    assert_eq!(f.peers[0].node_index, 1);
    assert_eq!(f.peer_file.peers.len(), 1);
    let p = &f.peer_file.peers[0];
    assert_eq!(p.index, 1);
    assert_eq!(p.host_key, "ssh-ed25519 KEY-node1");
    assert_eq!(p.addr.as_deref(), Some("fe80::12%enP2p1s0f0np0"));
    let links: Vec<(u32, Option<&str>, &str)> = p
        .links
        .iter()
        .map(|l| (l.index, l.local.as_deref(), l.remote.as_str()))
        .collect();
    // The crossed cable is a recorded fact: node0's enP2…f0 lands on node1's enp1s0f1np1.
    assert_eq!(
        links,
        vec![(0, Some(P1), "enp1s0f1np1"), (1, Some(P0), "enp1s0f0np0")]
    );
    // Every address node1 showed is recorded as node1's: what the heartbeat groups by (133).
    assert_eq!(
        p.link_local,
        ["fe80::10", "fe80::11", "fe80::12", "fe80::13"]
    );
    // node1's own rails carry the same rails on its own ports.
    let peer_rails: Vec<(String, Option<u32>)> = f.peers[0]
        .rails
        .iter()
        .map(|r| (r.iface.clone(), r.index))
        .collect();
    assert!(peer_rails.contains(&("enp1s0f1np1".into(), Some(0))));
    assert!(peer_rails.contains(&("enp1s0f0np0".into(), Some(1))));
    assert!(peer_rails.contains(&("enP2p1s0f1np1".into(), None)));
    // And redeem accepts exactly this evidence, writing node1 at index 1.
    let rows = redeem::judge(&pair_plan(), &evidence(&f)).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].index, 1);
    assert_eq!(rows[1].rails["enp1s0f1np1"]["address"], "192.168.100.11/24");
    assert_eq!(rows[0].rails[P1]["address"], "192.168.100.10/24");
}

#[test]
fn k1_125_the_numbering_is_kept_from_peer_json_not_rederived_from_port_order() {
    let obs = node0(
        vec![port(P0, &["fe80::10"]), port(P1, &["fe80::12"])],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(node1()))),
            ("fe80::12", P1, Login::Machine(Box::new(node1()))),
        ],
    );
    let first = found(decide(&obs, &[0, 1], None));
    // An earlier run numbered them the other way round: that numbering stands.
    let mut kept: PeerFile = first.peer_file.clone();
    for l in &mut kept.peers[0].links {
        l.index = 1 - l.index;
    }
    kept.peers[0].index = 1;
    let again = found(decide(&obs, &[0, 1], Some(&kept)));
    let idx = |f: &Found, i: &str| f.rails.iter().find(|r| r.iface == i).unwrap().index;
    assert_eq!(idx(&first, P1), Some(0));
    assert_eq!(idx(&again, P1), Some(1));
    assert_eq!(idx(&again, P0), Some(0));
    // Without a record, the same facts number the same way every time.
    assert_eq!(found(decide(&obs, &[0, 1], None)), first);
}

#[test]
fn k1_125_a_kept_node_index_stays_with_its_machine() {
    let other = machine("aaa", &[("enp1s0f0np0", &["fe80::20"])]);
    let obs = node0(
        vec![port(P0, &["fe80::10"]), port(P1, &["fe80::20"])],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(node1()))),
            ("fe80::20", P1, Login::Machine(Box::new(other.clone()))),
        ],
    );
    // By hardware_id, "aaa" sorts first and is node 1.
    let f = found(decide(&obs, &[0, 1], None));
    let idx = |f: &Found, hw: &str| {
        f.peers
            .iter()
            .find(|p| p.hardware_id.as_deref() == Some(hw))
            .unwrap()
            .node_index
    };
    assert_eq!((idx(&f, "aaa"), idx(&f, "node1")), (1, 2));
    // A record pinning node1 at index 1 keeps it there; the newcomer takes the next free one.
    let kept = PeerFile {
        peers: vec![byo_wire::peers::Peer {
            index: 1,
            addr: None,
            mgmt_addr: None,
            host_key: node1().host_key,
            links: Vec::new(),
            link_local: Vec::new(),
        }],
    };
    let f = found(decide(&obs, &[0, 1], Some(&kept)));
    assert_eq!((idx(&f, "node1"), idx(&f, "aaa")), (1, 2));
    // Two machines on a pair's cables: redeem refuses more machines than satellites.
    assert_eq!(
        redeem::judge(&pair_plan(), &evidence(&f)),
        Err(Rejection::WrongPeerCount {
            expected: 1,
            found: 2
        })
    );
}

#[test]
fn k1_125_a_missing_cable_leaves_one_rail_and_the_pair_still_enrols() {
    let mut silent = port(P1, &[]);
    silent.carrier = false;
    let obs = node0(
        vec![port(P0, &["fe80::10"]), silent],
        vec![("fe80::10", P0, Login::Machine(Box::new(node1())))],
    );
    let f = found(decide(&obs, &[0, 1], None));
    assert_eq!(verdict(&f.verdicts, P1), PortVerdict::NoCable);
    let p1 = f.rails.iter().find(|r| r.iface == P1).unwrap();
    assert_eq!((p1.neighbours_discovered, p1.index), (0, None));
    assert_eq!(f.peer_file.peers[0].links.len(), 1);
    assert_eq!(f.peer_file.peers[0].links[0].index, 0);
    assert!(redeem::judge(&pair_plan(), &evidence(&f)).is_ok());
}

#[test]
fn k1_125_a_cable_looped_between_node0s_own_ports_finds_nothing() {
    // Each port hears itself and node0's other port: both are node0's own.
    let obs = node0(
        vec![port(P0, &["fe80::a1"]), port(P1, &["fe80::a0"])],
        vec![],
    );
    assert_eq!(
        judge_port(&obs, &obs.ports[0]),
        PortVerdict::Looped {
            to: vec![P1.into()]
        }
    );
    let f = found(decide(&obs, &[0, 1], None));
    assert!(f.peers.is_empty());
    assert!(f.rails.iter().all(|r| r.neighbours_discovered == 0));
    // Nothing on the cables: redeem turns the lone Spark away.
    assert_eq!(
        redeem::judge(&pair_plan(), &evidence(&f)),
        Err(Rejection::NoCable)
    );
}

#[test]
fn k1_125_several_machines_on_a_port_are_a_lan_left_alone() {
    let extra = machine("rack-7", &[("eth0", &["fe80::77"])]);
    let obs = node0(
        vec![
            port(P0, &["fe80::10"]),
            // The owner's uplink in a QSFP port: node1's eth0, a rack neighbour accepting the
            // same login, and one refusing it.
            port(P1, &["fe80::19", "fe80::77", "fe80::99"]),
        ],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(node1()))),
            (
                "fe80::19",
                P1,
                Login::Machine(Box::new(machine(
                    "node1",
                    &[("enp1s0f0np0", &["fe80::10"]), ("eth0", &["fe80::19"])],
                ))),
            ),
            ("fe80::77", P1, Login::Machine(Box::new(extra))),
            ("fe80::99", P1, Login::Refused),
        ],
    );
    let f = found(decide(&obs, &[0, 1], None));
    assert_eq!(verdict(&f.verdicts, P1), PortVerdict::Lan { machines: 3 });
    let lan = f.rails.iter().find(|r| r.iface == P1).unwrap();
    assert_eq!((lan.neighbours_discovered, lan.index), (3, None));
    // The LAN's machines are never peers, however the password is set.
    assert_eq!(f.peers.len(), 1);
    assert_eq!(f.peers[0].hardware_id.as_deref(), Some("node1"));
    assert_eq!(f.peer_file.peers[0].links.len(), 1);
    // Left alone at redeem too: the pair enrols on its one cable.
    let rows = redeem::judge(&pair_plan(), &evidence(&f)).expect("the pair enrols");
    assert_eq!(rows.len(), 2);
}

#[test]
fn k1_125_one_known_machine_and_a_stranger_are_two_machines() {
    let obs = node0(
        vec![port(P0, &["fe80::10", "fe80::99"])],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(node1()))),
            ("fe80::99", P0, Login::Unreachable("timeout".into())),
        ],
    );
    assert_eq!(
        judge_port(&obs, &obs.ports[0]),
        PortVerdict::Lan { machines: 2 }
    );
}

#[test]
fn k1_125_every_address_refusing_the_login_is_a_login_failure_not_a_lan() {
    let obs = node0(
        vec![port(P0, &["fe80::10", "fe80::11"]), port(P1, &["fe80::12"])],
        vec![
            ("fe80::10", P0, Login::Refused),
            ("fe80::11", P0, Login::Refused),
            ("fe80::12", P1, Login::Refused),
        ],
    );
    match decide(&obs, &[0, 1], None) {
        Decision::Retry { retry, verdicts } => {
            assert_eq!(
                retry,
                Retry::LoginFailed {
                    ports: vec![P1.into(), P0.into()]
                }
            );
            assert_eq!(verdict(&verdicts, P0), PortVerdict::LoginFailed);
            assert!(retry.to_string().contains("peer-login"));
        }
        d => panic!("{d:?}"),
    }
}

#[test]
fn k1_125_addresses_with_no_ssh_are_a_retry() {
    let obs = node0(
        vec![port(P0, &["fe80::10"])],
        vec![("fe80::10", P0, Login::Refused)],
    );
    let mut obs2 = obs.clone();
    obs2.logins.insert(
        scoped("fe80::10", P0),
        Login::Unreachable("connection refused".into()),
    );
    assert_eq!(judge_port(&obs2, &obs2.ports[0]), PortVerdict::Unreachable);
    // An address nobody tried is not a refusal either.
    obs2.logins.clear();
    assert_eq!(judge_port(&obs2, &obs2.ports[0]), PortVerdict::Unreachable);
    assert!(matches!(
        decide(&obs2, &[0], None),
        Decision::Retry {
            retry: Retry::Unreachable { .. },
            ..
        }
    ));
}

#[test]
fn k1_125_a_machine_with_no_identity_is_not_a_peer() {
    let mut anon = node1();
    anon.report.hardware_id = Some("  ".into());
    let obs = node0(
        vec![port(P0, &["fe80::10"])],
        vec![("fe80::10", P0, Login::Machine(Box::new(anon.clone())))],
    );
    assert_eq!(judge_port(&obs, &obs.ports[0]), PortVerdict::Unreachable);
    // Beside a known machine it still counts as one more.
    let obs = node0(
        vec![port(P0, &["fe80::10", "fe80::55"])],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(node1()))),
            (
                "fe80::55",
                P0,
                Login::Machine(Box::new(machine("", &[("eth0", &["fe80::55"])]))),
            ),
        ],
    );
    assert_eq!(
        judge_port(&obs, &obs.ports[0]),
        PortVerdict::Lan { machines: 2 }
    );
}

#[test]
fn k1_125_a_self_pair_is_a_retry_and_the_agent_checks_it_again_before_enrolling() {
    // A cloned image, a login that lands on node0 (say through ENVERGE_PEER_ADDR).
    let me = machine("node0", &[("enp1s0f0np0", &["fe80::10"])]);
    let obs = node0(
        vec![port(P0, &["fe80::10"])],
        vec![("fe80::10", P0, Login::Machine(Box::new(me)))],
    );
    match decide(&obs, &[0, 1], None) {
        Decision::Retry { retry, .. } => {
            assert_eq!(
                retry,
                Retry::SelfPair {
                    ports: vec![P0.into()]
                }
            )
        }
        d => panic!("{d:?}"),
    }
    let mine = report("node0", &[]);
    assert!(self_pair(&mine, &[report("node0", &[])]));
    assert!(!self_pair(&mine, &[report("node1", &[])]));
    assert!(!self_pair(&report("", &[]), &[report("", &[])]));
    // With no hardware id, the machine id stands in, as it does for redeem.
    let mut a = report("", &[]);
    a.hardware_id = None;
    assert!(self_pair(&a, std::slice::from_ref(&a)));
}

#[test]
fn k1_125_a_silent_port_with_carrier_is_a_retry_only_when_nothing_is_linked() {
    let obs = node0(vec![port(P0, &[]), port(P1, &[])], vec![]);
    match decide(&obs, &[0, 1], None) {
        Decision::Retry { retry, .. } => {
            assert_eq!(
                retry,
                Retry::Silent {
                    ports: vec![P1.into(), P0.into()]
                }
            );
            assert!(retry.to_string().contains("have carrier"));
        }
        d => panic!("{d:?}"),
    }
    // One linked cable, one silent port: the pair enrols on the cable it has.
    let obs = node0(
        vec![port(P0, &["fe80::10"]), port(P1, &[])],
        vec![("fe80::10", P0, Login::Machine(Box::new(node1())))],
    );
    let f = found(decide(&obs, &[0, 1], None));
    assert_eq!(verdict(&f.verdicts, P1), PortVerdict::Silent);
    // No carrier anywhere: a lone Spark, sent to redeem, which turns it away.
    let mut a = port(P0, &[]);
    a.carrier = false;
    let obs = node0(vec![a], vec![]);
    let f = found(decide(&obs, &[0, 1], None));
    assert_eq!(
        redeem::judge(&pair_plan(), &evidence(&f)),
        Err(Rejection::NoCable)
    );
}

#[test]
fn k2_more_links_than_rails_leave_the_extra_unnumbered_for_redeem_to_refuse() {
    let obs = node0(
        vec![port(P0, &["fe80::10"]), port(P1, &["fe80::12"])],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(node1()))),
            ("fe80::12", P1, Login::Machine(Box::new(node1()))),
        ],
    );
    let f = found(decide(&obs, &[5], None));
    let idx: Vec<Option<u32>> = f.rails.iter().map(|r| r.index).collect();
    assert_eq!(idx, vec![Some(5), None]);
    let mut plan = pair_plan();
    plan.rails.truncate(1);
    plan.rails[0].index = 5;
    assert_eq!(
        redeem::judge(&plan, &evidence(&f)),
        Err(Rejection::MoreCablesThanRails {
            cables: 2,
            rails: 1
        })
    );
}

#[test]
fn the_verdicts_read_as_words() {
    let words = [
        (PortVerdict::Lan { machines: 3 }, "3 machines"),
        (PortVerdict::LoginFailed, "refused the login"),
        (PortVerdict::Unreachable, "SSH did not"),
        (
            PortVerdict::Looped {
                to: vec![P1.into()],
            },
            P1,
        ),
        (PortVerdict::SelfPair, "itself"),
        (PortVerdict::Silent, "nothing answered"),
        (PortVerdict::NoCable, "no cable"),
        (
            PortVerdict::Link {
                hardware_id: "x".into(),
                remote: vec!["enp1".into()],
                addr: "fe80::1%a".into(),
            },
            "its enp1",
        ),
    ];
    for (v, w) in words {
        assert!(v.to_string().contains(w), "{v}");
    }
    for (r, w) in [
        (
            Retry::Unreachable {
                ports: vec!["a".into()],
            },
            "sshd",
        ),
        (
            Retry::SelfPair {
                ports: vec!["a".into()],
            },
            "two machines",
        ),
        (
            Retry::Silent {
                ports: vec!["a".into()],
            },
            "a has carrier",
        ),
    ] {
        assert!(r.to_string().contains(w), "{r}");
    }
}

#[test]
fn k1_125_one_machine_answering_inconsistently_is_nothing_to_number_by() {
    // Two logins on one port land on the same GPUs, but the second shows none of the
    // addresses seen on this port: not a cable node0 can number.
    let first = machine("node1", &[("enp1s0f0np0", &["fe80::10", "fe80::11"])]);
    let second = machine("node1", &[("enp1s0f0np0", &["fe80::99"])]);
    let obs = node0(
        vec![port(P0, &["fe80::10", "fe80::11"])],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(first))),
            ("fe80::11", P0, Login::Machine(Box::new(second))),
        ],
    );
    assert_eq!(judge_port(&obs, &obs.ports[0]), PortVerdict::Unreachable);
}

#[test]
fn k1_125_a_new_link_beside_a_kept_one_takes_the_rail_left_free() {
    let obs = node0(
        vec![port(P0, &["fe80::10"]), port(P1, &["fe80::12"])],
        vec![
            ("fe80::10", P0, Login::Machine(Box::new(node1()))),
            ("fe80::12", P1, Login::Machine(Box::new(node1()))),
        ],
    );
    // An earlier run saw only the cable on P0, and numbered it rail 0; by name order P1
    // would have taken rail 0 now.
    let kept = PeerFile {
        peers: vec![byo_wire::peers::Peer {
            index: 1,
            addr: None,
            mgmt_addr: None,
            host_key: node1().host_key,
            links: vec![byo_wire::peers::Link {
                index: 0,
                local: Some(P0.into()),
                remote: "enp1s0f0np0".into(),
                neighbour_addr: None,
                peer: None,
            }],
            link_local: Vec::new(),
        }],
    };
    let f = found(decide(&obs, &[0, 1], Some(&kept)));
    let idx = |i: &str| f.rails.iter().find(|r| r.iface == i).unwrap().index;
    assert_eq!((idx(P0), idx(P1)), (Some(0), Some(1)));
    // Each port keeps its own facts.
    let dev = |i: &str| {
        f.rails
            .iter()
            .find(|r| r.iface == i)
            .unwrap()
            .device
            .clone()
    };
    assert_eq!(dev(P0), Some(format!("roce-{P0}")));
    assert_eq!(dev(P1), Some(format!("roce-{P1}")));
}

#[test]
fn k1_125_a_remote_port_detect_did_not_list_is_still_recorded_on_the_peer() {
    // node1's detect named no RDMA port, but it holds the address on eth5: the cable is
    // recorded on that port all the same.
    let mut bare = machine("node1", &[("eth5", &["fe80::10"])]);
    bare.report.rails = vec![RailPort {
        iface: "eth9".into(),
        ..RailPort::default()
    }];
    let obs = node0(
        vec![port(P0, &["fe80::10"])],
        vec![("fe80::10", P0, Login::Machine(Box::new(bare)))],
    );
    let f = found(decide(&obs, &[0, 1], None));
    assert_eq!(
        f.peers[0].rails,
        vec![
            RailPort {
                iface: "eth9".into(),
                ..RailPort::default()
            },
            RailPort {
                iface: "eth5".into(),
                neighbours_discovered: 1,
                index: Some(0),
                ..RailPort::default()
            }
        ]
    );
}

/// 133: the heartbeat counts machines on a rail, not addresses. node1's two functions on one
/// cable are one machine; node0's own addresses (a looped cable) are none; an address nobody
/// logged into is one machine more; silence (an instance holds the netdev) is zero.
#[test]
fn k_133_the_heartbeat_counts_machines_on_a_rail_not_addresses() {
    use byo_core::probe::machines_answering;
    let known: BTreeMap<String, u32> = [("fe80::10", 1), ("fe80::11", 1), ("fe80::20", 2)]
        .into_iter()
        .map(|(a, n)| (a.to_owned(), n))
        .collect();
    let own = ["fe80::1".to_owned(), "fe80::2".to_owned()];
    let seen = |a: &[&str]| a.iter().map(|a| format!("{a}%{P0}")).collect::<Vec<_>>();
    assert_eq!(
        machines_answering(&seen(&["fe80::10", "FE80::11"]), &own, &known),
        1
    );
    assert_eq!(
        machines_answering(&seen(&["fe80::1", "fe80::2"]), &own, &known),
        0
    );
    assert_eq!(
        machines_answering(&seen(&["fe80::10", "fe80::11", "fe80::99"]), &own, &known),
        2
    );
    assert_eq!(
        machines_answering(&seen(&["fe80::10", "fe80::20"]), &own, &known),
        2
    );
    assert_eq!(machines_answering(&[], &own, &known), 0);
}

// ---- K2, the ring: four machines on a switchless ring, the diagonal reached through a
// neighbour (K2 notes 3–5 and 8).

const A0: &str = "enp1s0f0np0";
const A0B: &str = "enP2p1s0f0np0";
const A1: &str = "enp1s0f1np1";

fn ring_plan() -> ProfilePlan {
    serde_json::from_value(serde_json::json!({
        "node_count": 4, "gpu_model": "GB10", "gpu_count": 1, "arch": "aarch64",
        "rails": [
            {"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000},
            {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000},
            {"index": 2, "subnet": "192.168.102.0/24", "mtu": 9000},
            {"index": 3, "subnet": "192.168.103.0/24", "mtu": 9000}
        ]
    }))
    .unwrap()
}

fn heard(m: &mut Machine, ports: &[(&str, &[&str])]) {
    m.heard = ports.iter().map(|(i, a)| port(i, a)).collect();
}

/// node0 → "aaa" on P0 (its QSFP's two functions on the wire), node0 → "ccc" on P1, and the
/// diagonal "bbb" cabled to both, reached only through them. Every machine flashed from one
/// image: the same /etc/machine-id on all four.
fn ring() -> (Observation, [Machine; 3]) {
    let mut a = machine(
        "aaa",
        &[
            (A0, &["fe80::1a"]),
            (A0B, &["fe80::1b"]),
            (A1, &["fe80::1c"]),
        ],
    );
    let mut c = machine("ccc", &[(A0, &["fe80::3a"]), (A1, &["fe80::3c"])]);
    let mut b = machine("bbb", &[(A0, &["fe80::2a"]), (A1, &["fe80::2c"])]);
    heard(
        &mut a,
        &[
            (A0, &["fe80::a0", "fe80::1a", "fe80::1b"]),
            (A0B, &["fe80::a0", "fe80::1a", "fe80::1b"]),
            (A1, &["fe80::1c", "fe80::2a"]),
        ],
    );
    heard(
        &mut c,
        &[
            (A0, &["fe80::a1", "fe80::3a"]),
            (A1, &["fe80::3c", "fe80::2c"]),
        ],
    );
    heard(
        &mut b,
        &[
            (A0, &["fe80::2a", "fe80::1c"]),
            (A1, &["fe80::2c", "fe80::3c"]),
        ],
    );
    let mut obs = node0(
        vec![port(P0, &["fe80::1a", "fe80::1b"]), port(P1, &["fe80::3a"])],
        vec![
            ("fe80::1a", P0, Login::Machine(Box::new(a.clone()))),
            ("fe80::1b", P0, Login::Machine(Box::new(a.clone()))),
            ("fe80::3a", P1, Login::Machine(Box::new(c.clone()))),
        ],
    );
    obs.beyond = vec![b.clone()];
    (obs, [a, b, c])
}

fn link(f: &Found, node: u32) -> Vec<(u32, Option<String>, String, Option<u32>)> {
    f.peer_file
        .peers
        .iter()
        .find(|p| p.index == node)
        .unwrap()
        .links
        .iter()
        .map(|l| (l.index, l.local.clone(), l.remote.clone(), l.peer))
        .collect()
}

#[test]
fn k2_the_diagonal_is_reached_through_a_neighbour_and_the_ring_enrols() {
    let (obs, _) = ring();
    let f = found(decide(&obs, &[0, 1, 2, 3], None));
    // Satellites by hardware_id sorted: aaa 1, bbb (the diagonal) 2, ccc 3.
    let nodes: Vec<(u32, String)> = f
        .peers
        .iter()
        .map(|p| (p.node_index, p.hardware_id.clone().unwrap()))
        .collect();
    assert_eq!(
        nodes,
        [(1, "aaa".into()), (2, "bbb".into()), (3, "ccc".into())]
    );
    // Cables numbered by (lower node, higher node): 0–1, 0–3, 1–2, 2–3; each addressed on
    // the PCI-domain-0 function, never its enP2 twin.
    assert_eq!(
        link(&f, 1),
        [
            (0, Some(P0.into()), A0.into(), Some(0)),
            (2, None, A1.into(), Some(2))
        ]
    );
    assert_eq!(
        link(&f, 2),
        [(2, None, A0.into(), Some(1)), (3, None, A1.into(), Some(3))]
    );
    assert_eq!(
        link(&f, 3),
        [
            (1, Some(P1.into()), A0.into(), Some(0)),
            (3, None, A1.into(), Some(2))
        ]
    );
    // Rail addresses only where node0 has a cable; the diagonal by its management address.
    let peer = |n: u32| {
        f.peer_file
            .peers
            .iter()
            .find(|p| p.index == n)
            .unwrap()
            .clone()
    };
    assert_eq!(peer(1).addr.as_deref(), Some(&*scoped("fe80::1a", P0)));
    assert_eq!(peer(2).addr, None);
    assert_eq!(peer(2).mgmt_addr, Some("10.0.0.3".into()));
    assert_eq!(peer(2).host_key, "ssh-ed25519 KEY-bbb");
    assert_eq!(peer(3).addr.as_deref(), Some(&*scoped("fe80::3a", P1)));
    // node0's two cables carry rails 0 and 1; the diagonal's rails are on its own row.
    let idx = |i: &str| f.rails.iter().find(|r| r.iface == i).unwrap().index;
    assert_eq!((idx(P0), idx(P1)), (Some(0), Some(1)));
    let rails_of = |n: u32| -> Vec<(String, Option<u32>)> {
        let p = f.peers.iter().find(|p| p.node_index == n).unwrap();
        p.rails.iter().map(|r| (r.iface.clone(), r.index)).collect()
    };
    assert_eq!(
        rails_of(1),
        [
            (A0.into(), Some(0)),
            (A0B.into(), None),
            (A1.into(), Some(2))
        ]
    );
    assert_eq!(rails_of(2), [(A0.into(), Some(2)), (A1.into(), Some(3))]);
    // Redeem judges it as it judges a pair: four rows at the indexes the machines carry.
    let rows = redeem::judge(&ring_plan(), &evidence(&f)).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.index).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    // The pair-shaped plan refuses the same evidence: the ring's third rail is not in it.
    assert!(matches!(
        redeem::judge(&pair_plan(), &evidence(&f)),
        Err(Rejection::UnplannedRail { index: 2, .. })
    ));
}

#[test]
fn k2_the_numbering_follows_the_pinned_node_indexes_not_the_order_machines_were_found() {
    let (obs, [a, b, c]) = ring();
    // An earlier run pinned ccc at 1 and aaa at 3: the cables follow the pinned indexes.
    let pinned = |m: &Machine, index| byo_wire::peers::Peer {
        index,
        addr: None,
        mgmt_addr: None,
        host_key: m.host_key.clone(),
        links: Vec::new(),
        link_local: Vec::new(),
    };
    let kept = PeerFile {
        peers: vec![pinned(&c, 1), pinned(&b, 2), pinned(&a, 3)],
    };
    let f = found(decide(&obs, &[0, 1, 2, 3], Some(&kept)));
    // 0–1 is node0's P1 to ccc now; 0–3 its P0 to aaa.
    let idx = |i: &str| f.rails.iter().find(|r| r.iface == i).unwrap().index;
    assert_eq!((idx(P1), idx(P0)), (Some(0), Some(1)));
    assert_eq!(
        link(&f, 2),
        [(2, None, A1.into(), Some(1)), (3, None, A0.into(), Some(3))]
    );
    // The same observation decided twice numbers the same.
    assert_eq!(f, found(decide(&obs, &[0, 1, 2, 3], Some(&kept))));
}

#[test]
fn k2_a_machine_reached_with_no_cable_is_never_a_satellite() {
    let (mut obs, _) = ring();
    // The rack neighbour accepts the same login, and the walk reached it (as if through the
    // LAN): no cable joins it to any of the four.
    let mut stranger = machine("000", &[("eth0", &["fe80::99"])]);
    heard(&mut stranger, &[("eth0", &["fe80::99"])]);
    obs.beyond.push(stranger);
    let f = found(decide(&obs, &[0, 1, 2, 3], None));
    assert_eq!(f.peers.len(), 3);
    assert!(
        f.peers
            .iter()
            .all(|p| p.hardware_id.as_deref() != Some("000"))
    );
}

#[test]
fn k2_more_machines_on_the_cables_than_satellites_is_refused_by_redeem() {
    let (mut obs, _) = ring();
    // A fifth machine cabled to the diagonal's spare port, with no port detect calls a rail
    // (nothing heard from it: the bed's rack neighbour): it is found by holding an address.
    let e = machine("eee", &[(A0, &["fe80::5a"])]);
    let b = &mut obs.beyond[0];
    b.ports.push((A0B.into(), vec!["fe80::2b".into()]));
    b.heard.push(port(A0B, &["fe80::2b", "fe80::5a"]));
    obs.beyond.push(e);
    let f = found(decide(&obs, &[0, 1, 2, 3], None));
    assert_eq!(f.peers.len(), 4);
    // Five cables, four rails: the fifth carries none.
    let railed: usize = f.peer_file.peers.iter().map(|p| p.links.len()).sum();
    assert_eq!(railed, 6);
    assert!(matches!(
        redeem::judge(&ring_plan(), &evidence(&f)),
        Err(Rejection::WrongPeerCount {
            expected: 3,
            found: 4
        })
    ));
}

#[test]
fn k2_a_wire_with_a_stranger_on_it_is_a_lan_not_a_cable() {
    let (mut obs, _) = ring();
    // ccc's second port hears the diagonal and an address nobody logged into holds.
    let c = obs
        .logins
        .values_mut()
        .find_map(|l| match l {
            Login::Machine(m) if m.report.hardware_id.as_deref() == Some("ccc") => Some(m),
            _ => None,
        })
        .unwrap();
    c.heard[1].answered.push("fe80::77".into());
    let f = found(decide(&obs, &[0, 1, 2, 3], None));
    // The 2–3 wire is gone: bbb keeps its one cable, to aaa, and ccc only node0's.
    assert_eq!(link(&f, 2), [(2, None, A0.into(), Some(1))]);
    assert_eq!(link(&f, 3), [(1, Some(P1.into()), A0.into(), Some(0))]);
}

#[test]
fn k2_another_pair_in_the_rack_is_not_on_this_ring() {
    let (mut obs, _) = ring();
    // Two machines of another pair, cabled to each other, both reached (say, over the LAN).
    let mut x = machine("xxx", &[(A0, &["fe80::8a"])]);
    let mut y = machine("yyy", &[(A0, &["fe80::9a"])]);
    heard(&mut x, &[(A0, &["fe80::8a", "fe80::9a"])]);
    heard(&mut y, &[(A0, &["fe80::9a", "fe80::8a"])]);
    obs.beyond.extend([x, y]);
    let f = found(decide(&obs, &[0, 1, 2, 3], None));
    let hw: Vec<String> = f
        .peers
        .iter()
        .map(|p| p.hardware_id.clone().unwrap())
        .collect();
    assert_eq!(hw, ["aaa", "bbb", "ccc"]);
    let railed: usize = f.peer_file.peers.iter().map(|p| p.links.len()).sum();
    assert_eq!(railed, 6);
}

#[test]
fn k2_a_ring_whose_diagonal_is_off_is_still_numbered_from_the_cable_map() {
    // The walk ran (each neighbour heard its own ports), and nothing answered beyond them.
    let (mut obs, _) = ring();
    obs.beyond.clear();
    let f = found(decide(&obs, &[0, 1, 2, 3], None));
    assert_eq!(f.peers.len(), 2);
    // (0, aaa) before (0, ccc): node0's P0 carries rail 0, though P1 sorts first by name,
    // and every link names the node at its other end.
    let idx = |i: &str| f.rails.iter().find(|r| r.iface == i).unwrap().index;
    assert_eq!((idx(P0), idx(P1)), (Some(0), Some(1)));
    assert_eq!(link(&f, 1), [(0, Some(P0.into()), A0.into(), Some(0))]);
    assert_eq!(link(&f, 2), [(1, Some(P1.into()), A0.into(), Some(0))]);
}

#[test]
fn k2_two_cables_between_the_same_two_nodes_are_numbered_by_the_lower_nodes_port() {
    // node0's P0 to aaa's A0 and its P1 to aaa's A1, walked: (0, 1) twice, and node0's port
    // names decide (P1 sorts first), not aaa's.
    let mut a = machine("aaa", &[(A0, &["fe80::1a"]), (A1, &["fe80::1c"])]);
    heard(
        &mut a,
        &[
            (A0, &["fe80::a0", "fe80::1a"]),
            (A1, &["fe80::a1", "fe80::1c"]),
        ],
    );
    let obs = node0(
        vec![port(P0, &["fe80::1a"]), port(P1, &["fe80::1c"])],
        vec![
            ("fe80::1a", P0, Login::Machine(Box::new(a.clone()))),
            ("fe80::1c", P1, Login::Machine(Box::new(a))),
        ],
    );
    let f = found(decide(&obs, &[0, 1, 2, 3], None));
    let idx = |i: &str| f.rails.iter().find(|r| r.iface == i).unwrap().index;
    assert_eq!((idx(P1), idx(P0)), (Some(0), Some(1)));
    assert_eq!(
        link(&f, 1),
        [
            (0, Some(P1.into()), A1.into(), Some(0)),
            (1, Some(P0.into()), A0.into(), Some(0))
        ]
    );
}
