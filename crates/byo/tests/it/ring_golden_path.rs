//! K2's "done when", on real parts: four Debian host containers on a switchless ring (the cable
//! bed of `byo-agent/tests/it/support/cabled.rs`: node0 cabled to two machines, the diagonal to
//! those two only, the rack neighbour on the management LAN accepting the same login) enrol
//! from the one-liner run on node0 alone (`--peer --nodes=4`, the satellites' one login from a
//! root-only file) against the real server (SQLite) with a real relay. Redeem writes four
//! host_nodes rows from the walk's evidence; node0 prepares its three satellites (the diagonal
//! over the management network) and proves every cable from both ends; an operator activates
//! it; a customer rents four containers and their plain `ssh` lands in the head, which reaches
//! every worker over every rail, the diagonal's through a neighbour that forwards. M.4: a
//! published operator key reaches every machine; a satellite that does not answer fails the
//! push, named on the host's push record, and "send again" repairs it. Delete takes all four.

use crate::cabled;
use crate::cabled_platform;
use crate::host_container;
use crate::relay_support;
use crate::support;

use std::time::Duration;

use byo_db::hosts::HostNodeRow;
use cabled::{Bed, containers, head_to_worker, ipv4, wait_for, whole_mtu_passes};
use cabled_platform::{Enrolled, Platform, journal};
use host_container::HostContainer;
use relay_support::kernel_parts;
use serde_json::json;
use support::platform;

/// The plan's address of `node` on `rail` (the subnet's tenth host plus the node's index).
fn addr(rail: u64, node: u64) -> String {
    format!("192.168.{}.{}", 100 + rail, 10 + node)
}

