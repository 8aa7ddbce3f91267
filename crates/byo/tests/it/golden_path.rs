//! The golden path, on real parts: the server on PostgreSQL; a relay in a network namespace
//! (wireguard-go, byo-relay's ssh_mapd driving nftables, Caddy in front of the agent's
//! API); a host that is a Debian system container in LXD, onboarded by its owner running the
//! printed one-liner; preparation; an operator's activation; a customer whose plain `ssh` to
//! the relay's public address lands in their container; a relay restart healed by the
//! heartbeat; a delete that closes the row, clears the map, and leaves `ssh` nowhere.

use crate::host_container;
use crate::relay_support;
use crate::support;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use byo::local_relay::LxdRelays;
use byo_db::users::NewUser;
use byo_server::providers::local::LocalTunnels;
use byo_wire::Role;
use host_container::{HostContainer, bridge_gateway};
use relay_support::kernel_parts;
use secrecy::ExposeSecret;
use serde_json::json;
use support::platform::{self, Api, RemoveRelays, customer_ssh, until};
use support::{release, ssh};

/// The relay provider with a gate: provisioning waits until the test lets it through.
struct Gated {
    relays: Arc<LxdRelays>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl byo_server::providers::RelayProvider for Gated {
    fn provision<'a>(
        &'a self,
        slug: &'a str,
        bootstrap: Option<&'a str>,
    ) -> futures::future::BoxFuture<
        'a,
        Result<byo_server::providers::RelayInfo, byo_server::providers::ProviderError>,
    > {
        Box::pin(async move {
            let _ = self.gate.acquire().await;
            self.relays.provision(slug, bootstrap).await
        })
    }

    fn release<'a>(
        &'a self,
        slug: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), byo_server::providers::ProviderError>> {
        self.relays.release(slug)
    }
}

/// tcpdump on the LXD bridge, for what crosses the relay's public interface.
struct Capture {
    child: std::process::Child,
    file: std::path::PathBuf,
}

impl Capture {
    fn start(file: &Path, filter: &str) -> Capture {
        let child = Command::new("tcpdump")
            .args(["-i", byo::local_relay::BRIDGE, "-s", "0", "-U", "-n", "-w"])
            .arg(file)
            .args(filter.split_whitespace())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tcpdump starts");
        Capture {
            child,
            file: file.to_owned(),
        }
    }

    /// Everything captured so far, as raw bytes.
    fn bytes(&mut self) -> Vec<u8> {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        std::fs::read(&self.file).unwrap_or_default()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn golden_path_a_customer_reaches_their_container_on_an_onboarded_host_by_plain_ssh() {
    if !kernel_parts(&[
        "ip",
        "nft",
        "wg",
        "wireguard-go",
        "caddy",
        "ssh",
        "ssh-keygen",
        "lxc",
        "tcpdump",
    ]) {
        return;
    }
    let Some(db) = byo_db::testing::fresh(byo_db::Backend::Postgres).await else {
        return;
    };
    let Some(host) = HostContainer::launch("byo-gold") else {
        return;
    };
    // The server's log (a relay that could not be built says why there).
    byo_server::telemetry::init(byo_server::config::LogFormat::Pretty);
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let work = tempfile::tempdir().unwrap();
    let store = db.store.clone();
    // The Debian host container stands in for a GB10 Spark, which customers rent; its
    // profile (linux-test) is staff-only everywhere else, and rent time refuses staff-only
    // types to customers (issue #13, 5).
    store
        .execute_unchecked("update host_profiles set staff_only = false where id = 'linux-test'")
        .await
        .unwrap();

    // The release the installer fetches.
    let arch = std::env::consts::ARCH;
    let releases = release(&work.path().join("releases"), &[arch]);

    // The server, where the host container reaches it: the test bridge's gateway.
    let (listener, base) = platform::listen(bridge_gateway()).await;
    let signing = byo_core::keylist_testing::private_key();
    let config = platform::config(&base, releases.clone(), &signing);
    let sealer =
        byo_server::seal::Sealer::from_hex(config.secret_key.as_ref().unwrap().expose_secret())
            .unwrap();
    let relays = Arc::new(LxdRelays::new(&format!("byo-gold-{}-", std::process::id())));
    // The relay is held back until the host has redeemed: #11's early redeem, on purpose.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let gated = Arc::new(Gated {
        relays: relays.clone(),
        gate: gate.clone(),
    });
    let _relays_go = RemoveRelays(relays.clone());
    // /admin as it reads a host whose heartbeat is 10 s old (the threshold shortened, issue
    // #14, 4): the same database, a second server.
    let watchful = {
        let mut c = config.clone();
        c.placement.max_heartbeat_age_secs = 10;
        byo_server::state::AppState::new(store.clone(), c)
    };
    let state = byo_server::state::AppState::new(store.clone(), config)
        .with_providers(gated, Arc::new(LocalTunnels::default()));
    // #12, 7 below: the same backend, impatient — a create waits 700 ms for the host (a
    // real one takes ~1.5 s), so the host goes on after the backend has given up.
    let impatient = state.clone().with_waits(byo_server::agents::AgentWaits {
        create: Duration::from_millis(700),
        ..byo_server::agents::AgentWaits::default()
    });
    tokio::spawn(byo_server::serve(state, listener, std::future::pending()));
    let api = Api::new(&base);
    let platform::People {
        staff,
        operator,
        customer,
    } = platform::people(&store).await;
    phase("server up");

