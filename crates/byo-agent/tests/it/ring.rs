//! K2 on real machines: four Debian host containers on a switchless ring (`support/cabled.rs`),
//! node0 cabled to two of them, the diagonal to those two only, and the rack neighbour on the
//! management LAN accepting the same login. The agent binary on node0 walks the cables (step
//! 125 for a ring): its neighbours first, then, one hop through either, the diagonal; the
//! satellites by hardware_id; peer.json ring-shaped; the evidence redeem judges; a fifth
//! machine on the cables refused. The ring's preparation, rent and M.4 run through the real
//! server and relay in `crates/byo/tests/it/ring_golden_path.rs`.

use crate::support;

use std::time::Instant;

use byo_wire::enroll::{EnrollRequest, NodeReport};
use serde_json::Value;
use support::cabled::{Bed, PASSWORD, RING_UUIDS};

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
    eprintln!("== ring suite: {:.1} s", began.elapsed().as_secs_f64());
}
