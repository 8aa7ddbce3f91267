//! Billing (issue #13). The gate — whether an account may be charged, asked live — is
//! [`crate::billing`] (beside `state`, which holds it), re-exported here. `byo up` runs with
//! billing off: every account may be charged and nothing is.
//!
//! With `[billing]` configured, [`StripeBilling`] is the gate and the rest of billing runs
//! on Stripe (`docs/billing.md`):
//! - the live check: the account's Stripe customer has a usable default payment method,
//!   asked of Stripe each time (never cached here);
//! - Checkout: a session in setup mode to add a card, and one in payment mode for a
//!   pre-booking (`metadata[prebooking_id]`);
//! - the webhook: `Stripe-Signature` verified ([`verify_signature`]), each event processed
//!   once by its id; `checkout.session.completed` for a booking is the only writer of
//!   `paid_at` (E3.1), for a setup session it makes the new card the default;
//! - usage ([`usage`], the job `bill-usage`): an invoice item per instance per UTC day from
//!   the four timestamps, and a credit for a stuck delete's time (G.3).

use anyhow::anyhow;
use byo_db::billing::{EventSeen, NewRefund, NewUsageCharge};
use byo_wire::billing::{
    BillingView, CheckoutView, CreditView, InvoiceView, MonthUsage, UsageLine,
};
use byo_wire::states::InvoiceStatus;
use chrono::{DateTime, TimeDelta, Utc};
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::auth::CurrentUser;
use crate::error::{AppError, AppResult};
use crate::providers::stripe::{NewInvoiceItem, PaymentLine, StripeError};
use crate::state::AppState;

pub use crate::billing::{BillingGate, BillingOff, Charge, StripeBilling, StripeGate, money};

/// What the pages say when billing is off.
pub const BILLING_OFF: &str = "Billing is off on this installation: nobody is charged.";

/// How far a webhook's signed timestamp may be from now (Stripe's own default).
pub const WEBHOOK_TOLERANCE_SECS: i64 = 300;

/// How many unfinished instances one `bill-usage` run reads.
pub const BILL_BATCH: i64 = 500;
/// How often `bill-usage` runs.
pub const BILL_EVERY: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// The caller's billing status (the Billing page and `GET /api/billing`).
pub async fn status(state: &AppState, user: &CurrentUser) -> AppResult<BillingView> {
    if !state.billing.enabled() {
        return Ok(BillingView {
            enabled: false,
            chargeable: true,
            reason: None,
            payment_method: None,
            this_month: None,
            invoices: Vec::new(),
            credits: Vec::new(),
        });
    }
    let sub = &user.user.sub;
    let now = state.clock.now();
    let invoices = state
        .store
        .invoices_for(&user.user.sub, INVOICES_LISTED)
        .await?
        .into_iter()
        .map(invoice_view)
        .collect();
    let (charge, payment_method) = match state.stripe.as_deref() {
        Some(stripe) => stripe.inspect(sub, now).await?,
        None => (state.billing.may_charge(sub).await?, None),
    };
    let (chargeable, reason) = match charge {
        Charge::Allowed => (true, None),
        Charge::Refused { reason } => (false, Some(reason)),
    };
    let this_month = match state.stripe.as_deref() {
        Some(stripe) => Some(month_so_far(state, stripe, sub, now).await?),
        None => None,
    };
    let credits = state
        .store
        .refunds_of(sub, INVOICES_LISTED)
        .await?
        .into_iter()
        .map(|r| CreditView {
            vm_id: r.vm_id,
            from: r.from_at,
            to: r.to_at,
            amount_cents: i64::from(r.amount_cents),
            currency: r.currency,
        })
        .collect();
    Ok(BillingView {
        enabled: true,
        chargeable,
        reason,
        payment_method,
        this_month,
        invoices,
        credits,
    })
}

/// The account's usage since the first of this month, per instance, live from the four
/// timestamps and priced as its days will be charged.
async fn month_so_far(
    state: &AppState,
    stripe: &StripeBilling,
    user_sub: &str,
    now: DateTime<Utc>,
) -> AppResult<MonthUsage> {
    let since = invoicing::month_start(now);
    let price = stripe.config.price_cents_per_hour;
    let mut instances = Vec::new();
    for v in state.store.vms_billable_since(user_sub, since).await? {
        let times = usage::VmTimes {
            created_at: v.created_at,
            creation_failed_at: v.creation_failed_at,
            delete_requested_at: v.delete_requested_at,
            deleted_at: v.deleted_at,
        };
        let (seconds, amount_cents) = usage::so_far(&times, since, now, price);
        if seconds > 0 {
            instances.push(UsageLine {
                vm_id: v.id,
                name: v.name,
                seconds,
                amount_cents,
            });
        }
    }
    Ok(MonthUsage {
        since,
        currency: stripe.config.currency.clone(),
        total_cents: instances.iter().map(|i| i.amount_cents).sum(),
        instances,
    })
}

/// One invoice as its account and the operators read it.
pub(crate) fn invoice_view(i: byo_db::invoices::InvoiceRow) -> InvoiceView {
    InvoiceView {
        id: i.id,
        created_at: i.created_at,
        reason: i.reason,
        amount_cents: i64::from(i.amount_cents),
        currency: i.currency,
        status: i.status,
        hosted_invoice_url: i.hosted_invoice_url,
        payment_failed_at: i.payment_failed_at,
        paid_at: i.paid_at,
    }
}

/// How many of an account's invoices its billing status lists (two years of months).
pub const INVOICES_LISTED: i64 = 24;

pub(crate) fn stripe_of(state: &AppState) -> AppResult<&StripeBilling> {
    state.stripe.as_deref().ok_or_else(|| {
        AppError::conflict(
            "billing_off",
            "billing is off on this installation: there is nothing to pay",
        )
    })
}

pub(crate) fn stripe_failed(e: StripeError) -> AppError {
    AppError::Internal(anyhow!("{e}"))
}

/// The caller's Stripe customer, made on first use.
async fn customer_for(
    state: &AppState,
    stripe: &StripeBilling,
    user: &CurrentUser,
) -> AppResult<String> {
    if let Some(c) = state.store.stripe_customer(&user.user.sub).await? {
        return Ok(c);
    }
    let made = stripe
        .client
        .create_customer(&user.user.sub, &user.user.email)
        .await
        .map_err(stripe_failed)?;
    Ok(state
        .store
        .keep_stripe_customer(&user.user.sub, &made.id, state.clock.now())
        .await?)
}

pub(crate) fn page_url(state: &AppState, path: &str) -> String {
    format!("{}{path}", state.config.public_url.trim_end_matches('/'))
}

/// A Checkout page (setup mode) where the caller adds a card; the webhook makes it the
/// default payment method.
pub async fn payment_method_checkout(
    state: &AppState,
    user: &CurrentUser,
) -> AppResult<CheckoutView> {
    let stripe = stripe_of(state)?;
    let customer = customer_for(state, stripe, user).await?;
    let session = stripe
        .client
        .checkout_setup(
            &customer,
            &page_url(state, "/billing?added=1"),
            &page_url(state, "/billing"),
        )
        .await
        .map_err(stripe_failed)?;
    checkout_view(session.url)
}

