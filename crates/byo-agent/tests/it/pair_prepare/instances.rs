//! K1 note 11, lockstep and L3 on the prepared pair: the customer's instance is the head on
//! node0 and `<head>-w1` on node1, made, started, stopped and deleted together by node0's
//! serving (its real unit, as spark) over the management network; each container holds its
//! machine's cables (lofispark-dual) with the plan's addresses inside; the head reaches the
//! worker as `user` over each rail with its per-instance launcher key, which the worker
//! alone trusts; the heartbeat brings a worker stopped behind its back in step, and names
//! half a pair on `lxd` when node1 cannot be reached. The relay is the stand-in ssh_mapd of
//! `support::mapd` (the golden path runs the real one).

use std::time::{Duration, Instant};

use byo_core::keylist_testing::private_key;
use serde_json::{Value, json};

use crate::support::cabled::{Bed, containers, head_to_worker, ipv4, wait_for};
use crate::support::host_container::HostContainer;
use crate::support::mapd::FakeMapd;
use crate::support::prepared::{
    Enrollment, agent_api, key_file, public_line, serve_with_mapd, text,
};

/// The newest beat's `(lxd, details)` once `seen` accepts one, within `within`.
fn beat_where(mapd: &FakeMapd, within: Duration, seen: impl Fn(&Value) -> bool) -> Option<Value> {
    let from = mapd.beats.lock().unwrap().len();
    wait_for(within, || {
        mapd.beats.lock().unwrap()[from..]
            .iter()
            .rev()
            .find(|b| seen(b))
            .cloned()
    })
}

