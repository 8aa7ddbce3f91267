//! A simulated DGX Spark: the same `Host` adapter the agent prepares a real machine
//! through, answering the commands, files and LXD REST calls the steps make with the
//! shapes the real ones have, and modelling the state those steps touch — including every
//! failure mode the design's landmines describe:
//!
//! - Docker sets the iptables FORWARD policy to DROP, which breaks lxdbr0's NAT and the
//!   image build's egress; purging Docker leaves the policy and docker0 behind.
//! - zfs reads modprobe.d when it loads (installing LXD loads it); a file written later
//!   changes nothing until a reboot.
//! - Swap left on disarms earlyoom (its check names it).
//! - A pool created without the bridge: LXD refuses lofispark-base's NIC.
//! - A default-deny ufw drops the bridge's DHCP and DNS and forwarded traffic; its
//!   FORWARD policy comes back from /etc/default/ufw at every reload.
//! - A dir pool is slow (recorded per create); an image without its alias fails creates.
//! - A 10.8.0.0/24 LAN: wg0 coming up takes the host off the network.
//! - nftables tables live in the kernel: a reboot empties them, and only an enabled unit
//!   that loads one brings it back; a `ufw reload` touches none but ufw's.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use byo_agent::host::{Fallible, Host, LxdBody, LxdReply, Output};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub home: String,
    pub groups: BTreeSet<String>,
    pub locked: bool,
}

