//! Billing over HTTP (issue #13, 4): Stripe's webhook, the caller's billing status and the
//! Checkout links. The rules are [`crate::app::billing`]'s.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use byo_wire::api::ErrorBody;
use byo_wire::billing::{AdminBillingView, BillingView, CheckoutView, EarningsView, PayoutsView};

use crate::app::billing::{self, WebhookOutcome};
use crate::auth::{CurrentUser, Operator};
use crate::error::AppResult;
use crate::state::AppState;

/// Stripe's webhook: server to server, authenticated by `Stripe-Signature` (HMAC-SHA256
/// over the timestamp and the raw body, 300 s tolerance), no session. Each event is
/// processed once by its id; a replay answers 200 and changes nothing. 404 with billing off.
#[utoipa::path(post, path = "/api/stripe/webhook", tag = "billing",
    request_body(content = String, content_type = "application/json", description = "a Stripe event, as Stripe signed it"),
    responses((status = 200, description = "processed, or a replay of an event already processed"),
              (status = 400, body = ErrorBody, description = "bad_signature, stale_signature, invalid_event"),
              (status = 404, body = ErrorBody, description = "billing is off")))]
pub async fn post_webhook(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> AppResult<Json<serde_json::Value>> {
    let signature = headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok());
    let outcome = billing::webhook(&state, signature, &body).await?;
    Ok(Json(serde_json::json!({
        "received": true,
        "replayed": outcome == WebhookOutcome::Replayed,
    })))
}

/// Your billing: whether this installation bills and whether your account may be charged
/// now (asked of Stripe live).
#[utoipa::path(get, path = "/api/billing", tag = "billing",
    responses((status = 200, body = BillingView), (status = 401, body = ErrorBody)))]
pub async fn get_billing(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<BillingView>> {
    Ok(Json(billing::status(&state, &user).await?))
}

/// A Stripe Checkout page to add a payment method (setup mode). 409 with billing off.
#[utoipa::path(post, path = "/api/billing/payment-method", tag = "billing",
    responses((status = 200, body = CheckoutView), (status = 401, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn post_payment_method(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<CheckoutView>> {
    Ok(Json(billing::payment_method_checkout(&state, &user).await?))
}

/// A Stripe Checkout page to pay for one of your bookings: its window's started hours at
/// the hourly price. 404 for a booking not yours, 409 when it is paid or closed, or billing
/// is off.
#[utoipa::path(post, path = "/api/prebookings/{prebooking_id}/checkout", tag = "billing",
    params(("prebooking_id" = String, Path, description = "the booking's id")),
    responses((status = 200, body = CheckoutView), (status = 401, body = ErrorBody),
              (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn post_prebooking_checkout(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(prebooking_id): Path<String>,
) -> AppResult<Json<CheckoutView>> {
    Ok(Json(
        billing::prebooking_checkout(&state, &user, &prebooking_id).await?,
    ))
}

/// What your hosts earned (issue #40, 6): every cent invoiced for instances on them, split
/// between you and the platform at the installation's share, by month and host. Empty for an
/// account with no hosts, or with billing off.
#[utoipa::path(get, path = "/api/me/earnings", tag = "billing",
    responses((status = 200, body = EarningsView), (status = 401, body = ErrorBody)))]
pub async fn get_earnings(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<EarningsView>> {
    Ok(Json(
        crate::app::earnings::mine(&state, &user.user.sub).await?,
    ))
}

/// Your payouts (issue #40, 6): the Stripe account your share is transferred to (asked of
/// Stripe live until it can take transfers) and each month's payout, a refused transfer's
/// reason and next attempt on it. Empty with billing off.
#[utoipa::path(get, path = "/api/me/payouts", tag = "billing",
    responses((status = 200, body = PayoutsView), (status = 401, body = ErrorBody)))]
pub async fn get_payouts(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<PayoutsView>> {
    Ok(Json(
        crate::app::payouts::mine(&state, &user.user.sub).await?,
    ))
}

/// Stripe's onboarding for the account your share is paid to: made on first use, each call a
/// fresh single-use link. 409 with billing off, and for an account that has never had a host.
#[utoipa::path(post, path = "/api/me/payouts/connect", tag = "billing",
    responses((status = 200, body = CheckoutView), (status = 401, body = ErrorBody),
              (status = 409, body = ErrorBody)))]
pub async fn post_payouts_connect(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<CheckoutView>> {
    Ok(Json(crate::app::payouts::connect(&state, &user).await?))
}

/// Billing for operators: the accounts held by a declined, unpaid invoice (when their
/// instances stop, how many are stopped) and every account's recent invoices.
#[utoipa::path(get, path = "/api/admin/billing", tag = "admin",
    responses((status = 200, body = AdminBillingView), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody)))]
pub async fn get_admin_billing(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<AdminBillingView>> {
    Ok(Json(crate::app::billing_admin::admin_view(&state).await?))
}
