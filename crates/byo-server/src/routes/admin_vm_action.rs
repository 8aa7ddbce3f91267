//! admin-vm-action: an operator's delete, through the same path as the customer's (G.7:
//! every caller owns both edges), and notify-stuck-deletes' list.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use byo_wire::api::ErrorBody;
use byo_wire::vm::{InstanceDeletion, StuckDelete};
use chrono::TimeDelta;
use serde::Deserialize;

use crate::auth::Operator;
use crate::error::{AppError, AppResult};
use crate::instances::{self, Deleter};
use crate::notify_stuck_deletes::{self, STUCK_AFTER_MINUTES};
use crate::routes::vms::deletion_status;
use crate::state::AppState;

/// Delete any instance, as its customer would: 200 when the host confirmed, 202 when the
/// delete is recorded and not confirmed.
#[utoipa::path(post, path = "/api/admin/vms/{vm_id}/delete", tag = "admin",
    params(("vm_id" = String, Path, description = "the instance's id")),
    responses((status = 200, body = InstanceDeletion), (status = 202, body = InstanceDeletion),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_delete(
    State(state): State<AppState>,
    op: Operator,
    Path(vm_id): Path<String>,
) -> AppResult<(StatusCode, Json<InstanceDeletion>)> {
    let d = instances::delete(&state, Deleter::Operator(&op.0), &vm_id).await?;
    Ok((deletion_status(&d), Json(d)))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct StuckQuery {
    /// List deletes unconfirmed for at least this many minutes (default 10; 0 lists every
    /// delete waiting for its host).
    pub older_than_minutes: Option<i64>,
}

/// Deletes that were accepted and never confirmed, oldest first: still billed, their
/// hosts still held.
#[utoipa::path(get, path = "/api/admin/stuck-deletes", tag = "admin", params(StuckQuery),
    responses((status = 200, body = Vec<StuckDelete>), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn get_stuck_deletes(
    State(state): State<AppState>,
    _op: Operator,
    Query(q): Query<StuckQuery>,
) -> AppResult<Json<Vec<StuckDelete>>> {
    let minutes = q.older_than_minutes.unwrap_or(STUCK_AFTER_MINUTES);
    if !(0..=60 * 24 * 365).contains(&minutes) {
        return Err(AppError::bad_request(
            "invalid_minutes",
            "older_than_minutes is between 0 and a year",
        ));
    }
    let found = notify_stuck_deletes::stuck(&state, TimeDelta::minutes(minutes)).await?;
    Ok(Json(found))
}
