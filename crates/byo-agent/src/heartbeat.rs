//! The one schedule serving keeps (133). At start: wait for LXD, restore each instance to
//! its last state, then point the relay (L2). Each beat: read the relay's SSH map and
//! rewrite it when it differs from what the host runs (G note 4), then report host_status.

use std::sync::Arc;
use std::time::Duration;

use byo_wire::vm::{Health, Heartbeat};

use crate::prepare::HandOver;
use crate::serve::VmService;

/// What one beat found, for the heartbeat body. LXD is read under the host's lock; the
/// relay is asked after it is released, so a relay that does not answer never holds up the
/// VM API.
fn beat(svc: &VmService) -> Heartbeat {
    let (lxd_up, instances, storage, want) = {
        let mut host = svc.host.lock().unwrap_or_else(|p| p.into_inner());
        let lxd_up = crate::lxd::get(&mut *host, "/1.0").ok().flatten().is_some();
        let instances = if lxd_up {
            crate::vms::list(&mut *host)
                .map(|l| l.len() as u32)
                .unwrap_or(0)
        } else {
            0
        };
        let storage = match crate::lxd::get(&mut *host, "/1.0/storage-pools/default") {
            Ok(Some(_)) => Health::Ok,
            Ok(None) => Health::Down,
            Err(_) => Health::Unknown,
        };
        let want = lxd_up.then(|| crate::vms::wanted_map(&mut *host, &svc.config));
        (lxd_up, instances, storage, want)
    };
    let (relay, relay_detail) = match want {
        None => (Health::Unknown, None),
        Some(want) => match want.and_then(|w| crate::vms::sync_map(svc.relay.as_ref(), &w)) {
            Ok(false) => (Health::Ok, None),
            Ok(true) => {
                tracing::warn!("the relay's SSH map differed from what this host runs; rewritten");
                (Health::Ok, Some("rewritten"))
            }
            Err(e) => {
                tracing::warn!(error = %e, "the relay's SSH map could not be checked");
                (Health::Down, None)
            }
        },
    };
    Heartbeat {
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        lxd: if lxd_up { Health::Ok } else { Health::Down },
        relay,
        tunnel: Health::Unknown,
        gpu: if svc.config.gpu {
            Health::Unknown
        } else {
            Health::Ok
        },
        storage,
        instances,
        details: serde_json::json!({"relay_map": relay_detail}),
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
    loop {
        std::thread::sleep(every);
        let body = beat(&svc);
        if let Some(r) = reporter.as_mut()
            && let Err(e) = r.heartbeat(&body)
        {
            tracing::warn!(error = %e, "heartbeat not delivered");
        }
    }
}
