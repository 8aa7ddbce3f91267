//! What the cabled platform scenarios share (`pair_golden_path.rs`, `ring_golden_path.rs`):
//! the real server (SQLite) with real relay containers and the pair's or ring's staff-only
//! test profile offered to customers; the one-liner run on node0 alone, the satellites' login
//! read from a root-only file (the unattended form of step 123's prompt); preparation waited
//! on through the host's rows; the rent and the delete through the API.
//!
//! Included by `#[path]` next to `cabled` and `host_container`, which it uses.

#![allow(dead_code)] // each test binary uses a different part

use std::sync::Arc;
use std::time::{Duration, Instant};

use byo::local_relay::{LxdRelay, LxdRelays};
use byo_db::hosts::HostNodeRow;
use byo_server::providers::local::LocalTunnels;
use serde_json::json;

use crate::cabled::{PASSWORD, USER};
use crate::host_container::{HostContainer, bridge_gateway};
use crate::support::platform::{self, Api, RemoveRelays, until};
use crate::support::release;

/// The platform a cabled scenario runs against, and its people.
pub struct Platform {
    pub store: byo_db::Store,
    pub api: Api,
    pub people: platform::People,
    /// The operator-key list's signing key (the staff's, off the platform).
    pub signing: ssh_key::PrivateKey,
    pub work: tempfile::TempDir,
    relays: Arc<LxdRelays>,
    began: Instant,
    _relays_go: RemoveRelays,
    _db: byo_db::testing::TestDb,
}

/// A host the one-liner enrolled: its id, its slug and its relay, booted.
pub struct Enrolled {
    pub host_id: String,
    pub relay: Arc<LxdRelay>,
}

impl Platform {
    /// The server on SQLite, listening where host containers reach it, with relays made as
    /// LXD containers named `<prefix>-<pid>-…`, `profile` offered to customers (the golden
    /// path offers linux-test so: rent time refuses staff-only types to customers), and an
    /// operator key published.
    pub async fn start(prefix: &str, profile: &str) -> Platform {
        byo_server::telemetry::init(byo_server::config::LogFormat::Pretty);
        let began = Instant::now();
        let db = byo_db::testing::sqlite().await;
        let store = db.store.clone();
        store
            .execute_unchecked(&format!(
                "update host_profiles set staff_only = false where id = '{profile}'"
            ))
            .await
            .unwrap();
        let work = tempfile::tempdir().unwrap();
        let releases = release(&work.path().join("releases"), &[std::env::consts::ARCH]);
        let (listener, base) = platform::listen(bridge_gateway()).await;
        let signing = byo_core::keylist_testing::private_key();
        let config = platform::config(&base, releases, &signing);
        let relays = Arc::new(LxdRelays::new(&format!("{prefix}-{}-", std::process::id())));
        let state = byo_server::state::AppState::new(store.clone(), config)
            .with_providers(relays.clone(), Arc::new(LocalTunnels::default()));
        tokio::spawn(byo_server::serve(state, listener, std::future::pending()));
        let api = Api::new(&base);
        let people = platform::people(&store).await;
        let op_key = byo_core::keylist_testing::private_key();
        platform::publish_operator_key(&api, &people.operator, &people.staff, &signing, &op_key)
            .await;
        let p = Platform {
            store,
            api,
            people,
            signing,
            work,
            _relays_go: RemoveRelays(relays.clone()),
            relays,
            began,
            _db: db,
        };
        p.phase("server up");
        p
    }

    /// One line on stderr: the seconds since the start and what was reached.
    pub fn phase(&self, what: &str) {
        eprintln!("[{:>6.1} s] {what}", self.began.elapsed().as_secs_f64());
    }

    /// A (owner) adds a host of `profile`, whose one-liner carries `--peer --nodes=N`; B + C
    /// run it on node0 alone, with the satellites' login from a root-only file and
    /// wireguard-go's tun device. Redeem (127) wrote a row per machine; the relay boots.
    pub async fn enrol(&self, n0: &HostContainer, profile: &str, nodes: u64) -> Enrolled {
        let (status, provisioned) = self
            .api
            .call(
                reqwest::Method::POST,
                "/api/hosts",
                &self.people.staff,
                Some(json!({"profile_id": profile})),
            )
            .await;
        assert_eq!(status, 201, "{provisioned}");
        let host_id = provisioned["host_id"].as_str().unwrap().to_owned();
        let command = provisioned["command"].as_str().unwrap().to_owned();
        assert!(
            command.contains(&format!(" --peer --nodes={nodes}")),
            "{command}"
        );
        let tun = std::process::Command::new("lxc")
            .args(["config", "device", "add", n0.name(), "tun", "unix-char"])
            .arg("path=/dev/net/tun")
            .output()
            .unwrap();
        assert!(tun.status.success(), "{tun:?}");
        n0.write(
            "/root/peer-login",
            format!("{USER}\n{PASSWORD}\n").as_bytes(),
            0o600,
        );
        let ran = n0.sh(&format!("{command} --peer-login-file /root/peer-login"));
        assert!(
            ran.status.success(),
            "the one-liner failed:\n{}{}",
            String::from_utf8_lossy(&ran.stdout),
            String::from_utf8_lossy(&ran.stderr)
        );
        self.phase("the one-liner ran on node0");

        let rows = self.store.host_nodes(&host_id).await.unwrap();
        assert_eq!(
            rows.iter().map(|n| n.index as u64).collect::<Vec<_>>(),
            (0..nodes).collect::<Vec<_>>(),
            "{rows:?}"
        );
        let slug = provisioned["slug"].as_str().unwrap().to_owned();
        let relay = until(
            "the relay to be built",
            Duration::from_secs(90),
            async || self.relays.relay(&slug),
        )
        .await;
        tokio::task::block_in_place(|| relay.wait_booted(Duration::from_secs(240)))
            .unwrap_or_else(|e| panic!("{e}"));
        self.phase("the relay booted");
        Enrolled { host_id, relay }
    }

