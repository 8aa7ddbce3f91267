//! admin-host-action over HTTP: activation and revocation. The rules are
//! [`crate::app::admin_host_action`]'s.

use axum::extract::{Path, State};
use byo_wire::api::{ActivateRequest, ErrorBody};

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
    admin_host_action::activate(&state, &op, &host_id, &req.placement, req.change).await?;
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
