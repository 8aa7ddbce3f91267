//! Pre-bookings (E3): the customer's `/prebookings` (their bookings with their state, the
//! form to book, cancelling an unpaid one) and operators' `/admin/prebookings` (every
//! booking; recording an off-band payment and launching by id for superadmins; reassigning
//! a pin). Plain forms that POST and redirect; every rule is [`crate::app::prebookings`]'s.

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use byo_wire::Role;
use byo_wire::prebooking::{PrebookingRequest, PrebookingState, PrebookingView};
use chrono::{DateTime, NaiveDateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;

use super::instances::{gpu_types, shown};
use super::{
    PageError, PageResult, layout, ops_layout, require_operator, require_superadmin, signed_in,
};
use crate::app::prebookings;
use crate::auth::{CurrentUser, Operator};
use crate::error::AppError;
use crate::state::AppState;

/// A booking's state in words: unpaid / paid, waiting for its window / launched /
/// waiting because … / closed.
fn state_line(b: &PrebookingView) -> Markup {
    html! {
        @match b.state {
            PrebookingState::Unpaid => { "unpaid" }
            PrebookingState::PaidWaiting => { "paid; launches when its window opens" }
            PrebookingState::Launched => {
                "launched"
                @if let Some(vm) = &b.launched_vm_id {
                    " — " a href={ "/instances#instance-" (vm) } { "its instance" }
                }
            }
            PrebookingState::Waiting => {
                @match &b.launch_note {
                    Some(note) => { "waiting: " (note) }
                    None => { "paid; launching at the next tick" }
                }
            }
            PrebookingState::Closed => {
                @match b.closed_reason.as_deref() {
                    Some("cancelled") => { "closed: cancelled" }
                    _ => { "closed: its window ended" }
                }
            }
        }
    }
}

/// `2026-11-29 14:00 → 18:00` (the end's date only when it differs).
fn window(b: &PrebookingView) -> Markup {
    let end = if b.end_date.date_naive() == b.start_date.date_naive() {
        b.end_date.format("%H:%M")
    } else {
        b.end_date.format("%Y-%m-%d %H:%M")
    };
    html! {
        time datetime=(b.start_date.to_rfc3339()) { (b.start_date.format("%Y-%m-%d %H:%M")) }
        " → "
        time datetime=(b.end_date.to_rfc3339()) { (end) }
    }
}

fn short(t: DateTime<Utc>) -> Markup {
    html! { time datetime=(t.to_rfc3339()) { (t.format("%Y-%m-%d %H:%M")) } }
}

#[derive(Default, Deserialize)]
pub struct BookForm {
    #[serde(default)]
    gpu_type: String,
    /// `YYYY-MM-DDTHH:MM` (a datetime-local input), read as UTC.
    #[serde(default)]
    start: String,
    #[serde(default)]
    end: String,
}

fn parse_utc(field: &str, value: &str) -> Result<DateTime<Utc>, AppError> {
    let value = value.trim();
    NaiveDateTime::parse_from_str(value, "%Y-%m-%dT%H:%M")
        .or_else(|_| NaiveDateTime::parse_from_str(value, "%Y-%m-%dT%H:%M:%S"))
        .map(|t| t.and_utc())
        .map_err(|_| {
            AppError::bad_request(
                "invalid_window",
                format!("the {field} is a date and time like 2026-12-01T09:00 (UTC)"),
            )
        })
}

/// What the action before this page did, carried by its redirect
/// (`/prebookings?done=booked|cancelled&id=…`): said at the top and its row marked, instead of
/// the browser jumping down to the row (issue #42, 5).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Done {
    done: Option<String>,
    id: Option<String>,
}

