//! K1's "done when", on real parts: a pair of Debian host containers joined by cables (the
//! cable bed of `byo-agent/tests/it/support/cabled.rs`) enrols from the one-liner run on node0
//! alone (`--peer --nodes=2`, node1's login from a root-only file), against the real server
//! (SQLite) with a real relay; redeem writes both host_nodes rows from the cable's evidence;
//! node0 prepares node1 over SSH and the rails are proved; an operator activates it; a customer
//! rents it, and their plain `ssh` to the relay lands in the head, which reaches its worker on
//! node1 as `user` over the rail. Delete takes both containers. Then H on a pair: uninstall on
//! node0 hands node1 back first, over the management network, and then node0 itself.

use crate::cabled;
use crate::cabled_platform;
use crate::relay_support;

use cabled::{Bed, containers, head_to_worker};
use cabled_platform::{Enrolled, Platform};
use relay_support::kernel_parts;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn k1_a_pair_enrols_from_the_one_liner_prepares_is_activated_and_rented() {
    if !kernel_parts(&["ip", "nft", "wg", "wireguard-go", "caddy", "ssh", "lxc"]) {
        return;
    }
    let Some(bed) = Bed::pair("byo-gpair") else {
        return;
    };
    let (n0, n1) = (&bed.node0, &bed.node1);
    // The pair's staff-only test profile (migration 0019).
    let p = Platform::start("byo-gpair", "linux-test-2").await;

    // Two cables at a QSFP's MTU, crossed, each showing node1's two PCIe functions.
    bed.cable_with_mtu(&[(n0, "rail0"), (n1, "rail1"), (n1, "rail1b")], Some(9000));
    bed.cable_with_mtu(&[(n0, "rail1"), (n1, "rail0"), (n1, "rail0b")], Some(9000));

    // A–C: the one-liner on node0 alone; redeem writes both machines from the cable's
    // evidence.
    let Enrolled { host_id, relay } = p.enrol(n0, "linux-test-2", 2).await;

    // 129–132: node0 prepares node1 and proves both cables; the rows say so.
    p.prepared(&host_id, n0, 2).await;

    // D + E: activated and rented; the customer's ssh lands in the head.
    let (vm_id, name) = p.rent(&host_id, "linux-test-2", &relay).await;
    let worker = format!("{name}-w1");
    assert!(
        containers(n1).contains(&format!("{worker},RUNNING")),
        "{}",
        containers(n1)
    );
    // The head reaches its worker as user over each rail.
    for addr in ["192.168.100.11", "192.168.101.11"] {
        assert_eq!(
            head_to_worker(n0, &name, "/root/.ssh/id_dropbear", addr),
            Ok(worker.clone()),
            "over {addr}"
        );
    }

    // G: delete takes both containers.
    p.delete(&vm_id).await;
    assert!(!containers(n0).contains(&name), "{}", containers(n0));
    assert!(!containers(n1).contains(&worker), "{}", containers(n1));
    p.phase("deleted: head and worker gone");

    // H on a pair (issue #39, 4): uninstall on node0 hands node1 back first, from node0 over
    // the management network, then node0 itself; each owner administers their machine again
    // and nothing of ours is left on either.
    let what_is_ours = "for p in /etc/enverge /var/lib/enverge-agent /etc/sudoers.d/enverge-spark \
                  /etc/netplan/60-enverge-rails.yaml /home/spark; do
           if [ -e \"$p\" ]; then echo \"left: $p\"; fi; done
         id spark 2>&1 || true; nft list tables; lxc query /1.0/profiles
         ls /etc/systemd/system | grep -i enverge || true";
    let before = n1.sh_ok(what_is_ours);
    for there in [
        "left: /etc/enverge",
        "left: /etc/sudoers.d/enverge-spark",
        "left: /etc/netplan/60-enverge-rails.yaml",
        "enverge_tenants",
        "lofispark-base",
        "uid=",
    ] {
        assert!(before.contains(there), "{there} on node1 before:\n{before}");
    }
    let ran = n0.sh("/usr/local/bin/byo-agent uninstall --yes --keep-lxd --owner owner 2>&1");
    let said = String::from_utf8_lossy(&ran.stdout).into_owned();
    eprintln!("--- uninstall on node0:\n{said}");
    assert!(ran.status.success(), "{said}");
    for line in [
        "    node1 owner-restore",
        "    node1 host-settings    removed",
        "    node1 spark-access     removed",
        "  satellites       removed",
        "  agent-files      removed",
        "uninstalled in",
    ] {
        assert!(said.contains(line), "{line:?} in:\n{said}");
    }
    assert!(
        said.find("node1 spark-access").unwrap() < said.find("  instances ").unwrap(),
        "node1 goes before node0's own removals:\n{said}"
    );
    p.phase("uninstalled: node1 handed back from node0, then node0");
    for (name, node) in [("node0", n0), ("node1", n1)] {
        let left = node.sh_ok(what_is_ours);
        for gone in ["left: ", "enverge", "lofispark", "uid="] {
            assert!(!left.contains(gone), "{gone} left on {name}:\n{left}");
        }
        let owner = node.sh_ok("passwd -S owner; id -nG owner");
        assert!(
            owner.starts_with("owner P ") && owner.contains("sudo"),
            "{name}'s owner: {owner}"
        );
    }
}