/// The node index redeem gave `h`: the row holding the hardware id its GPU reports.
fn index_of(rows: &[HostNodeRow], n0: &HostContainer, h: &HostContainer) -> u64 {
    if h.name() == n0.name() {
        return 0;
    }
    let smi = h.sh_ok("nvidia-smi");
    let uuid = smi
        .split(", ")
        .nth(1)
        .unwrap_or_else(|| panic!("nvidia-smi on {} printed {smi:?}", h.name()))
        .trim();
    let hw = byo_agent::detect::hardware_id(&[uuid.to_owned()]).unwrap();
    rows.iter()
        .find(|r| r.hardware_id == hw)
        .unwrap_or_else(|| panic!("no row holds {}'s hardware id {hw}", h.name()))
        .index as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn k2_a_ring_enrols_from_the_one_liner_prepares_is_activated_and_rented() {
    if !kernel_parts(&["ip", "nft", "wg", "wireguard-go", "caddy", "ssh", "lxc"]) {
        return;
    }
    let Some(bed) = Bed::ring("byo-gring") else {
        return;
    };
    bed.netplan();
    let (n0, n1) = (&bed.node0, &bed.node1);
    let (n2, n3) = (&bed.more[0], &bed.more[1]);
    // The ring's staff-only test profile (migration 0019): four rails at 9000.
    let p = Platform::start("byo-gring", "linux-test-4").await;

    // node0–node1, node0–node3, node1–node2, node3–node2: node2 is the diagonal.
    let ring: [(&HostContainer, &str, &HostContainer, &str); 4] = [
        (n0, "rail0", n1, "rail0"),
        (n0, "rail1", n3, "rail0"),
        (n1, "rail1", n2, "rail0"),
        (n3, "rail1", n2, "rail1"),
    ];
    for (a, pa, b, pb) in ring {
        bed.cable_with_mtu(&[(a, pa), (b, pb)], Some(9000));
    }

    // A–C: the one-liner on node0 alone walks the ring; redeem writes four rows.
    let Enrolled { host_id, relay } = p.enrol(n0, "linux-test-4", 4).await;

    // 129–132: node0 prepares its three satellites and proves every cable.
    let (rows, _) = p.prepared(&host_id, n0, 2).await;
    let index_of = |h: &HostContainer| index_of(&rows, n0, h);
    // Each cable's rail, numbered by (lower node, higher node).
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
    let said = journal(n0, 3000);
    for k in 1..=3 {
        for step in byo_agent::prepare::peers::satellite_steps() {
            assert!(
                said.contains(&format!("node{k} {step} ")),
                "no progress of node{k}'s {step} in the preparation's journal:\n{said}"
            );
        }
    }
    // Each cable addressed at both ends with the plan's address for that node on that rail,
    // at 9000, and whole frames crossing it each way (the diagonal's two included).
    for (a, pa, b, pb) in ring {
        let rail = rail_of(a, b);
        for (h, port, other) in [(a, pa, b), (b, pb, a)] {
            let want = format!("{}/24", addr(rail, index_of(h)));
            assert_eq!(ipv4(h, port), (vec![want], 9000), "{} {port}", h.name());
            let far = addr(rail, index_of(other));
            assert!(
                whole_mtu_passes(h, port, &far, 9000),
                "{} {port} → {far}",
                h.name()
            );
        }
    }

    // D + E: activated and rented; the customer's ssh lands in the head, and each satellite
    // runs its worker.
    let (vm_id, name) = p.rent(&host_id, "linux-test-4", &relay).await;
    for h in [n1, n2, n3] {
        let worker = format!("{name}-w{},RUNNING", index_of(h));
        assert!(
            containers(h).contains(&worker),
            "{}: {}",
            h.name(),
            containers(h)
        );
    }
    // The head reaches every worker as user, on every rail address it has: the diagonal's
    // too, though no cable of the head's goes there (one hop through a neighbour).
    for (a, _, b, _) in ring {
        let rail = rail_of(a, b);
        for h in [a, b].into_iter().filter(|h| h.name() != n0.name()) {
            let k = index_of(h);
            let at = addr(rail, k);
            assert_eq!(
                head_to_worker(n0, &name, "/root/.ssh/id_dropbear", &at),
                Ok(format!("{name}-w{k}")),
                "the head reaches node{k}'s worker at {at}"
            );
        }
    }
    // And the diagonal's worker reaches the head (the route back).
    let diagonal = index_of(n2);
    let head_addr = addr(rail_of(n0, n1), 0);
    let back = n2.sh(&format!(
        "lxc exec {name}-w{diagonal} -- ping -c 2 -W 2 {head_addr}"
    ));
    assert!(
        back.status.success(),
        "the diagonal's worker reaches the head: {}",
        String::from_utf8_lossy(&back.stdout)
    );
    let cluster = n0.sh_ok(&format!("lxc exec {name} -- cat /etc/enverge/cluster.md"));
    assert!(
        cluster.contains(&format!(
            "{name}-w{diagonal} (node{diagonal}) has no cable to the head"
        )),
        "{cluster}"
    );
    p.phase("the head reaches every worker, the diagonal's through a neighbour");

    m_4_a_published_key_reaches_every_machine_of_the_ring(&p, &bed, &host_id, index_of(n3)).await;

    // G: delete takes all four, and every machine's cables are addressed again.
    p.delete(&vm_id).await;
    for h in [n0, n1, n2, n3] {
        assert!(
            !containers(h).contains(&name),
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
    p.phase("deleted: the head and its three workers gone");
}

/// M.4 on a ring, through the platform: a key the operator adds and staff sign is pushed to
/// node0, and serving writes it to every satellite's spark (the diagonal over the management
/// network too), node0's peer key kept. With node3 unreachable the push fails, the host's
/// push record naming node3 alone; once node3 answers, "send again" lands it (M.6).
async fn m_4_a_published_key_reaches_every_machine_of_the_ring(
    p: &Platform,
    bed: &Bed,
    host_id: &str,
    k3: u64,
) {
    let (n0, n1) = (&bed.node0, &bed.node1);
    let (n2, n3) = (&bed.more[0], &bed.more[1]);
    let line = |k: &ssh_key::PrivateKey| {
        let l = k.public_key().to_openssh().unwrap();
        l.split_whitespace().nth(1).unwrap().to_owned()
    };
    let peer_key = n0.sh_ok("cat /etc/enverge/peer.key.pub");
    let peer_key = peer_key.split_whitespace().nth(1).unwrap().to_owned();
    let desk = byo_core::keylist_testing::private_key();
    let pushed = platform::publish_operator_key(
        &p.api,
        &p.people.operator,
        &p.people.staff,
        &p.signing,
        &desk,
    )
    .await;
    assert_eq!(
        (&pushed["delivered"], &pushed["failed"]),
        (&json!(1), &json!(0)),
        "{pushed}"
    );
    for h in [n0, n1, n2, n3] {
        let admitted = h.sh_ok("cat /home/spark/.ssh/authorized_keys");
        assert!(admitted.contains(&line(&desk)), "{}: {admitted}", h.name());
        if h.name() != n0.name() {
            assert!(admitted.contains(&peer_key), "{}: {admitted}", h.name());
        }
    }
    // The new key is spark on the diagonal, over the LAN.
    let desk_file = platform::key_file(&p.work.path().join("desk"), &desk);
    let landed = support::ssh(&desk_file, &[&format!("spark@{}", n2.ipv4()), "true"]);
    assert!(
        landed.is_ok(),
        "the new key logs into the diagonal: {landed:?}"
    );
    p.phase("M.4: a published key on every machine of the ring");

    // node3 cannot be reached from node0: node0 applies the list, the push fails naming node3.
    let late = byo_core::keylist_testing::private_key();
    let node0_ip = n0.ipv4();
    n3.sh_ok(&format!("ip route add blackhole {node0_ip}/32"));
    let asked = std::time::Instant::now();
    let pushed = platform::publish_operator_key(
        &p.api,
        &p.people.operator,
        &p.people.staff,
        &p.signing,
        &late,
    )
    .await;
    let took = asked.elapsed().as_secs_f64();
    n3.sh_ok(&format!("ip route del blackhole {node0_ip}/32"));
    let record = p
        .store
        .key_push_status()
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.host_id == host_id)
        .unwrap();
    let error = record.error.unwrap_or_default();
    assert_eq!(
        (&pushed["delivered"], &pushed["failed"]),
        (&json!(0), &json!(1)),
        "{pushed}"
    );
    eprintln!("the push with node{k3} unreachable answered in {took:.1} s: {error}");
    if !error.contains("applied on node0") {
        let serving = n0.sh("journalctl -u enverge-agent.service -n 60 --no-pager");
        eprintln!(
            "serving's journal:\n{}",
            String::from_utf8_lossy(&serving.stdout)
        );
    }
    let version = pushed["version"].as_i64().unwrap();
    assert!(
        error.contains(&format!("version {version} applied on node0"))
            && error.contains(&format!("node{k3}:"))
            && ![1, 2, 3]
                .iter()
                .filter(|k| **k != k3)
                .any(|k| error.contains(&format!("node{k}:"))),
        "{error}"
    );
    assert!(
        !n3.sh_ok("cat /home/spark/.ssh/authorized_keys")
            .contains(&line(&late))
    );
    // Once node3 answers, the operator sends the same list again and it lands there.
    let (status, again) = p
        .api
        .call(
            reqwest::Method::POST,
            &format!("/api/admin/operator-keys/hosts/{host_id}/send"),
            &p.people.operator,
            None,
        )
        .await;
    assert_eq!(
        (status, &again["delivered"], &again["failed"]),
        (200, &json!(1), &json!(0)),
        "{again}"
    );
    assert!(
        n3.sh_ok("cat /home/spark/.ssh/authorized_keys")
            .contains(&line(&late))
    );
    p.phase("M.4: a satellite's failed push named, and sent again");
}
