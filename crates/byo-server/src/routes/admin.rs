//! The operator's users page and audit log, as API.

use axum::Json;
use axum::extract::{Path, Query, State};
use byo_wire::Role;
use byo_wire::api::{AuditEntry, ErrorBody, UserView};
use serde::Deserialize;
use serde_json::json;

use crate::accounts::user_view;
use crate::auth::Operator;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// Every user, with their grants and how many hosts they own.
#[utoipa::path(get, path = "/api/admin/users", tag = "admin",
    responses((status = 200, body = Vec<UserView>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_users(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<Vec<UserView>>> {
    let users = state.store.users_overview().await?;
    Ok(Json(
        users
            .into_iter()
            .map(|u| UserView {
                sub: u.user.sub,
                email: u.user.email,
                display_name: u.user.display_name,
                roles: u.roles,
                hosts_owned: u.hosts_owned,
                created_at: u.user.created_at,
            })
            .collect(),
    ))
}

fn parse_role(role: &str) -> AppResult<Role> {
    role.parse().map_err(|e: byo_wire::role::UnknownRole| {
        AppError::bad_request("unknown_role", e.to_string())
    })
}

/// Change a grant: operators grant and revoke community_host; only a superadmin changes
/// operator or superadmin.
pub async fn change_grant(
    state: &AppState,
    by: &Operator,
    sub: &str,
    role: &str,
    grant: bool,
) -> AppResult<UserView> {
    let role = parse_role(role)?;
    if !by.0.may_grant(role) {
        return Err(AppError::Forbidden(
            "only a superadmin changes operator and superadmin grants",
        ));
    }
    let target = state.store.user(sub).await?.ok_or(AppError::NotFound)?;
    let now = state.clock.now();
    let changed = if grant {
        state
            .store
            .grant_role(&target.sub, role, Some(&by.0.user.sub), now)
            .await?
    } else {
        state
            .store
            .revoke_role(&target.sub, role)
            .await
            .map_err(|e| {
                if e.is_constraint("last_superadmin") {
                    AppError::conflict("last_superadmin", "the last superadmin cannot be revoked")
                } else {
                    e.into()
                }
            })?
    };
    if changed {
        let action = if grant { "role.grant" } else { "role.revoke" };
        state
            .store
            .audit(
                Some(&by.0.user.sub),
                action,
                Some(&target.sub),
                json!({"role": role}),
                now,
            )
            .await?;
    }
    user_view(state, target).await
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
    Ok(Json(change_grant(&state, &op, &sub, &role, true).await?))
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
    Ok(Json(change_grant(&state, &op, &sub, &role, false).await?))
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
    let limit = q.limit.unwrap_or(100).clamp(1, 500);
    let rows = state.store.audit_log(limit).await?;
    Ok(Json(
        rows.into_iter()
            .map(|r| AuditEntry {
                id: r.id,
                at: r.at,
                actor_sub: r.actor_sub,
                action: r.action,
                target: r.target,
                details: r.details.0,
            })
            .collect(),
    ))
}