pub fn k1_11_the_instance_is_a_head_and_its_worker_kept_in_lockstep(bed: &Bed, e: &Enrollment) {
    let (n0, n1) = (&bed.node0, &bed.node1);
    let began = Instant::now();
    // serving's view of the pair, handed over by preparation: each machine's cables with the
    // plan's addresses (crossed: node0's rail0 lands on node1's rail1), node1's management
    // address and pinned host key, and its own copy of the peer key.
    let handed_path = byo_core::render::units::HANDED_OVER;
    let handed: Value = serde_json::from_str(&n0.sh_ok(&format!("cat {handed_path}"))).unwrap();
    let rails = |i: usize| -> Vec<(String, String)> {
        handed["pair"][i]["rails"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["port"].as_str().unwrap().to_owned(),
                    r["address"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let pairs = |v: &[(&str, &str)]| {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        rails(0),
        pairs(&[
            ("rail0", "192.168.100.10/24"),
            ("rail1", "192.168.101.10/24")
        ])
    );
    assert_eq!(
        rails(1),
        pairs(&[
            ("rail1", "192.168.100.11/24"),
            ("rail0", "192.168.101.11/24")
        ])
    );
    assert_eq!(handed["pair"][1]["mgmt_addr"], json!(n1.ipv4().to_string()));
    assert_eq!(
        n0.sh_ok("stat -c '%U %a' /var/lib/enverge-agent/peer.key")
            .trim(),
        "spark 600",
        "serving's copy of the peer key is spark's alone"
    );

    // The relay and the backend's heartbeat route, on this machine.
    let mapd = serve_with_mapd(n0, e);
    let token = e.agent_token.clone();
    // A whole idle pair beats lxd ok.
    let whole = beat_where(&mapd, Duration::from_secs(30), |b| b["lxd"] == "ok");
    assert!(
        whole.is_some(),
        "an idle pair's beat: {:?}",
        mapd.beats.lock().unwrap().last()
    );

    // K1 11.1: a worker left on node1 from before goes first.
    n1.sh_ok("lxc init lofispark-base old-w1 --profile lofispark-base -c user.enverge.head=old >/dev/null");
    let customer = private_key();
    let customer_path = key_file(e.dir.path(), "pair-customer", &customer);
    n0.push(&customer_path, "/root/customer", 0o600);
    let lap = Instant::now();
    let (status, body) = agent_api(
        n0,
        &token,
        "POST",
        "/v1/vms",
        Some(json!({"name": "c1", "ssh_public_key": public_line(&customer)})),
    );
    let created_in = lap.elapsed().as_secs_f64();
    assert_eq!(status, 201, "{body}");
    let ssh_port = body["ssh_port"].as_u64().unwrap();
    assert!(containers(n0).contains("c1,RUNNING"), "{}", containers(n0));
    let on_node1 = containers(n1);
    assert!(
        on_node1.contains("c1-w1,RUNNING") && !on_node1.contains("old-w1"),
        "node1: {on_node1}"
    );

    // Each container holds its machine's cables, addressed inside; the hosts hold neither.
    for (host, c, port, addr) in [
        (n0, "c1", "rail0", "192.168.100.10/24"),
        (n0, "c1", "rail1", "192.168.101.10/24"),
        (n1, "c1-w1", "rail1", "192.168.100.11/24"),
        (n1, "c1-w1", "rail0", "192.168.101.11/24"),
    ] {
        let inside = host.sh_ok(&format!("lxc exec {c} -- ip -o -4 addr show dev {port}"));
        if !inside.contains(addr) {
            // Seen twice under two lanes while the rails script flushed before it added (a run
            // overlapping the agent's left the port bare); if it shows again, say everything.
            let seen = host.sh(&format!(
                "lxc info {c}; lxc exec {c} -- ip -o addr; lxc exec {c} -- ps; ip -o link; \
                 journalctl -n 60 --no-pager"
            ));
            panic!(
                "{c} {port} is not addressed inside: {inside:?}\n{}\n{}",
                String::from_utf8_lossy(&seen.stdout),
                String::from_utf8_lossy(&seen.stderr)
            );
        }
        assert!(
            !host
                .sh(&format!("ip link show dev {port}"))
                .status
                .success(),
            "{} still holds {port}",
            host.name()
        );
    }

    // The customer's ssh lands in the head; the head reaches the worker as user over each
    // rail with the launcher key; the worker trusts that key alone.
    let out = n0.sh(&format!(
        "ssh -i /root/customer -p {ssh_port} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 root@10.8.0.2 hostname"
    ));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "c1",
        "{}",
        text(&out)
    );
    for addr in ["192.168.100.11", "192.168.101.11"] {
        assert_eq!(
            head_to_worker(n0, "c1", "/root/.ssh/id_dropbear", addr),
            Ok("c1-w1".to_owned()),
            "over {addr}"
        );
    }
    // The customer's own key, in the head's client's format: the worker refuses it.
    let customer_dropbear = e.dir.path().join("pair-customer.dropbear");
    std::fs::write(
        &customer_dropbear,
        byo_agent::workers::dropbear_private(&customer).unwrap(),
    )
    .unwrap();
    n0.push(&customer_dropbear, "/root/customer.dropbear", 0o600);
    n0.sh_ok("lxc file push /root/customer.dropbear c1/root/customer --mode 0600");
    // dbclient offers its default key (the launcher's) besides -i: set that one aside.
    n0.sh_ok("lxc exec c1 -- mv /root/.ssh/id_dropbear /root/.ssh/launcher.aside");
    let refused = head_to_worker(n0, "c1", "/root/customer", "192.168.100.11");
    n0.sh_ok("lxc exec c1 -- mv /root/.ssh/launcher.aside /root/.ssh/id_dropbear");
    let refused = refused.expect_err("the worker trusts the launcher key alone");
    assert!(
        refused.contains("denied") || refused.contains("No auth methods could be used"),
        "refused for the key, not for its format: {refused}"
    );
    let cluster = n0.sh_ok("lxc exec c1 -- cat /etc/enverge/cluster.md");
    assert!(
        cluster.contains("| node1 | c1-w1 | 192.168.100.11/24, 192.168.101.11/24 |"),
        "{cluster}"
    );

    // Lockstep through the customer's buttons: stop takes both, start brings both back,
    // the worker's rails addressed again by its own boot (L3.2).
    let (status, body) = agent_api(
        n0,
        &token,
        "POST",
        "/v1/vms/c1/state",
        Some(json!({"action": "stop"})),
    );
    assert_eq!(status, 204, "{body}");
    assert!(
        containers(n0).contains("c1,STOPPED") && containers(n1).contains("c1-w1,STOPPED"),
        "{} / {}",
        containers(n0),
        containers(n1)
    );
    // A stopped instance holds no rail: the hosts have their cables back, addressed.
    assert_eq!(ipv4(n0, "rail0").0, vec!["192.168.100.10/24".to_owned()]);
    assert_eq!(ipv4(n1, "rail1").0, vec!["192.168.100.11/24".to_owned()]);
    let (status, body) = agent_api(
        n0,
        &token,
        "POST",
        "/v1/vms/c1/state",
        Some(json!({"action": "start"})),
    );
    assert_eq!(status, 204, "{body}");
    assert!(
        containers(n1).contains("c1-w1,RUNNING"),
        "{}",
        containers(n1)
    );
    let back = wait_for(Duration::from_secs(20), || {
        head_to_worker(n0, "c1", "/root/.ssh/id_dropbear", "192.168.101.11").ok()
    });
    assert_eq!(
        back.as_deref(),
        Some("c1-w1"),
        "the head reaches the restarted worker over the rail"
    );

    // L3: the worker stopped behind node0's back is started again within a beat.
    n1.sh_ok("lxc stop --force c1-w1");
    let mended = beat_where(&mapd, Duration::from_secs(30), |b| {
        b["details"]["lockstep"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m == "start c1-w1 on node1"))
    });
    assert!(
        mended.is_some(),
        "a beat starts the stopped worker: {:?}",
        mapd.beats.lock().unwrap().last()
    );
    assert!(
        containers(n1).contains("c1-w1,RUNNING"),
        "{}",
        containers(n1)
    );

    // Half a pair: node1 unreachable over the management network lands on lxd as degraded,
    // named; it answers again and the pair is whole.
    let node0_ip = n0.ipv4();
    n1.sh_ok(&format!("ip route add blackhole {node0_ip}/32"));
    let half = beat_where(&mapd, Duration::from_secs(60), |b| b["lxd"] == "degraded");
    n1.sh_ok(&format!("ip route del blackhole {node0_ip}/32"));
    let half =
        half.unwrap_or_else(|| panic!("no degraded beat: {:?}", mapd.beats.lock().unwrap().last()));
    let why = half["details"]["half_a_pair"].to_string();
    assert!(
        why.contains("node1 cannot be reached over the management network"),
        "{why}"
    );
    assert!(
        beat_where(&mapd, Duration::from_secs(60), |b| b["lxd"] == "ok").is_some(),
        "the pair is whole again"
    );

    // Delete takes the worker with the head, and both machines' rails are the hosts' again.
    let (status, body) = agent_api(n0, &token, "DELETE", "/v1/vms/c1", None);
    assert_eq!(status, 200, "{body}");
    assert!(!containers(n0).contains("c1"), "{}", containers(n0));
    assert!(!containers(n1).contains("c1-w1"), "{}", containers(n1));
    for (host, iface, want) in [
        (n0, "rail0", "192.168.100.10/24"),
        (n0, "rail1", "192.168.101.10/24"),
        (n1, "rail1", "192.168.100.11/24"),
        (n1, "rail0", "192.168.101.11/24"),
    ] {
        let back = wait_for(Duration::from_secs(20), || {
            (ipv4(host, iface).0 == vec![want.to_owned()]).then_some(())
        });
        assert!(
            back.is_some(),
            "{} {iface}:\n{}\n{:?}",
            host.name(),
            text(&host.sh(&format!("ip -d link show {iface}; networkctl status {iface} --no-pager; journalctl -u systemd-networkd -n 40 --no-pager; ls -la /run/systemd/network/"))),
            ipv4(host, iface)
        );
    }
    assert!(
        mapd.map.lock().unwrap().mappings.is_empty(),
        "the relay's map is cleared"
    );

    // A worker that will not start fails the create: the head goes with it, node0's rails
    // come back, and nothing is left on either machine.
    n1.sh_ok("lxc profile device set lofispark-dual rail1 parent nosuchport");
    let (status, body) = agent_api(
        n0,
        &token,
        "POST",
        "/v1/vms",
        Some(json!({"name": "c2", "ssh_public_key": public_line(&customer)})),
    );
    n1.sh_ok("lxc profile device set lofispark-dual rail1 parent rail1");
    assert!(status >= 500, "{status} {body}");
    let said = body.to_string();
    assert!(
        said.contains("c2-w1") && said.contains("reverted"),
        "{said}"
    );
    assert!(!containers(n0).contains("c2"), "{}", containers(n0));
    assert!(!containers(n1).contains("c2-w1"), "{}", containers(n1));
    assert_eq!(ipv4(n0, "rail0").0, vec!["192.168.100.10/24".to_owned()]);
    l4_a_reboot_of_the_pair(bed, &token, &customer, &mapd);
    n0.sh_ok("systemctl stop enverge-agent.service");
    eprintln!(
        "figure: a pair's create (head, worker, rails, launcher key) {created_in:.1} s; the instance part {:.1} s",
        began.elapsed().as_secs_f64()
    );
}

/// This boot of `host`, or `None` while it is down.
fn boot_id(host: &HostContainer) -> Option<String> {
    let out = host.sh("cat /proc/sys/kernel/random/boot_id");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|b| !b.is_empty())
}

