//! Step 127: what redeem accepts and refuses, against the profiles' plans, with the
//! design's own example request as the fixture.

use byo_core::redeem::{Rejection, judge};
use byo_wire::enroll::EnrollRequest;
use byo_wire::profile::ProfilePlan;
use serde_json::json;

fn plan(node_count: u32) -> ProfilePlan {
    // A pair has two rails; a ring one per cable, four; a single Spark none.
    let rail_count = if node_count > 1 {
        node_count.clamp(2, 4)
    } else {
        0
    };
    let rails: Vec<_> = (0..rail_count)
        .map(|i| json!({"index": i, "subnet": format!("192.168.{}.0/24", 100 + i), "mtu": 9000}))
        .collect();
    serde_json::from_value(json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "cuda_repo_arch": "sbsa", "node_count": node_count, "rails": rails
    }))
    .unwrap()
}

fn test_plan() -> ProfilePlan {
    serde_json::from_value(
        json!({"gpu_model": null, "gpu_count": null, "gpu_mem_mib": null, "arch": null,
        "cuda_repo_arch": "x86_64", "node_count": 1, "rails": []}),
    )
    .unwrap()
}

/// The design's example request at 126, a pair.
fn pair_request() -> EnrollRequest {
    serde_json::from_value(json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": "3f2a", "hardware_id": "b41c", "node_index": 0,
        "rails": [
            { "device": "rocep1s0f0", "iface": "enp1s0f0np0", "mtu": 1500, "active_mtu": 1024, "neighbours_discovered": 1, "index": 0 },
            { "device": "roceP2p1s0f0", "iface": "enP2p1s0f0np0", "mtu": 1500, "active_mtu": 1024, "neighbours_discovered": 1, "index": 1 },
            { "device": "rocep1s0f1", "iface": "enp1s0f1np1", "mtu": 1500, "neighbours_discovered": 0 }
        ],
        "peers": [
            { "gpu_model": "GB10", "gpu_count": 1, "arch": "aarch64", "machine_id": "9c17", "hardware_id": "7e08", "os_id": "ubuntu", "node_index": 1,
              "rails": [ { "iface": "enp1s0f0np0", "index": 0, "neighbours_discovered": 1 }, { "iface": "enP2p1s0f1np1", "index": 1, "neighbours_discovered": 1 } ] }
        ]
    }))
    .unwrap()
}

fn single_request() -> EnrollRequest {
    let mut r = pair_request();
    r.peers.clear();
    r
}

#[test]
fn a_single_spark_is_one_row_and_judges_nothing_about_rails() {
    let rows = judge(&plan(1), &single_request()).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].index, rows[0].hardware_id.as_str()), (0, "b41c"));
    assert_eq!(rows[0].fingerprint["gpu_model"], "GB10");
    assert!(rows[0].fingerprint.get("rails").is_none(), "identity only");
    assert_eq!(rows[0].rails["enp1s0f1np1"]["neighbours_discovered"], 0);
}

