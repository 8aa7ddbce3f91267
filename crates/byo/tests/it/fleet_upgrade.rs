//! `byo fleet upgrade` as an operator runs it (issue #14, 5; J note 9), against `byo up` on
//! loopback: a published build, four simulated hosts — three real `sshd`s on loopback that
//! the CLI reaches with the operator's key through an ssh config (`--via ssh-config`), and
//! one with an instance being created — in waves, judged by their heartbeats on the real
//! server, halted by the first failure and resumed.
//!
//! Each sshd stands in for a host's: its ForceCommand is the host's stand-in for its agent's
//! verifier — it checks that the command is exactly `sudo /usr/local/bin/byo-agent upgrade
//! --build B` (never a script fetched from the server), fetches the build from the server
//! as the verifier would, and then either fails as `byo-agent upgrade` fails (its message,
//! its exit) or "upgrades": beats the server's heartbeat API with the
//! host's token, reporting the new build, as the restarted agent does. Logins are to the
//! account the test runs as (sshd needs a real account; a prepared host's is spark).

use crate::support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use support::ByoUp;

const ARCH: &str = std::env::consts::ARCH;

struct Sshd(Child);
impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn keygen(path: &Path) {
    assert!(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
            .arg(path)
            .status()
            .unwrap()
            .success()
    );
}

/// A simulated host: its sshd, whose only command is `script`.
fn host_sshd(dir: &Path, slug: &str, script: &Path, authorized: &Path) -> (Sshd, u16) {
    let host_key = dir.join(format!("{slug}-host-key"));
    keygen(&host_key);
    let port = free_port();
    let config = dir.join(format!("{slug}-sshd_config"));
    std::fs::write(
        &config,
        format!(
            "ListenAddress 127.0.0.1:{port}\nHostKey {hk}\nPidFile none\nAuthorizedKeysFile {ak}\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nStrictModes no\nForceCommand {script}\nLogLevel ERROR\n",
            hk = host_key.display(),
            ak = authorized.display(),
            script = script.display(),
        ),
    )
    .unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let mut child = Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-o", "LogLevel=INFO", "-f"])
        .arg(&config)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("Server listening") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .expect("sshd listens");
    (Sshd(child), port)
}

