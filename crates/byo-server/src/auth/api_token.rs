//! API tokens (issue #43): `Authorization: Bearer byo_api_…` on an `/api` route acts as the
//! person who made the token, within the token's scope, and nowhere else: not on a page, not
//! on a route that needs a session (the account's own doors), not past the person's roles.
//!
//! [`resolve`] runs once per request that presents one: it finds the token (by its hash),
//! judges it ([`judge`]: revoked, the person disabled, expired), notes its use and serves the
//! request inside [`byo_db::audit::VIA_TOKEN`], so every audit row the request writes names
//! the token. The [`crate::auth::CurrentUser`] extractor then admits the caller only where
//! [`reach`] says the scope reaches the route. A request that presents a token is judged by
//! the token alone: a session cookie riding along is not read, which is also why such a
//! request needs no cross-site check (`auth::csrf`): no browser adds this header by itself.

use std::net::IpAddr;

use axum::extract::{MatchedPath, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::api_tokens::ApiTokenRow;
use byo_wire::states::ApiScope;
use chrono::{DateTime, Utc};

use super::CurrentUser;
use crate::error::AppError;
use crate::state::AppState;

/// The token a request acts through, as its caller carries it.
#[derive(Clone, Debug)]
pub struct TokenUse {
    pub id: String,
    pub name: String,
    pub scope: ApiScope,
}

/// What [`resolve`] found for a request that presented an API token.
#[derive(Clone, Debug)]
enum Presented {
    Caller(CurrentUser),
    Refused { code: &'static str, message: String },
}

/// Routes no token reaches, whatever its scope, besides `/api/auth/…` (signing up, in and
/// out): the password, the
/// notice switches, the payment method and the payout account (a browser's, at Stripe) and
/// the tokens themselves — a leaked token must not mint, list or outlive others.
pub const SESSION_ONLY: &[(&str, &str)] = &[
    ("PUT", "/api/me/password"),
    ("PUT", "/api/me/notices"),
    ("POST", "/api/billing/payment-method"),
    ("POST", "/api/me/payouts/connect"),
    ("GET", "/api/me/tokens"),
    ("POST", "/api/me/tokens"),
    ("DELETE", "/api/me/tokens/{token_id}"),
];

/// Whether a token of `scope` reaches `method route` (the router's pattern).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    Yes,
    OutOfScope,
    SessionOnly,
}

/// The parts of the API a scope is made of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Area {
    /// Staff's: `/api/admin/…`.
    Operations,
    /// A customer's rentals, keys, queue, bookings and bill.
    Instances,
    /// An owner's machines, earnings and payouts.
    Hosts,
    /// Who you are and your notices: every scope reads it.
    Account,
    /// Anything else (the hosts' and Stripe's doors): no token reaches it.
    Elsewhere,
}

