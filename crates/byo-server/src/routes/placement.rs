//! A host's placement record over HTTP, for operators. The rules are
//! [`crate::app::placement`]'s.

use axum::Json;
use axum::extract::{Path, State};
use byo_wire::api::ErrorBody;
use byo_wire::vm::HostPlacementView;

use crate::app::placement;
use crate::auth::Operator;
use crate::error::AppResult;
use crate::state::AppState;

/// What placement holds against a host: creates failed in a row, its bench, its heartbeat.
#[utoipa::path(get, path = "/api/admin/hosts/{host_id}/placement", tag = "admin",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 200, body = HostPlacementView), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_placement(
    State(state): State<AppState>,
    _op: Operator,
    Path(host_id): Path<String>,
) -> AppResult<Json<HostPlacementView>> {
    Ok(Json(placement::view(&state, &host_id).await?))
}

/// Clear a host's bench and its count of failed creates: it is picked again at once.
#[utoipa::path(post, path = "/api/admin/hosts/{host_id}/placement/clear", tag = "admin",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 200, body = HostPlacementView), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn post_clear(
    State(state): State<AppState>,
    op: Operator,
    Path(host_id): Path<String>,
) -> AppResult<Json<HostPlacementView>> {
    Ok(Json(placement::clear(&state, &op, &host_id).await?))
}
