//! admin-host-action over HTTP: activation and revocation. The rules are
//! [`crate::app::admin_host_action`]'s.

use axum::extract::{Path, State};
use byo_wire::api::{ActivateRequest, ErrorBody, PathWalkView};

use crate::app::admin_host_action;
use crate::auth::Operator;
use crate::error::AppResult;
use crate::extract::Checked;
use crate::state::AppState;

/// Activate a host whose preparation finished: the single flag, plus the placement.
#[utoipa::path(post, path = "/api/admin/hosts/{host_id}/activate", tag = "admin", request_body = ActivateRequest,
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_activate(
    State(state): State<AppState>,
    op: Operator,
    Path(host_id): Path<String>,
    Checked(req): Checked<ActivateRequest>,
) -> AppResult<axum::http::StatusCode> {
    admin_host_action::activate(
        &state,
        &op,
        &host_id,
        &req.placement,
        req.change,
        req.walk_override.as_deref(),
    )
    .await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// Revoke an enrolment before it redeems (H); its allocation is handed back at once.
#[utoipa::path(post, path = "/api/admin/enrollments/{enrollment_id}/revoke", tag = "admin",
    params(("enrollment_id" = String, Path, description = "the enrolment's id")),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_revoke(
    State(state): State<AppState>,
    op: Operator,
    Path(enrollment_id): Path<String>,
) -> AppResult<axum::http::StatusCode> {
    admin_host_action::revoke(&state, &op, &enrollment_id).await?;
    Ok(axum::http::StatusCode::NO_CONTENT)
}

/// Walk the host's customer path now (issue #38, 4): a scratch instance made, logged in to
/// over ssh through the relay as a customer would, deleted. Answers the walk, passed or
/// failed; refused (409) for a host in service, holding an instance, not prepared, without a
/// relay address, or already being walked.
#[utoipa::path(post, path = "/api/admin/hosts/{host_id}/walk", tag = "admin",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 200, body = PathWalkView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_walk(
    State(state): State<AppState>,
    op: Operator,
    Path(host_id): Path<String>,
) -> AppResult<axum::Json<PathWalkView>> {
    let walk = crate::app::path_walk::walk(&state, &host_id, Some(&op.0.user.sub)).await?;
    Ok(axum::Json(crate::app::path_walk::view(walk)))
}
