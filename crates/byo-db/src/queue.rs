//! The queue (E2, migration 0011). A queued row is step 58's row with no host: the
//! customer's intent and nothing else. No `vms` row exists for it until a drain attempt
//! writes one, with the host it is about to contact, in the same transaction that checks
//! the drainer still holds its claim (the row is a precondition for dispatch, E0). A
//! refused attempt's row is closed by `creation_failed_at` at once, so the queued intent
//! never occupies a host that refused it (E2, step 58's point); the queue row closes
//! `placed` only once a host took the instance (step 62).
//!
//! Drainers claim rows with a lease (`claimed_until`, `claim_token`): on PostgreSQL with
//! `for update skip locked`, so concurrent drainers take disjoint rows without waiting; on
//! SQLite inside the write lock. A lease that ran out is anyone's again.
//!
//! The per-account limit (live instances plus queued rows without a live instance) is
//! counted in the transaction that inserts, under the user's row lock, so two racing
//! creates cannot both pass it.

use chrono::{DateTime, Utc};

use crate::vms::{NewVm, VM_COLUMNS, VmRow};
use crate::{DbError, GuardedWrite, Result, Store, new_id};

/// The columns every [`QueueRow`] is read with.
const QUEUE_COLUMNS: &str = "id, user_sub, gpu_type, ssh_key_id, created_at, attempts, claimed_until, \
     claim_token, vm_id, last_error, last_error_at, closed_at, close_reason, expires_at";

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct QueueRow {
    pub id: String,
    pub user_sub: String,
    pub gpu_type: String,
    pub ssh_key_id: String,
    pub created_at: DateTime<Utc>,
    pub attempts: i32,
    pub claimed_until: Option<DateTime<Utc>>,
    pub claim_token: Option<String>,
    /// The instance of the attempt in flight, of the last attempt, or (closed `placed`)
    /// the one placed.
    pub vm_id: Option<String>,
    /// Why the last attempt did not place it, in words a customer and an operator read.
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    pub closed_at: Option<DateTime<Utc>>,
    pub close_reason: Option<String>,
    /// When an open row lapses: the expire-queue job closes it `expired` from then on, and
    /// no drain claims it (migration 0021). The customer moves it with "keep waiting".
    pub expires_at: DateTime<Utc>,
}

/// An open queued row with its place in its gpu_type's line (1 is next) and its owner's
/// email, for the customer's list and /admin/queue.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct QueuedRow {
    #[sqlx(flatten)]
    pub row: QueueRow,
    pub position: i64,
    pub email: String,
}

/// How a queue row ends (`close_reason`, a closed set in the schema).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueClose {
    Placed,
    PlacedByOperator,
    Cancelled,
    ClosedByOperator,
    /// Nobody placed it before `expires_at` (issue #39, 2).
    Expired,
}

impl QueueClose {
    pub fn as_str(self) -> &'static str {
        match self {
            QueueClose::Placed => "placed",
            QueueClose::PlacedByOperator => "placed_by_operator",
            QueueClose::Cancelled => "cancelled",
            QueueClose::ClosedByOperator => "closed_by_operator",
            QueueClose::Expired => "expired",
        }
    }

    /// The ending a stored `close_reason` names (the schema's closed set).
    pub fn parse(reason: &str) -> Option<QueueClose> {
        [
            QueueClose::Placed,
            QueueClose::PlacedByOperator,
            QueueClose::Cancelled,
            QueueClose::ClosedByOperator,
            QueueClose::Expired,
        ]
        .into_iter()
        .find(|c| c.as_str() == reason)
    }
}

/// What [`Store::start_queue_attempts`] came to, per attempt.
#[derive(Debug)]
pub enum QueueAttempt {
    /// The attempt's row is written (host, name, SSH name, `created_at`) and the queue row
    /// points at it: dispatch may go ahead.
    Started(Box<VmRow>),
    /// Another writer holds a live row on that host (`vms_one_live_per_host`): nothing was
    /// written; the host did nothing wrong (Skipped).
    HostTaken,
    /// The claim is no longer this drainer's, or the row closed (cancelled, placed by an
    /// operator): nothing was written.
    Lost,
}

