//! admin-host-action: the operator's decisions about a host. Activation is the only thing
//! between an enrolled machine and a paying customer (D), and its gate lives here and in
//! the schema — one gate for every path.

use byo_db::DbError;
use serde_json::json;

use crate::auth::Operator;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// Activate a host whose preparation finished: the single flag, plus the placement.
pub async fn activate(
    state: &AppState,
    by: &Operator,
    host_id: &str,
    placement: &str,
) -> AppResult<()> {
    let placement = placement.trim();
    if placement.is_empty() || placement.len() > 64 || placement.chars().any(char::is_control) {
        return Err(AppError::bad_request(
            "invalid_placement",
            "a placement is 1 to 64 printable characters",
        ));
    }
    let now = state.clock.now();
    state
        .store
        .activate_host(host_id, placement, &by.0.user.sub, now)
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
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "host.activate",
            Some(host_id),
            json!({"placement": placement}),
            now,
        )
        .await?;
    Ok(())
}

/// Revoke an enrolment before it redeems (H); its allocation is handed back at once.
pub async fn revoke(state: &AppState, by: &Operator, enrollment_id: &str) -> AppResult<()> {
    if !state.store.revoke_enrollment(enrollment_id).await? {
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