async fn customer_page(
    state: &AppState,
    v: &CurrentUser,
    error: Option<&str>,
    form: Option<&BookForm>,
    pay: bool,
    done: &Done,
) -> Result<Markup, PageError> {
    let list = prebookings::mine(state, v).await?;
    let kinds = gpu_types(state, v).await?;
    let has_key = !state.store.ssh_keys_of(&v.user.sub).await?.is_empty();
    let picked = form.map(|f| f.gpu_type.as_str());
    let billing_on = state.billing.enabled();
    let marked = done.id.as_deref();
    let said = marked
        .and_then(|id| list.iter().find(|b| b.id == id))
        .and_then(|b| match done.done.as_deref() {
            Some("booked") => Some(format!(
                "Your {} booking is made: it launches by itself when its window opens{}.",
                b.gpu_type,
                if billing_on { ", once it is paid" } else { "" }
            )),
            Some("cancelled") => Some(format!("Your {} booking is cancelled.", b.gpu_type)),
            _ => None,
        });
    Ok(layout(
        "Pre-bookings",
        Some(v),
        html! {
            h1 { "Your pre-bookings" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            @if let Some(n) = &said { p.notice #done role="status" { (n) } }
            @if pay { p #pay { a.button href="/billing" { "Add a payment method" } } }
            p { "A pre-booking holds one box for a window. It launches by itself when the window opens, once it is paid, and is torn down when the window ends." }
            @if billing_on {
                p #refund-rule { "A paid booking cancelled before its window opens is refunded in full; once the window has opened it is not refunded." }
            }
            @if !has_key {
                p #needs-key { "Add an SSH key on " a href="/instances" { "Instances" } " before your window opens: a booking launches with your newest key, and waits without one." }
            }
            @if list.is_empty() {
                p #no-prebookings { "No pre-bookings yet." }
            } @else {
                div.scroll { table #prebookings {
                    thead { tr { th { "GPU" } th { "Window (UTC)" } th { "State" } th { "" } } }
                    tbody { @for b in &list {
                        tr id={ "prebooking-" (b.id) } class=[(marked == Some(b.id.as_str())).then_some("done")] {
                            td.gpu { (b.gpu_type) }
                            td.window { (window(b)) }
                            td.state { (state_line(b))
                                @if let Some(pay) = &b.how_to_pay { br; small.pay { "To pay: " (pay) } }
                            }
                            td.actions {
                                @if b.state == PrebookingState::Unpaid {
                                    @if billing_on {
                                        form.inline.pay method="post" action={ "/prebookings/" (b.id) "/checkout" } {
                                            button type="submit" { "Pay" }
                                        }
                                    }
                                    form.inline method="post" action={ "/prebookings/" (b.id) "/cancel" } {
                                        button type="submit" { "Cancel" }
                                    }
                                } @else if b.state == PrebookingState::PaidWaiting && billing_on {
                                    form.inline.cancel-refund method="post" action={ "/prebookings/" (b.id) "/cancel" } {
                                        button type="submit" { "Cancel and refund" }
                                    }
                                }
                            }
                        }
                    } }
                } }
            }
            h2 { "Book a box" }
            form #book method="post" action="/prebookings" {
                label { "GPU"
                    select name="gpu_type" required {
                        @for (kind, description) in &kinds {
                            option value=(kind) selected[picked == Some(kind.as_str())] { (kind) " — " (description) }
                        }
                    }
                }
                label { "From (UTC, on the hour)"
                    input type="datetime-local" name="start" required step="3600"
                        value=(form.map_or("", |f| f.start.as_str()));
                }
                label { "Until (UTC, on the hour)"
                    input type="datetime-local" name="end" required step="3600"
                        value=(form.map_or("", |f| f.end.as_str()));
                }
                button type="submit" { "Book" }
                small { "At most " (prebookings::MAX_WINDOW_DAYS) " days, starting in the future. The box is chosen now and kept for you; it launches only once paid." }
            }
        },
    ))
}

async fn customer_refusal(
    state: &AppState,
    v: &CurrentUser,
    e: AppError,
    form: Option<&BookForm>,
) -> PageResult {
    let e = shown(e)?;
    let message = match e {
        AppError::NotFound => "you have no pre-booking with that id".to_owned(),
        ref other => other.to_string(),
    };
    let pay = e.code() == crate::app::instances::PAYMENT_REQUIRED;
    let page = customer_page(state, v, Some(&message), form, pay, &Done::default()).await?;
    Ok((e.status(), page).into_response())
}

pub async fn page(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Query(done): Query<Done>,
) -> PageResult {
    let v = signed_in(viewer)?;
    Ok(customer_page(&state, &v, None, None, false, &done)
        .await?
        .into_response())
}

/// `POST /prebookings`: as `POST /api/prebookings`.
pub async fn book(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Form(form): Form<BookForm>,
) -> PageResult {
    let v = signed_in(viewer)?;
    let req = match (parse_utc("start", &form.start), parse_utc("end", &form.end)) {
        (Ok(start_date), Ok(end_date)) => PrebookingRequest {
            gpu_type: form.gpu_type.clone(),
            start_date,
            end_date,
        },
        (Err(e), _) | (_, Err(e)) => return customer_refusal(&state, &v, e, Some(&form)).await,
    };
    match prebookings::book(&state, &v, &req).await {
        Ok(b) => Ok(Redirect::to(&format!("/prebookings?done=booked&id={}", b.id)).into_response()),
        Err(e) => customer_refusal(&state, &v, e, Some(&form)).await,
    }
}

/// `POST /prebookings/{prebooking_id}/cancel`: as `POST /api/prebookings/{id}/cancel`.
pub async fn cancel(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(prebooking_id): Path<String>,
) -> PageResult {
    let v = signed_in(viewer)?;
    match prebookings::cancel(&state, &v, &prebooking_id).await {
        Ok(_) => Ok(
            Redirect::to(&format!("/prebookings?done=cancelled&id={prebooking_id}"))
                .into_response(),
        ),
        Err(e) => customer_refusal(&state, &v, e, None).await,
    }
}

/// `POST /prebookings/{prebooking_id}/checkout`: to Stripe's Checkout page for the booking
/// (as `POST /api/prebookings/{id}/checkout`).
pub async fn checkout(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(prebooking_id): Path<String>,
) -> PageResult {
    let v = signed_in(viewer)?;
    match crate::app::billing::prebooking_checkout(&state, &v, &prebooking_id).await {
        Ok(c) => Ok(Redirect::to(&c.url).into_response()),
        Err(e) => customer_refusal(&state, &v, e, None).await,
    }
}

// ---------------------------------------------------------------- operators

async fn operator_page(
    state: &AppState,
    op: &Operator,
    error: Option<&str>,
) -> Result<Markup, PageError> {
    let list = prebookings::overview(state).await?;
    let hosts = state.store.agent_targets().await?;
    let superadmin = op.0.has(Role::Superadmin);
    let billing_on = state.billing.enabled();
    Ok(ops_layout(
        "Pre-bookings",
        Some(&op.0),
        html! {
            h1 { "Pre-bookings" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            @if billing_on {
                p #billing { "Billing is on: a booking is marked paid by its confirmed payment. A payment collected off-band may still be recorded here, with a reason; a Checkout payment may be refunded, with a reason." }
            } @else {
                p #billing { "Billing is off: payment is collected off-band, and a superadmin records it here." }
            }
            p { small { "The launcher and expire-prebook run every minute (" a href="/admin/jobs" { "jobs" } "). A booking whose pinned host is unavailable waits with its reason until the host is back or it is reassigned; it is never moved by itself." } }
            @if list.is_empty() {
                p #no-prebookings { "None." }
            } @else {
                div.scroll { table #prebookings {
                    thead { tr { th { "Booker" } th { "GPU" } th { "Host" } th { "Window (UTC)" } th { "State" } th { "Paid" } th { "" } } }
                    tbody { @for b in &list {
                        tr #{ "prebooking-" (b.id) } {
                            td.booker { (b.booker_email.as_deref().unwrap_or("—")) }
                            td.gpu { (b.gpu_type) }
                            td.host { (b.host_slug.as_deref().unwrap_or("pool (legacy)")) }
                            td.window { (window(b)) }
                            td.state { (state_line(b)) }
                            td.paid { @if let Some(p) = b.paid_at { (short(p)) } @else { "—" } }
                            td.actions {
                                @if b.state != PrebookingState::Closed {
                                    @if superadmin && b.paid_at.is_none() {
                                        form.inline method="post" action={ "/admin/prebookings/" (b.id) "/paid" } {
                                            @if billing_on {
                                                input type="text" name="reason" required maxlength="500" placeholder="why, beside Checkout" aria-label="reason";
                                            }
                                            button type="submit" { "Record payment" }
                                        }
                                    }
                                    @if superadmin && billing_on && b.paid_at.is_some() {
                                        form.inline.refund method="post" action={ "/admin/prebookings/" (b.id) "/refund" } {
                                            input type="text" name="reason" required maxlength="500" placeholder="why" aria-label="reason";
                                            button type="submit" { "Refund" }
                                        }
                                    }
                                    form.inline.reassign method="post" action={ "/admin/prebookings/" (b.id) "/reassign" } {
                                        select name="host_id" aria-label="host" {
                                            @for h in &hosts {
                                                option value=(h.id) selected[b.host_id.as_deref() == Some(h.id.as_str())] { (h.slug) }
                                            }
                                        }
                                        button type="submit" { "Reassign" }
                                    }
                                }
                                @if superadmin && b.state != PrebookingState::Launched {
                                    form.inline.launch method="post" action={ "/admin/prebookings/" (b.id) "/launch" } {
                                        label { input type="checkbox" name="force" value="true"; " force" }
                                        button type="submit" { "Launch now" }
                                    }
                                }
                            }
                        }
                    } }
                } }
            }
        },
    ))
}

