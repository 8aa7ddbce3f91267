//! reap: hand back everything a lapsed, rejected or revoked-before-redeem enrolment holds —
//! relay, address, tunnel, DNS, hosts row. Every provider call is idempotent and the row
//! goes last, so a sweep that fails half-way is finished by the next one. Beyond the
//! design, the sweep runs on a schedule inside the server, as the job `reap` (`app::jobs`).

use crate::error::AppResult;
use crate::state::AppState;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReapReport {
    pub released: usize,
    pub failed: usize,
}

/// Everything outside a host holds, handed back: the relay and its address, the customer
/// SSH wildcard `*.<slug>.ssh` (N.4), the operator tunnel and its DNS. Each call is
/// idempotent (what is gone is fine), so a caller stopped half-way runs it again. The one
/// teardown reap, revoke (H) and retire (N) share.
///
/// The names go first, the address last (issue #36, 8): a relay's public IPv4, once handed
/// back, may be given to anyone, and a `*.<slug>.ssh` record still pointing at it would send
/// this host's customers — and their trust in the name — to whoever holds it next. So a
/// teardown stopped half-way leaves an address still ours with no name, never a name with
/// an address that is not.
pub async fn release_outside(
    state: &AppState,
    slug: &str,
) -> Result<(), crate::providers::ProviderError> {
    let wildcard = crate::app::instances::ssh_wildcard(state, slug);
    state.tunnels.remove_ssh_wildcard(&wildcard).await?;
    state.tunnels.delete(slug).await?;
    state.relays.release(slug).await
}

/// One sweep over every allocation that should be handed back.
pub async fn reap_once(state: &AppState) -> AppResult<ReapReport> {
    let now = state.clock.now();
    let mut report = ReapReport::default();
    for r in state.store.reapable(now).await? {
        if let Some(slug) = &r.slug
            && let Err(e) = release_outside(state, slug).await
        {
            tracing::warn!(%slug, enrollment = %r.enrollment_id, error = %e, "reap: not finished; the next sweep carries on");
            report.failed += 1;
            continue;
        }
        state
            .store
            .release_allocation(&r.enrollment_id, now)
            .await?;
        state
            .store
            .audit(
                None,
                "host.reaped",
                r.host_id.as_deref(),
                serde_json::json!({"slug": r.slug, "state": r.state}),
                now,
            )
            .await?;
        report.released += 1;
    }
    Ok(report)
}
