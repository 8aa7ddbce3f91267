//! The one schedule serving keeps (133). At start: wait for LXD, restore each instance to
//! its last state, then point the relay (L2). Each beat: read the relay's SSH map and
//! rewrite it when it differs from what the host runs (G note 4, the drift named in the
//! details), check the operator tunnel's unit and the GPU for real, then report host_status
//! with the instances the host holds, which the backend reconciles its rows with.

use std::sync::Arc;
use std::time::Duration;

use byo_core::render::units;
use byo_wire::relay::SshMap;
use byo_wire::vm::{
    BeatDetails, Health, Heartbeat, HeldVm, KeysHeld, MAX_HELD_VMS, RelayDrift, RelayMapCheck,
    RollbackRecord,
};

use crate::host::Host;
use crate::operator_keys::OperatorKeys;
use crate::vms::{RelayMap, VmConfig};

use crate::machines::HandOver;
use crate::vms::VmService;

/// How a drifted relay map is named in the beat's details: what the relay held, as
/// `port->target:port` (at most a few entries).
fn describe_map(map: &SshMap) -> String {
    let entries: Vec<String> = map
        .mappings
        .iter()
        .take(4)
        .map(|e| format!("{}->{}:{}", e.port, e.target, e.target_port))
        .collect();
    if entries.is_empty() {
        "empty".to_owned()
    } else {
        entries.join(",")
    }
}

/// The operator tunnel, actually checked: the unit preparation installs it as
/// ([`units::TUNNEL`]), as systemd has it. Not configured when preparation installed none (the
/// profile has no tunnel). The unit restarts a dying connector for ever (`Restart=always`),
/// so `is-active` alone would read a crash loop as "activating": between restarts
/// (`auto-restart`) it is down.
pub fn tunnel_health<H: Host + ?Sized>(host: &mut H, configured: Option<bool>) -> (Health, String) {
    if configured == Some(false) {
        return (
            Health::NotConfigured,
            "no operator tunnel on this host".to_owned(),
        );
    }
    let argv = [
        "systemctl",
        "show",
        units::TUNNEL,
        "-p",
        "ActiveState",
        "-p",
        "SubState",
    ];
    let shown = match host.run(&argv, None) {
        Ok(out) if out.ok() => out.stdout,
        Ok(out) => {
            return (
                Health::Unknown,
                format!("systemctl: {}", first_line(&out.stderr)),
            );
        }
        Err(e) => return (Health::Unknown, format!("systemctl: {}", first_line(&e))),
    };
    let field = |name: &str| {
        shown
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_default()
            .trim()
            .chars()
            .take(32)
            .collect::<String>()
    };
    let (active, sub) = (field("ActiveState"), field("SubState"));
    let health = match (active.as_str(), sub.as_str(), configured) {
        ("active", _, _) => Health::Ok,
        (_, "auto-restart", _) => Health::Down,
        ("activating" | "reloading", _, _) => Health::Degraded,
        (_, _, Some(true)) => Health::Down,
        // A hand-over that does not say whether a tunnel was installed.
        (_, _, _) => Health::Unknown,
    };
    (health, format!("{}: {active} ({sub})", units::TUNNEL))
}

/// The GPU, actually checked where the profile has one: nvidia-smi lists a GPU.
fn gpu_health<H: Host + ?Sized>(host: &mut H, configured: bool) -> (Health, String) {
    if !configured {
        return (Health::NotConfigured, "the profile has no GPU".to_owned());
    }
    match host.run(&["nvidia-smi", "-L"], None) {
        Ok(out) if out.ok() && out.stdout.contains("GPU") => (Health::Ok, first_line(&out.stdout)),
        Ok(out) => (
            Health::Down,
            format!(
                "nvidia-smi exited {}: {}",
                out.code,
                first_line(&out.stderr)
            ),
        ),
        Err(e) => (Health::Down, format!("nvidia-smi: {}", first_line(&e))),
    }
}

