//! Owners' payouts (issue #40, 6; migration 0024): each owner's connected Stripe account, and
//! the payouts of their share — made here first, the charges and credits each covers marked
//! in the same transaction, then transferred at Stripe under a key derived from its id. The
//! rules — when a payout is due, the owner's part of a line, the backoff — are the server's
//! (`app::payouts`).

use byo_wire::states::PayoutStatus;
use chrono::{DateTime, Utc};

use crate::{GuardedWrite, Result, Store, new_id};

/// An owner's connected Stripe account.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PayoutAccountRow {
    pub user_sub: String,
    pub stripe_account_id: String,
    /// Whether it could receive transfers when last asked (shown; a payout asks again).
    pub transfers_active: bool,
    pub checked_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

macro_rules! columns {
    () => {
        "id, user_sub, month, stripe_account_id, amount_cents, currency, owner_share_bps, \
         status, stripe_transfer_id, attempts, last_error, next_attempt_at, created_at, \
         paid_at, updated_at"
    };
}

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct PayoutRow {
    pub id: String,
    pub user_sub: String,
    /// `2026-11`: the month whose end it follows.
    pub month: String,
    pub stripe_account_id: String,
    pub amount_cents: i64,
    pub currency: String,
    pub owner_share_bps: i32,
    #[sqlx(try_from = "String")]
    pub status: PayoutStatus,
    pub stripe_transfer_id: Option<String>,
    /// Transfers tried and refused (or unanswered).
    pub attempts: i32,
    pub last_error: Option<String>,
    pub next_attempt_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

/// A payout to make: `user_sub`'s share of every line on their hosts whose invoice was paid
/// before `paid_before` and that no payout took yet.
#[derive(Clone, Debug)]
pub struct NewPayout<'a> {
    pub user_sub: &'a str,
    pub month: &'a str,
    pub stripe_account_id: &'a str,
    pub currency: &'a str,
    pub owner_share_bps: u32,
    pub paid_before: DateTime<Utc>,
    pub now: DateTime<Utc>,
}

/// Which lines of a table a payout may take: charges (or credits) of instances on the
/// owner's hosts, on an invoice paid before the cutoff, not paid out yet. `$1` the owner, `$2`
/// the cutoff.
macro_rules! payable {
    () => {
        " where payout_id is null \
           and invoice_id in (select id from invoices where status = 'paid' and paid_at < $2) \
           and vm_id in (select v.id from vms v join hosts h on h.id = v.host_id \
                         where h.owner_sub = $1)"
    };
}

