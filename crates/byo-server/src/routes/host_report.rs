//! host-report over HTTP: the host token and the report unpacked. The rules are
//! [`crate::app::host_report`]'s.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use byo_wire::api::ErrorBody;
use byo_wire::prepare::{HostReport, NodeRails};

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
    let report = unpack(body)?;
    answer(host_report::record(&state, &token, report).await?)
}

/// Report one machine's rails as a rail step left them (130–132): node 0, or a satellite by
/// its index.
#[utoipa::path(post, path = "/api/host/rails", tag = "hosts", request_body = NodeRails,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn post_rails(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Checked<NodeRails>, AppError>,
) -> AppResult<Response> {
    let Some(token) = presented_host_token(&headers) else {
        return Ok(invalid_host_token());
    };
    let rails = unpack(body)?;
    answer(host_report::record_rails(&state, &token, rails).await?)
}

/// The agent finished `byo-agent uninstall` on this host (issue #39, 3): the host is stopped,
/// its instances end, and `retire-stopped` retires it at its next run. No body.
#[utoipa::path(post, path = "/api/host/uninstalled", tag = "hosts",
    responses((status = 204), (status = 401, body = ErrorBody)))]
pub async fn post_uninstalled(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> AppResult<Response> {
    let Some(token) = presented_host_token(&headers) else {
        return Ok(invalid_host_token());
    };
    answer(crate::app::host_lifecycle::host_uninstalled(&state, &token).await?)
}

/// A body too large or not JSON is refused before the token is looked at; any other fault
/// is the rule's to answer, once the token is known to be a host's.
fn unpack<T>(body: Result<Checked<T>, AppError>) -> AppResult<Result<T, String>> {
    match body {
        Ok(Checked(body)) => Ok(Ok(body)),
        Err(e)
            if matches!(
                e.status(),
                StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE
            ) =>
        {
            Err(e)
        }
        Err(e) => Ok(Err(e.to_string())),
    }
}

fn answer(call: HostCall) -> AppResult<Response> {
    Ok(match call {
        HostCall::Recorded => StatusCode::NO_CONTENT.into_response(),
        HostCall::InvalidToken => invalid_host_token(),
    })
}
