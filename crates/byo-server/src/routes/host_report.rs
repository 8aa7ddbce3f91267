//! host-report over HTTP: the host token and the report unpacked. The rules are
//! [`crate::app::host_report`]'s.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use byo_wire::api::ErrorBody;
use byo_wire::prepare::HostReport;

use crate::app::host_report::{self, HostCall};
use crate::auth::host_token::{invalid_host_token, presented_host_token};
use crate::error::{AppError, AppResult};
use crate::extract::Checked;
use crate::state::AppState;

/// Report one prepare step's progress (node 0, or a satellite by its index).
#[utoipa::path(post, path = "/api/host/report", tag = "hosts", request_body = HostReport,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn post_report(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Checked<HostReport>, AppError>,
) -> AppResult<Response> {
    let Some(token) = presented_host_token(&headers) else {
        return Ok(invalid_host_token());
    };
    let report = match body {
        Ok(Checked(report)) => Ok(report),
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
    Ok(match host_report::record(&state, &token, report).await? {
        HostCall::Recorded => StatusCode::NO_CONTENT.into_response(),
        HostCall::InvalidToken => invalid_host_token(),
    })
}