/// The count the per-account limit is taken over: live instances, and open queued rows
/// whose attempt is not a live instance already (so one instance is never counted twice).
const COUNT_HELD: &str = "select
       (select count(*) from vms v where v.user_sub = $1
          and v.deleted_at is null and v.creation_failed_at is null)
     + (select count(*) from vm_queue q where q.user_sub = $1 and q.closed_at is null
          and not exists (select 1 from vms v where v.id = q.vm_id
                          and v.deleted_at is null and v.creation_failed_at is null))";

/// The line an open row stands in: its gpu_type's open rows, oldest first.
const POSITION: &str = "(select count(*) from vm_queue o where o.closed_at is null
       and o.gpu_type = q.gpu_type
       and (o.created_at < q.created_at or (o.created_at = q.created_at and o.id <= q.id)))";

/// A customer's intent to queue (step 58): what to create, and the key to install.
#[derive(Clone, Debug)]
pub struct NewQueued<'a> {
    pub user_sub: &'a str,
    pub gpu_type: &'a str,
    pub ssh_key_id: &'a str,
    /// When it lapses if nobody placed it (`created_at` plus the configured age).
    pub expires_at: DateTime<Utc>,
}

/// What a cancel or an operator's close came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueCloseOutcome {
    Closed,
    /// No open row with that id (for a customer: none of theirs).
    NotOpen,
    /// An attempt is in flight (its instance is being created): nothing changed.
    Placing,
}

/// The queue row's earlier attempt is live (inside a statement on `vm_queue`).
const LIVE_ATTEMPT: &str = "select 1 from vms v where v.id = vm_queue.vm_id
       and v.deleted_at is null and v.creation_failed_at is null";

/// What [`Store::settle_queue_placements`] writes per attempt: the host took its instance.
#[derive(Clone, Copy, Debug)]
pub struct QueuePlaced<'a> {
    pub queue_id: &'a str,
    pub vm_id: &'a str,
    pub host_id: &'a str,
    pub ssh_port: Option<i32>,
    pub how: QueueClose,
}

/// One attempt of [`Store::start_queue_attempts`]: the queue row it is for, the instance
/// row to write (its `user_sub` and `gpu_type` are the queue row's, read under its lock)
/// and the details of its `vm.create` audit entry.
#[derive(Clone, Debug)]
pub struct NewAttempt<'a> {
    pub queue_id: &'a str,
    pub vm: NewVm<'a>,
    pub audit: serde_json::Value,
}

/// An attempt row is live: not deleted, not failed.
const LIVE_VM: &str = "select cast(1 as bigint) from vms where id = $1
       and deleted_at is null and creation_failed_at is null";

