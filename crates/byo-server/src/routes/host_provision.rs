//! host-provision (A) over HTTP. The rules are [`crate::app::host_provision`]'s.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use byo_wire::api::ErrorBody;
use byo_wire::enroll::{OwnerHostView, ProvisionRequest, ProvisionResponse};

use crate::app::host_provision::provision;
use crate::app::owner_hosts;
use crate::auth::CurrentUser;
use crate::error::AppResult;
use crate::extract::Checked;
use crate::state::AppState;

/// Add a GPU: the one-liner, shown once.
#[utoipa::path(post, path = "/api/hosts", tag = "hosts", request_body = ProvisionRequest,
    responses((status = 201, body = ProvisionResponse), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_host(
    State(state): State<AppState>,
    by: CurrentUser,
    Checked(req): Checked<ProvisionRequest>,
) -> AppResult<(StatusCode, Json<ProvisionResponse>)> {
    Ok((
        StatusCode::CREATED,
        Json(provision(&state, &by, &req).await?),
    ))
}

/// Your GPUs: every one you added, newest first, each with its state in your words (as the
/// Your GPUs page says it), its latest preparation step and, under a failed one, what it
/// means and who fixes it.
#[utoipa::path(get, path = "/api/hosts", tag = "hosts",
    responses((status = 200, body = Vec<OwnerHostView>), (status = 401, body = ErrorBody)))]
pub async fn get_hosts(
    State(state): State<AppState>,
    by: CurrentUser,
) -> AppResult<Json<Vec<OwnerHostView>>> {
    Ok(Json(owner_hosts::mine(&state, &by).await?))
}
