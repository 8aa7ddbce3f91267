//! A Debian host container prepared by the real agent binary, as enrolment would leave it
//! (credentials, pinned signing key, the signed operator-key list) with the staff-only test
//! profile; shared by the preparation and instance suites.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use byo_core::keylist::OperatorKey;
use byo_core::keylist_testing::{envelope, list, private_key};
use byo_core::tokens::{SecretToken, TokenKind};
use serde_json::json;
use ssh_key::LineEnding;

use super::host_container::HostContainer;

pub const ENVIRONMENT: &str = "test";

pub fn public_line(key: &ssh_key::PrivateKey) -> String {
    let mut p = key.public_key().clone();
    p.set_comment("");
    p.to_openssh().unwrap()
}

pub fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn ssh(ip: &str, port: u16, user: &str, key: &Path, command: &str) -> std::process::Output {
    Command::new("ssh")
        .args([
            "-p",
            &port.to_string(),
            "-i",
            key.to_str().unwrap(),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "IdentitiesOnly=yes",
            &format!("{user}@{ip}"),
            command,
        ])
        .output()
        .unwrap()
}

pub use super::kernel::wg_keypair;

/// A private key in a file ssh accepts (0600).
pub fn key_file(dir: &Path, name: &str, key: &ssh_key::PrivateKey) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, key.to_openssh(LineEnding::LF).unwrap().as_bytes()).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    path
}

/// Where the relay is, as the host will be told at enrolment.
#[derive(Clone, Debug)]
pub struct RelayView {
    pub wg_endpoint: String,
    pub wg_public: String,
    pub ssh_map_endpoint: String,
    pub ssh_map_token: String,
}

/// A host container and what enrolment left on it.
pub struct Enrolled {
    pub host: HostContainer,
    pub enrollment: Enrollment,
}

impl std::ops::Deref for Enrolled {
    type Target = Enrollment;
    fn deref(&self) -> &Enrollment {
        &self.enrollment
    }
}

/// What enrolment left on a host container, and the keys the test holds against it.
pub struct Enrollment {
    pub ip: String,
    pub dir: tempfile::TempDir,
    pub owner_key: PathBuf,
    pub operator_key: PathBuf,
    pub agent_token: String,
    pub wg_private: String,
    /// The signing key the host pins: it signs lists pushed to serving.
    pub signing: ssh_key::PrivateKey,
}

/// The staff-only single-host test profile's constants (`linux-test`, migration 0004).
pub fn linux_test() -> serde_json::Value {
    json!({"gpu_model": null, "gpu_count": null, "gpu_mem_mib": null, "arch": null,
           "cuda_repo_arch": "x86_64", "node_count": 1, "rails": [],
           "prepare": {"lxd": "apt", "storage_driver": "dir", "pool_size": "20GiB",
                       "zfs_arc_max": 1073741824, "base_image": "minimal"}})
}

/// A fresh host container holding what enrolment keeps, with the agent binary installed.
pub fn enrolled(prefix: &str, relay: Option<RelayView>) -> Option<Enrolled> {
    let host = HostContainer::launch(prefix)?;
    let enrollment = enroll_into(&host, relay, "linux-test", linux_test());
    Some(Enrolled { host, enrollment })
}