impl Store {
    /// Step 58: queue a create with no host, counted against `limit` (live instances and
    /// queued rows) under the user's row lock. `DbError::Refused("instance_limit")` past it.
    pub async fn enqueue_vm(
        &self,
        new: NewQueued<'_>,
        now: DateTime<Utc>,
        limit: u32,
    ) -> Result<QueueRow> {
        in_tx!(self, |tx, for_update| {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select sub from users where sub = $1{for_update}"
            )))
            .bind(new.user_sub)
            .fetch_optional(&mut *tx)
            .await?;
            let held: i64 = sqlx::query_scalar(COUNT_HELD)
                .bind(new.user_sub)
                .fetch_one(&mut *tx)
                .await?;
            if held >= i64::from(limit) {
                return Err(DbError::Refused("instance_limit".into()));
            }
            sqlx::query_as::<_, QueueRow>(sqlx::AssertSqlSafe(format!(
                "insert into vm_queue (id, user_sub, gpu_type, ssh_key_id, created_at, expires_at)
                 values ($1, $2, $3, $4, $5, $6) returning {QUEUE_COLUMNS}"
            )))
            .bind(new_id())
            .bind(new.user_sub)
            .bind(new.gpu_type)
            .bind(new.ssh_key_id)
            .bind(now)
            .bind(new.expires_at)
            .fetch_one(&mut *tx)
            .await
            .map_err(DbError::from)
        })
    }

    /// [`Store::create_vm`] under the per-account limit: the user's row is locked, their
    /// live instances and queued rows counted, and the row written in one transaction, so
    /// two racing creates cannot both pass. `Refused("instance_limit")` past it;
    /// `Conflict("vms_one_live_per_host")` when the host was taken.
    pub async fn create_vm_within_limit(
        &self,
        new: NewVm<'_>,
        created_at: DateTime<Utc>,
        limit: u32,
    ) -> Result<VmRow> {
        in_tx!(self, |tx, for_update| {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select sub from users where sub = $1{for_update}"
            )))
            .bind(new.user_sub)
            .fetch_optional(&mut *tx)
            .await?;
            let held: i64 = sqlx::query_scalar(COUNT_HELD)
                .bind(new.user_sub)
                .fetch_one(&mut *tx)
                .await?;
            if held >= i64::from(limit) {
                return Err(DbError::Refused("instance_limit".into()));
            }
            let inserted = sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(format!(
                "insert into vms (id, user_sub, host_id, name, gpu_type, ssh_hostname, created_at)
                 values ($1, $2, $3, $4, $5, $6, $7) returning {VM_COLUMNS}"
            )))
            .bind(new_id())
            .bind(new.user_sub)
            .bind(new.host_id)
            .bind(new.name)
            .bind(new.gpu_type)
            .bind(new.ssh_hostname)
            .bind(created_at)
            .fetch_one(&mut *tx)
            .await;
            inserted.map_err(live_row_conflict)
        })
    }

    /// How many instances and queued rows `user_sub` holds against the limit.
    pub async fn instances_held(&self, user_sub: &str) -> Result<i64> {
        on_pool!(self, |p| sqlx::query_scalar(COUNT_HELD)
            .bind(user_sub)
            .fetch_one(p)
            .await)
        .map_err(Into::into)
    }

    /// Whether `gpu_type` is staff-only: a profile of it says so (`host_profiles.staff_only`).
    pub async fn gpu_type_staff_only(&self, gpu_type: &str) -> Result<bool> {
        let n: i64 = on_pool!(self, |p| sqlx::query_scalar(
            "select count(*) from host_profiles where gpu_type = $1 and staff_only = true"
        )
        .bind(gpu_type)
        .fetch_one(p)
        .await)?;
        Ok(n > 0)
    }

    pub async fn queue_row(&self, id: &str) -> Result<Option<QueueRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, QueueRow>(
            sqlx::AssertSqlSafe(format!(
                "select {QUEUE_COLUMNS} from vm_queue where id = $1"
            ))
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Open rows with their place in line, oldest first: one user's, or (`None`) everyone's.
    pub async fn open_queue(&self, user_sub: Option<&str>, limit: i64) -> Result<Vec<QueuedRow>> {
        let columns: Vec<String> = QUEUE_COLUMNS
            .split(',')
            .map(|c| format!("q.{}", c.trim()))
            .collect();
        on_pool!(self, |p| sqlx::query_as::<_, QueuedRow>(
            sqlx::AssertSqlSafe(format!(
                "select {}, {POSITION} as position, u.email
                 from vm_queue q join users u on u.sub = q.user_sub
                 where q.closed_at is null and ($1 is null or q.user_sub = $1)
                 order by q.created_at, q.id
                 limit $2",
                columns.join(", ")
            ))
        )
        .bind(user_sub)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// A drainer claims up to `n` open rows no one holds (or whose lease ran out), oldest
    /// first, until `lease_until`, under `token`, leaving out the gpu_types in `skip` (a
    /// run's kinds with no free host). PostgreSQL skips rows another drainer is claiming
    /// (`for update skip locked`); SQLite's statement runs under its write lock.
    pub async fn claim_queue_rows(
        &self,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        token: &str,
        n: i64,
        skip: &[String],
    ) -> Result<Vec<QueueRow>> {
        // On PostgreSQL the locking pick is a materialized CTE: as an `in (subquery)` the
        // planner may run it more than once and claim past the limit.
        let (with, skip_locked, pick) = match self.backend() {
            crate::Backend::Postgres => (
                "with c as materialized (",
                " for update skip locked) ",
                "select id from c",
            ),
            crate::Backend::Sqlite => ("", "", ""),
        };
        let not_in = if skip.is_empty() {
            String::new()
        } else {
            format!(" and gpu_type not in ({})", crate::marks(5, skip.len()))
        };
        let picked = format!(
            "select id from vm_queue
             where closed_at is null and (claimed_until is null or claimed_until <= $1)
               and expires_at > $1{not_in}
             order by created_at, id limit $4"
        );
        let sql = if with.is_empty() {
            format!(
                "update vm_queue set claimed_until = $2, claim_token = $3
                 where id in ({picked})
                   and closed_at is null and (claimed_until is null or claimed_until <= $1)
                   and expires_at > $1
                 returning {QUEUE_COLUMNS}"
            )
        } else {
            format!(
                "{with}{picked}{skip_locked}
                 update vm_queue set claimed_until = $2, claim_token = $3
                 where id in ({pick})
                   and closed_at is null and (claimed_until is null or claimed_until <= $1)
                   and expires_at > $1
                 returning {QUEUE_COLUMNS}"
            )
        };
        let mut rows = on_pool!(self, |p| {
            let mut q = sqlx::query_as::<_, QueueRow>(sqlx::AssertSqlSafe(sql.clone()))
                .bind(now)
                .bind(lease_until)
                .bind(token)
                .bind(n);
            for g in skip {
                q = q.bind(g.as_str());
            }
            q.fetch_all(p).await
        })?;
        rows.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(rows)
    }

    /// Claim one open row by id (an operator placing it by hand), as [`claim_queue_rows`]
    /// would: `None` when it is closed, lapsed or another holds a live lease on it.
    ///
    /// [`claim_queue_rows`]: Store::claim_queue_rows
    pub async fn claim_queue_row(
        &self,
        id: &str,
        now: DateTime<Utc>,
        lease_until: DateTime<Utc>,
        token: &str,
    ) -> Result<Option<QueueRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, QueueRow>(sqlx::AssertSqlSafe(
            format!(
                "update vm_queue set claimed_until = $3, claim_token = $4
                 where id = $1 and closed_at is null and (claimed_until is null or claimed_until <= $2)
                   and expires_at > $2
                 returning {QUEUE_COLUMNS}"
            )
        ))
        .bind(id)
        .bind(now)
        .bind(lease_until)
        .bind(token)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Record on a row this drainer holds why it was not placed (billing refused, the
    /// key removed, …). The claim stays: the run lets go of its rows when it ends.
    pub async fn note_queue_refusal(
        &self,
        id: &str,
        token: &str,
        why: &str,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let why: String = why.chars().take(300).collect();
        let done = on_pool!(self, |p| sqlx::query(
            "update vm_queue set last_error = $3, last_error_at = $4
             where id = $1 and claim_token = $2 and closed_at is null"
        )
        .bind(id)
        .bind(token)
        .bind(why)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// E0's precondition and step 59's attempt for a batch of queue rows, each all or
    /// nothing on its own: per attempt, check this drainer still holds the row and no
    /// attempt of it is live, write the attempt's `vms` row (host, freshly minted name and
    /// SSH name, `created_at`) with its `vm.create` audit entry (the attempt's `audit`
    /// details), point the row at it, count the attempt and extend the lease. One answer
    /// per attempt, in order. On PostgreSQL one statement (the queue rows locked, a host
    /// another writer holds a live row on skipped by `on conflict do nothing`, then, only
    /// when some were not started, one read telling a taken host from a lost claim); on
    /// SQLite one transaction under the write lock. A batch never names one host or one
    /// row twice.
    pub async fn start_queue_attempts(
        &self,
        token: &str,
        attempts: &[NewAttempt<'_>],
        created_at: DateTime<Utc>,
        lease_until: DateTime<Utc>,
    ) -> Result<Vec<QueueAttempt>> {
        let vm_ids: Vec<String> = attempts.iter().map(|_| new_id()).collect();
        let mut started: std::collections::HashMap<String, VmRow> = match &self.pool {
            crate::Pool::Postgres(p) => {
                let col = |f: &dyn Fn(&NewAttempt<'_>) -> Option<String>| -> Vec<Option<String>> {
                    attempts.iter().map(f).collect()
                };
                let sql = format!(
                    "with i as (
                       select * from unnest($1::text[], $2::text[], $3::text[], $4::text[],
                                            $5::text[], $6::text[], $7::text[])
                         as t(queue_id, vm_id, host_id, name, ssh_hostname, audit_id, details)),
                     q as (
                       select vm_queue.id, vm_queue.user_sub, vm_queue.gpu_type from vm_queue
                       where vm_queue.id in (select queue_id from i) and claim_token = $8
                         and closed_at is null and not exists ({LIVE_ATTEMPT})
                       for update),
                     v as (
                       insert into vms (id, user_sub, host_id, name, gpu_type, ssh_hostname, created_at)
                       select i.vm_id, q.user_sub, i.host_id, i.name, q.gpu_type, i.ssh_hostname, $9
                       from i join q on q.id = i.queue_id
                       -- Hosts in one order for every drainer: two batches waiting on each
                       -- other's uncommitted rows would deadlock.
                       order by i.host_id
                       on conflict do nothing
                       returning {VM_COLUMNS}),
                     u as (
                       update vm_queue set vm_id = v.id, attempts = attempts + 1, claimed_until = $10
                       from v join i on i.vm_id = v.id
                       where vm_queue.id = i.queue_id),
                     a as (
                       insert into audit_log (id, at, actor_sub, action, target, details)
                       select i.audit_id, $9, cast(null as text), 'vm.create', v.id,
                              cast(i.details as jsonb)
                       from v join i on i.vm_id = v.id)
                     select {VM_COLUMNS} from v"
                );
                let (queue_ids, host_ids, names, hostnames, details) = (
                    col(&|a| Some(a.queue_id.to_owned())),
                    col(&|a| a.vm.host_id.map(str::to_owned)),
                    col(&|a| Some(a.vm.name.to_owned())),
                    col(&|a| a.vm.ssh_hostname.map(str::to_owned)),
                    col(&|a| Some(a.audit.to_string())),
                );
                retry_deadlock(|| {
                    sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(sql.clone()))
                        .bind(queue_ids.clone())
                        .bind(vm_ids.clone())
                        .bind(host_ids.clone())
                        .bind(names.clone())
                        .bind(hostnames.clone())
                        .bind(col(&|_| Some(new_id())))
                        .bind(details.clone())
                        .bind(token)
                        .bind(created_at)
                        .bind(lease_until)
                        .fetch_all(p)
                })
                .await?
                .into_iter()
                .map(|vm| (vm.id.clone(), vm))
                .collect()
            }
            crate::Pool::Sqlite(p) => {
                let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                let mut started = std::collections::HashMap::new();
                for (a, vm_id) in attempts.iter().zip(&vm_ids) {
                    let inserted = sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(format!(
                        "insert into vms (id, user_sub, host_id, name, gpu_type, ssh_hostname, created_at)
                         select $3, vm_queue.user_sub, $4, $5, vm_queue.gpu_type, $6, $7 from vm_queue
                         where id = $1 and claim_token = $2 and closed_at is null
                           and not exists ({LIVE_ATTEMPT})
                         returning {VM_COLUMNS}"
                    )))
                    .bind(a.queue_id)
                    .bind(token)
                    .bind(vm_id)
                    .bind(a.vm.host_id)
                    .bind(a.vm.name)
                    .bind(a.vm.ssh_hostname)
                    .bind(created_at)
                    .fetch_optional(&mut *tx)
                    .await;
                    // A taken host fails only its own statement; the transaction goes on.
                    let vm = match inserted {
                        Ok(Some(vm)) => vm,
                        Ok(None) => continue,
                        Err(e) => match live_row_conflict(e) {
                            DbError::Conflict(_) => continue,
                            other => return Err(other),
                        },
                    };
                    sqlx::query(
                        "update vm_queue set vm_id = $2, attempts = attempts + 1, claimed_until = $3
                         where id = $1",
                    )
                    .bind(a.queue_id)
                    .bind(&vm.id)
                    .bind(lease_until)
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query(
                        "insert into audit_log (id, at, actor_sub, action, target, details)
                         values ($1, $2, null, 'vm.create', $3, $4)",
                    )
                    .bind(new_id())
                    .bind(created_at)
                    .bind(&vm.id)
                    .bind(sqlx::types::Json(&a.audit))
                    .execute(&mut *tx)
                    .await?;
                    started.insert(vm.id.clone(), vm);
                }
                tx.commit().await?;
                started
            }
        };
        // Of the rows not started, those still held (and with no live attempt) met a taken
        // host; the rest were lost. Read only when some were not started.
        let unstarted: Vec<&str> = attempts
            .iter()
            .zip(&vm_ids)
            .filter(|(_, id)| !started.contains_key(*id))
            .map(|(a, _)| a.queue_id)
            .collect();
        let held = if unstarted.is_empty() {
            Vec::new()
        } else {
            self.queue_rows_held(token, &unstarted).await?
        };
        Ok(attempts
            .iter()
            .zip(vm_ids)
            .map(|(a, id)| match started.remove(&id) {
                Some(vm) => QueueAttempt::Started(Box::new(vm)),
                None if held.iter().any(|h| h == a.queue_id) => QueueAttempt::HostTaken,
                None => QueueAttempt::Lost,
            })
            .collect())
    }

    /// Of `ids`, the open rows `token` holds with no live attempt.
    async fn queue_rows_held(&self, token: &str, ids: &[&str]) -> Result<Vec<String>> {
        let sql = format!(
            "select id from vm_queue where claim_token = $1 and closed_at is null
               and not exists ({LIVE_ATTEMPT}) and id in ({})",
            crate::marks(2, ids.len())
        );
        on_pool!(self, |p| {
            let mut q =
                sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql.clone())).bind(token);
            for id in ids {
                q = q.bind(*id);
            }
            q.fetch_all(p).await
        })
        .map_err(Into::into)
    }

    /// Step 62's ending with the hosts' answers, for a batch of attempts the hosts took:
    /// each instance runs (`ssh_port` as its agent said; guarded by `creating`), each
    /// host's failure count is reset, and each queue row closes naming its instance
    /// (guarded: only an open row whose attempt is `vm_id`). One statement on PostgreSQL,
    /// one transaction on SQLite. Per attempt, in order, whether its row closed.
    pub async fn settle_queue_placements(
        &self,
        placed: &[QueuePlaced<'_>],
        now: DateTime<Utc>,
    ) -> Result<Vec<GuardedWrite>> {
        let closed: Vec<String> = match &self.pool {
            crate::Pool::Postgres(p) => {
                let col = |f: &dyn Fn(&QueuePlaced<'_>) -> String| -> Vec<String> {
                    placed.iter().map(f).collect()
                };
                let (queue_ids, vm_ids, host_ids, ports, hows) = (
                    col(&|x| x.queue_id.to_owned()),
                    col(&|x| x.vm_id.to_owned()),
                    col(&|x| x.host_id.to_owned()),
                    placed.iter().map(|x| x.ssh_port).collect::<Vec<_>>(),
                    col(&|x| x.how.as_str().to_owned()),
                );
                retry_deadlock(|| {
                    sqlx::query_scalar(
                        "with i as (
                           select * from unnest($1::text[], $2::text[], $3::text[], $4::int[],
                                                $5::text[])
                             as t(queue_id, vm_id, host_id, ssh_port, how)),
                         v as (
                           update vms set status = 'running', ssh_port = i.ssh_port
                           from i
                           where vms.id = i.vm_id and vms.status = 'creating'
                             and vms.creation_failed_at is null and vms.deleted_at is null
                           returning vms.id),
                         h as (delete from host_placement where host_id in (select host_id from i)),
                         q as (
                           update vm_queue set closed_at = $6, close_reason = i.how,
                                  claimed_until = null, claim_token = null, last_error = null,
                                  last_error_at = null
                           from i
                           where vm_queue.id = i.queue_id and vm_queue.vm_id = i.vm_id
                             and vm_queue.closed_at is null
                           returning vm_queue.id)
                         select id from q",
                    )
                    .bind(queue_ids.clone())
                    .bind(vm_ids.clone())
                    .bind(host_ids.clone())
                    .bind(ports.clone())
                    .bind(hows.clone())
                    .bind(now)
                    .fetch_all(p)
                })
                .await?
            }
            crate::Pool::Sqlite(p) => {
                let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                let mut closed = Vec::new();
                for x in placed {
                    sqlx::query(
                        "update vms set status = 'running', ssh_port = $2
                         where id = $1 and status = 'creating' and creation_failed_at is null
                           and deleted_at is null",
                    )
                    .bind(x.vm_id)
                    .bind(x.ssh_port)
                    .execute(&mut *tx)
                    .await?;
                    sqlx::query("delete from host_placement where host_id = $1")
                        .bind(x.host_id)
                        .execute(&mut *tx)
                        .await?;
                    let done = sqlx::query(
                        "update vm_queue set closed_at = $3, close_reason = $4, claimed_until = null,
                                claim_token = null, last_error = null, last_error_at = null
                         where id = $1 and vm_id = $2 and closed_at is null",
                    )
                    .bind(x.queue_id)
                    .bind(x.vm_id)
                    .bind(now)
                    .bind(x.how.as_str())
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                    if done == 1 {
                        closed.push(x.queue_id.to_owned());
                    }
                }
                tx.commit().await?;
                closed
            }
        };
        Ok(placed
            .iter()
            .map(|x| GuardedWrite::from_rows(u64::from(closed.iter().any(|c| c == x.queue_id))))
            .collect())
    }

    /// Step 62's ending for an attempt a heartbeat settled running: the row closes naming
    /// it. Guarded: only an open row whose attempt is `vm_id`.
    pub async fn close_queue_placed(
        &self,
        queue_id: &str,
        vm_id: &str,
        how: QueueClose,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| sqlx::query(
            "update vm_queue set closed_at = $3, close_reason = $4, claimed_until = null,
                    claim_token = null, last_error = null, last_error_at = null
             where id = $1 and vm_id = $2 and closed_at is null"
        )
        .bind(queue_id)
        .bind(vm_id)
        .bind(now)
        .bind(how.as_str())
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// The keys `ids` name, as (id, owner, public key), read once per claimed batch: a
    /// key no longer on its row's account is absent or another's (the row is held).
    pub async fn ssh_keys_by_id(&self, ids: &[&str]) -> Result<Vec<(String, String, String)>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "select id, user_sub, public_key from ssh_keys where id in ({})",
            crate::marks(1, ids.len())
        );
        on_pool!(self, |p| {
            let mut q =
                sqlx::query_as::<_, (String, String, String)>(sqlx::AssertSqlSafe(sql.clone()));
            for id in ids {
                q = q.bind(*id);
            }
            q.fetch_all(p).await
        })
        .map_err(Into::into)
    }

    /// The customer cancels (`user_sub` given: only their own row) or an operator closes a
    /// queued row. Refused while an attempt of it is live (`Placing`); nothing changes then.
    pub async fn close_queued(
        &self,
        id: &str,
        user_sub: Option<&str>,
        how: QueueClose,
        now: DateTime<Utc>,
    ) -> Result<QueueCloseOutcome> {
        in_tx!(self, |tx, for_update| {
            let held: Option<QueueRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "select {QUEUE_COLUMNS} from vm_queue
                 where id = $1 and closed_at is null and ($2 is null or user_sub = $2){for_update}"
            )))
            .bind(id)
            .bind(user_sub)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(held) = held else {
                return Ok(QueueCloseOutcome::NotOpen);
            };
            if let Some(vm_id) = &held.vm_id {
                let live: Option<i64> = sqlx::query_scalar(LIVE_VM)
                    .bind(vm_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                if live.is_some() {
                    return Ok(QueueCloseOutcome::Placing);
                }
            }
            sqlx::query(
                "update vm_queue set closed_at = $2, close_reason = $3, claimed_until = null,
                        claim_token = null
                 where id = $1",
            )
            .bind(id)
            .bind(now)
            .bind(how.as_str())
            .execute(&mut *tx)
            .await?;
            Ok(QueueCloseOutcome::Closed)
        })
    }
}