impl Store {
    pub async fn payout_account(&self, user_sub: &str) -> Result<Option<PayoutAccountRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PayoutAccountRow>(
                "select user_sub, stripe_account_id, transfers_active, checked_at, created_at \
                 from payout_accounts where user_sub = $1",
            )
            .bind(user_sub)
            .fetch_optional(p)
            .await
        })?)
    }

    /// Keep `stripe_account_id` as the owner's connected account unless they have one;
    /// answers the one kept (the first writer's).
    pub async fn keep_payout_account(
        &self,
        user_sub: &str,
        stripe_account_id: &str,
        now: DateTime<Utc>,
    ) -> Result<PayoutAccountRow> {
        on_pool!(self, |p| {
            sqlx::query(
                "insert into payout_accounts (user_sub, stripe_account_id, created_at) \
                 values ($1, $2, $3) on conflict (user_sub) do nothing",
            )
            .bind(user_sub)
            .bind(stripe_account_id)
            .bind(now)
            .execute(p)
            .await
            .map(|_| ())
        })?;
        self.payout_account(user_sub)
            .await?
            .ok_or(crate::DbError::NotFound)
    }

    /// What Stripe said, live, about whether the owner's account can receive transfers.
    pub async fn record_payout_account_check(
        &self,
        user_sub: &str,
        transfers_active: bool,
        now: DateTime<Utc>,
    ) -> Result<()> {
        on_pool!(self, |p| {
            sqlx::query(
                "update payout_accounts set transfers_active = $2, checked_at = $3 \
                 where user_sub = $1",
            )
            .bind(user_sub)
            .bind(transfers_active)
            .bind(now)
            .execute(p)
            .await
            .map(|_| ())
        })?;
        Ok(())
    }

    /// Connected accounts whose owner has no payout for `month` yet and has lines paid before
    /// `paid_before` to pay out.
    pub async fn owners_due_payout(
        &self,
        month: &str,
        paid_before: DateTime<Utc>,
    ) -> Result<Vec<PayoutAccountRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PayoutAccountRow>(
                "select a.user_sub, a.stripe_account_id, a.transfers_active, a.checked_at, \
                        a.created_at \
                 from payout_accounts a \
                 where not exists (select 1 from payouts o \
                                   where o.user_sub = a.user_sub and o.month = $1) \
                   and (exists (select 1 from usage_charges c \
                                join invoices i on i.id = c.invoice_id \
                                join vms v on v.id = c.vm_id join hosts h on h.id = v.host_id \
                                where c.payout_id is null and i.status = 'paid' \
                                  and i.paid_at < $2 and h.owner_sub = a.user_sub) \
                        or exists (select 1 from refunds r \
                                join invoices i on i.id = r.invoice_id \
                                join vms v on v.id = r.vm_id join hosts h on h.id = v.host_id \
                                where r.payout_id is null and i.status = 'paid' \
                                  and i.paid_at < $2 and h.owner_sub = a.user_sub)) \
                 order by a.user_sub",
            )
            .bind(month)
            .bind(paid_before)
            .fetch_all(p)
            .await
        })?)
    }

    /// Make the owner's payout for `p.month`: a `pending` row of their part of every payable
    /// line (`owner_part` of each line's cents, a credit's negative), the lines marked with it
    /// in the same transaction. None (nothing written) when they have a payout for the month
    /// already, or their part comes to nothing: the lines wait for the next month's.
    pub async fn open_payout(
        &self,
        n: &NewPayout<'_>,
        owner_part: impl Fn(i64) -> i64,
    ) -> Result<Option<PayoutRow>> {
        in_tx!(self, |tx, for_update| {
            // One payout at a time per owner (PostgreSQL; SQLite's writer is already alone).
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select sub from users where sub = $1{for_update}"
            )))
            .bind(n.user_sub)
            .fetch_optional(&mut *tx)
            .await?;
            let made: i64 = sqlx::query_scalar(
                "select count(*) from payouts where user_sub = $1 and month = $2",
            )
            .bind(n.user_sub)
            .bind(n.month)
            .fetch_one(&mut *tx)
            .await?;
            if made > 0 {
                return Ok(None);
            }
            let lines: Vec<i64> = sqlx::query_scalar(concat!(
                "select cast(amount_cents as bigint) from usage_charges",
                payable!(),
                " union all select -cast(amount_cents as bigint) from refunds",
                payable!()
            ))
            .bind(n.user_sub)
            .bind(n.paid_before)
            .fetch_all(&mut *tx)
            .await?;
            let amount: i64 = lines.iter().map(|&c| owner_part(c)).sum();
            if amount <= 0 {
                return Ok(None);
            }
            let id = new_id();
            let row = sqlx::query_as::<_, PayoutRow>(concat!(
                "insert into payouts (id, user_sub, month, stripe_account_id, amount_cents, \
                   currency, owner_share_bps, status, next_attempt_at, created_at, updated_at) \
                 values ($1, $2, $3, $4, $5, $6, $7, 'pending', $8, $8, $8) returning ",
                columns!()
            ))
            .bind(&id)
            .bind(n.user_sub)
            .bind(n.month)
            .bind(n.stripe_account_id)
            .bind(amount)
            .bind(n.currency)
            .bind(i32::try_from(n.owner_share_bps).unwrap_or(i32::MAX))
            .bind(n.now)
            .fetch_one(&mut *tx)
            .await?;
            let mut marked = 0;
            for update in [
                concat!("update usage_charges set payout_id = $3", payable!()),
                concat!("update refunds set payout_id = $3", payable!()),
            ] {
                marked += sqlx::query(update)
                    .bind(n.user_sub)
                    .bind(n.paid_before)
                    .bind(&id)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
            }
            // The cutoff is in the past, so no line can have become payable in between.
            if marked != lines.len() as u64 {
                return Err(crate::DbError::Refused(format!(
                    "payout {id}: {} lines summed, {marked} marked",
                    lines.len()
                )));
            }
            Ok::<_, crate::DbError>(Some(row))
        })
    }

    /// Payouts to transfer now: pending, their next attempt due. Oldest first.
    pub async fn payouts_to_transfer(&self, now: DateTime<Utc>) -> Result<Vec<PayoutRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PayoutRow>(concat!(
                "select ",
                columns!(),
                " from payouts where status = 'pending' and next_attempt_at <= $1 \
                  order by created_at, id"
            ))
            .bind(now)
            .fetch_all(p)
            .await
        })?)
    }

    /// Stripe took the transfer. Once: a paid payout stays as it was paid.
    pub async fn payout_paid(
        &self,
        id: &str,
        stripe_transfer_id: &str,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let rows = on_pool!(self, |p| {
            sqlx::query(
                "update payouts set status = 'paid', stripe_transfer_id = $2, paid_at = $3, \
                   last_error = null, updated_at = $3 \
                 where id = $1 and status = 'pending'",
            )
            .bind(id)
            .bind(stripe_transfer_id)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(rows))
    }

    /// The transfer was refused or unanswered: counted, its reason kept, tried again at
    /// `next_attempt_at`.
    pub async fn payout_failed(
        &self,
        id: &str,
        error: &str,
        next_attempt_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let rows = on_pool!(self, |p| {
            sqlx::query(
                "update payouts set attempts = attempts + 1, last_error = $2, \
                   next_attempt_at = $3, updated_at = $4 \
                 where id = $1 and status = 'pending'",
            )
            .bind(id)
            .bind(error)
            .bind(next_attempt_at)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(rows))
    }

    pub async fn payout(&self, id: &str) -> Result<Option<PayoutRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PayoutRow>(concat!(
                "select ",
                columns!(),
                " from payouts where id = $1"
            ))
            .bind(id)
            .fetch_optional(p)
            .await
        })?)
    }

    /// An owner's payouts, newest month first, at most `limit`.
    pub async fn payouts_for(&self, user_sub: &str, limit: i64) -> Result<Vec<PayoutRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PayoutRow>(concat!(
                "select ",
                columns!(),
                " from payouts where user_sub = $1 order by month desc, id desc limit $2"
            ))
            .bind(user_sub)
            .bind(limit)
            .fetch_all(p)
            .await
        })?)
    }

    /// Every payout not yet transferred, oldest first (the operators' billing page).
    pub async fn pending_payouts(&self) -> Result<Vec<PayoutRow>> {
        Ok(on_pool!(self, |p| {
            sqlx::query_as::<_, PayoutRow>(concat!(
                "select ",
                columns!(),
                " from payouts where status = 'pending' order by created_at, id"
            ))
            .fetch_all(p)
            .await
        })?)
    }
}
