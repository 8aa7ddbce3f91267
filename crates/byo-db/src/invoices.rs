//! Invoices (issue #40, 1; migration 0023): an account's pending charges and credits
//! collected into one invoice, made here first (status `pending`, its charges marked in the
//! same transaction) and then created, finalized and paid at Stripe under keys derived from
//! its id. The rules — when an account is invoiced, the order of the Stripe calls — are the
//! server's (`app::billing::invoicing`).

use byo_wire::states::InvoiceStatus;
use chrono::{DateTime, Utc};

use crate::{GuardedWrite, Result, Store, new_id};

/// Why an invoice was made.
pub const REASON_MONTH_END: &str = "month_end";
pub const REASON_THRESHOLD: &str = "threshold";

/// An account's charges and credits not yet on an invoice.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct UninvoicedBalance {
    pub user_sub: String,
    pub customer_id: String,
    /// Charges less credits, in the currency's smallest unit.
    pub amount_cents: i64,
    /// The start of the oldest period among them.
    pub earliest: DateTime<Utc>,
}

macro_rules! columns {
    () => {
        "id, user_sub, customer_id, reason, amount_cents, currency, status, stripe_invoice_id, \
         hosted_invoice_url, stripe_total_cents, created_at, finalized_at, pay_attempted_at, \
         payment_failed_at, paid_at, voided_at, last_error, updated_at"
    };
}

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct InvoiceRow {
    pub id: String,
    pub user_sub: String,
    pub customer_id: String,
    pub reason: String,
    /// What this installation invoiced: the marked charges less the marked credits.
    pub amount_cents: i32,
    pub currency: String,
    #[sqlx(try_from = "String")]
    pub status: InvoiceStatus,
    pub stripe_invoice_id: Option<String>,
    /// Stripe's page where the customer sees and pays the invoice.
    pub hosted_invoice_url: Option<String>,
    /// What Stripe totalled: equal to `amount_cents` unless Stripe held other items.
    pub stripe_total_cents: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub finalized_at: Option<DateTime<Utc>>,
    pub pay_attempted_at: Option<DateTime<Utc>>,
    pub payment_failed_at: Option<DateTime<Utc>>,
    pub paid_at: Option<DateTime<Utc>>,
    pub voided_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub updated_at: DateTime<Utc>,
}

/// An instance as the unpaid-invoice rules act on it: where it runs and how it stands.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PaymentStopVm {
    pub vm_id: String,
    pub user_sub: String,
    pub name: String,
    pub host_id: Option<String>,
    #[sqlx(try_from = "String")]
    pub status: byo_wire::states::VmStatus,
    /// Asked to be deleted, or deleted: nothing to start.
    pub leaving: bool,
    /// The invoice it was stopped for (none while it runs).
    pub invoice_id: Option<String>,
}

/// One invoiced line of an owner's earnings (issue #40, 6): an instance-day charged on one of
/// their hosts, or a credit given back for one; what it sold and which invoice took it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct EarningLine {
    pub host_id: String,
    pub host_slug: String,
    pub vm_id: String,
    /// The day charged, or the start of the credited time.
    pub at: DateTime<Utc>,
    /// `usage` or `credit`.
    pub kind: String,
    /// Seconds sold (negative for a credit).
    pub seconds: i64,
    /// Cents invoiced (negative for a credit).
    pub amount_cents: i64,
    pub currency: String,
    pub invoice_id: String,
    #[sqlx(try_from = "String")]
    pub invoice_status: InvoiceStatus,
    /// The payout that paid the owner their part of it (migration 0024), once one has.
    pub payout_id: Option<String>,
}

/// What Stripe said about an invoice (an API answer or a webhook's object).
#[derive(Clone, Debug, Default)]
pub struct InvoiceUpdate<'a> {
    pub status: Option<InvoiceStatus>,
    pub stripe_invoice_id: Option<&'a str>,
    pub hosted_invoice_url: Option<&'a str>,
    pub stripe_total_cents: Option<i64>,
    /// `/pay` was called (whatever it answered).
    pub pay_attempted: bool,
    /// The payment failed (a decline from `/pay`, or `invoice.payment_failed`).
    pub payment_failed: bool,
    pub last_error: Option<&'a str>,
}

