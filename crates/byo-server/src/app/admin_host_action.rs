//! admin-host-action: the operator's decisions about a host. Activation is the only thing
//! between an enrolled machine and a paying customer (D), and its gate lives here and in
//! the schema — one gate for every path.

use byo_db::DbError;
use byo_db::hosts::Activation;
use byo_wire::api::Placement;
use serde_json::json;

use crate::auth::Operator;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// Activate a host whose preparation finished: the single flag, plus the placement — one
/// of the closed set (`shared`, or `dedicated` to one user). An already active host is
/// refused (`already_active`) unless the request is an explicit change, which is audited
/// with the placement it replaced.
pub async fn activate(
    state: &AppState,
    by: &Operator,
    host_id: &str,
    placement: &Placement,
    change: bool,
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
            e if e.is_constraint("hosts_active_prepared") => AppError::conflict(
                "not_prepared",
                "this host's preparation has not finished; it cannot be activated",
            ),
            e if e.is_constraint("hosts_retired_inactive") => {
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
            json!({"placement": placement.as_str(), "dedicated_to": placement.dedicated_to()}),
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
