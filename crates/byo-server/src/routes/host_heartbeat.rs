//! The heartbeat (step 133): node0's agent reports its subsystems on the one schedule
//! serving keeps, authenticated by the host token, and the backend keeps the latest as the
//! host's host_status row with `seen_at` from its own clock. An unknown or retired host's
//! token gets the same 401 as host-report's, whatever the body.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use byo_wire::api::ErrorBody;
use byo_wire::vm::Heartbeat;

use crate::error::{AppError, AppResult};
use crate::routes::host_report::{invalid_host_token, presented_host_token};
use crate::state::AppState;

/// How large `details` may be, serialised.
pub const MAX_DETAILS_BYTES: usize = 16 * 1024;

fn check(beat: &Heartbeat) -> AppResult<()> {
    let v = &beat.agent_version;
    if v.is_empty() || v.len() > 64 || v.chars().any(char::is_control) {
        return Err(AppError::bad_request(
            "invalid_heartbeat",
            "agent_version is 1 to 64 printable characters",
        ));
    }
    if !(beat.details.is_null() || beat.details.is_object()) {
        return Err(AppError::bad_request(
            "invalid_heartbeat",
            "details is a JSON object",
        ));
    }
    if beat.details.to_string().len() > MAX_DETAILS_BYTES {
        return Err(AppError::bad_request(
            "invalid_heartbeat",
            format!("details is at most {MAX_DETAILS_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Report the host's health; kept as its host_status row.
#[utoipa::path(post, path = "/api/host/heartbeat", tag = "hosts", request_body = Heartbeat,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn post_heartbeat(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Json<Heartbeat>, JsonRejection>,
) -> AppResult<Response> {
    let Some(token) = presented_host_token(&headers) else {
        return Ok(invalid_host_token());
    };
    let hash = token.hash();
    let beat = match body.map_err(|e| e.body_text()).and_then(|Json(b)| {
        check(&b).map_err(|e| e.to_string())?;
        Ok(b)
    }) {
        Ok(beat) => beat,
        Err(why) => {
            // A body we cannot use is the host's to hear about only if it is a host.
            if state.store.host_id_by_token(&hash).await?.is_none() {
                return Ok(invalid_host_token());
            }
            return Err(AppError::bad_request("invalid_heartbeat", why));
        }
    };
    // The token lookup and the upsert are one statement: one round trip per beat.
    match state
        .store
        .record_heartbeat(&hash, &beat, state.clock.now())
        .await?
    {
        Some(_) => Ok(StatusCode::NO_CONTENT.into_response()),
        None => Ok(invalid_host_token()),
    }
}