async fn operator_refusal(state: &AppState, op: &Operator, e: AppError) -> PageResult {
    let e = shown(e)?;
    let message = match e {
        AppError::NotFound => "there is no pre-booking with that id".to_owned(),
        ref other => other.to_string(),
    };
    let page = operator_page(state, op, Some(&message)).await?;
    Ok((e.status(), page).into_response())
}

pub async fn admin_page(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = require_operator(viewer)?;
    Ok(operator_page(&state, &op, None).await?.into_response())
}

fn back(id: &str) -> PageResult {
    Ok(Redirect::to(&format!("/admin/prebookings#prebooking-{id}")).into_response())
}

#[derive(Default, Deserialize)]
pub struct ReasonForm {
    #[serde(default)]
    reason: String,
}

/// `POST /admin/prebookings/{prebooking_id}/paid`: as the API's.
pub async fn record_payment(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(prebooking_id): Path<String>,
    Form(form): Form<ReasonForm>,
) -> PageResult {
    let admin = require_superadmin(viewer)?;
    let reason = form.reason.trim();
    let reason = (!reason.is_empty()).then_some(reason);
    match prebookings::record_payment(&state, &admin, &prebooking_id, reason).await {
        Ok(_) => back(&prebooking_id),
        Err(e) => operator_refusal(&state, &Operator(admin.0), e).await,
    }
}