fn first_line(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

/// What a beat reads from the host itself (under the host's lock).
struct Observed {
    lxd_up: bool,
    held: Vec<HeldVm>,
    storage: Health,
    want: Option<Result<SshMap, String>>,
    tunnel: (Health, String),
    gpu: (Health, String),
    /// What enverge-agent-rollback recorded, if it fired since the last install.
    rollback: Option<RollbackRecord>,
    /// The kept operator-key list's version and expiry (#16: the backend sees a host whose
    /// list is about to lapse, or has).
    operator_keys: Option<KeysHeld>,
    /// sshd's accepted logins to spark since the last delivered beat (#16, 5).
    logins: crate::logins::Read,
    /// A pair's or a ring's lockstep this beat (L3): why it is half a pair (empty: whole,
    /// or a single Spark), and the moves that brought a worker back in step.
    half: Vec<String>,
    moved: Vec<String>,
}

fn observe<H: Host + ?Sized>(host: &mut H, config: &VmConfig) -> Observed {
    let lxd_up = crate::lxd::get(host, "/1.0").ok().flatten().is_some();
    let held: Vec<HeldVm> = if lxd_up {
        crate::vms::list(host).unwrap_or_default()
    } else {
        Vec::new()
    };
    let storage = match crate::lxd::get(host, "/1.0/storage-pools/default") {
        Ok(Some(_)) => Health::Ok,
        Ok(None) => Health::Down,
        Err(_) => Health::Unknown,
    };
    let want = lxd_up.then(|| crate::vms::wanted_map(host, config));
    let tunnel = tunnel_health(host, config.tunnel);
    let gpu = gpu_health(host, config.gpu);
    let rollback = host
        .read(crate::rollback::ROLLED_BACK)
        .ok()
        .flatten()
        .and_then(|b| serde_json::from_slice(&b).ok());
    let held_keys = config
        .operator_keys_held
        .as_ref()
        .and_then(|p| host.read(&p.to_string_lossy()).ok().flatten());
    let operator_keys = held_keys
        .as_deref()
        .and_then(|b| byo_core::keylist::SignedList::from_bytes(b).ok())
        .and_then(|s| byo_core::keylist::KeyList::from_canonical(&s.body).ok())
        .map(|l| KeysHeld {
            version: l.version,
            expires: l.expires,
        });
    let logins = crate::logins::read(host, &crate::logins::applied_keys(held_keys.as_deref()));
    // L3: each satellite's LXD asked over the management network, its worker brought in
    // step with the head. Under the host's lock, so it never crosses a create or a delete.
    let (mut half, mut moved) = (Vec::new(), Vec::new());
    if lxd_up && !config.machines.is_single() {
        match crate::vms::head(host) {
            Ok(head) => {
                let (moves, why) = crate::workers::keep(&config.machines, head.as_ref());
                moved = moves.iter().map(ToString::to_string).collect();
                half = why
                    .into_iter()
                    .map(|w| w.chars().take(300).collect())
                    .collect();
            }
            Err(e) => half.push(format!("node0's instances could not be read: {e}")),
        }
    }
    Observed {
        half,
        moved,
        logins,
        operator_keys,
        rollback,
        lxd_up,
        held,
        storage,
        want,
        tunnel,
        gpu,
    }
}

/// The beat's body: what was observed, and the relay's map compared with what the host
/// runs (rewritten when it differs; the drift named in the details). With it, the journal
/// cursor to keep once the beat is delivered.
fn report(seen: Observed, relay: &dyn RelayMap) -> (Heartbeat, Option<String>) {
    let (relay, relay_map, drift) = match seen.want {
        None => (Health::Unknown, RelayMapCheck::Unchecked, None),
        Some(want) => match want
            .and_then(|w| crate::vms::sync_map_drift(relay, &w).map(|had| (had, w)))
        {
            Ok((None, _)) => (Health::Ok, RelayMapCheck::InSync, None),
            Ok((Some(had), runs)) => {
                tracing::warn!("the relay's SSH map differed from what this host runs; rewritten");
                (
                    Health::Ok,
                    RelayMapCheck::DriftRewritten,
                    Some(RelayDrift {
                        relay_had: describe_map(&had),
                        host_runs: describe_map(&runs),
                    }),
                )
            }
            Err(e) => {
                tracing::warn!(error = %e, "the relay's SSH map could not be checked");
                (Health::Down, RelayMapCheck::Unreachable, None)
            }
        },
    };
    let instances = u32::try_from(seen.held.len()).unwrap_or(u32::MAX);
    let vms: Vec<HeldVm> = seen
        .held
        .into_iter()
        .filter(|v| byo_wire::vm::is_instance_name(&v.name))
        .take(MAX_HELD_VMS)
        .collect();
    let beat = Heartbeat {
        agent_version: crate::report::build_version().to_owned(),
        // Half a pair lands on lxd (L3.3: host_status has no column for a pair).
        lxd: match (seen.lxd_up, seen.half.is_empty()) {
            (false, _) => Health::Down,
            (true, false) => Health::Degraded,
            (true, true) => Health::Ok,
        },
        relay,
        tunnel: seen.tunnel.0,
        gpu: seen.gpu.0,
        storage: seen.storage,
        instances,
        details: BeatDetails {
            relay_map: Some(relay_map),
            relay_drift: drift,
            tunnel: Some(seen.tunnel.1),
            gpu: Some(seen.gpu.1),
            rollback: seen.rollback,
            operator_keys: seen.operator_keys,
            operator_logins: Some(seen.logins.logins),
            operator_logins_error: seen.logins.error,
            half_a_pair: (!seen.half.is_empty()).then_some(seen.half),
            lockstep: (!seen.moved.is_empty()).then_some(seen.moved),
            rail_neighbours: None,
        },
        vms,
    };
    (beat, seen.logins.cursor)
}

/// One beat. LXD is read under the host's lock; the relay is asked after it is released,
/// so a relay that does not answer never holds up the VM API.
fn beat(svc: &VmService) -> (Heartbeat, Option<String>) {
    let seen = {
        let mut host = svc.host.lock().unwrap_or_else(|p| p.into_inner());
        observe(&mut *host, &svc.config)
    };
    report(seen, svc.relay.as_ref())
}

/// Step 133 on a pair or a ring: how many machines answer on each of node0's rail ports
/// (the all-nodes multicast; node0's own addresses left out; a satellite's addresses counted
/// as the one machine they are, `known`), for node0's host_nodes.rails. Reads zero on a port
/// whose netdev an instance holds, which is why L3 asks node1's LXD instead. `None` on a
/// single Spark, or when node0's own addresses cannot be read.
pub fn rail_neighbours<H: Host + ?Sized>(
    host: &mut H,
    ports: &[String],
    known: &std::collections::BTreeMap<String, u32>,
) -> Option<std::collections::BTreeMap<String, u64>> {
    if ports.is_empty() {
        return None;
    }
    let own: Vec<String> = crate::cable::link_local(host)
        .ok()?
        .into_values()
        .flatten()
        .collect();
    let mut counts = std::collections::BTreeMap::new();
    for port in ports {
        let answered = crate::cable::all_nodes_unprivileged(host, port).unwrap_or_default();
        let n = byo_core::probe::machines_answering(&answered, &own, known);
        counts.insert(port.clone(), u64::from(n));
    }
    Some(counts)
}

/// The tenant firewall follows the host (issue #36): after each beat, serving keeps the
/// address the backend saw the beat come from (`tenants::WAN_FILE`) and asks root to bring
/// the table to what the host is now (`units::FIREWALL_FLAG`) when that address or the
/// host's networks differ from what it last asked for. Serving's first beat always asks:
/// what changed while it was down is not known. Root re-renders from its own reading of the
/// host and reloads only when the table differs, so asking too often costs a render.
pub struct FirewallWatch {
    pub wan_file: std::path::PathBuf,
    pub flag: std::path::PathBuf,
    /// The networks and address the last request was made for.
    asked: Option<FirewallInputs>,
}

/// What the tenant firewall is rendered from that can change under a running host.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FirewallInputs {
    nets4: Vec<(String, String)>,
    nets6: Vec<(String, String)>,
    wan: Option<std::net::IpAddr>,
}

