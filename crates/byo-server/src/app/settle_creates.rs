//! settle-creates (issue #39): a create nobody answered settles on its own. The create
//! itself settles what its host answers or refuses; the heartbeat settles what a host that
//! beats holds or does not hold once the create's deadline is over. What is left is a row
//! still `creating` on a host that has not beaten since — the server restarted mid-create
//! and the host went silent. Past the create's deadline and [`SETTLE_GRACE_MINUTES`], this
//! sweep marks it `creation_failed_at` (never billed) and its host is free again. If the host
//! comes back holding the container, no live row accounts for it, and the heartbeat removes it
//! as an orphan on the backend's instruction, audited (`vm.orphan_removed`).

use std::time::Duration;

use chrono::TimeDelta;

use crate::error::AppResult;
use crate::state::AppState;

/// How long past the create's deadline a `creating` row waits for its host's heartbeat
/// before it is settled here: the bound at which a host with no heartbeat reads as
/// unreachable, so a host that beats at all settles its own creates first.
pub const SETTLE_GRACE_MINUTES: i64 = 10;
/// How often the sweep runs.
pub const SETTLE_EVERY: Duration = Duration::from_secs(60);
/// The most rows one sweep settles; the next sweep takes the rest.
const BATCH: i64 = 500;

/// One sweep: every `creating` row older than the create's deadline and the grace is failed
/// and audited. Returns how many it settled.
pub async fn settle_once(state: &AppState) -> AppResult<usize> {
    let now = state.clock.now();
    let wait = TimeDelta::from_std(state.waits.create).unwrap_or(TimeDelta::MAX);
    let Some(made_by) = now
        .checked_sub_signed(wait)
        .and_then(|t| t.checked_sub_signed(TimeDelta::minutes(SETTLE_GRACE_MINUTES)))
    else {
        return Ok(0);
    };
    let mut settled = 0;
    for row in state.store.unsettled_creates(made_by, BATCH).await? {
        // The heartbeat or the create may settle it between the read and this write; the
        // guarded write lets only one of them.
        if !crate::app::instances::fail_create(
            state,
            &row.id,
            row.host_id.as_deref(),
            "the host neither answered the create nor beat after its deadline",
            Some("settle-creates"),
        )
        .await?
        {
            continue;
        }
        settled += 1;
        tracing::warn!(vm = %row.id, host = ?row.host_id, name = %row.name, created_at = %row.created_at,
            "a create nobody answered is settled: its host has not beaten since its deadline; nothing billed");
    }
    Ok(settled)
}