fn checkout_view(url: Option<String>) -> AppResult<CheckoutView> {
    url.map(|url| CheckoutView { url })
        .ok_or_else(|| AppError::Internal(anyhow!("stripe: a Checkout session without a url")))
}

/// What a booking costs: the configured hourly price for every started hour of its window.
pub fn booking_amount(start: DateTime<Utc>, end: DateTime<Utc>, price_cents_per_hour: u32) -> i64 {
    let secs = (end - start).num_seconds().max(0);
    let hours = (secs + 3599) / 3600;
    hours * i64::from(price_cents_per_hour)
}

/// A Checkout page (payment mode) for the caller's unpaid, open booking. Someone else's
/// booking is not found; a paid or closed one is refused.
pub async fn prebooking_checkout(
    state: &AppState,
    user: &CurrentUser,
    prebooking_id: &str,
) -> AppResult<CheckoutView> {
    let stripe = stripe_of(state)?;
    let booking = state
        .store
        .prebooking_for_billing(prebooking_id)
        .await?
        .filter(|b| b.user_sub == user.user.sub)
        .ok_or(AppError::NotFound)?;
    if booking.paid_at.is_some() {
        return Err(AppError::conflict(
            "already_paid",
            "this booking is paid already",
        ));
    }
    if booking.closed_at.is_some() || booking.end_date <= state.clock.now() {
        return Err(AppError::conflict(
            "booking_closed",
            "this booking is closed: its window has ended or it was cancelled",
        ));
    }
    let amount = booking_amount(
        booking.start_date,
        booking.end_date,
        stripe.config.price_cents_per_hour,
    );
    let customer = customer_for(state, stripe, user).await?;
    let name = format!(
        "{} from {} to {}",
        booking.gpu_type,
        booking.start_date.format("%Y-%m-%d %H:%M UTC"),
        booking.end_date.format("%Y-%m-%d %H:%M UTC")
    );
    let session = stripe
        .client
        .checkout_payment(
            &customer,
            &PaymentLine {
                name: &name,
                amount,
                currency: &stripe.config.currency,
            },
            &[
                ("prebooking_id", booking.id.as_str()),
                ("user_sub", booking.user_sub.as_str()),
            ],
            &page_url(state, "/billing?paid=1"),
            &page_url(state, "/billing"),
        )
        .await
        .map_err(stripe_failed)?;
    checkout_view(session.url)
}

/// Why a webhook was refused before its payload was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignatureRefusal {
    /// No `t=`, no `v1=`, or no `v1` that matches.
    BadSignature,
    /// A matching signature over a timestamp further than the tolerance from now.
    Stale,
}

type HmacSha256 = Hmac<Sha256>;

/// Stripe's signature: HMAC-SHA256 with the endpoint's secret over `"{t}.{payload}"`, hex.
pub fn sign(secret: &[u8], t: i64, payload: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    hex::encode(mac.finalize().into_bytes())
}

/// Verify `Stripe-Signature` (`t=…,v1=…[,v1=…][,v0=…]`): any `v1` matching (compared in
/// constant time) and `t` within `tolerance_secs` of `now`, either way.
pub fn verify_signature(
    header: &str,
    payload: &[u8],
    secret: &[u8],
    now: DateTime<Utc>,
    tolerance_secs: i64,
) -> Result<(), SignatureRefusal> {
    let mut t = None;
    let mut candidates = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = v.parse::<i64>().ok(),
            Some(("v1", v)) => {
                if let Ok(bytes) = hex::decode(v) {
                    candidates.push(bytes);
                }
            }
            _ => {}
        }
    }
    let t = t.ok_or(SignatureRefusal::BadSignature)?;
    let expected = hex::decode(sign(secret, t, payload)).expect("our own hex");
    let matched = candidates.iter().fold(subtle::Choice::from(0), |acc, c| {
        acc | if c.len() == expected.len() {
            c.as_slice().ct_eq(&expected)
        } else {
            subtle::Choice::from(0)
        }
    });
    if !bool::from(matched) {
        return Err(SignatureRefusal::BadSignature);
    }
    if (now.timestamp() - t).abs() > tolerance_secs {
        return Err(SignatureRefusal::Stale);
    }
    Ok(())
}

/// What a verified webhook came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// Processed now (what it did, for the log).
    Processed(String),
    /// Seen and processed before: nothing changed.
    Replayed,
}

/// `POST /api/stripe/webhook`: verify, then process once by event id. A refusal changes
/// nothing; a failure part-way (Stripe unreachable) answers 5xx and leaves the event
/// unfinished, so Stripe's retry processes it again (every effect is itself idempotent).
pub async fn webhook(
    state: &AppState,
    signature: Option<&str>,
    payload: &[u8],
) -> AppResult<WebhookOutcome> {
    let stripe = state.stripe.as_deref().ok_or(AppError::NotFound)?;
    let now = state.clock.now();
    use secrecy::ExposeSecret;
    let secret = stripe.config.stripe_webhook_secret.expose_secret();
    match verify_signature(
        signature.unwrap_or(""),
        payload,
        secret.as_bytes(),
        now,
        WEBHOOK_TOLERANCE_SECS,
    ) {
        Ok(()) => {}
        Err(SignatureRefusal::BadSignature) => {
            return Err(AppError::bad_request(
                "bad_signature",
                "the Stripe-Signature header does not sign this payload",
            ));
        }
        Err(SignatureRefusal::Stale) => {
            return Err(AppError::bad_request(
                "stale_signature",
                format!(
                    "the signed timestamp is more than {WEBHOOK_TOLERANCE_SECS} s from now: a replayed or delayed request"
                ),
            ));
        }
    }
    let event: Value = serde_json::from_slice(payload)
        .map_err(|_| AppError::bad_request("invalid_event", "the event is not JSON"))?;
    let (Some(id), Some(kind)) = (event["id"].as_str(), event["type"].as_str()) else {
        return Err(AppError::bad_request(
            "invalid_event",
            "the event has no id or type",
        ));
    };
    if id.is_empty() || id.len() > 255 || kind.len() > 255 {
        return Err(AppError::bad_request(
            "invalid_event",
            "the event's id or type is too long",
        ));
    }
    if state.store.record_stripe_event(id, kind, now).await? == EventSeen::Processed {
        tracing::info!(event = %id, kind = %kind, "stripe event replayed: nothing to do");
        return Ok(WebhookOutcome::Replayed);
    }
    let object = &event["data"]["object"];
    let did = match kind {
        "checkout.session.completed" | "checkout.session.async_payment_succeeded" => {
            checkout_completed(state, stripe, object, now).await?
        }
        "invoice.finalized"
        | "invoice.paid"
        | "invoice.payment_succeeded"
        | "invoice.payment_failed"
        | "invoice.voided"
        | "invoice.marked_uncollectible" => invoice_event(state, kind, object, now).await?,
        other => format!("ignored {other}"),
    };
    state.store.mark_stripe_event_processed(id, now).await?;
    tracing::info!(event = %id, kind = %kind, outcome = %did, "stripe event processed");
    Ok(WebhookOutcome::Processed(did))
}