fn area(route: &str) -> Area {
    let under = |prefix: &str| {
        route == prefix
            || route
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    if under("/api/admin") {
        Area::Operations
    } else if [
        "/api/vms",
        "/api/ssh-keys",
        "/api/queue",
        "/api/prebookings",
        "/api/billing",
    ]
    .into_iter()
    .any(under)
    {
        Area::Instances
    } else if ["/api/hosts", "/api/me/earnings", "/api/me/payouts"]
        .into_iter()
        .any(under)
    {
        Area::Hosts
    } else if route == "/api/me" || under("/api/me/notices") {
        Area::Account
    } else {
        Area::Elsewhere
    }
}

/// The scope rule (docs/api-tokens.md): `read` reaches every GET outside the operations,
/// `instances` and `hosts` their own area and what you are, `admin` every area. The
/// person's roles still gate each route after this.
pub fn reach(scope: ApiScope, method: &Method, route: &str) -> Reach {
    if route.starts_with("/api/auth/")
        || SESSION_ONLY
            .iter()
            .any(|(m, r)| *m == method.as_str() && *r == route)
    {
        return Reach::SessionOnly;
    }
    let area = area(route);
    let reached = match (scope, area) {
        (_, Area::Elsewhere) => false,
        (ApiScope::Admin, _) => true,
        (_, Area::Operations) => false,
        (ApiScope::Read, _) => method == Method::GET,
        (ApiScope::Instances, Area::Instances) | (ApiScope::Hosts, Area::Hosts) => true,
        (_, Area::Account) => method == Method::GET,
        _ => false,
    };
    if reached {
        Reach::Yes
    } else {
        Reach::OutOfScope
    }
}

/// Why a presented token does not authenticate, if it does not: revoked, its person
/// disabled, or expired. Pure: time is passed in.
pub fn judge(
    token: &ApiTokenRow,
    person_disabled: bool,
    now: DateTime<Utc>,
) -> Result<(), (&'static str, String)> {
    if let Some(at) = token.revoked_at {
        return Err((
            "token_revoked",
            format!(
                "the API token \"{}\" was revoked on {}; make a new one on your account page",
                token.name,
                at.format("%Y-%m-%d")
            ),
        ));
    }
    if person_disabled {
        return Err(("invalid_token", "this API token is not valid".to_owned()));
    }
    if token.expires_at <= now {
        return Err((
            "token_expired",
            format!(
                "the API token \"{}\" expired on {}; make a new one on your account page",
                token.name,
                token.expires_at.format("%Y-%m-%d")
            ),
        ));
    }
    Ok(())
}

/// The API token a request presents, if it presents one (`Bearer byo_api_…`, well formed
/// or not).
fn presented(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .filter(|t| t.starts_with(TokenKind::Api.prefix()))
}

/// Whether a request presents an API token (the cross-site check lets it pass: see the
/// module's note).
pub fn presents_api_token(headers: &HeaderMap) -> bool {
    presented(headers).is_some()
}

fn is_api(path: &str) -> bool {
    path.starts_with("/api/")
}

/// Middleware: find and judge the API token a request to `/api` presents, note its use,
/// and serve the request as the token's (see the module's note).
pub async fn resolve(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let Some(text) = presented(request.headers())
        .filter(|_| is_api(request.uri().path()))
        .map(str::to_owned)
    else {
        return next.run(request).await;
    };
    let from = crate::rate_limit::source_of(request.extensions());
    let found = match find(&state, &text, from).await {
        Ok(found) => found,
        Err(e) => return e.into_response(),
    };
    let name = match &found {
        Presented::Caller(c) => c.via.as_ref().map(|t| t.name.clone()),
        Presented::Refused { .. } => None,
    };
    request.extensions_mut().insert(found);
    match name {
        Some(name) => {
            byo_db::audit::VIA_TOKEN
                .scope(name, next.run(request))
                .await
        }
        None => next.run(request).await,
    }
}

async fn find(state: &AppState, text: &str, from: IpAddr) -> Result<Presented, AppError> {
    let refused = |code, message: &str| Presented::Refused {
        code,
        message: message.to_owned(),
    };
    let Ok(token) = SecretToken::parse(TokenKind::Api, text) else {
        return Ok(refused(
            "invalid_token",
            "that is not a whole API token (byo_api_…); copy it again",
        ));
    };
    let Some(found) = state.store.api_token_by_hash(&token.hash()).await? else {
        return Ok(refused("invalid_token", "this API token is not valid"));
    };
    let now = state.clock.now();
    if let Err((code, message)) = judge(&found.token, found.user.disabled_at.is_some(), now) {
        return Ok(Presented::Refused { code, message });
    }
    let from = from.to_string();
    if let Err(e) = state
        .store
        .touch_api_token(&found.token.id, now, &from)
        .await
    {
        // The use is served either way; only its note is lost.
        tracing::warn!(token = %found.token.id, error = %e, "could not note an API token's use");
    }
    let roles = state.store.roles_of(&found.user.sub).await?;
    Ok(Presented::Caller(CurrentUser {
        user: found.user,
        roles,
        via: Some(TokenUse {
            id: found.token.id,
            name: found.token.name,
            scope: found.token.scope,
        }),
    }))
}

/// The caller of a request that carries an `Authorization` header: the token's person where
/// its scope reaches the route, a refusal otherwise; nobody on a page.
pub(super) fn caller(parts: &Parts) -> Result<Option<CurrentUser>, AppError> {
    if !is_api(parts.uri.path()) {
        return Ok(None);
    }
    let caller = match parts.extensions.get::<Presented>() {
        None => {
            return Err(AppError::TokenRefused {
                code: "invalid_token",
                message: "send an API token (byo_api_…) as Authorization: Bearer, or sign in"
                    .to_owned(),
            });
        }
        Some(Presented::Refused { code, message }) => {
            return Err(AppError::TokenRefused {
                code,
                message: message.clone(),
            });
        }
        Some(Presented::Caller(c)) => c,
    };
    let scope = caller.via.as_ref().map_or(ApiScope::Read, |t| t.scope);
    let route = parts
        .extensions
        .get::<MatchedPath>()
        .map_or("", MatchedPath::as_str);
    match reach(scope, &parts.method, route) {
        Reach::Yes => Ok(Some(caller.clone())),
        Reach::SessionOnly => Err(AppError::Denied {
            code: "session_only",
            message: format!(
                "{} {route} needs a signed-in session; no API token reaches it",
                parts.method
            ),
        }),
        Reach::OutOfScope => Err(AppError::Denied {
            code: "out_of_scope",
            message: format!(
                "this token's scope ({scope}) does not reach {} {route}; make a token with the \
                 scope it needs",
                parts.method
            ),
        }),
    }
}
