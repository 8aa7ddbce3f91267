//! admin-vm-action: an operator's delete, through the same path as the customer's (G.7:
//! every caller owns both edges), and notify-stuck-deletes' list on request.

use byo_wire::vm::{InstanceDeletion, StuckDelete};
use chrono::TimeDelta;

use crate::app::instances::{self, Deleter};
use crate::app::notify_stuck_deletes::{self, STUCK_AFTER_MINUTES};
use crate::auth::Operator;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// Delete any instance, as its customer would.
pub async fn delete(state: &AppState, by: &Operator, vm_id: &str) -> AppResult<InstanceDeletion> {
    instances::delete(state, Deleter::Operator(&by.0), vm_id).await
}

/// Deletes unconfirmed for at least `older_than_minutes` (default
/// [`STUCK_AFTER_MINUTES`]; 0 lists every delete waiting for its host), oldest first.
pub async fn stuck_deletes(
    state: &AppState,
    older_than_minutes: Option<i64>,
) -> AppResult<Vec<StuckDelete>> {
    let minutes = older_than_minutes.unwrap_or(STUCK_AFTER_MINUTES);
    if !(0..=60 * 24 * 365).contains(&minutes) {
        return Err(AppError::bad_request(
            "invalid_minutes",
            "older_than_minutes is between 0 and a year",
        ));
    }
    notify_stuck_deletes::stuck(state, TimeDelta::minutes(minutes)).await
}
