//! H.3–H.4 for real: a Debian host container onboarded through the real path (the owner runs
//! the one-liner with sudo against a real server; the real units prepare it, with
//! `hosts.lockout_owner` on, so owner-lockout takes the owner's login away), then handed
//! back with `install.sh --uninstall --keep-lxd`, cut short once and run again. Afterwards
//! the owner logs in with their password over ssh and administers the machine, and nothing
//! of byo's is left: no unit, no sudoers drop-in, no spark, no table, no /etc/enverge — and
//! LXD, kept, still answers.

use crate::host_container;
use crate::onboard;
use crate::support;

use std::process::Command;
use std::time::{Duration, Instant};

use byo_server::clock::Clock;
use byo_wire::Role;
use byo_wire::enroll::ProvisionRequest;
use host_container::HostContainer;
use onboard::{on_terminal, publish_operator_keys, serve, user};
use support::release;

const PASSWORD: &str = "correct horse battery";

/// How `byo-agent uninstall` prints a step's outcome.
fn step_line(step: &str, outcome: &str) -> String {
    format!("  {step:<16} {outcome}")
}

/// `sshpass -p … ssh owner@ip command`: a person typing their password.
fn owner_ssh(ip: &str, command: &str) -> Result<String, String> {
    let out = Command::new("sshpass")
        .args(["-p", PASSWORD, "ssh", "-F", "/dev/null"])
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "PreferredAuthentications=password,keyboard-interactive",
            "-o",
            "PubkeyAuthentication=no",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
        ])
        .arg(format!("owner@{ip}"))
        .arg(command)
        .output()
        .expect("sshpass runs (scripts/test installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(said)
    } else {
        Err(said)
    }
}

/// A host container onboarded through the real path and prepared by the real units, with
/// `hosts.lockout_owner` on; the server stays up while this is held.
struct Onboarded {
    host: HostContainer,
    ip: String,
    server: String,
    host_id: String,
    state: byo_server::AppState,
    t0: Instant,
    _db: byo_db::testing::TestDb,
    _work: tempfile::TempDir,
}

impl Onboarded {
    fn phase(&self, what: &str) {
        eprintln!("[{:>6.1} s] {what}", self.t0.elapsed().as_secs_f64());
    }
}