/// `POST /admin/prebookings/{prebooking_id}/refund`: as the API's.
pub async fn refund(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(prebooking_id): Path<String>,
    Form(form): Form<ReasonForm>,
) -> PageResult {
    let admin = require_superadmin(viewer)?;
    match prebookings::refund(&state, &admin, &prebooking_id, &form.reason).await {
        Ok(_) => back(&prebooking_id),
        Err(e) => operator_refusal(&state, &Operator(admin.0), e).await,
    }
}

#[derive(Default, Deserialize)]
pub struct LaunchForm {
    #[serde(default)]
    force: Option<String>,
}

/// `POST /admin/prebookings/{prebooking_id}/launch`: E0 caller 5, as the API's.
pub async fn launch(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(prebooking_id): Path<String>,
    Form(form): Form<LaunchForm>,
) -> PageResult {
    let admin = require_superadmin(viewer)?;
    let force = form
        .force
        .as_deref()
        .is_some_and(|f| f == "true" || f == "on");
    match prebookings::launch(&state, &admin, &prebooking_id, force).await {
        Ok(_) => back(&prebooking_id),
        Err(e) => operator_refusal(&state, &Operator(admin.0), e).await,
    }
}

#[derive(Default, Deserialize)]
pub struct ReassignForm {
    #[serde(default)]
    host_id: String,
}

/// `POST /admin/prebookings/{prebooking_id}/reassign`: as the API's.
pub async fn reassign(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(prebooking_id): Path<String>,
    Form(form): Form<ReassignForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    match prebookings::reassign(&state, &op, &prebooking_id, &form.host_id).await {
        Ok(_) => back(&prebooking_id),
        Err(e) => operator_refusal(&state, &op, e).await,
    }
}
