//! Pre-bookings (E3): a named box for a date range, pinned at booking time.
//!
//! A booking is *open* until `closed_at` (its window ended, or its booker cancelled it
//! unpaid: `closed_reason`). The host is pinned when the booking is made (E3.2) and
//! `prebookings_host_not_double_booked` (migration 0012) keeps one host from being pinned
//! by two open bookings whose windows overlap, for every writer. `paid_at` is written only
//! by [`Store::mark_prebooking_paid`] (E3.1). The launcher stamps `launched_vm_id` in the
//! transaction that writes the instance's row, before the host is contacted, and
//! `vms_one_live_per_prebooking` keeps a booking to one live instance.

use chrono::{DateTime, Utc};

use crate::vms::{NewVm, VM_COLUMNS, VmRow};
use crate::{DbError, GuardedWrite, Result, Store, new_id};

/// The columns every [`PrebookingRow`] is read with.
const PREBOOKING_COLUMNS: &str = "id, user_sub, host_id, gpu_type, start_date, end_date, paid_at, \
     launched_vm_id, closed_at, closed_reason, launch_note, launch_note_at, created_at";

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct PrebookingRow {
    pub id: String,
    pub user_sub: String,
    /// The pinned host; `None` on a legacy row, which falls back to the pool (E3.2).
    pub host_id: Option<String>,
    pub gpu_type: String,
    pub start_date: DateTime<Utc>,
    pub end_date: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    /// The instance the launcher last wrote for it; never nulled (vms are soft-deleted).
    pub launched_vm_id: Option<String>,
    pub closed_at: Option<DateTime<Utc>>,
    /// `ended` or `cancelled`.
    pub closed_reason: Option<String>,
    /// Why the launcher did not launch it at `launch_note_at` (cleared by a launch).
    pub launch_note: Option<String>,
    pub launch_note_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

/// A booking as operators list it: with its host's slug and its booker's email.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct PrebookingListRow {
    #[sqlx(flatten)]
    pub booking: PrebookingRow,
    pub host_slug: Option<String>,
    pub booker_email: String,
}

#[derive(Clone, Debug)]
pub struct NewPrebooking<'a> {
    pub user_sub: &'a str,
    pub gpu_type: &'a str,
    pub start_date: DateTime<Utc>,
    pub end_date: DateTime<Utc>,
}

/// Why a booking closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClosedReason {
    /// expire-prebook closed it at `end_date` (E3.4).
    Ended,
    /// Its booker cancelled it before paying.
    Cancelled,
}

impl ClosedReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ClosedReason::Ended => "ended",
            ClosedReason::Cancelled => "cancelled",
        }
    }
}