async fn checkout_completed(
    state: &AppState,
    stripe: &StripeBilling,
    session: &Value,
    now: DateTime<Utc>,
) -> AppResult<String> {
    match session["mode"].as_str() {
        Some("payment") => {
            let Some(booking_id) = session["metadata"]["prebooking_id"].as_str() else {
                return Ok("a payment for no booking: nothing to record".into());
            };
            if session["payment_status"].as_str() != Some("paid") {
                return Ok(format!("booking {booking_id}: not paid yet"));
            }
            let Some(booking) = state.store.prebooking_for_billing(booking_id).await? else {
                tracing::warn!(prebooking = %booking_id, "a paid Checkout session for a booking that does not exist: nothing written");
                return Ok(format!("unknown booking {booking_id}: nothing written"));
            };
            if session["metadata"]["user_sub"].as_str() != Some(booking.user_sub.as_str()) {
                tracing::warn!(prebooking = %booking_id, "a paid Checkout session whose account is not the booking's: nothing written");
                return Ok(format!(
                    "booking {booking_id}: another account's payment, nothing written"
                ));
            }
            let w = state.store.mark_prebooking_paid(booking_id, now).await?;
            // What a refund refunds: the session's payment intent and what it took.
            if let Some(pi) = session["payment_intent"].as_str() {
                state
                    .store
                    .record_booking_payment(&byo_db::billing::BookingPaymentRow {
                        prebooking_id: booking_id.to_owned(),
                        payment_intent: pi.to_owned(),
                        amount_cents: session["amount_total"]
                            .as_i64()
                            .and_then(|a| i32::try_from(a).ok())
                            .unwrap_or(0),
                        currency: session["currency"]
                            .as_str()
                            .unwrap_or(&stripe.config.currency)
                            .to_owned(),
                        paid_at: now,
                    })
                    .await?;
            }
            Ok(format!("booking {booking_id}: paid ({w:?})"))
        }
        Some("setup") => {
            let (Some(customer), Some(intent)) = (
                session["customer"].as_str(),
                session["setup_intent"].as_str(),
            ) else {
                return Ok("a setup session without a customer or intent: nothing to do".into());
            };
            let intent = stripe
                .client
                .retrieve_setup_intent(intent)
                .await
                .map_err(stripe_failed)?;
            let Some(pm) = intent.payment_method else {
                return Ok(format!("customer {customer}: no payment method set up"));
            };
            stripe
                .client
                .set_default_payment_method(customer, &pm)
                .await
                .map_err(stripe_failed)?;
            let retried = pay_declined_with(state, stripe, customer, &pm, now).await?;
            Ok(format!(
                "customer {customer}: default payment method {pm}{retried}"
            ))
        }
        _ => Ok("a Checkout session of another mode: nothing to do".into()),
    }
}

/// An invoice's webhook: the invoice is ours when its Stripe id is on a row, or (the event
/// overtook the answer that carried the id) when `metadata.invoice_id` names one. Its status
/// moves only forward, so events in any order leave the latest state; a decline stamps
/// `payment_failed_at`. Someone else's invoice is recorded and ignored.
async fn invoice_event(
    state: &AppState,
    kind: &str,
    object: &Value,
    now: DateTime<Utc>,
) -> AppResult<String> {
    let Ok(inv) = serde_json::from_value::<crate::providers::stripe::Invoice>(object.clone())
    else {
        return Ok(format!("{kind}: not an invoice object, nothing written"));
    };
    let row = match state.store.invoice_by_stripe_id(&inv.id).await? {
        Some(r) => Some(r),
        None => match inv.metadata.get("invoice_id").and_then(Value::as_str) {
            Some(ours) => state
                .store
                .invoice(ours)
                .await?
                .filter(|r| r.stripe_invoice_id.as_deref().is_none_or(|s| s == inv.id)),
            None => None,
        },
    };
    let Some(row) = row else {
        tracing::warn!(stripe_invoice = %inv.id, kind, "an invoice event for an invoice this installation did not make: nothing written");
        return Ok(format!("invoice {}: not ours, nothing written", inv.id));
    };
    let failed = kind == "invoice.payment_failed";
    let update = byo_db::invoices::InvoiceUpdate {
        status: inv.status.as_deref().and_then(|s| s.parse().ok()),
        stripe_invoice_id: Some(&inv.id),
        hosted_invoice_url: inv.hosted_invoice_url.as_deref(),
        stripe_total_cents: Some(inv.total),
        pay_attempted: failed,
        payment_failed: failed,
        last_error: failed.then_some("the payment failed (invoice.payment_failed)"),
    };
    let w = state.store.update_invoice(&row.id, &update, now).await?;
    let after = state
        .store
        .invoice(&row.id)
        .await?
        .ok_or_else(|| AppError::Internal(anyhow!("invoice {} vanished", row.id)))?;
    let newly_failed = after.payment_failed_at.is_some() && row.payment_failed_at.is_none();
    let settled = after.status != row.status
        && matches!(after.status, InvoiceStatus::Paid | InvoiceStatus::Void);
    if newly_failed || settled {
        let action = if settled {
            format!("billing.invoice_{}", after.status)
        } else {
            "billing.payment_failed".to_owned()
        };
        state
            .store
            .audit(
                None,
                &action,
                Some(&row.id),
                json!({"user_sub": row.user_sub, "stripe_invoice_id": inv.id,
                       "amount_cents": row.amount_cents, "event": kind}),
                now,
            )
            .await?;
    }
    if settled {
        // The account may owe nothing declined now: its stopped instances start at once.
        super::unpaid::release_soon(state);
    }
    Ok(format!(
        "invoice {} ({}): {} ({w:?})",
        row.id,
        inv.id,
        inv.status.as_deref().unwrap_or("no status")
    ))
}

/// Refund a booking's Checkout payment in full (issue #40, 5), once: `POST /v1/refunds` on its
/// payment intent under the key `refund-booking-<id>` (a retry after a crash refunds
/// nothing twice), then the refund recorded and audited with `reason`. 409 with billing off,
/// for a booking not paid through Checkout (an off-band payment is returned off-band), and
/// for one already refunded.
pub async fn refund_booking(
    state: &AppState,
    prebooking_id: &str,
    reason: &str,
    by: &str,
) -> AppResult<byo_db::billing::BookingRefundRow> {
    let stripe = stripe_of(state)?;
    if state.store.booking_refund(prebooking_id).await?.is_some() {
        return Err(AppError::conflict(
            "already_refunded",
            "this booking's payment was refunded already",
        ));
    }
    let Some(payment) = state.store.booking_payment(prebooking_id).await? else {
        return Err(AppError::conflict(
            "not_paid_by_checkout",
            "this booking was not paid through Checkout: a payment recorded by hand is returned the way it was collected",
        ));
    };
    let refund = stripe
        .client
        .create_refund(
            &payment.payment_intent,
            i64::from(payment.amount_cents),
            &[("prebooking_id", prebooking_id)],
            &format!("refund-booking-{prebooking_id}"),
        )
        .await
        .map_err(stripe_failed)?;
    let now = state.clock.now();
    let row = byo_db::billing::BookingRefundRow {
        prebooking_id: prebooking_id.to_owned(),
        stripe_refund_id: refund.id,
        amount_cents: payment.amount_cents,
        currency: payment.currency,
        reason: reason.to_owned(),
        refunded_by: Some(by.to_owned()),
        created_at: now,
    };
    state.store.record_booking_refund(&row).await?;
    state
        .store
        .audit(
            Some(by),
            "prebooking.refunded",
            Some(prebooking_id),
            json!({"reason": reason, "amount_cents": row.amount_cents,
                   "stripe_refund_id": row.stripe_refund_id}),
            now,
        )
        .await?;
    Ok(row)
}

