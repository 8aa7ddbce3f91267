//! A real Debian bookworm host for the agent's prepare steps: an unprivileged system container
//! in this machine's LXD, booted with systemd, reachable over its bridge, where the agent runs
//! as root. `scripts/lxd` (run by `scripts/test` as root) sets up the daemon, the pool, the
//! bridge, the `byo-test-host` profile and the `byo-debian-host` image; the image has what an
//! owner's host already has (sshd, sudo, docker running, ufw enabled with ssh allowed,
//! nftables), but not what the agent installs (lxd, earlyoom, wireguard).
//!
//! A create costs several seconds on the `dir` pool: one container per test binary, not per
//! test. Without LXD or the image, [`HostContainer::launch`] says so loudly and returns `None`
//! (the test skips); under `CI=true` it panics instead.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

pub const IMAGE: &str = "byo-debian-host";
pub const PROFILE: &str = "byo-test-host";
/// How long a boot (or a restart) may take before the harness gives up.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
/// Nested LXD inside the container needs its root's ids within the container's own range
/// (0..=10000000 here). Installing Debian's lxd adds `root:100000:10000001` to an empty file
/// (nested creates then fail: "LXD doesn't have a uid/gid allocation"), or appends a range
/// past the existing ones; the daemon takes the first `root` line, so these must come first.
const SUBIDS: &str = "root:1000000:9000000\n_lxd:1000000:9000000\n";

#[derive(Debug)]
pub struct HostContainer {
    name: String,
}

