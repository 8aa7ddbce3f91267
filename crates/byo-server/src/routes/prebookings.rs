//! Pre-bookings (E3) over HTTP: the customer's bookings, and the operators' actions on
//! them (recording an off-band payment, launching by booking id — E0's caller 5 —, and
//! reassigning a pin). The rules are [`crate::app::prebookings`]'s.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use byo_wire::api::ErrorBody;
use byo_wire::limits::Bounded;
use byo_wire::prebooking::{
    PrebookingLaunch, PrebookingPaid, PrebookingReassign, PrebookingRefund, PrebookingRequest,
    PrebookingView,
};

use crate::app::prebookings;
use crate::auth::{CurrentUser, Operator, Superadmin};
use crate::error::AppResult;
use crate::extract::Checked;
use crate::state::AppState;

/// Book a box of `gpu_type` for a window (whole UTC hours, starting in the future, at most
/// 31 days). The host is chosen and pinned now; the answer says how to pay. 409 when no
/// host is free for the whole window, or past the cap of open unpaid bookings.
#[utoipa::path(post, path = "/api/prebookings", tag = "prebookings",
    request_body = PrebookingRequest,
    responses((status = 201, body = PrebookingView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_prebooking(
    State(state): State<AppState>,
    user: CurrentUser,
    Checked(req): Checked<PrebookingRequest>,
) -> AppResult<(StatusCode, Json<PrebookingView>)> {
    let booked = prebookings::book(&state, &user, &req).await?;
    Ok((StatusCode::CREATED, Json(booked)))
}

/// Your bookings, newest window first, each with its state.
#[utoipa::path(get, path = "/api/prebookings", tag = "prebookings",
    responses((status = 200, body = Vec<PrebookingView>), (status = 401, body = ErrorBody)))]
pub async fn get_prebookings(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<Vec<PrebookingView>>> {
    Ok(Json(prebookings::mine(&state, &user).await?))
}

/// Cancel one of your bookings that is open and not paid.
#[utoipa::path(post, path = "/api/prebookings/{prebooking_id}/cancel", tag = "prebookings",
    params(("prebooking_id" = String, Path, description = "the booking's id")),
    responses((status = 200, body = PrebookingView), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_cancel(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(prebooking_id): Path<String>,
) -> AppResult<Json<PrebookingView>> {
    Ok(Json(
        prebookings::cancel(&state, &user, &prebooking_id).await?,
    ))
}

/// Every booking, open ones first, with its host and booker.
#[utoipa::path(get, path = "/api/admin/prebookings", tag = "prebookings",
    responses((status = 200, body = Vec<PrebookingView>), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody)))]
pub async fn get_admin_prebookings(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<Vec<PrebookingView>>> {
    Ok(Json(prebookings::overview(&state).await?))
}

/// Record a payment collected off-band (E3.1). With billing on too — beside Checkout, as the
/// design keeps it — but then only with a reason (400 `reason_required`), audited.
#[utoipa::path(post, path = "/api/admin/prebookings/{prebooking_id}/paid", tag = "prebookings",
    params(("prebooking_id" = String, Path, description = "the booking's id")),
    request_body(content = PrebookingPaid, description = "optional with billing off"),
    responses((status = 200, body = PrebookingView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_paid(
    State(state): State<AppState>,
    admin: Superadmin,
    Path(prebooking_id): Path<String>,
    body: Option<Json<PrebookingPaid>>,
) -> AppResult<Json<PrebookingView>> {
    let body = body.map(|Json(b)| b).unwrap_or_default();
    body.check_bounds()
        .map_err(crate::error::AppError::out_of_bounds)?;
    let reason = body.reason;
    Ok(Json(
        prebookings::record_payment(&state, &admin, &prebooking_id, reason.as_deref()).await?,
    ))
}

/// Refund a booking's Checkout payment in full, with a reason (audited), whatever its
/// window. 409 with billing off, for a booking not paid through Checkout, or one already
/// refunded; 400 without a reason.
#[utoipa::path(post, path = "/api/admin/prebookings/{prebooking_id}/refund", tag = "prebookings",
    params(("prebooking_id" = String, Path, description = "the booking's id")),
    request_body = PrebookingRefund,
    responses((status = 200, body = PrebookingView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_refund(
    State(state): State<AppState>,
    admin: Superadmin,
    Path(prebooking_id): Path<String>,
    Checked(req): Checked<PrebookingRefund>,
) -> AppResult<Json<PrebookingView>> {
    Ok(Json(
        prebookings::refund(&state, &admin, &prebooking_id, &req.reason).await?,
    ))
}

/// Launch a booking now (E0 caller 5). Without force: refused when closed, outside its
/// window or already live. With force: a booking torn down inside its own window is
/// revived, and one whose window has not opened starts early. Never after its window.
#[utoipa::path(post, path = "/api/admin/prebookings/{prebooking_id}/launch", tag = "prebookings",
    params(("prebooking_id" = String, Path, description = "the booking's id")),
    request_body = PrebookingLaunch,
    responses((status = 200, body = PrebookingView), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn post_launch(
    State(state): State<AppState>,
    admin: Superadmin,
    Path(prebooking_id): Path<String>,
    Checked(req): Checked<PrebookingLaunch>,
) -> AppResult<Json<PrebookingView>> {
    Ok(Json(
        prebookings::launch(&state, &admin, &prebooking_id, req.force).await?,
    ))
}

/// Pin an open booking to another host (E3.2): same GPU type, in service, not holding
/// another open booking for an overlapping window.
#[utoipa::path(post, path = "/api/admin/prebookings/{prebooking_id}/reassign", tag = "prebookings",
    params(("prebooking_id" = String, Path, description = "the booking's id")),
    request_body = PrebookingReassign,
    responses((status = 200, body = PrebookingView), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_reassign(
    State(state): State<AppState>,
    op: Operator,
    Path(prebooking_id): Path<String>,
    Checked(req): Checked<PrebookingReassign>,
) -> AppResult<Json<PrebookingView>> {
    Ok(Json(
        prebookings::reassign(&state, &op, &prebooking_id, &req.host_id).await?,
    ))
}
