//! host-enroll over HTTP: the bearer token and the step-126 request unpacked, the redeem
//! (the rules are [`crate::app::host_enroll`]'s) answered as 200, 401 or 422. Every token
//! that does not redeem gets one byte-identical answer.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_wire::api::ErrorBody;
use byo_wire::enroll::{EnrollRequest, EnrollResponse};
use serde_json::json;

use crate::app::host_enroll::{Redemption, redeem};
use crate::error::{AppError, AppResult};
use crate::extract::Checked;
use crate::state::AppState;

/// The one answer for every token that does not redeem. Which of unknown, spent, expired
/// or mistyped it was is not something a caller has earned (B note 1).
pub fn invalid_token() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({
            "error": "invalid_token",
            "message": "this enrolment token is not valid: it may be mistyped, already used or expired. Add the GPU again for a new command."
        })),
    )
        .into_response()
}

fn presented_token(headers: &HeaderMap) -> Option<SecretToken> {
    crate::auth::host_token::presented_token(headers, TokenKind::Enrollment)
}

/// Redeem: the agent sends its token as a bearer and the step-126 request as the body.
#[utoipa::path(post, path = "/api/enroll", tag = "hosts", request_body = EnrollRequest,
    responses((status = 200, body = EnrollResponse), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 413, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn post_enroll(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Checked<EnrollRequest>, AppError>,
) -> AppResult<Response> {
    // A body too large or not JSON is refused as on every route, before the token is read.
    let body = match body {
        Err(e)
            if matches!(
                e.status(),
                StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE
            ) =>
        {
            return Err(e);
        }
        other => other,
    };
    let Some(token) = presented_token(&headers) else {
        return Ok(invalid_token());
    };
    let Checked(req) = body?;
    Ok(match redeem(&state, &token, req).await? {
        Redemption::InvalidToken => invalid_token(),
        Redemption::Rejected(reason) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            Json(json!({"error": "rejected", "message": reason})),
        )
            .into_response(),
        Redemption::Enrolled(response) => (StatusCode::OK, Json(*response)).into_response(),
    })
}
