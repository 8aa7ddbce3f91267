//! The heartbeat (step 133) over HTTP: the host token and the beat unpacked. The rules are
//! [`crate::app::host_heartbeat`]'s.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use byo_wire::api::ErrorBody;
use byo_wire::vm::Heartbeat;

use crate::app::host_heartbeat;
use crate::app::host_report::HostCall;
use crate::auth::host_token::{invalid_host_token, presented_host_token};
use crate::error::{AppError, AppResult};
use crate::extract::Checked;
use crate::state::AppState;

/// Report the host's health; kept as its host_status row.
#[utoipa::path(post, path = "/api/host/heartbeat", tag = "hosts", request_body = Heartbeat,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn post_heartbeat(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Checked<Heartbeat>, AppError>,
) -> AppResult<Response> {
    let Some(token) = presented_host_token(&headers) else {
        return Ok(invalid_host_token());
    };
    let beat = match body {
        Ok(Checked(beat)) => Ok(beat),
        // A body too large or not JSON is refused before the token is looked at.
        Err(e)
            if matches!(
                e.status(),
                StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE
            ) =>
        {
            return Err(e);
        }
        Err(e) => Err(e.to_string()),
    };
    Ok(match host_heartbeat::record(&state, &token, beat).await? {
        HostCall::Recorded => StatusCode::NO_CONTENT.into_response(),
        HostCall::InvalidToken => invalid_host_token(),
    })
}
