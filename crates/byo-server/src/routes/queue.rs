//! The queue (E2) over HTTP: the customer's queued creates (list, cancel, keep waiting,
//! the ones that ended) and the
//! operators' (list, place by hand, close — E0's caller 4). The rules are
//! [`crate::app::queue_drain`]'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use byo_wire::api::ErrorBody;
use byo_wire::vm::{
    AdminQueuedView, EndedQueuedView, InstanceView, QueueCloseRequest, QueuePlaceRequest,
    QueuedView,
};

use crate::app::queue_drain;
use crate::app::queued;
use crate::auth::{CurrentUser, Operator};
use crate::error::AppResult;
use crate::extract::Checked;
use crate::state::AppState;

/// Your queued creates, each with its place in line (1 is next) and why the last try did
/// not place it.
#[utoipa::path(get, path = "/api/queue", tag = "instances",
    responses((status = 200, body = Vec<QueuedView>), (status = 401, body = ErrorBody)))]
pub async fn get_queue(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<Vec<QueuedView>>> {
    Ok(Json(queued::mine(&state, &user).await?))
}

/// Cancel one of your queued creates (204). 404 for one that is not yours or not open;
/// 409 while a host is being asked to take it.
#[utoipa::path(delete, path = "/api/queue/{queue_id}", tag = "instances",
    params(("queue_id" = String, Path, description = "the queued create's id")),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn delete_queued(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(queue_id): Path<String>,
) -> AppResult<StatusCode> {
    queued::cancel(&state, &user, &queue_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Keep waiting: your open queued create lapses the configured age (72 h by default)
/// from now instead (200 with the row). 404 for one that is not yours or not open.
#[utoipa::path(post, path = "/api/queue/{queue_id}/extend", tag = "instances",
    params(("queue_id" = String, Path, description = "the queued create's id")),
    responses((status = 200, body = QueuedView), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn post_extend(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(queue_id): Path<String>,
) -> AppResult<Json<QueuedView>> {
    Ok(Json(queued::extend(&state, &user, &queue_id).await?))
}

/// Your queued creates that ended in the last 7 days, latest first, and how: placed (the
/// instance), cancelled, closed by an operator, or expired.
#[utoipa::path(get, path = "/api/queue/ended", tag = "instances",
    responses((status = 200, body = Vec<EndedQueuedView>), (status = 401, body = ErrorBody)))]
pub async fn get_ended(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<Vec<EndedQueuedView>>> {
    Ok(Json(queued::ended(&state, &user).await?))
}

/// Every open queued create, oldest first.
#[utoipa::path(get, path = "/api/admin/queue", tag = "admin",
    responses((status = 200, body = Vec<AdminQueuedView>), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody)))]
pub async fn get_admin_queue(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<Vec<AdminQueuedView>>> {
    Ok(Json(queued::open_rows(&state).await?))
}

/// Place a queued create on the host you name (201 with the instance). 409 when the row
/// is closed or being placed, the host is not active, of another gpu_type, unreachable or
/// holds a live instance, or the key is gone; 502/504 when the host refused or was silent.
#[utoipa::path(post, path = "/api/admin/queue/{queue_id}/place", tag = "admin",
    request_body = QueuePlaceRequest,
    params(("queue_id" = String, Path, description = "the queued create's id")),
    responses((status = 201, body = InstanceView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn post_place(
    State(state): State<AppState>,
    op: Operator,
    Path(queue_id): Path<String>,
    Checked(req): Checked<QueuePlaceRequest>,
) -> AppResult<(StatusCode, Json<InstanceView>)> {
    let view = queue_drain::place_by_operator(&state, &op.0, &queue_id, &req.host_id).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// Close a queued create, saying why (204). 404 unknown, 409 already closed or being placed.
#[utoipa::path(post, path = "/api/admin/queue/{queue_id}/close", tag = "admin",
    request_body = QueueCloseRequest,
    params(("queue_id" = String, Path, description = "the queued create's id")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn post_close(
    State(state): State<AppState>,
    op: Operator,
    Path(queue_id): Path<String>,
    Checked(req): Checked<QueueCloseRequest>,
) -> AppResult<StatusCode> {
    queued::close_by_operator(&state, &op.0, &queue_id, &req.reason).await?;
    Ok(StatusCode::NO_CONTENT)
}
