//! K1 steps 129–132 on real machines: node0's agent binary prepares a pair of Debian host
//! containers joined by cables (`support/cabled.rs`) — peer-access over node1's management
//! address with the login the owner lent (129), node1's subset of the steps over SSH as
//! spark with node0's peer key (130–131), the rail plan's addresses on the ports the probe
//! recorded (rail-network, netplan), and traffic of the rail's whole MTU across every cable
//! from both ends (rail-verify, 132), and serving's heartbeat counting the machines on each rail
//! under its own unit (133). The probe (125) that records peer.json is the real one,
//! run by the same binary first. What no container has (a GB10, ConnectX-7 RDMA) is the bed's
//! only simulated part, as in `cabled.rs`.

#[path = "pair_prepare/instances.rs"]
mod instances;
use crate::support;

use std::time::Instant;

use serde_json::{Value, json};
use support::cabled::{Bed, Capture, PASSWORD, USER, ipv4, wait_for, whole_mtu_passes};
use support::prepared::{self, public_line, ssh, text};

/// The staff-only pair profile's constants (`linux-test-2`, migration 0019): a pair's two
/// rails at a QSFP's MTU, and what a Debian container can prepare.
fn linux_test_2() -> Value {
    json!({"gpu_model": null, "gpu_count": null, "gpu_mem_mib": null, "arch": null,
           "cuda_repo_arch": "x86_64", "node_count": 2,
           "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000},
                     {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000}],
           "prepare": {"lxd": "apt", "storage_driver": "dir", "pool_size": "20GiB",
                       "zfs_arc_max": 1073741824, "base_image": "minimal", "tunnel": false}})
}

