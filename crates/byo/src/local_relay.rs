//! Relays on this machine, for `byo up` (as root) and the tests: each relay is a Debian
//! system container in LXD standing in for the Compute Engine VM, booted the one way a relay
//! is booted — by the exact script host-provision rendered, run as the instance's startup
//! script at first boot and again at every boot, as Compute Engine's guest agent runs it.
//! The container is `<prefix><slug>-relay` with a fixed address on the LXD bridge standing in
//! for the reserved external IP (`10.231.0.200`–`.254`; DHCP hands out only addresses below).
//! The script installs WireGuard (wireguard-go where the kernel has no module), nftables and
//! Caddy from Debian, fetches the relay daemon from the URL it carries and checks its sha256,
//! and brings up the tunnel, ssh_mapd, the seeded chain and Caddy on :443 with the relay's
//! certificate. Nothing here configures a relay by hand.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use byo_server::providers::{ProviderError, RelayInfo, RelayProvider};
use futures::future::BoxFuture;

/// The image and profile `scripts/lxd` sets up: the bridge, /dev/net/tun, a Debian with
/// systemd.
pub const IMAGE: &str = "byo-debian-host";
pub const PROFILE: &str = "byo-test-host";
pub const BRIDGE: &str = "byotestbr0";
/// Where relays' fixed addresses come from on the bridge (10.231.0.0/24).
const FIRST: u8 = 200;
const LAST: u8 = 254;

/// Where the startup script is kept in the container, and the unit that runs it at every
/// boot: the guest agent's part, not ours.
const STARTUP_SCRIPT: &str = "/var/lib/byo-relay-metadata/startup-script";
const STARTUP_UNIT: &str = "byo-startup-script.service";
const STARTUP_UNIT_TEXT: &str = "[Unit]\nDescription=Run the instance's startup-script (Compute Engine's guest agent, for a local relay)\nWants=network-online.target\nAfter=network-online.target\n\n[Service]\nType=oneshot\nExecStart=/bin/bash /var/lib/byo-relay-metadata/startup-script\n\n[Install]\nWantedBy=multi-user.target\n";

