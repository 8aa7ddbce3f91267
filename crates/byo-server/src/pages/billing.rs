//! The customer's Billing page (issue #13, 4): whether this installation bills, whether the
//! account may be charged now (asked of Stripe live) and the way to add a payment method
//! (a Stripe Checkout page). With billing off it says so. The rules are
//! [`crate::app::billing`]'s.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Redirect};
use byo_wire::billing::{CreditView, InvoiceView, MonthUsage};
use byo_wire::states::InvoiceStatus;
use maud::{Markup, html};
use serde::Deserialize;

use super::instances::at;
use super::{PageError, PageResult, layout};
use crate::app::billing::{self, BILLING_OFF, money};
use crate::auth::CurrentUser;
use crate::error::AppError;
use crate::state::AppState;

#[derive(Default, Deserialize)]
pub struct Back {
    #[serde(default)]
    added: Option<String>,
    #[serde(default)]
    paid: Option<String>,
}

/// `GET /billing`.
pub async fn page(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Query(back): Query<Back>,
) -> PageResult {
    let v = viewer.ok_or(PageError::from(AppError::Unauthenticated))?;
    let status = billing::status(&state, &v).await;
    Ok(layout("Billing", Some(&v), html! {
        h1 { "Billing" }
        @match &status {
            Ok(s) if !s.enabled => { p #billing-off role="status" { (BILLING_OFF) } }
            Ok(s) => {
                @if back.added.is_some() { p.notice role="status" { "Thank you: your card is being added. It shows here once Stripe confirms it." } }
                @if back.paid.is_some() { p.notice role="status" { "Thank you: your payment is being confirmed. Your booking shows it as paid once Stripe confirms it." } }
                @if s.chargeable {
                    p #billing-ok { "Your account has a payment method: instances you create are billed by the hour, from creation until the host confirms the delete." }
                } @else {
                    p #billing-refused role="alert" { "Your account cannot be charged yet: " (s.reason.as_deref().unwrap_or("")) }
                }
                h2 { "Payment method" }
                @if let Some(card) = &s.payment_method {
                    p #payment-method { "On file: " strong { (card) } ". Replacing it takes you to Stripe; an unpaid invoice is paid again with the new card at once." }
                } @else {
                    p #payment-method { "None on file." }
                }
                form #add-payment-method method="post" action="/billing/payment-method" {
                    button type="submit" { (if s.payment_method.is_some() { "Replace the payment method" } else { "Add a payment method" }) }
                }
                @if let Some(m) = &s.this_month { (this_month(m)) }
                h2 { "Invoices" }
                (invoices(&s.invoices))
                @if !s.credits.is_empty() { (credits(&s.credits)) }
            }
            Err(_) => { p.error role="alert" { "Stripe could not be asked just now; try again in a minute." } }
        }
    }).into_response())
}

/// This month's usage so far, per instance: what the next invoice will hold, live.
fn this_month(m: &MonthUsage) -> Markup {
    html! {
        h2 { "This month so far" }
        @if m.instances.is_empty() {
            p #usage-none { "No usage since " (at(m.since)) "." }
        } @else {
            div.scroll { table #usage {
                thead { tr { th { "Instance" } th { "Hours" } th { "Amount" } } }
                tbody {
                    @for i in &m.instances {
                        tr data-vm=(i.vm_id) {
                            td { (i.name) }
                            td { (format!("{:.1}", i.seconds as f64 / 3600.0)) }
                            td { (money(i.amount_cents, &m.currency)) }
                        }
                    }
                }
                tfoot { tr { th { "Total since " (at(m.since)) } td {} td #usage-total { (money(m.total_cents, &m.currency)) } } }
            } }
            p.hint { "Live, from when each instance was created until its host confirmed the delete; each day is charged once it ends, and invoiced when the month ends or the total reaches this installation's threshold." }
        }
    }
}

/// Credits for deletes the host confirmed late: the time from the delete to the
/// confirmation, taken off the next invoice.
fn credits(list: &[CreditView]) -> Markup {
    html! {
        h2 { "Credits" }
        div.scroll { table #credits {
            thead { tr { th { "Instance" } th { "Deleted" } th { "Confirmed" } th { "Credit" } } }
            tbody {
                @for c in list {
                    tr {
                        td { code { (c.vm_id) } }
                        td { (at(c.from)) }
                        td { (at(c.to)) }
                        td { (money(-c.amount_cents, &c.currency)) }
                    }
                }
            }
        } }
    }
}