async fn onboarded(prefix: &str) -> Option<Onboarded> {
    if !byo_core::testing::have_tools(&["sshpass", "ssh"]) {
        return None;
    }
    let host = HostContainer::launch(prefix)?;
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let db = byo_db::testing::sqlite().await;
    let store = db.store.clone();
    let work = tempfile::tempdir().unwrap();
    let arch = host.sh_ok("uname -m").trim().to_owned();
    let clock = Clock::manual(chrono::Utc::now());
    let releases = release(&work.path().join("releases"), &[&arch]);
    let (server, state) = serve(&store, releases, None, &clock).await;
    let staff = user(&store, "staff@example.com", Role::Superadmin).await;
    publish_operator_keys(&state, &staff).await;
    let provisioned = byo_server::app::host_provision::provision(
        &state,
        &staff,
        &ProvisionRequest {
            profile_id: "linux-test".into(),
        },
    )
    .await
    .unwrap();
    let host_id = provisioned.host_id.clone();
    // This host locks its owner out (hosts.lockout_owner ships false, and nothing but an
    // operator's database write turns it on yet).
    store
        .execute_unchecked(&format!(
            "update hosts set lockout_owner = true where id = '{host_id}'"
        ))
        .await
        .unwrap();
    // wg-quick falls back to wireguard-go here, which needs the tun device.
    let tun = Command::new("lxc")
        .args(["config", "device", "add", host.name(), "tun", "unix-char"])
        .arg("path=/dev/net/tun")
        .output()
        .unwrap();
    assert!(tun.status.success(), "{tun:?}");
    let ip = host.ipv4().to_string();

    // The owner: a login with a password and sudo, who runs the one-liner with sudo.
    host.sh_ok(&format!(
        "useradd -m -s /bin/bash -G sudo owner && echo 'owner:{PASSWORD}' | chpasswd \
         && printf '#!/bin/sh\\necho \"{PASSWORD}\"\\n' > /usr/local/bin/owner-askpass \
         && chmod 755 /usr/local/bin/owner-askpass"
    ));
    let before = owner_ssh(&ip, &format!("echo '{PASSWORD}' | sudo -S -p '' id -u"));
    assert!(
        before.as_ref().is_ok_and(|s| s.trim() == "0"),
        "the owner logs in and administers before: {before:?}"
    );
    let line = format!(
        "curl -fsSL {server}/install.sh | SUDO_ASKPASS=/usr/local/bin/owner-askpass sudo -A bash -s -- --token '{}'",
        provisioned.token
    );
    let ran = on_terminal(&host, &line, Some("owner"));
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    assert_eq!(
        host.read("/etc/enverge/owner").as_deref(),
        Some(&b"owner\n"[..]),
        "install.sh records who ran it with sudo"
    );
    phase("the owner ran the one-liner");
    let journal =
        || host.sh_ok("journalctl -u enverge-agent-prepare -u enverge-agent --no-pager -o cat");
    let started = Instant::now();
    loop {
        let h = store.host(&host_id).await.unwrap().unwrap();
        if h.prepared_at.is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(400),
            "preparation did not complete ({:?}):\n{}",
            h.prepare_state,
            journal()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    phase("prepared");
    Some(Onboarded {
        host,
        ip,
        server,
        host_id,
        state,
        t0,
        _db: db,
        _work: work,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_uninstall_restores_the_owner_first_and_leaves_nothing_of_ours() {
    let Some(o) = onboarded("byo-uninstall").await else {
        return;
    };
    let (host, ip, server) = (&o.host, o.ip.as_str(), o.server.as_str());
    let phase = |what: &str| o.phase(what);
    // owner-lockout took the owner's login and sudo away.
    assert!(
        owner_ssh(ip, "true").is_err(),
        "the owner still gets in after owner-lockout"
    );
    let facts = host.sh_ok(
        "cat /etc/enverge/owner-groups; nft list tables; ls /etc/sudoers.d; systemctl list-unit-files 'enverge*' --no-legend; id spark",
    );
    // What preparation changed that was the owner's, recorded as it changed it (issue #39, 4):
    // the image's ufw forwarded nothing and its Docker ran.
    let recorded = host.sh_ok(
        "cat /etc/enverge/ufw-forward-policy /etc/enverge/docker-removed; grep ^DEFAULT_FORWARD_POLICY= /etc/default/ufw",
    );
    assert!(
        recorded.starts_with("DROP\n")
            && recorded.contains("docker.io\n")
            && recorded.ends_with("DEFAULT_FORWARD_POLICY=\"ACCEPT\"\n"),
        "{recorded}"
    );
    for want in [
        "sudo",
        "enverge_tenants",
        "enverge-spark",
        "enverge-agent.service",
        "enverge-tenant-firewall.service",
        "uid=",
    ] {
        assert!(
            facts.contains(want),
            "{want:?} missing from the prepared host:\n{facts}"
        );
    }

    // Cut short: killed once the agent's units are gone.
    let cut = host.sh_ok(
        "/usr/local/bin/byo-agent uninstall --yes --keep-lxd > /tmp/uninstall.log 2>&1 & pid=$!
         for _ in $(seq 1 2400); do grep -q '^  agent-units *removed' /tmp/uninstall.log && break; sleep 0.05; done
         kill -9 $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; cat /tmp/uninstall.log",
    );
    phase("uninstall cut short");
    eprintln!("--- the run cut short:\n{cut}");
    assert!(
        cut.contains(&step_line("owner-restore", "restored and verified"))
            && cut.contains(&step_line("agent-units", "removed"))
            && !cut.contains("uninstalled in"),
        "{cut}"
    );
    // The owner was given back before anything was removed, and is in already.
    assert!(
        owner_ssh(ip, "true").is_ok(),
        "the owner is not back after owner-restore"
    );

    // Run again, as the owner now can: it finishes.
    let line = "curl -fsSL SERVER/install.sh | SUDO_ASKPASS=/usr/local/bin/owner-askpass sudo -A bash -s -- --uninstall --keep-lxd"
        .replace("SERVER", server);
    let ran = on_terminal(host, &line, Some("owner"));
    phase("uninstall run again");
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    for says in [
        step_line("owner-restore", "nothing to do"),
        step_line("agent-units", "nothing to do"),
        step_line("lxd", "skipped: --keep-lxd"),
        step_line("agent-files", "removed"),
        "uninstalled in".to_owned(),
        "the server was told".to_owned(),
        // Docker is offered back, not put back unasked.
        step_line("docker", "skipped: preparation removed Docker (docker.io"),
        "sudo apt-get install docker.io".to_owned(),
    ] {
        assert!(ran.terminal.contains(&says), "{says:?}:\n{}", ran.terminal);
    }
    // ufw forwards as it did before preparation, in its file and, reloaded, in the kernel.
    let ufw = host
        .sh_ok("grep ^DEFAULT_FORWARD_POLICY= /etc/default/ufw; iptables -S FORWARD | head -n 1");
    assert_eq!(ufw, "DEFAULT_FORWARD_POLICY=\"DROP\"\n-P FORWARD DROP\n");
    // Leaving gives everything back (issue #39, 3): the server heard it from the host and
    // retires it at the job's next run, without waiting for a silent day.
    let store = &o.state.store;
    let h = store.host(&o.host_id).await.unwrap().unwrap();
    assert!(!h.active, "the uninstalled host is out of placement");
    let r = byo_server::app::retire_stopped::retire_stopped_once(&o.state)
        .await
        .unwrap();
    assert_eq!((r.retired, r.refused, r.failed), (1, 0, 0), "{r}");
    let life = store.host_lifecycle(&o.host_id).await.unwrap().unwrap();
    assert!(life.retired_at.is_some(), "retired on its own");
    phase("the server retired the host");

    // The owner logs in with their password and administers the machine.
    let admin = owner_ssh(ip, &format!("echo '{PASSWORD}' | sudo -S -p '' id -u"));
    assert!(
        admin.as_ref().is_ok_and(|s| s.trim() == "0"),
        "the owner's login after uninstall: {admin:?}"
    );
    // Nothing of ours is left.
    let left = host.sh_ok(
        "systemctl list-units 'enverge*' --all --no-legend; systemctl list-unit-files 'enverge*' --no-legend
         ls /etc/systemd/system | grep -i enverge || true
         ls /etc/sudoers.d | grep -v README || true
         id spark 2>&1 || true; ls /home
         nft list tables
         for p in /etc/enverge /var/lib/enverge-agent /usr/local/bin/byo-agent /usr/local/bin/byo-agent.previous \
                  /etc/wireguard/wg0.conf /etc/ssh/sshd_config.d/00-enverge-lockout.conf /home/spark; do
           if [ -e \"$p\" ]; then echo \"left: $p\"; fi; done
         ip link show wg0 2>&1 || true",
    );
    eprintln!("--- what the host holds after uninstall:\n{left}");
    for gone in ["enverge", "left: ", "uid=", "/home/spark", "wg0:"] {
        assert!(!left.contains(gone), "{gone:?} is still there:\n{left}");
    }
    assert!(left.contains("no such user"), "{left}");
    // --keep-lxd: LXD answers, without our profile or instances.
    let lxd = host.sh_ok("lxc query /1.0/profiles; lxc list --format csv -c n");
    assert!(
        lxd.contains("/1.0/profiles/default") && !lxd.contains("lofispark-base"),
        "{lxd}"
    );

    // A third time: nothing of ours, said, exit 0.
    let line = format!("curl -fsSL {server}/install.sh | bash -s -- --uninstall");
    let ran = on_terminal(host, &line, None);
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    assert!(
        ran.terminal
            .contains("Nothing of byo's is installed on this machine: nothing to uninstall."),
        "{}",
        ran.terminal
    );
    phase("done");
}

/// Without `--keep-lxd`, the LXD preparation installed goes too (its images, pool and bridge
/// first, then Debian's package), and the owner is restored first as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h3_uninstall_without_keep_lxd_removes_the_lxd_preparation_installed() {
    let Some(o) = onboarded("byo-uninstall-lxd").await else {
        return;
    };
    let (host, ip, server) = (&o.host, o.ip.as_str(), o.server.as_str());
    // The owner is locked out, so the machine's console (root) runs it.
    let line = format!("curl -fsSL {server}/install.sh | bash -s -- --uninstall");
    let ran = on_terminal(host, &line, None);
    o.phase("uninstalled");
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    for says in [
        step_line("owner-restore", "restored and verified"),
        step_line("lxd", "removed"),
        step_line("agent-files", "removed"),
    ] {
        assert!(ran.terminal.contains(&says), "{says:?}:\n{}", ran.terminal);
    }
    let admin = owner_ssh(ip, &format!("echo '{PASSWORD}' | sudo -S -p '' id -u"));
    assert!(
        admin.as_ref().is_ok_and(|s| s.trim() == "0"),
        "the owner's login after uninstall: {admin:?}"
    );
    let left = host.sh_ok(
        "dpkg-query -W -f='${Status}\\n' lxd 2>&1 || true; ls /var/lib/lxd 2>&1 || true
         systemctl list-unit-files 'enverge*' --no-legend; nft list tables
         if [ -e /etc/enverge ]; then echo left-etc-enverge; fi",
    );
    eprintln!("--- after uninstall:\n{left}");
    assert!(!left.contains("install ok installed"), "{left}");
    assert!(
        left.contains("cannot access '/var/lib/lxd'")
            && !left.contains("enverge")
            && !left.contains("table inet lxd"),
        "{left}"
    );
}
