//! Life after go-live over HTTP: the operator's de-pool, revoke, retire and relay
//! replacement of a host, and the owner's stop-hosting. The rules are
//! [`crate::app::host_lifecycle`]'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use byo_wire::api::ErrorBody;
use byo_wire::lifecycle::{HostProgress, RelayReplaced, WorklistEntry};
use serde::Deserialize;

use crate::app::{host_lifecycle, retire_stopped};
use crate::auth::{CurrentUser, Operator};
use crate::error::AppResult;
use crate::state::AppState;

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DepoolRequest {
    /// Why the host is taken out of placement (1 to 500 printable characters); audited.
    pub reason: String,
}

/// 200 once finished, 202 while the host has not confirmed its drain (run it again).
fn progress_status(p: &HostProgress) -> StatusCode {
    if p.done {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    }
}

/// De-pool a host: `active = false`, with a reason. Its instance stays until drained;
/// activation brings it back.
#[utoipa::path(post, path = "/api/admin/hosts/{host_id}/depool", tag = "admin", request_body = DepoolRequest,
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_depool(
    State(state): State<AppState>,
    op: Operator,
    Path(host_id): Path<String>,
    Json(req): Json<DepoolRequest>,
) -> AppResult<StatusCode> {
    host_lifecycle::depool(&state, &op, &host_id, &req.reason).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Revoke an enrolled host (H): de-pool, drain, then remove its access. 202 while the host
/// has not confirmed its drain (the revoke is recorded at its step; run it again to resume).
#[utoipa::path(post, path = "/api/admin/hosts/{host_id}/revoke", tag = "admin",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 200, body = HostProgress), (status = 202, body = HostProgress),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 502, body = ErrorBody)))]
pub async fn post_revoke_host(
    State(state): State<AppState>,
    op: Operator,
    Path(host_id): Path<String>,
) -> AppResult<(StatusCode, Json<HostProgress>)> {
    let p = host_lifecycle::revoke(&state, &op, &host_id).await?;
    Ok((progress_status(&p), Json(p)))
}

/// Retire a host (N): outside first, the stamp last. Refused while active, dedicated,
/// holding a live instance or a pre-booking, or never enrolled.
#[utoipa::path(post, path = "/api/admin/hosts/{host_id}/retire", tag = "admin",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 502, body = ErrorBody)))]
pub async fn post_retire(
    State(state): State<AppState>,
    op: Operator,
    Path(host_id): Path<String>,
) -> AppResult<StatusCode> {
    host_lifecycle::retire(&state, &op, &host_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Replace a dead relay (A.3) through relay-provision: the old one released, a new one
/// booted with the key the host trusts; the host learns its endpoint at `GET /api/host/relay`.
#[utoipa::path(post, path = "/api/admin/hosts/{host_id}/replace-relay", tag = "admin",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 200, body = RelayReplaced), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn post_replace_relay(
    State(state): State<AppState>,
    op: Operator,
    Path(host_id): Path<String>,
) -> AppResult<Json<RelayReplaced>> {
    Ok(Json(
        host_lifecycle::replace_relay(&state, &op, &host_id).await?,
    ))
}

/// The owner cancels their own allocation before the GPU enrolled: the enrolment is revoked
/// and the relay, its address, the tunnel and the names are handed back at once. 204 when all
/// is handed back; 202 when a provider failed part way and reap's next sweep carries on.
#[utoipa::path(post, path = "/api/hosts/{host_id}/cancel", tag = "hosts",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 204), (status = 202),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn post_cancel_allocation(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(host_id): Path<String>,
) -> AppResult<StatusCode> {
    Ok(
        if host_lifecycle::cancel_allocation(&state, &user, &host_id).await? {
            StatusCode::NO_CONTENT
        } else {
            StatusCode::ACCEPTED
        },
    )
}

/// The owner stops hosting their own GPU: de-pooled and drained; then they uninstall.
/// 202 while an instance has not ended (run it again).
#[utoipa::path(post, path = "/api/hosts/{host_id}/stop", tag = "hosts",
    params(("host_id" = String, Path, description = "the host's id")),
    responses((status = 200, body = HostProgress), (status = 202, body = HostProgress),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn post_stop_hosting(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(host_id): Path<String>,
) -> AppResult<(StatusCode, Json<HostProgress>)> {
    let p = host_lifecycle::stop_hosting(&state, &user, &host_id).await?;
    Ok((progress_status(&p), Json(p)))
}

/// The operators' worklist (issue #39, 3): hosts whose owner stopped hosting and that have
/// been silent a day, which retire-stopped would retire but for one of retire's refusals
/// (N.1, N.5), each with that refusal. What has none is retired by the job, not listed.
#[utoipa::path(get, path = "/api/admin/worklist", tag = "admin",
    responses((status = 200, body = Vec<WorklistEntry>), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody)))]
pub async fn get_worklist(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<Vec<WorklistEntry>>> {
    Ok(Json(retire_stopped::worklist(&state).await?))
}

/// The fleet at a glance (issue #38, 1): every host not retired with its state and its
/// problems by name, the counts by state, filtered, sorted and 50 to a page.
#[utoipa::path(get, path = "/api/admin/fleet", tag = "admin",
    params(crate::app::fleet_overview::FleetQuery),
    responses((status = 200, body = byo_wire::overview::FleetOverview),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody)))]
pub async fn get_fleet(
    State(state): State<AppState>,
    _op: Operator,
    axum::extract::Query(q): axum::extract::Query<crate::app::fleet_overview::FleetQuery>,
) -> AppResult<Json<byo_wire::overview::FleetOverview>> {
    let filter = q.filter()?;
    Ok(Json(
        crate::app::fleet_overview::fleet_overview(&state, &filter).await?,
    ))
}
