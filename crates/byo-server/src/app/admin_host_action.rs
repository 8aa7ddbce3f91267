//! admin-host-action: the operator's decisions about a host. Activation is the only thing
//! between an enrolled machine and a paying customer (D), and its gate lives here and in
//! the schema — one gate for every path.

use byo_db::DbError;
use byo_db::hosts::Activation;
use byo_wire::api::Placement;
use chrono::{DateTime, Utc};
use serde_json::json;

use crate::app::host_problems::{Problem, Seen, list_expiry, problems};
use crate::auth::Operator;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// Activate a host whose preparation finished: the single flag, plus the placement — one
/// of the closed set (`shared`, or `dedicated` to one user). An already active host is
/// refused (`already_active`) unless the request is an explicit change, which is audited
/// with the placement it replaced. A host going into service has its customers' path walked
/// first ([`require_walk`]).
pub async fn activate(
    state: &AppState,
    by: &Operator,
    host_id: &str,
    placement: &Placement,
    change: bool,
    walk_override: Option<&str>,
) -> AppResult<()> {
    if let Placement::Dedicated { dedicated_to } = placement
        && state.store.user(dedicated_to).await?.is_none()
    {
        return Err(AppError::bad_request(
            "unknown_user",
            "dedicated_to names no user; give the subject id of the user the host is for",
        ));
    }
    let now = state.clock.now();
    refuse_unhealthy(state, host_id, now).await?;
    let walked = require_walk(state, by, host_id, walk_override).await?;
    let done = state
        .store
        .activate_host(
            host_id,
            placement.as_str(),
            placement.dedicated_to(),
            change,
            &by.0.user.sub,
            now,
        )
        .await
        .map_err(|e| match e {
            e if e.breaks(byo_db::Rule::ActiveHostPrepared) => AppError::conflict(
                "not_prepared",
                "this host's preparation has not finished; it cannot be activated",
            ),
            e if e.breaks(byo_db::Rule::RetiredHostInactive) => {
                AppError::conflict("retired", "a retired host cannot be activated")
            }
            DbError::NotFound => AppError::NotFound,
            other => other.into(),
        })?;
    let (action, details) = match done {
        Activation::AlreadyActive { placement, .. } => {
            return Err(AppError::conflict(
                "already_active",
                format!(
                    "this host is already active (placement {}); to change its placement, \
                     send the new one with \"change\": true",
                    placement.as_deref().unwrap_or("none")
                ),
            ));
        }
        Activation::Activated => (
            "host.activate",
            json!({"placement": placement.as_str(), "dedicated_to": placement.dedicated_to(),
                   "walk_id": walked.walk_id, "walk_override": walked.overridden}),
        ),
        Activation::Changed {
            placement: was,
            dedicated_to: was_to,
        } => (
            "host.placement_change",
            json!({"placement": placement.as_str(), "dedicated_to": placement.dedicated_to(),
                   "was": {"placement": was, "dedicated_to": was_to}}),
        ),
    };
    state
        .store
        .audit(Some(&by.0.user.sub), action, Some(host_id), details, now)
        .await?;
    Ok(())
}

/// What activation went on: the walk that passed, or the operator's reason and the walk it
/// overrode (none for a placement change).
#[derive(Default)]
struct Walked {
    walk_id: Option<String>,
    overridden: Option<String>,
}

