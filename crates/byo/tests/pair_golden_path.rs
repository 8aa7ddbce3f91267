//! K1's "done when", on real parts: a pair of Debian host containers joined by cables (the
//! cable bed of `byo-agent/tests/support/cabled.rs`) enrols from the one-liner run on node0
//! alone (`--peer --nodes=2`, node1's login from a root-only file), against the real server
//! (SQLite) with a real relay; redeem writes both host_nodes rows from the cable's evidence;
//! node0 prepares node1 over SSH and the rails are proved; an operator activates it; a customer
//! rents it, and their plain `ssh` to the relay lands in the head, which reaches its worker on
//! node1 as `user` over the rail. Delete takes both containers.

#[path = "../../byo-agent/tests/support/cabled.rs"]
mod cabled;
#[path = "../../byo-agent/tests/support/host_container.rs"]
mod host_container;
#[path = "../../byo-relay/tests/support/mod.rs"]
mod relay_support;
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use byo::local_relay::LxdRelays;
use byo_server::providers::local::LocalTunnels;
use cabled::{Bed, PASSWORD, USER, containers, head_to_worker};
use host_container::bridge_gateway;
use relay_support::kernel_parts;
use serde_json::json;
use support::platform::{self, Api, RemoveRelays, until};
use support::release;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn k1_a_pair_enrols_from_the_one_liner_prepares_is_activated_and_rented() {
    if !kernel_parts(&["ip", "nft", "wg", "wireguard-go", "caddy", "ssh", "lxc"]) {
        return;
    }
    let Some(bed) = Bed::pair("byo-gpair") else {
        return;
    };
    let (n0, n1) = (&bed.node0, &bed.node1);
    byo_server::telemetry::init(byo_server::config::LogFormat::Pretty);
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let db = byo_db::testing::sqlite().await;
    let store = db.store.clone();
    let work = tempfile::tempdir().unwrap();
    // The pair's staff-only test profile (migration 0019), offered to customers here as the
    // golden path offers linux-test: rent time refuses staff-only types to customers.
    store
        .execute_unchecked("update host_profiles set staff_only = false where id = 'linux-test-2'")
        .await
        .unwrap();

    let arch = std::env::consts::ARCH;
    let releases = release(&work.path().join("releases"), &[arch]);
    let (listener, base) = platform::listen(bridge_gateway()).await;
    let signing = byo_core::keylist_testing::private_key();
    let config = platform::config(&base, releases, &signing);
    let relays = Arc::new(LxdRelays::new(&format!(
        "byo-gpair-{}-",
        std::process::id()
    )));
    let _relays_go = RemoveRelays(relays.clone());
    let state = byo_server::state::AppState::new(store.clone(), config)
        .with_providers(relays.clone(), Arc::new(LocalTunnels::default()));
    tokio::spawn(byo_server::serve(state, listener, std::future::pending()));
    let api = Api::new(&base);
    let platform::People {
        staff,
        operator,
        customer,
    } = platform::people(&store).await;
    let op_key = byo_core::keylist_testing::private_key();
    platform::publish_operator_key(&api, &operator, &staff, &signing, &op_key).await;
    phase("server up");

    // Two cables at a QSFP's MTU, crossed, each showing node1's two PCIe functions.
    bed.cable_with_mtu(&[(n0, "rail0"), (n1, "rail1"), (n1, "rail1b")], Some(9000));
    bed.cable_with_mtu(&[(n0, "rail1"), (n1, "rail0"), (n1, "rail0b")], Some(9000));

    // A: the owner adds a pair; the one-liner carries --peer --nodes=2.
    let (status, provisioned) = api
        .call(
            reqwest::Method::POST,
            "/api/hosts",
            &staff,
            Some(json!({"profile_id": "linux-test-2"})),
        )
        .await;
    assert_eq!(status, 201, "{provisioned}");
    let host_id = provisioned["host_id"].as_str().unwrap().to_owned();
    let command = provisioned["command"].as_str().unwrap().to_owned();
    assert!(command.contains(" --peer --nodes=2"), "{command}");
    // B + C on node0 alone: node1's login from a root-only file (the unattended form of
    // step 123's prompt), wireguard-go's tun device.
    let tun = std::process::Command::new("lxc")
        .args(["config", "device", "add", n0.name(), "tun", "unix-char"])
        .arg("path=/dev/net/tun")
        .output()
        .unwrap();
    assert!(tun.status.success(), "{tun:?}");
    n0.write(
        "/root/node1-login",
        format!("{USER}\n{PASSWORD}\n").as_bytes(),
        0o600,
    );
    let ran = n0.sh(&format!("{command} --peer-login-file /root/node1-login"));
    assert!(
        ran.status.success(),
        "the one-liner failed:\n{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    phase("the one-liner ran on node0");

    // 127: redeem wrote both machines from the cable's evidence.
    let nodes = store.host_nodes(&host_id).await.unwrap();
    assert_eq!(
        nodes.iter().map(|n| n.index).collect::<Vec<_>>(),
        [0, 1],
        "{nodes:?}"
    );
    let relay = until(
        "the relay to be built",
        Duration::from_secs(90),
        async || relays.relay(provisioned["slug"].as_str().unwrap()),
    )
    .await;
    tokio::task::block_in_place(|| relay.wait_booted(Duration::from_secs(240)))
        .unwrap_or_else(|e| panic!("{e}"));
    phase("the relay booted");

    // 129–132: node0 prepares node1 and proves the cables; the rows say so.
    let started = Instant::now();
    loop {
        let h = store.host(&host_id).await.unwrap().unwrap();
        if h.prepared_at.is_some() {
            break;
        }
        let failed = h.prepare_state.as_ref().and_then(|s| {
            (s.0["state"] == "failed").then(|| s.0["error"].as_str().unwrap_or("").to_owned())
        });
        let waiting = failed
            .as_deref()
            .is_some_and(|e| e.contains("the relay has no public address yet"));
        if (failed.is_some() && !waiting) || started.elapsed() > Duration::from_secs(420) {
            let journal = n0.sh("journalctl -u enverge-agent-prepare.service -n 80 --no-pager");
            panic!(
                "the pair did not prepare ({:?}):\n{}",
                h.prepare_state,
                String::from_utf8_lossy(&journal.stdout)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    phase(&format!(
        "prepared, node1 included ({:.0} s)",
        started.elapsed().as_secs_f64()
    ));
    let nodes = store.host_nodes(&host_id).await.unwrap();
    for n in &nodes {
        let cabled: Vec<(&String, &serde_json::Value)> = n
            .rails
            .0
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, p)| p["index"].is_u64())
            .collect();
        assert_eq!(cabled.len(), 2, "node{}: {}", n.index, n.rails.0);
        for (iface, p) in cabled {
            let want = format!(
                "192.168.{}.{}/24",
                100 + p["index"].as_u64().unwrap(),
                10 + n.index
            );
            assert_eq!(p["address"], want.as_str(), "node{} {iface}", n.index);
            assert!(p["verified_at"].is_string(), "node{} {iface}: {p}", n.index);
        }
    }
    assert!(
        nodes[1]
            .prepare_state
            .as_ref()
            .is_some_and(|s| s.0["state"] != "failed"),
        "{:?}",
        nodes[1].prepare_state
    );

    // D: the operator approves.
    platform::activate(&api, &operator, &host_id).await;
    phase("activated");

    // E: the customer rents the pair; their ssh lands in the head.
    let (key_file, k) =
        platform::customer_key(&api, &customer, &work.path().join("customer")).await;
    until(
        "the host's first heartbeat",
        Duration::from_secs(120),
        async || store.host_status(&host_id).await.unwrap().map(|_| ()),
    )
    .await;
    platform::serving_answers_through(&relay).await;
    let (vm_id, name, landed, took) = platform::rent(
        &api,
        &customer,
        "linux-test-2",
        &k["id"],
        &relay.public,
        &key_file,
    )
    .await;
    phase(&format!("rented: create to ssh-reachable {took:.2} s"));
    assert_eq!(landed, name, "the customer's ssh lands in the head");
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
    let (status, deleted) = api
        .call(
            reqwest::Method::DELETE,
            &format!("/api/vms/{vm_id}"),
            &customer,
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert!(!containers(n0).contains(&name), "{}", containers(n0));
    assert!(!containers(n1).contains(&worker), "{}", containers(n1));
    phase("deleted: head and worker gone");
}
