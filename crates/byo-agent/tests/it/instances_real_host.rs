//! The agent's side of an instance (E1 scenarios 1–5, G scenarios 6–7, L2, G note 4) on a
//! real host: a Debian system container prepared by the agent binary, its serving unit
//! installed as install.sh installs it and running as spark, the VM API called as the
//! backend calls it (the agent token), tenant containers in Debian's LXD nested inside,
//! reached by ssh through the published port. The relay's ssh_mapd is a fake in this file
//! that speaks its API (the golden path uses the real one). `tenants` is issue #11's
//! isolation: from inside the customer's container, the internet and nothing of the owner's.

#[path = "instances_real_host/reboot.rs"]
mod reboot;
#[path = "instances_real_host/reprepare.rs"]
mod reprepare;
use crate::support;
#[path = "instances_real_host/tenants.rs"]
mod tenants;
#[path = "instances_real_host/unprivileged.rs"]
mod unprivileged;

use std::time::{Duration, Instant};

use byo_core::keylist_testing::private_key;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_wire::relay::MapEntry;
use serde_json::{Value, json};
use support::host_container::{HostContainer, bridge_gateway};
use support::mapd::{FakeMapd, start_mapd};
use support::prepared::{
    RelayView, agent_api, enrolled, install_units, key_file, prepare, public_line, text, wg_keypair,
};

struct World {
    host: HostContainer,
    mapd: FakeMapd,
    /// Where the fake ssh_mapd listens: this machine, on the host's LAN.
    mapd_host: String,
    mapd_port: u16,
    token: String,
    customer_key: String,
}

impl World {
    /// Call the agent's API from inside the host, as the relay's Caddy would: (status, body).
    fn api(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        agent_api(&self.host, &self.token, method, path, body)
    }

    fn instances(&self) -> String {
        self.host.sh_ok("lxc list --format csv -c ns")
    }

    fn map(&self) -> Vec<MapEntry> {
        self.mapd.map.lock().unwrap().mappings.clone()
    }

    /// The customer's ssh, from the host to the published port: which container answers.
    fn ssh_hostname(&self, port: u16) -> std::process::Output {
        self.host.sh(&format!(
            "ssh -i /root/customer -p {port} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o ConnectTimeout=10 root@10.8.0.2 'hostname; cat /etc/motd'"
        ))
    }