/// Issue #38, 4: a host goes into service only once its customers' path has been walked
/// (`app::path_walk`) since its preparation finished — walked here and now when it has not
/// been — or on the operator's stated reason when the walk failed or cannot be made. What
/// was decided goes into `host.activate`'s audit: the walk that passed, or the override
/// with the walk it overrode. A placement change on a host in service is not held to it.
async fn require_walk(
    state: &AppState,
    by: &Operator,
    host_id: &str,
    walk_override: Option<&str>,
) -> AppResult<Walked> {
    let store = &state.store;
    let Some(host) = store.host(host_id).await? else {
        return Ok(Walked::default());
    };
    let Some(prepared_at) = host.prepared_at.filter(|_| !host.active) else {
        return Ok(Walked::default());
    };
    let passed = |id: String| Walked {
        walk_id: Some(id),
        overridden: None,
    };
    let newest = store.latest_path_walk(host_id).await?;
    let since_prepared =
        crate::app::path_walk::since_prepared(newest.as_ref(), prepared_at).cloned();
    if let Some(w) = since_prepared.as_ref().filter(|w| w.passed == Some(true)) {
        return Ok(passed(w.id.clone()));
    }
    if let Some(reason) = walk_override.map(str::trim).filter(|r| !r.is_empty()) {
        return Ok(Walked {
            walk_id: since_prepared.map(|w| w.id),
            overridden: Some(reason.to_owned()),
        });
    }
    let walked = match since_prepared {
        Some(w) if w.passed.is_none() => {
            return Err(AppError::conflict(
                "walk_running",
                "a walk of this host's customer path is under way; activate once it has \
                 passed. Nothing was changed",
            ));
        }
        Some(w) => w,
        None => crate::app::path_walk::walk(state, host_id, Some(&by.0.user.sub)).await?,
    };
    if walked.passed == Some(true) {
        return Ok(passed(walked.id));
    }
    Err(AppError::conflict(
        "walk_failed",
        format!(
            "the walk of this host's customer path failed at {}: {}. Nothing was changed: \
             mend the path and walk it again from the host's page, or activate with an \
             override and your reason",
            walked.stage.as_deref().unwrap_or("an unknown stage"),
            walked.error.as_deref().unwrap_or("no reason recorded")
        ),
    ))
}

/// Revoke an enrolment before it redeems (H); its allocation is handed back at once.
pub async fn revoke(state: &AppState, by: &Operator, enrollment_id: &str) -> AppResult<()> {
    if !state.store.revoke_enrollment(enrollment_id).await? {
        let host_id = state
            .store
            .enrollment(enrollment_id)
            .await?
            .and_then(|e| e.host_id);
        if let Some(refusal) =
            crate::app::host_lifecycle::booked_refusal(state, host_id.as_deref()).await?
        {
            return Err(refusal);
        }
        return Err(AppError::conflict(
            "not_revocable",
            "only an enrolment that has not redeemed can be revoked",
        ));
    }
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "enrollment.revoke",
            Some(enrollment_id),
            json!({}),
            state.clock.now(),
        )
        .await?;
    crate::app::reap::reap_once(state).await?;
    Ok(())
}

/// Problems that do not stop a host from renting: the fleet's key list nearing its expiry
/// (every host's, for operators to re-sign). A push not yet made (operators' access, not the
/// customers') is not read at all.
const RENTABLE_DESPITE: &[&str] = &["key list expiring"];

/// A host goes into service only on its agent's word, not only its report's (issue #36, 8):
/// a prepared host that is not in service must have beaten within placement's age and be
/// judged free of every problem a customer would meet (`app::host_problems`), or the
/// activation is refused, naming each. A placement change on a host in service is not held
/// to this: it does not put it into service.
async fn refuse_unhealthy(state: &AppState, host_id: &str, now: DateTime<Utc>) -> AppResult<()> {
    let store = &state.store;
    let Some(host) = store.host(host_id).await? else {
        return Ok(()); // the activation's own answer says so
    };
    if host.active || host.prepared_at.is_none() {
        return Ok(());
    }
    let status = store.host_status(host_id).await?;
    let published = store.published_key_list().await?;
    let vms = store.live_vms_of_host(host_id).await?;
    let bench = store.host_bench(host_id).await?;
    let found: Vec<Problem> = problems(
        &Seen {
            host: &host,
            status: status.as_ref(),
            heard_since: state.config.placement.seen_since(now),
            // The key push is the operators' access, not what a customer meets: not read.
            push: None,
            published: published.as_ref(),
            published_expires: list_expiry(published.as_ref()),
            vms: &vms,
            bench: bench.as_ref(),
        },
        now,
    )
    .into_iter()
    .filter(|p| !RENTABLE_DESPITE.contains(&p.name))
    .collect();
    if found.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = found
        .iter()
        .map(|p| format!("{} ({})", p.name, p.detail))
        .collect();
    Err(AppError::conflict(
        "not_healthy",
        format!(
            "this host cannot go into service yet: {}. It is activated once its agent beats \
             with nothing wrong; nothing was changed",
            named.join("; ")
        ),
    ))
}