/// What LXD relays need on this machine; what is missing, named.
pub fn missing() -> Vec<String> {
    let ok = |args: &[&str]| {
        Command::new("lxc")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ok(&["query", "/1.0"]) {
        return vec!["LXD (run scripts/lxd)".into()];
    }
    let mut out = Vec::new();
    if !ok(&["image", "info", IMAGE]) {
        out.push(format!("the {IMAGE} image (run scripts/lxd)"));
    }
    if !ok(&["profile", "show", PROFILE]) {
        out.push(format!("the {PROFILE} profile (run scripts/lxd)"));
    }
    out
}

fn lxc(args: &[&str]) -> Result<String, ProviderError> {
    let run = || {
        Command::new("lxc")
            .args(args)
            .output()
            .map_err(|e| ProviderError(format!("local relay: running lxc: {e}")))
    };
    let mut out = run()?;
    // A file push into a just-made container can meet LXD stopping its forkfile helper
    // (canonical/lxd#18403); the same call made again starts a new one. Three tries, as the
    // agent's pushes (byo-agent's `lxd::push`).
    for _ in 1..3 {
        if out.status.success() || !String::from_utf8_lossy(&out.stderr).contains("forkfile.sock") {
            break;
        }
        out = run()?;
    }
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(ProviderError(format!(
            "local relay: `lxc {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// One relay: its container and its public address.
#[derive(Debug)]
pub struct LxdRelay {
    pub container: String,
    pub public: String,
}

impl LxdRelay {
    /// A command run inside the relay.
    pub fn exec(&self, argv: &[&str]) -> Command {
        let mut c = Command::new("lxc");
        c.args(["exec", &self.container, "--"]).args(argv);
        c
    }

    /// A reboot, as the VM would have one: the startup script runs again. A clean restart
    /// first; one whose shutdown does not finish (seen under load: LXD's "shutting down the
    /// container failed") is forced, as a VM's reset does not wait on its guest either.
    pub fn reboot(&self) -> Result<(), ProviderError> {
        match lxc(&["restart", "--timeout", "60", &self.container]) {
            Ok(_) => Ok(()),
            Err(clean) => {
                tracing::warn!(relay = %self.container, error = %clean, "the relay's clean restart failed; forcing it");
                lxc(&["restart", "--force", &self.container]).map(drop)
            }
        }
    }

    /// Wait until the startup script has finished since the relay last booted, and say how
    /// long that took from now; the script's log when it failed or did not finish.
    pub fn wait_booted(&self, within: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let out = self
                .exec(&[
                    "systemctl",
                    "show",
                    STARTUP_UNIT,
                    "-p",
                    "ActiveState,Result,ExecMainExitTimestampMonotonic",
                ])
                .output()
                .map_err(|e| e.to_string())?;
            let shown = String::from_utf8_lossy(&out.stdout);
            let value = |key: &str| {
                shown
                    .lines()
                    .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                    .unwrap_or("")
                    .to_owned()
            };
            // A oneshot without RemainAfterExit is inactive both before and after it ran; the
            // exit time is set only once it ran in this boot.
            let ran = value("ExecMainExitTimestampMonotonic")
                .parse::<u64>()
                .unwrap_or(0)
                > 0;
            match (value("ActiveState").as_str(), value("Result").as_str()) {
                ("inactive", "success") if ran => {
                    return Ok(started.elapsed());
                }
                ("failed", _) => {
                    return Err(format!(
                        "the startup script failed:\n{}",
                        self.bootstrap_log()
                    ));
                }
                _ => {}
            }
            if started.elapsed() > within {
                return Err(format!(
                    "the startup script did not finish within {within:?}:\n{}",
                    self.bootstrap_log()
                ));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The startup script's own log, every boot's.
    pub fn bootstrap_log(&self) -> String {
        self.exec(&["cat", "/var/log/byo-relay-bootstrap.log"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The DNAT map as the relay's kernel holds it.
    pub fn kernel_map(&self) -> String {
        self.exec(&["nft", "list", "map", "ip", "lofispark", "vmssh_ports"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }
}

/// The provider: one container per slug.
#[derive(Debug)]
pub struct LxdRelays {
    /// Put before every container name, so two installations on one machine (byo up and a
    /// test) never share one.
    prefix: String,
    relays: Mutex<BTreeMap<String, Arc<LxdRelay>>>,
}

impl LxdRelays {
    pub fn new(prefix: &str) -> Self {
        LxdRelays {
            prefix: prefix.to_owned(),
            relays: Mutex::default(),
        }
    }

    pub fn relay(&self, slug: &str) -> Option<Arc<LxdRelay>> {
        self.relays.lock().expect("relays lock").get(slug).cloned()
    }

    fn container(&self, slug: &str) -> String {
        format!("{}{slug}-relay", self.prefix)
    }

    /// Every relay address the bridge's containers hold or are promised.
    fn taken() -> Result<Vec<Ipv4Addr>, ProviderError> {
        let listed = lxc(&["list", "--format", "json"])?;
        let all: serde_json::Value = serde_json::from_str(&listed)
            .map_err(|e| ProviderError(format!("local relay: lxc list: {e}")))?;
        let mut taken = Vec::new();
        for c in all.as_array().into_iter().flatten() {
            let fixed = c["expanded_devices"]["eth0"]["ipv4.address"].as_str();
            taken.extend(fixed.and_then(|a| a.parse::<Ipv4Addr>().ok()));
            let nets = &c["state"]["network"];
            for net in nets.as_object().into_iter().flat_map(|o| o.values()) {
                for a in net["addresses"].as_array().into_iter().flatten() {
                    taken.extend(
                        a["address"]
                            .as_str()
                            .and_then(|a| a.parse::<Ipv4Addr>().ok()),
                    );
                }
            }
        }
        Ok(taken)
    }

    /// Create the relay's container with a fixed address and its startup script, and boot
    /// it. The script runs in the background, as on a VM: this returns once it is booting.
    fn build(&self, slug: &str, script: &str) -> Result<LxdRelay, ProviderError> {
        let container = self.container(slug);
        if let Ok(shown) = lxc(&[
            "config",
            "device",
            "get",
            &container,
            "eth0",
            "ipv4.address",
        ]) {
            // Made before (byo up restarted): it keeps its address and boots itself.
            let public = shown.trim().to_owned();
            let _ = lxc(&["start", &container]);
            return Ok(LxdRelay { container, public });
        }
        let taken = Self::taken()?;
        let public = (FIRST..=LAST)
            .map(|n| Ipv4Addr::new(10, 231, 0, n))
            .find(|a| !taken.contains(a))
            .ok_or_else(|| ProviderError("local relay: every relay address is taken".into()))?
            .to_string();
        lxc(&["init", IMAGE, &container, "--profile", PROFILE])?;
        let made = (|| {
            lxc(&[
                "config",
                "device",
                "override",
                &container,
                "eth0",
                &format!("ipv4.address={public}"),
            ])?;
            let dir =
                tempfile::tempdir().map_err(|e| ProviderError(format!("local relay: {e}")))?;
            let push = |name: &str, text: &str, to: &str, mode: &str| {
                let local = dir.path().join(name);
                std::fs::write(&local, text)
                    .map_err(|e| ProviderError(format!("local relay: {e}")))?;
                lxc(&[
                    "file",
                    "push",
                    "--create-dirs",
                    "--mode",
                    mode,
                    &local.to_string_lossy(),
                    &format!("{container}{to}"),
                ])
                .map(drop)
            };
            push("startup-script", script, STARTUP_SCRIPT, "0700")?;
            push(
                "unit",
                STARTUP_UNIT_TEXT,
                &format!("/etc/systemd/system/{STARTUP_UNIT}"),
                "0644",
            )?;
            // A Compute Engine Debian image has no ufw and no Docker (the host image this
            // container is made from has both, as an owner's Spark does).
            push("ufw.conf", "ENABLED=no\n", "/etc/ufw/ufw.conf", "0644")?;
            lxc(&["start", &container])?;
            let relay = LxdRelay {
                container: container.clone(),
                public: public.clone(),
            };
            // systemctl needs the container's systemd up (its bus), not the boot finished.
            let started = Instant::now();
            while !relay
                .exec(&["systemctl", "is-system-running"])
                .output()
                .is_ok_and(|o| {
                    let s = String::from_utf8_lossy(&o.stdout);
                    ["running", "degraded", "starting"].contains(&s.trim())
                })
            {
                if started.elapsed() > Duration::from_secs(60) {
                    return Err(ProviderError(format!(
                        "local relay: {container}'s systemd did not come up within 60 s"
                    )));
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            let out = relay
                .exec(&[
                    "sh",
                    "-c",
                    &format!(
                        "systemctl disable --now docker.service docker.socket >/dev/null 2>&1; \
                         systemctl enable {STARTUP_UNIT} && systemctl start --no-block {STARTUP_UNIT}"
                    ),
                ])
                .output()
                .map_err(|e| ProviderError(format!("local relay: {e}")))?;
            if !out.status.success() {
                return Err(ProviderError(format!(
                    "local relay: enabling the startup script: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            Ok(relay)
        })();
        if made.is_err() {
            let _ = lxc(&["delete", "--force", &container]);
        }
        made
    }

    /// Delete every relay this provider made (byo up on Ctrl-C, a test at its end).
    pub fn remove_all(&self) {
        let relays = std::mem::take(&mut *self.relays.lock().expect("relays lock"));
        for r in relays.values() {
            let _ = lxc(&["delete", "--force", &r.container]);
        }
    }
}

impl RelayProvider for LxdRelays {
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
            let script = bootstrap
                .ok_or_else(|| ProviderError("local relay: no bootstrap was rendered".into()))?
                .to_owned();
            let slug_owned = slug.to_owned();
            // lxc: blocking work, off the async workers.
            let relay = tokio::task::block_in_place(|| self.build(&slug_owned, &script))?;
            let address = relay.public.clone();
            self.relays
                .lock()
                .expect("relays lock")
                .insert(slug.to_owned(), Arc::new(relay));
            tracing::info!(%slug, %address, "local relay booting");
            Ok(RelayInfo { name, address })
        })
    }

    fn release<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let container = self.container(slug);
            self.relays.lock().expect("relays lock").remove(slug);
            tokio::task::block_in_place(|| match lxc(&["delete", "--force", &container]) {
                Err(e) if !e.0.contains("not found") => Err(e),
                _ => Ok(()),
            })
        })
    }
}

/// The container-name prefix of one `byo up` installation: its data directory's digest,
/// so relays of two installations on one machine never collide and a restarted `byo up`
/// finds its own.
pub fn prefix_for(data_dir: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(data_dir.to_string_lossy().as_bytes());
    format!("byo-{}-", &hex::encode(digest)[..8])
}
