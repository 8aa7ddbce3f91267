//! Relays on this machine, for `byo up` (as root) and the golden-path test: each relay is a
//! network namespace behind a veth pair, configured from the very values host-provision put
//! in its bootstrap — its WireGuard key and peer, its ssh_mapd token's hash — running what a
//! GCP relay runs: wireguard-go as wg0's stand-in, `byo-relay serve` (ssh_mapd driving the
//! LOFISPARK_VMSSH chain in nftables) and Caddy in front of the host agent's API on :8080.
//! A customer's plain `ssh root@<public>` from this machine reaches the DNAT exactly as it
//! would on GCP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use byo_server::providers::{ProviderError, RelayInfo, RelayProvider};
use futures::future::BoxFuture;

/// What a relay namespace needs installed; `missing` names what is not.
pub const TOOLS: &[&str] = &["ip", "nft", "wg", "wireguard-go", "caddy"];

pub fn missing_tools() -> Vec<&'static str> {
    TOOLS
        .iter()
        .copied()
        .filter(|t| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {t}")])
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .collect()
}

fn run(cmd: &mut Command) -> Result<String, ProviderError> {
    let out = cmd
        .output()
        .map_err(|e| ProviderError(format!("local relay: {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ProviderError(format!(
            "local relay: {:?} failed: {}",
            cmd,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// One relay: its namespace, its public address and the daemons in it.
#[derive(Debug)]
pub struct LocalRelay {
    pub netns: String,
    pub public: String,
    pub wg: String,
    veth: String,
    token_hash: PathBuf,
    relay_bin: PathBuf,
    mapd: Mutex<Option<Child>>,
    others: Mutex<Vec<Child>>,
}

impl LocalRelay {
    fn exec(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns, program]);
        c
    }

    fn spawn(
        &self,
        program: &str,
        args: &[&str],
        env: &[(&str, &Path)],
    ) -> Result<Child, ProviderError> {
        let mut c = self.exec(program);
        c.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        c.spawn()
            .map_err(|e| ProviderError(format!("local relay: starting {program}: {e}")))
    }

    /// ssh_mapd, on 10.8.0.1:8754 inside the tunnel.
    pub fn start_mapd(&self) -> Result<(), ProviderError> {
        let bin = self.relay_bin.to_string_lossy().into_owned();
        let hash = self.token_hash.to_string_lossy().into_owned();
        let child = self.spawn(
            &bin,
            &[
                "serve",
                "--listen",
                "10.8.0.1:8754",
                "--token-hash-file",
                &hash,
                "--host",
                "10.8.0.2",
                "--tunnel",
                &self.wg,
            ],
            &[],
        )?;
        *self.mapd.lock().expect("mapd lock") = Some(child);
        Ok(())
    }

    /// What a relay that restarted looks like: ssh_mapd gone and back, the table empty.
    pub fn restart_mapd(&self) -> Result<(), ProviderError> {
        if let Some(mut c) = self.mapd.lock().expect("mapd lock").take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self
            .exec("nft")
            .args(["delete", "table", "ip", "lofispark"])
            .output();
        self.start_mapd()
    }

    /// The DNAT map as the kernel holds it.
    pub fn kernel_map(&self) -> String {
        self.exec("nft")
            .args(["list", "map", "ip", "lofispark", "vmssh_ports"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

impl Drop for LocalRelay {
    fn drop(&mut self) {
        for c in self
            .mapd
            .lock()
            .expect("mapd lock")
            .take()
            .into_iter()
            .chain(self.others.lock().expect("children lock").drain(..))
        {
            let mut c = c;
            let _ = c.kill();
            let _ = c.wait();
        }
        // wireguard-go daemonised itself: every process left in the namespace goes.
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.netns])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).output();
            }
        }
        let _ = Command::new("ip")
            .args(["link", "delete", &self.veth])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .output();
    }
}

/// The provider: one namespace per slug, each on its own 10.98.N.0/24 (the relay at .2).
#[derive(Debug)]
pub struct NetnsRelays {
    pub dir: PathBuf,
    pub relay_bin: PathBuf,
    pub relays: Mutex<BTreeMap<String, Arc<LocalRelay>>>,
    next: Mutex<u32>,
}

fn bootstrap_value<'a>(script: &'a str, prefix: &str) -> Result<&'a str, ProviderError> {
    script
        .lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .map(str::trim)
        .ok_or_else(|| ProviderError(format!("local relay: the bootstrap has no {prefix:?}")))
}

impl NetnsRelays {
    pub fn new(dir: PathBuf, relay_bin: PathBuf) -> Self {
        NetnsRelays {
            dir,
            relay_bin,
            relays: Mutex::default(),
            // Two processes on one machine (byo up and a test) take different /24s.
            next: Mutex::new(1 + (std::process::id() % 50) * 5),
        }
    }

    pub fn relay(&self, slug: &str) -> Option<Arc<LocalRelay>> {
        self.relays.lock().expect("relays lock").get(slug).cloned()
    }

