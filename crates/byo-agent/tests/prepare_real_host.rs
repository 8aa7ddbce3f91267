//! C for real: the agent binary prepares a Debian system container in a real LXD daemon —
//! every step that can run there, with the profile's alternatives where it cannot (no zfs,
//! no snap, no hardware watchdog, no kernel WireGuard) — then a second run changes
//! nothing, and a restart of the machine leaves it prepared.

mod support;

use std::path::Path;
use std::process::Command;

use byo_core::keylist::OperatorKey;
use byo_core::keylist_testing::{envelope, list, private_key};
use serde_json::json;
use ssh_key::LineEnding;
use support::host_container::HostContainer;

const ENVIRONMENT: &str = "test";

fn public_line(key: &ssh_key::PrivateKey) -> String {
    let mut p = key.public_key().clone();
    p.set_comment("");
    p.to_openssh().unwrap()
}

fn ssh(ip: &str, user: &str, key: &Path, command: &str) -> std::process::Output {
    Command::new("ssh")
        .args([
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

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What enrolment keeps on a machine of the staff-only test profile.
fn credentials(wg_private: &str, relay_public: &str) -> serde_json::Value {
    json!({
        "host_id": "h-real", "slug": "real-test", "environment": ENVIRONMENT,
        "host_token": byo_core::tokens::SecretToken::generate(byo_core::tokens::TokenKind::Host).expose(),
        "agent_token": byo_core::tokens::SecretToken::generate(byo_core::tokens::TokenKind::Agent).expose(),
        "wireguard": {"private_key": wg_private, "address": "10.8.0.2/24", "peer_public_key": relay_public,
                      "endpoint": "10.231.0.1:51820", "allowed_ips": "10.8.0.1/32"},
        "relay_name": "real-test-relay", "ssh_map_endpoint": "10.8.0.1:8754",
        "ssh_map_token": byo_core::tokens::SecretToken::generate(byo_core::tokens::TokenKind::SshMap).expose(),
        "tunnel_hostname": null, "tunnel_connector_token": null, "operator_keys": null,
        "signing_keys": [], "profile_id": "linux-test",
        "constants": {"gpu_model": null, "gpu_count": null, "gpu_mem_mib": null, "arch": null,
                      "cuda_repo_arch": "x86_64", "node_count": 1, "rails": [],
                      "prepare": {"lxd": "apt", "storage_driver": "dir", "pool_size": "20GiB",
                                  "zfs_arc_max": 1073741824, "base_image": "minimal"}},
        "lockout_owner": true
    })
}

fn wg_keypair() -> (String, String) {
    let private = Command::new("wg").arg("genkey").output().unwrap();
    assert!(private.status.success(), "wg genkey");
    let private = String::from_utf8(private.stdout).unwrap().trim().to_owned();
    let mut child = Command::new("wg")
        .arg("pubkey")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(private.as_bytes())
        .unwrap();
    let public = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    (private, public.trim().to_owned())
}

fn prepare(host: &HostContainer, args: &[&str]) -> (bool, String) {
    let mut argv = vec!["/usr/local/bin/byo-agent", "prepare"];
    argv.extend_from_slice(args);
    let started = std::time::Instant::now();
    let out = host.exec(&argv);
    let said = text(&out);
    eprintln!(
        "--- byo-agent prepare {} ({:.1} s)\n{said}",
        args.join(" "),
        started.elapsed().as_secs_f64()
    );
    (out.status.success(), said)
}

#[test]
fn c_the_real_agent_prepares_a_debian_host_and_a_second_run_changes_nothing() {
    let Some(host) = HostContainer::launch("byo-prep") else {
        return;
    };
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
    let owner_key = private_key();
    let owner_file = dir.path().join("owner");
    std::fs::write(
        &owner_file,
        owner_key.to_openssh(LineEnding::LF).unwrap().as_bytes(),
    )
    .unwrap();
    std::fs::set_permissions(
        &owner_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    host.sh_ok("id owner >/dev/null 2>&1 || useradd -m -s /bin/bash -G sudo owner; install -d -m 700 -o owner -g owner /home/owner/.ssh");
    host.write(
        "/home/owner/.ssh/authorized_keys",
        format!("{}\n", public_line(&owner_key)).as_bytes(),
        0o600,
    );
    host.sh_ok("chown owner:owner /home/owner/.ssh/authorized_keys; install -d -m 700 /etc/enverge /var/lib/enverge-agent");
    host.write("/etc/enverge/owner", b"owner\n", 0o644);
    let before = ssh(&ip, "owner", &owner_file, "true");
    assert!(
        before.status.success(),
        "the owner's login works before: {}",
        text(&before)
    );

    // What enrolment keeps: the credentials, the pinned signing key, the signed list.
    let signing = private_key();
    let operator = private_key();
    let operator_file = dir.path().join("operator");
    std::fs::write(
        &operator_file,
        operator.to_openssh(LineEnding::LF).unwrap().as_bytes(),
    )
    .unwrap();
    std::fs::set_permissions(
        &operator_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
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
    let (_, relay_public) = wg_keypair();
    host.write(
        "/etc/enverge/credentials.json",
        credentials(&wg_private, &relay_public)
            .to_string()
            .as_bytes(),
        0o600,
    );
    host.write(
        "/etc/enverge/signing-keys",
        format!("{}\n", public_line(&signing)).as_bytes(),
        0o644,
    );
    host.write(
        "/var/lib/enverge-agent/operator-keys.signed",
        &envelope(&keys, &[&signing]),
        0o644,
    );
    host.push(
        Path::new(env!("CARGO_BIN_EXE_byo-agent")),
        "/usr/local/bin/byo-agent",
        0o755,
    );

    // The run: every step, in order.
    let (ok, said) = prepare(&host, &[]);
    if !ok && std::env::var("BYO_DEBUG_KEEP").is_ok() {
        eprintln!("kept {name} for debugging");
        std::mem::forget(host);
        panic!("preparation failed");
    }
    assert!(ok, "preparation failed:\n{said}");
    for step in byo_agent::prepare::STEP_NAMES {
        assert!(said.contains(step), "{step} was not reported:\n{said}");
    }
    assert!(
        said.contains("this profile's alternative"),
        "the alternatives are said in the report"
    );
    assert!(said.contains("watchdog") && said.contains("/dev/watchdog is absent"));

    // operator-access: an operator logs in as spark from outside, with sudo.
    let op = ssh(&ip, "spark", &operator_file, "sudo -n id -u");
    assert!(op.status.success(), "{}", text(&op));
    assert_eq!(String::from_utf8_lossy(&op.stdout).trim(), "0");
    // owner-lockout: the owner's login is refused now.
    let owner = ssh(&ip, "owner", &owner_file, "true");
    assert!(!owner.status.success(), "the owner still gets in");
    // The rest, as the host holds it.
    let facts = host.sh_ok(
        "dpkg-query -W -f='${Status}' docker.io 2>/dev/null | grep -q 'install ok' && echo docker-present || echo docker-gone
         systemctl is-active earlyoom
         cat /etc/modprobe.d/enverge-zfs.conf
         grep '^DEFAULT_FORWARD_POLICY' /etc/default/ufw
         lxc storage show default | grep '^driver:'
         lxc network get lxdbr0 ipv4.nat
         lxc profile show lofispark-base | grep -c 'network: lxdbr0'
         lxc image alias list --format csv | cut -d, -f1
         wg show wg0 peers
         id -nG spark
         stat -c '%U %a' /etc/enverge/serving.json",
    );
    for want in [
        "docker-gone",
        "\nactive\n",
        "options zfs zfs_arc_max=1073741824",
        "DEFAULT_FORWARD_POLICY=\"ACCEPT\"",
        "driver: dir",
        "\ntrue\n",
        "lofispark-base",
        relay_public.as_str(),
        "lxd",
        "spark 600",
    ] {
        assert!(
            facts.contains(want),
            "{want:?} missing from what the host holds:\n{facts}"
        );
    }

    // A second start finds the record and exits at once.
    let (ok, said) = prepare(&host, &[]);
    assert!(
        ok && said.contains("preparation completed earlier"),
        "{said}"
    );
    // A newer binary re-checks every step: nothing applies (also the check-only benchmark).
    host.sh_ok("rm -f /etc/enverge/serving.json /var/lib/enverge-agent/prepare-done.json");
    let (ok, said) = prepare(&host, &[]);
    assert!(ok, "{said}");
    assert!(
        !said.contains("Applying"),
        "a prepared host was changed:\n{said}"
    );

    // A restart: the machine comes back prepared, and preparation does not run again.
    host.restart();
    let (ok, said) = prepare(&host, &[]);
    assert!(
        ok && said.contains("preparation completed earlier"),
        "{said}"
    );
    host.sh_ok("rm -f /var/lib/enverge-agent/prepare-done.json");
    let (ok, said) = prepare(&host, &["--dry-run"]);
    assert!(
        ok && said.contains("nothing would change"),
        "after a restart:\n{said}"
    );
    let owner = ssh(&ip, "owner", &owner_file, "true");
    assert!(!owner.status.success(), "the owner gets in after a restart");
    let op = ssh(&ip, "spark", &operator_file, "sudo -n true");
    assert!(op.status.success(), "{}", text(&op));
}
