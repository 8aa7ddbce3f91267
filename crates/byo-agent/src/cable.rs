//! Steps 123–125 on node0, the IO around the pure probe (`byo_core::probe`): peer-prep (the
//! one pre-enrol write: each rail port up, link-local eui64 pinned, on node0 and, after a
//! login, on node1), the all-nodes multicast on every rail port, the logins that tell machines
//! apart, the management-LAN fallback that only wakes a cabled machine with no link-local, and
//! peer.json recorded on the spot. `docs/pairs.md` has every step, refusal and test.
//!
//! The only simulated parts are what no container has: which interfaces are RDMA ports (an
//! iproute2 `rdma` stand-in) and the GPU identity (an `nvidia-smi` stand-in), tools the test
//! bed installs; the agent asks them as it asks the real ones. Everything else — ping, ip,
//! sysctl, ssh, sudo — is the real thing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use byo_core::probe::{self, Decision, Login, Machine, Observation, PortSeen};
use byo_wire::peers::{PEER_FILE, PeerFile};
use serde_json::Value;

use crate::detect::{HostProbe, LocalProbe, Probe};
use crate::host::{Fallible, Host, LocalHost, SshHost, must, read_string};

/// How many machines the host is (`install.sh --peer --nodes=N`), before enrolment returns
/// the profile (K2 note 1).
pub const PEER_NODES: &str = "/etc/enverge/peer-nodes";
/// node1's login from step 123: user, then password. Root-only, read at 125 and 129, deleted
/// at 129 (peer-access); never logged, never in a request body.
pub use crate::names::PEER_LOGIN;
/// Names node1 outright: skips both the cable-first search and the LAN fallback.
pub const PEER_ADDR_ENV: &str = "ENVERGE_PEER_ADDR";

/// Where the probe works: `root` prefixes node0's files (`/` on a host).
#[derive(Clone, Debug)]
pub struct CableProbe {
    pub root: PathBuf,
    /// node1 named outright (ENVERGE_PEER_ADDR).
    pub peer_addr: Option<String>,
    /// How long a port's own link-local may stay tentative after a bounce.
    pub settle: Duration,
}