impl FirewallWatch {
    pub fn new(
        wan_file: impl Into<std::path::PathBuf>,
        flag: impl Into<std::path::PathBuf>,
    ) -> Self {
        FirewallWatch {
            wan_file: wan_file.into(),
            flag: flag.into(),
            asked: None,
        }
    }

    /// After a beat: `seen_from` is what the backend said, `None` when the beat did not land
    /// or the backend said nothing (then the address kept stands). `Ok(true)` when root was
    /// asked.
    pub fn after_beat<H: Host + ?Sized>(
        &mut self,
        host: &mut H,
        seen_from: Option<std::net::IpAddr>,
    ) -> Result<bool, String> {
        let kept = std::fs::read_to_string(&self.wan_file)
            .ok()
            .and_then(|t| t.trim().parse::<std::net::IpAddr>().ok());
        if let Some(seen) = seen_from
            && kept != Some(seen)
        {
            std::fs::write(&self.wan_file, format!("{seen}\n"))
                .map_err(|e| format!("keeping {}: {e}", self.wan_file.display()))?;
        }
        let now = FirewallInputs {
            nets4: crate::host::ipv4_networks(host)?,
            nets6: crate::host::ipv6_networks(host)?,
            wan: seen_from.or(kept),
        };
        if self.asked.as_ref() == Some(&now) {
            return Ok(false);
        }
        std::fs::write(&self.flag, b"requested by serving\n")
            .map_err(|e| format!("asking root at {}: {e}", self.flag.display()))?;
        self.asked = Some(now);
        Ok(true)
    }
}

