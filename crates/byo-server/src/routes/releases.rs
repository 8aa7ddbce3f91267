//! Releases and the fleet upgrade over HTTP (issue #14, items 1 and 5). The rules are
//! [`crate::app::releases`]' and [`crate::app::fleet_upgrade`]'s.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use base64::Engine;
use byo_wire::api::ErrorBody;
use byo_wire::fleet::{FleetAdvance, FleetRunView, FleetStart, ReleaseView, SIGNATURE_HEADER};
use serde::Deserialize;

use crate::app::{fleet_upgrade, releases};
use crate::auth::{Operator, Superadmin};
use crate::error::{AppError, AppResult};
use crate::extract::Checked;
use crate::state::AppState;

#[derive(Deserialize)]
pub struct PublishQuery {
    version: String,
}

/// Publish an agent build: the body is the build's bytes, the `byo-release-signature` header
/// its SSHSIG by the release key (base64 of the armored signature). The server verifies it
/// against its `release_key` before keeping anything; the installer's path then serves it
/// as the newest build of its arch. No host changes build until someone runs the one-liner.
#[utoipa::path(post, path = "/api/admin/releases/{arch}", tag = "admin",
    params(("arch" = String, Path, description = "the architecture, as uname -m prints it"),
           ("version" = String, Query, description = "what byo-agent --version prints")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 201, body = ReleaseView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody), (status = 413, body = ErrorBody)))]
pub async fn post_release(
    State(state): State<AppState>,
    admin: Superadmin,
    Path(arch): Path<String>,
    Query(q): Query<PublishQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> AppResult<(StatusCode, Json<ReleaseView>)> {
    let signature = headers
        .get(SIGNATURE_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| base64::engine::general_purpose::STANDARD.decode(v.trim()).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            AppError::bad_request(
                "bad_signature",
                format!("send the build's signature in the {SIGNATURE_HEADER} header (base64 of the armored SSHSIG); nothing was published"),
            )
        })?;
    let view = releases::publish(&state, &admin, &arch, &q.version, &signature, body).await?;
    Ok((StatusCode::CREATED, Json(view)))
}

/// Every published build, newest first, each marked when the installer serves it.
#[utoipa::path(get, path = "/api/admin/releases", tag = "admin",
    responses((status = 200, body = Vec<ReleaseView>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn get_releases(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<Vec<ReleaseView>>> {
    Ok(Json(releases::list(&state).await?))
}

/// Start a fleet upgrade to a published build, or resume the open one (`resume`). The
/// answer is the run with its first step; `byo fleet upgrade` runs the one-liner on each
/// host over the operators' access path and reports back through `/advance`.
#[utoipa::path(post, path = "/api/admin/fleet-upgrades", tag = "admin", request_body = FleetStart,
    responses((status = 200, body = FleetRunView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_fleet_upgrade(
    State(state): State<AppState>,
    admin: Superadmin,
    Checked(req): Checked<FleetStart>,
) -> AppResult<Json<FleetRunView>> {
    Ok(Json(fleet_upgrade::start(&state, &admin, req).await?))
}

/// One step of a run: record what the operator's machine saw on a host (the one-liner
/// started, or failed), judge upgrading hosts by their heartbeats, answer with what next.
#[utoipa::path(post, path = "/api/admin/fleet-upgrades/{run_id}/advance", tag = "admin",
    params(("run_id" = String, Path, description = "the run's id")),
    request_body = FleetAdvance,
    responses((status = 200, body = FleetRunView), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_advance(
    State(state): State<AppState>,
    admin: Superadmin,
    Path(run_id): Path<String>,
    Checked(req): Checked<FleetAdvance>,
) -> AppResult<Json<FleetRunView>> {
    Ok(Json(
        fleet_upgrade::advance(&state, &admin, &run_id, req).await?,
    ))
}