#[test]
fn hardware_that_is_not_the_profiles_is_rejected() {
    for (field, value) in [
        ("gpu_model", json!("RTX 4090")),
        ("arch", json!("x86_64")),
        ("gpu_count", json!(2)),
        ("gpu_mem_mib", json!(24576)),
    ] {
        let mut v = serde_json::to_value(single_request()).unwrap();
        v[field] = value;
        let req: EnrollRequest = serde_json::from_value(v).unwrap();
        match judge(&plan(1), &req) {
            Err(Rejection::NotTheProfilesHardware {
                node: 0, field: f, ..
            }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    // The staff-only test profile takes an ordinary Linux machine.
    let mut v = serde_json::to_value(single_request()).unwrap();
    v["gpu_model"] = json!(null);
    v["arch"] = json!("x86_64");
    let req: EnrollRequest = serde_json::from_value(v).unwrap();
    assert!(judge(&test_plan(), &req).is_ok());
}

#[test]
fn an_older_agent_without_hardware_id_is_keyed_by_machine_id() {
    let mut req = single_request();
    req.node.hardware_id = None;
    assert_eq!(judge(&plan(1), &req).unwrap()[0].hardware_id, "3f2a");
    req.node.machine_id = None;
    assert_eq!(
        judge(&plan(1), &req),
        Err(Rejection::NoHardwareId { node: 0 })
    );
}

#[test]
fn the_designs_pair_is_accepted_with_the_plans_addresses_stamped() {
    let rows = judge(&plan(2), &pair_request()).unwrap();
    assert_eq!(rows.iter().map(|r| r.index).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(rows[0].rails["enp1s0f0np0"]["address"], "192.168.100.10/24");
    assert_eq!(
        rows[0].rails["enP2p1s0f0np0"]["address"],
        "192.168.101.10/24"
    );
    assert!(
        rows[0].rails["enp1s0f1np1"].get("address").is_none(),
        "a port nobody is on has no index"
    );
    // node1's second cable landed on its other port: recorded, not a fault.
    assert_eq!(
        rows[1].rails["enP2p1s0f1np1"]["address"],
        "192.168.101.11/24"
    );
    assert_eq!(rows[1].hardware_id, "7e08");
}

#[test]
fn k1_125_a_lan_in_a_qsfp_port_is_left_alone_and_a_lone_spark_on_a_switch_is_refused() {
    let p = plan(2);
    // The owner's uplink in node0's spare QSFP port: three machines, no rail number.
    let mut req = pair_request();
    req.node.rails[2].neighbours_discovered = 3;
    let rows = judge(&p, &req).expect("a LAN the probe left alone is not a cable");
    assert!(
        rows[0].rails["enp1s0f1np1"].get("address").is_none(),
        "the LAN port is given no rail address"
    );
    assert_eq!(rows[0].rails["enp1s0f1np1"]["neighbours_discovered"], 3);

    // A lone Spark whose rails sit on the owner's switch, offered as a pair: nothing is a
    // cable, and the port with several machines is named (K1 note 10).
    let mut req = pair_request();
    for port in &mut req.node.rails {
        port.index = None;
        port.neighbours_discovered = 0;
    }
    req.node.rails[1].neighbours_discovered = 4;
    assert_eq!(
        judge(&p, &req),
        Err(Rejection::SeveralMachinesOnACable {
            iface: "enP2p1s0f0np0".into(),
            neighbours: 4
        })
    );
}

#[test]
fn what_a_pair_must_show_is_refused_when_it_does_not() {
    let p = plan(2);
    let mut req = pair_request();
    for port in &mut req.node.rails {
        port.neighbours_discovered = 0;
    }
    assert_eq!(judge(&p, &req), Err(Rejection::NoCable));

    let mut req = pair_request();
    req.node.rails[0].neighbours_discovered = 3;
    assert!(matches!(
        judge(&p, &req),
        Err(Rejection::SeveralMachinesOnACable { .. })
    ));

    let mut req = pair_request();
    req.node.rails[2].neighbours_discovered = 1;
    req.node.rails[2].index = Some(1);
    assert_eq!(
        judge(&p, &req),
        Err(Rejection::MoreCablesThanRails {
            cables: 3,
            rails: 2
        })
    );

    let mut req = pair_request();
    req.node.rails[0].index = Some(7);
    assert!(matches!(
        judge(&p, &req),
        Err(Rejection::UnplannedRail { index: 7, .. })
    ));

    assert_eq!(
        judge(&p, &single_request()),
        Err(Rejection::WrongPeerCount {
            expected: 1,
            found: 0
        })
    );

    // A single Spark presented as a pair with its own login: the peer is node0 itself.
    let mut req = pair_request();
    req.peers[0].hardware_id = Some("b41c".into());
    assert_eq!(judge(&p, &req), Err(Rejection::PeerIsNode0));

    for bad in [0, 2] {
        let mut req = pair_request();
        req.peers[0].node_index = bad;
        assert_eq!(judge(&p, &req), Err(Rejection::PeerIndex { index: bad }));
    }

    let mut req = pair_request();
    req.peers[0].arch = Some("x86_64".into());
    assert!(matches!(
        judge(&p, &req),
        Err(Rejection::NotTheProfilesHardware {
            node: 1,
            field: "arch",
            ..
        })
    ));

    let mut req = pair_request();
    req.node.node_index = 1;
    assert_eq!(judge(&p, &req), Err(Rejection::WrongNodeIndex { found: 1 }));
}

#[test]
fn a_ring_takes_each_satellite_once_and_fewer_cables_than_rails() {
    let p = plan(4);
    let mut req = pair_request();
    let peer = req.peers[0].clone();
    req.peers = (1..=3)
        .map(|i| {
            let mut n = peer.clone();
            n.node_index = i;
            n.hardware_id = Some(format!("hw-{i}"));
            n
        })
        .collect();
    let rows = judge(&p, &req).unwrap();
    assert_eq!(
        rows.iter().map(|r| r.index).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    req.peers[2].hardware_id = Some("hw-1".into());
    assert_eq!(judge(&p, &req), Err(Rejection::SamePeerTwice));
    req.peers[2].hardware_id = Some("hw-3".into());
    req.peers[2].node_index = 1;
    assert_eq!(judge(&p, &req), Err(Rejection::PeerIndex { index: 1 }));
}

/// The rejection's words are what the owner reads (the enrolment answer's message and
/// `host_enrollments.reject_reason`): each names what was found against the plan.
#[test]
fn a_rejection_says_what_was_found_against_the_plan() {
    for (rejection, says) in [
        (
            Rejection::NotTheProfilesHardware {
                node: 0,
                field: "arch",
                expected: "aarch64".into(),
                found: "x86_64".into(),
            },
            "node 0 is not this profile's hardware: arch is x86_64, expected aarch64",
        ),
        (
            Rejection::NoHardwareId { node: 1 },
            "node 1 reported no hardware id or machine id",
        ),
        (
            Rejection::WrongNodeIndex { found: 2 },
            "the enrolling machine must be node 0, not 2",
        ),
        (Rejection::NoCable, "no cable to another machine was found"),
        (
            Rejection::WrongPeerCount {
                expected: 1,
                found: 0,
            },
            "0 other machines found, the profile is 1 more",
        ),
        (
            Rejection::SamePeerTwice,
            "one machine was offered as two peers",
        ),
    ] {
        assert_eq!(rejection.to_string(), says);
    }
}

/// 130–132: a machine's rails refreshed after rail-network, as host-report's rails write
/// them — its own address on each cabled port, a bare port as found, and `verified_at` only
/// once rail-verify proved the cables, only on the ports that carry a rail.
#[test]
fn k_131_132_a_machines_rails_are_refreshed_with_its_own_addresses_then_verified() {
    use byo_core::redeem::node_rails;
    use byo_wire::enroll::RailPort;
    let ports: Vec<RailPort> = serde_json::from_value(json!([
        {"iface": "enp1s0f0np0", "device": "rocep1s0f0", "mtu": 9000, "active_mtu": 4096,
         "neighbours_discovered": 1, "index": 0, "address": "192.168.100.11/24"},
        {"iface": "enP2p1s0f1np1", "device": "roceP2p1s0f1", "mtu": 9000, "active_mtu": null,
         "neighbours_discovered": 1, "index": 1, "address": "192.168.101.11/24"},
        {"iface": "enP2p1s0f0np0", "device": "roceP2p1s0f0", "mtu": 1500, "active_mtu": null,
         "neighbours_discovered": 0, "index": null}
    ]))
    .unwrap();
    let own = |p: &RailPort| p.address.clone();
    let configured = json!({
        "enp1s0f0np0": {"index": 0, "device": "rocep1s0f0", "mtu": 9000, "active_mtu": 4096,
                        "address": "192.168.100.11/24", "neighbours_discovered": 1},
        "enP2p1s0f1np1": {"index": 1, "device": "roceP2p1s0f1", "mtu": 9000,
                          "address": "192.168.101.11/24", "neighbours_discovered": 1},
        "enP2p1s0f0np0": {"device": "roceP2p1s0f0", "mtu": 1500, "neighbours_discovered": 0}
    });
    assert_eq!(node_rails(&ports, own, None), configured);
    let at = chrono::DateTime::parse_from_rfc3339("2026-09-08T14:20:03Z")
        .unwrap()
        .to_utc();
    let mut verified = configured.clone();
    for port in ["enp1s0f0np0", "enP2p1s0f1np1"] {
        verified[port]["verified_at"] = json!("2026-09-08T14:20:03Z");
    }
    assert_eq!(node_rails(&ports, own, Some(at)), verified);
}