/// The schedule, on a thread of its own (every call it makes blocks: LXD, the relay, the
/// backend); the async workers only answer the API.
pub fn run(svc: Arc<VmService>, handed: HandOver, keys: OperatorKeys, every: Duration) {
    let restored = {
        let mut host = svc.host.lock().unwrap_or_else(|p| p.into_inner());
        crate::vms::restore(
            &mut *host,
            svc.relay.as_ref(),
            &svc.config,
            Duration::from_secs(300),
        )
    };
    match restored {
        Ok(started) => tracing::info!(?started, "instances restored; the relay points at them"),
        Err(e) => tracing::error!(error = %e, "restoring instances at start failed"),
    }
    let mut reporter = if handed.server.is_empty() {
        None
    } else {
        crate::report::Reporter::new(&handed.server, &handed.host_token).ok()
    };
    let mut firewall = FirewallWatch::new(
        byo_core::render::nft::tenants::WAN_FILE,
        byo_core::render::units::FIREWALL_FLAG,
    );
    // The first beat goes out at once: placement picks only hosts it has heard from.
    loop {
        // The kept list may have expired since the last beat: that is when break glass is
        // admitted, and a list received since ends it (`byo_core::break_glass`).
        match keys.reconcile_through_root(chrono::Utc::now()) {
            Ok(true) => tracing::warn!(
                "root asked to rewrite authorized_keys from the kept operator-key list (its expiry passed, or a new one came)"
            ),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "authorized_keys could not be brought to the kept list")
            }
        }
        let (mut body, cursor) = beat(&svc);
        // Outside the host's lock: a multicast ping waits up to a second a port.
        if let Some(rails) = rail_neighbours(
            &mut crate::host::LocalHost::default(),
            &handed.rail_ports,
            &handed.rail_neighbours,
        ) {
            body.details.rail_neighbours = Some(rails);
        }
        let mut seen_from = None;
        if let Some(r) = reporter.as_mut() {
            match r.heartbeat(&body) {
                Err(e) => tracing::warn!(error = %e, "heartbeat not delivered"),
                // Delivered: the logins it carried are the backend's now.
                Ok(seen) => {
                    seen_from = seen;
                    if let Some(c) = cursor {
                        let mut host = svc.host.lock().unwrap_or_else(|p| p.into_inner());
                        if let Err(e) = crate::logins::delivered(&mut *host, &c) {
                            tracing::warn!(error = %e, "the journal cursor could not be kept");
                        }
                    }
                }
            }
        }
        // A host serving a backend (a prepared one); serving without one is a test's.
        if reporter.is_some() {
            match firewall.after_beat(&mut crate::host::LocalHost::default(), seen_from) {
                Ok(true) => tracing::info!(
                    ?seen_from,
                    "asked root to bring the tenant firewall to the host's networks"
                ),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "the tenant firewall's refresh was not asked for")
                }
            }
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use byo_wire::relay::{MapEntry, MapTarget};

    use serde_json::json;

    use super::*;
    use crate::host::{LxdBody, LxdReply, Output};

    /// A host whose programs answer as told and whose LXD holds `instances`.
    struct FakeHost {
        instances: serde_json::Value,
        /// The tunnel unit's (ActiveState, SubState), `None` when systemctl is missing.
        tunnel: Option<(&'static str, &'static str)>,
        nvidia: Option<Output>,
        /// What enverge-agent-rollback left, if anything.
        rolled_back: Option<&'static str>,
        held_keys: Option<Vec<u8>>,
        /// What `journalctl` prints, and the argv it was last asked with.
        journal: Option<String>,
        journal_asked: Vec<String>,
    }

    impl Host for FakeHost {
        fn run(&mut self, argv: &[&str], _: Option<&[u8]>) -> crate::host::Fallible<Output> {
            match argv {
                [
                    "systemctl",
                    "show",
                    units::TUNNEL,
                    "-p",
                    "ActiveState",
                    "-p",
                    "SubState",
                ] => match self.tunnel {
                    Some((active, sub)) => Ok(Output::success(format!(
                        "ActiveState={active}\nSubState={sub}\n"
                    ))),
                    None => Err("no systemctl".into()),
                },
                ["nvidia-smi", "-L"] => self.nvidia.clone().ok_or_else(|| "not found".into()),
                ["journalctl", ..] => {
                    self.journal_asked = argv.iter().map(|a| a.to_string()).collect();
                    self.journal
                        .clone()
                        .map(Output::success)
                        .ok_or_else(|| "no journal".into())
                }
                _ => Err(format!("unexpected {argv:?}")),
            }
        }
        fn read(&mut self, p: &str) -> crate::host::Fallible<Option<Vec<u8>>> {
            if p == "/var/lib/enverge/operator-keys.signed" {
                return Ok(self.held_keys.clone());
            }
            Ok((p == crate::rollback::ROLLED_BACK)
                .then(|| self.rolled_back.map(|r| r.as_bytes().to_vec()))
                .flatten())
        }
        fn write(&mut self, p: &str, _: &[u8], _: u32, _: &str) -> crate::host::Fallible<()> {
            Err(format!("no writes: {p}"))
        }
        fn remove(&mut self, p: &str) -> crate::host::Fallible<()> {
            Err(format!("no removes: {p}"))
        }
        fn lxd(&mut self, m: &str, path: &str, _: LxdBody<'_>) -> crate::host::Fallible<LxdReply> {
            let body = match (m, path) {
                ("GET", "/1.0") | ("GET", "/1.0/storage-pools/default") => json!({}),
                ("GET", "/1.0/instances?recursion=1") => self.instances.clone(),
                _ => return Err(format!("unexpected {m} {path}")),
            };
            Ok(LxdReply {
                status: 200,
                body: json!({"type": "sync", "metadata": body})
                    .to_string()
                    .into_bytes(),
            })
        }
        fn describe(&self) -> String {
            "fake".into()
        }
    }

    /// A relay holding `map`; what it was told to hold is kept.
    struct Relay {
        map: SshMap,
        put: RefCell<Option<SshMap>>,
    }

    impl RelayMap for Relay {
        fn get(&self) -> crate::host::Fallible<SshMap> {
            Ok(self.map.clone())
        }
        fn put_port(&self, _: u16, _: &MapTarget) -> crate::host::Fallible<()> {
            Err("not used".into())
        }
        fn delete_port(&self, _: u16) -> crate::host::Fallible<()> {
            Err("not used".into())
        }
        fn put(&self, map: &SshMap) -> crate::host::Fallible<()> {
            *self.put.borrow_mut() = Some(map.clone());
            Ok(())
        }
    }

    fn ours(name: &str, status: &str, port: u16) -> serde_json::Value {
        json!({"name": name, "status": status, "config": {"user.enverge.ssh_port": port.to_string()}})
    }

    fn config(tunnel: Option<bool>, gpu: bool) -> VmConfig {
        VmConfig {
            ssh_listen: "10.8.0.2".into(),
            gpu,
            tunnel,
            operator_keys_held: None,
            prepare_lock: None,
            machines: crate::machines::Machines::single(),
            reboot_flag: None,
        }
    }

    fn smi(code: i32, stdout: &str) -> Option<Output> {
        Some(Output {
            code,
            stdout: stdout.into(),
            stderr: "NVIDIA-SMI has failed".into(),
        })
    }

    #[test]
    fn the_beat_lists_what_the_host_holds_and_names_the_relays_drift() {
        let mut host = FakeHost {
            instances: json!([ours("vm-abc12345", "Running", 22000), ours("vm-old00001", "Stopped", 22001),
                              {"name": "lofispark-build", "status": "Stopped", "config": {}}]),
            tunnel: Some(("active", "running")),
            nvidia: None,
            rolled_back: None,
            held_keys: None,
            journal: None,
            journal_asked: Vec::new(),
        };
        // The relay forwards :22 somewhere stale.
        let relay = Relay {
            map: SshMap {
                mappings: vec![MapEntry {
                    port: 22,
                    target: "10.8.0.2".into(),
                    target_port: 22007,
                }],
            },
            put: RefCell::new(None),
        };
        let (beat, _) = report(observe(&mut host, &config(Some(true), false)), &relay);
        let held: Vec<(&str, &str, Option<u16>)> = beat
            .vms
            .iter()
            .map(|v| (v.name.as_str(), v.status.as_str(), v.ssh_port))
            .collect();
        assert_eq!(
            held,
            [
                ("vm-abc12345", "Running", Some(22000)),
                ("vm-old00001", "Stopped", Some(22001))
            ]
        );
        assert_eq!(beat.instances, 2);
        assert_eq!(beat.relay, Health::Ok);
        assert_eq!(beat.details.relay_map, Some(RelayMapCheck::DriftRewritten));
        assert_eq!(
            beat.details.relay_drift,
            Some(RelayDrift {
                relay_had: "22->10.8.0.2:22007".into(),
                host_runs: "22->10.8.0.2:22000".into()
            })
        );
        assert_eq!(
            relay.put.borrow().as_ref().unwrap().mappings[0].target_port,
            22000
        );
        // Again, in sync: nothing named, nothing written.
        let relay = Relay {
            map: relay.put.borrow().clone().unwrap(),
            put: RefCell::new(None),
        };
        let (beat, _) = report(observe(&mut host, &config(Some(true), false)), &relay);
        assert_eq!(beat.details.relay_map, Some(RelayMapCheck::InSync));
        assert!(beat.details.relay_drift.is_none());
        assert!(relay.put.borrow().is_none());
    }

    #[test]
    fn the_tunnel_and_the_gpu_are_checked_not_assumed() {
        let cases = [
            // (tunnel configured, the tunnel unit's state, gpu, nvidia-smi) -> (tunnel, gpu)
            (
                Some(true),
                Some(("active", "running")),
                true,
                smi(0, "GPU 0: NVIDIA GB10 (UUID: GPU-1)\n"),
                Health::Ok,
                Health::Ok,
            ),
            (
                Some(true),
                Some(("failed", "failed")),
                true,
                smi(9, ""),
                Health::Down,
                Health::Down,
            ),
            // A connector that keeps dying, between two of its restarts.
            (
                Some(true),
                Some(("activating", "auto-restart")),
                true,
                smi(0, "GPU 0: NVIDIA GB10 (UUID: GPU-1)\n"),
                Health::Down,
                Health::Ok,
            ),
            (
                Some(true),
                Some(("activating", "start")),
                true,
                None,
                Health::Degraded,
                Health::Down,
            ),
            (
                Some(false),
                Some(("inactive", "dead")),
                false,
                None,
                Health::NotConfigured,
                Health::NotConfigured,
            ),
            (
                None,
                Some(("active", "running")),
                false,
                None,
                Health::Ok,
                Health::NotConfigured,
            ),
            (
                None,
                Some(("inactive", "dead")),
                false,
                None,
                Health::Unknown,
                Health::NotConfigured,
            ),
        ];
        for (tunnel, state, gpu, nvidia, want_tunnel, want_gpu) in cases {
            let mut host = FakeHost {
                instances: json!([]),
                tunnel: state,
                nvidia,
                rolled_back: None,
                held_keys: None,
                journal: None,
                journal_asked: Vec::new(),
            };
            let relay = Relay {
                map: SshMap::default(),
                put: RefCell::new(None),
            };
            let (beat, _) = report(observe(&mut host, &config(tunnel, gpu)), &relay);
            assert_eq!(
                (beat.tunnel, beat.gpu),
                (want_tunnel, want_gpu),
                "{tunnel:?} {state:?} {gpu}"
            );
            assert!(beat.details.tunnel.is_some() && beat.details.gpu.is_some());
        }
    }

    #[test]
    fn a_rollback_is_reported_on_every_beat_until_the_next_install() {
        let relay = Relay {
            map: SshMap::default(),
            put: RefCell::new(None),
        };
        let mut host = FakeHost {
            instances: json!([]),
            tunnel: None,
            nvidia: None,
            rolled_back: None,
            held_keys: None,
            journal: None,
            journal_asked: Vec::new(),
        };
        let (beat, _) = report(observe(&mut host, &config(None, false)), &relay);
        assert!(beat.details.rollback.is_none());
        host.rolled_back =
            Some(r#"{"at":"2026-11-30T20:00:00Z","from_sha256":"aa","to_sha256":"bb"}"#);
        let (beat, _) = report(observe(&mut host, &config(None, false)), &relay);
        assert_eq!(
            beat.details.rollback,
            Some(RollbackRecord {
                at: Some("2026-11-30T20:00:00Z".into()),
                from_sha256: Some("aa".into()),
                to_sha256: Some("bb".into())
            })
        );
    }

    /// A host with programs only, each answered by the closure; no files, no LXD.
    struct Commands<F>(F);

    impl<F: FnMut(&[&str]) -> Output> Host for Commands<F> {
        fn run(&mut self, argv: &[&str], _: Option<&[u8]>) -> crate::host::Fallible<Output> {
            Ok((self.0)(argv))
        }
        fn read(&mut self, _: &str) -> crate::host::Fallible<Option<Vec<u8>>> {
            Ok(None)
        }
        fn write(&mut self, _: &str, _: &[u8], _: u32, _: &str) -> crate::host::Fallible<()> {
            Ok(())
        }
        fn remove(&mut self, _: &str) -> crate::host::Fallible<()> {
            Ok(())
        }
        fn lxd(&mut self, _: &str, _: &str, _: LxdBody<'_>) -> crate::host::Fallible<LxdReply> {
            Err("no LXD here".into())
        }
        fn describe(&self) -> String {
            "node0".into()
        }
    }

    /// Issue #36: serving keeps the owner's public address the backend saw and asks root for
    /// the tenant firewall once per change of that address or of the host's networks — at
    /// its first beat, never again for the same, and not for a beat that did not land.
    #[test]
    fn the_tenant_firewall_is_asked_for_when_the_address_or_the_networks_change() {
        let dir = tempfile::tempdir().unwrap();
        let (wan, flag) = (
            dir.path().join("wan-address"),
            dir.path().join("firewall-requested"),
        );
        let lan = std::rc::Rc::new(RefCell::new("192.168.1.23".to_owned()));
        // Its only programs are `ip -j addr`: the LAN address as told.
        let seen = lan.clone();
        let mut host = Commands(move |argv: &[&str]| match argv {
            ["ip", "-j", "-4", "addr", "show"] => Output::success(format!(
                r#"[{{"ifname":"eth0","addr_info":[{{"local":"{}","prefixlen":24}}]}}]"#,
                seen.borrow()
            )),
            ["ip", "-j", "-6", "addr", "show", "scope", "global"] => Output::success("[]"),
            _ => Output::failure(1, format!("{argv:?}")),
        });
        let mut watch = FirewallWatch::new(&wan, &flag);
        let seen: std::net::IpAddr = "198.51.100.7".parse().unwrap();
        let mut asked = |seen_from: Option<std::net::IpAddr>| {
            let _ = std::fs::remove_file(&flag);
            let said = watch.after_beat(&mut host, seen_from).unwrap();
            assert_eq!(said, flag.exists(), "the answer is the flag");
            said
        };
        assert!(asked(Some(seen)), "the first beat asks");
        assert_eq!(std::fs::read_to_string(&wan).unwrap(), "198.51.100.7\n");
        assert!(!asked(Some(seen)), "nothing changed");
        assert!(!asked(None), "a beat that did not land keeps the address");
        assert_eq!(std::fs::read_to_string(&wan).unwrap(), "198.51.100.7\n");
        // The owner's router got a new address.
        assert!(asked(Some("203.0.113.44".parse().unwrap())));
        assert_eq!(std::fs::read_to_string(&wan).unwrap(), "203.0.113.44\n");
        assert!(!asked(Some("203.0.113.44".parse().unwrap())));
        // The host moved to another LAN.
        *lan.borrow_mut() = "10.20.30.40".into();
        assert!(asked(None));
        assert!(!asked(None));
        // Serving restarted: it does not know what changed while it was down.
        let mut again = FirewallWatch::new(&wan, &flag);
        assert!(again.after_beat(&mut host, None).unwrap());
    }

    /// #16: the beat carries the kept operator-key list's version and expiry.
    #[test]
    fn the_kept_key_lists_version_and_expiry_ride_on_the_beat() {
        use byo_core::keylist_testing as t;
        let relay = Relay {
            map: SshMap::default(),
            put: RefCell::new(None),
        };
        let now: chrono::DateTime<chrono::Utc> = "2026-11-30T12:00:00Z".parse().unwrap();
        let list = t::list("prod", 7, vec![t::login_key("op", "laptop")], now);
        let mut host = FakeHost {
            instances: json!([]),
            tunnel: None,
            nvidia: None,
            rolled_back: None,
            held_keys: Some(t::envelope(&list, &[&t::private_key()])),
            journal: None,
            journal_asked: Vec::new(),
        };
        let mut with_keys = config(None, false);
        with_keys.operator_keys_held = Some("/var/lib/enverge/operator-keys.signed".into());
        let (beat, _) = report(observe(&mut host, &with_keys), &relay);
        assert_eq!(
            beat.details.operator_keys,
            Some(KeysHeld {
                version: 7,
                expires: list.expires
            })
        );
        host.held_keys = None;
        let (beat, _) = report(observe(&mut host, &with_keys), &relay);
        assert!(beat.details.operator_keys.is_none());
    }

    /// #16, 5: the logins to spark since the kept cursor ride on the beat, attributed against
    /// the applied list; the cursor to keep comes back with it, and a journal that cannot be
    /// read is named without failing the beat.
    #[test]
    fn sshds_logins_to_spark_ride_on_the_beat_attributed_to_their_operator() {
        use byo_core::keylist_testing as t;
        let relay = Relay {
            map: SshMap::default(),
            put: RefCell::new(None),
        };
        let now: chrono::DateTime<chrono::Utc> = "2026-11-30T12:00:00Z".parse().unwrap();
        let key = t::login_key("op-sub-1", "laptop");
        let fp = byo_core::keylist::check_key(&key).unwrap().fingerprint;
        let list = t::list("prod", 7, vec![key], now);
        let entry = |cursor: &str, port: u16, fp: &str| {
            json!({"__CURSOR": cursor, "__REALTIME_TIMESTAMP": "1764550800000000",
                   "MESSAGE": format!("Accepted publickey for spark from 10.8.0.1 port {port} ssh2: ED25519 {fp}")})
            .to_string()
        };
        let mut host = FakeHost {
            instances: json!([]),
            tunnel: None,
            nvidia: None,
            rolled_back: None,
            held_keys: Some(t::envelope(&list, &[&t::private_key()])),
            journal: Some(format!(
                "{}\n{}\n",
                entry("c1", 40001, &fp),
                entry("c2", 40002, "SHA256:notonthelist")
            )),
            journal_asked: Vec::new(),
        };
        let mut with_keys = config(None, false);
        with_keys.operator_keys_held = Some("/var/lib/enverge/operator-keys.signed".into());
        let (beat, cursor) = report(observe(&mut host, &with_keys), &relay);
        assert_eq!(cursor.as_deref(), Some("c2"));
        let logins = beat.details.operator_logins.clone().unwrap();
        assert_eq!(logins.len(), 2);
        assert_eq!(logins[0].user_sub.as_deref(), Some("op-sub-1"));
        assert_eq!(logins[0].fingerprint, fp);
        assert_eq!(
            (logins[0].source.as_str(), logins[0].source_port),
            ("10.8.0.1", 40001)
        );
        assert_eq!(logins[1].user_sub, None, "not an operator key");
        assert!(beat.details.operator_logins_error.is_none());
        assert!(
            !host
                .journal_asked
                .iter()
                .any(|a| a.starts_with("--after-cursor"))
        );
        // No journal: named, no logins, no cursor to keep.
        host.journal = None;
        let (beat, cursor) = report(observe(&mut host, &with_keys), &relay);
        assert_eq!(cursor, None);
        assert_eq!(beat.details.operator_logins, Some(vec![]));
        assert_eq!(
            beat.details.operator_logins_error.as_deref(),
            Some("journalctl: no journal")
        );
    }

    /// node0 of a pair: its rails, a twin each, and what answers on them.
    fn rails() -> Commands<impl FnMut(&[&str]) -> Output> {
        Commands(|argv: &[&str]| {
            let out = |stdout: &str| Output {
                code: 0,
                stdout: stdout.into(),
                stderr: String::new(),
            };
            match argv {
                ["ip", "-j", "-6", "addr", "show", "scope", "link"] => out(
                    r#"[{"ifname": "rail0", "addr_info": [{"local": "fe80::a0"}]},
                        {"ifname": "rail1", "addr_info": [{"local": "fe80::a1"}]}]"#,
                ),
                // node1's two functions on rail0's cable, and node0's own rail1 (a loop).
                ["ping", "-6", .., "ff02::1%rail0"] => out(
                    "64 bytes from fe80::a0%rail0: icmp_seq=1\n64 bytes from fe80::10%rail0: icmp_seq=1\n64 bytes from fe80::11%rail0: icmp_seq=1\n",
                ),
                ["ping", "-6", .., "ff02::1%rail1"] => out(
                    "64 bytes from fe80::a1%rail1: icmp_seq=1\n64 bytes from fe80::a0%rail1: icmp_seq=1\n",
                ),
                // An instance holds rail2's netdev: silence.
                ["ping", ..] => Output {
                    code: 1,
                    stdout: String::new(),
                    stderr: String::new(),
                },
                other => panic!("unexpected {other:?}"),
            }
        })
    }

    #[test]
    fn k_133_a_pairs_beat_counts_the_machines_on_each_rail() {
        let known = [("fe80::10".to_owned(), 1), ("fe80::11".to_owned(), 1)]
            .into_iter()
            .collect();
        let ports = ["rail0".to_owned(), "rail1".to_owned(), "rail2".to_owned()];
        assert_eq!(
            rail_neighbours(&mut rails(), &ports, &known),
            Some(
                [("rail0", 1), ("rail1", 0), ("rail2", 0)]
                    .map(|(p, n)| (p.to_owned(), n))
                    .into()
            )
        );
        assert_eq!(
            rail_neighbours(&mut rails(), &[], &known),
            None,
            "a single Spark"
        );
    }
}