impl Store {
    /// The customer's "keep waiting": their open row lapses at `until` instead. Guarded:
    /// only an open row of theirs (`None` otherwise: someone else's is as absent as none).
    /// A row already past its time but not yet swept is moved too: they asked in time.
    pub async fn extend_queued(
        &self,
        id: &str,
        user_sub: &str,
        until: DateTime<Utc>,
    ) -> Result<Option<QueueRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, QueueRow>(
            sqlx::AssertSqlSafe(format!(
                "update vm_queue set expires_at = $3
                 where id = $1 and user_sub = $2 and closed_at is null
                 returning {QUEUE_COLUMNS}"
            ))
        )
        .bind(id)
        .bind(user_sub)
        .bind(until)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// The expire-queue job's write: close up to `limit` open rows past `expires_at`, oldest
    /// lapse first, that no drainer holds and no attempt of which is live (a create in
    /// flight is the heartbeat's to settle; its row lapses afterwards if it failed). One
    /// statement, each row guarded again as it is written: a drainer's claim taken
    /// meanwhile, or a customer's "keep waiting", wins. The rows it closed.
    pub async fn expire_queued(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<QueueRow>> {
        let lapsed = format!(
            "closed_at is null and expires_at <= $1
             and (claimed_until is null or claimed_until <= $1)
             and not exists ({LIVE_ATTEMPT})"
        );
        on_pool!(self, |p| sqlx::query_as::<_, QueueRow>(
            sqlx::AssertSqlSafe(format!(
                "update vm_queue set closed_at = $1, close_reason = 'expired',
                        claimed_until = null, claim_token = null
                 where id in (select id from vm_queue where {lapsed}
                              order by expires_at, id limit $2)
                   and {lapsed}
                 returning {QUEUE_COLUMNS}"
            ))
        )
        .bind(now)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// A customer's queued creates that ended since `since`, latest first: placed (naming
    /// the instance), cancelled, closed by an operator or expired — what they are told
    /// when a row leaves their list.
    pub async fn ended_queue(
        &self,
        user_sub: &str,
        since: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<QueueRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, QueueRow>(
            sqlx::AssertSqlSafe(format!(
                "select {QUEUE_COLUMNS} from vm_queue
                 where user_sub = $1 and closed_at is not null and closed_at > $2
                 order by closed_at desc, id limit $3"
            ))
        )
        .bind(user_sub)
        .bind(since)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}

/// The only unique an instance insert can meet is the live-row rule (the id is fresh);
/// SQLite names columns rather than the index, so name it here.
/// Run a batch statement on PostgreSQL again when the server broke a deadlock by failing
/// it (it wrote nothing): batches lock several rows, and another writer may lock the same
/// ones in another order.
async fn retry_deadlock<T, F, Fut>(mut run: F) -> std::result::Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, sqlx::Error>>,
{
    let mut tries = 0;
    loop {
        match run().await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("40P01") && tries < 3 => {
                tries += 1;
            }
            other => return other,
        }
    }
}

fn live_row_conflict(e: sqlx::Error) -> DbError {
    match DbError::from(e) {
        DbError::Conflict(_) => DbError::Conflict("vms_one_live_per_host".into()),
        other => other,
    }
}

impl Store {
    /// Let every row a drain run still holds go (the ones it did not place), in one
    /// statement, so the next run or another drainer takes them at once.
    pub async fn release_queue_claims(&self, token: &str) -> Result<u64> {
        on_pool!(self, |p| sqlx::query(
            "update vm_queue set claimed_until = null, claim_token = null
             where claim_token = $1 and closed_at is null"
        )
        .bind(token)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))
        .map_err(Into::into)
    }
}

/// What the queue and its instances add up to, for the drain benchmark's checker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueTally {
    /// Open rows.
    pub open: i64,
    /// Rows closed `placed` or `placed_by_operator`.
    pub placed: i64,
    /// Distinct instances the placed rows name.
    pub placed_instances: i64,
    /// Instance rows of any state.
    pub instances: i64,
    /// Hosts holding more than one live instance row (the schema forbids it).
    pub hosts_with_two_live: i64,
}

impl Store {
    /// How many rows are open (the drain benchmark waits for none).
    pub async fn open_queue_count(&self) -> Result<i64> {
        on_pool!(self, |p| sqlx::query_scalar(
            "select count(*) from vm_queue where closed_at is null"
        )
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    /// The queue's tally (see [`QueueTally`]).
    pub async fn queue_tally(&self) -> Result<QueueTally> {
        let (open, placed, placed_instances, instances, hosts_with_two_live): (
            i64,
            i64,
            i64,
            i64,
            i64,
        ) = on_pool!(self, |p| sqlx::query_as(
            "select
               (select count(*) from vm_queue where closed_at is null),
               (select count(*) from vm_queue
                  where close_reason in ('placed', 'placed_by_operator')),
               (select count(distinct vm_id) from vm_queue
                  where close_reason in ('placed', 'placed_by_operator')),
               (select count(*) from vms),
               (select count(*) from (select host_id from vms
                  where deleted_at is null and creation_failed_at is null
                  group by host_id having count(*) > 1) t)"
        )
        .fetch_one(p)
        .await)?;
        Ok(QueueTally {
            open,
            placed,
            placed_instances,
            instances,
            hosts_with_two_live,
        })
    }
}