/// The host's stand-in for `byo-agent upgrade` (see the module's doc). The real verifier
/// runs on the real host container in `installer.rs` and `golden_path.rs`.
fn stand_in(dir: &Path, slug: &str, url: &str, token: &str, build: &str) -> PathBuf {
    let script = dir.join(format!("{slug}.sh"));
    let beat = serde_json::json!({
        "agent_version": format!("0.1.0 ({build})"), "lxd": "ok", "relay": "ok", "tunnel": "ok",
        "gpu": "ok", "storage": "ok", "instances": 0, "details": {}
    });
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
echo "$SSH_ORIGINAL_COMMAND" >> {dir}/{slug}.commands
if [ "$SSH_ORIGINAL_COMMAND" != "sudo /usr/local/bin/byo-agent upgrade --build {build}" ]; then
  echo "{slug}: not the host's verifier: $SSH_ORIGINAL_COMMAND" >&2
  exit 2
fi
curl -fsS {url}/agent/byo-agent-{arch} -o /dev/null || exit 6
if [ -e {dir}/{slug}.fail ]; then
  echo "This machine is already enrolled; reusing its credentials." >&2
  echo "byo-agent: the agent from {url} does not run on this machine (byo-agent --version: Exec format error); nothing was installed" >&2
  exit 1
fi
echo "Serving restarted on the new build."
curl -fsS -o /dev/null -X POST -H 'Authorization: Bearer {token}' -H 'Content-Type: application/json' \
  --data '{beat}' {url}/api/host/heartbeat
"#,
            dir = dir.display(),
            arch = ARCH,
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j9_byo_fleet_upgrade_goes_in_waves_over_ssh_halts_on_a_failure_and_resumes() {
    if !byo_core::testing::have_tools(&["sshd", "ssh", "ssh-keygen", "curl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = ByoUp::on_loopback(&data, dir.path());
    let url = up.url.clone();
    let store = byo_db::Store::connect(&format!("sqlite://{}", data.join("byo.db").display()))
        .await
        .unwrap();
    let admin = store.user_by_email(&up.email).await.unwrap().unwrap().sub;

    // A build, signed with the release key and published through the API (the upload of
    // `byo release publish`, tested in releases.rs).
    let mut bytes = std::fs::read("/bin/true").unwrap();
    bytes.extend_from_slice(b"\nfleet test build\n");
    let key = ssh_key::PrivateKey::from_openssh(
        std::fs::read_to_string(data.join("release-signing-key")).unwrap(),
    )
    .unwrap();
    let sig = byo_core::release::sign(&key, &bytes).unwrap();
    let client = reqwest::Client::builder()
        .cookie_store(true)
        .build()
        .unwrap();
    let login = client
        .post(format!("{url}/api/auth/login"))
        .json(&serde_json::json!({"email": up.email, "password": up.password}))
        .send()
        .await
        .unwrap();
    assert!(login.status().is_success());
    use base64::Engine;
    let published = client
        .post(format!(
            "{url}/api/admin/releases/{ARCH}?version=byo-agent%200.1.0"
        ))
        .header(
            byo_wire::fleet::SIGNATURE_HEADER,
            base64::engine::general_purpose::STANDARD.encode(&sig),
        )
        .body(bytes)
        .send()
        .await
        .unwrap();
    assert_eq!(
        published.status(),
        201,
        "{}",
        published.text().await.unwrap()
    );
    let build = published.json::<serde_json::Value>().await.unwrap()["build"]
        .as_str()
        .unwrap()
        .to_owned();

    // Four hosts: three reachable over ssh, one with an instance being created.
    let operator_key = dir.path().join("operator");
    keygen(&operator_key);
    let authorized = dir.path().join("authorized_keys");
    std::fs::copy(operator_key.with_extension("pub"), &authorized).unwrap();
    let now = chrono::Utc::now();
    let mut ssh_config = String::new();
    let mut sshds = Vec::new();
    let mut ids = Vec::new();
    for n in 1..=4 {
        let slug = format!("spark-{n}");
        let (id, token) = byo_db::testing::fleet_host(&store, &admin, &slug, ARCH, now).await;
        ids.push(id.clone());
        if n == 4 {
            store
                .create_vm(
                    byo_db::vms::NewVm {
                        user_sub: &admin,
                        host_id: Some(&id),
                        name: "box",
                        gpu_type: "spark-1",
                        ssh_hostname: None,
                    },
                    now,
                )
                .await
                .unwrap();
            continue;
        }
        let script = stand_in(dir.path(), &slug, &url, &token, &build);
        let (sshd, port) = host_sshd(dir.path(), &slug, &script, &authorized);
        sshds.push(sshd);
        ssh_config.push_str(&format!(
            "Host {slug}\n  HostName 127.0.0.1\n  Port {port}\n  User root\n  IdentityFile {key}\n  \
             StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            key = operator_key.display()
        ));
    }
    let config = dir.path().join("ssh_config");
    std::fs::write(&config, ssh_config).unwrap();
    // spark-2's install fails: the run halts there.
    std::fs::write(dir.path().join("spark-2.fail"), b"").unwrap();

    let fleet = |resume: bool| {
        let mut cmd = Command::new(support::sibling("byo"));
        cmd.args([
            "fleet", "upgrade", "--server", &url, "--email", &up.email, "--build", &build,
        ])
        .args(["--via", "ssh-config", "--ssh-config"])
        .arg(&config)
        .args(["--wait-secs", "30"])
        .env("BYO_PASSWORD", &up.password)
        .stdin(Stdio::null());
        if resume {
            cmd.arg("--resume");
        }
        let started = std::time::Instant::now();
        let out = cmd.output().unwrap();
        (out, started.elapsed())
    };
    let (out, halted_after) = fleet(false);
    let text = said(&out);
    println!("{text}");
    assert!(!out.status.success(), "the failure halts the run:\n{text}");
    assert!(text.contains("4 host(s), 2 wave(s)"), "{text}");
    assert!(
        text.contains("wave 0: upgrading spark-1\n"),
        "the canary first:\n{text}"
    );
    assert!(
        text.contains(&format!("spark-1: healthy on build {build}")),
        "{text}"
    );
    assert!(
        text.contains("wave 1: upgrading spark-2, spark-3"),
        "{text}"
    );
    assert!(
        text.contains("spark-4: skipped: an instance is being created"),
        "{text}"
    );
    assert!(
        text.contains("halted: spark-2: the upgrade exited 1: ")
            && text.contains("does not run on this machine")
            && text.contains("--resume"),
        "{text}"
    );
    let version = |id: &str| {
        let store = store.clone();
        let id = id.to_owned();
        async move { store.host_status(&id).await.unwrap().unwrap().agent_version }
    };
    assert_eq!(
        version(&ids[1]).await.as_deref(),
        Some("0.1.0"),
        "spark-2 kept its build"
    );
    assert_eq!(
        version(&ids[3]).await.as_deref(),
        Some("0.1.0"),
        "spark-4 was not touched"
    );
    assert!(!dir.path().join("spark-4.commands").exists());

    // Fixed; resumed: spark-2 is tried again, spark-1 is not touched again.
    std::fs::remove_file(dir.path().join("spark-2.fail")).unwrap();
    let (out, resumed_after) = fleet(true);
    let text = said(&out);
    println!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(text.contains("resumed"), "{text}");
    assert!(
        text.contains(&format!("spark-2: healthy on build {build}")),
        "{text}"
    );
    assert!(
        text.contains("done in") && text.contains("3 healthy"),
        "{text}"
    );
    for (n, id) in ids.iter().enumerate().take(3) {
        assert_eq!(
            version(id).await,
            Some(format!("0.1.0 ({build})")),
            "spark-{} reports the build",
            n + 1
        );
    }
    let commands = |slug: &str| {
        std::fs::read_to_string(dir.path().join(format!("{slug}.commands")))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(commands("spark-1"), 1, "the canary ran the upgrade once");
    assert_eq!(commands("spark-2"), 2, "the failed host twice");
    let run = store.fleet_runs(1).await.unwrap().remove(0);
    assert_eq!(run.state, byo_wire::states::FleetRunState::Closed);
    println!(
        "figure: byo fleet upgrade of 4 simulated hosts (3 over ssh, 1 skipped): halted after {:.2} s, resumed to done in {:.2} s",
        halted_after.as_secs_f64(),
        resumed_after.as_secs_f64()
    );
    store.close().await;
    drop(sshds);
}
