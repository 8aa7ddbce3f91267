//! Real kernel parts for tests: network namespaces, veth links, WireGuard (wireguard-go),
//! sshd. Each namespace kills every process in it and deletes itself when dropped.

#![allow(dead_code)] // each test binary uses a different part

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether this machine can run the kernel tests (root, ip netns, nft, wireguard-go, sshd).
/// Outside CI a missing part skips loudly; under CI it fails.
pub fn kernel_parts(needs: &[&str]) -> bool {
    let root = unsafe_free_euid_is_root();
    let missing: Vec<&str> = needs
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect();
    if root && missing.is_empty() {
        return true;
    }
    let why = if root {
        format!("missing {}", missing.join(", "))
    } else {
        "not running as root".to_owned()
    };
    byo_core::testing::skip("kernel parts", &why);
    false
}

fn unsafe_free_euid_is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct Netns {
    pub name: String,
    children: std::sync::Mutex<Vec<std::process::Child>>,
}

impl Netns {
    pub fn new(role: &str) -> Netns {
        let name = format!(
            "byo{}-{}-{}",
            std::process::id() % 100_000,
            NEXT.fetch_add(1, Ordering::SeqCst),
            role
        );
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Netns {
            name,
            children: Default::default(),
        };
        ns.sh("ip link set lo up");
        ns
    }

    /// A command run inside this namespace.
    pub fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }

    pub fn sh(&self, script: &str) -> Output {
        run(self.cmd("sh").args(["-c", script]))
    }

    pub fn try_sh(&self, script: &str) -> Output {
        self.cmd("sh").args(["-c", script]).output().unwrap()
    }

    /// A long-running process in this namespace, killed and reaped with the namespace.
    /// Returns its pid.
    pub fn spawn(&self, script: &str) -> u32 {
        let child = self
            .cmd("sh")
            .args(["-c", script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        self.children.lock().unwrap().push(child);
        pid
    }

    /// Kill every process in the namespace (wireguard-go, sshd, daemons).
    pub fn kill_all(&self) {
        let out = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .unwrap();
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).output();
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.kill_all();
        for mut child in self.children.lock().unwrap().drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Link two namespaces with a veth pair and addresses.
pub fn link(a: &Netns, a_addr: &str, b: &Netns, b_addr: &str) {
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let (ia, ib) = (format!("va{n}"), format!("vb{n}"));
    run(Command::new("ip").args(["link", "add", &ia, "type", "veth", "peer", "name", &ib]));
    run(Command::new("ip").args(["link", "set", &ia, "netns", &a.name]));
    run(Command::new("ip").args(["link", "set", &ib, "netns", &b.name]));
    a.sh(&format!(
        "ip addr add {a_addr} dev {ia} && ip link set {ia} up"
    ));
    b.sh(&format!(
        "ip addr add {b_addr} dev {ib} && ip link set {ib} up"
    ));
}

pub fn wg_keypair() -> (String, String) {
    let private = String::from_utf8(run(Command::new("wg").arg("genkey")).stdout)
        .unwrap()
        .trim()
        .to_owned();
    let mut child = Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(private.as_bytes())
        .unwrap();
    let public = String::from_utf8(child.wait_with_output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_owned();
    (private, public)
}

/// A WireGuard interface name unique on this machine: wireguard-go keeps its control
/// socket in /run/wireguard/<name>.sock, which every namespace shares.
pub fn wg_name() -> String {
    format!(
        "wg{}x{}",
        std::process::id() % 10_000,
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// Bring up `ifname` in `ns` with wireguard-go, configured from `wg setconf`-format text,
/// with `address` on it.
pub fn wireguard(ns: &Netns, dir: &std::path::Path, ifname: &str, setconf: &str, address: &str) {
    let conf = dir.join(format!("{ifname}.conf"));
    std::fs::write(&conf, setconf).unwrap();
    ns.sh(&format!(
        "wireguard-go {ifname} && wg setconf {ifname} {conf} && ip addr add {address} dev {ifname} && ip link set {ifname} up",
        conf = conf.display()
    ));
}

/// An sshd on `listen` that answers every login with `who`, so a test can tell which
/// machine it reached.
pub fn sshd(
    ns: &Netns,
    dir: &std::path::Path,
    listen: &str,
    who: &str,
    authorized_keys: &std::path::Path,
) {
    let host_key = dir.join(format!("{who}-host-key"));
    if !host_key.exists() {
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&host_key));
    }
    let cfg = dir.join(format!("{who}-sshd.conf"));
    std::fs::write(
        &cfg,
        format!(
            "ListenAddress {listen}\nHostKey {hk}\nPidFile none\nAuthorizedKeysFile {ak}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nForceCommand echo {who}\n",
            hk = host_key.display(),
            ak = authorized_keys.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    // Its log in `<who>-sshd.log`, the lines the journal holds on a host.
    ns.spawn(&format!(
        "exec /usr/sbin/sshd -D -E {} -f {}",
        dir.join(format!("{who}-sshd.log")).display(),
        cfg.display()
    ));
}

/// `ssh` from `ns` to `target`; what the far end printed, or None if it got nowhere.
pub fn ssh(ns: &Netns, key: &std::path::Path, target: &str, port: u16) -> Option<String> {
    let out = ns
        .cmd("ssh")
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
            "ConnectTimeout=2",
            "-o",
            "LogLevel=ERROR",
            "-p",
            &port.to_string(),
            &format!("root@{target}"),
        ])
        .output()
        .unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Wait until `probe` holds, or panic with `what`.
pub fn eventually(what: &str, mut probe: impl FnMut() -> bool) {
    for _ in 0..100 {
        if probe() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}
