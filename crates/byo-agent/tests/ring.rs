//! K2 on real machines: four Debian host containers on a switchless ring (`support/cabled.rs`),
//! node0 cabled to two of them, the diagonal to those two only, and the rack neighbour on the
//! management LAN accepting the same login. The agent binary on node0 walks the cables (step
//! 125 for a ring): its neighbours first, then, one hop through either, the diagonal; the
//! satellites by hardware_id; peer.json ring-shaped; the evidence redeem judges.

mod support;

use std::time::{Duration, Instant};

use byo_core::keylist_testing::private_key;
use byo_wire::enroll::{EnrollRequest, NodeReport};
use serde_json::{Value, json};
use support::cabled::{
    Bed, PASSWORD, RING_UUIDS, containers, head_to_worker, ipv4, wait_for, whole_mtu_passes,
};
use support::host_container::HostContainer;
use support::prepared::{self, agent_api, key_file, public_line, text};

fn hardware_id(uuid: &str) -> String {
    byo_agent::detect::hardware_id(&[format!("GPU-{uuid}")]).unwrap()
}

const NODE1_UUID: &str = "1111bbbb-1111-4111-8111-111111111111";

fn ring_plan() -> byo_wire::profile::ProfilePlan {
    serde_json::from_value(serde_json::json!({
        "node_count": 4, "gpu_model": "GB10", "gpu_count": 1,
        "rails": [
            {"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000},
            {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000},
            {"index": 2, "subnet": "192.168.102.0/24", "mtu": 9000},
            {"index": 3, "subnet": "192.168.103.0/24", "mtu": 9000}
        ]
    }))
    .unwrap()
}

/// One link of a peer in peer.json: (rail, node0's port, its port, the node at the other end).
fn links(peer: &Value) -> Vec<(u64, Option<String>, String, u64)> {
    peer["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["index"].as_u64().unwrap(),
                l["local"].as_str().map(str::to_owned),
                l["remote"].as_str().unwrap().to_owned(),
                l["peer"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn k2_125_the_ring_is_walked_from_node0_and_the_diagonal_reached_through_a_neighbour() {
    let began = Instant::now();
    let Some(bed) = Bed::ring("p15-ring") else {
        return;
    };
    let (n0, n1) = (&bed.node0, &bed.node1);
    let (n2, n3) = (&bed.more[0], &bed.more[1]);
    // The ring: node0–node1 (node1's QSFP showing both its functions), node0–node3,
    // node1–node2 and node3–node2. node2 is the diagonal: no cable of node0's reaches it.
    bed.cable(&[(n0, "rail0"), (n1, "rail0"), (n1, "rail0b")]);
    bed.cable(&[(n0, "rail1"), (n3, "rail0")]);
    bed.cable(&[(n1, "rail1"), (n2, "rail0")]);
    bed.cable(&[(n3, "rail1"), (n2, "rail1")]);
    // A ring flashed from one image: every machine the same /etc/machine-id.
    for h in [n0, n1, n2, n3] {
        h.sh_ok("echo 5eed5eed5eed5eed5eed5eed5eed5eed > /etc/machine-id");
    }
    bed.lend_login_for(PASSWORD, 4);
    let (code, j, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(j["decision"], "enroll", "{j}");

    // Satellites by hardware_id sorted, pinned in peer.json.
    let mut by_hw = [
        (hardware_id(NODE1_UUID), n1),
        (hardware_id(RING_UUIDS[0]), n2),
        (hardware_id(RING_UUIDS[1]), n3),
    ];
    by_hw.sort_by(|a, b| a.0.cmp(&b.0));
    let index_of =
        |name: &str| 1 + by_hw.iter().position(|(_, h)| h.name() == name).unwrap() as u64;
    let peers = j["peers"].as_array().unwrap();
    let found: Vec<(u64, String)> = peers
        .iter()
        .map(|p| {
            (
                p["node_index"].as_u64().unwrap(),
                p["hardware_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(u64, String)> = by_hw
        .iter()
        .enumerate()
        .map(|(i, (hw, _))| (i as u64 + 1, hw.clone()))
        .collect();
    assert_eq!(
        found, want,
        "three satellites, the rack neighbour none: {j}"
    );

    // The cables numbered by (lower node, higher node), each on rail0/rail1, never the twin.
    let (i1, i2, i3) = (
        index_of(n1.name()),
        index_of(n2.name()),
        index_of(n3.name()),
    );
    let mut cables = [
        (0, i1),
        (0, i3),
        (i1.min(i2), i1.max(i2)),
        (i2.min(i3), i2.max(i3)),
    ];
    cables.sort();
    let rail_of = |a: u64, b: u64| {
        cables
            .iter()
            .position(|c| *c == (a.min(b), a.max(b)))
            .unwrap() as u64
    };
    let recorded: Value =
        serde_json::from_slice(&n0.read("/etc/enverge/peer.json").expect("peer.json")).unwrap();
    assert_eq!(recorded, j["peer_file"]);
    let peer = |i: u64| {
        recorded["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["index"] == i)
            .unwrap()
            .clone()
    };
    let sorted = |mut v: Vec<(u64, Option<String>, String, u64)>| {
        v.sort();
        v
    };
    assert_eq!(
        links(&peer(i1)),
        sorted(vec![
            (rail_of(0, i1), Some("rail0".into()), "rail0".into(), 0),
            (rail_of(i1, i2), None, "rail1".into(), i2),
        ])
    );
    assert_eq!(
        links(&peer(i3)),
        sorted(vec![
            (rail_of(0, i3), Some("rail1".into()), "rail0".into(), 0),
            (rail_of(i3, i2), None, "rail1".into(), i2),
        ])
    );
    // The diagonal: its two cables recorded on it though node0 has an end on neither; no
    // rail address, its management address and host key read from itself over the cable.
    assert_eq!(
        links(&peer(i2)),
        sorted(vec![
            (rail_of(i1, i2), None, "rail0".into(), i1),
            (rail_of(i3, i2), None, "rail1".into(), i3),
        ])
    );
    let diagonal = peer(i2);
    assert!(diagonal["addr"].is_null(), "{diagonal}");
    let route: Value = serde_json::from_str(&n2.sh_ok("ip -4 -j route get 1.0.0.1")).unwrap();
    assert_eq!(diagonal["mgmt_addr"], route[0]["prefsrc"]);
    let n2_key = n2.sh_ok("cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub");
    assert_eq!(diagonal["host_key"], n2_key.trim());
    // node0's two cables carry their rails; redeem judges the evidence: four rows at the
    // indexes the machines carry.
    let node0_rail = |p: &str| {
        j["rails"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["iface"] == p)
            .unwrap()["index"]
            .as_u64()
    };
    assert_eq!(node0_rail("rail0"), Some(rail_of(0, i1)));
    assert_eq!(node0_rail("rail1"), Some(rail_of(0, i3)));
    let node0 = NodeReport {
        gpu_model: Some("GB10".into()),
        gpu_count: Some(1),
        hardware_id: Some(hardware_id("0000aaaa-0000-4000-8000-000000000000")),
        rails: serde_json::from_value(j["rails"].clone()).unwrap(),
        ..NodeReport::default()
    };
    let req = EnrollRequest {
        node: node0,
        peers: serde_json::from_value(j["peers"].clone()).unwrap(),
    };
    let rows = byo_core::redeem::judge(&ring_plan(), &req).expect("the ring is accepted");
    assert_eq!(
        rows.iter().map(|r| r.index).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    eprintln!("== the ring walked: {:.1} s", began.elapsed().as_secs_f64());

    // --- Again: the same numbering, nothing re-derived.
    let (code, again, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(again["peer_file"], j["peer_file"]);

    // --- A fifth machine on the cables (the rack neighbour cabled to node2's spare QSFP):
    // more machines than the profile has satellites, refused by redeem.
    let x = bed.extra();
    bed.cable(&[(n2, "rail1b"), (x, "rail0")]);
    let (code, five, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    let req = EnrollRequest {
        node: req.node.clone(),
        peers: serde_json::from_value(five["peers"].clone()).unwrap(),
    };
    assert_eq!(req.peers.len(), 4, "{five}");
    assert!(matches!(
        byo_core::redeem::judge(&ring_plan(), &req),
        Err(byo_core::redeem::Rejection::WrongPeerCount {
            expected: 3,
            found: 4
        })
    ));
    eprintln!(
        "== five machines on the cables: {:.1} s",
        began.elapsed().as_secs_f64()
    );

    bed.uncable();
    k2_6_7_the_ring_prepares_and_rents_four_containers(&bed);
    eprintln!("== ring suite: {:.1} s", began.elapsed().as_secs_f64());
}

/// The staff-only ring profile's constants (`linux-test-4`, migration 0019): four rails, one
/// per cable, at a QSFP's MTU, and what a Debian container can prepare.
fn linux_test_4() -> Value {
    json!({"gpu_model": null, "gpu_count": null, "gpu_mem_mib": null, "arch": null,
           "cuda_repo_arch": "x86_64", "node_count": 4,
           "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000},
                     {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000},
                     {"index": 2, "subnet": "192.168.102.0/24", "mtu": 9000},
                     {"index": 3, "subnet": "192.168.103.0/24", "mtu": 9000}],
           "prepare": {"lxd": "apt", "storage_driver": "dir", "pool_size": "20GiB",
                       "zfs_arc_max": 1073741824, "base_image": "minimal", "tunnel": false}})
}

/// The plan's address of `node` on `rail` (the subnet's tenth host plus the node's index).
fn addr(rail: u64, node: u64) -> String {
    format!("192.168.{}.{}", 100 + rail, 10 + node)
}

/// K2 notes 6 and 7 on the bed: node0 prepares its three satellites (the diagonal over the
/// management network), every cable addressed and proved from both ends — the two between
/// satellites included — and the customer's instance is four containers: the head reaches
/// every worker, the diagonal's through a neighbour that forwards.
fn k2_6_7_the_ring_prepares_and_rents_four_containers(bed: &Bed) {
    let began = Instant::now();
    let (n0, n1) = (&bed.node0, &bed.node1);
    let (n2, n3) = (&bed.more[0], &bed.more[1]);
    bed.netplan();
    let e = prepared::enroll_into(n0, None, "linux-test-4", linux_test_4());
    bed.lend_login_for(PASSWORD, 4);
    // The same ring, at a QSFP's MTU.
    let ring: [(&HostContainer, &str, &HostContainer, &str); 4] = [
        (n0, "rail0", n1, "rail0"),
        (n0, "rail1", n3, "rail0"),
        (n1, "rail1", n2, "rail0"),
        (n3, "rail1", n2, "rail1"),
    ];
    for (a, pa, b, pb) in ring {
        bed.cable_with_mtu(&[(a, pa), (b, pb)], Some(9000));
    }
    let (code, decision, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "the ring would enrol: {said}\n{decision}");
    // Each machine's node index, as the probe pinned it.
    let index_of = |h: &HostContainer| -> u64 {
        if h.name() == n0.name() {
            return 0;
        }
        let hw = h.sh_ok("nvidia-smi").split(", ").nth(1).unwrap().to_owned();
        let hw = hardware_id(hw.trim_start_matches("GPU-"));
        decision["peers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["hardware_id"] == hw.as_str())
            .unwrap()["node_index"]
            .as_u64()
            .unwrap()
    };
    // Each cable's rail, from the cable map by (lower node, higher node).
    let mut by_nodes: Vec<(u64, u64)> = ring
        .iter()
        .map(|(a, _, b, _)| {
            let (x, y) = (index_of(a), index_of(b));
            (x.min(y), x.max(y))
        })
        .collect();
    by_nodes.sort();
    let rail_of = |a: &HostContainer, b: &HostContainer| -> u64 {
        let (x, y) = (index_of(a), index_of(b));
        by_nodes
            .iter()
            .position(|c| *c == (x.min(y), x.max(y)))
            .unwrap() as u64
    };

    let lap = Instant::now();
    let (ok, said) = prepared::prepare(n0, &[]);
    assert!(ok, "the ring prepares: {said}");
    let prepared_in = lap.elapsed().as_secs_f64();
    for k in 1..=3 {
        for step in byo_agent::prepare::peers::satellite_steps() {
            assert!(
                said.lines()
                    .any(|l| l.trim_start().starts_with(&format!("node{k} {step} "))),
                "no progress of node{k}'s {step}:\n{said}"
            );
        }
    }
    // rail-network: each cable addressed at both ends with the plan's address for that
    // node on that rail, at 9000; rail-verify proved each from both ends (seen again here,
    // the diagonal's two included).
    for (a, pa, b, pb) in ring {
        let rail = rail_of(a, b);
        for (h, p, other) in [(a, pa, b), (b, pb, a)] {
            let want = format!("{}/24", addr(rail, index_of(h)));
            assert_eq!(ipv4(h, p), (vec![want], 9000), "{} {p}", h.name());
            let far = addr(rail, index_of(other));
            assert!(
                whole_mtu_passes(h, p, &far, 9000),
                "{} {p} → {far}",
                h.name()
            );
        }
    }
    for k in 0..=3 {
        assert!(
            said.lines()
                .any(|l| l.trim().starts_with(&format!("node{k} rails:"))
                    && l.trim().ends_with(", verified")),
            "node{k}'s rails are reported verified:\n{said}"
        );
    }
    // The diagonal was prepared over the management network: its spark admits node0's peer
    // key, its host key pinned from the cable.
    let diagonal = index_of(n2);
    let out = n0.sh(&format!(
        "ssh -i /etc/enverge/peer.key -o BatchMode=yes -o StrictHostKeyChecking=yes \
         -o UserKnownHostsFile=/etc/enverge/peer-{diagonal}.known_hosts spark@{} sudo -n true",
        n2.ipv4()
    ));
    assert!(
        out.status.success(),
        "node0 reaches the diagonal as spark: {}",
        text(&out)
    );

    // --- The instance: four containers, in lockstep, made by serving under its own unit.
    let handed_path = byo_core::render::units::HANDED_OVER;
    let handed: Value = serde_json::from_str(&n0.sh_ok(&format!("cat {handed_path}"))).unwrap();
    assert_eq!(handed["pair"].as_array().map(Vec::len), Some(4), "{handed}");
    prepared::install_units(n0, 2);
    let _mapd = prepared::serve_with_mapd(n0, &e);
    let token = e.agent_token.clone();
    let customer = private_key();
    let customer_path = key_file(e.dir.path(), "ring-customer", &customer);
    n0.push(&customer_path, "/root/customer", 0o600);
    let lap = Instant::now();
    let (status, body) = agent_api(
        n0,
        &token,
        "POST",
        "/v1/vms",
        Some(json!({"name": "r1", "ssh_public_key": public_line(&customer)})),
    );
    let created_in = lap.elapsed().as_secs_f64();
    assert_eq!(status, 201, "{body}");
    assert!(containers(n0).contains("r1,RUNNING"), "{}", containers(n0));
    for h in [n1, n2, n3] {
        let worker = format!("r1-w{},RUNNING", index_of(h));
        assert!(
            containers(h).contains(&worker),
            "{}: {}",
            h.name(),
            containers(h)
        );
    }
    // The head reaches every worker as user with the launcher key, on every rail address it
    // has — the diagonal's too, though no cable of the head's goes there: one hop through a
    // neighbour that forwards between its rails.
    for (a, _, b, _) in ring {
        let rail = rail_of(a, b);
        for h in [a, b].into_iter().filter(|h| h.name() != n0.name()) {
            let k = index_of(h);
            let at = addr(rail, k);
            assert_eq!(
                head_to_worker(n0, "r1", "/root/.ssh/id_dropbear", &at),
                Ok(format!("r1-w{k}")),
                "the head reaches node{k}'s worker at {at}"
            );
        }
    }
    // And the diagonal reaches the head (the route back).
    let head_addr = addr(rail_of(n0, n1), 0);
    let back = n2.sh(&format!(
        "lxc exec r1-w{diagonal} -- ping -c 2 -W 2 {head_addr}"
    ));
    assert!(
        back.status.success(),
        "the diagonal's worker reaches the head: {}",
        text(&back)
    );
    let cluster = n0.sh_ok("lxc exec r1 -- cat /etc/enverge/cluster.md");
    assert!(
        cluster.contains(&format!(
            "r1-w{diagonal} (node{diagonal}) has no cable to the head"
        )),
        "{cluster}"
    );

    // Delete takes all four, and every machine's cables are addressed again.
    let (status, body) = agent_api(n0, &token, "DELETE", "/v1/vms/r1", None);
    assert_eq!(status, 200, "{body}");
    for h in [n0, n1, n2, n3] {
        assert!(
            !containers(h).contains("r1"),
            "{}: {}",
            h.name(),
            containers(h)
        );
    }
    for (a, pa, b, _) in ring {
        let want = vec![format!("{}/24", addr(rail_of(a, b), index_of(a)))];
        let back = wait_for(Duration::from_secs(30), || {
            (ipv4(a, pa).0 == want).then_some(())
        });
        assert!(
            back.is_some(),
            "{} {pa} addressed again: {:?}",
            a.name(),
            ipv4(a, pa)
        );
    }
    m_4_an_operator_key_push_reaches_every_satellite(bed, &e, &token, |h| index_of(h));
    n0.sh_ok("systemctl stop enverge-agent.service");
    eprintln!(
        "figure: ring preparation from node0 {prepared_in:.1} s; a four-container create {created_in:.1} s; prepare and rent {:.1} s",
        began.elapsed().as_secs_f64()
    );
}

/// M.4 on a ring: serving writes the list it applied to every satellite's spark (the diagonal
/// over the management network too), node0's peer key kept; a satellite that does not answer
/// fails the push, named (M.6), and sending the same list again repairs it.
fn m_4_an_operator_key_push_reaches_every_satellite(
    bed: &Bed,
    e: &prepared::Enrollment,
    token: &str,
    index_of: impl Fn(&HostContainer) -> u64,
) {
    use byo_core::keylist::OperatorKey;
    use byo_core::keylist_testing::{envelope, list};
    let (n0, n1) = (&bed.node0, &bed.node1);
    let (n2, n3) = (&bed.more[0], &bed.more[1]);
    let newcomer = private_key();
    let signed = |version: u64| -> Value {
        let keys = list(
            prepared::ENVIRONMENT,
            version,
            vec![OperatorKey {
                user_sub: "op-2".into(),
                label: "ring desk".into(),
                public_key: public_line(&newcomer),
            }],
            chrono::Utc::now(),
        );
        serde_json::from_slice(&envelope(&keys, &[&e.signing])).unwrap()
    };
    let peer_key = n0.sh_ok("cat /etc/enverge/peer.key.pub");
    let operator = ssh_key::PrivateKey::read_openssh_file(&e.operator_key).unwrap();
    let (status, body) = agent_api(n0, token, "PUT", "/v1/operator-keys", Some(signed(2)));
    assert_eq!(status, 200, "{body}");
    for h in [n0, n1, n2, n3] {
        let admitted = h.sh_ok("cat /home/spark/.ssh/authorized_keys");
        assert!(
            admitted.contains(&public_line(&newcomer)),
            "{}: {admitted}",
            h.name()
        );
        assert!(
            !admitted.contains(&public_line(&operator)),
            "{}: {admitted}",
            h.name()
        );
        if h.name() != n0.name() {
            assert!(
                admitted.contains(peer_key.trim()),
                "{}: {admitted}",
                h.name()
            );
        }
    }
    // The newcomer is spark on the diagonal, over the LAN.
    let newcomer_path = key_file(e.dir.path(), "ring-newcomer", &newcomer);
    let out = prepared::ssh(&n2.ipv4().to_string(), 22, "spark", &newcomer_path, "true");
    assert!(
        out.status.success(),
        "the newcomer logs into the diagonal: {}",
        text(&out)
    );

    // node3 cannot be reached: node0 applies the list, the push fails naming node3.
    let node0_ip = n0.ipv4();
    n3.sh_ok(&format!("ip route add blackhole {node0_ip}/32"));
    let (status, body) = agent_api(n0, token, "PUT", "/v1/operator-keys", Some(signed(3)));
    n3.sh_ok(&format!("ip route del blackhole {node0_ip}/32"));
    assert_eq!(status, 502, "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    let k3 = index_of(n3);
    assert!(
        message.contains("version 3 applied on node0")
            && message.contains(&format!("node{k3}:"))
            && !message.contains(&format!("node{}:", index_of(n1))),
        "{body}"
    );
    // Sending the same list again lands everywhere.
    let (status, body) = agent_api(n0, token, "PUT", "/v1/operator-keys", Some(signed(3)));
    assert_eq!(status, 200, "{body}");
    assert!(
        n3.sh_ok("cat /home/spark/.ssh/authorized_keys")
            .contains(&public_line(&newcomer))
    );
}