    fn wait_for<T>(&self, what: &str, within: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let started = Instant::now();
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(
                started.elapsed() < within,
                "{what} did not happen within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn create(&self, name: &str, key: &str) -> (u16, Value) {
        self.api("POST", "/v1/vms", Some(json!({"name": name, "ssh_public_key": key, "ssh_hostname": format!("{name}.real-test.ssh.example")})))
    }
}

fn scenario_1_create_publishes_ssh_and_points_the_relay(w: &World) {
    let started = Instant::now();
    let (status, body) = w.create("c1", &w.customer_key);
    let created_in = started.elapsed();
    assert_eq!(status, 201, "{body}");
    let port = body["ssh_port"].as_u64().unwrap() as u16;
    assert_eq!(body["gpu_check"]["ok"], true);
    assert!(w.instances().contains("c1,RUNNING"), "{}", w.instances());
    assert_eq!(
        w.map(),
        vec![MapEntry {
            port: 22,
            target: "10.8.0.2".into(),
            target_port: port
        }]
    );
    let ssh = w.wait_for("the customer's ssh", Duration::from_secs(20), || {
        let out = w.ssh_hostname(port);
        out.status.success().then_some(out)
    });
    let said = text(&ssh);
    assert!(
        said.starts_with("c1\n"),
        "the customer landed elsewhere: {said}"
    );
    assert!(
        said.contains("Welcome to your Enverge GPU instance")
            && said.contains("c1.real-test.ssh.example")
    );
    eprintln!(
        "scenario 1: create answered in {:.2} s, ssh reachable {:.2} s after the request",
        created_in.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

fn scenario_2_the_gpu_check_and_startup_script_are_advisory(w: &World) {
    // An image whose startup script fails, put behind the alias every create launches by.
    let original = w.host.sh_ok("lxc query /1.0/images/aliases/lofispark-base | sed -n 's/.*\"target\": \"\\([0-9a-f]*\\)\".*/\\1/p'");
    let original = original.trim().to_owned();
    assert_eq!(original.len(), 64, "the alias's target: {original:?}");
    w.host.sh_ok(
        "lxc init lofispark-base advisory-src -p lofispark-base >/dev/null
         printf 'echo the startup script failed >&2\nexit 7\n' | lxc file push - advisory-src/etc/enverge/startup.sh --create-dirs
         lxc publish advisory-src --alias advisory-base >/dev/null && lxc delete advisory-src",
    );
    let probe = w
        .host
        .sh_ok("lxc image info advisory-base | sed -n 's/^Fingerprint: //p'");
    let point = |fp: &str| {
        w.host.sh_ok(&format!(
            "lxc query -X PUT --data '{{\"target\": \"{fp}\", \"description\": \"\"}}' /1.0/images/aliases/lofispark-base"
        ))
    };
    point(probe.trim());
    let (status, body) = w.create("c2", &w.customer_key);
    point(&original);
    w.host.sh_ok("lxc image delete advisory-base");
    // Reported, and the instance created anyway.
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["startup_script"]["ok"], false, "{body}");
    let detail = body["startup_script"]["detail"].as_str().unwrap();
    assert!(
        detail.contains("exited 7") && detail.contains("the startup script failed"),
        "{detail}"
    );
    assert_eq!(
        body["gpu_check"],
        json!({"ok": true, "detail": "this profile has no GPU"})
    );
    assert!(w.instances().contains("c2,RUNNING"), "{}", w.instances());
    assert_eq!(w.api("DELETE", "/v1/vms/c2", None).0, 200);
    assert!(w.map().is_empty() && !w.instances().contains("c2"));
}

fn scenario_3_a_key_that_does_not_parse_is_refused_before_anything_exists(w: &World) {
    let before = (w.instances(), w.map());
    let (status, body) = w.create("c3", "ssh-ed25519 not-a-key");
    assert_eq!(status, 400, "{body}");
    assert!(body["message"].as_str().unwrap().contains("does not parse"));
    assert_eq!(
        (w.instances(), w.map()),
        before,
        "a refusal changed something"
    );
}

fn scenario_4_a_name_that_exists_is_refused_and_the_instance_untouched(w: &World) {
    let before = (w.instances(), w.map());
    let (status, body) = w.create("c1", &w.customer_key);
    assert_eq!(status, 409, "{body}");
    assert_eq!((w.instances(), w.map()), before);
}

/// One instance per host on the agent too: with c1 held, a create under another name is
/// refused (409 host_occupied, naming c1) and nothing changes — no container, no map entry.
fn a_second_instance_is_refused_while_the_host_holds_one(w: &World) {
    let before = (w.instances(), w.map());
    let (status, body) = w.create("c4b", &w.customer_key);
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"], "host_occupied", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("c1"),
        "the refusal names the instance held: {body}"
    );
    assert_eq!((w.instances(), w.map()), before);
    // Stopped, it still holds the host.
    assert_eq!(
        w.api("POST", "/v1/vms/c1/state", Some(json!({"action": "stop"})))
            .0,
        204
    );
    let (status, body) = w.create("c4b", &w.customer_key);
    assert_eq!(
        (status, &body["error"]),
        (409, &json!("host_occupied")),
        "{body}"
    );
    assert!(!w.instances().contains("c4b"), "{}", w.instances());
    assert_eq!(
        w.api("POST", "/v1/vms/c1/state", Some(json!({"action": "start"})))
            .0,
        204
    );
    assert_eq!(
        w.map(),
        before.1,
        "started again, the relay points at c1 as before"
    );
}

/// M on a host enrolled outside production (`test` here, `local` under `byo up`): serving
/// applies a list for the environment the host enrolled into and refuses one for another.
fn m_serving_takes_lists_for_the_environment_it_enrolled_into(
    w: &World,
    signing: &ssh_key::PrivateKey,
) {
    use byo_core::keylist::OperatorKey;
    use byo_core::keylist_testing::{envelope, list};
    let push = |env: &str, version: u64| {
        let key = private_key();
        let keys = list(
            env,
            version,
            vec![OperatorKey {
                user_sub: "op-2".into(),
                label: format!("{env} desk"),
                public_key: public_line(&key),
            }],
            chrono::Utc::now(),
        );
        w.host
            .write("/root/list.json", &envelope(&keys, &[signing]), 0o600);
        let out = w.host.sh(&format!(
            "curl -s -m 30 -X PUT -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' --data-binary @/root/list.json -w '\n%{{http_code}}' http://10.8.0.2:8080/v1/operator-keys",
            w.token
        ));
        (text(&out), public_line(&key))
    };
    let authorized = || w.host.sh_ok("cat /home/spark/.ssh/authorized_keys");
    let (said, _) = push("production", 2);
    assert!(
        said.ends_with("422"),
        "a list for another environment: {said}"
    );
    let (said, key) = push(support::prepared::ENVIRONMENT, 2);
    assert!(
        said.ends_with("200"),
        "a list for its own environment: {said}"
    );
    assert!(authorized().contains(&key), "{}", authorized());
}

fn scenario_5_a_relay_that_refuses_the_map_reverts_the_create(w: &World) {
    let before = (w.instances(), w.map());
    *w.mapd.refuse.lock().unwrap() = true;
    let (status, body) = w.create("c5", &w.customer_key);
    *w.mapd.refuse.lock().unwrap() = false;
    assert_eq!(status, 502, "{body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("relay's SSH map") && message.contains("reverted"),
        "{message}"
    );
    assert!(
        !w.instances().contains("c5"),
        "the refused create left its container: {}",
        w.instances()
    );
    assert_eq!((w.instances(), w.map()), before);
}

fn g4_a_relay_that_lost_its_map_is_healed_within_a_heartbeat(w: &World) {
    let want = w.map();
    w.mapd.map.lock().unwrap().mappings.clear();
    let started = Instant::now();
    while w.map() != want {
        if started.elapsed() > Duration::from_secs(10) {
            let journal = w
                .host
                .sh("journalctl -u enverge-agent.service -n 30 --no-pager");
            panic!(
                "the heartbeat did not rewrite the relay's map within 10 s:\n{}",
                text(&journal)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn scenario_6_delete_removes_the_container_and_clears_the_map(w: &World) {
    let (status, body) = w.api("DELETE", "/v1/vms/c1", None);
    assert_eq!(status, 200, "{body}");
    assert!(!w.instances().contains("c1"), "{}", w.instances());
    assert!(w.map().is_empty(), "the map still forwards: {:?}", w.map());
    assert!(
        !w.ssh_hostname(22000).status.success(),
        "ssh still lands somewhere"
    );
}

fn scenario_7_a_delete_of_an_instance_already_gone_answers_404(w: &World) {
    let before = (w.instances(), w.map());
    let (status, body) = w.api("DELETE", "/v1/vms/c1", None);
    assert_eq!(status, 404, "{body}");
    // The body is what the backend reads as the confirmation (G.5): the wire type's
    // `not_found`, exactly as the agent words it.
    assert_eq!(
        body,
        json!({"error": "not_found", "message": "no such instance on this host"})
    );
    let refusal: byo_wire::vm::AgentRefusal = serde_json::from_value(body).unwrap();
    assert_eq!(refusal.error, byo_wire::vm::AgentErrorCode::NotFound);
    assert_eq!((w.instances(), w.map()), before);
}

fn unauthenticated_calls_are_refused(w: &World) {
    let out = w.host.sh("curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Authorization: Bearer byo_agent_nope' -d '{}' http://10.8.0.2:8080/v1/vms");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "401");
}

#[test]
fn e1_g_l2_the_agents_side_of_an_instance_on_a_real_host() {
    let token = SecretToken::generate(TokenKind::SshMap).expose().to_owned();
    let mapd = FakeMapd {
        token: token.clone(),
        ..FakeMapd::default()
    };
    let port = start_mapd(mapd.clone());
    let relay = RelayView {
        wg_endpoint: format!("{}:51820", bridge_gateway()),
        wg_public: wg_keypair().1,
        ssh_map_endpoint: format!("{}:{port}", bridge_gateway()),
        ssh_map_token: token,
    };
    let Some(e) = enrolled("byo-vms", Some(relay)) else {
        return;
    };
    // The backend is the fake's own: host-report lands there (the deliberate run's steps).
    e.host.write(
        "/etc/enverge/server",
        format!("http://{}:{port}\n", bridge_gateway()).as_bytes(),
        0o644,
    );
    *mapd.host.lock().unwrap() = Some(e.host.name().to_owned());
    let (ok, said) = prepare(&e.host, &[]);
    assert!(ok, "preparation failed:\n{said}");
    install_units(&e.host, 2);
    e.host.sh_ok("systemctl start enverge-agent.service");
    let customer = private_key();
    let key_path = key_file(e.dir.path(), "customer", &customer);
    e.host.push(&key_path, "/root/customer", 0o600);
    let token = e.agent_token.clone();
    let w = World {
        host: e.host,
        mapd,
        mapd_host: bridge_gateway(),
        mapd_port: port,
        token,
        customer_key: public_line(&customer),
    };
    let started = Instant::now();
    while w.api("GET", "/v1/vms", None).0 != 200 {
        if started.elapsed() > Duration::from_secs(30) {
            let journal = w.host.sh("systemctl status enverge-agent.service enverge-agent-prepare.service --no-pager; journalctl -u enverge-agent.service -n 40 --no-pager");
            panic!("serving did not answer within 30 s:\n{}", text(&journal));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // Serving's own process: root's refresh of the tenant firewall runs beside it on request.
    let who = w
        .host
        .sh_ok("ps -o user= -p \"$(pgrep -d, -f '^/usr/local/bin/byo-agent serve')\" | sort -u");
    assert_eq!(who.trim(), "spark", "serving runs unprivileged");

    unauthenticated_calls_are_refused(&w);
    m_serving_takes_lists_for_the_environment_it_enrolled_into(&w, &e.enrollment.signing);
    scenario_2_the_gpu_check_and_startup_script_are_advisory(&w);
    // On an empty host: with an instance held, any other create is refused first.
    scenario_5_a_relay_that_refuses_the_map_reverts_the_create(&w);
    scenario_1_create_publishes_ssh_and_points_the_relay(&w);
    unprivileged::serving_cannot_make_itself_root(&w);
    reprepare::l_prepare_again_is_refused_while_an_instance_holds_the_rails(&w);
    tenants::tenants_see_the_internet_and_nothing_of_the_owners(&w);
    scenario_3_a_key_that_does_not_parse_is_refused_before_anything_exists(&w);
    scenario_4_a_name_that_exists_is_refused_and_the_instance_untouched(&w);
    a_second_instance_is_refused_while_the_host_holds_one(&w);
    g4_a_relay_that_lost_its_map_is_healed_within_a_heartbeat(&w);
    reboot::l2_a_reboot_of_the_host_restores_the_running_instance_head_before_relay(&w);
    tenants::still_after_a_reboot(&w);
    reboot::l2_a_reboot_of_the_host_leaves_a_stopped_instance_stopped(&w);
    reprepare::l_prepare_again_on_an_idle_host_checks_every_step_and_serving_keeps_answering(&w);
    reprepare::l_a_failed_step_of_prepare_again_is_reported_and_left(&w);
    reboot::the_stopped_instance_starts_again_on_its_customers_word(&w);
    // DESIGN §7's figure for serving at rest: its resident memory, with an instance up.
    let rss = w
        .host
        .sh_ok("grep VmRSS /proc/$(pgrep -f 'byo-agent serve' | head -n 1)/status");
    eprintln!("serving, idle with one instance: {}", rss.trim());
    scenario_6_delete_removes_the_container_and_clears_the_map(&w);
    scenario_7_a_delete_of_an_instance_already_gone_answers_404(&w);
    let _ = e.enrollment.dir;
}
