//! notify-stuck-deletes: a delete that was accepted and never confirmed keeps billing and
//! keeps its host occupied (G.2), which is only defensible because it is visible (G.3).
//! This sweep finds them and tells operators — a warning per instance in the log on a
//! schedule inside the server, and the list at `GET /api/admin/stuck-deletes`.

use std::time::Duration;

use byo_wire::vm::StuckDelete;
use chrono::TimeDelta;

use crate::error::AppResult;
use crate::state::AppState;

/// A delete is stuck once it has waited this long unconfirmed: far past the 90 s a delete
/// waits for its host (G.4).
pub const STUCK_AFTER_MINUTES: i64 = 10;
/// How often the sweep runs.
pub const NOTIFY_EVERY: Duration = Duration::from_secs(5 * 60);

/// Deletes requested at least `older_than` ago and not confirmed, oldest first.
pub async fn stuck(state: &AppState, older_than: TimeDelta) -> AppResult<Vec<StuckDelete>> {
    let now = state.clock.now();
    let rows = state.store.stuck_deletes(now - older_than).await?;
    Ok(rows
        .into_iter()
        .map(|r| StuckDelete {
            waiting_minutes: (now - r.delete_requested_at).num_minutes(),
            vm_id: r.id,
            name: r.name,
            user_sub: r.user_sub,
            host_id: r.host_id,
            host_slug: r.host_slug,
            delete_requested_at: r.delete_requested_at,
        })
        .collect())
}

/// One sweep: every stuck delete is logged at warn level with its instance, host and how
/// long it has waited. Returns what it reported.
pub async fn notify_once(state: &AppState) -> AppResult<Vec<StuckDelete>> {
    let found = stuck(state, TimeDelta::minutes(STUCK_AFTER_MINUTES)).await?;
    for s in &found {
        tracing::warn!(
            vm = %s.vm_id,
            name = %s.name,
            host = %s.host_slug.as_deref().or(s.host_id.as_deref()).unwrap_or("-"),
            requested_at = %s.delete_requested_at.to_rfc3339(),
            waiting_minutes = s.waiting_minutes,
            "stuck delete: requested and not confirmed; the instance is still billed and its host held"
        );
    }
    Ok(found)
}