/// A new default card: each declined, unpaid invoice of the customer is paid again with it,
/// once per card (key `pay-<our id>-<card>`). What it came to, for the event's log line. A
/// decline is recorded; an outage fails the event, so Stripe's retry tries again.
async fn pay_declined_with(
    state: &AppState,
    stripe: &StripeBilling,
    customer: &str,
    pm: &str,
    now: DateTime<Utc>,
) -> AppResult<String> {
    let mut said = String::new();
    let mut any_paid = false;
    for row in state.store.declined_unpaid_invoices().await? {
        let (true, Some(sid)) = (
            row.customer_id == customer,
            row.stripe_invoice_id.as_deref(),
        ) else {
            continue;
        };
        let key = format!("pay-{}-{pm}", row.id);
        let answer = stripe.client.pay_invoice(sid, &key).await;
        let declined = match &answer {
            Err(e) if e.is_outage() => return Err(stripe_failed(e.clone())),
            Err(e) => Some(e.to_string()),
            Ok(_) => None,
        };
        let update = match &answer {
            Ok(inv) => byo_db::invoices::InvoiceUpdate {
                status: inv.status.as_deref().and_then(|s| s.parse().ok()),
                hosted_invoice_url: inv.hosted_invoice_url.as_deref(),
                stripe_total_cents: Some(inv.total),
                ..Default::default()
            },
            Err(_) => byo_db::invoices::InvoiceUpdate {
                last_error: declined.as_deref(),
                ..Default::default()
            },
        };
        state.store.update_invoice(&row.id, &update, now).await?;
        let paid = matches!(
            state.store.invoice(&row.id).await?.map(|r| r.status),
            Some(InvoiceStatus::Paid)
        );
        if paid {
            any_paid = true;
            state
                .store
                .audit(
                    None,
                    "billing.invoice_paid",
                    Some(&row.id),
                    json!({"user_sub": row.user_sub, "stripe_invoice_id": sid,
                           "amount_cents": row.amount_cents, "with": "a new payment method"}),
                    now,
                )
                .await?;
        }
        said.push_str(&format!(
            "; invoice {} paid again with it: {}",
            row.id,
            if paid { "paid" } else { "declined" }
        ));
    }
    if any_paid {
        super::unpaid::release_soon(state);
    }
    Ok(said)
}

/// The charge as pure computation over the four timestamps, time passed in.
pub mod usage {
    use chrono::{DateTime, TimeDelta, Utc};

    /// An instance's billing facts (E1 step 44, G.1).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct VmTimes {
        pub created_at: DateTime<Utc>,
        pub creation_failed_at: Option<DateTime<Utc>>,
        pub delete_requested_at: Option<DateTime<Utc>>,
        pub deleted_at: Option<DateTime<Utc>>,
    }

    /// One billing period (a UTC day) of one instance, and the billable seconds in it.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Period {
        pub start: DateTime<Utc>,
        pub end: DateTime<Utc>,
        pub seconds: i64,
    }

    /// The UTC day holding `t`.
    pub fn day_of(t: DateTime<Utc>) -> DateTime<Utc> {
        t.date_naive()
            .and_hms_opt(0, 0, 0)
            .expect("midnight exists")
            .and_utc()
    }

    /// The billable span: [created_at, deleted_at), up to `now` while not deleted; nothing
    /// for a create that failed.
    pub fn billable(v: &VmTimes, now: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        if v.creation_failed_at.is_some() {
            return None;
        }
        let end = v.deleted_at.unwrap_or(now);
        (end > v.created_at).then_some((v.created_at, end))
    }

    /// The periods that are final and not charged yet: a day is final once it has ended,
    /// or once the instance was deleted (its time can no longer grow). A still-running
    /// instance's current day waits for midnight.
    pub fn due_periods(v: &VmTimes, charged: &[DateTime<Utc>], now: DateTime<Utc>) -> Vec<Period> {
        let Some((from, to)) = billable(v, now) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut day = day_of(from);
        while day < to {
            let next = day + TimeDelta::days(1);
            let final_ = next <= now || v.deleted_at.is_some();
            if !final_ {
                break;
            }
            // Positive: `day < to`, and `from` lies in the first day.
            let seconds = (to.min(next) - from.max(day)).num_seconds();
            if !charged.contains(&day) {
                out.push(Period {
                    start: day,
                    end: next,
                    seconds,
                });
            }
            day = next;
        }
        out
    }

    /// An instance's usage from `since` to `now`, as its days will be charged: the billable
    /// seconds, and the sum of each day's amount (the current day's so far).
    pub fn so_far(
        v: &VmTimes,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
        price_cents_per_hour: u32,
    ) -> (i64, i64) {
        let Some((from, to)) = billable(v, now) else {
            return (0, 0);
        };
        let (from, to) = (from.max(since), to.min(now));
        let (mut seconds, mut cents) = (0, 0);
        let mut day = day_of(from);
        while day < to && from < to {
            let next = day + TimeDelta::days(1);
            let s = (to.min(next) - from.max(day)).num_seconds();
            seconds += s;
            cents += amount_cents(s, price_cents_per_hour);
            day = next;
        }
        (seconds, cents)
    }

    /// Seconds at an hourly price, to the nearest cent (half up).
    pub fn amount_cents(seconds: i64, price_cents_per_hour: u32) -> i64 {
        (seconds.max(0) * i64::from(price_cents_per_hour) + 1800) / 3600
    }

    /// A stuck delete's refund (G.3): from delete_requested_at (the customer gave the
    /// instance up when they asked) to deleted_at, when that took longer than `stuck_after`.
    pub fn stuck_refund(
        v: &VmTimes,
        stuck_after: TimeDelta,
    ) -> Option<(DateTime<Utc>, DateTime<Utc>, i64)> {
        if v.creation_failed_at.is_some() {
            return None;
        }
        let (asked, gone) = (v.delete_requested_at?, v.deleted_at?);
        let from = asked.max(v.created_at);
        (gone - asked > stuck_after && gone > from)
            .then(|| (from, gone, (gone - from).num_seconds()))
    }
}