    fn build(&self, slug: &str, bootstrap: &str) -> Result<LocalRelay, ProviderError> {
        let n = {
            let mut next = self.next.lock().expect("next lock");
            let n = *next;
            *next += 1;
            n
        };
        let tag = format!("{}x{n}", std::process::id() % 10_000);
        let (netns, veth, inner) = (
            format!("byo-relay-{tag}"),
            format!("brl{tag}"),
            format!("brr{tag}"),
        );
        let public = format!("10.98.{n}.2");
        run(Command::new("ip").args(["netns", "add", &netns]))?;
        let dir = self.dir.join(slug);
        std::fs::create_dir_all(&dir).map_err(|e| ProviderError(format!("local relay: {e}")))?;
        let wg = format!("wgr{tag}");
        let token_hash = dir.join("ssh-map-token.sha256");
        let relay = LocalRelay {
            netns: netns.clone(),
            public: public.clone(),
            wg: wg.clone(),
            veth: veth.clone(),
            token_hash: token_hash.clone(),
            relay_bin: self.relay_bin.clone(),
            mapd: Mutex::default(),
            others: Mutex::default(),
        };
        run(
            Command::new("ip").args(["link", "add", &veth, "type", "veth", "peer", "name", &inner])
        )?;
        run(Command::new("ip").args(["link", "set", &inner, "netns", &netns]))?;
        run(Command::new("ip").args(["addr", "add", &format!("10.98.{n}.1/24"), "dev", &veth]))?;
        run(Command::new("ip").args(["link", "set", &veth, "up"]))?;
        let setup = format!(
            "ip link set lo up && ip addr add {public}/24 dev {inner} && ip link set {inner} up && ip route add default via 10.98.{n}.1 && sysctl -q -w net.ipv4.ip_forward=1"
        );
        run(relay.exec("sh").args(["-c", &setup]))?;
        let conf = dir.join("wg.conf");
        std::fs::write(
            &conf,
            format!(
                "[Interface]\nPrivateKey = {}\nListenPort = 51820\n\n[Peer]\nPublicKey = {}\nAllowedIPs = 10.8.0.2/32\n",
                bootstrap_value(bootstrap, "PrivateKey = ")?,
                bootstrap_value(bootstrap, "PublicKey = ")?
            ),
        )
        .map_err(|e| ProviderError(format!("local relay: {e}")))?;
        let wg_up = format!(
            "wireguard-go {wg} && wg setconf {wg} {conf} && ip addr add 10.8.0.1/24 dev {wg} && ip link set {wg} up",
            conf = conf.display()
        );
        run(relay.exec("sh").args(["-c", &wg_up]))?;
        let hash = bootstrap
            .lines()
            .find_map(|l| {
                l.strip_prefix("echo '")
                    .and_then(|r| r.split_once("' > /etc/byo-relay/ssh-map-token.sha256"))
                    .map(|(h, _)| h.to_owned())
            })
            .ok_or_else(|| ProviderError("local relay: the bootstrap has no token hash".into()))?;
        std::fs::write(&token_hash, format!("{hash}\n"))
            .map_err(|e| ProviderError(format!("local relay: {e}")))?;
        // Caddy in front of the agent's API, as the bootstrap's Caddyfile has it.
        let caddy = relay.spawn(
            "caddy",
            &[
                "reverse-proxy",
                "--from",
                "http://:8080",
                "--to",
                "10.8.0.2:8080",
            ],
            &[
                ("HOME", &dir),
                ("XDG_DATA_HOME", &dir),
                ("XDG_CONFIG_HOME", &dir),
            ],
        )?;
        relay.others.lock().expect("children lock").push(caddy);
        relay.start_mapd()?;
        Ok(relay)
    }
}

impl RelayProvider for NetnsRelays {
    fn provision<'a>(
        &'a self,
        slug: &'a str,
        bootstrap: Option<&'a str>,
    ) -> BoxFuture<'a, Result<RelayInfo, ProviderError>> {
        Box::pin(async move {
            let name = format!("{slug}-relay");
            if let Some(r) = self.relay(slug) {
                return Ok(RelayInfo {
                    name,
                    address: r.public.clone(),
                });
            }
            let bootstrap = bootstrap
                .ok_or_else(|| ProviderError("local relay: no bootstrap was rendered".into()))?
                .to_owned();
            let slug_owned = slug.to_owned();
            // Namespaces and daemons: blocking work, off the async workers.
            let relay = tokio::task::block_in_place(|| self.build(&slug_owned, &bootstrap))?;
            let address = relay.public.clone();
            self.relays
                .lock()
                .expect("relays lock")
                .insert(slug.to_owned(), Arc::new(relay));
            tracing::info!(%slug, %address, "local relay up");
            Ok(RelayInfo { name, address })
        })
    }

    fn release<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.relays.lock().expect("relays lock").remove(slug);
            Ok(())
        })
    }
}
