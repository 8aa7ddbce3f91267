//! Where the host's relay is now, over HTTP: the host token unpacked; and a relay's fetch of
//! its secrets, its own token unpacked. The rule is
//! [`crate::app::host_relay`]'s.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use byo_core::tokens::TokenKind;
use byo_wire::api::ErrorBody;
use byo_wire::enroll::HostRelay;
use serde_json::json;

use crate::app::host_relay;
use crate::auth::host_token::{invalid_host_token, presented_host_token, presented_token};
use crate::error::AppResult;
use crate::rate_limit::Source;
use crate::state::AppState;

/// The host's relay as it stands now: its public WireGuard endpoint, once it has an address.
#[utoipa::path(get, path = "/api/host/relay", tag = "hosts",
    responses((status = 200, body = HostRelay), (status = 401, body = ErrorBody)))]
pub async fn get_relay(State(state): State<AppState>, headers: HeaderMap) -> AppResult<Response> {
    let Some(token) = presented_host_token(&headers) else {
        return Ok(invalid_host_token());
    };
    Ok(match host_relay::current(&state, &token).await? {
        Some(relay) => Json(relay).into_response(),
        None => invalid_host_token(),
    })
}

/// A relay's one fetch of its secrets at its first boot, with the single-use token its
/// startup script carries: its WireGuard private key and its TLS certificate and key, as
/// `text/plain` in `byo_core::render::relay_bootstrap::RelaySecrets`' format. Every token
/// that does not qualify (unknown, spent, lapsed, the host retired or being revoked) gets
/// one 401.
#[utoipa::path(post, path = "/api/relay/secrets", tag = "hosts",
    responses((status = 200, description = "the relay's secrets", content_type = "text/plain", body = String),
        (status = 401, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn post_relay_secrets(
    State(state): State<AppState>,
    Source(from): Source,
    headers: HeaderMap,
) -> AppResult<Response> {
    let answer = match presented_token(&headers, TokenKind::RelaySecrets) {
        Some(token) => host_relay::secrets(&state, &token, from).await?,
        None => None,
    };
    Ok(match answer {
        Some(text) => ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response(),
        None => (
            StatusCode::UNAUTHORIZED,
            Json(json!({
                "error": "invalid_token",
                "message": "this relay token is not valid: unknown, already spent, or lapsed; \
                            replace the relay from the host's page"
            })),
        )
            .into_response(),
    })
}
