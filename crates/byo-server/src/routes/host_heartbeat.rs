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
use crate::rate_limit::Source;
use crate::state::AppState;

/// Report the host's health; kept as its host_status row. The answer names the address the
/// beat came from (`Byo-Seen-From`): the owner's public address, which the host's tenant
/// firewall keeps tenants from (issue #36).
#[utoipa::path(post, path = "/api/host/heartbeat", tag = "hosts", request_body = Heartbeat,
    responses((status = 204, headers(("byo-seen-from" = String, description = "the address this beat came from, as the backend saw it"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn post_heartbeat(
    State(state): State<AppState>,
    Source(source): Source,
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
        // Said only to the host itself, and only where the listener said where it came from.
        HostCall::Recorded if source.is_unspecified() => StatusCode::NO_CONTENT.into_response(),
        HostCall::Recorded => (
            StatusCode::NO_CONTENT,
            [(byo_wire::vm::SEEN_FROM_HEADER, source.to_string())],
        )
            .into_response(),
        HostCall::InvalidToken => invalid_host_token(),
    })
}
