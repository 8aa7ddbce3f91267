//! The customer's instances: create from the dashboard (E1), list, read, delete (G). The
//! rules live in [`crate::app::instances`]; these handlers only carry them over HTTP.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use byo_wire::api::ErrorBody;
use byo_wire::vm::{
    InstanceCreated, InstanceDeletion, InstanceQueued, InstanceRequest, InstanceView, VmStateChange,
};

use crate::app::instance_power;
use crate::app::instances::{self, CreateOutcome, Deleter};
use crate::auth::CurrentUser;
use crate::error::AppResult;
use crate::error::deletion_status;
use crate::extract::Checked;
use crate::state::AppState;

/// Create an instance of `gpu_type` on a free host, reachable with one of your keys: 201
/// when a host took it; 202 with `{queued: {id, position}}` when no host is free (it is
/// queued, nothing is billed until a host takes it); 403 for a staff-only gpu_type; 409
/// past the per-account limit; 502 when the host refused and 504 when it never answered
/// (the instance is marked failed and nothing is billed).
#[utoipa::path(post, path = "/api/vms", tag = "instances", request_body = InstanceRequest,
    responses((status = 201, body = InstanceCreated), (status = 202, body = InstanceQueued),
              (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 502, body = ErrorBody), (status = 504, body = ErrorBody)))]
pub async fn post_vm(
    State(state): State<AppState>,
    user: CurrentUser,
    Checked(req): Checked<InstanceRequest>,
) -> AppResult<Response> {
    Ok(match instances::create(&state, &user, &req).await? {
        CreateOutcome::Created(created) => (StatusCode::CREATED, Json(*created)).into_response(),
        CreateOutcome::Queued(queued) => (StatusCode::ACCEPTED, Json(queued)).into_response(),
    })
}

/// Your instances: every live one, and those that ended in the last week.
#[utoipa::path(get, path = "/api/vms", tag = "instances",
    responses((status = 200, body = Vec<InstanceView>), (status = 401, body = ErrorBody)))]
pub async fn get_vms(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<Vec<InstanceView>>> {
    Ok(Json(instances::recent(&state, &user).await?))
}

/// One of your instances.
#[utoipa::path(get, path = "/api/vms/{vm_id}", tag = "instances",
    params(("vm_id" = String, Path, description = "the instance's id")),
    responses((status = 200, body = InstanceView), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody)))]
pub async fn get_vm(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(vm_id): Path<String>,
) -> AppResult<Json<InstanceView>> {
    Ok(Json(instances::get(&state, &user, &vm_id).await?))
}

/// Delete one of your instances. Waits up to 90 s for the host: 200 when it confirmed,
/// 202 when the delete is recorded but not confirmed (billing continues until it is).
#[utoipa::path(delete, path = "/api/vms/{vm_id}", tag = "instances",
    params(("vm_id" = String, Path, description = "the instance's id")),
    responses((status = 200, body = InstanceDeletion), (status = 202, body = InstanceDeletion),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn delete_vm(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(vm_id): Path<String>,
) -> AppResult<(StatusCode, Json<InstanceDeletion>)> {
    let d = instances::delete(&state, Deleter::Owner(&user), &vm_id).await?;
    Ok((deletion_status(&d), Json(d)))
}

/// Start, stop or reboot one of your instances. 409 unless it is running or stopped; 402 for
/// a start while an invoice of yours is declined and unpaid; 502 when the host refused and
/// 504 when it did not answer (nothing changes either way).
#[utoipa::path(post, path = "/api/vms/{vm_id}/state", tag = "instances", request_body = VmStateChange,
    params(("vm_id" = String, Path, description = "the instance's id")),
    responses((status = 200, body = InstanceView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 402, body = ErrorBody),
              (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 502, body = ErrorBody),
              (status = 504, body = ErrorBody)))]
pub async fn post_vm_state(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(vm_id): Path<String>,
    Checked(change): Checked<VmStateChange>,
) -> AppResult<Json<InstanceView>> {
    Ok(Json(
        instance_power::change_power(&state, &user, &vm_id, change.action).await?,
    ))
}