    // M: an operator's key, signed into the list every host receives at enrolment.
    let op_key = byo_core::keylist_testing::private_key();
    let op_file = platform::key_file(&work.path().join("operator"), &op_key);
    platform::publish_operator_key(&api, &operator, &staff, &signing, &op_key).await;

    // A: the owner (staff: linux-test is a staff-only profile) adds a GPU.
    let (status, provisioned) = api
        .call(
            reqwest::Method::POST,
            "/api/hosts",
            &staff,
            Some(json!({"profile_id": "linux-test"})),
        )
        .await;
    assert_eq!(status, 201, "{provisioned}");
    let host_id = provisioned["host_id"].as_str().unwrap().to_owned();
    let command = provisioned["command"].as_str().unwrap().to_owned();
    // B + C: the owner runs the one-liner on the machine.
    let tun = Command::new("lxc")
        .args([
            "config",
            "device",
            "add",
            host.name(),
            "tun",
            "unix-char",
            "path=/dev/net/tun",
        ])
        .output()
        .unwrap();
    assert!(tun.status.success());
    host.sh_ok("useradd -m -s /bin/bash -G sudo owner && echo 'owner ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/owner && chmod 440 /etc/sudoers.d/owner");
    let ran = host.exec(&["runuser", "-u", "owner", "--", "bash", "-c", &command]);
    assert!(
        ran.status.success(),
        "the one-liner failed:\n{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    phase("the one-liner ran");
    // The host redeemed before its relay had an address: no endpoint for its tunnel yet.
    let h = store.host(&host_id).await.unwrap().unwrap();
    assert_eq!(
        h.relay_ip, None,
        "the relay was held back until the host redeemed"
    );
    gate.add_permits(1);
    let relay = until(
        "the relay to be built",
        Duration::from_secs(90),
        async || {
            let slug = provisioned["slug"].as_str().unwrap();
            relays.relay(slug)
        },
    )
    .await;
    phase(&format!("provisioned; {} is booting", relay.container));
    // Everything that crosses the relay's public interface from here on, for the proof
    // below that no agent token crosses it in the clear.
    let mut capture = Capture::start(
        &work.path().join("relay.pcap"),
        &format!("host {}", relay.public),
    );
    let first_boot = tokio::task::block_in_place(|| relay.wait_booted(Duration::from_secs(240)))
        .unwrap_or_else(|e| panic!("{e}"));
    phase(&format!(
        "the relay booted by its own script ({:.1} s after it was created)",
        first_boot.as_secs_f64()
    ));
    // Issue #36: its metadata (the startup script) holds no key; the first boot fetched them
    // with the script's single-use token, from the relay's own address, into files of its own.
    let read = |argv: &[&str]| {
        let out = relay.exec(argv).output().unwrap();
        assert!(
            out.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let metadata = read(&["cat", "/var/lib/byo-relay-metadata/startup-script"]);
    assert!(
        metadata.contains("byo_rly_")
            && !metadata.lines().any(|l| l.starts_with("-----BEGIN"))
            && !metadata.contains("PrivateKey"),
        "{metadata}"
    );
    assert_eq!(
        read(&[
            "stat",
            "-c",
            "%a %U",
            "/etc/wireguard/wg0.key",
            "/etc/byo-relay/tls/relay.key"
        ]),
        "600 root\n640 root\n"
    );
    let fetched = store.relay_secrets_fetched(&host_id).await.unwrap();
    assert_eq!(
        fetched.as_ref().map(|f| f.1.as_str()),
        Some(relay.public.as_str()),
        "the relay fetched its secrets from its own address"
    );

    let prepared = Instant::now();
    let started = Instant::now();
    let mut waited_for_endpoint = false;
    loop {
        let h = store.host(&host_id).await.unwrap().unwrap();
        if h.prepared_at.is_some() {
            break;
        }
        // relay-peer fails while the endpoint is unknown, and the next scheduled try heals it.
        let failed = h
            .prepare_state
            .as_ref()
            .and_then(|s| s.0.failed().then(|| s.0.error.clone().unwrap_or_default()));
        match &failed {
            Some(e) if e.contains("the relay has no public address yet") => {
                waited_for_endpoint = true
            }
            _ => {}
        }
        let other_failure = failed
            .as_deref()
            .is_some_and(|e| !support::retried_prepare_failure(e));
        if other_failure || started.elapsed() > Duration::from_secs(300) {
            let journal = host.sh("journalctl -u enverge-agent-prepare.service -u enverge-agent.service -n 60 --no-pager");
            panic!(
                "preparation did not complete ({:?}):\n{}",
                h.prepare_state,
                String::from_utf8_lossy(&journal.stdout)
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        waited_for_endpoint,
        "relay-peer never reported waiting for the relay's endpoint"
    );
    phase(&format!(
        "prepared ({:.0} s after the one-liner; relay-peer waited for the relay's endpoint, then healed on its own)",
        prepared.elapsed().as_secs_f64()
    ));
    // I: the operator's key logs in as spark, with sudo; the owner's login stays (lockout_owner ships false).
    let glass = ssh(
        &op_file,
        &[&format!("spark@{}", host.ipv4()), "sudo -n id -u"],
    );
    assert_eq!(glass.as_deref(), Ok("0"));
    // Beats every 2 s from here, so the relay's restart below heals quickly.
    host.write(
        "/etc/systemd/system/enverge-agent.service.d/beat.conf",
        b"[Service]\nExecStart=\nExecStart=/usr/local/bin/byo-agent serve --heartbeat-every 2\n",
        0o644,
    );
    host.sh_ok("systemctl daemon-reload && systemctl restart enverge-agent.service");

    // D, with the customer's path walked first (issue #38, 4). First through a relay whose
    // :22 is broken on purpose, sent to the host's own sshd ahead of the instance's mapping
    // (a rule the heartbeat's map repair does not touch): the walk logs in nowhere it may,
    // fails at ssh, and activation is refused with nothing changed.
    let relay_nft = |args: &str| {
        let out = relay
            .exec(&["sh", "-c", &format!("nft {args}")])
            .output()
            .unwrap();
        assert!(out.status.success(), "nft {args}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    relay_nft(
        "insert rule ip lofispark LOFISPARK_VMSSH tcp dport 22 dnat to 10.8.0.2:22 comment broken-on-purpose",
    );
    let (status, body) = platform::activation(&api, &operator, &host_id).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("walk_failed")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("failed at ssh"),
        "{body}"
    );
    assert!(
        !store.host(&host_id).await.unwrap().unwrap().active,
        "nothing changed"
    );
    let failed = store.latest_path_walk(&host_id).await.unwrap().unwrap();
    assert_eq!(
        (failed.passed, failed.stage.as_deref()),
        (Some(false), Some("ssh")),
        "{failed:?}"
    );
    assert!(
        failed.create_ms.is_some() && failed.delete_ms.is_some(),
        "{failed:?}"
    );
    let held = host.sh_ok("lxc list --format csv --columns n");
    assert!(
        !held.contains(&failed.vm_name),
        "the scratch instance is gone: {held}"
    );
    phase(&format!(
        "the walk through a broken relay failed: {}",
        failed.error.unwrap_or_default()
    ));
    // Mended, the operator walks it again (the host's page's button is this call) and the
    // walk passes; activation goes on it.
    let handle = relay_nft("-a list chain ip lofispark LOFISPARK_VMSSH")
        .lines()
        .find(|l| l.contains("broken-on-purpose"))
        .and_then(|l| l.rsplit("handle ").next())
        .map(|h| h.trim().to_owned())
        .expect("the broken rule's handle");
    relay_nft(&format!(
        "delete rule ip lofispark LOFISPARK_VMSSH handle {handle}"
    ));
    let (status, walk) = api
        .call(
            reqwest::Method::POST,
            &format!("/api/admin/hosts/{host_id}/walk"),
            &operator,
            None,
        )
        .await;
    assert_eq!(
        (status, walk["passed"].as_bool()),
        (200, Some(true)),
        "{walk}"
    );
    phase(&format!(
        "the customer's path walked: create {} ms, first login {} ms, delete {} ms",
        walk["create_ms"], walk["ssh_ms"], walk["delete_ms"]
    ));
    platform::activate(&api, &operator, &host_id).await;
    phase("activated");

    // E1: the customer creates an instance with their key.
    let (key_file, k) =
        platform::customer_key(&api, &customer, &work.path().join("customer")).await;
    platform::serving_answers_through(&relay).await;
    phase("serving answers through the relay");
    // Placement picks only a host it has heard from: serving beats once at start.
    until(
        "the host's first heartbeat",
        Duration::from_secs(30),
        async || store.host_status(&host_id).await.unwrap().map(|_| ()),
    )
    .await;
    let (vm_id, name, landed, took) = platform::rent(
        &api,
        &customer,
        "linux-test",
        &k["id"],
        &relay.public,
        &key_file,
    )
    .await;
    phase(&format!("create to ssh-reachable: {took:.2} s"));
    assert_eq!(landed, name, "the customer's ssh landed in another machine");
    let row = store.vm(&vm_id).await.unwrap().unwrap();
    assert_eq!(row.host_id.as_deref(), Some(host_id.as_str()));
    assert!(row.created_at <= chrono::Utc::now() && row.deleted_at.is_none());

    // G note 4 and A.3: a relay that reboots runs its script again and comes back with the
    // chain seeded and empty; the host's next heartbeat puts the map back.
    let rebooted = Instant::now();
    tokio::task::block_in_place(|| relay.reboot()).unwrap();
    tokio::task::block_in_place(|| relay.wait_booted(Duration::from_secs(120)))
        .unwrap_or_else(|e| panic!("{e}"));
    let boots = relay.bootstrap_log().matches("starting at").count();
    assert_eq!(
        boots,
        2,
        "the script ran at each boot:\n{}",
        relay.bootstrap_log()
    );
    assert_eq!(
        store.relay_secrets_fetched(&host_id).await.unwrap(),
        fetched,
        "a later boot has its secrets and fetches nothing (its token is spent)"
    );
    phase(&format!(
        "the relay rebooted and ran its script again in {:.1} s",
        rebooted.elapsed().as_secs_f64()
    ));
    let again = until(
        "the heartbeat to heal the relay",
        Duration::from_secs(60),
        async || customer_ssh(&relay.public, &key_file),
    )
    .await;
    assert_eq!(again, name);
    phase(&format!(
        "relay reboot healed: the customer's ssh works {:.1} s after the reboot",
        rebooted.elapsed().as_secs_f64()
    ));
    let Some(beat) = store.host_status(&host_id).await.unwrap() else {
        let journal = host.sh("journalctl -u enverge-agent.service -n 30 --no-pager");
        panic!(
            "no heartbeat reached host_status:\n{}",
            String::from_utf8_lossy(&journal.stdout)
        );
    };
    assert_eq!(beat.lxd.as_deref(), Some("ok"));

    // J and L1 (issue #14, 3 and 4) on this host, rented, with the customer's ssh session
    // open through the relay: the upgrade and every branch of the rollback.
    upgrades_and_rollbacks(Upgrade {
        host: &host,
        store: &store,
        host_id: &host_id,
        releases: &releases,
        arch,
        server: &base,
        instance: &name,
        customer_key: &key_file,
        relay_public: &relay.public,
        staff: &staff,
        watchful,
        slug: provisioned["slug"].as_str().unwrap(),
        operator_key: &op_file,
        work: work.path(),
    })
    .await;
    phase("upgrades and rollbacks done");

    // G: the customer deletes; the row closes only once the host confirms, the map is
    // cleared, and ssh gets nowhere.
    let asked = Instant::now();
    let (status, deleted) = api
        .call(
            reqwest::Method::DELETE,
            &format!("/api/vms/{vm_id}"),
            &customer,
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    phase(&format!(
        "delete to confirmed: {:.2} s",
        asked.elapsed().as_secs_f64()
    ));
    let row = store.vm(&vm_id).await.unwrap().unwrap();
    assert!(row.delete_requested_at.is_some() && row.deleted_at.is_some());
    assert!(
        !relay.kernel_map().contains("10.8.0.2"),
        "the relay still forwards: {}",
        relay.kernel_map()
    );
    assert_eq!(
        customer_ssh(&relay.public, &key_file),
        None,
        "ssh still lands somewhere"
    );
    assert!(!host.sh_ok("lxc list --format csv -c n").contains(&name));

    // #12, 7 on real parts: a create the backend stops waiting for while the host goes on.
    // The answer is 504 and the row stays `creating` (silence is not a refusal); the
    // host's next heartbeat lists the container running, and the row settles to running —
    // the row and the host agree, and the customer's ssh lands in it.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let impatient_api = Api {
        base: format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port()),
        client: reqwest::Client::new(),
    };
    tokio::spawn(byo_server::serve(
        impatient,
        listener,
        std::future::pending(),
    ));
    let asked = Instant::now();
    let (status, silent) = impatient_api
        .call(
            reqwest::Method::POST,
            "/api/vms",
            &customer,
            Some(json!({"gpu_type": "linux-test", "ssh_key_id": k["id"]})),
        )
        .await;
    assert_eq!(
        (status, silent["error"].as_str()),
        (504, Some("host_silent")),
        "{silent}"
    );
    let open = store.live_vms().await.unwrap();
    assert_eq!(open.len(), 1, "{open:?}");
    let open = open[0].vm.clone();
    assert_eq!(open.status, byo_wire::states::VmStatus::Creating);
    let settled = until(
        "the heartbeat to settle the create",
        Duration::from_secs(60),
        async || {
            let row = store.vm(&open.id).await.unwrap().unwrap();
            (row.status != byo_wire::states::VmStatus::Creating).then_some(row)
        },
    )
    .await;
    phase(&format!(
        "a create the backend gave up on settled from the heartbeat: {:?} after {:.1} s",
        settled.status,
        asked.elapsed().as_secs_f64()
    ));
    assert_eq!(
        (settled.status, settled.creation_failed_at),
        (byo_wire::states::VmStatus::Running, None)
    );
    assert!(
        host.sh_ok("lxc list --format csv -c ns")
            .contains(&format!("{},RUNNING", open.name)),
        "the host runs what the row says"
    );
    let landed = until("the customer's ssh", Duration::from_secs(30), async || {
        customer_ssh(&relay.public, &key_file)
    })
    .await;
    assert_eq!(landed, open.name);
    let (status, deleted) = api
        .call(
            reqwest::Method::DELETE,
            &format!("/api/vms/{}", open.id),
            &customer,
            None,
        )
        .await;
    assert_eq!(status, 200, "{deleted}");
    assert!(
        !host
            .sh_ok("lxc list --format csv -c n")
            .contains(&open.name)
    );

    // I, "leaving is one action" (#16, 1), to the real host: revoking the operator's role
    // drafts their key off the list in the same request; once the list is signed, its push
    // takes the key off spark's authorized_keys on the host, and it no longer logs in.
    let operator_sub = store
        .user_by_email("op@example.com")
        .await
        .unwrap()
        .unwrap()
        .sub;
    // A list never goes empty (M.2): the superadmin's own key stays.
    let kept_key = byo_core::keylist_testing::private_key();
    let kept = kept_key.public_key().to_openssh().unwrap();
    let (status, body) = api
        .call(
            reqwest::Method::POST,
            "/api/admin/operator-keys/changes",
            &staff,
            Some(json!({"action": "add", "public_key": kept, "label": "staff desk"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api
        .call(
            reqwest::Method::DELETE,
            &format!("/api/admin/users/{operator_sub}/roles/operator"),
            &staff,
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, overview) = api
        .call(
            reqwest::Method::GET,
            "/api/admin/operator-keys",
            &staff,
            None,
        )
        .await;
    assert_eq!(status, 200, "{overview}");
    assert!(
        overview["draft_changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["action"] == "depart"),
        "{overview}"
    );
    let signature =
        byo_core::keylist_testing::sign(overview["draft"]["body"].as_str().unwrap(), &signing);
    let (status, pushed) = api
        .call(
            reqwest::Method::POST,
            &format!(
                "/api/admin/operator-keys/{}/signatures",
                overview["draft"]["version"]
            ),
            &staff,
            Some(json!({"signature": signature})),
        )
        .await;
    assert_eq!(
        (status, &pushed["delivered"], &pushed["failed"]),
        (200, &json!(1), &json!(0)),
        "{pushed}"
    );
    let departed = op_key.public_key().to_openssh().unwrap();
    let departed = departed.split_whitespace().nth(1).unwrap();
    let authorized = host.sh_ok("cat /home/spark/.ssh/authorized_keys");
    assert!(
        !authorized.contains(departed)
            && authorized.contains(kept.split_whitespace().nth(1).unwrap()),
        "{authorized}"
    );
    assert!(
        ssh(
            &op_file,
            &[&format!("spark@{}", host.ipv4()), "sudo -n id -u"]
        )
        .is_err(),
        "the departed operator's key still logs in as spark"
    );
    phase("the departed operator's key is off the host");

    // No agent token crossed the relay's public interface in the clear: the backend's
    // calls went over TLS to the relay's name (its SNI is the one readable thing).
    let target = store.agent_targets().await.unwrap().remove(0);
    let agent_token = sealer
        .open(
            &byo_server::seal::SealedAt::agent_token(&target.id),
            &target.agent_token.unwrap(),
        )
        .unwrap();
    let captured = capture.bytes();
    let relay_name = byo_server::relay_ca::relay_name(provisioned["slug"].as_str().unwrap(), &base);
    assert!(
        contains(&captured, relay_name.as_bytes()),
        "the capture saw the backend's TLS to {relay_name} ({} bytes)",
        captured.len()
    );
    assert!(
        !contains(&captured, agent_token.as_bytes()),
        "the agent token crossed the relay's public interface in the clear"
    );
    phase("golden path done");
}

/// What the upgrade scenarios need of the onboarded, rented host.
struct Upgrade<'a> {
    host: &'a HostContainer,
    store: &'a byo_db::Store,
    host_id: &'a str,
    releases: &'a Path,
    arch: &'a str,
    server: &'a str,
    instance: &'a str,
    customer_key: &'a Path,
    relay_public: &'a str,
    staff: &'a str,
    watchful: byo_server::state::AppState,
    /// The host's name, as `byo fleet upgrade` reaches it through an ssh config.
    slug: &'a str,
    /// The operator's private key, signed into the list the host received at enrolment.
    operator_key: &'a Path,
    work: &'a Path,
}

/// A superadmin who signs in with a password, as `byo release publish` and `byo fleet
/// upgrade` do (BYO_PASSWORD).
async fn password_user(store: &byo_db::Store, email: &str, password: &str) {
    let hash = byo_server::password::Passwords::new(byo_server::config::PasswordHashing {
        memory_kib: 256,
        iterations: 1,
        parallelism: 1,
    })
    .hash(password.to_owned())
    .await
    .unwrap();
    let now = chrono::Utc::now();
    let user = store
        .create_user(
            NewUser {
                email,
                display_name: "",
                password_hash: &hash,
            },
            now,
        )
        .await
        .unwrap();
    store
        .grant_role(&user.sub, Role::Superadmin, None, now)
        .await
        .unwrap();
}

/// Runs the `byo` binary as an operator does (the password in BYO_PASSWORD, `stdin` piped
/// in): whether it exited 0, and what it printed.
fn byo_cli(args: &[&str], password: &str, stdin: Option<&[u8]>) -> (bool, String) {
    use std::io::Write;
    use std::process::Stdio;
    tokio::task::block_in_place(|| {
        let mut child = Command::new(support::sibling("byo"))
            .args(args)
            .env("BYO_PASSWORD", password)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(bytes) = stdin {
            child.stdin.take().unwrap().write_all(bytes).unwrap();
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    })
}

/// Puts `bytes` in the release directory as the build the one-liner fetches, signed with
/// the release key (publishing: nothing reaches the host until the one-liner runs there).
fn publish_build(releases: &Path, arch: &str, bytes: &[u8]) {
    support::publish_agent(releases, arch, bytes, support::release_key());
}

/// A build that answers `--version` (so the installer's check passes) and crashes at every
/// start of serving: what the rollback exists for.
fn crashing_build(mark: &str) -> Vec<u8> {
    format!(
        "#!/bin/sh\ncase \"$1\" in\n  --version) echo 'byo-agent 0.0.0-{mark}' ;;\n  *) echo 'byo-agent: build {mark} crashes at start' >&2; exit 70 ;;\nesac\n"
    )
    .into_bytes()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The customer's ssh session, held open: each line written comes back prefixed.
struct Session {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Session {
    fn open(relay: &str, key: &Path) -> Session {
        use std::io::BufRead;
        let mut child = Command::new("ssh")
            .args(["-F", "/dev/null", "-i"])
            .arg(key)
            .args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=5",
                "-o",
                "LogLevel=ERROR",
                "-o",
                "IdentitiesOnly=yes",
                &format!("root@{relay}"),
                "while read l; do echo \"$(hostname) $l\"; done",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Session { child, lines }
    }

    /// Sends `word` and returns the answer line (None when the session is gone).
    fn echo(&mut self, word: &str) -> Option<String> {
        use std::io::Write;
        writeln!(self.child.stdin.as_mut()?, "{word}").ok()?;
        self.lines.next()?.ok()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Serving's availability seen from the host itself, every 50 ms, into /tmp/poll.log:
/// "<epoch seconds> <HTTP status>" (401: the agent answered; 000: nothing listening).
const POLLER: &str = "#!/bin/sh\nwhile :; do c=$(curl -s -m 1 -o /dev/null -w '%{http_code}' http://10.8.0.2:8080/v1/vms); echo \"$(date +%s.%N) $c\" >> /tmp/poll.log; sleep 0.05; done\n";

/// The longest stretch in the poll log with no answer from serving, in seconds.
fn longest_outage(log: &str) -> f64 {
    let mut worst = 0.0f64;
    let mut last_up: Option<f64> = None;
    let mut down = false;
    for line in log.lines() {
        let mut it = line.split_whitespace();
        let (Some(t), Some(code)) = (it.next().and_then(|t| t.parse::<f64>().ok()), it.next())
        else {
            continue;
        };
        if code == "401" {
            if down && let Some(u) = last_up {
                worst = worst.max(t - u);
            }
            down = false;
            last_up = Some(t);
        } else {
            down = true;
        }
    }
    worst
}

async fn upgrades_and_rollbacks(u: Upgrade<'_>) {
    const BIN: &str = "/usr/local/bin/byo-agent";
    let t0 = Instant::now();
    let host = u.host;
    let sha_on_host = |path: &str| {
        host.sh(&format!("sha256sum {path} | cut -d' ' -f1"))
            .stdout
            .iter()
            .map(|&b| b as char)
            .collect::<String>()
            .trim()
            .to_owned()
    };
    let one_liner = || {
        let line = format!("curl -fsSL {}/install.sh | sudo bash -s --", u.server);
        let out = host.exec(&["runuser", "-u", "owner", "--", "bash", "-c", &line]);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!(
            "--- upgrade one-liner exited {:?}:\n{said}",
            out.status.code()
        );
        (out.status.code(), said)
    };
    // /etc/enverge as serving needs it: 0711 root, each file with the mode preparation gave it.
    let modes = || {
        host.sh_ok("stat -c '%n %a %U:%G' /etc/enverge /etc/enverge/* | grep -v -e /etc/enverge/server -e rolled-back.json")
    };
    let prepare_runs = || {
        host.sh_ok(
            "systemctl show -p InvocationID --value enverge-agent-prepare.service; \
             journalctl -u enverge-agent-prepare --no-pager -o cat | grep -c 'preparing spark-' || true",
        )
    };
    let instance_pid = || {
        host.sh_ok(&format!("lxc info {} | sed -n 's/^PID: //p'", u.instance))
            .trim()
            .to_owned()
    };
    let beat_version = async || {
        u.store
            .host_status(u.host_id)
            .await
            .unwrap()
            .and_then(|s| s.agent_version)
            .unwrap_or_default()
    };
    let journal = || {
        host.sh_ok("journalctl -u enverge-agent -u enverge-agent-rollback -u enverge-agent-install -n 80 --no-pager -o short-monotonic")
    };
    let serving_answers = async |within: Duration| {
        until("serving to answer on the host", within, async || {
            let out =
                host.sh("curl -s -m 1 -o /dev/null -w '%{http_code}' http://10.8.0.2:8080/v1/vms");
            (String::from_utf8_lossy(&out.stdout) == "401").then_some(())
        })
        .await
    };

    // --- Item 3: the upgrade, for real. ---
    let mut session = Session::open(u.relay_public, u.customer_key);
    let answer = session
        .echo("before")
        .expect("the customer's session is open");
    assert_eq!(answer, format!("{} before", u.instance));
    let old = sha_on_host(BIN);
    let modes_before = modes();
    assert!(
        modes_before.starts_with("/etc/enverge 711 root:root\n"),
        "{modes_before}"
    );
    let prepared_before = prepare_runs();
    let prepare_row = u
        .store
        .host(u.host_id)
        .await
        .unwrap()
        .unwrap()
        .prepare_state;
    let pid_before = instance_pid();
    assert!(!pid_before.is_empty(), "the instance runs");
    // The new build: the same binary with a marker appended (an ELF ignores trailing bytes),
    // so its digest — and the build the heartbeat reports — differ from the running one's.
    let mut new_build = std::fs::read(support::sibling("byo-agent")).unwrap();
    new_build.extend_from_slice(b"\nbyo test build: upgrade 2\n");
    let new_sha = sha256_hex(&new_build);
    let new_id = &new_sha[..12];
    let new_version = format!("({new_id})");
    // Published as an operator publishes (J, "publishing is not delivery"): signed where the
    // release key is (`byo release sign`, the key on standard input), uploaded as a
    // superadmin (`byo release publish`); the server verifies it against its release_key.
    const PASSWORD: &str = "release-desk-password";
    let email = "release@example.com";
    password_user(u.store, email, PASSWORD).await;
    let build_file = u.work.join("byo-agent-upgrade-2");
    std::fs::write(&build_file, &new_build).unwrap();
    std::fs::set_permissions(
        &build_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let build_arg = build_file.to_string_lossy().into_owned();
    let release_private = support::release_key()
        .to_openssh(ssh_key::LineEnding::LF)
        .unwrap();
    let (ok, said) = byo_cli(
        &["release", "sign", "--build", &build_arg],
        PASSWORD,
        Some(release_private.as_bytes()),
    );
    assert!(ok && said.contains(&format!("build {new_id}")), "{said}");
    let (ok, said) = byo_cli(
        &[
            "release", "publish", "--server", u.server, "--email", email, "--build", &build_arg,
        ],
        PASSWORD,
        None,
    );
    assert!(
        ok && said.contains(&format!("build {new_id}")) && said.contains("No host changed build"),
        "{said}"
    );
    assert!(!beat_version().await.ends_with(&new_version));
    host.write("/tmp/poll.sh", POLLER.as_bytes(), 0o755);
    host.sh_ok("rm -f /tmp/poll.log; systemd-run --unit=byo-test-poll /bin/sh /tmp/poll.sh");
    until(
        "the poller's first answer",
        Duration::from_secs(10),
        async || {
            host.read("/tmp/poll.log")
                .filter(|l| String::from_utf8_lossy(l).contains(" 401"))
                .map(|_| ())
        },
    )
    .await;
    // Delivered as an operator delivers it (issue #14, 5): `byo fleet upgrade` over the
    // operator's access path — here an ssh config naming the host by its slug, as spark with
    // the operator's key from the signed list — runs the host's own verifier (`sudo
    // byo-agent upgrade --build`, issue #36, 2: the agent already installed fetches, checks
    // the pinned release key, installs) and waits for the heartbeat to report the build,
    // healthy.
    let ssh_config = u.work.join("fleet-ssh-config");
    std::fs::write(
        &ssh_config,
        format!(
            "Host {slug}\n  HostName {ip}\n  User spark\n  IdentityFile {key}\n  IdentitiesOnly yes\n  \
             StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            slug = u.slug,
            ip = host.ipv4(),
            key = u.operator_key.display()
        ),
    )
    .unwrap();
    let asked = Instant::now();
    let (ok, said) = byo_cli(
        &[
            "fleet",
            "upgrade",
            "--server",
            u.server,
            "--email",
            email,
            "--build",
            new_id,
            "--via",
            "ssh-config",
            "--ssh-config",
            &ssh_config.to_string_lossy(),
            "--wait-secs",
            "120",
        ],
        PASSWORD,
        None,
    );
    let installed = asked.elapsed();
    eprintln!("--- byo fleet upgrade:\n{said}");
    assert!(ok, "byo fleet upgrade failed:\n{said}");
    for says in [
        "1 host(s), 1 wave(s)".to_owned(),
        format!("wave 0: upgrading {}\n", u.slug),
        format!("{}: upgrade done in", u.slug),
        format!("{}: healthy on build {new_id}", u.slug),
        format!("1 healthy on build {new_id}, 0 skipped"),
    ] {
        assert!(said.contains(&says), "{says:?} not printed:\n{said}");
    }
    // The run, as /admin/releases shows it: closed, the host healthy on the build.
    let run = u.store.fleet_runs(1).await.unwrap().remove(0);
    assert_eq!(run.state, byo_wire::states::FleetRunState::Closed);
    assert_eq!(run.build, new_id);
    let page = reqwest::Client::new()
        .get(format!("{}/admin/releases", u.server))
        .header("cookie", format!("byo_session={}", u.staff))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let section = page
        .split(&format!("id=\"run-{}\"", run.id))
        .nth(1)
        .unwrap_or_else(|| panic!("run {} not on /admin/releases:\n{page}", run.id));
    assert!(
        section.contains("<span class=\"state\">closed</span>"),
        "{section}"
    );
    let row = section
        .split(&format!("id=\"fleet-{}-{}\"", run.id, u.slug))
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_else(|| panic!("{} not in the run:\n{section}", u.slug));
    assert!(
        row.contains("<td class=\"state\">healthy</td>") && row.contains(&new_version),
        "{row}"
    );
    println!(
        "figure: byo fleet upgrade of the rented golden-path host (ssh-config, the host's own verifier under systemd): started to healthy in {:.1} s",
        installed.as_secs_f64()
    );
    serving_answers(Duration::from_secs(30)).await;
    until(
        "the heartbeat to report the new build",
        Duration::from_secs(60),
        async || beat_version().await.ends_with(&new_version).then_some(()),
    )
    .await;
    let to_beat = asked.elapsed();
    host.sh_ok("systemctl stop byo-test-poll");
    let poll = String::from_utf8(host.read("/tmp/poll.log").unwrap()).unwrap();
    let downtime = longest_outage(&poll);
    eprintln!(
        "[upgrade] byo fleet upgrade {:.1} s; serving down {downtime:.2} s; heartbeat with the new build {:.1} s after the upgrade started",
        installed.as_secs_f64(),
        to_beat.as_secs_f64()
    );
    assert_eq!(sha_on_host(BIN), new_sha, "the new build is installed");
    assert_eq!(
        sha_on_host(&format!("{BIN}.previous")),
        old,
        ".previous holds the old build"
    );
    assert_eq!(modes(), modes_before, "/etc/enverge as serving needs it");
    assert_eq!(prepare_runs(), prepared_before, "preparation did not run");
    assert_eq!(
        u.store
            .host(u.host_id)
            .await
            .unwrap()
            .unwrap()
            .prepare_state,
        prepare_row
    );
    assert_eq!(instance_pid(), pid_before, "the instance kept running");
    assert_eq!(
        session.echo("after").as_deref(),
        Some(format!("{} after", u.instance).as_str()),
        "the customer's session survived the upgrade"
    );
    drop(session);
    // The branches below install crashing builds — shell scripts, which publishing refuses
    // (not an executable of the arch) — by putting them in the release directory, whose
    // files the installer serves only while no build of the arch is published as a row.
    u.store
        .execute_unchecked("delete from agent_releases")
        .await
        .unwrap();

    // --- Item 4: a build that crashes at start; systemd's OnFailure= fires the rollback. ---
    let good = new_sha.clone();
    let bad1 = crashing_build("crash-1");
    publish_build(u.releases, u.arch, &bad1);
    let asked = Instant::now();
    let (code, said) = one_liner();
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(sha_on_host(&format!("{BIN}.previous")), good);
    until(
        "the rollback to restore the good build",
        Duration::from_secs(120),
        async || (sha_on_host(BIN) == good).then_some(()),
    )
    .await;
    serving_answers(Duration::from_secs(30)).await;
    let rolled = asked.elapsed();
    eprintln!(
        "[rollback] a crashing build installed, rolled back and serving again in {:.1} s",
        rolled.as_secs_f64()
    );
    let said = journal();
    assert!(
        said.contains(&format!("restored the previous build at {BIN}")),
        "{said}"
    );
    assert!(
        host.read(&format!("{BIN}.previous")).is_none(),
        ".previous is consumed"
    );
    assert!(host.read("/etc/enverge/rolled-back.json").is_some());
    until(
        "the heartbeat to report the rollback",
        Duration::from_secs(30),
        async || {
            u.store
                .host_status(u.host_id)
                .await
                .unwrap()
                .filter(|s| s.details.0.rollback.is_some())
                .map(|_| ())
        },
    )
    .await;
    assert_eq!(instance_pid(), pid_before, "the instance kept running");

    // Both builds bad: the rollback goes back once, to a build that fails too, and then
    // leaves the host down rather than flipping between them.
    let bad2 = crashing_build("crash-2");
    publish_build(u.releases, u.arch, &bad1);
    let (code, said) = one_liner();
    assert_eq!(code, Some(0), "{said}");
    publish_build(u.releases, u.arch, &bad2);
    let (code, said) = one_liner();
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(sha_on_host(&format!("{BIN}.previous")), sha256_hex(&bad1));
    until(
        "the rollback to give up",
        Duration::from_secs(180),
        async || {
            journal()
                .contains("no previous build at /usr/local/bin/byo-agent.previous")
                .then_some(())
        },
    )
    .await;
    let said = journal();
    assert!(
        said.contains("restored the previous build") && said.contains("crash-1"),
        "{said}"
    );
    assert_eq!(
        sha_on_host(BIN),
        sha256_hex(&bad1),
        "restored once, not again"
    );
    assert!(host.read(&format!("{BIN}.previous")).is_none());
    let state = host.sh("systemctl is-active enverge-agent.service");
    assert_eq!(String::from_utf8_lossy(&state.stdout).trim(), "failed");
    // /admin says so once the heartbeat is older than the threshold (10 s here).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(byo_server::serve(
        u.watchful.clone(),
        listener,
        std::future::pending(),
    ));
    let page = until(
        "/admin to show the host unreachable",
        Duration::from_secs(60),
        async || {
            let page = reqwest::Client::new()
                .get(format!("{admin}/admin/hosts/{}", u.host_id))
                .header("cookie", format!("byo_session={}", u.staff))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            page.contains("agent unreachable").then_some(page)
        },
    )
    .await;
    // The second rollback is recorded on the host; the build it restored never beat to say so.
    assert!(page.contains("agent unreachable"), "{page}");
    assert!(host.read("/etc/enverge/rolled-back.json").is_some());
    let down = sha_on_host(BIN);
    assert_eq!(down, sha256_hex(&bad1));
    assert_eq!(
        instance_pid(),
        pid_before,
        "the instance runs on with serving down"
    );

    // An operator's upgrade to a good build brings the downed host back (reset-failed); the
    // owner's terminal says what happened.
    publish_build(u.releases, u.arch, &new_build);
    let (code, said) = one_liner();
    assert_eq!(code, Some(0), "{said}");
    for says in [
        "This machine is already enrolled; reusing its credentials.",
        "Serving restarted on the new build.",
        "byo agent installed",
    ] {
        assert!(said.contains(says), "{says:?} not on the terminal:\n{said}");
    }
    serving_answers(Duration::from_secs(30)).await;
    assert_eq!(sha_on_host(BIN), good);
    assert!(host.read("/etc/enverge/rolled-back.json").is_none());
    eprintln!(
        "[upgrades and rollbacks] all branches in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
}