/// What one `bill-usage` run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BillReport {
    pub charged: usize,
    pub refunded: usize,
    pub closed: usize,
    /// Instances of accounts with no Stripe customer: left for a later run.
    pub no_customer: usize,
    pub failed: usize,
    /// Invoices made this run (each account's uninvoiced usage, at month end or past the
    /// threshold).
    pub invoiced: usize,
    /// Invoices that reached `paid` this run.
    pub invoices_paid: usize,
    /// Invoices whose payment was declined this run.
    pub payments_failed: usize,
    /// Instances stopped because their account's invoice stayed unpaid past the grace.
    pub unpaid_stopped: usize,
    /// Instances started again because their account paid.
    pub unpaid_started: usize,
    /// Accounts whose charging failed this run: not invoiced until a run charges them
    /// cleanly (Stripe may hold an item they have not recorded).
    pub failed_accounts: std::collections::BTreeSet<String>,
}

/// The job `bill-usage`: every unfinished instance's final periods charged (one invoice
/// item each, Idempotency-Key `usage-<vm>-<day>`), a deleted instance's stuck-delete time
/// credited back (`refund-<vm>`), then its billing closed. A Stripe failure leaves that
/// instance for the next run; the keys make the retry charge nothing twice.
pub async fn bill_usage_once(state: &AppState) -> AppResult<BillReport> {
    let mut report = BillReport::default();
    let Some(stripe) = state.stripe.as_deref() else {
        return Ok(report);
    };
    let now = state.clock.now();
    let mut first_error = None;
    let mut after = None;
    loop {
        let page = state.store.vms_to_bill(after.clone(), BILL_BATCH).await?;
        let Some(last) = page.last() else { break };
        after = Some((last.created_at, last.id.clone()));
        for vm in page {
            bill_one(state, stripe, &vm, now, &mut report, &mut first_error).await?;
        }
        // Paged until an empty page: one read more than stopping at a short page, every
        // 15 minutes, for one rule fewer.
    }
    report.no_customer = usize::try_from(state.store.vms_without_customer().await?).unwrap_or(0);
    // Invoicing runs after charging in the same run, never beside it: an invoice takes every
    // item pending at Stripe, so an item made while an invoice is being made would land on
    // it unrecorded. An account whose charging failed this run may have an item at Stripe
    // it has not recorded, so it waits for the next run.
    invoice_due(state, stripe, now, &mut report, &mut first_error).await?;
    let (settled, host_error) =
        super::unpaid::settle_once(state, stripe.config.payment_grace_hours).await?;
    report.unpaid_stopped = settled.stopped;
    report.unpaid_started = settled.started;
    report.failed += settled.failed;
    if let Some(e) = host_error {
        first_error.get_or_insert(e);
    }
    match first_error {
        Some(e) => Err(AppError::Internal(anyhow!(
            "charged {}, refunded {}, closed {}, invoiced {}, {} failed (first: {e})",
            report.charged,
            report.refunded,
            report.closed,
            report.invoiced,
            report.failed
        ))),
        None => Ok(report),
    }
}

/// When to invoice, and the next Stripe call for an invoice: pure, time passed in.
pub mod invoicing {
    use byo_db::invoices::{InvoiceRow, REASON_MONTH_END, REASON_THRESHOLD};
    use byo_wire::states::InvoiceStatus;
    use chrono::{DateTime, Datelike, TimeZone, Utc};

    /// Midnight UTC on the first of `t`'s month.
    pub fn month_start(t: DateTime<Utc>) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(t.year(), t.month(), 1, 0, 0, 0)
            .single()
            .expect("the first of a month at midnight UTC exists")
    }

    /// Whether an account with `balance` cents uninvoiced, the oldest from `earliest`, is
    /// invoiced now, and why: once a month has ended with usage in it, or once the balance
    /// reaches the threshold. Nothing positive, nothing to invoice (a credit waits for the
    /// next charges).
    pub fn due(
        balance: i64,
        earliest: DateTime<Utc>,
        now: DateTime<Utc>,
        threshold: u32,
    ) -> Option<&'static str> {
        if balance <= 0 {
            None
        } else if earliest < month_start(now) {
            Some(REASON_MONTH_END)
        } else if balance >= i64::from(threshold) {
            Some(REASON_THRESHOLD)
        } else {
            None
        }
    }

    /// The next call an invoice needs.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum Next<'a> {
        /// Not at Stripe yet: `POST /v1/invoices` (key `invoice-<id>`).
        Create,
        /// A draft: `POST /v1/invoices/{id}/finalize` (key `finalize-<id>`).
        Finalize(&'a str),
        /// Open and never asked to pay: `POST /v1/invoices/{id}/pay` (key `pay-<id>`).
        Pay(&'a str),
        /// Paid, void, uncollectible, or its payment already attempted: the webhooks
        /// carry the rest.
        Done,
    }

    pub fn next(row: &InvoiceRow) -> Next<'_> {
        match (row.status, row.stripe_invoice_id.as_deref()) {
            (InvoiceStatus::Pending, _) | (_, None) => Next::Create,
            (InvoiceStatus::Draft, Some(id)) => Next::Finalize(id),
            (InvoiceStatus::Open, Some(id)) if row.pay_attempted_at.is_none() => Next::Pay(id),
            _ => Next::Done,
        }
    }
}

/// Finish every unfinished invoice, then make and finish the ones now due.
async fn invoice_due(
    state: &AppState,
    stripe: &StripeBilling,
    now: DateTime<Utc>,
    report: &mut BillReport,
    first_error: &mut Option<String>,
) -> AppResult<()> {
    for row in state.store.unfinished_invoices().await? {
        advance_invoice(state, stripe, row, now, report, first_error).await?;
    }
    let threshold = stripe.config.invoice_threshold_cents;
    // An account whose last invoice was declined is not invoiced again until it pays: the
    // next would only be declined too. Its usage waits, and is invoiced with the next.
    let held: std::collections::BTreeSet<String> = state
        .store
        .declined_unpaid_invoices()
        .await?
        .into_iter()
        .map(|i| i.user_sub)
        .collect();
    for b in state.store.uninvoiced_balances().await? {
        if report.failed_accounts.contains(&b.user_sub) || held.contains(&b.user_sub) {
            continue;
        }
        let Some(reason) = invoicing::due(b.amount_cents, b.earliest, now, threshold) else {
            continue;
        };
        let Some(row) = state
            .store
            .open_invoice(
                &b.user_sub,
                &b.customer_id,
                reason,
                &stripe.config.currency,
                now,
            )
            .await?
        else {
            continue;
        };
        tracing::info!(invoice = %row.id, user = %row.user_sub, amount_cents = row.amount_cents, reason, "bill-usage: invoicing");
        report.invoiced += 1;
        advance_invoice(state, stripe, row, now, report, first_error).await?;
    }
    Ok(())
}

