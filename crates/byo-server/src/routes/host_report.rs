//! host-report: what the host's agent tells the backend about its preparation, step by
//! step, authenticated by the host token it received at redeem. Progress is what the owner
//! watches and what the operator reads before approving (D).

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_wire::api::ErrorBody;
use byo_wire::prepare::HostReport;
use serde_json::json;

use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// One answer for every host token that does not authenticate (host-report, heartbeats).
pub(crate) fn invalid_host_token() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": "invalid_token", "message": "this host token is not valid"})),
    )
        .into_response()
}

/// The host token a request carries, if it is one in form; whether it is a live host's is
/// the store's to say.
pub(crate) fn presented_host_token(headers: &HeaderMap) -> Option<SecretToken> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| SecretToken::parse(TokenKind::Host, t).ok())
}

/// Report one prepare step's progress (node 0, or a satellite by its index).
#[utoipa::path(post, path = "/api/host/report", tag = "hosts", request_body = HostReport,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn post_report(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<HostReport>, JsonRejection>,
) -> AppResult<Response> {
    let Some(token) = presented_host_token(&headers) else {
        return Ok(invalid_host_token());
    };
    let Some(host_id) = state.store.host_id_by_token(&token.hash()).await? else {
        return Ok(invalid_host_token());
    };
    let Json(report) = body.map_err(|e| AppError::bad_request("invalid_report", e.body_text()))?;
    let node = i32::try_from(report.node)
        .map_err(|_| AppError::bad_request("invalid_report", "no such node"))?;
    let value = serde_json::to_value(&report.state).map_err(anyhow::Error::from)?;
    let now = state.clock.now();
    if !state
        .store
        .record_prepare_state(&host_id, node, &value, report.completed && node == 0, now)
        .await?
    {
        return Err(AppError::bad_request(
            "unknown_node",
            format!("this host has no node {}", report.node),
        ));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}