#[test]
fn k1_129_132_node0_prepares_node1_over_ssh_and_proves_every_cable() {
    let began = Instant::now();
    let Some(bed) = Bed::pair("p15-prep") else {
        return;
    };
    let (n0, n1) = (&bed.node0, &bed.node1);
    let e = prepared::enroll_into(n0, None, "linux-test-2", linux_test_2());
    // Two cables at a QSFP's MTU, crossed (node0's rail0 lands on node1's rail1), each
    // showing node1's two PCIe functions: K's own example of a recorded fact.
    bed.lend_login(PASSWORD);
    bed.cable_with_mtu(&[(n0, "rail0"), (n1, "rail1"), (n1, "rail1b")], Some(9000));
    bed.cable_with_mtu(&[(n0, "rail1"), (n1, "rail0"), (n1, "rail0b")], Some(9000));
    let (code, decision, said) = bed.probe(&[]);
    assert_eq!(
        code,
        Some(0),
        "the probe would enrol the pair: {said}\n{decision}"
    );
    let node1_ip = n1.ipv4().to_string();
    let lap = Instant::now();

    // --- The whole preparation, by node0's agent alone.
    let (ok, said) = prepared::prepare(n0, &[]);
    if !ok {
        // What node1's nested LXD said, for a base-image that would not build there.
        let logs = n1.sh("tail -n 40 /var/log/lxd/lxd.log /var/log/lxd/*/lxc.log 2>&1");
        panic!(
            "the pair prepares: {said}\n--- node1's LXD:\n{}",
            text(&logs)
        );
    }
    let prepared_in = lap.elapsed().as_secs_f64();
    // node1's subset ran there, each step reported with index 1, in node0's order.
    for step in byo_agent::prepare::peers::satellite_steps() {
        assert!(
            said.lines()
                .any(|l| l.trim_start().starts_with(&format!("node1 {step} "))),
            "no progress of node1's {step}:\n{said}"
        );
    }

    // 130–132: each machine's rails as host-report's rails carry them to the backend,
    // after rail-network and again once rail-verify proved every cable.
    for line in [
        "node0 rails: rail0 192.168.100.10/24, rail1 192.168.101.10/24",
        "node1 rails: rail0 192.168.101.11/24, rail1 192.168.100.11/24",
        "node0 rails: rail0 192.168.100.10/24, rail1 192.168.101.10/24, verified",
        "node1 rails: rail0 192.168.101.11/24, rail1 192.168.100.11/24, verified",
    ] {
        assert!(
            said.lines().any(|l| l.trim() == line),
            "no {line:?} in:\n{said}"
        );
    }

    // 129, peer-access: the lent login is gone from node0 and refused on node1; node1 admits
    // spark with node0's peer key (made by node0, root-only) and with the operator's key.
    assert_eq!(
        n0.sh("test -e /etc/enverge/peer-login").status.code(),
        Some(1),
        "peer-login is deleted once node1 admits spark"
    );
    assert_eq!(
        n0.sh_ok("stat -c '%a %U' /etc/enverge/peer.key").trim(),
        "600 root"
    );
    let peer_public = n0.sh_ok("cat /etc/enverge/peer.key.pub");
    let admitted = n1.sh_ok("cat /home/spark/.ssh/authorized_keys");
    let operator = ssh_key::PrivateKey::read_openssh_file(&e.operator_key).unwrap();
    assert!(
        admitted.contains(peer_public.trim()) && admitted.contains(&public_line(&operator)),
        "node1's spark admits node0's peer key and the operator: {admitted}"
    );
    let out = ssh(&node1_ip, 22, "spark", &e.operator_key, "sudo -n true");
    assert!(
        out.status.success(),
        "the operator is root on node1: {}",
        text(&out)
    );
    let out = n0.sh(&format!(
        "ssh -i /etc/enverge/peer.key -o BatchMode=yes -o StrictHostKeyChecking=yes \
         -o UserKnownHostsFile=/etc/enverge/peer-1.known_hosts spark@{node1_ip} sudo -n true"
    ));
    assert!(
        out.status.success(),
        "node0 reaches node1 as spark with its peer key, node1's host key pinned: {}",
        text(&out)
    );
    let lent = std::process::Command::new("sshpass")
        .args(["-p", PASSWORD, "ssh", "-o", "StrictHostKeyChecking=no"])
        .args([
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=10",
        ])
        .args(["-o", "PubkeyAuthentication=no"])
        .arg(format!("{USER}@{node1_ip}"))
        .arg("true")
        .output()
        .expect("run sshpass (scripts/test installs it)");
    assert!(
        !lent.status.success(),
        "node1's lent login is locked out with node0's owner: {}",
        text(&lent)
    );

    // 130–131, node1's own preparation: what node0's is, without a relay.
    assert!(
        n1.sh("systemctl is-active --quiet earlyoom && lxc image alias list --format csv | grep -q lofispark-base")
            .status
            .success(),
        "node1 has earlyoom running and the base image"
    );
    assert_eq!(
        n1.sh("test -e /etc/wireguard/wg0.conf").status.code(),
        Some(1),
        "a satellite has no relay"
    );

    // rail-network: the plan's address per cable — the subnet's tenth host plus the node's
    // index — on the ports the probe recorded, at the rail's MTU; the twins stay bare.
    for (host, iface, want) in [
        (n0, "rail0", "192.168.100.10/24"),
        (n0, "rail1", "192.168.101.10/24"),
        (n1, "rail1", "192.168.100.11/24"),
        (n1, "rail0", "192.168.101.11/24"),
    ] {
        let (addrs, mtu) = ipv4(host, iface);
        assert_eq!(
            (addrs, mtu),
            (vec![want.to_owned()], 9000),
            "{} {iface}",
            host.name()
        );
    }
    for iface in ["rail0b", "rail1b"] {
        assert!(
            ipv4(n1, iface).0.is_empty(),
            "node1's {iface} has no rail address"
        );
    }
    assert_eq!(
        n0.sh_ok("stat -c %a /etc/netplan/60-enverge-rails.yaml")
            .trim(),
        "600"
    );

    // 132, rail-verify's claim, seen from outside it: a whole 9000-byte frame crosses each
    // cable both ways.
    for (from, iface, to) in [
        (n0, "rail0", "192.168.100.11"),
        (n0, "rail1", "192.168.101.11"),
        (n1, "rail1", "192.168.100.10"),
        (n1, "rail0", "192.168.101.10"),
    ] {
        assert!(
            whole_mtu_passes(from, iface, to, 9000),
            "{} {iface} → {to}",
            from.name()
        );
    }

    // 133: serving, as its unit runs it (spark, no new privileges), counts the machines on
    // each of node0's rails in every beat — node1's two functions on a cable are one machine,
    // by the addresses the probe saw node1 hold, handed over with the rail ports.
    let handed_path = byo_core::render::units::HANDED_OVER;
    let mut handed: Value = serde_json::from_str(&n0.sh_ok(&format!("cat {handed_path}"))).unwrap();
    assert_eq!(handed["rail_ports"], json!(["rail0", "rail1"]));
    for iface in ["rail0", "rail0b", "rail1", "rail1b"] {
        let addr = Bed::link_local(n1, iface);
        assert_eq!(
            handed["rail_neighbours"][&addr], 1,
            "{iface} {addr}: {handed}"
        );
    }
    let beats = Capture::on("/api/host/heartbeat", 204, "");
    let kept_as = n0.sh_ok(&format!("stat -c '%U:%G %a' {handed_path}"));
    let (owner, mode) = kept_as.trim().split_once(' ').unwrap();
    handed["server"] = json!(beats.url);
    n0.write(handed_path, handed.to_string().as_bytes(), 0o600);
    n0.sh_ok(&format!(
        "chown {owner} {handed_path} && chmod {mode} {handed_path}"
    ));
    prepared::install_units(n0, 2);
    n0.sh_ok("systemctl start enverge-agent.service");
    let counted = wait_for(std::time::Duration::from_secs(90), || {
        beats.bodies.lock().unwrap().iter().find_map(|b| {
            let beat: Value = serde_json::from_str(b).ok()?;
            let n = beat["details"]["rail_neighbours"].clone();
            n.is_object().then_some(n)
        })
    });
    let Some(counted) = counted else {
        let journal = n0.sh("journalctl -u enverge-agent.service -n 40 --no-pager");
        panic!("no beat counted the rails in 90 s:\n{}", text(&journal));
    };
    assert_eq!(counted, json!({"rail0": 1, "rail1": 1}));
    n0.sh_ok("systemctl stop enverge-agent.service");

    // The deliberate run (L) re-checks every step on both machines, whatever the done list
    // says: nothing changes on a prepared pair.
    let lap = Instant::now();
    let (ok, said) = prepared::prepare(n0, &["--again"]);
    assert!(
        ok && said.contains("every step checked, 0 changed"),
        "a prepared pair checks clean: {said}"
    );
    let checked_in = lap.elapsed().as_secs_f64();

    // L rule 5: node1 is asked too. An instance running there holds the rails, and the
    // deliberate run refuses, naming it, before touching either machine.
    n1.sh_ok("lxc launch lofispark-base w1-test --profile lofispark-base >/dev/null");
    let (ok, said) = prepared::prepare(n0, &["--again"]);
    assert!(
        !ok && said.contains("an instance holds the rails: w1-test on node1")
            && said.contains("Nothing was changed"),
        "a worker running on node1 holds the rails: {said}"
    );
    n1.sh_ok("lxc delete --force w1-test");

    // A cable end left at 1500 (a port that lost its netplan MTU): the deliberate run
    // names that cable and changes nothing — the addresses stay, nothing is rolled back.
    n1.sh_ok("ip link set rail0 mtu 1500");
    let (ok, said) = prepared::prepare(n0, &["--again"]);
    assert!(!ok, "rail-verify fails on a short cable end: {said}");
    assert!(
        said.contains("rail-verify")
            && said.contains("rail 1: node1 rail0 → node0 192.168.101.10 does not carry the rail's MTU 9000 unfragmented"),
        "the short end is named: {said}"
    );
    assert!(
        !said.contains("rail 0:"),
        "the other cable is not named: {said}"
    );
    assert_eq!(ipv4(n1, "rail0").0, vec!["192.168.101.11/24".to_owned()]);
    assert_eq!(ipv4(n0, "rail1").0, vec!["192.168.101.10/24".to_owned()]);

    // K1 note 11 and lockstep on the prepared pair (the cable's MTU back first).
    n1.sh_ok("ip link set rail0 mtu 9000");
    instances::k1_11_the_instance_is_a_head_and_its_worker_kept_in_lockstep(&bed, &e);

    eprintln!(
        "figure: pair preparation from node0 {prepared_in:.1} s; every step checked again {checked_in:.1} s; whole scenario {:.1} s",
        began.elapsed().as_secs_f64()
    );
}
