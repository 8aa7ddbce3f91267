//! admin-vm-action over HTTP: an operator's delete and the stuck-delete list. The rules are
//! [`crate::app::admin_vm_action`]'s.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use byo_wire::api::ErrorBody;
use byo_wire::vm::{InstanceDeletion, StuckDelete};
use serde::Deserialize;

use crate::app::admin_vm_action;
use crate::auth::Operator;
use crate::error::AppResult;
use crate::error::deletion_status;
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
    let d = admin_vm_action::delete(&state, &op, &vm_id).await?;
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
    Ok(Json(
        admin_vm_action::stuck_deletes(&state, q.older_than_minutes).await?,
    ))
}
