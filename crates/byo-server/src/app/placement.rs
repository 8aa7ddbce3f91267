//! Placement's record of a host (issue #12, 6), for operators: the creates it failed in a
//! row, its bench, and its heartbeat's age; and the operator's clear. The rules that write
//! it are `crate::app::instances`' (a failed attempt counts, a taken create forgets) and the
//! picker's (`Store::pick_hosts_for_gpu`: a heartbeat later than the bench lifts it).

/// How often the pre-booking launcher runs (and expire-prebook): placement keeps a booking's
/// pinned host out of other creates from this far ahead of its window, so the launcher's
/// next run finds it free. Here, below the create and the launcher both.
pub const LAUNCH_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

use byo_wire::vm::HostPlacementView;
use serde_json::json;

use crate::auth::Operator;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// What placement holds against `host_id`; a host it holds nothing against shows a clean
/// record. A host that does not exist is a 404.
pub async fn view(state: &AppState, host_id: &str) -> AppResult<HostPlacementView> {
    if state.store.host(host_id).await?.is_none() {
        return Err(AppError::NotFound);
    }
    let now = state.clock.now();
    let seen_at = state.store.host_status(host_id).await?.map(|s| s.seen_at);
    let bench = state.store.host_bench(host_id).await?;
    Ok(HostPlacementView {
        host_id: host_id.to_owned(),
        benched: bench.as_ref().is_some_and(|b| b.in_effect()),
        benched_at: bench.as_ref().and_then(|b| b.benched_at),
        consecutive_failures: bench.as_ref().map_or(0, |b| b.consecutive_failures),
        last_failure: bench.as_ref().and_then(|b| b.last_failure.clone()),
        last_failure_at: bench.as_ref().and_then(|b| b.last_failure_at),
        last_heartbeat_at: seen_at,
        heartbeat_age_seconds: seen_at.map(|s| (now - s).num_seconds()),
        heartbeat_fresh: seen_at.is_some_and(|s| s >= state.config.placement.seen_since(now)),
    })
}

/// An operator clears a host's bench and its count (audited `host.bench_cleared` when
/// there was one to clear).
pub async fn clear(state: &AppState, by: &Operator, host_id: &str) -> AppResult<HostPlacementView> {
    if state.store.host(host_id).await?.is_none() {
        return Err(AppError::NotFound);
    }
    if state.store.clear_placement_bench(host_id).await? {
        state
            .store
            .audit(
                Some(&by.0.user.sub),
                "host.bench_cleared",
                Some(host_id),
                json!({}),
                state.clock.now(),
            )
            .await?;
    }
    view(state, host_id).await
}