/// Take one invoice as far as it goes now: created, finalized, paid. Each answer is recorded
/// before the next call, and each call's key is derived from the invoice's id, so a run that
/// dies between two calls is finished by the next without a second invoice. A decline is
/// recorded (the invoice stays open); an outage leaves it for the next run.
async fn advance_invoice(
    state: &AppState,
    stripe: &StripeBilling,
    mut row: byo_db::invoices::InvoiceRow,
    now: DateTime<Utc>,
    report: &mut BillReport,
    first_error: &mut Option<String>,
) -> AppResult<()> {
    use byo_db::invoices::InvoiceUpdate;
    use invoicing::Next;
    // Create, finalize, pay: three calls at most; a fourth turn would mean an answer that
    // moved nothing (an unknown status), which the next run sees again.
    for _ in 0..3 {
        let (answer, pay) = match invoicing::next(&row) {
            Next::Done => return Ok(()),
            Next::Create => (
                stripe
                    .client
                    .create_invoice(&row.customer_id, &row.currency, &row.id)
                    .await,
                false,
            ),
            Next::Finalize(sid) => (stripe.client.finalize_invoice(sid, &row.id).await, false),
            Next::Pay(sid) => (
                stripe
                    .client
                    .pay_invoice(sid, &format!("pay-{}", row.id))
                    .await,
                true,
            ),
        };
        let declined = answer.as_ref().err().map(|e| e.to_string());
        let update = match &answer {
            Ok(inv) => {
                // Stripe's total is kept beside ours (`stripe_total_cents`): a difference
                // means items at Stripe this installation did not make.
                let status = inv.status.as_deref().and_then(|s| s.parse().ok());
                InvoiceUpdate {
                    status,
                    stripe_invoice_id: Some(&inv.id),
                    hosted_invoice_url: inv.hosted_invoice_url.as_deref(),
                    stripe_total_cents: Some(inv.total),
                    pay_attempted: pay,
                    ..Default::default()
                }
            }
            Err(e) if pay && !e.is_outage() => InvoiceUpdate {
                pay_attempted: true,
                payment_failed: true,
                last_error: declined.as_deref(),
                ..Default::default()
            },
            Err(e) => {
                tracing::warn!(invoice = %row.id, error = %e, "bill-usage: an invoice call failed; left for the next run");
                first_error.get_or_insert_with(|| e.to_string());
                report.failed += 1;
                return Ok(());
            }
        };
        let before = row.status;
        state.store.update_invoice(&row.id, &update, now).await?;
        row = state
            .store
            .invoice(&row.id)
            .await?
            .ok_or_else(|| AppError::Internal(anyhow!("invoice {} vanished", row.id)))?;
        if row.status == byo_wire::states::InvoiceStatus::Paid && before != row.status {
            report.invoices_paid += 1;
            state
                .store
                .audit(
                    None,
                    "billing.invoice_paid",
                    Some(&row.id),
                    json!({"user_sub": row.user_sub, "stripe_invoice_id": row.stripe_invoice_id,
                           "amount_cents": row.amount_cents}),
                    now,
                )
                .await?;
        }
        if let Err(e) = &answer {
            tracing::warn!(invoice = %row.id, error = %e, "bill-usage: the invoice's payment was declined; it stays open");
            state
                .store
                .audit(
                    None,
                    "billing.payment_failed",
                    Some(&row.id),
                    json!({"user_sub": row.user_sub, "stripe_invoice_id": row.stripe_invoice_id,
                           "amount_cents": row.amount_cents, "error": e.to_string()}),
                    now,
                )
                .await?;
            report.payments_failed += 1;
            return Ok(());
        }
    }
    Ok(())
}

