//! The operator's view of users: every user with their grants, changing a grant, and the
//! audit log.

use byo_wire::Role;
use byo_wire::api::{AuditEntry, UserView};
use serde_json::json;

use crate::app::accounts::user_view;
use crate::auth::Operator;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// Every user, with their grants and how many hosts they own.
pub async fn list(state: &AppState) -> AppResult<Vec<UserView>> {
    let users = state.store.users_overview().await?;
    Ok(users
        .into_iter()
        .map(|u| UserView {
            sub: u.user.sub,
            email: u.user.email,
            display_name: u.user.display_name,
            roles: u.roles,
            hosts_owned: u.hosts_owned,
            created_at: u.user.created_at,
        })
        .collect())
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
                if e.breaks(byo_db::Rule::LastSuperadmin) {
                    AppError::conflict("last_superadmin", "the last superadmin cannot be revoked")
                } else {
                    e.into()
                }
            })?
    };
    if changed && !grant && matches!(role, Role::Operator | Role::Superadmin) {
        // I: leaving is one action. Someone who is no longer an operator has their keys
        // drafted off the list in the same step; the next signed list takes them off
        // every host.
        let roles = state.store.roles_of(&target.sub).await?;
        if !roles
            .iter()
            .any(|r| matches!(r, Role::Operator | Role::Superadmin))
            && let Some(version) =
                crate::app::operator_keys::depart(state, &by.0.user.sub, &target.sub).await?
        {
            tracing::info!(user = %target.sub, version, "operator left: their keys are drafted off the list");
        }
    }
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

/// The newest audit entries: `limit` of them (default 100, at most 500).
pub async fn audit_log(state: &AppState, limit: Option<i64>) -> AppResult<Vec<AuditEntry>> {
    let limit = limit.unwrap_or(100).clamp(1, 500);
    let rows = state.store.audit_log(limit).await?;
    Ok(rows
        .into_iter()
        .map(|r| AuditEntry {
            via_token: r.via_token,
            id: r.id,
            at: r.at,
            actor_sub: r.actor_sub,
            action: r.action,
            target: r.target,
            details: r.details.0,
        })
        .collect())
}