/// What enrolment keeps, written into `host` (node0) as enrolment with `profile_id` and its
/// `constants` would leave it, with the agent binary installed.
pub fn enroll_into(
    host: &HostContainer,
    relay: Option<RelayView>,
    profile_id: &str,
    constants: serde_json::Value,
) -> Enrollment {
    let name = host.name().to_owned();
    // wg-quick falls back to wireguard-go here, which needs the tun device.
    let tun = Command::new("lxc")
        .args([
            "config",
            "device",
            "add",
            &name,
            "tun",
            "unix-char",
            "path=/dev/net/tun",
        ])
        .output()
        .unwrap();
    assert!(tun.status.success(), "{}", text(&tun));
    let ip = host.ipv4().to_string();
    let dir = tempfile::tempdir().unwrap();

    // The owner as the one-liner finds them: a login with sudo and their own key.
    let owner = private_key();
    let owner_key = key_file(dir.path(), "owner", &owner);
    host.sh_ok("id owner >/dev/null 2>&1 || useradd -m -s /bin/bash -G sudo owner; install -d -m 700 -o owner -g owner /home/owner/.ssh");
    host.write(
        "/home/owner/.ssh/authorized_keys",
        format!("{}\n", public_line(&owner)).as_bytes(),
        0o600,
    );
    host.sh_ok("chown owner:owner /home/owner/.ssh/authorized_keys; install -d -m 700 /etc/enverge /var/lib/enverge-agent");
    host.write("/etc/enverge/owner", b"owner\n", 0o644);

    let signing = private_key();
    let operator = private_key();
    let operator_key = key_file(dir.path(), "operator", &operator);
    let keys = list(
        ENVIRONMENT,
        1,
        vec![OperatorKey {
            user_sub: "op-1".into(),
            label: "laptop".into(),
            public_key: public_line(&operator),
        }],
        chrono::Utc::now(),
    );
    let (wg_private, _) = wg_keypair();
    let relay = relay.unwrap_or_else(|| RelayView {
        wg_endpoint: "10.231.0.1:51820".into(),
        wg_public: wg_keypair().1,
        ssh_map_endpoint: "10.8.0.1:8754".into(),
        ssh_map_token: SecretToken::generate(TokenKind::SshMap).expose().to_owned(),
    });
    let agent_token = SecretToken::generate(TokenKind::Agent);
    let creds = json!({
        "host_id": "h-real", "slug": "real-test", "environment": ENVIRONMENT,
        "host_token": SecretToken::generate(TokenKind::Host).expose(),
        "agent_token": agent_token.expose(),
        "wireguard": {"private_key": wg_private, "address": "10.8.0.2/24", "peer_public_key": relay.wg_public,
                      "endpoint": relay.wg_endpoint, "allowed_ips": "10.8.0.1/32"},
        "relay_name": "real-test-relay", "ssh_map_endpoint": relay.ssh_map_endpoint,
        "ssh_map_token": relay.ssh_map_token,
        "tunnel_hostname": null, "tunnel_connector_token": null, "operator_keys": null,
        "signing_keys": [], "profile_id": profile_id, "constants": constants,
        "lockout_owner": true
    });
    host.write(
        "/etc/enverge/credentials.json",
        creds.to_string().as_bytes(),
        0o600,
    );
    host.write(
        "/etc/enverge/agent-token.sha256",
        format!("{}\n", agent_token.hash().as_str()).as_bytes(),
        0o644,
    );
    // The environment it enrolled into, where enrolment keeps it: serving checks pushes
    // against it.
    host.write(
        "/etc/enverge/environment",
        format!("{ENVIRONMENT}\n").as_bytes(),
        0o644,
    );
    host.write(
        "/etc/enverge/signing-keys",
        format!("{}\n", public_line(&signing)).as_bytes(),
        0o644,
    );
    host.write(
        byo_core::render::units::OPERATOR_KEYS_HELD,
        &envelope(&keys, &[&signing]),
        0o644,
    );
    host.push(
        Path::new(env!("CARGO_BIN_EXE_byo-agent")),
        "/usr/local/bin/byo-agent",
        0o755,
    );
    Enrollment {
        ip,
        dir,
        owner_key,
        operator_key,
        agent_token: agent_token.expose().to_owned(),
        wg_private,
        signing,
    }
}

