//! Where the host's relay is now, over HTTP: the host token unpacked. The rule is
//! [`crate::app::host_relay`]'s.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use byo_wire::api::ErrorBody;
use byo_wire::enroll::HostRelay;

use crate::app::host_relay;
use crate::auth::host_token::{invalid_host_token, presented_host_token};
use crate::error::AppResult;
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
