//! K1 note 3 on real machines: the cable probe (step 125) and the evidence it sends at 126,
//! run by the agent binary on node0 of the cable bed (`support/cabled.rs`: Debian host
//! containers joined by point-to-point cables, sharing a management LAN with a machine that
//! accepts the same login). One bed for every variant, re-cabled between them; each variant
//! prints its time.

use crate::support;

use std::time::Instant;

use byo_core::tokens::{SecretToken, TokenKind};
use serde_json::Value;
use support::cabled::{Bed, Capture, PASSWORD};

fn hardware_id(uuid: &str) -> String {
    byo_agent::detect::hardware_id(&[format!("GPU-{uuid}")]).unwrap()
}

const NODE1_UUID: &str = "1111bbbb-1111-4111-8111-111111111111";
const NODE0_UUID: &str = "0000aaaa-0000-4000-8000-000000000000";

fn kind(j: &Value, port: &str) -> String {
    j["ports"][port]["kind"]
        .as_str()
        .unwrap_or("none")
        .to_owned()
}

fn rail(j: &Value, port: &str) -> (u64, Option<u64>) {
    let r = j["rails"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["iface"] == port)
        .unwrap_or_else(|| panic!("no rail {port} in {j}"));
    (
        r["neighbours_discovered"].as_u64().unwrap(),
        r["index"].as_u64(),
    )
}

fn enroll(bed: &Bed, server: &str) -> (Option<i32>, String) {
    let token = SecretToken::generate(TokenKind::Enrollment);
    let out = bed.node0.sh(&format!(
        "/usr/local/bin/byo-agent enroll --server {server} --token {} \
         --retry-every 1 --give-up-after 2 --probe-every 1 --probe-for 2",
        token.expose()
    ));
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("enroll exited {:?}:\n{said}", out.status.code());
    (out.status.code(), said)
}

