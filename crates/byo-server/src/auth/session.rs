//! Cookie sessions and the role gates handlers declare in their signatures.
//!
//! The cookie holds a random `byo_ses_…` token; the database holds its SHA-256. The
//! cookie is HttpOnly (no script reads it), Secure (configurable for plain-HTTP
//! deployments) and SameSite=Lax (not sent on cross-site POSTs).

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::http::request::Parts;
use axum_extra::extract::cookie::{Cookie, CookieJar, SameSite};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::users::UserRow;
use byo_wire::Role;

use crate::error::AppError;
use crate::state::AppState;

/// The session cookie's name over plain HTTP (`byo up` on an address, tests).
pub const SESSION_COOKIE: &str = "byo_session";
/// Its name when cookies are Secure: the `__Host-` prefix makes the browser refuse it unless
/// it is Secure, has `Path=/` and no `Domain` — so no sibling subdomain can set or shadow it.
pub const SECURE_SESSION_COOKIE: &str = "__Host-byo_session";

/// The session cookie's name under this configuration.
pub fn session_cookie(secure: bool) -> &'static str {
    if secure {
        SECURE_SESSION_COOKIE
    } else {
        SESSION_COOKIE
    }
}

/// A signed-in user and their grants.
#[derive(Clone, Debug)]
pub struct CurrentUser {
    pub user: UserRow,
    pub roles: Vec<Role>,
    /// The API token the request came with, if not a session (issue #43).
    pub via: Option<super::api_token::TokenUse>,
}

impl CurrentUser {
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// Operators and superadmins see the operator pages.
    pub fn is_operator(&self) -> bool {
        self.has(Role::Operator) || self.has(Role::Superadmin)
    }

    /// Whether this user may grant or revoke `role`: community_host is an operator's to
    /// give (the users page); operator and superadmin only a superadmin's.
    pub fn may_grant(&self, role: Role) -> bool {
        match role {
            Role::CommunityHost => self.is_operator(),
            Role::Operator | Role::Superadmin => self.has(Role::Superadmin),
        }
    }
}

async fn current_user(
    parts: &mut Parts,
    state: &AppState,
) -> Result<Option<CurrentUser>, AppError> {
    // A request that brings credentials in the header is judged by them alone.
    if parts
        .headers
        .contains_key(axum::http::header::AUTHORIZATION)
    {
        return super::api_token::caller(parts);
    }
    let jar = CookieJar::from_headers(&parts.headers);
    let Some(cookie) = jar.get(session_cookie(state.config.cookie_secure)) else {
        return Ok(None);
    };
    let Ok(token) = SecretToken::parse(TokenKind::Session, cookie.value()) else {
        return Ok(None);
    };
    let Some((user, roles)) = state
        .store
        .session_user(&token.hash(), state.clock.now())
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(CurrentUser {
        user,
        roles,
        via: None,
    }))
}

impl FromRequestParts<AppState> for CurrentUser {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        current_user(parts, state)
            .await?
            .ok_or(AppError::Unauthenticated)
    }
}

impl OptionalFromRequestParts<AppState> for CurrentUser {
    type Rejection = AppError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Option<Self>, AppError> {
        current_user(parts, state).await
    }
}

/// An operator or a superadmin.
#[derive(Clone, Debug)]
pub struct Operator(pub CurrentUser);

impl FromRequestParts<AppState> for Operator {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let user =
            <CurrentUser as FromRequestParts<AppState>>::from_request_parts(parts, state).await?;
        if user.is_operator() {
            Ok(Operator(user))
        } else {
            Err(AppError::Forbidden("operators only"))
        }
    }
}

/// A superadmin.
#[derive(Clone, Debug)]
pub struct Superadmin(pub CurrentUser);

impl FromRequestParts<AppState> for Superadmin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let user =
            <CurrentUser as FromRequestParts<AppState>>::from_request_parts(parts, state).await?;
        if user.has(Role::Superadmin) {
            Ok(Superadmin(user))
        } else {
            Err(AppError::Forbidden("superadmins only"))
        }
    }
}

/// Open a session for `user_sub` and return the cookie that carries it.
pub async fn start_session(state: &AppState, user_sub: &str) -> Result<Cookie<'static>, AppError> {
    let token = SecretToken::generate(TokenKind::Session);
    let now = state.clock.now();
    let hours = state.config.session_hours;
    state
        .store
        .create_session(
            &token.hash(),
            user_sub,
            now,
            now + chrono::Duration::hours(hours),
        )
        .await?;
    Ok(Cookie::build((
        session_cookie(state.config.cookie_secure),
        token.expose().to_owned(),
    ))
    .http_only(true)
    .secure(state.config.cookie_secure)
    .same_site(SameSite::Lax)
    .path("/")
    .max_age(cookie_time::Duration::hours(hours))
    .build())
}

/// End the session the request carries (if any) and return the cookie that clears it.
pub async fn end_session(state: &AppState, jar: &CookieJar) -> Result<Cookie<'static>, AppError> {
    if let Some(token) = jar
        .get(session_cookie(state.config.cookie_secure))
        .and_then(|c| SecretToken::parse(TokenKind::Session, c.value()).ok())
    {
        state.store.delete_session(&token.hash()).await?;
    }
    Ok(
        Cookie::build((session_cookie(state.config.cookie_secure), ""))
            .secure(state.config.cookie_secure)
            .path("/")
            .max_age(cookie_time::Duration::ZERO)
            .build(),
    )
}

use cookie::time as cookie_time;
