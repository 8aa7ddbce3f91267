//! Your API tokens over HTTP (issue #43), from a signed-in session only. The rules are
//! [`crate::app::api_tokens`]'s; what a token reaches is [`crate::auth::api_token`]'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use byo_wire::api::{ApiTokenView, CreatedApiToken, ErrorBody, NewApiToken};

use crate::app::api_tokens;
use crate::auth::CurrentUser;
use crate::error::AppResult;
use crate::extract::Checked;
use crate::state::AppState;

/// Make an API token: its secret is in this answer and nowhere else, ever.
#[utoipa::path(post, path = "/api/me/tokens", tag = "accounts", request_body = NewApiToken,
    responses((status = 201, body = CreatedApiToken), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn post_token(
    State(state): State<AppState>,
    user: CurrentUser,
    Checked(req): Checked<NewApiToken>,
) -> AppResult<(StatusCode, Json<CreatedApiToken>)> {
    Ok((
        StatusCode::CREATED,
        Json(api_tokens::create(&state, &user, &req).await?),
    ))
}

/// Your API tokens that are not revoked, with when and where each was last used.
#[utoipa::path(get, path = "/api/me/tokens", tag = "accounts",
    responses((status = 200, body = Vec<ApiTokenView>), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody)))]
pub async fn get_tokens(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<Vec<ApiTokenView>>> {
    Ok(Json(api_tokens::list(&state, &user).await?))
}

/// Revoke one of your API tokens: refused from the next request on.
#[utoipa::path(delete, path = "/api/me/tokens/{token_id}", tag = "accounts",
    params(("token_id" = String, Path, description = "the token's id")),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn delete_token(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(token_id): Path<String>,
) -> AppResult<StatusCode> {
    api_tokens::revoke(&state, &user, &token_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
