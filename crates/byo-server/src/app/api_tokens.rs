//! A person's API tokens (issue #43): made, listed and revoked from a signed-in session only
//! (the routes are session-only, and these rules refuse a token's caller too, for the pages'
//! sake). The secret is shown once, at creation; only its hash is kept. What a token reaches
//! is `auth::api_token`'s rule.

use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::DbError;
use byo_db::api_tokens::{ApiTokenRow, MAX_LIVE_TOKENS, NewApiToken as NewTokenRow};
use byo_wire::api::{ApiTokenView, CreatedApiToken, NewApiToken};
use byo_wire::states::ApiScope;
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;

use crate::auth::CurrentUser;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// A token lives this long unless its maker says otherwise.
pub const DEFAULT_DAYS: u32 = 90;
/// And never longer than this.
pub const MAX_DAYS: u32 = 365;

pub fn view(row: ApiTokenRow, now: DateTime<Utc>) -> ApiTokenView {
    ApiTokenView {
        expired: row.expires_at <= now,
        id: row.id,
        name: row.name,
        scope: row.scope,
        created_at: row.created_at,
        expires_at: row.expires_at,
        last_used_at: row.last_used_at,
        last_used_from: row.last_used_from,
    }
}

fn session_only(user: &CurrentUser) -> AppResult<()> {
    match user.via {
        Some(_) => Err(AppError::Denied {
            code: "session_only",
            message: "API tokens are made, listed and revoked from a signed-in session".into(),
        }),
        None => Ok(()),
    }
}

/// Make a token for `user`: named, scoped no higher than their roles, expiring within
/// [`MAX_DAYS`]. Returns the secret, this once.
pub async fn create(
    state: &AppState,
    user: &CurrentUser,
    req: &NewApiToken,
) -> AppResult<CreatedApiToken> {
    session_only(user)?;
    byo_wire::limits::Bounded::check_bounds(req).map_err(AppError::out_of_bounds)?;
    let name = req.name.trim();
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(AppError::bad_request(
            "invalid_name",
            "a token's name is 1 to 64 printable characters, say where it is used (\"laptop\", \
             \"ci-deploy\")",
        ));
    }
    let days = req.expires_in_days.unwrap_or(DEFAULT_DAYS);
    if days == 0 || days > MAX_DAYS {
        return Err(AppError::bad_request(
            "invalid_expiry",
            format!("a token expires in 1 to {MAX_DAYS} days (the default is {DEFAULT_DAYS})"),
        ));
    }
    if req.scope == ApiScope::Admin && !user.is_operator() {
        return Err(AppError::Denied {
            code: "scope_above_roles",
            message: "only staff (operators and superadmins) may make an admin token; choose \
                      read, instances or hosts"
                .into(),
        });
    }
    let secret = SecretToken::generate(TokenKind::Api);
    let now = state.clock.now();
    let row = state
        .store
        .insert_api_token(
            NewTokenRow {
                user_sub: &user.user.sub,
                name,
                scope: req.scope,
                token_hash: &secret.hash(),
                expires_at: now + TimeDelta::days(i64::from(days)),
            },
            now,
        )
        .await
        .map_err(|e| match e {
            DbError::Conflict(what) if what == "api_tokens_too_many" => AppError::conflict(
                "too_many_tokens",
                format!(
                    "you hold {MAX_LIVE_TOKENS} tokens already; revoke one you no longer use first"
                ),
            ),
            DbError::Conflict(_) => AppError::conflict(
                "name_taken",
                format!(
                    "you already have a token named \"{name}\"; revoke it or choose another name"
                ),
            ),
            other => other.into(),
        })?;
    state
        .store
        .audit(
            Some(&user.user.sub),
            "api_token.create",
            Some(&row.id),
            json!({"name": row.name, "scope": row.scope, "expires_at": row.expires_at}),
            now,
        )
        .await?;
    Ok(CreatedApiToken {
        token: secret.expose().to_owned(),
        api_token: view(row, now),
    })
}

/// `user`'s tokens that are not revoked, newest first.
pub async fn list(state: &AppState, user: &CurrentUser) -> AppResult<Vec<ApiTokenView>> {
    session_only(user)?;
    let now = state.clock.now();
    Ok(state
        .store
        .api_tokens_of(&user.user.sub)
        .await?
        .into_iter()
        .map(|row| view(row, now))
        .collect())
}

/// Revoke one of `user`'s tokens: refused from the next request on. Another person's is as
/// absent as one that does not exist.
pub async fn revoke(state: &AppState, user: &CurrentUser, id: &str) -> AppResult<ApiTokenView> {
    session_only(user)?;
    let now = state.clock.now();
    let row = state
        .store
        .revoke_api_token(&user.user.sub, id, now)
        .await?
        .ok_or(AppError::NotFound)?;
    state
        .store
        .audit(
            Some(&user.user.sub),
            "api_token.revoke",
            Some(&row.id),
            json!({"name": row.name, "scope": row.scope}),
            now,
        )
        .await?;
    Ok(view(row, now))
}