/// The account's invoices, newest first: when, why, how much, where it stands, and Stripe's
/// page for it.
fn invoices(list: &[InvoiceView]) -> Markup {
    html! {
        @if list.is_empty() {
            p #no-invoices { "No invoices yet. Usage is invoiced when a month ends, or earlier once it reaches this installation's invoicing threshold." }
        } @else {
            div.scroll { table #invoices {
                thead { tr { th { "Made" } th { "Why" } th { "Amount" } th { "Status" } th { "Invoice" } } }
                tbody {
                    @for i in list {
                        tr data-invoice=(i.id) {
                            td { (at(i.created_at)) }
                            td { (match i.reason.as_str() { "month_end" => "the month ended", "threshold" => "usage reached the threshold", other => other }) }
                            td { (money(i.amount_cents, &i.currency)) }
                            td.status {
                                @match (i.status, i.payment_failed_at) {
                                    (InvoiceStatus::Paid, _) => { "paid" @if let Some(t) = i.paid_at { " " (at(t)) } }
                                    (InvoiceStatus::Open, Some(t)) => { strong role="alert" { "payment declined " (at(t)) } ": pay it on Stripe's page, or replace the payment method above" }
                                    (InvoiceStatus::Pending | InvoiceStatus::Draft, _) => { "being prepared" }
                                    (other, _) => { (other.as_str()) }
                                }
                            }
                            td { @if let Some(u) = &i.hosted_invoice_url { a href=(u) rel="noopener" { "view on Stripe" } } }
                        }
                    }
                }
            } }
        }
    }
}

/// `GET /admin/billing`: the accounts held by a declined invoice, then every account's
/// recent invoices (as `GET /api/admin/billing`).
pub async fn admin(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = super::require_operator(viewer)?;
    let v = crate::app::billing_admin::admin_view(&state).await?;
    let invoice_row = |email: &str, i: &InvoiceView| {
        html! {
            tr data-invoice=(i.id) {
                td { (at(i.created_at)) }
                td { (email) }
                td { (money(i.amount_cents, &i.currency)) }
                td.status { (i.status.as_str()) @if i.payment_failed_at.is_some() && i.status != InvoiceStatus::Paid { " (declined)" } }
                td { @if let Some(u) = &i.hosted_invoice_url { a href=(u) rel="noopener" { "on Stripe" } } }
            }
        }
    };
    Ok(super::ops_layout("Billing", Some(&op.0), html! {
        h1 { "Billing" }
        @if !v.enabled {
            p #billing-off role="status" { (BILLING_OFF) }
        } @else {
            h2 { "Held accounts" }
            p { "An account whose invoice was declined creates, queues, books and starts nothing until it pays; past the grace its running instances are stopped (never deleted) and start again once it is paid." }
            @if v.held.is_empty() {
                p #no-held { "None." }
            } @else {
                div.scroll { table #held {
                    thead { tr { th { "Account" } th { "Owes" } th { "Declined" } th { "Instances stop" } th { "Stopped now" } } }
                    tbody { @for h in &v.held { tr {
                        td { (h.email) }
                        td { (money(h.invoice.amount_cents, &h.invoice.currency)) }
                        td { @if let Some(t) = h.invoice.payment_failed_at { (at(t)) } }
                        td { (at(h.stop_at)) }
                        td.stopped { (h.stopped_instances) }
                    } } }
                } }
            }
            h2 { "Payouts not yet sent" }
            p { "Each owner's share is transferred to their Stripe account once a month has ended; a refused transfer is tried again after an hour, doubling to a day." }
            @if v.pending_payouts.is_empty() {
                p #no-pending-payouts { "None." }
            } @else {
                div.scroll { table #pending-payouts {
                    thead { tr { th { "Owner" } th { "Month" } th { "Amount" } th { "Tries" } th { "Last refusal" } th { "Next try" } } }
                    tbody { @for p in &v.pending_payouts { tr data-payout=(p.payout.id) {
                        td { (p.email) }
                        td { (p.payout.month) }
                        td { (money(p.payout.amount_cents, &p.payout.currency)) }
                        td { (p.payout.attempts) }
                        td.error { (p.payout.last_error.as_deref().unwrap_or("")) }
                        td { (at(p.payout.next_attempt_at)) }
                    } } }
                } }
            }
            h2 { "Invoices" }
            @if v.invoices.is_empty() {
                p #no-invoices { "None yet." }
            } @else {
                div.scroll { table #all-invoices {
                    thead { tr { th { "Made" } th { "Account" } th { "Amount" } th { "Status" } th { "" } } }
                    tbody { @for i in &v.invoices { (invoice_row(&i.email, &i.invoice)) } }
                } }
            }
        }
    }).into_response())
}

/// `POST /billing/payment-method`: to Stripe's Checkout page (setup mode).
pub async fn add_payment_method(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
) -> PageResult {
    let v = viewer.ok_or(PageError::from(AppError::Unauthenticated))?;
    let checkout = billing::payment_method_checkout(&state, &v).await?;
    Ok(Redirect::to(&checkout.url).into_response())
}
