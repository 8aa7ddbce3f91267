//! The host token: how host-report, the heartbeat and the operator-key fetch know which
//! host is calling. One parser and one refusal, so all answer an unknown or retired host
//! alike.

use axum::Json;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use byo_core::tokens::{SecretToken, TokenKind};
use serde_json::json;

/// One answer for every host token that does not authenticate (host-report, heartbeats,
/// the operator-key fetch).
pub fn invalid_host_token() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": "invalid_token", "message": "this host token is not valid"})),
    )
        .into_response()
}

/// The host token a request carries, if it is one in form; whether it is a live host's is
/// the store's to say.
pub fn presented_host_token(headers: &HeaderMap) -> Option<SecretToken> {
    presented_token(headers, TokenKind::Host)
}

/// The bearer token of `kind` a request carries, if it is one in form (the enrolment token,
/// the host token, a relay's secrets token); whether it is live is the store's to say.
pub fn presented_token(headers: &HeaderMap, kind: TokenKind) -> Option<SecretToken> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| SecretToken::parse(kind, t).ok())
}