    /// 129–132: until node0 has prepared every satellite and proved the cables; then each
    /// machine's row carries `cabled` rails, each at the plan's address for that machine
    /// (the subnet's tenth host plus its index) and verified. The rows and the seconds taken.
    pub async fn prepared(
        &self,
        host_id: &str,
        n0: &HostContainer,
        cabled: usize,
    ) -> (Vec<HostNodeRow>, f64) {
        let started = Instant::now();
        loop {
            let h = self.store.host(host_id).await.unwrap().unwrap();
            if h.prepared_at.is_some() {
                break;
            }
            let failed = h
                .prepare_state
                .as_ref()
                .and_then(|s| s.0.failed().then(|| s.0.error.clone().unwrap_or_default()));
            let waiting = failed
                .as_deref()
                .is_some_and(crate::support::retried_prepare_failure);
            if (failed.is_some() && !waiting) || started.elapsed() > Duration::from_secs(480) {
                panic!(
                    "the host did not prepare ({:?}):\n{}",
                    h.prepare_state,
                    journal(n0, 80)
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let took = started.elapsed().as_secs_f64();
        self.phase(&format!("prepared, every satellite included ({took:.0} s)"));
        let nodes = self.store.host_nodes(host_id).await.unwrap();
        for n in &nodes {
            let rails: Vec<(&String, &serde_json::Value)> = n
                .rails
                .0
                .as_object()
                .unwrap()
                .iter()
                .filter(|(_, p)| p["index"].is_u64())
                .collect();
            assert_eq!(rails.len(), cabled, "node{}: {}", n.index, n.rails.0);
            for (iface, p) in rails {
                let want = format!(
                    "192.168.{}.{}/24",
                    100 + p["index"].as_u64().unwrap(),
                    10 + n.index
                );
                assert_eq!(p["address"], want.as_str(), "node{} {iface}", n.index);
                assert!(p["verified_at"].is_string(), "node{} {iface}: {p}", n.index);
            }
            assert!(
                n.prepare_state.as_ref().is_none_or(|s| !s.0.failed()),
                "node{}: {:?}",
                n.index,
                n.prepare_state
            );
        }
        (nodes, took)
    }

    /// D and E: the operator activates the host; once it beats and serving answers through
    /// the relay, the customer rents `profile` and their plain ssh to the relay lands in the
    /// head. The instance's id and name.
    pub async fn rent(&self, host_id: &str, profile: &str, relay: &LxdRelay) -> (String, String) {
        platform::activate(&self.api, &self.people.operator, host_id).await;
        self.phase("activated");
        let (key_file, k) = platform::customer_key(
            &self.api,
            &self.people.customer,
            &self.work.path().join("customer"),
        )
        .await;
        until(
            "the host's first heartbeat",
            Duration::from_secs(120),
            async || self.store.host_status(host_id).await.unwrap().map(|_| ()),
        )
        .await;
        platform::serving_answers_through(relay).await;
        let (vm_id, name, landed, took) = platform::rent(
            &self.api,
            &self.people.customer,
            profile,
            &k["id"],
            &relay.public,
            &key_file,
        )
        .await;
        self.phase(&format!("rented: create to ssh-reachable {took:.2} s"));
        assert_eq!(landed, name, "the customer's ssh lands in the head");
        (vm_id, name)
    }

    /// G: the customer deletes the instance.
    pub async fn delete(&self, vm_id: &str) {
        let (status, deleted) = self
            .api
            .call(
                reqwest::Method::DELETE,
                &format!("/api/vms/{vm_id}"),
                &self.people.customer,
                None,
            )
            .await;
        assert_eq!(status, 200, "{deleted}");
    }
}

/// The last `lines` of node0's preparation unit's journal.
pub fn journal(n0: &HostContainer, lines: u32) -> String {
    let out = n0.sh(&format!(
        "journalctl -u enverge-agent-prepare.service -n {lines} --no-pager"
    ));
    String::from_utf8_lossy(&out.stdout).into_owned()
}
