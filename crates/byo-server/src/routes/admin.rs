//! The operator's users page, audit log and background jobs, as API. The rules are [`crate::app::users`]'s.

use axum::Json;
use axum::extract::{Path, Query, State};
use byo_wire::api::{AuditEntry, ErrorBody, JobView, UserView};
use serde::Deserialize;

use crate::app::users;
use crate::auth::Operator;
use crate::error::AppResult;
use crate::state::AppState;

/// Every user, with their grants and how many hosts they own.
#[utoipa::path(get, path = "/api/admin/users", tag = "admin",
    responses((status = 200, body = Vec<UserView>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_users(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<Vec<UserView>>> {
    Ok(Json(users::list(&state).await?))
}

#[utoipa::path(put, path = "/api/admin/users/{sub}/roles/{role}", tag = "admin",
    params(("sub" = String, Path, description = "the user's sub"),
           ("role" = String, Path, description = "superadmin, operator or community_host")),
    responses((status = 200, body = UserView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn grant_role(
    State(state): State<AppState>,
    op: Operator,
    Path((sub, role)): Path<(String, String)>,
) -> AppResult<Json<UserView>> {
    Ok(Json(
        users::change_grant(&state, &op, &sub, &role, true).await?,
    ))
}

#[utoipa::path(delete, path = "/api/admin/users/{sub}/roles/{role}", tag = "admin",
    params(("sub" = String, Path, description = "the user's sub"),
           ("role" = String, Path, description = "superadmin, operator or community_host")),
    responses((status = 200, body = UserView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn revoke_role(
    State(state): State<AppState>,
    op: Operator,
    Path((sub, role)): Path<(String, String)>,
) -> AppResult<Json<UserView>> {
    Ok(Json(
        users::change_grant(&state, &op, &sub, &role, false).await?,
    ))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct AuditQuery {
    /// At most this many entries, newest first (default 100, at most 500).
    pub limit: Option<i64>,
}

#[utoipa::path(get, path = "/api/admin/audit", tag = "admin", params(AuditQuery),
    responses((status = 200, body = Vec<AuditEntry>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn audit_log(
    State(state): State<AppState>,
    _op: Operator,
    Query(q): Query<AuditQuery>,
) -> AppResult<Json<Vec<AuditEntry>>> {
    Ok(Json(users::audit_log(&state, q.limit).await?))
}

/// Each background job with its period and its newest runs (issue #13; `app::jobs`).
#[utoipa::path(get, path = "/api/admin/jobs", tag = "admin",
    responses((status = 200, body = Vec<JobView>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn jobs(State(state): State<AppState>, _op: Operator) -> AppResult<Json<Vec<JobView>>> {
    Ok(Json(crate::app::jobs::overview(&state).await?))
}
