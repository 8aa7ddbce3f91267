//! Customers' SSH keys over HTTP. The rules are [`crate::app::ssh_keys`]'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use byo_wire::api::ErrorBody;
use byo_wire::vm::{NewSshKey, SshKeyView};

use crate::app::ssh_keys;
use crate::auth::CurrentUser;
use crate::error::AppResult;
use crate::extract::Checked;
use crate::state::AppState;

/// Add an SSH public key to your account.
#[utoipa::path(post, path = "/api/ssh-keys", tag = "instances", request_body = NewSshKey,
    responses((status = 201, body = SshKeyView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_ssh_key(
    State(state): State<AppState>,
    user: CurrentUser,
    Checked(req): Checked<NewSshKey>,
) -> AppResult<(StatusCode, Json<SshKeyView>)> {
    Ok((
        StatusCode::CREATED,
        Json(ssh_keys::add(&state, &user, &req).await?),
    ))
}

/// Your SSH keys.
#[utoipa::path(get, path = "/api/ssh-keys", tag = "instances",
    responses((status = 200, body = Vec<SshKeyView>), (status = 401, body = ErrorBody)))]
pub async fn get_ssh_keys(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<Vec<SshKeyView>>> {
    Ok(Json(ssh_keys::list(&state, &user).await?))
}

/// Remove one of your SSH keys. Instances already created keep the key they were made with.
#[utoipa::path(delete, path = "/api/ssh-keys/{key_id}", tag = "instances",
    params(("key_id" = String, Path, description = "the key's id")),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_ssh_key(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(key_id): Path<String>,
) -> AppResult<StatusCode> {
    ssh_keys::remove(&state, &user, &key_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
