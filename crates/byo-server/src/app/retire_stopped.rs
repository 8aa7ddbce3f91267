//! Leaving gives everything back (issue #39, 3): a host its owner stopped hosting, drained,
//! whose agent has then been silent past [`SILENT_HOURS`] (uninstalled, switched off, gone)
//! is retired on its own — N's order, the operator's own code path: the refusals first,
//! outside next (names, tunnel, relay and address), the stamp last. A host one of N's
//! refusals applies to (a pre-booking still owed, a live instance a delete never confirmed,
//! a dedication) is not touched: it is on the operators' worklist ([`worklist`], shown on
//! `/admin/hosts`) with the refusal in words, and the job retires it on the run after the
//! refusal is settled. A provider failing part way stamps nothing; the next run carries on.

use std::time::Duration;

use byo_db::lifecycle::StoppedHost;
use byo_wire::lifecycle::WorklistEntry;
use chrono::TimeDelta;
use serde_json::json;

use crate::app::host_lifecycle::{STOP_REASON, retire_refusal, retire_refusals_passed};
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// The job's name in the registry.
pub const RETIRE_STOPPED: &str = "retire-stopped";
/// Its period.
pub const RETIRE_STOPPED_EVERY: Duration = Duration::from_secs(5 * 60);
/// How long a stopped host's agent must have been silent (and the stop be old) before the
/// host is retired: a day, so an owner who stopped and is only rebooting or moving the box
/// is not retired under them, and one who uninstalled is retired the same day.
pub const SILENT_HOURS: i64 = 24;
/// Candidates read per run (the longest silent first).
pub const BATCH: i64 = 100;

/// What one run came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetireStoppedReport {
    pub retired: u32,
    /// Left for an operator: a refusal of N's applies (the worklist).
    pub refused: u32,
    /// A provider failed part way: nothing stamped; the next run carries on.
    pub failed: u32,
}

impl std::fmt::Display for RetireStoppedReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "retired {}, on the worklist {}, failed {}",
            self.retired, self.refused, self.failed
        )
    }
}

/// The candidates now (stopped, silent past the bound), each with retire's refusal if one
/// applies. A database fault met while judging is the caller's, not a refusal.
async fn judged(
    state: &AppState,
    now: chrono::DateTime<chrono::Utc>,
) -> AppResult<Vec<(StoppedHost, Option<AppError>)>> {
    let since = now - TimeDelta::hours(SILENT_HOURS);
    let mut out = Vec::new();
    for c in state
        .store
        .stopped_and_silent(STOP_REASON, since, BATCH)
        .await?
    {
        let refusal = match retire_refusal(state, &c.host, now).await {
            Ok(()) => None,
            Err(e) if e.status().is_server_error() => return Err(e),
            Err(e) => Some(e),
        };
        out.push((c, refusal));
    }
    Ok(out)
}

/// One run: every stopped host silent past the bound is retired, or left for an operator.
pub async fn retire_stopped_once(state: &AppState) -> AppResult<RetireStoppedReport> {
    let mut report = RetireStoppedReport::default();
    for (c, refusal) in judged(state, state.clock.now()).await? {
        if let Some(refusal) = refusal {
            tracing::info!(host = %c.host.slug, refusal = refusal.code(),
                "a stopped, silent host waits for an operator: {refusal}");
            report.refused += 1;
            continue;
        }
        let details = json!({
            "slug": c.host.slug,
            "by": RETIRE_STOPPED,
            "stopped_at": c.host.depooled_at,
            "last_seen_at": c.seen_at,
            "silent_hours": SILENT_HOURS,
        });
        match retire_refusals_passed(state, None, &c.host, details).await {
            Ok(()) => {
                tracing::info!(host = %c.host.slug, "retired: its owner stopped hosting and it has been silent since");
                report.retired += 1;
            }
            Err(e) => {
                tracing::warn!(host = %c.host.slug, "retire-stopped: {e}");
                report.failed += 1;
            }
        }
    }
    Ok(report)
}

/// The operators' worklist: stopped hosts silent past the bound that a refusal of N's keeps
/// from retiring, each with the refusal (a host with none is retire-stopped's, not listed).
pub async fn worklist(state: &AppState) -> AppResult<Vec<WorklistEntry>> {
    Ok(judged(state, state.clock.now())
        .await?
        .into_iter()
        .filter_map(|(c, refusal)| {
            let refusal = refusal?;
            Some(WorklistEntry {
                host_id: c.host.id,
                slug: c.host.slug,
                owner_sub: c.host.owner_sub,
                stopped_at: c.host.depooled_at,
                last_seen_at: c.seen_at,
                refusal: refusal.code().to_owned(),
                message: refusal.to_string(),
            })
        })
        .collect())
}