impl Store {
    /// The one write of `prebookings.paid_at` (E3.1: the launcher's only gate). Guarded: a
    /// booking already paid keeps its first payment time, so a replayed payment changes
    /// nothing.
    pub async fn mark_prebooking_paid(
        &self,
        id: &str,
        paid_at: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query("update prebookings set paid_at = $2 where id = $1 and paid_at is null")
                .bind(id)
                .bind(paid_at)
                .execute(p)
                .await
                .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// Make a booking, pinning its host now (E3.2): the first host of `gpu_type` that a
    /// create for this booker could use (active, so prepared; not retired; reachable; in the
    /// shared placement or dedicated to the booker) and that no open booking holds for an
    /// overlapping window; the booker's own dedicated boxes first. In one transaction with
    /// the booker's row locked, the booker's open unpaid bookings are counted against
    /// `max_open_unpaid`: [`DbError::Refused`]`("prebookings_unpaid_cap")` past it, and
    /// `Refused("no_host_for_window")` when no host is free for the window. A racing booking
    /// that took the same host first is `Refused("prebookings_host_not_double_booked")`.
    pub async fn book_prebooking(
        &self,
        new: NewPrebooking<'_>,
        max_open_unpaid: i64,
        now: DateTime<Utc>,
    ) -> Result<PrebookingRow> {
        in_tx!(self, |tx, for_update| {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select sub from users where sub = $1{for_update}"
            )))
            .bind(new.user_sub)
            .fetch_optional(&mut *tx)
            .await?;
            let unpaid: i64 = sqlx::query_scalar(
                "select count(*) from prebookings
                 where user_sub = $1 and closed_at is null and paid_at is null and end_date > $2",
            )
            .bind(new.user_sub)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            if unpaid >= max_open_unpaid {
                return Err(crate::Rule::UnpaidBookingCap.refused());
            }
            let host: Option<String> = sqlx::query_scalar(
                "select h.id from hosts h
                 where h.gpu_type = $1
                   and h.active = true and h.prepared_at is not null and h.retired_at is null
                   and h.agent_token is not null and h.relay_ip is not null
                   and ((h.dedicated = false and h.placement = 'shared')
                        or (h.dedicated = true and h.dedicated_to = $2))
                   and not exists (select 1 from prebookings b
                                   where b.host_id = h.id and b.closed_at is null
                                     and b.start_date < $4 and $3 < b.end_date)
                 order by h.dedicated desc, h.activated_at, h.slug
                 limit 1",
            )
            .bind(new.gpu_type)
            .bind(new.user_sub)
            .bind(new.start_date)
            .bind(new.end_date)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(host) = host else {
                return Err(crate::Rule::NoHostForWindow.refused());
            };
            let row = sqlx::query_as::<_, PrebookingRow>(sqlx::AssertSqlSafe(format!(
                "insert into prebookings (id, user_sub, host_id, gpu_type, start_date, end_date, created_at)
                 values ($1, $2, $3, $4, $5, $6, $7)
                 returning {PREBOOKING_COLUMNS}"
            )))
            .bind(new_id())
            .bind(new.user_sub)
            .bind(&host)
            .bind(new.gpu_type)
            .bind(new.start_date)
            .bind(new.end_date)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            Ok(row)
        })
    }

    pub async fn prebooking(&self, id: &str) -> Result<Option<PrebookingRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, PrebookingRow>(
            sqlx::AssertSqlSafe(format!(
                "select {PREBOOKING_COLUMNS} from prebookings where id = $1"
            ))
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// One booker's bookings, newest window first.
    pub async fn prebookings_of(&self, user_sub: &str) -> Result<Vec<PrebookingRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, PrebookingRow>(
            sqlx::AssertSqlSafe(format!(
                "select {PREBOOKING_COLUMNS} from prebookings where user_sub = $1
                 order by start_date desc, id limit 200"
            ))
        )
        .bind(user_sub)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Every booking for operators: open ones first by window, then the closed, newest
    /// first; with the host's slug and the booker's email.
    pub async fn prebookings_overview(&self, limit: i64) -> Result<Vec<PrebookingListRow>> {
        let columns: Vec<String> = PREBOOKING_COLUMNS
            .split(',')
            .map(|c| format!("b.{}", c.trim()))
            .collect();
        on_pool!(self, |p| sqlx::query_as::<_, PrebookingListRow>(
            sqlx::AssertSqlSafe(format!(
                "select {}, h.slug as host_slug, u.email as booker_email
                 from prebookings b join users u on u.sub = b.user_sub
                 left join hosts h on h.id = b.host_id
                 order by case when b.closed_at is null then 0 else 1 end,
                          case when b.closed_at is null then b.start_date end,
                          b.closed_at desc, b.id
                 limit $1",
                columns.join(", ")
            ))
        )
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The booker cancels an open booking that is not paid. Guarded: a paid, closed or
    /// someone else's booking is left as it is ([`GuardedWrite::AlreadySet`]).
    pub async fn cancel_prebooking(
        &self,
        id: &str,
        user_sub: &str,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| sqlx::query(
            "update prebookings set closed_at = $3, closed_reason = 'cancelled'
             where id = $1 and user_sub = $2 and closed_at is null and paid_at is null"
        )
        .bind(id)
        .bind(user_sub)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// The booker cancels a paid booking before its window opens (its refund made): closed
    /// as cancelled, guarded so a booking whose window has opened, or closed meanwhile, is
    /// `AlreadySet`.
    pub async fn cancel_paid_prebooking(
        &self,
        id: &str,
        user_sub: &str,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| sqlx::query(
            "update prebookings set closed_at = $3, closed_reason = 'cancelled'
             where id = $1 and user_sub = $2 and closed_at is null and paid_at is not null
               and start_date > $3"
        )
        .bind(id)
        .bind(user_sub)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// An operator moves an open booking's pin to `host_id` (E3.2); the note of the old
    /// pin goes with it. An overlapping open booking on the new host is
    /// `Refused("prebookings_host_not_double_booked")`.
    pub async fn reassign_prebooking(&self, id: &str, host_id: &str) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| sqlx::query(
            "update prebookings set host_id = $2, launch_note = null, launch_note_at = null
             where id = $1 and closed_at is null"
        )
        .bind(id)
        .bind(host_id)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// Open, paid bookings whose window is open at `now` (start ≤ now < end): the
    /// launcher's work, oldest window first.
    pub async fn prebookings_due(&self, now: DateTime<Utc>) -> Result<Vec<PrebookingRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, PrebookingRow>(
            sqlx::AssertSqlSafe(format!(
                "select {PREBOOKING_COLUMNS} from prebookings
                 where closed_at is null and paid_at is not null
                   and start_date <= $1 and end_date > $1
                 order by start_date, id limit 500"
            ))
        )
        .bind(now)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Open bookings whose window has ended at `now`: expire-prebook's work.
    pub async fn prebookings_ended(&self, now: DateTime<Utc>) -> Result<Vec<PrebookingRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, PrebookingRow>(
            sqlx::AssertSqlSafe(format!(
                "select {PREBOOKING_COLUMNS} from prebookings
                 where closed_at is null and end_date <= $1
                 order by end_date, id limit 500"
            ))
        )
        .bind(now)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Close an open booking (guarded by `closed_at is null`).
    pub async fn close_prebooking(
        &self,
        id: &str,
        reason: ClosedReason,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| sqlx::query(
            "update prebookings set closed_at = $2, closed_reason = $3
             where id = $1 and closed_at is null"
        )
        .bind(id)
        .bind(now)
        .bind(reason.as_str())
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// Open a closed booking again (an operator's forced launch, E0 caller 5). Its pin is
    /// checked again: a host another open booking took meanwhile is
    /// `Refused("prebookings_host_not_double_booked")`.
    pub async fn reopen_prebooking(&self, id: &str) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| sqlx::query(
            "update prebookings set closed_at = null, closed_reason = null
             where id = $1 and closed_at is not null"
        )
        .bind(id)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// Why the launcher did not launch the booking at `at` (bounded to 500 characters),
    /// or `None` to clear it.
    pub async fn record_prebooking_note(
        &self,
        id: &str,
        note: Option<&str>,
        at: DateTime<Utc>,
    ) -> Result<()> {
        let note: Option<String> = note
            .map(|n| n.chars().take(500).collect::<String>())
            .filter(|n| !n.is_empty());
        let at = note.as_ref().map(|_| at);
        on_pool!(self, |p| sqlx::query(
            "update prebookings set launch_note = $2, launch_note_at = $3 where id = $1"
        )
        .bind(id)
        .bind(&note)
        .bind(at)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// The launcher's write (E3, like create_vm for E1): the instance's row with its host,
    /// name and `prebooking_id`, and the booking's `launched_vm_id`, in one transaction with
    /// the booking locked, before the host is contacted. A closed booking is
    /// `Refused("prebooking_closed")`; a booking already holding a live instance is
    /// `Conflict("vms_one_live_per_prebooking")`; a host holding one is
    /// `Conflict("vms_one_live_per_host")`.
    pub async fn create_prebooking_vm(
        &self,
        prebooking_id: &str,
        new: NewVm<'_>,
        created_at: DateTime<Utc>,
    ) -> Result<VmRow> {
        let written: Result<VmRow> = async {
            in_tx!(self, |tx, for_update| {
                let open: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "select id from prebookings where id = $1 and closed_at is null{for_update}"
                )))
                .bind(prebooking_id)
                .fetch_optional(&mut *tx)
                .await?;
                if open.is_none() {
                    return Err(crate::Rule::BookingClosed.refused());
                }
                let row = sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(format!(
                    "insert into vms (id, user_sub, host_id, name, gpu_type, ssh_hostname, prebooking_id, created_at)
                     values ($1, $2, $3, $4, $5, $6, $7, $8)
                     returning {VM_COLUMNS}"
                )))
                .bind(new_id())
                .bind(new.user_sub)
                .bind(new.host_id)
                .bind(new.name)
                .bind(new.gpu_type)
                .bind(new.ssh_hostname)
                .bind(prebooking_id)
                .bind(created_at)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query(
                    "update prebookings set launched_vm_id = $2, launch_note = null, launch_note_at = null
                     where id = $1",
                )
                .bind(prebooking_id)
                .bind(&row.id)
                .execute(&mut *tx)
                .await?;
                Ok(row)
            })
        }
        .await;
        written.map_err(|e| match e {
            // SQLite names the columns, PostgreSQL the index.
            DbError::Conflict(name) if name.contains("prebooking") => {
                DbError::Conflict("vms_one_live_per_prebooking".into())
            }
            DbError::Conflict(_) => DbError::Conflict("vms_one_live_per_host".into()),
            other => other,
        })
    }
}
