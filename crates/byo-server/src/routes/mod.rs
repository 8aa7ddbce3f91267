//! The one router: every route the server answers is listed here, API routes with their
//! OpenAPI operations (so the document cannot miss one), pages after them.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router, middleware};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::AppError;
use crate::extract::BODY_LIMIT;
use crate::pages::PageError;
use crate::state::AppState;
use crate::{auth, metrics, pages, telemetry};

pub mod accounts;
pub mod admin;
pub mod admin_host_action;
pub mod admin_vm_action;
pub mod api_tokens;
pub mod billing;
pub mod health;
pub mod host_enroll;
pub mod host_heartbeat;
pub mod host_lifecycle;
pub mod host_provision;
pub mod host_relay;
pub mod host_report;
pub mod notices;
pub mod operator_keys;
pub mod placement;
pub mod prebookings;
pub mod queue;
pub mod releases;
pub mod ssh_keys;
pub mod vms;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "byo control plane",
        description = "The API behind app pages, hosts and operators. Sessions are cookies \
                       (`__Host-byo_session` when Secure, `byo_session` over plain HTTP); scripts \
                       and the `byo` CLI send an API token (`Authorization: Bearer byo_api_…`, \
                       made on the account page, reaching what its scope covers: \
                       docs/api-tokens.md); errors are `ErrorBody`."
    ),
    tags(
        (name = "health", description = "Liveness and readiness"),
        (name = "accounts", description = "Signing up, in and out; your own account"),
        (name = "admin", description = "Operators' pages: users, grants, the audit log"),
        (name = "operator-keys", description = "admin-operator-keys: the signed operator-key lists (M)"),
        (name = "hosts", description = "host-provision and host-enroll: adding a GPU and enrolling it (A, B); host-report, the heartbeat and the operator-key list a preparing host fetches"),
        (name = "instances", description = "Your SSH keys and instances: create (E1) and delete (G)"),
        (name = "billing", description = "Billing on Stripe: your payment method, paying a booking, Stripe's webhook"),
        (name = "prebookings", description = "Pre-bookings (E3): a box for a window, pinned when booked; operators record payment, launch and reassign"),
    )
)]
struct ApiDoc;

/// Every API route, with its OpenAPI operation.
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health::healthz))
        .routes(routes!(accounts::signup))
        .routes(routes!(accounts::confirm_signup))
        .routes(routes!(accounts::login))
        .routes(routes!(accounts::logout))
        .routes(routes!(accounts::me))
        .routes(routes!(accounts::change_password))
        .routes(routes!(api_tokens::get_tokens, api_tokens::post_token))
        .routes(routes!(api_tokens::delete_token))
        .routes(routes!(notices::get_my_notices, notices::put_my_notices))
        .routes(routes!(notices::get_outbox))
        .routes(routes!(admin::list_users))
        .routes(routes!(admin::grant_role, admin::revoke_role))
        .routes(routes!(admin::audit_log))
        .routes(routes!(admin::jobs))
        .routes(routes!(operator_keys::get_operator_keys))
        .routes(routes!(operator_keys::post_change))
        .routes(routes!(operator_keys::delete_draft))
        .routes(routes!(operator_keys::post_signature))
        .routes(routes!(operator_keys::post_send_again))
        .routes(routes!(operator_keys::get_owner))
        .routes(routes!(operator_keys::get_host_operator_keys))
        .routes(routes!(
            host_provision::post_host,
            host_provision::get_hosts
        ))
        .routes(routes!(host_enroll::post_enroll))
        .routes(routes!(host_report::post_report))
        .routes(routes!(host_report::post_rails))
        .routes(routes!(host_report::post_uninstalled))
        .routes(routes!(admin_host_action::post_activate))
        .routes(routes!(admin_host_action::post_walk))
        .routes(routes!(admin_host_action::post_revoke))
        .routes(routes!(host_lifecycle::post_depool))
        .routes(routes!(host_lifecycle::post_revoke_host))
        .routes(routes!(host_lifecycle::post_retire))
        .routes(routes!(host_lifecycle::post_replace_relay))
        .routes(routes!(host_lifecycle::post_stop_hosting))
        .routes(routes!(host_lifecycle::post_cancel_allocation))
        .routes(routes!(host_lifecycle::get_worklist))
        .routes(routes!(host_lifecycle::get_fleet))
        .routes(routes!(host_heartbeat::post_heartbeat))
        .routes(routes!(host_relay::get_relay))
        .routes(routes!(host_relay::post_relay_secrets))
        .routes(routes!(ssh_keys::post_ssh_key, ssh_keys::get_ssh_keys))
        .routes(routes!(ssh_keys::delete_ssh_key))
        .routes(routes!(vms::post_vm, vms::get_vms))
        .routes(routes!(vms::get_vm, vms::delete_vm))
        .routes(routes!(vms::post_vm_state))
        .routes(routes!(admin_vm_action::post_delete))
        .routes(routes!(admin_vm_action::get_stuck_deletes))
        .routes(routes!(placement::get_placement))
        .routes(routes!(placement::post_clear))
        .routes(routes!(billing::post_webhook))
        .routes(routes!(billing::get_billing))
        .routes(routes!(billing::get_earnings))
        .routes(routes!(billing::get_payouts))
        .routes(routes!(billing::post_payouts_connect))
        .routes(routes!(billing::get_admin_billing))
        .routes(routes!(billing::post_payment_method))
        .routes(routes!(billing::post_prebooking_checkout))
        .routes(routes!(
            prebookings::post_prebooking,
            prebookings::get_prebookings
        ))
        .routes(routes!(prebookings::post_cancel))
        .routes(routes!(prebookings::get_admin_prebookings))
        .routes(routes!(prebookings::post_paid))
        .routes(routes!(prebookings::post_refund))
        .routes(routes!(prebookings::post_launch))
        .routes(routes!(prebookings::post_reassign))
        // The queue (E2, issue #13).
        .routes(routes!(queue::get_queue))
        .routes(routes!(queue::delete_queued))
        .routes(routes!(queue::post_extend))
        .routes(routes!(queue::get_ended))
        .routes(routes!(queue::get_admin_queue))
        .routes(routes!(queue::post_place))
        .routes(routes!(queue::post_close))
        .routes(routes!(releases::get_releases))
        .routes(routes!(releases::post_fleet_upgrade))
        .routes(routes!(releases::post_advance))
        // A build is far larger than any other body: its own limit, on its route only.
        .merge(
            OpenApiRouter::new()
                .routes(routes!(releases::post_release))
                .layer(DefaultBodyLimit::max(crate::app::releases::MAX_BUILD_BYTES)),
        )
}