impl CableProbe {
    pub fn system() -> Self {
        CableProbe {
            root: PathBuf::from("/"),
            peer_addr: std::env::var(PEER_ADDR_ENV)
                .ok()
                .filter(|a| !a.trim().is_empty()),
            settle: Duration::from_secs(5),
        }
    }
    fn at(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
    /// N from peer-nodes: 1 (no pair) when the installer wrote none.
    pub fn nodes(&self) -> u32 {
        std::fs::read_to_string(self.at(PEER_NODES))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(1)
    }
    pub fn login_file(&self) -> PathBuf {
        self.at(PEER_LOGIN)
    }
    /// The rails a first numbering may use: a pair's two, a ring's one per cable (K2 note 8).
    pub fn rail_indexes(&self) -> Vec<u32> {
        (0..self.nodes().max(2)).collect()
    }
    fn kept(&self) -> Option<PeerFile> {
        let text = std::fs::read_to_string(self.at(PEER_FILE)).ok()?;
        byo_wire::peers::parse_peer_file(&text)
            .ok()
            .map(|peers| PeerFile { peers })
    }
    /// Record the numbering on the spot, root-only.
    pub fn record(&self, file: &PeerFile) -> Fallible<()> {
        let path = self.at(PEER_FILE);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let text = serde_json::to_string_pretty(file).map_err(|e| e.to_string())?;
        crate::host::write_atomic(&path, format!("{text}\n").as_bytes(), 0o600)
            .map_err(|e| format!("recording {PEER_FILE}: {e}"))
    }

    /// Step 125 once: pin node0's rails, look, log in, decide. A decision to enrol has
    /// already been recorded in peer.json when this returns.
    pub fn run_once(&self, node0: &mut LocalHost) -> Fallible<Decision> {
        let me = crate::detect::detect(&LocalProbe);
        let hardware_id = me
            .hardware_id
            .clone()
            .or(me.machine_id.clone())
            .unwrap_or_default();
        let ports: Vec<String> = me.rails.iter().map(|r| r.iface.clone()).collect();
        for change in peer_prep(node0, &ports)? {
            println!("byo-agent: peer-prep on node0: {change}");
        }
        wait_link_local(node0, &ports, self.settle);
        let mut logins = Logins::new(self)?;
        if let Some(addr) = &self.peer_addr {
            logins.named(addr)?;
        }
        let silent = |d: &Decision| {
            matches!(
                d,
                Decision::Retry {
                    retry: probe::Retry::Silent { .. },
                    ..
                }
            )
        };
        let mut obs = self.look(node0, &me, hardware_id.clone(), &mut logins)?;
        let mut decision = probe::decide(&obs, &self.rail_indexes(), self.kept().as_ref());
        // The management LAN only wakes a cabled machine with carrier and no link-local;
        // then the cables are walked again. ENVERGE_PEER_ADDR skips it (its login has already
        // pinned the named machine's rails).
        let woken = match (&self.peer_addr, silent(&decision)) {
            (None, true) => logins.wake_over_lan(node0)?,
            (Some(_), true) => 1,
            (_, false) => 0,
        };
        // A woken rail's address is tentative for a moment (duplicate detection): look
        // again until the cable answers or the moment has passed.
        let deadline = Instant::now() + self.settle;
        while woken > 0 && silent(&decision) && Instant::now() < deadline {
            obs = self.look(node0, &me, hardware_id.clone(), &mut logins)?;
            decision = probe::decide(&obs, &self.rail_indexes(), self.kept().as_ref());
        }
        // A ring: walk the cables beyond node0's, from each machine on them, until nothing
        // new answers (K2 note 3).
        if self.nodes() > 2
            && let Decision::Enroll(found) = &decision
        {
            let linked: Vec<String> = found
                .peers
                .iter()
                .filter_map(|p| p.hardware_id.clone())
                .collect();
            logins.walk(&mut obs, &linked)?;
            decision = probe::decide(&obs, &self.rail_indexes(), self.kept().as_ref());
        }
        if let Decision::Enroll(found) = &decision {
            self.record(&found.peer_file)?;
        }
        Ok(decision)
    }

    fn look(
        &self,
        node0: &mut LocalHost,
        me: &byo_wire::enroll::NodeReport,
        hardware_id: String,
        logins: &mut Logins,
    ) -> Fallible<Observation> {
        let own: Vec<(String, String)> = link_local(node0)?
            .into_iter()
            .flat_map(|(i, addrs)| addrs.into_iter().map(move |a| (i.clone(), a)))
            .collect();
        let mut ports = Vec::new();
        let mut seen = BTreeMap::new();
        for r in &me.rails {
            let answered = all_nodes(node0, &r.iface)?;
            for a in &answered {
                if own.iter().any(|(_, o)| o == a) {
                    continue;
                }
                let key = probe::scoped(a, &r.iface);
                let login = logins.at(a, &r.iface);
                seen.insert(key, login);
            }
            ports.push(PortSeen {
                iface: r.iface.clone(),
                device: r.device.clone(),
                mtu: r.mtu,
                active_mtu: r.active_mtu,
                carrier: LocalProbe
                    .read(&format!("/sys/class/net/{}/carrier", r.iface))
                    .is_some_and(|c| c.trim() == "1"),
                answered,
            });
        }
        Ok(Observation {
            hardware_id,
            ports,
            own,
            logins: seen,
            beyond: Vec::new(),
        })
    }
}

/// peer-prep: every rail port up with link-local eui64, idempotently — NetworkManager's
/// connection pinned (`ipv6.method link-local`, `ipv6.addr-gen-mode eui64`) when it runs, and
/// the live sysctl forced either way, the port bounced if its address is still missing.
/// Returns what it changed (nothing on a second run).
pub fn peer_prep<H: Host + ?Sized>(h: &mut H, ports: &[String]) -> Fallible<Vec<String>> {
    let mut changed = Vec::new();
    let nm = h
        .run(
            &["systemctl", "is-active", "--quiet", "NetworkManager"],
            None,
        )?
        .ok();
    for iface in ports {
        // A port the kernel does not have (no cable module, a missing cable in the bed) is
        // nothing to pin.
        if read_string(h, &format!("/sys/class/net/{iface}/flags"))?.is_none() {
            continue;
        }
        if nm {
            let conn = nm_connection(h, iface)?;
            let want = [
                ("ipv6.method", "link-local"),
                ("ipv6.addr-gen-mode", "eui64"),
            ];
            match conn {
                None => {
                    let name = format!("enverge-{iface}");
                    must(
                        h,
                        &[
                            "nmcli",
                            "connection",
                            "add",
                            "type",
                            "ethernet",
                            "ifname",
                            iface,
                            "con-name",
                            &name,
                            "ipv4.method",
                            "disabled",
                            "ipv6.method",
                            "link-local",
                            "ipv6.addr-gen-mode",
                            "eui64",
                        ],
                    )?;
                    must(h, &["nmcli", "connection", "up", &name])?;
                    changed.push(format!("{iface}: NetworkManager connection {name} added"));
                }
                Some(name) => {
                    let mut stale = Vec::new();
                    for (k, v) in want {
                        let now = must(h, &["nmcli", "-g", k, "connection", "show", &name])?;
                        if now.trim() != v {
                            stale.push((k, v));
                        }
                    }
                    if !stale.is_empty() {
                        let mut argv = vec!["nmcli", "connection", "modify", name.as_str()];
                        for (k, v) in &stale {
                            argv.extend([*k, *v]);
                        }
                        must(h, &argv)?;
                        must(h, &["nmcli", "connection", "up", &name])?;
                        changed.push(format!("{iface}: {name} pinned to link-local eui64"));
                    }
                }
            }
        }
        let sys = |k: &str| format!("/proc/sys/net/ipv6/conf/{iface}/{k}");
        for (k, v) in [("disable_ipv6", "0"), ("addr_gen_mode", "0")] {
            if read_string(h, &sys(k))?.as_deref().map(str::trim) != Some(v) {
                must(
                    h,
                    &[
                        "sysctl",
                        "-q",
                        "-w",
                        &format!("net.ipv6.conf.{iface}.{k}={v}"),
                    ],
                )?;
                changed.push(format!("{iface}: {k}={v}"));
            }
        }
        let up = read_string(h, &format!("/sys/class/net/{iface}/flags"))?
            .and_then(|f| u32::from_str_radix(f.trim().trim_start_matches("0x"), 16).ok())
            .is_some_and(|f| f & 1 == 1);
        // A bounced port's address is tentative for a moment: it counts as there.
        let has_ll = addresses(h, true)?
            .get(iface)
            .is_some_and(|a| !a.is_empty());
        if !up || !has_ll {
            if up {
                must(h, &["ip", "link", "set", iface, "down"])?;
            }
            must(h, &["ip", "link", "set", iface, "up"])?;
            changed.push(format!("{iface}: brought up"));
        }
    }
    Ok(changed)
}

fn nm_connection<H: Host + ?Sized>(h: &mut H, iface: &str) -> Fallible<Option<String>> {
    let out = h.run(
        &["nmcli", "-g", "GENERAL.CONNECTION", "device", "show", iface],
        None,
    )?;
    Ok(out
        .ok()
        .then(|| out.stdout.trim().to_owned())
        .filter(|c| !c.is_empty() && c != "--"))
}

/// Every interface's link-local addresses (`ip -j -6 addr show scope link`), tentative ones
/// left out: an address still in duplicate detection answers nothing.
pub fn link_local<H: Host + ?Sized>(h: &mut H) -> Fallible<BTreeMap<String, Vec<String>>> {
    addresses(h, false)
}

fn addresses<H: Host + ?Sized>(
    h: &mut H,
    tentative: bool,
) -> Fallible<BTreeMap<String, Vec<String>>> {
    let out = must(h, &["ip", "-j", "-6", "addr", "show", "scope", "link"])?;
    let v: Value = serde_json::from_str(&out).map_err(|e| format!("`ip -j -6 addr`: {e}"))?;
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for link in v.as_array().into_iter().flatten() {
        let ifname = link["ifname"].as_str().unwrap_or_default().to_owned();
        let addrs = map.entry(ifname).or_default();
        for a in link["addr_info"].as_array().into_iter().flatten() {
            if !tentative && a["tentative"].as_bool() == Some(true) {
                continue;
            }
            if let Some(local) = a["local"].as_str() {
                addrs.push(local.to_owned());
            }
        }
    }
    Ok(map)
}

fn wait_link_local(h: &mut LocalHost, ports: &[String], settle: Duration) {
    let deadline = Instant::now() + settle;
    while Instant::now() < deadline {
        let ready = link_local(h).is_ok_and(|m| {
            ports
                .iter()
                .all(|p| m.get(p).is_some_and(|a| !a.is_empty()))
        });
        if ready {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Who answers the all-nodes multicast on `iface` (unscoped addresses, each once): three
/// echoes 0.2 s apart, as root does at step 125.
pub fn all_nodes<H: Host + ?Sized>(h: &mut H, iface: &str) -> Fallible<Vec<String>> {
    let target = format!("ff02::1%{iface}");
    let out = h.run(
        &[
            "ping", "-6", "-n", "-c", "3", "-i", "0.2", "-W", "1", &target,
        ],
        None,
    )?;
    Ok(answering(&out.stdout))
}

/// [`all_nodes`] as serving asks it (133): unprivileged, over an ICMP datagram socket (the
/// `ping_group_range` rail-network grants spark's group), which allows a multicast echo once
/// a second, so every echo of two seconds is listened to.
pub fn all_nodes_unprivileged<H: Host + ?Sized>(h: &mut H, iface: &str) -> Fallible<Vec<String>> {
    let target = format!("ff02::1%{iface}");
    let out = h.run(&["ping", "-6", "-n", "-w", "2", &target], None)?;
    Ok(answering(&out.stdout))
}

/// The addresses in ping's replies: "64 bytes from fe80::1%rail0: icmp_seq=1 ttl=64 …".
fn answering(stdout: &str) -> Vec<String> {
    let mut found: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.split(" from ").nth(1)?.split_whitespace().next())
        .filter_map(|a| a.trim_end_matches(':').split('%').next())
        .map(str::to_ascii_lowercase)
        .filter(|a| a.starts_with("fe80:"))
        .collect();
    found.sort();
    found.dedup();
    found
}

/// A private directory for one probe's known_hosts files, removed with it.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Fallible<Self> {
        use std::os::unix::fs::DirBuilderExt;
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("enverge-probe-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("a scratch directory: {e}"))?;
        Ok(Scratch(dir))
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The logins of one probe: each machine logged into once, reused for the addresses it holds.
struct Logins {
    user: Option<String>,
    password_file: Option<PathBuf>,
    keys: Vec<PathBuf>,
    known: Vec<Machine>,
    /// How each machine logged into is reached again (by hardware_id): the walk looks from it.
    hosts: BTreeMap<String, SshHost>,
    dir: Scratch,
    n: usize,
}

impl Logins {
    fn new(p: &CableProbe) -> Fallible<Self> {
        let file = p.login_file();
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let user = text
            .lines()
            .next()
            .map(|u| u.trim().to_owned())
            .filter(|u| !u.is_empty());
        // The peer user's existing keys first (NVIDIA's guide has matching users), then the
        // lent password.
        let mut keys = Vec::new();
        if let Some(u) = &user
            && let Ok(Some(home)) = crate::host::home_of(&mut LocalHost::default(), u)
        {
            for k in ["id_ed25519", "id_ecdsa", "id_rsa"] {
                let path = Path::new(&home).join(".ssh").join(k);
                if path.exists() {
                    keys.push(path);
                }
            }
        }
        Ok(Logins {
            password_file: (text.lines().nth(1).is_some()).then_some(file),
            user,
            keys,
            known: Vec::new(),
            hosts: BTreeMap::new(),
            dir: Scratch::new()?,
            n: 0,
        })
    }

    /// ENVERGE_PEER_ADDR: node1 named outright, logged into first.
    fn named(&mut self, addr: &str) -> Fallible<()> {
        match self.login(addr) {
            Login::Machine(m) => {
                self.known.push(*m);
                Ok(())
            }
            Login::Refused => Err(format!("{PEER_ADDR_ENV}={addr} refused the login")),
            Login::Unreachable(why) => Err(format!("{PEER_ADDR_ENV}={addr}: {why}")),
        }
    }

    fn at(&mut self, addr: &str, iface: &str) -> Login {
        if let Some(m) = self
            .known
            .iter()
            .find(|m| m.ports.iter().any(|(_, a)| a.iter().any(|x| x == addr)))
        {
            return Login::Machine(Box::new(m.clone()));
        }
        let login = self.login(&probe::scoped(addr, iface));
        if let Login::Machine(m) = &login {
            self.known.push(m.as_ref().clone());
        }
        login
    }

    fn ssh(&mut self, addr: &str, key: Option<&Path>, known: &Path) -> SshHost {
        SshHost {
            node: 1,
            user: self.user.clone().unwrap_or_default(),
            addr: addr.to_owned(),
            key: key.map_or_else(|| self.dir.path().join("none"), Path::to_path_buf),
            known_hosts: known.to_path_buf(),
            port: 22,
            lxd_socket: String::new(),
            // sudo reads the password on stdin even after a key login.
            password_file: self.password_file.clone(),
            host_key_alias: Some("enverge-probe".into()),
            control_path: Some(self.dir.path().join(format!("cm-{}", self.n))),
            proxy: None,
        }
    }

    /// Log in at `addr`: its host key read over the wire first and held to, then the keys,
    /// then the password. A login that works reads the machine (its identity, its ports, its
    /// management address) and pins its rails' link-local (peer-prep on node1).
    fn login(&mut self, addr: &str) -> Login {
        self.login_via(addr, None)
    }

    /// [`Logins::login`], through `via` when given: `addr` is then as `via` sees it, its host
    /// key read there, across the cable.
    fn login_via(&mut self, addr: &str, via: Option<&SshHost>) -> Login {
        if self.user.is_none() {
            return Login::Refused;
        }
        let keyscan = ["ssh-keyscan", "-T", "5", "-t", "ed25519", addr];
        let scan = match via {
            None => LocalHost::default().run(&keyscan, None),
            Some(v) => v.clone().run(&keyscan, None),
        };
        let scan = match scan {
            Ok(o) => o,
            Err(e) => return Login::Unreachable(e),
        };
        let Some(host_key) = scan.stdout.lines().find_map(|l| {
            let mut w = l.split_whitespace();
            w.next()?;
            let (t, k) = (w.next()?, w.next()?);
            (t == "ssh-ed25519").then(|| format!("{t} {k}"))
        }) else {
            return Login::Unreachable(format!("{addr}: no SSH host key answered"));
        };
        self.n += 1;
        let known = self.dir.path().join(format!("known-{}", self.n));
        if let Err(e) = std::fs::write(&known, format!("enverge-probe {host_key}\n")) {
            return Login::Unreachable(e.to_string());
        }
        let mut tries: Vec<Option<PathBuf>> = self.keys.iter().cloned().map(Some).collect();
        if self.password_file.is_some() {
            tries.push(None);
        }
        let mut last = Login::Refused;
        for key in tries {
            let mut host = self.ssh(addr, key.as_deref(), &known);
            if let Some(v) = via {
                host.proxy = Some(v.proxy_to(addr));
                host.control_path = None;
            }
            match host.run(&["true"], None) {
                Ok(o) if o.ok() => {
                    let login = read_machine(&mut host, host_key);
                    if let Login::Machine(m) = &login
                        && let Some(hw) = m.report.hardware_id.clone()
                    {
                        self.hosts.entry(hw).or_insert(host);
                    }
                    return login;
                }
                // Logged in, but sudo refused: not a login node0 can prepare with.
                Ok(_) => last = Login::Refused,
                Err(e) if e.contains("Permission denied") => last = Login::Refused,
                Err(e) => last = Login::Unreachable(e),
            }
        }
        last
    }

    /// The ring's walk (K2 note 3): from each machine on the cables — node0's neighbours
    /// (`linked`, by hardware_id) first — listen on each of its rail ports, and log in one
    /// hop through it at every address no machine already logged into holds; what answers is
    /// walked in turn, until nothing new answers. What each machine heard goes on it, and the
    /// machines beyond node0's cables into `obs.beyond`; the pure probe then keeps only what
    /// the cables join to node0.
    fn walk(&mut self, obs: &mut Observation, linked: &[String]) -> Fallible<()> {
        let mut queue: Vec<String> = linked.to_vec();
        let mut heard: BTreeMap<String, Vec<PortSeen>> = BTreeMap::new();
        let mut beyond: Vec<String> = Vec::new();
        while let Some(hw) = queue.pop() {
            if heard.contains_key(&hw) {
                continue;
            }
            let (Some(host), Some(m)) = (
                self.hosts.get(&hw).cloned(),
                self.known
                    .iter()
                    .find(|m| m.report.hardware_id.as_ref() == Some(&hw))
                    .cloned(),
            ) else {
                continue;
            };
            let mut host = host;
            let mut ports = Vec::new();
            for r in &m.report.rails {
                let answered = all_nodes(&mut host, &r.iface)?;
                let carrier =
                    read_string(&mut host, &format!("/sys/class/net/{}/carrier", r.iface))?
                        .is_some_and(|c| c.trim() == "1");
                for a in &answered {
                    let held = obs.own.iter().any(|(_, o)| o.eq_ignore_ascii_case(a))
                        || self.known.iter().any(|k| {
                            k.ports
                                .iter()
                                .any(|(_, x)| x.iter().any(|x| x.eq_ignore_ascii_case(a)))
                        });
                    if held {
                        continue;
                    }
                    if let Login::Machine(found) =
                        self.login_via(&probe::scoped(a, &r.iface), Some(&host))
                        && let Some(id) = found.report.hardware_id.clone()
                        && !self
                            .known
                            .iter()
                            .any(|k| k.report.hardware_id.as_ref() == Some(&id))
                    {
                        println!(
                            "byo-agent: reached {a} across {}'s {} (no cable of node0's goes there)",
                            m.mgmt_addr.as_deref().unwrap_or(&host.addr),
                            r.iface
                        );
                        self.known.push(*found);
                        beyond.push(id.clone());
                        queue.push(id);
                    }
                }
                ports.push(PortSeen {
                    iface: r.iface.clone(),
                    device: r.device.clone(),
                    mtu: r.mtu,
                    active_mtu: r.active_mtu,
                    carrier,
                    answered,
                });
            }
            heard.insert(hw, ports);
        }
        for login in obs.logins.values_mut() {
            if let Login::Machine(m) = login
                && let Some(hw) = &m.report.hardware_id
                && let Some(h) = heard.get(hw)
            {
                m.heard = h.clone();
            }
        }
        obs.beyond = beyond
            .iter()
            .filter_map(|hw| {
                let mut m = self
                    .known
                    .iter()
                    .find(|k| k.report.hardware_id.as_ref() == Some(hw))?
                    .clone();
                m.heard = heard.get(hw).cloned().unwrap_or_default();
                Some(m)
            })
            .collect();
        Ok(())
    }

    /// The management-LAN fallback (mDNS `_ssh._tcp`, then ARP on the uplink): log into each
    /// machine found there and pin its rails' link-local, so its cables can answer. It only
    /// wakes: a machine is a peer only if the cables then find it. Returns how many woke.
    fn wake_over_lan(&mut self, node0: &mut LocalHost) -> Fallible<usize> {
        let mut candidates = Vec::new();
        if let Ok(o) = node0.run(&["avahi-browse", "-rpt", "_ssh._tcp"], None) {
            for l in o.stdout.lines().filter(|l| l.starts_with('=')) {
                if let Some(a) = l.split(';').nth(7) {
                    candidates.push(a.to_owned());
                }
            }
        }
        candidates.extend(arp_neighbours(node0)?);
        candidates.sort();
        candidates.dedup();
        let mut woken = 0;
        for addr in candidates {
            if let Login::Machine(m) = self.login(&addr) {
                println!(
                    "byo-agent: woke {addr} over the management LAN (its rails pinned to link-local)"
                );
                self.known.push(*m);
                woken += 1;
            }
        }
        Ok(woken)
    }
}

/// The uplink's IPv4 neighbours after one sweep of its subnet (ARP), the gateway left out.
fn arp_neighbours(h: &mut LocalHost) -> Fallible<Vec<String>> {
    let route = must(h, &["ip", "-j", "-4", "route", "show", "default"])?;
    let v: Value = serde_json::from_str(&route).map_err(|e| e.to_string())?;
    let Some(dev) = v[0]["dev"].as_str().map(str::to_owned) else {
        return Ok(Vec::new());
    };
    let gateway = v[0]["gateway"].as_str().unwrap_or_default().to_owned();
    let nets = crate::host::ipv4_networks(h)?;
    let Some((_, net)) = nets.iter().find(|(i, _)| *i == dev) else {
        return Ok(Vec::new());
    };
    let (ip, len) = net.split_once('/').ok_or("an address without a prefix")?;
    let len: u32 = len.parse().map_err(|_| "a prefix that does not parse")?;
    let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| "an address that does not parse")?;
    // A /22 at most: a sweep of one ping per address, all at once.
    if len >= 22 {
        let base = u32::from(ip) & (u32::MAX << (32 - len));
        let hosts = (1..(1u32 << (32 - len)) - 1)
            .map(|i| std::net::Ipv4Addr::from(base + i).to_string())
            .filter(|a| *a != ip.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let script =
            format!("for a in {hosts}; do ping -c1 -W1 -n \"$a\" >/dev/null 2>&1 & done; wait");
        h.run(&["sh", "-c", &script], None)?;
    }
    let out = must(h, &["ip", "-j", "-4", "neigh", "show", "dev", &dev])?;
    let v: Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter(|n| {
            n["state"]
                .as_array()
                .is_none_or(|s| !s.iter().any(|x| x == "FAILED" || x == "INCOMPLETE"))
        })
        .filter_map(|n| n["dst"].as_str().map(str::to_owned))
        .filter(|a| *a != gateway)
        .collect())
}

/// A machine as logging in shows it: detect's report, its ports' link-local addresses, its
/// management address; its rails pinned to link-local (the one pre-enrol write on node1).
fn read_machine(host: &mut SshHost, host_key: String) -> Login {
    let report = {
        let probe = HostProbe(std::cell::RefCell::new(&mut *host));
        crate::detect::detect(&probe)
    };
    let rails: Vec<String> = report.rails.iter().map(|r| r.iface.clone()).collect();
    match peer_prep(host, &rails) {
        Ok(changes) => {
            for c in changes {
                println!("byo-agent: peer-prep on {}: {c}", host.addr);
            }
        }
        Err(e) => eprintln!("byo-agent: peer-prep on {}: {e}", host.addr),
    }
    // Tentative ones too: a port peer-prep just bounced still holds its address.
    let ports = match addresses(host, true) {
        Ok(m) => m.into_iter().collect(),
        Err(e) => return Login::Unreachable(e),
    };
    let mgmt_addr = must(host, &["ip", "-j", "-4", "route", "get", "1.0.0.1"])
        .ok()
        .and_then(|o| serde_json::from_str::<Value>(&o).ok())
        .and_then(|v| v[0]["prefsrc"].as_str().map(str::to_owned));
    Login::Machine(Box::new(Machine {
        report,
        host_key,
        mgmt_addr,
        ports,
        heard: Vec::new(),
    }))
}

/// What a decision is, as JSON for `byo-agent probe-cables` (and the tests on the bed).
pub fn decision_json(d: &Decision) -> Value {
    let verdicts = |vs: &[(String, probe::PortVerdict)]| -> Value {
        vs.iter()
            .map(|(i, v)| {
                let kind = match v {
                    probe::PortVerdict::Link { .. } => "link",
                    probe::PortVerdict::Lan { .. } => "lan",
                    probe::PortVerdict::LoginFailed => "login_failed",
                    probe::PortVerdict::Unreachable => "unreachable",
                    probe::PortVerdict::Looped { .. } => "looped",
                    probe::PortVerdict::SelfPair => "self_pair",
                    probe::PortVerdict::Silent => "silent",
                    probe::PortVerdict::NoCable => "no_cable",
                };
                let mut o = serde_json::json!({"kind": kind, "says": v.to_string(),
                    "machines": v.machines()});
                if let probe::PortVerdict::Link { remote, .. } = v {
                    o["remote"] = serde_json::json!(remote);
                }
                (i.clone(), o)
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    match d {
        Decision::Enroll(f) => serde_json::json!({
            "decision": "enroll",
            "ports": verdicts(&f.verdicts),
            "rails": f.rails,
            "peers": f.peers,
            "peer_file": f.peer_file,
        }),
        Decision::Retry { retry, verdicts: v } => serde_json::json!({
            "decision": "retry",
            "why": retry.to_string(),
            "ports": verdicts(v),
        }),
    }
}