/// L4: the pair rebooted by one call (the customer's button and /admin's): node1 told first,
/// both deferred so the caller hears 202, and the instance back as it was — L2 on node0 (the
/// head), then L3 (the worker, once node1 answers). Then once more with node1 unreachable:
/// node0 reboots all the same, and the pair is half a pair until node1 answers.
fn l4_a_reboot_of_the_pair(
    bed: &Bed,
    token: &str,
    customer: &ssh_key::PrivateKey,
    mapd: &FakeMapd,
) {
    let (n0, n1) = (&bed.node0, &bed.node1);
    let (status, body) = agent_api(
        n0,
        token,
        "POST",
        "/v1/vms",
        Some(json!({"name": "c3", "ssh_public_key": public_line(customer)})),
    );
    assert_eq!(status, 201, "{body}");
    let before = (boot_id(n0).unwrap(), boot_id(n1).unwrap());
    let lap = Instant::now();
    let (status, body) = agent_api(n0, token, "POST", "/v1/host/reboot", None);
    let answered_in = lap.elapsed().as_secs_f64();
    assert_eq!(status, 202, "{body}");
    assert_eq!(
        body,
        json!({"node0_in_secs": 3, "satellites": [{"node": 1, "rebooting": true}]})
    );
    let rebooted = wait_for(Duration::from_secs(180), || {
        let now = (boot_id(n0)?, boot_id(n1)?);
        (now.0 != before.0 && now.1 != before.1).then_some(())
    });
    assert!(rebooted.is_some(), "both machines rebooted");
    let up = wait_for(Duration::from_secs(120), || {
        (agent_api(n0, token, "GET", "/v1/vms", None).0 == 200).then_some(())
    });
    assert!(up.is_some(), "serving answers after the reboot");
    // L2 then L3: the head as it was, then the worker, and the rail between them.
    let whole = wait_for(Duration::from_secs(120), || {
        head_to_worker(n0, "c3", "/root/.ssh/id_dropbear", "192.168.100.11")
            .ok()
            .filter(|h| h == "c3-w1")
    });
    assert!(
        whole.is_some(),
        "the head reaches its worker after the pair's reboot: {} / {}",
        containers(n0),
        containers(n1)
    );
    let back_in = lap.elapsed().as_secs_f64();

    // L4.3: node1 unreachable does not block: 202, node1 named, node0 reboots, and the
    // beat says half a pair until node1 answers.
    let node0_ip = n0.ipv4();
    n1.sh_ok(&format!("ip route add blackhole {node0_ip}/32"));
    let before = boot_id(n0).unwrap();
    let (status, body) = agent_api(n0, token, "POST", "/v1/host/reboot", None);
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["satellites"][0]["rebooting"], json!(false), "{body}");
    assert!(
        body["satellites"][0]["error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{body}"
    );
    let rebooted = wait_for(Duration::from_secs(120), || {
        boot_id(n0).filter(|b| *b != before).map(drop)
    });
    assert!(rebooted.is_some(), "node0 rebooted with node1 unreachable");
    let half = beat_where(mapd, Duration::from_secs(120), |b| b["lxd"] == "degraded");
    n1.sh_ok(&format!("ip route del blackhole {node0_ip}/32"));
    assert!(half.is_some(), "half a pair after node0's reboot alone");
    let whole = beat_where(mapd, Duration::from_secs(120), |b| b["lxd"] == "ok");
    assert!(whole.is_some(), "the pair is whole once node1 answers");
    let (status, body) = agent_api(n0, token, "DELETE", "/v1/vms/c3", None);
    assert_eq!(status, 200, "{body}");
    eprintln!(
        "figure: L4 pair reboot answered in {answered_in:.1} s; head reaching its worker again {back_in:.1} s after the call"
    );
}