#[test]
fn k1_125_the_cable_probe_on_cabled_debian_hosts() {
    let began = Instant::now();
    let Some(bed) = Bed::launch("p15-cable") else {
        return;
    };
    let (n0, n1, x) = (&bed.node0, &bed.node1, bed.extra());
    let node1_hw = hardware_id(NODE1_UUID);
    let mut lap = Instant::now();
    let mut lap_done = |name: &str| {
        eprintln!("== {name}: {:.1} s", lap.elapsed().as_secs_f64());
        lap = Instant::now();
    };

    // --- A link per cable, crossed, each QSFP showing two of node1's addresses.
    bed.lend_login(PASSWORD);
    bed.cable(&[(n0, "rail0"), (n1, "rail1"), (n1, "rail1b")]);
    bed.cable(&[(n0, "rail1"), (n1, "rail0"), (n1, "rail0b")]);
    let (code, j, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(j["decision"], "enroll");
    assert_eq!(kind(&j, "rail0"), "link");
    assert_eq!(
        j["ports"]["rail0"]["remote"],
        serde_json::json!(["rail1", "rail1b"])
    );
    assert_eq!(
        j["ports"]["rail1"]["remote"],
        serde_json::json!(["rail0", "rail0b"])
    );
    // Machines, not addresses: one per port.
    assert_eq!(rail(&j, "rail0"), (1, Some(0)));
    assert_eq!(rail(&j, "rail1"), (1, Some(1)));
    let peers = j["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1, "only node1 is a peer: {j}");
    assert_eq!(peers[0]["hardware_id"], node1_hw.as_str());
    assert_eq!(peers[0]["node_index"], 1);
    // The crossed cable is a recorded fact, in peer.json on the spot, root-only.
    let recorded: Value =
        serde_json::from_slice(&n0.read("/etc/enverge/peer.json").expect("peer.json")).unwrap();
    assert_eq!(recorded, j["peer_file"]);
    let links: Vec<(u64, String, String)> = recorded["peers"][0]["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["index"].as_u64().unwrap(),
                l["local"].as_str().unwrap().to_owned(),
                l["remote"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        links,
        vec![
            (0, "rail0".into(), "rail1".into()),
            (1, "rail1".into(), "rail0".into())
        ]
    );
    let node1_ll = Bed::link_local(n1, "rail1");
    assert_eq!(
        recorded["peers"][0]["links"][0]["neighbour_addr"],
        format!("{node1_ll}%rail0").as_str()
    );
    assert_eq!(n0.sh_ok("stat -c %a /etc/enverge/peer.json").trim(), "600");
    let host_key = n1.sh_ok("cut -d' ' -f1,2 /etc/ssh/ssh_host_ed25519_key.pub");
    assert_eq!(recorded["peers"][0]["host_key"], host_key.trim());
    // The login is kept for 129 (peer-access deletes it), not here.
    assert!(n0.read("/etc/enverge/peer-login").is_some());
    lap_done("link, crossed, two addresses per QSFP");

    // --- Again: peer-prep changes nothing, and the numbering recorded stands even when it is
    // not what the port order would give.
    let swapped = n0.sh_ok(
        "sed -i 's/\"index\": 0/\"index\": 9/; s/\"index\": 1,/\"index\": 0,/; s/\"index\": 9/\"index\": 1/' /etc/enverge/peer.json && cat /etc/enverge/peer.json",
    );
    let (code, j, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        !said.contains("peer-prep on"),
        "a second peer-prep changed something:\n{said}"
    );
    assert_eq!(rail(&j, "rail0"), (1, Some(1)), "kept from {swapped}");
    assert_eq!(rail(&j, "rail1"), (1, Some(0)));
    lap_done("kept numbering, idempotent peer-prep");

    // --- The login is wrong: a login failure, named; nothing recorded.
    n0.sh_ok("rm /etc/enverge/peer.json");
    bed.lend_login("not-the-password");
    let (code, j, said) = bed.probe(&[]);
    assert_eq!(code, Some(9), "{said}");
    assert_eq!(j["decision"], "retry");
    assert_eq!(kind(&j, "rail0"), "login_failed");
    assert_eq!(kind(&j, "rail1"), "login_failed");
    assert!(j["why"].as_str().unwrap().contains("peer-login"), "{j}");
    assert!(n0.read("/etc/enverge/peer.json").is_none());
    lap_done("login failure");

    // --- Enrolment with the wrong login sends nothing (the token stays unspent); with the
    // right one it sends the rails and node1, and never the password nor a link-local address.
    // A stand-in for host-enroll that keeps every body and turns each away (422).
    let server = Capture::on(
        "/api/enroll",
        422,
        r#"{"error":"rejected","message":"captured by the test"}"#,
    );
    let (code, said) = enroll(&bed, &server.url);
    assert_eq!(code, Some(9), "{said}");
    assert!(server.bodies.lock().unwrap().is_empty());
    bed.lend_login(PASSWORD);
    let (code, said) = enroll(&bed, &server.url);
    assert_eq!(code, Some(5), "turned away by the capture: {said}");
    let bodies = server.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1);
    let sent: Value = serde_json::from_str(&bodies[0]).unwrap();
    assert_eq!(sent["hardware_id"], hardware_id(NODE0_UUID).as_str());
    assert_eq!(sent["peers"][0]["hardware_id"], node1_hw.as_str());
    assert_eq!(sent["peers"][0]["node_index"], 1);
    let ported: Vec<(String, u64, Option<u64>)> = sent["rails"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["iface"].as_str().unwrap().to_owned(),
                r["neighbours_discovered"].as_u64().unwrap(),
                r["index"].as_u64(),
            )
        })
        .collect();
    assert_eq!(
        ported,
        vec![("rail0".into(), 1, Some(0)), ("rail1".into(), 1, Some(1))]
    );
    assert!(!bodies[0].contains(PASSWORD), "the password was sent");
    assert!(
        !bodies[0].contains("fe80"),
        "a link-local address was sent: {}",
        bodies[0]
    );
    lap_done("enrolment evidence");

    // --- A cloned identity: node1 reports node0's GPUs. A self-pair is a retry, nothing sent.
    n1.sh_ok(&format!(
        "sed -i 's/GPU-{NODE1_UUID}/GPU-{NODE0_UUID}/' /usr/local/bin/nvidia-smi"
    ));
    let (code, said) = enroll(&bed, &server.url);
    assert_eq!(code, Some(9), "{said}");
    assert!(said.contains("this machine itself"), "{said}");
    assert_eq!(
        server.bodies.lock().unwrap().len(),
        1,
        "a self-pair sent something"
    );
    n1.sh_ok(&format!(
        "sed -i 's/GPU-{NODE0_UUID}/GPU-{NODE1_UUID}/' /usr/local/bin/nvidia-smi"
    ));
    lap_done("self-pair");

    // --- A cable looped between node0's own two ports finds nothing.
    bed.uncable();
    bed.cable(&[(n0, "rail0"), (n0, "rail1")]);
    let (code, j, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(kind(&j, "rail0"), "looped");
    assert_eq!(kind(&j, "rail1"), "looped");
    assert_eq!(j["peers"], serde_json::json!([]));
    lap_done("looped cable");

    // --- A missing cable: one link, the other port without a cable; still a pair.
    bed.uncable();
    bed.cable(&[(n0, "rail0"), (n1, "rail0"), (n1, "rail0b")]);
    let (code, j, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(kind(&j, "rail0"), "link");
    assert_eq!(kind(&j, "rail1"), "no_cable");
    assert_eq!(rail(&j, "rail1"), (0, None));
    lap_done("missing cable");

    // --- The owner's LAN in a QSFP port: node1 and the rack neighbour (same login) on one
    // wire. A LAN, left alone; the neighbour is never a peer.
    bed.cable(&[(n0, "rail1"), (n1, "rail1"), (x, "lan0")]);
    let (code, j, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(kind(&j, "rail1"), "lan");
    assert_eq!(rail(&j, "rail1"), (2, None));
    assert_eq!(j["peers"].as_array().unwrap().len(), 1);
    assert_eq!(j["peers"][0]["hardware_id"], node1_hw.as_str());
    lap_done("LAN in a QSFP port");

    // --- node1's rail has carrier and no link-local (DGX OS's addr_gen_mode=none): the
    // management LAN wakes it, and the cable answers.
    bed.uncable();
    bed.cable(&[(n0, "rail0"), (n1, "rail0")]);
    n1.sh_ok(
        "sysctl -q -w net.ipv6.conf.rail0.addr_gen_mode=1; ip link set rail0 down; ip link set rail0 up",
    );
    assert_eq!(
        Bed::link_local(n1, "rail0"),
        "",
        "node1's rail still has link-local"
    );
    let (code, j, said) = bed.probe(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("over the management LAN"), "{said}");
    assert_eq!(kind(&j, "rail0"), "link");
    assert_eq!(
        j["peers"].as_array().unwrap().len(),
        1,
        "the rack neighbour became a peer"
    );
    assert_eq!(
        n1.sh_ok("sysctl -n net.ipv6.conf.rail0.addr_gen_mode")
            .trim(),
        "0",
        "peer-prep pinned node1's rail"
    );
    lap_done("LAN fallback wakes node1");

    // --- ENVERGE_PEER_ADDR names node1 outright: no LAN scan, and its login pins its rails.
    n1.sh_ok(
        "sysctl -q -w net.ipv6.conf.rail0.addr_gen_mode=1; ip link set rail0 down; ip link set rail0 up",
    );
    let named = n1.ipv4().to_string();
    let (code, j, said) = bed.probe(&[("ENVERGE_PEER_ADDR", named.as_str())]);
    assert_eq!(code, Some(0), "{said}");
    assert!(!said.contains("over the management LAN"), "{said}");
    assert_eq!(kind(&j, "rail0"), "link");
    assert_eq!(j["peers"][0]["hardware_id"], node1_hw.as_str());
    lap_done("ENVERGE_PEER_ADDR");

    bed.uncable();
    eprintln!(
        "k1_125 on the cable bed: {:.1} s in all",
        began.elapsed().as_secs_f64()
    );
}
