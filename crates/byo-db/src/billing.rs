//! Billing on Stripe (issue #13, 4; migration 0013): each account's Stripe customer, the
//! webhook events seen (the idempotency of their processing), the usage charged per
//! instance per period, the refunds of stuck deletes, and the instances whose billing is
//! finished. Whether an account may be charged is never stored: it is asked of Stripe live.

use byo_wire::states::VmStatus;
use chrono::{DateTime, Utc};

use crate::{GuardedWrite, Result, Store, new_id};

/// What the events table said about an event id when it was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventSeen {
    /// First time: process it.
    New,
    /// Seen before, but its processing never finished: process it again.
    Unfinished,
    /// Processed already: a replay, which changes nothing.
    Processed,
}

/// A booking as its checkout and its payment webhook read it.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct PrebookingBillRow {
    pub id: String,
    pub user_sub: String,
    pub gpu_type: String,
    pub start_date: DateTime<Utc>,
    pub end_date: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub closed_at: Option<DateTime<Utc>>,
}

/// An instance whose billing is not finished: its four timestamps and its status.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct VmToBillRow {
    pub id: String,
    pub user_sub: String,
    #[sqlx(try_from = "String")]
    pub status: VmStatus,
    pub created_at: DateTime<Utc>,
    pub creation_failed_at: Option<DateTime<Utc>>,
    pub delete_requested_at: Option<DateTime<Utc>>,
    pub deleted_at: Option<DateTime<Utc>>,
    /// The account's Stripe customer.
    pub customer_id: String,
}

/// One period's charge, as recorded once Stripe took it.
#[derive(Clone, Debug)]
pub struct NewUsageCharge<'a> {
    pub vm_id: &'a str,
    pub user_sub: &'a str,
    pub period_start: DateTime<Utc>,
    pub period_end: DateTime<Utc>,
    pub seconds: i32,
    pub amount_cents: i32,
    pub currency: &'a str,
    pub idempotency_key: &'a str,
    pub stripe_invoice_item_id: Option<&'a str>,
}

#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize)]
pub struct UsageChargeRow {
    pub vm_id: String,
    pub user_sub: String,
    pub period_start: DateTime<Utc>,
    pub period_end: DateTime<Utc>,
    pub seconds: i32,
    pub amount_cents: i32,
    pub currency: String,
    pub idempotency_key: String,
    pub stripe_invoice_item_id: Option<String>,
    /// The invoice that took it; none while it is pending at Stripe.
    pub invoice_id: Option<String>,
}

/// An instance's four timestamps, for the usage so far this month (the Billing page).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct UsageVmRow {
    pub id: String,
    pub name: String,
    pub created_at: DateTime<Utc>,
    pub creation_failed_at: Option<DateTime<Utc>>,
    pub delete_requested_at: Option<DateTime<Utc>>,
    pub deleted_at: Option<DateTime<Utc>>,
}

/// A booking paid through Checkout: what a refund refunds.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct BookingPaymentRow {
    pub prebooking_id: String,
    pub payment_intent: String,
    pub amount_cents: i32,
    pub currency: String,
    pub paid_at: DateTime<Utc>,
}

/// A booking's refund, once Stripe made it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct BookingRefundRow {
    pub prebooking_id: String,
    pub stripe_refund_id: String,
    pub amount_cents: i32,
    pub currency: String,
    pub reason: String,
    pub refunded_by: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// A stuck delete's refund, as recorded once Stripe took it.
#[derive(Clone, Debug)]
pub struct NewRefund<'a> {
    pub vm_id: &'a str,
    pub user_sub: &'a str,
    pub from_at: DateTime<Utc>,
    pub to_at: DateTime<Utc>,
    pub seconds: i32,
    pub amount_cents: i32,
    pub currency: &'a str,
    pub idempotency_key: &'a str,
    pub stripe_credit_id: Option<&'a str>,
}

