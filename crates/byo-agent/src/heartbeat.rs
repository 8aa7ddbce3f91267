//! The one schedule serving keeps (133). At start: wait for LXD, restore each instance to
//! its last state, then point the relay (L2). Each beat: read the relay's SSH map and
//! rewrite it when it differs from what the host runs (G note 4, the drift named in the
//! details), check the operator tunnel's unit and the GPU for real, then report host_status
//! with the instances the host holds, which the backend reconciles its rows with.

use std::sync::Arc;
use std::time::Duration;

use byo_wire::relay::SshMap;
use byo_wire::vm::{Health, HeldVm, Heartbeat, MAX_HELD_VMS};
use serde_json::json;

use crate::host::Host;

use crate::prepare::HandOver;
use crate::serve::VmService;

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

/// The operator tunnel, actually checked: cloudflared's unit as systemd has it. Not
/// configured when preparation installed none (the profile has no tunnel).
fn tunnel_health<H: Host + ?Sized>(host: &mut H, configured: Option<bool>) -> (Health, String) {
    if configured == Some(false) {
        return (Health::NotConfigured, "no operator tunnel on this host".to_owned());
    }
    let state = match host.run(&["systemctl", "is-active", "cloudflared"], None) {
        Ok(out) => out.stdout.trim().chars().take(32).collect::<String>(),
        Err(e) => return (Health::Unknown, format!("systemctl: {}", first_line(&e))),
    };
    let health = match (state.as_str(), configured) {
        ("active", _) => Health::Ok,
        ("activating" | "reloading", _) => Health::Degraded,
        (_, Some(true)) => Health::Down,
        // A hand-over that does not say whether a tunnel was installed.
        (_, _) => Health::Unknown,
    };
    (health, format!("cloudflared: {state}"))
}

/// The GPU, actually checked where the profile has one: nvidia-smi lists a GPU.
fn gpu_health<H: Host + ?Sized>(host: &mut H, configured: bool) -> (Health, String) {
    if !configured {
        return (Health::NotConfigured, "the profile has no GPU".to_owned());
    }
    match host.run(&["nvidia-smi", "-L"], None) {
        Ok(out) if out.ok() && out.stdout.contains("GPU") => {
            (Health::Ok, first_line(&out.stdout))
        }
        Ok(out) => (
            Health::Down,
            format!("nvidia-smi exited {}: {}", out.code, first_line(&out.stderr)),
        ),
        Err(e) => (Health::Down, format!("nvidia-smi: {}", first_line(&e))),
    }
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").chars().take(200).collect()
}

/// What one beat found, for the heartbeat body. LXD is read under the host's lock; the
/// relay is asked after it is released, so a relay that does not answer never holds up the
/// VM API.
fn beat(svc: &VmService) -> Heartbeat {
    let (lxd_up, held, storage, want, tunnel, gpu) = {
        let mut host = svc.host.lock().unwrap_or_else(|p| p.into_inner());
        let lxd_up = crate::lxd::get(&mut *host, "/1.0").ok().flatten().is_some();
        let held: Vec<HeldVm> = if lxd_up {
            crate::vms::list(&mut *host)
                .unwrap_or_default()
                .into_iter()
                .map(|v| HeldVm {
                    name: v.name,
                    status: v.status,
                    ssh_port: v.ssh_port,
                })
                .collect()
        } else {
            Vec::new()
        };
        let storage = match crate::lxd::get(&mut *host, "/1.0/storage-pools/default") {
            Ok(Some(_)) => Health::Ok,
            Ok(None) => Health::Down,
            Err(_) => Health::Unknown,
        };
        let want = lxd_up.then(|| crate::vms::wanted_map(&mut *host, &svc.config));
        let tunnel = tunnel_health(&mut *host, svc.config.tunnel);
        let gpu = gpu_health(&mut *host, svc.config.gpu);
        (lxd_up, held, storage, want, tunnel, gpu)
    };
    let (relay, relay_map, drift) = match want {
        None => (Health::Unknown, "unchecked", None),
        Some(want) => match want.and_then(|w| {
            crate::vms::sync_map_drift(svc.relay.as_ref(), &w).map(|had| (had, w))
        }) {
            Ok((None, _)) => (Health::Ok, "in_sync", None),
            Ok((Some(had), runs)) => {
                tracing::warn!("the relay's SSH map differed from what this host runs; rewritten");
                (
                    Health::Ok,
                    "drift_rewritten",
                    Some(json!({"relay_had": describe_map(&had), "host_runs": describe_map(&runs)})),
                )
            }
            Err(e) => {
                tracing::warn!(error = %e, "the relay's SSH map could not be checked");
                (Health::Down, "unreachable", None)
            }
        },
    };
    let instances = u32::try_from(held.len()).unwrap_or(u32::MAX);
    let vms: Vec<HeldVm> = held
        .into_iter()
        .filter(|v| byo_wire::vm::is_instance_name(&v.name))
        .take(MAX_HELD_VMS)
        .collect();
    Heartbeat {
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        lxd: if lxd_up { Health::Ok } else { Health::Down },
        relay,
        tunnel: tunnel.0,
        gpu: gpu.0,
        storage,
        instances,
        details: json!({
            "relay_map": relay_map,
            "relay_drift": drift,
            "tunnel": tunnel.1,
            "gpu": gpu.1,
        }),
        vms,
    }
}

/// The schedule, on a thread of its own (every call it makes blocks: LXD, the relay, the
/// backend); the async workers only answer the API.
pub fn run(svc: Arc<VmService>, handed: HandOver, every: Duration) {
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
    // The first beat goes out at once: placement picks only hosts it has heard from.
    loop {
        let body = beat(&svc);
        if let Some(r) = reporter.as_mut()
            && let Err(e) = r.heartbeat(&body)
        {
            tracing::warn!(error = %e, "heartbeat not delivered");
        }
        std::thread::sleep(every);
    }
}