/// The OpenAPI document, generated from the routes above.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().into_openapi()
}

/// The whole application, as `main` serves it and tests drive it.
pub fn router(state: AppState) -> Router {
    let (api, doc) = api().split_for_parts();
    let doc = Arc::new(doc);
    Router::new()
        .merge(api)
        .route(
            "/openapi.json",
            get(move || async move { Json(doc.as_ref().clone()) }),
        )
        .merge(pages::router())
        .route_layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            metrics::track,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::api_token::resolve,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::csrf::refuse_cross_site,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            limit_by_address,
        ))
        .layer(middleware::from_fn(one_answer_shape))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(middleware::from_fn(telemetry::request_id))
        .with_state(state)
}

/// One answer shape for every 4xx and 5xx, the framework's own included: an unknown path
/// (404) or method (405), a body too large (413), not JSON (415) or not the shape (400,
/// 422) — answered by axum in plain text before any handler — becomes `{error, message}`
/// on `/api` and a page elsewhere. Answers already in our shape (JSON, HTML) pass as they
/// are. And every answer no route gave a caching rule is `Cache-Control: no-store`: the
/// one-liner, the enrolment answer and the session cookie are never kept by a cache.
async fn one_answer_shape(request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let api = path.starts_with("/api/") || path == "/api" || path == "/openapi.json";
    let mut response = next.run(request).await;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        let ours = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/json") || ct.starts_with("text/html"));
        if !ours {
            let (parts, body) = response.into_parts();
            let text = axum::body::to_bytes(body, 16 * 1024)
                .await
                .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
                .unwrap_or_default();
            let message = if text.is_empty() {
                status
                    .canonical_reason()
                    .unwrap_or("refused")
                    .to_lowercase()
            } else {
                text
            };
            let error = AppError::rejected(status, message);
            response = if api {
                error.into_response()
            } else {
                PageError::from(error).into_response()
            };
            // Keep what the framework said besides the body (a 405's Allow).
            for (name, value) in &parts.headers {
                if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
                    response.headers_mut().insert(name.clone(), value.clone());
                }
            }
        }
    }
    let headers = response.headers_mut();
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    // No page of ours is framed (clickjacking a Revoke or a Sign button), runs a script or a
    // style from elsewhere, or posts a form elsewhere (#16).
    for (name, value) in SECURITY_HEADERS {
        headers.insert(name.clone(), HeaderValue::from_static(value));
    }
    response
}

/// Sent on every answer, pages and API alike.
pub const SECURITY_HEADERS: &[(header::HeaderName, &str)] = &[
    (
        header::CONTENT_SECURITY_POLICY,
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    (header::X_FRAME_OPTIONS, "DENY"),
    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    (header::REFERRER_POLICY, "same-origin"),
];

/// The per-address limit, before any handler: a limited request past its address's burst
/// is answered 429 in the answer shape of where it was sent (the API's JSON, a page).
pub async fn limit_by_address(
    axum::extract::State(state): axum::extract::State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method().as_str();
    let path = request.uri().path();
    let limited = crate::rate_limit::LIMITED
        .iter()
        .any(|(m, p)| *m == method && *p == path);
    if limited {
        let address = crate::rate_limit::source_of(request.extensions());
        if let Err(e) = state.rate_limits.address(address) {
            tracing::warn!(%address, path, "rate limited");
            return if path.starts_with("/api/") {
                e.into_response()
            } else {
                crate::pages::PageError::from(e).into_response()
            };
        }
    }
    next.run(request).await
}
