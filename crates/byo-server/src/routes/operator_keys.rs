//! admin-operator-keys (M) over HTTP, and a preparing host's fetch of the published list.
//! The rules are [`crate::app::operator_keys`]'s.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use byo_wire::api::{
    ErrorBody, KeyChangeRequest, KeyListView, KeyOwner, OperatorKeysView, PushOutcome,
    SignatureUpload,
};
use serde::Deserialize;

use crate::app::operator_keys::{self, HostFetch};
use crate::auth::host_token::{invalid_host_token, presented_host_token};
use crate::auth::{Operator, Superadmin};
use crate::error::AppResult;
use crate::extract::Checked;
use crate::state::AppState;

/// The draft, the published list, who changed what, and what every host holds.
#[utoipa::path(get, path = "/api/admin/operator-keys", tag = "operator-keys",
    responses((status = 200, body = OperatorKeysView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn get_operator_keys(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<OperatorKeysView>> {
    Ok(Json(operator_keys::overview(&state).await?))
}

#[utoipa::path(post, path = "/api/admin/operator-keys/changes", tag = "operator-keys", request_body = KeyChangeRequest,
    responses((status = 200, body = KeyListView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_change(
    State(state): State<AppState>,
    op: Operator,
    Checked(req): Checked<KeyChangeRequest>,
) -> AppResult<Json<KeyListView>> {
    Ok(Json(operator_keys::change_keys(&state, &op, req).await?))
}

/// Withdraw the draft nobody will sign, for everyone (M.12).
#[utoipa::path(delete, path = "/api/admin/operator-keys/draft", tag = "operator-keys",
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn delete_draft(State(state): State<AppState>, op: Operator) -> AppResult<StatusCode> {
    operator_keys::withdraw(&state, &op).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Publish the newest draft with a signature made on an operator's own machine, after
/// checking it with the agent's verifier; then push it to every host.
#[utoipa::path(post, path = "/api/admin/operator-keys/{version}/signatures", tag = "operator-keys",
    params(("version" = i32, Path, description = "the draft's version")),
    request_body = SignatureUpload,
    responses((status = 200, body = PushOutcome), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_signature(
    State(state): State<AppState>,
    Superadmin(by): Superadmin,
    Path(version): Path<i32>,
    Checked(upload): Checked<SignatureUpload>,
) -> AppResult<Json<PushOutcome>> {
    Ok(Json(
        operator_keys::publish(&state, &by, version, upload).await?,
    ))
}

/// Send the stored signed list to one host again: no signature needed (M.6).
#[utoipa::path(post, path = "/api/admin/operator-keys/hosts/{host_id}/send", tag = "operator-keys",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 200, body = PushOutcome), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_send_again(
    State(state): State<AppState>,
    op: Operator,
    Path(host_id): Path<String>,
) -> AppResult<Json<PushOutcome>> {
    Ok(Json(
        operator_keys::send_again(&state, &op, &host_id).await?,
    ))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct OwnerQuery {
    /// As sshd logs it: `SHA256:…`.
    pub fingerprint: String,
}

/// Whose key this is: attributes a login as spark to an operator (I.1).
#[utoipa::path(get, path = "/api/admin/operator-keys/owner", tag = "operator-keys", params(OwnerQuery),
    responses((status = 200, body = Vec<KeyOwner>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn get_owner(
    State(state): State<AppState>,
    _op: Operator,
    Query(q): Query<OwnerQuery>,
) -> AppResult<Json<Vec<KeyOwner>>> {
    Ok(Json(operator_keys::owners(&state, &q.fingerprint).await?))
}

/// The published signed list, for the host whose token this is: the exact bytes a push
/// sends. A host asks while preparing, when no push can reach it.
#[utoipa::path(get, path = "/api/host/operator-keys", tag = "hosts",
    responses((status = 200, description = "the signed envelope, exactly as published", content_type = "application/json", body = String),
              (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn get_host_operator_keys(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> AppResult<Response> {
    let Some(token) = presented_host_token(&headers) else {
        return Ok(invalid_host_token());
    };
    Ok(
        match operator_keys::published_for_host(&state, &token).await? {
            HostFetch::Published(envelope) => (
                [
                    (header::CONTENT_TYPE, "application/json"),
                    (header::CACHE_CONTROL, "no-store"),
                ],
                envelope,
            )
                .into_response(),
            HostFetch::InvalidToken => invalid_host_token(),
        },
    )
}