/// An instance: its status, the image it came from, the files pushed into it.
pub type Instance = (String, String, BTreeMap<String, Vec<u8>>);

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lxd {
    pub pools: BTreeMap<String, String>,
    pub networks: BTreeMap<String, Value>,
    pub profiles: BTreeMap<String, Value>,
    /// fingerprint -> properties
    pub images: BTreeMap<String, Value>,
    pub aliases: BTreeMap<String, String>,
    /// name -> (status, source fingerprint, pushed files)
    pub instances: BTreeMap<String, Instance>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct State {
    pub files: BTreeMap<String, Vec<u8>>,
    pub packages: BTreeSet<String>,
    pub users: BTreeMap<String, User>,
    pub enabled: BTreeSet<String>,
    pub active: BTreeSet<String>,
    pub swap: Vec<String>,
    pub forward_policy: String,
    pub links: BTreeSet<String>,
    /// (interface, address/prefix)
    pub addresses: Vec<(String, String)>,
    pub ufw_active: bool,
    pub ufw_rules: Vec<String>,
    /// zfs_arc_max as loaded, once zfs is.
    pub zfs_loaded: Option<u64>,
    pub kernel_wireguard: bool,
    pub watchdog: bool,
    pub gpu: Option<String>,
    pub lxd: Option<Lxd>,
    /// wg0's peer, once up.
    pub wg_peer: Option<String>,
    /// The host fell off its network (wg0 over a colliding LAN).
    pub unreachable: bool,
    /// nftables tables in the kernel besides ufw's ("inet enverge_tenants" -> the text it was
    /// loaded from: the simulated `nft list` prints what it was given).
    pub nft: BTreeMap<String, String>,
}

impl State {
    /// The host without the agent's own bookkeeping (the done list names its build).
    pub fn settled(&self) -> State {
        let mut s = self.clone();
        s.files.remove("/var/lib/enverge-agent/prepare-done.json");
        s
    }

    /// Where two states differ, readably (files as text), for assertion messages.
    pub fn diff(&self, other: &State) -> String {
        let show = |s: &State| {
            let mut s = s.clone();
            let files: BTreeMap<String, String> = s
                .files
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            s.files.clear();
            format!("{files:#?}\n{s:#?}")
        };
        let (a, b) = (show(self), show(other));
        a.lines()
            .zip(b.lines())
            .filter(|(x, y)| x != y)
            .take(6)
            .map(|(x, y)| format!("- {x}\n+ {y}\n"))
            .collect()
    }
}

/// What a simulated Spark is, out of the box: DGX OS as shipped (Docker, swap, a
/// default-deny ufw, the owner's login), with no LXD.
pub fn dgx_os() -> State {
    let mut files = BTreeMap::new();
    files.insert(
        "/etc/fstab".into(),
        b"UUID=abcd / ext4 defaults 0 1\n/swap.img none swap sw 0 0\n".to_vec(),
    );
    files.insert("/swap.img".into(), Vec::new());
    files.insert(
        "/etc/default/ufw".into(),
        b"IPV6=yes\nDEFAULT_INPUT_POLICY=\"DROP\"\nDEFAULT_OUTPUT_POLICY=\"ACCEPT\"\nDEFAULT_FORWARD_POLICY=\"DROP\"\n".to_vec(),
    );
    files.insert("/etc/enverge/owner".into(), b"owner\n".to_vec());
    let mut users = BTreeMap::new();
    users.insert(
        "owner".to_owned(),
        User {
            home: "/home/owner".into(),
            groups: ["owner", "sudo", "docker"].map(String::from).into(),
            locked: false,
        },
    );
    State {
        files,
        packages: [
            "openssh-server",
            "ufw",
            "docker.io",
            "containerd",
            "iptables",
            "snapd",
            "sudo",
        ]
        .map(String::from)
        .into(),
        users,
        enabled: ["ssh.service", "docker.service", "ufw.service"]
            .map(String::from)
            .into(),
        active: ["ssh.service", "docker.service", "ufw.service"]
            .map(String::from)
            .into(),
        swap: vec!["/swap.img".into()],
        forward_policy: "DROP".into(),
        links: ["lo", "enP7s7", "docker0"].map(String::from).into(),
        addresses: vec![("enP7s7".into(), "192.168.1.23/24".into())],
        ufw_active: true,
        ufw_rules: vec!["ufw allow 22/tcp".into()],
        zfs_loaded: None,
        kernel_wireguard: true,
        watchdog: true,
        gpu: Some("NVIDIA GB10".into()),
        lxd: None,
        wg_peer: None,
        unreachable: false,
        nft: BTreeMap::new(),
    }
}

const TENANT_UNIT: &str = "enverge-tenant-firewall.service";
const TENANT_NFT: &str = "/etc/enverge/tenant-firewall.nft";

/// The table an nft file defines ("inet enverge_tenants"), if it is one nft would load.
fn nft_table(text: &str) -> Option<String> {
    let last = text.lines().rev().find(|l| l.starts_with("table "))?;
    let mut w = last.split_whitespace().skip(1);
    let name = format!("{} {}", w.next()?, w.next()?);
    text.contains("chain ").then_some(name)
}

/// ZFS's own default when nothing caps it: half of the 128 GB of unified memory.
pub const ZFS_DEFAULT_ARC: u64 = 64 << 30;

#[derive(Debug)]
pub struct SimSpark {
    pub state: State,
    /// Fail every call after this many changes: the agent killed part way (the state
    /// stays as it was at that instant).
    pub kill_after: Option<usize>,
    pub changes: usize,
    /// Processes the agent would have spawned (every `run`).
    pub spawned: usize,
    /// Every creation of an instance, with the seconds it costs on this pool.
    pub create_seconds: Vec<f64>,
    ops: BTreeMap<String, Value>,
    logs: BTreeMap<String, Vec<u8>>,
    next: u64,
    /// The cables between the machines of a pair: every rail address any of them has
    /// configured, and the interfaces whose cable is dead.
    pub wire: Arc<Mutex<Wire>>,
    /// What the network serves this host (`curl -o FILE URL`): URL -> body; any other URL
    /// is a 404.
    pub served: BTreeMap<String, Vec<u8>>,
}

#[derive(Debug, Default)]
pub struct Wire {
    pub addresses: BTreeSet<String>,
    pub dead: BTreeSet<String>,
    /// Interfaces left below their rail's MTU: small packets pass, a whole one does not.
    pub small_mtu: BTreeSet<String>,
}

fn reply(status: u16, v: Value) -> LxdReply {
    LxdReply {
        status,
        body: serde_json::to_vec(&v).unwrap(),
    }
}
fn sync(v: Value) -> LxdReply {
    reply(
        200,
        json!({"type": "sync", "status": "Success", "status_code": 200, "metadata": v}),
    )
}
fn lxd_error(status: u16, msg: &str) -> LxdReply {
    reply(
        status,
        json!({"type": "error", "error": msg, "error_code": status}),
    )
}
/// A cloudflared binary at `bin`: the one preparation installs, or Cloudflare's package.
fn cloudflared_at(s: &State, bin: &str) -> bool {
    match bin {
        "/usr/bin/cloudflared" => s.packages.contains("cloudflared"),
        other => s.files.contains_key(other),
    }
}

fn ok(s: &str) -> Output {
    Output::success(s)
}
fn fail(code: i32, s: &str) -> Output {
    Output::failure(code, s)
}

impl SimSpark {
    pub fn new(state: State) -> Self {
        SimSpark {
            state,
            kill_after: None,
            changes: 0,
            spawned: 0,
            create_seconds: Vec::new(),
            ops: BTreeMap::new(),
            logs: BTreeMap::new(),
            next: 0,
            wire: Arc::default(),
            served: BTreeMap::new(),
        }
    }

    /// A reboot: swap from fstab comes back, modules reload with what modprobe.d says,
    /// ufw reapplies its file, enabled units start.
    pub fn reboot(&mut self) {
        let s = &mut self.state;
        let fstab = String::from_utf8_lossy(
            s.files
                .get("/etc/fstab")
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
        .into_owned();
        s.swap = fstab
            .lines()
            .filter(|l| {
                !l.trim_start().starts_with('#') && l.split_whitespace().nth(2) == Some("swap")
            })
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
            .collect();
        let loaded = s.zfs_loaded.is_some();
        if loaded {
            let arc = self.modprobe_arc();
            self.state.zfs_loaded = Some(arc);
        }
        let s = &mut self.state;
        s.active = s.enabled.clone();
        s.forward_policy = if s.packages.contains("docker.io") {
            "DROP".into()
        } else {
            "ACCEPT".into()
        };
        if s.ufw_active {
            self.ufw_reload();
        }
        // The kernel forgets every table; an enabled unit of ours loads its file again.
        self.state.nft.clear();
        if self.state.enabled.contains(TENANT_UNIT) {
            self.load_tenant_firewall();
        }
    }

    /// What `nft -f` of the tenant firewall's file does: the table is the file's.
    fn load_tenant_firewall(&mut self) -> Output {
        let text = self.file_text(TENANT_NFT);
        match nft_table(&text) {
            Some(name) => {
                self.state.nft.insert(name, text);
                ok("")
            }
            None => fail(1, &format!("{TENANT_NFT}: syntax error")),
        }
    }

    fn modprobe_arc(&self) -> u64 {
        let conf = self.file_text("/etc/modprobe.d/enverge-zfs.conf");
        conf.trim()
            .strip_prefix("options zfs zfs_arc_max=")
            .and_then(|v| v.parse().ok())
            .unwrap_or(ZFS_DEFAULT_ARC)
    }

    fn file_text(&self, p: &str) -> String {
        String::from_utf8_lossy(
            self.state
                .files
                .get(p)
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
        .into_owned()
    }

    fn ufw_reload(&mut self) {
        let policy = self
            .file_text("/etc/default/ufw")
            .lines()
            .find_map(|l| {
                l.strip_prefix("DEFAULT_FORWARD_POLICY=")
                    .map(|v| v.trim_matches('"').to_owned())
            })
            .unwrap_or_else(|| "DROP".into());
        self.state.forward_policy = policy;
    }

    fn change(&mut self) -> Fallible<()> {
        if self.state.unreachable {
            return Err("node0 could not be reached: it fell off its network".into());
        }
        if self.kill_after.is_some_and(|n| self.changes >= n) {
            return Err("killed".into());
        }
        self.changes += 1;
        Ok(())
    }

    fn alive(&self) -> Fallible<()> {
        if self.state.unreachable {
            return Err("node0 could not be reached: it fell off its network".into());
        }
        if self.kill_after.is_some_and(|n| self.changes >= n) {
            return Err("killed".into());
        }
        Ok(())
    }

    /// The bridge's DHCP/DNS and forwarded traffic get through: what the image build needs.
    pub fn egress(&self) -> Result<(), &'static str> {
        let s = &self.state;
        let allowed = |r: &str| s.ufw_rules.iter().any(|x| x == r);
        if s.ufw_active && !allowed("ufw allow in on lxdbr0") {
            return Err("udhcpc: no lease, failing");
        }
        if s.forward_policy != "ACCEPT" {
            return Err("wget: bad address 'deb.debian.org'");
        }
        Ok(())
    }

    fn install(&mut self, pkg: &str) -> Output {
        match pkg {
            "lxd" => {
                self.state.packages.insert("lxd".into());
                self.load_lxd();
            }
            "docker.io" => {
                self.state.forward_policy = "DROP".into();
                self.state.links.insert("docker0".into());
            }
            "cloudflared" => return fail(100, "E: Unable to locate package cloudflared"),
            _ => {}
        }
        self.state.packages.insert(pkg.into());
        if pkg == "earlyoom" {
            self.state.enabled.insert("earlyoom.service".into());
            self.state.active.insert("earlyoom.service".into());
        }
        ok("")
    }

    fn load_lxd(&mut self) {
        if self.state.lxd.is_none() {
            self.state.lxd = Some(Lxd::default());
        }
        // LXD loads zfs even for a non-zfs pool; modprobe.d is read now, never again.
        if self.state.zfs_loaded.is_none() {
            self.state.zfs_loaded = Some(self.modprobe_arc());
        }
        self.state.users.entry("lxd".into()).or_insert(User {
            home: "/".into(),
            groups: BTreeSet::new(),
            locked: true,
        });
    }

    fn sshd_config(&self) -> String {
        let mut s = String::from("port 22\npubkeyauthentication yes\npasswordauthentication yes\n");
        if self
            .state
            .files
            .contains_key("/etc/ssh/sshd_config.d/00-enverge-lockout.conf")
        {
            s.push_str("allowusers spark\n");
        }
        s
    }

    fn systemctl(&mut self, args: &[&str]) -> Fallible<Output> {
        let (verb, rest) = args.split_first().ok_or("systemctl: no verb")?;
        let units: Vec<&str> = rest
            .iter()
            .copied()
            .filter(|a| !a.starts_with("--"))
            .collect();
        let known = |u: &str, s: &State| -> bool {
            match u {
                "earlyoom.service" => s.packages.contains("earlyoom"),
                "docker.service" | "docker.socket" | "containerd.service" => {
                    s.packages.contains("docker.io")
                }
                "wg-quick@wg0.service" => {
                    s.packages.contains("wireguard-tools")
                        && s.files.contains_key("/etc/wireguard/wg0.conf")
                }
                "ssh.service" => s.packages.contains("openssh-server"),
                "lxd.service" | "lxd.socket" => s.packages.contains("lxd"),
                // Its unit starts only if the binary its ExecStart names is there.
                "enverge-tunnel.service" => {
                    let unit = String::from_utf8_lossy(
                        s.files
                            .get("/etc/systemd/system/enverge-tunnel.service")
                            .map(Vec::as_slice)
                            .unwrap_or_default(),
                    )
                    .into_owned();
                    unit.lines()
                        .find_map(|l| l.strip_prefix("ExecStart="))
                        .and_then(|l| l.split_whitespace().next())
                        .is_some_and(|bin| cloudflared_at(s, bin))
                }
                TENANT_UNIT => s
                    .files
                    .contains_key(&format!("/etc/systemd/system/{TENANT_UNIT}")),
                _ => false,
            }
        };
        match *verb {
            "is-active" => Ok(if units.iter().all(|u| self.state.active.contains(*u)) {
                ok("active\n")
            } else {
                fail(3, "")
            }),
            "is-enabled" => Ok(if units.iter().all(|u| self.state.enabled.contains(*u)) {
                ok("enabled\n")
            } else {
                fail(1, "")
            }),
            "daemon-reload" | "daemon-reexec" => {
                self.change()?;
                Ok(ok(""))
            }
            "enable" | "disable" | "start" | "restart" | "reload" | "stop" => {
                self.change()?;
                let now = rest.contains(&"--now");
                for u in &units {
                    if !known(u, &self.state) {
                        if *verb == "disable" || *verb == "stop" {
                            continue;
                        }
                        return Ok(fail(
                            5,
                            &format!("Failed to {verb} {u}: Unit {u} not found."),
                        ));
                    }
                    match *verb {
                        "enable" => {
                            self.state.enabled.insert((*u).into());
                            if now {
                                self.start(u)?;
                            }
                        }
                        "disable" => {
                            self.state.enabled.remove(*u);
                            if now {
                                self.state.active.remove(*u);
                            }
                        }
                        "stop" => {
                            self.state.active.remove(*u);
                        }
                        _ => self.start(u)?,
                    }
                }
                Ok(ok(""))
            }
            _ => Ok(fail(1, "systemctl: unsupported here")),
        }
    }

    fn start(&mut self, unit: &str) -> Fallible<()> {
        if unit == "wg-quick@wg0.service" {
            let conf = self.file_text("/etc/wireguard/wg0.conf");
            if !self.state.kernel_wireguard && !self.state.packages.contains("wireguard-go") {
                return Err("wg-quick: Missing WireGuard kernel module and no wireguard-go".into());
            }
            // A collision with the LAN: the route to 10.8.0.0/24 now points into the tunnel.
            if self
                .state
                .addresses
                .iter()
                .any(|(i, a)| i != "wg0" && a.starts_with("10.8.0."))
            {
                self.state.unreachable = true;
            }
            self.state.wg_peer = conf
                .lines()
                .find_map(|l| l.strip_prefix("PublicKey = ").map(str::to_owned));
            self.state.links.insert("wg0".into());
        }
        if unit == TENANT_UNIT {
            let out = self.load_tenant_firewall();
            if !out.ok() {
                return Err(format!("Job for {unit} failed: {}", out.stderr));
            }
        }
        self.state.active.insert(unit.into());
        Ok(())
    }

    /// What the host answers to a program; nothing the steps run reads standard input.
    fn command(&mut self, argv: &[&str]) -> Fallible<Output> {
        let s = &self.state;
        Ok(match argv {
            ["runuser", "-u", user, "--", "sudo", "-n", "true"] => {
                let sudoers = self.file_text(&format!("/etc/sudoers.d/enverge-{user}"));
                // The sudo group asks for a password; only the NOPASSWD drop-in does not.
                if sudoers.contains("NOPASSWD:ALL") {
                    ok("")
                } else {
                    fail(1, "sudo: a password is required")
                }
            }
            ["sshd", "-T", "-C", _] => {
                if !s.packages.contains("openssh-server") {
                    return Ok(fail(127, "sshd: command not found"));
                }
                ok(&self.sshd_config())
            }
            ["sshd", "-t"] => ok(""),
            ["true"] => ok(""),
            ["systemctl", rest @ ..] => return self.systemctl(rest),
            ["getent", "passwd", user] => match s.users.get(*user) {
                Some(u) => ok(&format!("{user}:x:1000:1000::{}:/bin/bash\n", u.home)),
                None => fail(2, ""),
            },
            ["id", "-nG", user] => match s.users.get(*user) {
                Some(u) => ok(&format!(
                    "{}\n",
                    u.groups.iter().cloned().collect::<Vec<_>>().join(" ")
                )),
                None => fail(1, &format!("id: '{user}': no such user")),
            },
            ["useradd", .., name] => {
                self.change()?;
                self.state.users.insert(
                    (*name).into(),
                    User {
                        home: format!("/home/{name}"),
                        groups: [(*name).to_owned()].into(),
                        locked: true,
                    },
                );
                ok("")
            }
            ["visudo", "-cf", path] => {
                let t = self.file_text(path);
                if t.ends_with('\n') && t.contains("ALL") {
                    ok("parsed OK")
                } else {
                    fail(1, "syntax error")
                }
            }
            [
                "env",
                "DEBIAN_FRONTEND=noninteractive",
                "apt-get",
                "-o",
                _,
                rest @ ..,
            ] => {
                self.change()?;
                match rest {
                    ["update", ..] => ok(""),
                    ["install", flags @ ..] => {
                        let pkgs: Vec<String> = flags
                            .iter()
                            .filter(|f| !f.starts_with('-'))
                            .map(|p| p.to_string())
                            .collect();
                        for p in pkgs {
                            let out = self.install(&p);
                            if !out.ok() {
                                return Ok(out);
                            }
                        }
                        ok("")
                    }
                    ["purge", flags @ ..] => {
                        for p in flags.iter().filter(|f| !f.starts_with('-')) {
                            // Purging Docker leaves its FORWARD policy and docker0 behind.
                            self.state.packages.remove(*p);
                            self.state
                                .enabled
                                .retain(|u| !u.starts_with(p.trim_end_matches(".io")));
                        }
                        ok("")
                    }
                    _ => fail(100, "E: unsupported"),
                }
            }
            ["install", "-d", ..] => {
                self.change()?;
                ok("")
            }
            ["cloudflared", "--version"] => {
                if s.packages.contains("cloudflared")
                    || s.files.contains_key("/usr/local/bin/cloudflared")
                {
                    ok("cloudflared 2026.1")
                } else {
                    fail(127, "")
                }
            }
            [bin, "--version"] if bin.ends_with("/cloudflared") => {
                if cloudflared_at(s, bin) {
                    ok("cloudflared 2026.1")
                } else {
                    fail(127, &format!("{bin}: command not found"))
                }
            }
            ["curl", .., "-o", out, url] => {
                self.change()?;
                match self.served.get(*url).cloned() {
                    Some(body) => {
                        self.state.files.insert((*out).to_owned(), body);
                        ok("")
                    }
                    None => fail(22, "curl: (22) The requested URL returned error: 404"),
                }
            }
            ["iptables", "-S", "FORWARD"] => {
                if s.packages.contains("iptables") {
                    ok(&format!("-P FORWARD {}\n", s.forward_policy))
                } else {
                    fail(127, "iptables: command not found")
                }
            }
            ["iptables", "-P", "FORWARD", policy] => {
                self.change()?;
                self.state.forward_policy = (*policy).into();
                ok("")
            }
            ["ip", "link", "show", name] => {
                if s.links.contains(*name) {
                    ok(&format!("5: {name}: <UP>\n"))
                } else {
                    fail(1, "Device does not exist.")
                }
            }
            ["ip", "addr", "del", address, "dev", port] => {
                self.change()?;
                let before = self.state.addresses.len();
                self.state
                    .addresses
                    .retain(|(i, a)| !(i == port && a == address));
                if self.state.addresses.len() < before {
                    ok("")
                } else {
                    fail(2, "RTNETLINK answers: Cannot assign requested address")
                }
            }
            ["ip", "link", "delete", name] => {
                self.change()?;
                self.state.links.remove(*name);
                ok("")
            }
            ["ip", "link", "add", _, "type", "wireguard"] => {
                if s.kernel_wireguard {
                    ok("")
                } else {
                    fail(2, "Error: Unknown device type.")
                }
            }
            ["nft", "--version"] => {
                if s.packages.contains("nftables") {
                    ok("nftables v1.0.9 (Old Doc Yak #3)\n")
                } else {
                    fail(127, "nft: command not found")
                }
            }
            ["nft", "-c", "-f", path] => {
                if nft_table(&self.file_text(path)).is_some() {
                    ok("")
                } else {
                    fail(1, &format!("{path}: syntax error"))
                }
            }
            ["nft", "delete", "table", family, name] => {
                self.change()?;
                match self.state.nft.remove(&format!("{family} {name}")) {
                    Some(_) => ok(""),
                    None => fail(1, "Error: No such file or directory"),
                }
            }
            ["nft", "list", "table", family, name] => {
                match s.nft.get(&format!("{family} {name}")) {
                    Some(t) => ok(t),
                    None => fail(1, "Error: No such file or directory"),
                }
            }
            ["ip", "-j", "-6", "addr", "show", "scope", "global"] => ok("[]"),
            ["ip", "-j", "-4", "addr", "show"] => {
                let mut by: BTreeMap<&str, Vec<Value>> = BTreeMap::new();
                for (i, a) in &s.addresses {
                    let (ip, len) = a.split_once('/').unwrap();
                    by.entry(i).or_default().push(json!({"family": "inet", "local": ip, "prefixlen": len.parse::<u32>().unwrap()}));
                }
                let v: Vec<Value> = by
                    .into_iter()
                    .map(|(i, a)| json!({"ifname": i, "addr_info": a}))
                    .collect();
                ok(&serde_json::to_string(&v).unwrap())
            }
            ["dpkg-query", "-W", _, pkg] => {
                if s.packages.contains(*pkg) {
                    ok("install ok installed")
                } else {
                    fail(1, &format!("dpkg-query: no packages found matching {pkg}"))
                }
            }
            ["swapoff", "-a"] => {
                self.change()?;
                self.state.swap.clear();
                ok("")
            }
            ["swapon", dev] => {
                let there = s.files.contains_key(*dev);
                self.change()?;
                if !there {
                    fail(
                        255,
                        &format!("swapon: cannot open {dev}: No such file or directory"),
                    )
                } else {
                    if !self.state.swap.iter().any(|d| d == dev) {
                        self.state.swap.push((*dev).to_owned());
                    }
                    ok("")
                }
            }
            ["rm", flags, paths @ ..] if flags.starts_with('-') => {
                self.change()?;
                for p in paths {
                    let under = format!("{}/", p.trim_end_matches('/'));
                    self.state
                        .files
                        .retain(|f, _| f != p && !f.starts_with(&under));
                }
                ok("")
            }
            ["test", "-e", path] => {
                let there = match *path {
                    "/dev/watchdog" => s.watchdog,
                    p => s.files.contains_key(p),
                };
                if there { ok("") } else { fail(1, "") }
            }
            ["snap", "list", "lxd"] => {
                if s.packages.contains("lxd") {
                    ok("lxd 5.21.3")
                } else {
                    fail(1, "error: no matching snaps installed")
                }
            }
            ["snap", "install", "lxd", ..] => {
                self.change()?;
                self.install("lxd")
            }
            ["lxd", "waitready", ..] => {
                if s.lxd.is_some() {
                    ok("")
                } else {
                    fail(1, "lxd: command not found")
                }
            }
            ["usermod", "-aG", group, user] => {
                self.change()?;
                if let Some(u) = self.state.users.get_mut(*user) {
                    u.groups.insert((*group).into());
                    ok("")
                } else {
                    fail(6, "usermod: user does not exist")
                }
            }
            ["usermod", "--lock", user] => {
                self.change()?;
                if let Some(u) = self.state.users.get_mut(*user) {
                    u.locked = true;
                }
                ok("")
            }
            ["passwd", "-S", user] => match s.users.get(*user) {
                Some(u) => ok(&format!(
                    "{user} {} 2026-01-01 0 99999 7 -1\n",
                    if u.locked { "L" } else { "P" }
                )),
                None => fail(1, "passwd: user does not exist"),
            },
            ["gpasswd", "--delete", user, group] => {
                self.change()?;
                if let Some(u) = self.state.users.get_mut(*user) {
                    u.groups.remove(*group);
                }
                ok("")
            }
            ["ufw", "status"] => {
                if !s.packages.contains("ufw") {
                    fail(127, "")
                } else if s.ufw_active {
                    ok("Status: active\n")
                } else {
                    ok("Status: inactive\n")
                }
            }
            ["ufw", "show", "added"] => {
                let mut t =
                    String::from("Added user rules (see 'ufw status' for running firewall):\n");
                for r in &s.ufw_rules {
                    t.push_str(r);
                    t.push('\n');
                }
                ok(&t)
            }
            ["ufw", "reload"] => {
                self.change()?;
                self.ufw_reload();
                ok("Firewall reloaded\n")
            }
            ["ufw", "--force", "delete", rule @ ..] => {
                self.change()?;
                let r = format!("ufw {}", rule.join(" "));
                self.state.ufw_rules.retain(|x| *x != r);
                ok("Rule deleted\n")
            }
            ["ufw", "--force", "route", "delete", rule @ ..] => {
                self.change()?;
                let r = format!("ufw route {}", rule.join(" "));
                self.state.ufw_rules.retain(|x| *x != r);
                ok("Rule deleted\n")
            }
            ["ufw", rule @ ..] => {
                self.change()?;
                let r = format!("ufw {}", rule.join(" "));
                if !self.state.ufw_rules.contains(&r) {
                    self.state.ufw_rules.push(r);
                }
                ok("Rule added\n")
            }
            ["wg", "--version"] => {
                if s.packages.contains("wireguard-tools") {
                    ok("wireguard-tools v1.0.20210914")
                } else {
                    fail(127, "")
                }
            }
            ["wireguard-go", "--version"] => {
                if s.packages.contains("wireguard-go") {
                    ok("wireguard-go v0.0.20230223")
                } else {
                    fail(127, "")
                }
            }
            ["wg", "show", "wg0", "peers"] => match &s.wg_peer {
                Some(p) if s.links.contains("wg0") => ok(&format!("{p}\n")),
                _ => fail(1, "Unable to access interface: No such device"),
            },
            ["nvidia-smi", ..] => match &s.gpu {
                Some(g) => ok(&format!("{g}\n")),
                None => fail(127, ""),
            },
            ["uname", "-m"] => ok("aarch64\n"),
            ["sysctl", "-q", "-p", file] => {
                let text = self.file_text(file);
                if text.is_empty() {
                    fail(255, &format!("sysctl: cannot open \"{file}\""))
                } else {
                    // The one setting a step reads back: the kernel takes it as written.
                    for line in text.lines() {
                        if let Some(v) = line.strip_prefix("net.ipv4.ping_group_range = ") {
                            let proc = "/proc/sys/net/ipv4/ping_group_range".to_owned();
                            self.state
                                .files
                                .insert(proc, v.replace(' ', "\t").into_bytes());
                        }
                    }
                    ok("")
                }
            }
            ["netplan", "generate"] => {
                let t = self.file_text("/etc/netplan/60-enverge-rails.yaml");
                if t.contains("network:") {
                    ok("")
                } else {
                    fail(1, "netplan: invalid YAML")
                }
            }
            ["netplan", "apply"] => {
                self.change()?;
                let t = self.file_text("/etc/netplan/60-enverge-rails.yaml");
                let mut iface = String::new();
                for line in t.lines() {
                    let l = line.trim();
                    if line.starts_with("    ") && !line.starts_with("      ") {
                        iface = l.trim_end_matches(':').to_owned();
                    } else if let Some(a) = l
                        .strip_prefix("addresses: [\"")
                        .and_then(|a| a.strip_suffix("\"]"))
                    {
                        self.state.addresses.retain(|(i, _)| *i != iface);
                        self.state.addresses.push((iface.clone(), a.to_owned()));
                        self.wire
                            .lock()
                            .unwrap()
                            .addresses
                            .insert(a.split('/').next().unwrap().to_owned());
                    }
                }
                ok("")
            }
            [
                "ping",
                "-n",
                "-q",
                "-c",
                _,
                "-i",
                _,
                "-W",
                _,
                "-I",
                iface,
                target,
            ]
            | [
                "ping",
                "-n",
                "-q",
                "-c",
                _,
                "-W",
                _,
                "-M",
                "do",
                "-s",
                _,
                "-I",
                iface,
                target,
            ] => {
                let configured = s.addresses.iter().any(|(i, a)| {
                    i == iface
                        && a.rsplit_once('.').map(|x| x.0) == target.rsplit_once('.').map(|x| x.0)
                });
                let wire = self.wire.lock().unwrap();
                let whole = argv.contains(&"do");
                if configured
                    && !wire.dead.contains(*iface)
                    && !(whole && wire.small_mtu.contains(*iface))
                    && wire.addresses.contains(*target)
                {
                    ok("3 packets transmitted, 3 received")
                } else {
                    fail(1, "3 packets transmitted, 0 received, 100% packet loss")
                }
            }
            other => fail(
                127,
                &format!("sim: no such command here: {}", other.join(" ")),
            ),
        })
    }

    fn op(&mut self, result: Value) -> LxdReply {
        self.next += 1;
        let id = format!("/1.0/operations/op{}", self.next);
        self.ops.insert(id.clone(), result);
        reply(
            202,
            json!({"type": "async", "status": "Operation created", "operation": id, "metadata": {}}),
        )
    }

    fn op_ok(&mut self, meta: Value) -> LxdReply {
        self.op(json!({"status": "Success", "err": "", "metadata": meta}))
    }

    fn op_fail(&mut self, err: &str) -> LxdReply {
        self.op(json!({"status": "Failure", "err": err, "metadata": null}))
    }

    fn rest(&mut self, method: &str, path: &str, body: &LxdBody<'_>) -> Fallible<LxdReply> {
        let json_body = match body {
            LxdBody::Json(v) => (*v).clone(),
            _ => Value::Null,
        };
        if method != "GET" {
            self.change()?;
        }
        if let Some(op) = path.strip_prefix("/1.0/operations/") {
            let id = format!("/1.0/operations/{}", op.split('/').next().unwrap());
            return Ok(match self.ops.get(&id) {
                Some(v) => sync(v.clone()),
                None => lxd_error(404, "Operation not found"),
            });
        }
        if let Some(bytes) = self.logs.get(path) {
            return Ok(LxdReply {
                status: 200,
                body: bytes.clone(),
            });
        }
        let Some(lxd) = self.state.lxd.as_mut() else {
            return Err("LXD is not answering on its socket".into());
        };
        let seg: Vec<&str> = path
            .trim_start_matches("/1.0")
            .split('?')
            .next()
            .unwrap()
            .split('/')
            .filter(|s| !s.is_empty())
            .collect();
        Ok(match (method, seg.as_slice()) {
            ("GET", []) => {
                sync(json!({"api_version": "1.0", "environment": {"server_version": "5.21.3"}}))
            }
            ("GET", ["storage-pools", name]) => match lxd.pools.get(*name) {
                Some(d) => sync(json!({"name": name, "driver": d, "used_by": []})),
                None => lxd_error(404, "Storage pool not found"),
            },
            ("POST", ["storage-pools"]) => {
                let name = json_body["name"].as_str().unwrap_or_default().to_owned();
                if lxd.pools.contains_key(&name) {
                    return Ok(lxd_error(400, "Storage pool already exists"));
                }
                lxd.pools
                    .insert(name, json_body["driver"].as_str().unwrap_or("dir").into());
                sync(json!({}))
            }
            ("GET", ["networks", name]) => match lxd.networks.get(*name) {
                Some(n) => sync(n.clone()),
                None => lxd_error(404, "Network not found"),
            },
            ("POST", ["networks"]) => {
                let name = json_body["name"].as_str().unwrap_or_default().to_owned();
                lxd.networks.insert(name.clone(), json!({"name": name, "type": "bridge", "managed": true, "config": json_body["config"]}));
                sync(json!({}))
            }
            ("PATCH", ["networks", name]) => {
                if let Some(n) = lxd.networks.get_mut(*name) {
                    for (k, v) in json_body["config"].as_object().into_iter().flatten() {
                        n["config"][k] = v.clone();
                    }
                }
                sync(json!({}))
            }
            ("GET", ["profiles", name]) => match lxd.profiles.get(*name) {
                Some(p) => sync(p.clone()),
                None => lxd_error(404, "Profile not found"),
            },
            ("DELETE", ["profiles", name]) => match lxd.profiles.remove(*name) {
                Some(_) => sync(json!({})),
                None => lxd_error(404, "Profile not found"),
            },
            ("POST", ["profiles"]) | ("PUT", ["profiles", _]) => {
                for (dev, d) in json_body["devices"].as_object().into_iter().flatten() {
                    if let Some(net) = d["network"].as_str()
                        && !lxd.networks.contains_key(net)
                    {
                        return Ok(lxd_error(
                            400,
                            &format!(
                                "Device validation failed for \"{dev}\": Failed loading network \"{net}\": Network not found"
                            ),
                        ));
                    }
                    if let Some(pool) = d["pool"].as_str()
                        && !lxd.pools.contains_key(pool)
                    {
                        return Ok(lxd_error(
                            400,
                            &format!(
                                "Device validation failed for \"{dev}\": Failed loading storage pool \"{pool}\""
                            ),
                        ));
                    }
                }
                let name = seg
                    .get(1)
                    .map(|s| s.to_string())
                    .or_else(|| json_body["name"].as_str().map(str::to_owned))
                    .unwrap_or_default();
                let mut p = json_body.clone();
                p["name"] = json!(name);
                lxd.profiles.insert(name, p);
                sync(json!({}))
            }
            ("GET", ["images"]) => {
                let list: Vec<Value> = lxd
                    .images
                    .iter()
                    .map(|(fp, props)| json!({"fingerprint": fp, "properties": props}))
                    .collect();
                sync(json!(list))
            }
            ("GET", ["images", "aliases", name]) => match lxd.aliases.get(*name) {
                Some(fp) => sync(json!({"name": name, "target": fp})),
                None => lxd_error(404, "Image alias not found"),
            },
            ("POST", ["images", "aliases"]) => {
                let name = json_body["name"].as_str().unwrap_or_default().to_owned();
                if lxd.aliases.contains_key(&name) {
                    return Ok(lxd_error(409, "Alias already exists"));
                }
                lxd.aliases.insert(
                    name,
                    json_body["target"].as_str().unwrap_or_default().into(),
                );
                sync(json!({}))
            }
            ("PUT", ["images", "aliases", name]) => {
                lxd.aliases.insert(
                    (*name).into(),
                    json_body["target"].as_str().unwrap_or_default().into(),
                );
                sync(json!({}))
            }
            ("GET", ["images", fp]) => match lxd.images.get(*fp) {
                Some(props) => sync(json!({"fingerprint": fp, "properties": props})),
                None => lxd_error(404, "Image not found"),
            },
            ("DELETE", ["images", fp]) => {
                lxd.images.remove(*fp);
                lxd.aliases.retain(|_, t| t != fp);
                let r = json!({});
                return Ok(self.op_ok(r));
            }
            ("POST", ["images"]) => {
                let (fp, props) = match body {
                    LxdBody::Raw { bytes, .. } => (
                        hex::encode(Sha256::digest(bytes)),
                        json!({"description": "enverge minimal source (busybox)", "os": "busybox"}),
                    ),
                    _ => {
                        let src = json_body["source"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned();
                        let Some((status, from, files)) = lxd.instances.get(&src) else {
                            return Ok(self.op_fail("Instance not found"));
                        };
                        if status == "Running" {
                            return Ok(self.op_fail("The instance is running, stop it first"));
                        }
                        let mut h = Sha256::new();
                        h.update(from.as_bytes());
                        for (k, v) in files {
                            h.update(k.as_bytes());
                            h.update(v);
                        }
                        h.update(json_body["properties"].to_string().as_bytes());
                        (hex::encode(h.finalize()), json_body["properties"].clone())
                    }
                };
                lxd.images.insert(fp.clone(), props);
                return Ok(self.op_ok(json!({"fingerprint": fp})));
            }
            ("GET", ["instances"]) => sync(json!(
                lxd.instances
                    .iter()
                    .map(
                        |(name, (status, ..))| json!({"name": name, "status": status, "config": {}})
                    )
                    .collect::<Vec<_>>()
            )),
            ("GET", ["instances", name]) => match lxd.instances.get(*name) {
                Some((status, ..)) => sync(json!({"name": name, "status": status})),
                None => lxd_error(404, "Instance not found"),
            },
            ("POST", ["instances"]) => {
                let name = json_body["name"].as_str().unwrap_or_default().to_owned();
                let src = &json_body["source"];
                let fp = if let Some(fp) = src["fingerprint"].as_str() {
                    fp.to_owned()
                } else if src["mode"] == json!("pull") {
                    format!("remote:{}", src["alias"].as_str().unwrap_or_default())
                } else if let Some(alias) = src["alias"].as_str() {
                    match lxd.aliases.get(alias) {
                        Some(fp) => fp.clone(),
                        None => {
                            return Ok(self.op_fail(&format!(
                                "Failed getting image: Image \"{alias}\" not found"
                            )));
                        }
                    }
                } else {
                    return Ok(self.op_fail("no source"));
                };
                for p in json_body["profiles"].as_array().into_iter().flatten() {
                    if !lxd.profiles.contains_key(p.as_str().unwrap_or_default()) {
                        return Ok(self.op_fail(&format!("Requested profile {p} doesn't exist")));
                    }
                }
                let pool_driver = lxd.pools.get("default").cloned().unwrap_or_default();
                lxd.instances
                    .insert(name, ("Stopped".into(), fp, BTreeMap::new()));
                self.create_seconds
                    .push(if pool_driver == "dir" { 69.0 } else { 0.6 });
                return Ok(self.op_ok(json!({})));
            }
            ("PUT", ["instances", name, "state"]) => {
                let Some(inst) = lxd.instances.get_mut(*name) else {
                    return Ok(lxd_error(404, "Instance not found"));
                };
                inst.0 = if json_body["action"] == json!("start") {
                    "Running".into()
                } else {
                    "Stopped".into()
                };
                return Ok(self.op_ok(json!({})));
            }
            ("DELETE", ["instances", name]) => {
                lxd.instances.remove(*name);
                return Ok(self.op_ok(json!({})));
            }
            ("POST", ["instances", name, "files"]) => {
                let file = path.split("path=").nth(1).unwrap_or_default().to_owned();
                let LxdBody::Raw { bytes, .. } = body else {
                    return Ok(lxd_error(400, "no body"));
                };
                match lxd.instances.get_mut(*name) {
                    Some(inst) => {
                        inst.2.insert(file, bytes.to_vec());
                        sync(json!({}))
                    }
                    None => lxd_error(404, "Instance not found"),
                }
            }
            ("POST", ["instances", name, "exec"]) => {
                let name = (*name).to_owned();
                let Some(inst) = lxd.instances.get(&name) else {
                    return Ok(lxd_error(404, "Instance not found"));
                };
                let script_pushed = inst.2.contains_key("/root/build-base-image.sh");
                let (code, out, err) = if !script_pushed {
                    (
                        127,
                        String::new(),
                        "/bin/sh: can't open '/root/build-base-image.sh'".to_owned(),
                    )
                } else {
                    match self.egress() {
                        Ok(()) => (0, "build-base-image: done\n".to_owned(), String::new()),
                        Err(e) => (
                            4,
                            String::new(),
                            format!(
                                "{e}\nbuild-base-image: no egress: could not fetch from deb.debian.org\n"
                            ),
                        ),
                    }
                };
                self.next += 1;
                let (o, e) = (
                    format!("/1.0/instances/{name}/logs/exec_{}.stdout", self.next),
                    format!("/1.0/instances/{name}/logs/exec_{}.stderr", self.next),
                );
                self.logs.insert(o.clone(), out.into_bytes());
                self.logs.insert(e.clone(), err.into_bytes());
                return Ok(self.op_ok(json!({"return": code, "output": {"1": o, "2": e}})));
            }
            _ => lxd_error(404, &format!("sim LXD: no route for {method} {path}")),
        })
    }
}

impl Host for SimSpark {
    fn run(&mut self, argv: &[&str], stdin: Option<&[u8]>) -> Fallible<Output> {
        self.alive()?;
        self.spawned += 1;
        // A throwaway network namespace prints what it was given to load.
        if let ["unshare", "--net", "--", "sh", "-c", _] = argv {
            let text = String::from_utf8_lossy(stdin.unwrap_or_default()).into_owned();
            return Ok(if nft_table(&text).is_some() {
                ok(&text)
            } else {
                fail(1, "/dev/stdin: syntax error")
            });
        }
        self.command(argv)
    }

    fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>> {
        self.alive()?;
        let s = &self.state;
        Ok(match path {
            "/proc/swaps" => {
                let mut t = String::from("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n");
                for d in &s.swap {
                    t.push_str(&format!(
                        "{d}                               file\t\t8388604\t\t0\t\t-2\n"
                    ));
                }
                Some(t.into_bytes())
            }
            "/sys/module/zfs/parameters/zfs_arc_max" => {
                s.zfs_loaded.map(|v| format!("{v}\n").into_bytes())
            }
            "/bin/busybox" => s
                .packages
                .contains("busybox-static")
                .then(|| b"\x7fELF busybox".to_vec()),
            p => s.files.get(p).cloned(),
        })
    }

    fn write(&mut self, path: &str, bytes: &[u8], _mode: u32, _owner: &str) -> Fallible<()> {
        self.change()?;
        self.state.files.insert(path.to_owned(), bytes.to_vec());
        Ok(())
    }

    fn remove(&mut self, path: &str) -> Fallible<()> {
        self.change()?;
        self.state.files.remove(path);
        Ok(())
    }

    fn lxd(&mut self, method: &str, path: &str, body: LxdBody<'_>) -> Fallible<LxdReply> {
        self.alive()?;
        self.rest(method, path, &body)
    }

    fn describe(&self) -> String {
        "node0 (simulated Spark)".into()
    }
}