impl Store {
    /// Every account with charges or credits not yet on an invoice, and a Stripe customer.
    pub async fn uninvoiced_balances(&self) -> Result<Vec<UninvoicedBalance>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, UninvoicedBalance>(
                "select u.user_sub, c.customer_id, cast(sum(u.amount) as bigint) as amount_cents, \
                        min(u.at) as earliest \
                 from (select user_sub, cast(amount_cents as bigint) as amount, period_start as at \
                         from usage_charges where invoice_id is null \
                       union all \
                       select user_sub, -cast(amount_cents as bigint), from_at \
                         from refunds where invoice_id is null) u \
                 join stripe_customers c on c.user_sub = u.user_sub \
                 group by u.user_sub, c.customer_id \
                 order by u.user_sub",
            )
            .fetch_all(p)
            .await
        })?)
    }

    /// Make the account's next invoice: a `pending` row covering every charge and credit of
    /// the account not yet on one, marked in the same transaction. None (nothing written)
    /// when the account already has an invoice pending, or nothing positive to invoice.
    pub async fn open_invoice(
        &self,
        user_sub: &str,
        customer_id: &str,
        reason: &str,
        currency: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<InvoiceRow>> {
        in_tx!(self, |tx, for_update| {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select sub from users where sub = $1{for_update}"
            )))
            .bind(user_sub)
            .fetch_optional(&mut *tx)
            .await?;
            let pending: i64 = sqlx::query_scalar(
                "select count(*) from invoices where user_sub = $1 and status = 'pending'",
            )
            .bind(user_sub)
            .fetch_one(&mut *tx)
            .await?;
            let amount: i64 = sqlx::query_scalar(
                "select coalesce((select cast(sum(amount_cents) as bigint) from usage_charges \
                                  where user_sub = $1 and invoice_id is null), 0) \
                      - coalesce((select cast(sum(amount_cents) as bigint) from refunds \
                                  where user_sub = $1 and invoice_id is null), 0)",
            )
            .bind(user_sub)
            .fetch_one(&mut *tx)
            .await?;
            if pending > 0 || amount <= 0 {
                return Ok(None);
            }
            let id = new_id();
            let row = sqlx::query_as::<_, InvoiceRow>(concat!(
                "insert into invoices (id, user_sub, customer_id, reason, amount_cents, \
                   currency, status, created_at, updated_at) \
                 values ($1, $2, $3, $4, $5, $6, 'pending', $7, $7) returning ",
                columns!()
            ))
            .bind(&id)
            .bind(user_sub)
            .bind(customer_id)
            .bind(reason)
            .bind(i32::try_from(amount).unwrap_or(i32::MAX))
            .bind(currency)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            sqlx::query(
                "update usage_charges set invoice_id = $2 where user_sub = $1 and invoice_id is null",
            )
            .bind(user_sub)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "update refunds set invoice_id = $2 where user_sub = $1 and invoice_id is null",
            )
            .bind(user_sub)
            .bind(&id)
            .execute(&mut *tx)
            .await?;
            Ok::<_, crate::DbError>(Some(row))
        })
    }

    /// Invoices the job has more to do for: not at Stripe yet, still a draft, or open and
    /// never asked to pay. Oldest first.
    pub async fn unfinished_invoices(&self) -> Result<Vec<InvoiceRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, InvoiceRow>(concat!(
                "select ",
                columns!(),
                " from invoices \
                 where status in ('pending', 'draft') \
                    or (status = 'open' and pay_attempted_at is null) \
                 order by created_at, id"
            ))
            .fetch_all(p)
            .await
        })?)
    }

    pub async fn invoice(&self, id: &str) -> Result<Option<InvoiceRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, InvoiceRow>(concat!(
                "select ",
                columns!(),
                " from invoices where id = $1"
            ))
            .bind(id)
            .fetch_optional(p)
            .await
        })?)
    }

    pub async fn invoice_by_stripe_id(&self, stripe_id: &str) -> Result<Option<InvoiceRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, InvoiceRow>(concat!(
                "select ",
                columns!(),
                " from invoices where stripe_invoice_id = $1"
            ))
            .bind(stripe_id)
            .fetch_optional(p)
            .await
        })?)
    }

    /// An account's invoices, newest first, at most `limit` (the billing page).
    pub async fn invoices_for(&self, user_sub: &str, limit: i64) -> Result<Vec<InvoiceRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, InvoiceRow>(concat!(
                "select ",
                columns!(),
                " from invoices where user_sub = $1 order by created_at desc, id desc limit $2"
            ))
            .bind(user_sub)
            .bind(limit)
            .fetch_all(p)
            .await
        })?)
    }

    /// Record what Stripe said about invoice `id`. The status moves only forward
    /// ([`InvoiceStatus::may_become`]): an update that would move it back writes nothing and
    /// is `AlreadySet`. The stamps of the status reached (`finalized_at`, `paid_at`,
    /// `voided_at`) and of a payment attempt or failure are set once; a Stripe id once set
    /// is kept.
    pub async fn update_invoice(
        &self,
        id: &str,
        u: &InvoiceUpdate<'_>,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        in_tx!(self, |tx, for_update| {
            let status: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "select status from invoices where id = $1{for_update}"
            )))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(current) = status.and_then(|s| s.parse::<InvoiceStatus>().ok()) else {
                return Ok(GuardedWrite::AlreadySet);
            };
            let next = u.status.unwrap_or(current);
            if !current.may_become(next) {
                return Ok(GuardedWrite::AlreadySet);
            }
            let stamp = |s: InvoiceStatus| (next == s).then_some(now);
            let finalized = matches!(
                next,
                InvoiceStatus::Open
                    | InvoiceStatus::Paid
                    | InvoiceStatus::Uncollectible
                    | InvoiceStatus::Void
            )
            .then_some(now);
            sqlx::query(
                "update invoices set status = $2, \
                   stripe_invoice_id = coalesce(stripe_invoice_id, $3), \
                   hosted_invoice_url = coalesce($4, hosted_invoice_url), \
                   stripe_total_cents = coalesce($5, stripe_total_cents), \
                   finalized_at = coalesce(finalized_at, $6), \
                   paid_at = coalesce(paid_at, $7), \
                   voided_at = coalesce(voided_at, $8), \
                   pay_attempted_at = coalesce(pay_attempted_at, $9), \
                   payment_failed_at = coalesce(payment_failed_at, $10), \
                   last_error = coalesce($11, last_error), \
                   updated_at = $12 \
                 where id = $1",
            )
            .bind(id)
            .bind(next.as_str())
            .bind(u.stripe_invoice_id)
            .bind(u.hosted_invoice_url)
            .bind(
                u.stripe_total_cents
                    .map(|c| i32::try_from(c).unwrap_or(i32::MAX)),
            )
            .bind(finalized)
            .bind(stamp(InvoiceStatus::Paid))
            .bind(stamp(InvoiceStatus::Void))
            .bind(u.pay_attempted.then_some(now))
            .bind(u.payment_failed.then_some(now))
            .bind(u.last_error)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            Ok::<_, crate::DbError>(GuardedWrite::Written)
        })
    }

    /// The charges and credits an invoice covers: (charges' cents, credits' cents).
    pub async fn invoice_lines_total(&self, invoice_id: &str) -> Result<(i64, i64)> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, (i64, i64)>(
                "select coalesce((select cast(sum(amount_cents) as bigint) from usage_charges \
                                  where invoice_id = $1), 0), \
                        coalesce((select cast(sum(amount_cents) as bigint) from refunds \
                                  where invoice_id = $1), 0)",
            )
            .bind(invoice_id)
            .fetch_one(p)
            .await
        })?)
    }

    /// Invoices whose payment was declined and that are still unpaid (open or
    /// uncollectible), the oldest decline first.
    pub async fn declined_unpaid_invoices(&self) -> Result<Vec<InvoiceRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, InvoiceRow>(concat!(
                "select ",
                columns!(),
                " from invoices \
                 where status in ('open', 'uncollectible') and payment_failed_at is not null \
                 order by payment_failed_at, id"
            ))
            .fetch_all(p)
            .await
        })?)
    }

    /// The account's oldest declined, unpaid invoice, if it has one (the billing gate).
    pub async fn declined_unpaid_invoice(&self, user_sub: &str) -> Result<Option<InvoiceRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, InvoiceRow>(concat!(
                "select ",
                columns!(),
                " from invoices \
                 where user_sub = $1 and status in ('open', 'uncollectible') \
                   and payment_failed_at is not null \
                 order by payment_failed_at, id limit 1"
            ))
            .bind(user_sub)
            .fetch_optional(p)
            .await
        })?)
    }

    /// The account's running instances not already stopped for payment.
    pub async fn running_vms_of(&self, user_sub: &str) -> Result<Vec<PaymentStopVm>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PaymentStopVm>(
                "select v.id as vm_id, v.user_sub, v.name, v.host_id, v.status, \
                        (v.delete_requested_at is not null or v.deleted_at is not null) as leaving, \
                        cast(null as text) as invoice_id \
                 from vms v \
                 where v.user_sub = $1 and v.status = 'running' \
                   and v.delete_requested_at is null and v.deleted_at is null \
                   and not exists (select 1 from payment_stops s where s.vm_id = v.id) \
                 order by v.created_at, v.id",
            )
            .bind(user_sub)
            .fetch_all(p)
            .await
        })?)
    }

    /// Record that `vm_id` was stopped because `invoice_id` went unpaid (once).
    pub async fn record_payment_stop(
        &self,
        vm_id: &str,
        user_sub: &str,
        invoice_id: &str,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
                "insert into payment_stops (vm_id, user_sub, invoice_id, stopped_at) \
                 values ($1, $2, $3, $4) on conflict (vm_id) do nothing",
            )
            .bind(vm_id)
            .bind(user_sub)
            .bind(invoice_id)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// Instances stopped for payment whose account now owes nothing declined: to start.
    pub async fn payment_stops_to_release(&self) -> Result<Vec<PaymentStopVm>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PaymentStopVm>(
                "select v.id as vm_id, v.user_sub, v.name, v.host_id, v.status, \
                        (v.delete_requested_at is not null or v.deleted_at is not null) as leaving, \
                        s.invoice_id \
                 from payment_stops s join vms v on v.id = s.vm_id \
                 where not exists (select 1 from invoices i \
                                   where i.user_sub = s.user_sub \
                                     and i.status in ('open', 'uncollectible') \
                                     and i.payment_failed_at is not null) \
                 order by s.stopped_at, s.vm_id",
            )
            .fetch_all(p)
            .await
        })?)
    }

    /// Take `vm_id` off the stopped-for-payment list; `AlreadySet` when it was not on it
    /// (another run took it first).
    pub async fn release_payment_stop(&self, vm_id: &str) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query("delete from payment_stops where vm_id = $1")
                .bind(vm_id)
                .execute(p)
                .await
                .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// The invoice `vm_id` was stopped for, if it was stopped for payment.
    pub async fn payment_stop(&self, vm_id: &str) -> Result<Option<String>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar::<_, String>("select invoice_id from payment_stops where vm_id = $1")
                .bind(vm_id)
                .fetch_optional(p)
                .await
        })?)
    }

    /// Every invoiced line (not on a void invoice) of instances on `owner_sub`'s hosts —
    /// every owner's with `None` — oldest first.
    pub async fn earning_lines(&self, owner_sub: Option<&str>) -> Result<Vec<EarningLine>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, EarningLine>(
                "select h.id as host_id, h.slug as host_slug, l.vm_id, l.at, l.kind, \
                        l.seconds, l.amount_cents, l.currency, l.invoice_id, \
                        i.status as invoice_status, l.payout_id \
                 from (select vm_id, period_start as at, 'usage' as kind, \
                              cast(seconds as bigint) as seconds, \
                              cast(amount_cents as bigint) as amount_cents, currency, invoice_id, \
                              payout_id \
                         from usage_charges where invoice_id is not null \
                       union all \
                       select vm_id, from_at, 'credit', -cast(seconds as bigint), \
                              -cast(amount_cents as bigint), currency, invoice_id, payout_id \
                         from refunds where invoice_id is not null) l \
                 join invoices i on i.id = l.invoice_id \
                 join vms v on v.id = l.vm_id \
                 join hosts h on h.id = v.host_id \
                 where i.status <> 'void' and ($1 is null or h.owner_sub = $1) \
                 order by l.at, h.slug, l.vm_id, l.kind desc",
            )
            .bind(owner_sub)
            .fetch_all(p)
            .await
        })?)
    }

    /// Every account's invoices, newest first, at most `limit` (the operators' billing page).
    pub async fn recent_invoices(&self, limit: i64) -> Result<Vec<InvoiceRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, InvoiceRow>(concat!(
                "select ",
                columns!(),
                " from invoices order by created_at desc, id desc limit $1"
            ))
            .bind(limit)
            .fetch_all(p)
            .await
        })?)
    }

    /// How many of the account's instances are stopped for payment now.
    pub async fn payment_stops_of(&self, user_sub: &str) -> Result<i64> {
        Ok(on_pool!(self, |p| {
            sqlx::query_scalar::<_, i64>("select count(*) from payment_stops where user_sub = $1")
                .bind(user_sub)
                .fetch_one(p)
                .await
        })?)
    }
}