impl HostContainer {
    /// Creates and boots a new host container; returns once systemd has finished booting
    /// (running or degraded: the failed units are printed) and eth0 has an IPv4 address.
    pub fn launch(prefix: &str) -> Option<HostContainer> {
        if let Err(why) = lxd_ready() {
            let msg = format!(
                "no LXD test host: {why}. Run `sudo ./scripts/lxd` (scripts/test does it as root)"
            );
            byo_core::testing::skip("LXD test host", &msg);
            return None;
        }
        let began = Instant::now();
        let host = HostContainer {
            name: unique_name(prefix),
        };
        let pid = format!("user.byo.test-pid={}", std::process::id());
        lxc(&[
            "init",
            IMAGE,
            &host.name,
            "--profile",
            PROFILE,
            "-c",
            "security.nesting=true",
            // This machine mounts cpu and cpuacct (cgroup v1) apart, which breaks nested LXC.
            "-c",
            "raw.lxc=lxc.mount.auto = cgroup:rw:force",
            // scripts/lxd deletes containers whose test process is gone.
            "-c",
            &pid,
        ]);
        // Pushed before the first boot, so they are in place before anything reads them
        // (later works too, but then the nested daemon must be restarted).
        host.write("/etc/subuid", SUBIDS.as_bytes(), 0o644);
        host.write("/etc/subgid", SUBIDS.as_bytes(), 0o644);
        let created = Instant::now();
        lxc(&["start", &host.name]);
        host.wait_booted();
        eprintln!(
            "{}: created in {:.1} s, booted in {:.1} s",
            host.name,
            (created - began).as_secs_f64(),
            created.elapsed().as_secs_f64()
        );
        Some(host)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `argv` as root inside (no terminal, stdin empty).
    pub fn exec(&self, argv: &[&str]) -> Output {
        let mut cmd = Command::new("lxc");
        cmd.args(["exec", &self.name, "--mode=non-interactive", "--"])
            .args(argv)
            .stdin(Stdio::null());
        cmd.output().expect("run lxc exec")
    }

    /// Runs a bash script as root inside.
    pub fn sh(&self, script: &str) -> Output {
        self.exec(&["bash", "-c", script])
    }

    /// Runs a bash script as root inside; panics with its output unless it succeeds. Returns
    /// its stdout.
    pub fn sh_ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(
            out.status.success(),
            "in {}: `{script}` failed ({}):\n{}",
            self.name,
            out.status,
            show(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Copies a local file to `remote` (absolute; parent directories are created), owned by
    /// root with `mode`.
    pub fn push(&self, local: &Path, remote: &str, mode: u32) {
        assert!(
            remote.starts_with('/'),
            "remote path must be absolute: {remote}"
        );
        let local = local.to_str().expect("local path is UTF-8");
        lxc(&[
            "file",
            "push",
            "--create-dirs",
            "--uid",
            "0",
            "--gid",
            "0",
            "--mode",
            &format!("{mode:04o}"),
            local,
            &format!("{}{remote}", self.name),
        ]);
    }

    /// Writes `contents` to `remote` (absolute; parent directories are created), owned by
    /// root with `mode`.
    pub fn write(&self, remote: &str, contents: &[u8], mode: u32) {
        let mut file = tempfile::NamedTempFile::new().expect("temp file");
        std::io::Write::write_all(&mut file, contents).expect("write temp file");
        self.push(file.path(), remote, mode);
    }

    /// The contents of `remote`, or None when it does not exist (or cannot be read).
    pub fn read(&self, remote: &str) -> Option<Vec<u8>> {
        let out = lxc_output(&["file", "pull", &format!("{}{remote}", self.name), "-"]);
        out.status.success().then_some(out.stdout)
    }

    /// Reboots the container cleanly (forced after a minute) and waits as after a launch.
    pub fn restart(&self) {
        let clean = Command::new("lxc")
            .args(["restart", &self.name, "--timeout", "60"])
            .stdin(Stdio::null())
            .output()
            .expect("run lxc restart");
        if !clean.status.success() {
            eprintln!(
                "{}: clean restart failed, forcing:\n{}",
                self.name,
                show(&clean)
            );
            lxc(&["restart", "--force", &self.name]);
        }
        self.wait_booted();
    }

    /// `systemctl is-system-running`, once booted: "running", "degraded", ...
    pub fn system_state(&self) -> String {
        let out = self.exec(&["systemctl", "is-system-running"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The units systemd reports failed, one per line.
    pub fn failed_units(&self) -> String {
        let out = self.exec(&["systemctl", "--failed", "--plain", "--no-legend"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// eth0's IPv4 address (reachable from this machine through the test bridge). Asked for
    /// up to half a minute: a lease renewed under load leaves eth0 bare for a moment (seen
    /// once in a full run, right after the boot had found the address).
    pub fn ipv4(&self) -> Ipv4Addr {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(ip) = self.try_ipv4() {
                return ip;
            }
            if Instant::now() > deadline {
                let net = self.sh("ip addr; networkctl status eth0 --no-pager");
                panic!("{} has no IPv4 address on eth0:\n{}", self.name, show(&net));
            }
            sleep(Duration::from_millis(200));
        }
    }

    fn try_ipv4(&self) -> Option<Ipv4Addr> {
        let out = self.exec(&[
            "ip", "-4", "-o", "addr", "show", "dev", "eth0", "scope", "global",
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        let mut words = text.split_whitespace();
        words.find(|w| *w == "inet")?;
        words.next()?.split('/').next()?.parse().ok()
    }

    fn wait_booted(&self) {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        // Right after a start PID 1 may not answer yet; `--wait` then blocks until the boot
        // is over.
        let state = loop {
            let out = self.exec(&["timeout", "120", "systemctl", "is-system-running", "--wait"]);
            let state = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if state == "running" || state == "degraded" {
                break state;
            }
            if Instant::now() > deadline {
                panic!(
                    "{}: systemd did not finish booting within {BOOT_TIMEOUT:?} (state {state:?}):\n{}",
                    self.name,
                    show(&out)
                );
            }
            sleep(Duration::from_millis(200));
        };
        if state == "degraded" {
            eprintln!(
                "{}: systemd booted DEGRADED; failed units:\n{}",
                self.name,
                self.failed_units()
            );
        }
        while self.try_ipv4().is_none() {
            if Instant::now() > deadline {
                let net = self.sh("ip addr; networkctl status eth0 --no-pager");
                panic!(
                    "{}: eth0 got no IPv4 address within {BOOT_TIMEOUT:?}:\n{}",
                    self.name,
                    show(&net)
                );
            }
            sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for HostContainer {
    fn drop(&mut self) {
        let _ = Command::new("lxc")
            .args(["delete", "--force", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Whether the daemon answers and the image and profile exist, or what is missing.
pub fn lxd_ready() -> Result<(), String> {
    let query = |path: &str| -> Result<(), String> {
        let out = Command::new("lxc")
            .args(["query", path])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run `lxc` ({e}): LXD is not installed"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`lxc query {path}` failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    query("/1.0")?;
    query(&format!("/1.0/images/aliases/{IMAGE}"))
        .map_err(|e| format!("the image {IMAGE} is missing ({e})"))?;
    query(&format!("/1.0/profiles/{PROFILE}"))
        .map_err(|e| format!("the profile {PROFILE} is missing ({e})"))?;
    Ok(())
}

/// `prefix-PID-N`, made a valid container (host) name.
fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let mut clean: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    if !clean.starts_with(|c: char| c.is_ascii_lowercase()) {
        clean.insert(0, 'h');
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{}-{}-{n}", clean.trim_end_matches('-'), std::process::id())
}

/// `lxc args…`'s output; a file call that meets LXD's forkfile race is made again, as the
/// agent's own pushes are (`byo_agent::lxd::forkfile_raced`).
fn lxc_output(args: &[&str]) -> Output {
    let run = || {
        Command::new("lxc")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run lxc")
    };
    let mut out = run();
    for _ in 1..byo_agent::lxd::FILE_CALL_TRIES {
        if out.status.success() || !byo_agent::lxd::forkfile_raced(&show(&out)) {
            break;
        }
        out = run();
    }
    out
}

fn lxc(args: &[&str]) {
    let out = lxc_output(args);
    assert!(
        out.status.success(),
        "`lxc {}` failed ({}):\n{}",
        args.join(" "),
        out.status,
        show(&out)
    );
}

fn show(out: &Output) -> String {
    format!(
        "--- stdout\n{}--- stderr\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The test bridge's own address: where a host container reaches this machine (a server,
/// a fake ssh_mapd) and the relays' veths route from.
pub fn bridge_gateway() -> String {
    let out = Command::new("lxc")
        .args(["network", "get", "byotestbr0", "ipv4.address"])
        .output()
        .expect("run lxc network get");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .split('/')
        .next()
        .filter(|a| !a.is_empty())
        .unwrap_or("10.231.0.1")
        .to_owned()
}