/// `byo-agent prepare` with `args`: whether it succeeded, and everything it said. An attempt
/// whose base image found no egress runs once more, as the real unit's restart would: the
/// bed reaches the Debian mirror through this machine's uplink, which is not ours.
pub fn prepare(host: &HostContainer, args: &[&str]) -> (bool, String) {
    let mut argv = vec!["/usr/local/bin/byo-agent", "prepare"];
    argv.extend_from_slice(args);
    let mut tries = 0;
    loop {
        tries += 1;
        let started = std::time::Instant::now();
        let out = host.exec(&argv);
        let said = text(&out);
        eprintln!(
            "--- byo-agent prepare {} ({:.1} s)\n{said}",
            args.join(" "),
            started.elapsed().as_secs_f64()
        );
        if out.status.success() || tries > 1 || !said.contains("build-base-image: no egress:") {
            return (out.status.success(), said);
        }
        eprintln!(
            "--- the attempt found no egress outside the bed; once more, as the unit's restart would"
        );
    }
}

/// Install the agent's three units as install.sh does, with a short heartbeat.
pub fn install_units(host: &HostContainer, heartbeat_every: u64) {
    for (name, text) in byo_core::render::units::units("/usr/local/bin/byo-agent") {
        host.write(
            &format!("/etc/systemd/system/{name}"),
            text.as_bytes(),
            0o644,
        );
    }
    host.write(
        "/etc/systemd/system/enverge-agent.service.d/test.conf",
        format!(
            "[Service]\nExecStart=\nExecStart=/usr/local/bin/byo-agent serve --heartbeat-every {heartbeat_every}\n"
        )
        .as_bytes(),
        0o644,
    );
    // As install.sh does: preparation and serving enabled, root's paths watching for what
    // serving asks (the reboot, the rails, the tenant firewall).
    use byo_core::render::units::{PREPARE, SERVING, SERVING_ASKS};
    host.sh_ok(&format!(
        "systemctl daemon-reload && systemctl enable {PREPARE} {SERVING} && systemctl enable --now {}",
        SERVING_ASKS.join(" ")
    ));
}

/// The agent's API called from inside the host on its tunnel address, as the relay's Caddy
/// calls it, with the agent token: (status, body; `Null` when it is not JSON).
pub fn agent_api(
    host: &HostContainer,
    token: &str,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let auth = format!("Authorization: Bearer {token}");
    let url = format!("http://10.8.0.2:8080{path}");
    let data = body.map(|b| b.to_string()).unwrap_or_default();
    let mut argv = vec![
        "curl",
        "-s",
        "-m",
        "180",
        "-X",
        method,
        "-H",
        &auth,
        "-H",
        "Content-Type: application/json",
        "-w",
        "\n%{http_code}",
    ];
    if !data.is_empty() {
        argv.extend(["--data-binary", &data]);
    }
    argv.push(&url);
    let out = host.exec(&argv);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = said.rsplit_once('\n').unwrap_or(("", "0"));
    (
        status.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

/// Serving started on a prepared `host` under its real unit, pointed at a stand-in relay and
/// backend on this machine (`support::mapd`): the stand-in, once serving answers its API.
pub fn serve_with_mapd(host: &HostContainer, e: &Enrollment) -> crate::support::mapd::FakeMapd {
    use crate::support::mapd::{FakeMapd, start_mapd};
    let handed_path = byo_core::render::units::HANDED_OVER;
    let mut handed: serde_json::Value =
        serde_json::from_str(&host.sh_ok(&format!("cat {handed_path}"))).unwrap();
    let mapd = FakeMapd {
        token: handed["ssh_map_token"].as_str().unwrap().to_owned(),
        ..FakeMapd::default()
    };
    let port = start_mapd(mapd.clone());
    let gateway = crate::support::host_container::bridge_gateway();
    handed["ssh_map_endpoint"] = json!(format!("{gateway}:{port}"));
    handed["server"] = json!(format!("http://{gateway}:{port}"));
    host.write(handed_path, handed.to_string().as_bytes(), 0o600);
    host.sh_ok(&format!("chown spark:spark {handed_path}"));
    host.sh_ok("systemctl start enverge-agent.service");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while agent_api(host, &e.agent_token, "GET", "/v1/vms", None).0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "serving answers within 30 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    mapd
}