#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize)]
pub struct RefundRow {
    pub vm_id: String,
    pub user_sub: String,
    pub from_at: DateTime<Utc>,
    pub to_at: DateTime<Utc>,
    pub seconds: i32,
    pub amount_cents: i32,
    pub currency: String,
    pub idempotency_key: String,
    pub stripe_credit_id: Option<String>,
    /// The invoice that took it; none while it is pending at Stripe.
    pub invoice_id: Option<String>,
}

impl Store {
    /// The account's Stripe customer id, if it has one.
    pub async fn stripe_customer(&self, user_sub: &str) -> Result<Option<String>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar::<_, String>(
                "select customer_id from stripe_customers where user_sub = $1",
            )
            .bind(user_sub)
            .fetch_optional(p)
            .await
        })?)
    }

    /// Keep `customer_id` as the account's customer unless it already has one; answers the
    /// one kept (the first writer's).
    pub async fn keep_stripe_customer(
        &self,
        user_sub: &str,
        customer_id: &str,
        now: DateTime<Utc>,
    ) -> Result<String> {
        on_pool!(self, |p| {
            sqlx::query(
                "insert into stripe_customers (user_sub, customer_id, created_at) \
                 values ($1, $2, $3) on conflict (user_sub) do nothing",
            )
            .bind(user_sub)
            .bind(customer_id)
            .bind(now)
            .execute(p)
            .await
            .map(|_| ())
        })?;
        Ok(self
            .stripe_customer(user_sub)
            .await?
            .unwrap_or_else(|| customer_id.to_owned()))
    }

    /// Record a verified webhook event by its id, or learn that it was seen before.
    pub async fn record_stripe_event(
        &self,
        event_id: &str,
        kind: &str,
        now: DateTime<Utc>,
    ) -> Result<EventSeen> {
        let inserted = on_pool!(self, |p| {
            sqlx::query(
                "insert into stripe_events (event_id, type, received_at) values ($1, $2, $3) \
                 on conflict (event_id) do nothing",
            )
            .bind(event_id)
            .bind(kind)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        if inserted == 1 {
            return Ok(EventSeen::New);
        }
        let processed: Option<DateTime<Utc>> = on_pool!(self, |p| {
            sqlx::query_scalar("select processed_at from stripe_events where event_id = $1")
                .bind(event_id)
                .fetch_one(p)
                .await
        })?;
        Ok(if processed.is_some() {
            EventSeen::Processed
        } else {
            EventSeen::Unfinished
        })
    }

    /// The event's processing finished.
    pub async fn mark_stripe_event_processed(
        &self,
        event_id: &str,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
                "update stripe_events set processed_at = $2 \
                 where event_id = $1 and processed_at is null",
            )
            .bind(event_id)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// How many webhook events have been recorded (tests and the billing docs' checks).
    pub async fn stripe_event_count(&self) -> Result<i64> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar::<_, i64>("select count(*) from stripe_events")
                .fetch_one(p)
                .await
        })?)
    }

    /// A booking, for its checkout and its payment webhook.
    pub async fn prebooking_for_billing(&self, id: &str) -> Result<Option<PrebookingBillRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PrebookingBillRow>(
                "select id, user_sub, gpu_type, start_date, end_date, paid_at, closed_at \
                 from prebookings where id = $1",
            )
            .bind(id)
            .fetch_optional(p)
            .await
        })?)
    }

    /// Instances whose billing is not finished and that can be billed: not a failed
    /// create, not still being created, no `billing_closed` row, and an account with a
    /// Stripe customer. In (created_at, id) order after `after`, at most `limit` (a
    /// keyset page, so a run reaches every instance however many there are).
    pub async fn vms_to_bill(
        &self,
        after: Option<(DateTime<Utc>, String)>,
        limit: i64,
    ) -> Result<Vec<VmToBillRow>> {
        let (at, id) = after.unwrap_or((DateTime::<Utc>::UNIX_EPOCH, String::new()));
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, VmToBillRow>(
                "select v.id, v.user_sub, v.status, v.created_at, v.creation_failed_at, \
                        v.delete_requested_at, v.deleted_at, c.customer_id \
                 from vms v \
                 join stripe_customers c on c.user_sub = v.user_sub \
                 where v.creation_failed_at is null \
                   and (v.status <> 'creating' or v.deleted_at is not null) \
                   and not exists (select 1 from billing_closed b where b.vm_id = v.id) \
                   and (v.created_at > $1 or (v.created_at = $1 and v.id > $2)) \
                 order by v.created_at, v.id limit $3",
            )
            .bind(at)
            .bind(id)
            .bind(limit)
            .fetch_all(p)
            .await
        })?)
    }

    /// Live or unfinished instances of accounts with no Stripe customer: usage bill-usage
    /// cannot charge yet (it will once the account has one).
    pub async fn vms_without_customer(&self) -> Result<i64> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar::<_, i64>(
                "select count(*) from vms v \
                 where v.creation_failed_at is null \
                   and not exists (select 1 from stripe_customers c where c.user_sub = v.user_sub) \
                   and not exists (select 1 from billing_closed b where b.vm_id = v.id)",
            )
            .fetch_one(p)
            .await
        })?)
    }

    /// The periods already charged for an instance, oldest first.
    pub async fn usage_charges(&self, vm_id: &str) -> Result<Vec<UsageChargeRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, UsageChargeRow>(
                "select vm_id, user_sub, period_start, period_end, seconds, amount_cents, \
                        currency, idempotency_key, stripe_invoice_item_id, invoice_id \
                 from usage_charges where vm_id = $1 order by period_start",
            )
            .bind(vm_id)
            .fetch_all(p)
            .await
        })?)
    }

    /// Record a period's charge. A second record of the same period is refused by
    /// `usage_charges_one_per_vm_period`.
    pub async fn record_usage_charge(
        &self,
        c: &NewUsageCharge<'_>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        on_pool!(self, |p| {
            sqlx::query(
                "insert into usage_charges (id, vm_id, user_sub, period_start, period_end, \
                   seconds, amount_cents, currency, idempotency_key, stripe_invoice_item_id, \
                   created_at) \
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(new_id())
            .bind(c.vm_id)
            .bind(c.user_sub)
            .bind(c.period_start)
            .bind(c.period_end)
            .bind(c.seconds)
            .bind(c.amount_cents)
            .bind(c.currency)
            .bind(c.idempotency_key)
            .bind(c.stripe_invoice_item_id)
            .bind(now)
            .execute(p)
            .await
            .map(|_| ())
        })?;
        Ok(())
    }

    /// An instance's stuck-delete refund, if one was made.
    pub async fn refund_for(&self, vm_id: &str) -> Result<Option<RefundRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, RefundRow>(
                "select vm_id, user_sub, from_at, to_at, seconds, amount_cents, currency, \
                        idempotency_key, stripe_credit_id, invoice_id \
                 from refunds where vm_id = $1",
            )
            .bind(vm_id)
            .fetch_optional(p)
            .await
        })?)
    }

    /// Record a stuck delete's refund; one per instance (`refunds_one_per_vm`).
    pub async fn record_refund(&self, r: &NewRefund<'_>, now: DateTime<Utc>) -> Result<()> {
        on_pool!(self, |p| {
            sqlx::query(
                "insert into refunds (id, vm_id, user_sub, from_at, to_at, seconds, \
                   amount_cents, currency, idempotency_key, stripe_credit_id, created_at) \
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(new_id())
            .bind(r.vm_id)
            .bind(r.user_sub)
            .bind(r.from_at)
            .bind(r.to_at)
            .bind(r.seconds)
            .bind(r.amount_cents)
            .bind(r.currency)
            .bind(r.idempotency_key)
            .bind(r.stripe_credit_id)
            .bind(now)
            .execute(p)
            .await
            .map(|_| ())
        })?;
        Ok(())
    }

    /// The instance's billing is finished: bill-usage reads it no more.
    pub async fn close_billing(&self, vm_id: &str, now: DateTime<Utc>) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
                "insert into billing_closed (vm_id, closed_at) values ($1, $2) \
                 on conflict (vm_id) do nothing",
            )
            .bind(vm_id)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// Whether the instance's billing is finished.
    pub async fn billing_closed(&self, vm_id: &str) -> Result<bool> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar::<_, i64>("select count(*) from billing_closed where vm_id = $1")
                .bind(vm_id)
                .fetch_one(p)
                .await
        })? > 0)
    }

    /// The account's instances billable at some time since `since`: not a failed create,
    /// not deleted before it. Oldest first.
    pub async fn vms_billable_since(
        &self,
        user_sub: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<UsageVmRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, UsageVmRow>(
                "select id, name, created_at, creation_failed_at, delete_requested_at, deleted_at \
                 from vms \
                 where user_sub = $1 and creation_failed_at is null \
                   and (deleted_at is null or deleted_at > $2) \
                 order by created_at, id",
            )
            .bind(user_sub)
            .bind(since)
            .fetch_all(p)
            .await
        })?)
    }

    /// The account's stuck-delete credits, newest first, at most `limit`.
    pub async fn refunds_of(&self, user_sub: &str, limit: i64) -> Result<Vec<RefundRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, RefundRow>(
                "select vm_id, user_sub, from_at, to_at, seconds, amount_cents, currency, \
                        idempotency_key, stripe_credit_id, invoice_id \
                 from refunds where user_sub = $1 order by to_at desc, vm_id limit $2",
            )
            .bind(user_sub)
            .bind(limit)
            .fetch_all(p)
            .await
        })?)
    }

    /// Keep a booking's Checkout payment (the first one, if Stripe sends two).
    pub async fn record_booking_payment(&self, p: &BookingPaymentRow) -> Result<GuardedWrite> {
        let done = on_pool!(self, |pool| {
            sqlx::query(
                "insert into booking_payments (prebooking_id, payment_intent, amount_cents, \
                   currency, paid_at) values ($1, $2, $3, $4, $5) \
                 on conflict (prebooking_id) do nothing",
            )
            .bind(&p.prebooking_id)
            .bind(&p.payment_intent)
            .bind(p.amount_cents)
            .bind(&p.currency)
            .bind(p.paid_at)
            .execute(pool)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    pub async fn booking_payment(&self, prebooking_id: &str) -> Result<Option<BookingPaymentRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, BookingPaymentRow>(
                "select prebooking_id, payment_intent, amount_cents, currency, paid_at \
                 from booking_payments where prebooking_id = $1",
            )
            .bind(prebooking_id)
            .fetch_optional(p)
            .await
        })?)
    }

    /// Record a booking's refund (at most one); `AlreadySet` when one is recorded.
    pub async fn record_booking_refund(&self, r: &BookingRefundRow) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
                "insert into booking_refunds (prebooking_id, stripe_refund_id, amount_cents, \
                   currency, reason, refunded_by, created_at) \
                 values ($1, $2, $3, $4, $5, $6, $7) on conflict (prebooking_id) do nothing",
            )
            .bind(&r.prebooking_id)
            .bind(&r.stripe_refund_id)
            .bind(r.amount_cents)
            .bind(&r.currency)
            .bind(&r.reason)
            .bind(&r.refunded_by)
            .bind(r.created_at)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    pub async fn booking_refund(&self, prebooking_id: &str) -> Result<Option<BookingRefundRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, BookingRefundRow>(
                "select prebooking_id, stripe_refund_id, amount_cents, currency, reason, \
                        refunded_by, created_at \
                 from booking_refunds where prebooking_id = $1",
            )
            .bind(prebooking_id)
            .fetch_optional(p)
            .await
        })?)
    }
}