/// One instance's final periods, then (deleted) its refund and its close. A Stripe failure
/// is counted and leaves the instance for the next run; a database failure ends the run.
async fn bill_one(
    state: &AppState,
    stripe: &StripeBilling,
    vm: &byo_db::billing::VmToBillRow,
    now: DateTime<Utc>,
    report: &mut BillReport,
    first_error: &mut Option<String>,
) -> AppResult<()> {
    let stuck_after = TimeDelta::minutes(super::notify_stuck_deletes::STUCK_AFTER_MINUTES);
    let price = stripe.config.price_cents_per_hour;
    let currency = stripe.config.currency.as_str();
    let customer = vm.customer_id.as_str();
    let times = usage::VmTimes {
        created_at: vm.created_at,
        creation_failed_at: vm.creation_failed_at,
        delete_requested_at: vm.delete_requested_at,
        deleted_at: vm.deleted_at,
    };
    let charged = state.store.usage_charges(&vm.id).await?;
    let starts: Vec<_> = charged.iter().map(|c| c.period_start).collect();
    let mut total: i64 = charged.iter().map(|c| i64::from(c.amount_cents)).sum();
    let mut ok = true;
    for p in usage::due_periods(&times, &starts, now) {
        let key = format!("usage-{}-{}", vm.id, p.start.format("%Y-%m-%d"));
        let amount = usage::amount_cents(p.seconds, price);
        let description = format!("instance {} on {}", vm.id, p.start.format("%Y-%m-%d"));
        let item = if amount > 0 {
            match stripe
                .client
                .create_invoice_item(
                    &NewInvoiceItem {
                        customer,
                        amount,
                        currency,
                        description: &description,
                        period: (p.start.timestamp(), p.end.timestamp()),
                        metadata: &[("vm_id", vm.id.as_str()), ("kind", "usage")],
                    },
                    &key,
                )
                .await
            {
                Ok(item) => Some(item.id),
                Err(e) => {
                    tracing::warn!(vm = %vm.id, error = %e, "bill-usage: charging a period failed; left for the next run");
                    first_error.get_or_insert_with(|| e.to_string());
                    report.failed_accounts.insert(vm.user_sub.clone());
                    ok = false;
                    break;
                }
            }
        } else {
            None
        };
        state
            .store
            .record_usage_charge(
                &NewUsageCharge {
                    vm_id: &vm.id,
                    user_sub: &vm.user_sub,
                    period_start: p.start,
                    period_end: p.end,
                    seconds: i32::try_from(p.seconds).unwrap_or(i32::MAX),
                    amount_cents: i32::try_from(amount).unwrap_or(i32::MAX),
                    currency,
                    idempotency_key: &key,
                    stripe_invoice_item_id: item.as_deref(),
                },
                now,
            )
            .await?;
        total += amount;
        report.charged += 1;
    }
    if !ok {
        report.failed += 1;
        return Ok(());
    }
    if vm.deleted_at.is_none() {
        return Ok(());
    }
    if let Some((from, to, seconds)) = usage::stuck_refund(&times, stuck_after)
        && state.store.refund_for(&vm.id).await?.is_none()
    {
        let amount = usage::amount_cents(seconds, price).min(total);
        let key = format!("refund-{}", vm.id);
        let description = format!(
            "refund: instance {} was deleted at {} and its host confirmed only at {}",
            vm.id,
            from.format("%Y-%m-%d %H:%M UTC"),
            to.format("%Y-%m-%d %H:%M UTC")
        );
        let credit = if amount > 0 {
            match stripe
                .client
                .create_invoice_item(
                    &NewInvoiceItem {
                        customer,
                        amount: -amount,
                        currency,
                        description: &description,
                        period: (from.timestamp(), to.timestamp()),
                        metadata: &[("vm_id", vm.id.as_str()), ("kind", "stuck_delete_refund")],
                    },
                    &key,
                )
                .await
            {
                Ok(item) => Some(item.id),
                Err(e) => {
                    tracing::warn!(vm = %vm.id, error = %e, "bill-usage: the stuck-delete refund failed; left for the next run");
                    first_error.get_or_insert_with(|| e.to_string());
                    report.failed += 1;
                    report.failed_accounts.insert(vm.user_sub.clone());
                    return Ok(());
                }
            }
        } else {
            None
        };
        state
            .store
            .record_refund(
                &NewRefund {
                    vm_id: &vm.id,
                    user_sub: &vm.user_sub,
                    from_at: from,
                    to_at: to,
                    seconds: i32::try_from(seconds).unwrap_or(i32::MAX),
                    amount_cents: i32::try_from(amount).unwrap_or(i32::MAX),
                    currency,
                    idempotency_key: &key,
                    stripe_credit_id: credit.as_deref(),
                },
                now,
            )
            .await?;
        report.refunded += 1;
    }
    state.store.close_billing(&vm.id, now).await?;
    report.closed += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use proptest::prelude::*;

    use super::usage::{VmTimes, amount_cents, billable, day_of, due_periods, stuck_refund};
    use super::*;

    const SECRET: &[u8] = b"whsec_unit";

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_793_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn a_signature_is_stripes_hmac_over_the_timestamp_and_the_payload() {
        // HMAC-SHA256 of "1.{}" under "key", computed independently (Python's hmac).
        assert_eq!(
            sign(b"key", 1, b"{}"),
            "1ba6b8171186efc613e8bcc0cbdab2748f24984d7c5a84faa2637afa0e40d224"
        );
        let now = at(0);
        let body = br#"{"id":"evt_1"}"#;
        let good = sign(SECRET, now.timestamp(), body);
        let header = format!("t={},v1={good}", now.timestamp());
        assert_eq!(verify_signature(&header, body, SECRET, now, 300), Ok(()));
        // Any one of several v1 (Stripe sends two while a secret is being rolled).
        let two = format!(
            "t={},v1={},v1={good},v0=00",
            now.timestamp(),
            "ab".repeat(32)
        );
        assert_eq!(verify_signature(&two, body, SECRET, now, 300), Ok(()));
        // Matching more than once is still a match (the matches are or-ed, not counted).
        let twice = format!("t={},v1={good},v1={good}", now.timestamp());
        assert_eq!(verify_signature(&twice, body, SECRET, now, 300), Ok(()));
        for bad in [
            format!("t={},v1={}", now.timestamp(), "ab".repeat(32)),
            format!("t={}", now.timestamp()),
            format!("v1={good}"),
            format!("t=x,v1={good}"),
            format!("t={},v1={}", now.timestamp() + 1, good),
            format!("t={},v0={good}", now.timestamp()),
            String::new(),
        ] {
            assert_eq!(
                verify_signature(&bad, body, SECRET, now, 300),
                Err(SignatureRefusal::BadSignature),
                "{bad}"
            );
        }
        // The payload must be byte for byte the one signed.
        assert_eq!(
            verify_signature(&header, br#"{"id": "evt_1"}"#, SECRET, now, 300),
            Err(SignatureRefusal::BadSignature)
        );
        // Stale either way past the tolerance; at it, fine.
        assert_eq!(
            verify_signature(&header, body, SECRET, now + TimeDelta::seconds(301), 300),
            Err(SignatureRefusal::Stale)
        );
        assert_eq!(
            verify_signature(&header, body, SECRET, now - TimeDelta::seconds(301), 300),
            Err(SignatureRefusal::Stale)
        );
        assert_eq!(
            verify_signature(&header, body, SECRET, now + TimeDelta::seconds(300), 300),
            Ok(())
        );
    }

    #[test]
    fn the_signature_matches_a_known_vector() {
        // RFC 4231 test case 2: the HMAC-SHA256 `sign` is built on.
        let mut mac = HmacSha256::new_from_slice(b"Jefe").unwrap();
        mac.update(b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    fn vm(created: i64, failed: Option<i64>, asked: Option<i64>, gone: Option<i64>) -> VmTimes {
        VmTimes {
            created_at: at(created),
            creation_failed_at: failed.map(at),
            delete_requested_at: asked.map(at),
            deleted_at: gone.map(at),
        }
    }

    #[test]
    fn a_failed_create_bills_nothing() {
        let v = vm(0, Some(60), None, None);
        assert_eq!(billable(&v, at(10 * 86_400)), None);
        assert!(due_periods(&v, &[], at(10 * 86_400)).is_empty());
        assert_eq!(
            stuck_refund(
                &vm(0, Some(60), Some(100), Some(5000)),
                TimeDelta::minutes(10)
            ),
            None
        );
    }

    #[test]
    fn a_running_instances_current_day_waits_for_midnight() {
        let created = day_of(at(0)) + TimeDelta::hours(20);
        let v = VmTimes {
            created_at: created,
            creation_failed_at: None,
            delete_requested_at: None,
            deleted_at: None,
        };
        let p = due_periods(&v, &[], created + TimeDelta::hours(7));
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].seconds, 4 * 3600);
        assert!(due_periods(&v, &[p[0].start], created + TimeDelta::hours(7)).is_empty());
        assert!(
            due_periods(&v, &[], created + TimeDelta::hours(3)).is_empty(),
            "the first day has not ended"
        );
    }

    #[test]
    fn a_span_that_ends_where_it_starts_or_at_midnight_has_no_empty_period() {
        // Deleted the moment it was made, or asked about at that moment: nothing billable.
        assert_eq!(billable(&vm(0, None, None, Some(0)), at(86_400)), None);
        assert_eq!(billable(&vm(0, None, None, None), at(0)), None);
        // Deleted exactly at midnight: its one day, and no empty period for the next.
        let created = day_of(at(0)) + TimeDelta::hours(20);
        let v = VmTimes {
            created_at: created,
            creation_failed_at: None,
            delete_requested_at: Some(created + TimeDelta::hours(4)),
            deleted_at: Some(created + TimeDelta::hours(4)),
        };
        let p = due_periods(&v, &[], created + TimeDelta::days(3));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!((p[0].start, p[0].seconds), (day_of(created), 4 * 3600));
    }

    #[test]
    fn a_stuck_delete_is_refunded_only_past_the_threshold_and_only_while_it_existed() {
        let ten = TimeDelta::minutes(10);
        // Exactly the threshold is not stuck; a second more is.
        assert_eq!(stuck_refund(&vm(0, None, Some(100), Some(700)), ten), None);
        assert_eq!(
            stuck_refund(&vm(0, None, Some(100), Some(701)), ten),
            Some((at(100), at(701), 601))
        );
        // Asked before it existed (a clock step): counted from its creation, and nothing
        // when it was gone the moment it was made.
        assert_eq!(
            stuck_refund(&vm(1000, None, Some(0), Some(1700)), ten),
            Some((at(1000), at(1700), 700))
        );
        assert_eq!(
            stuck_refund(&vm(1000, None, Some(0), Some(1000)), ten),
            None
        );
    }

    #[test]
    fn an_account_is_invoiced_when_its_month_ends_or_its_usage_reaches_the_threshold() {
        use super::invoicing::{due, month_start};
        let dec = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
        assert_eq!(
            month_start(Utc.with_ymd_and_hms(2026, 12, 31, 23, 59, 59).unwrap()),
            dec
        );
        let now = dec + TimeDelta::minutes(15);
        let nov30 = dec - TimeDelta::days(1);
        // November's usage, however small, once December has begun.
        assert_eq!(due(1, nov30, now, 10_000), Some("month_end"));
        // December's: only from the threshold on.
        assert_eq!(due(9_999, dec, now, 10_000), None);
        assert_eq!(due(10_000, dec, now, 10_000), Some("threshold"));
        // Nothing positive: nothing, whatever the month.
        assert_eq!(due(0, nov30, now, 10_000), None);
        assert_eq!(due(-50, nov30, now, 1), None);
    }

    #[test]
    fn an_invoice_is_created_then_finalized_then_paid_once() {
        use super::invoicing::{Next, next};
        use byo_wire::states::InvoiceStatus::*;
        let t = at(0);
        let mut row = byo_db::invoices::InvoiceRow {
            id: "i".into(),
            user_sub: "u".into(),
            customer_id: "cus".into(),
            reason: "threshold".into(),
            amount_cents: 1,
            currency: "usd".into(),
            status: Pending,
            stripe_invoice_id: None,
            hosted_invoice_url: None,
            stripe_total_cents: None,
            created_at: t,
            finalized_at: None,
            pay_attempted_at: None,
            payment_failed_at: None,
            paid_at: None,
            voided_at: None,
            last_error: None,
            updated_at: t,
        };
        assert_eq!(next(&row), Next::Create);
        row.stripe_invoice_id = Some("in_1".into());
        assert_eq!(
            next(&row),
            Next::Create,
            "pending: the create's answer is not recorded"
        );
        row.status = Draft;
        assert_eq!(next(&row), Next::Finalize("in_1"));
        row.status = Open;
        assert_eq!(next(&row), Next::Pay("in_1"));
        row.pay_attempted_at = Some(t);
        assert_eq!(
            next(&row),
            Next::Done,
            "asked once: the webhooks carry the rest"
        );
        for s in [Paid, Void, Uncollectible] {
            row.status = s;
            row.pay_attempted_at = None;
            assert_eq!(next(&row), Next::Done, "{s}");
        }
    }

    #[test]
    fn this_months_usage_so_far_is_priced_day_by_day_from_the_first() {
        use super::usage::so_far;
        let dec = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
        let now = dec + TimeDelta::hours(36);
        // `vm` takes seconds after `at`'s origin.
        let d = (dec - at(0)).num_seconds();
        // Since November: only December counts, a full day and half of the next.
        let v = vm(d - 86_400, None, None, None);
        assert_eq!(so_far(&v, dec, now, 120), (36 * 3600, 2880 + 1440));
        // Deleted before the month: nothing; a failed create: nothing.
        let gone = vm(d - 7200, None, None, Some(d - 3600));
        assert_eq!(so_far(&gone, dec, now, 120), (0, 0));
        let failed = vm(d, Some(d + 60), None, None);
        assert_eq!(so_far(&failed, dec, now, 120), (0, 0));
        // 20 minutes on each side of midnight: each day rounded as it will be charged.
        let brief = vm(d + 86_400 - 1200, None, None, Some(d + 86_400 + 1200));
        assert_eq!(so_far(&brief, dec, now, 120), (2400, 40 + 40));
        assert_eq!(
            so_far(&brief, dec, now, 1),
            (2400, 0),
            "a cent an hour: 20 minutes are worth nothing, twice"
        );
    }

    #[test]
    fn money_reads_as_a_person_writes_it() {
        assert_eq!(money(11_760, "usd"), "117.60 USD");
        assert_eq!(money(5, "eur"), "0.05 EUR");
        assert_eq!(money(-250, "usd"), "-2.50 USD");
        assert_eq!(money(0, "usd"), "0.00 USD");
    }

    #[test]
    fn cents_round_half_up() {
        assert_eq!(amount_cents(3600, 120), 120);
        assert_eq!(amount_cents(15, 120), 1); // 0.5 cent
        assert_eq!(amount_cents(14, 120), 0);
        assert_eq!(amount_cents(-5, 120), 0);
    }

    #[test]
    fn a_booking_costs_every_started_hour() {
        assert_eq!(booking_amount(at(0), at(3600), 100), 100);
        assert_eq!(booking_amount(at(0), at(3601), 100), 200);
        assert_eq!(booking_amount(at(10), at(0), 100), 0);
    }

    proptest! {
        /// A deleted instance's periods cover exactly [created_at, deleted_at), one per day,
        /// none overlapping; the refund is never outside it and only past the threshold.
        #[test]
        fn periods_cover_exactly_the_billable_time(
            created in 0i64..400_000,
            lived in 0i64..900_000,
            asked_before in 0i64..90_000,
            after in 0i64..900_000,
        ) {
            let gone = created + lived;
            let asked = (gone - asked_before).max(created);
            let v = vm(created, None, Some(asked), Some(gone));
            let now = at(gone + after);
            let periods = due_periods(&v, &[], now);
            let total: i64 = periods.iter().map(|p| p.seconds).sum();
            prop_assert_eq!(total, lived);
            for w in periods.windows(2) {
                prop_assert!(w[0].end <= w[1].start);
            }
            for p in &periods {
                prop_assert_eq!(p.end - p.start, TimeDelta::days(1));
                prop_assert!(p.seconds > 0 && p.seconds <= 86_400);
            }
            // Charged periods are not due again.
            let starts: Vec<_> = periods.iter().map(|p| p.start).collect();
            prop_assert!(due_periods(&v, &starts, now).is_empty());
            match stuck_refund(&v, TimeDelta::minutes(10)) {
                Some((from, to, secs)) => {
                    prop_assert!(gone - asked > 600);
                    prop_assert_eq!((from, to), (at(asked), at(gone)));
                    prop_assert!(secs <= lived);
                }
                None => prop_assert!(gone - asked <= 600),
            }
        }

        /// A running instance is billed only for days that have ended, never past now.
        #[test]
        fn a_running_instance_is_billed_for_ended_days_only(
            created in 0i64..400_000,
            elapsed in 0i64..900_000,
        ) {
            let v = vm(created, None, None, None);
            let now = at(created + elapsed);
            let periods = due_periods(&v, &[], now);
            let total: i64 = periods.iter().map(|p| p.seconds).sum();
            prop_assert!(total <= elapsed);
            prop_assert!(elapsed - total < 86_400, "at most today is unbilled");
            for p in &periods {
                prop_assert!(p.end <= now);
            }
        }
    }
}
