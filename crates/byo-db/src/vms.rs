//! Instances. Two facts end one (G): `delete_requested_at` when a delete is accepted and
//! `deleted_at` when the container is confirmed gone. Both writes are guarded by
//! `is null`, so whichever lands first wins and the other is a no-op.
//!
//! A row is *live* while `deleted_at` and `creation_failed_at` are both null; a host holding
//! a live row is never picked (E2, G.2), and `vms_one_live_per_host` makes that a rule for
//! every writer.

use byo_wire::states::VmStatus;
use chrono::{DateTime, Utc};

use crate::hosts::AgentTargetRow;
use crate::{DbError, GuardedWrite, Result, Store, new_id};

/// What a placement pick is for and when ([`Store::pick_hosts_for_gpu`]). Time is the
/// caller's: `now`, and `pins_from`, the end of the launcher's next tick, so a booking
/// whose window opens before the launcher runs again already holds its host.
#[derive(Clone, Copy, Debug)]
pub struct HostPick<'a> {
    pub gpu_type: &'a str,
    pub user_sub: &'a str,
    /// Only hosts heard from at or after this.
    pub seen_since: DateTime<Utc>,
    pub now: DateTime<Utc>,
    /// A paid booking whose window starts at or before this holds its pinned host.
    pub pins_from: DateTime<Utc>,
    /// The booking being launched (E3): its own pin is not held against it.
    pub booking: Option<&'a str>,
}

impl<'a> HostPick<'a> {
    /// A pick at `now` protecting pins whose window has begun by `now` (no lead).
    pub fn new(
        gpu_type: &'a str,
        user_sub: &'a str,
        seen_since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Self {
        HostPick {
            gpu_type,
            user_sub,
            seen_since,
            now,
            pins_from: now,
            booking: None,
        }
    }
}

/// A picked host and whether it is the user's dedicated box (those come first).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct PickedHost {
    #[sqlx(flatten)]
    pub target: AgentTargetRow,
    pub dedicated: bool,
}

/// The columns every [`VmRow`] is read with.
pub(crate) const VM_COLUMNS: &str = "id, user_sub, host_id, name, gpu_type, ssh_hostname, ssh_port, status, \
     created_at, creation_failed_at, delete_requested_at, deleted_at";

/// An instance as its customer's list shows it: the row and its host's relay address.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ListedVm {
    #[sqlx(flatten)]
    pub vm: VmRow,
    pub relay_ip: Option<String>,
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct VmRow {
    pub id: String,
    pub user_sub: String,
    pub host_id: Option<String>,
    pub name: String,
    pub gpu_type: String,
    pub ssh_hostname: Option<String>,
    /// The port on the host the relay's :22 forwards to, as the agent answered.
    pub ssh_port: Option<i32>,
    #[sqlx(try_from = "String")]
    pub status: VmStatus,
    pub created_at: DateTime<Utc>,
    pub creation_failed_at: Option<DateTime<Utc>>,
    pub delete_requested_at: Option<DateTime<Utc>>,
    pub deleted_at: Option<DateTime<Utc>>,
}

impl VmRow {
    /// Where it is in its life, judged as every reader judges it.
    pub fn phase(&self) -> byo_wire::states::InstancePhase {
        byo_wire::states::InstancePhase::of(
            self.status,
            self.creation_failed_at.is_some(),
            self.delete_requested_at.is_some(),
            self.deleted_at.is_some(),
        )
    }
}

/// A live instance as the operator's list shows it.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct LiveVmRow {
    #[sqlx(flatten)]
    pub vm: VmRow,
    pub host_slug: Option<String>,
    pub owner_email: String,
}

#[derive(Clone, Debug)]
pub struct NewVm<'a> {
    pub user_sub: &'a str,
    pub host_id: Option<&'a str>,
    pub name: &'a str,
    pub gpu_type: &'a str,
    pub ssh_hostname: Option<&'a str>,
}

impl Store {
    /// Write the row, host and name in one statement, with `created_at` as committed
    /// before the host is contacted (step 44). A host that already holds a live row is a
    /// [`DbError::Conflict`] naming `vms_one_live_per_host` (the loser of a race for it).
    pub async fn create_vm(&self, new: NewVm<'_>, created_at: DateTime<Utc>) -> Result<VmRow> {
        on_pool!(self, |p| sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(
            format!(
                "insert into vms (id, user_sub, host_id, name, gpu_type, ssh_hostname, created_at)
             values ($1, $2, $3, $4, $5, $6, $7)
             returning {VM_COLUMNS}"
            )
        ))
        .bind(new_id())
        .bind(new.user_sub)
        .bind(new.host_id)
        .bind(new.name)
        .bind(new.gpu_type)
        .bind(new.ssh_hostname)
        .bind(created_at)
        .fetch_one(p)
        .await)
        .map_err(|e| match DbError::from(e) {
            // The id is fresh, so the only unique this insert can meet is the live-row
            // rule; SQLite names columns rather than the index, so name it here.
            DbError::Conflict(_) => DbError::Conflict("vms_one_live_per_host".into()),
            other => other,
        })
    }

    pub async fn vm(&self, id: &str) -> Result<Option<VmRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(
            format!("select {VM_COLUMNS} from vms where id = $1")
        ))
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// The backend accepted a delete. Stops nothing; billing continues.
    pub async fn request_vm_delete(&self, id: &str, now: DateTime<Utc>) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
            "update vms set delete_requested_at = $2 where id = $1 and delete_requested_at is null"
        )
        .bind(id)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// The container is confirmed gone (a 404 from the agent confirms). Billing stops here.
    pub async fn confirm_vm_deleted(&self, id: &str, now: DateTime<Utc>) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            // A row still `creating` never ran as far as anyone knows (issue #39): its
            // delete stamps `creation_failed_at` too, so it bills nothing.
            sqlx::query(
                "update vms set deleted_at = $2, status = 'deleted',
                    creation_failed_at = case when status = 'creating'
                                              then coalesce(creation_failed_at, $2)
                                              else creation_failed_at end
             where id = $1 and deleted_at is null",
            )
            .bind(id)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }
}

impl Store {
    /// A start, stop or reboot the host carried out: `running` or `stopped`. Only a live
    /// instance moves (not one being created, failed, or given up by a delete).
    pub async fn set_vm_power(&self, id: &str, status: VmStatus) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
                "update vms set status = $2
                 where id = $1 and status in ('running', 'stopped') and creation_failed_at is null
                   and delete_requested_at is null and deleted_at is null",
            )
            .bind(id)
            .bind(status.as_str())
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// The host took the instance: it runs, and the relay forwards to `ssh_port`. Only a
    /// row still being created moves (a create already marked failed stays failed).
    pub async fn mark_vm_running(&self, id: &str, ssh_port: Option<i32>) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
            "update vms set status = 'running', ssh_port = $2
             where id = $1 and status = 'creating' and creation_failed_at is null and deleted_at is null"
        )
        .bind(id)
        .bind(ssh_port)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// A create the host refused or never answered (step 44): the row stops being live,
    /// which frees its host, and bills nothing. Guarded by `creation_failed_at is null`.
    /// Creates nobody settled (issue #39): rows still `creating` — not failed, not deleted —
    /// made at or before `made_by`, oldest first, at most `limit`. The heartbeat settles a
    /// host's creates at its first beat after their deadline, so a row still open well past
    /// it is on a host that has not beaten since.
    pub async fn unsettled_creates(
        &self,
        made_by: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<VmRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(
            format!(
                "select {VM_COLUMNS} from vms
             where status = 'creating' and creation_failed_at is null and deleted_at is null
               and created_at <= $1
             order by created_at, id limit $2"
            )
        ))
        .bind(made_by)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn mark_vm_creation_failed(
        &self,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| sqlx::query(
            "update vms set creation_failed_at = $2, status = 'failed'
             where id = $1 and creation_failed_at is null and status = 'creating'"
        )
        .bind(id)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// Every live instance (not deleted, not failed), oldest first, with its host's slug
    /// and its owner's email: the operator's list, in one query.
    pub async fn live_vms(&self) -> Result<Vec<LiveVmRow>> {
        let columns: Vec<String> = VM_COLUMNS
            .split(',')
            .map(|c| format!("v.{}", c.trim()))
            .collect();
        on_pool!(self, |p| sqlx::query_as::<_, LiveVmRow>(
            sqlx::AssertSqlSafe(format!(
                "select {}, h.slug as host_slug, u.email as owner_email
             from vms v join users u on u.sub = v.user_sub left join hosts h on h.id = v.host_id
             where v.deleted_at is null and v.creation_failed_at is null
             order by v.created_at, v.id",
                columns.join(", ")
            ))
        )
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// A customer's instances: every live one, and those that ended after `since`, newest
    /// first.
    pub async fn vms_of(&self, user_sub: &str, since: DateTime<Utc>) -> Result<Vec<VmRow>> {
        Ok(self
            .listed_vms_of(user_sub, since)
            .await?
            .into_iter()
            .map(|l| l.vm)
            .collect())
    }

    /// [`Store::vms_of`], each with its host's relay address, in one statement: the
    /// customer's instance list (`GET /api/vms`, the instances page) names where each is
    /// reached.
    pub async fn listed_vms_of(
        &self,
        user_sub: &str,
        since: DateTime<Utc>,
    ) -> Result<Vec<ListedVm>> {
        on_pool!(self, |p| sqlx::query_as::<_, ListedVm>(
            sqlx::AssertSqlSafe(format!(
                "select {VM_COLUMNS},
                    (select h.relay_ip from hosts h where h.id = vms.host_id) as relay_ip
             from vms
             where user_sub = $1
               and ((deleted_at is null and creation_failed_at is null)
                    or deleted_at > $2 or creation_failed_at > $2)
             order by created_at desc, id
             limit 200"
            ))
        )
        .bind(user_sub)
        .bind(since)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// pick_hosts_for_gpu: the hosts a create of `pick.gpu_type` for `pick.user_sub` may
    /// land on — active (so prepared, D.3), not retired, of that gpu_type, reachable (an
    /// agent token and a relay address), in the shared placement or dedicated to this user,
    /// holding no live instance, **heard from**: a heartbeat at or after `seen_since` (we
    /// trust the absence of a heartbeat; a host that never beat is not picked), **not
    /// benched** (a bench holds until a heartbeat later than it, or an operator clears it),
    /// and **not pinned by a paid booking in its window** (E3.2): an open, paid pre-booking
    /// whose window has begun or begins by `pins_from` (now plus the launcher's tick) and
    /// has not ended at `now` holds its host for its booker's launch alone (`booking`, the
    /// launch of that booking, is the one pick that sees it). The user's own dedicated
    /// boxes come first. Every caller that picks (E1's create, E2's drain, E3's launch)
    /// goes through this one statement.
    pub async fn pick_hosts_for_gpu(&self, pick: HostPick<'_>) -> Result<Vec<AgentTargetRow>> {
        Ok(self
            .pick_first_hosts_for_gpu(pick, i64::MAX)
            .await?
            .into_iter()
            .map(|h| h.target)
            .collect())
    }

    /// [`pick_hosts_for_gpu`](Store::pick_hosts_for_gpu)'s first `n` hosts: the queue's
    /// drain, which tries a few candidates per row however many hosts are free.
    pub async fn pick_first_hosts_for_gpu(
        &self,
        pick: HostPick<'_>,
        n: i64,
    ) -> Result<Vec<PickedHost>> {
        on_pool!(self, |p| sqlx::query_as::<_, PickedHost>(
            "select h.id, h.slug, h.relay_ip, h.agent_token, h.dedicated
             from hosts h join host_status s on s.host_id = h.id
             left join host_placement b on b.host_id = h.id
             where h.gpu_type = $1
               and h.active = true and h.prepared_at is not null and h.retired_at is null
               and h.agent_token is not null and h.relay_ip is not null
               and ((h.dedicated = false and h.placement = 'shared')
                    or (h.dedicated = true and h.dedicated_to = $2))
               and s.seen_at >= $3
               and (b.benched_at is null or s.seen_at > b.benched_at)
               and not exists (select 1 from vms v where v.host_id = h.id
                               and v.deleted_at is null and v.creation_failed_at is null)
               and not exists (select 1 from prebookings pb where pb.host_id = h.id
                               and pb.closed_at is null and pb.paid_at is not null
                               and pb.start_date <= $5 and pb.end_date > $6
                               and ($7 is null or pb.id <> $7))
             order by h.dedicated desc, h.activated_at, h.slug
             limit $4"
        )
        .bind(pick.gpu_type)
        .bind(pick.user_sub)
        .bind(pick.seen_since)
        .bind(n)
        .bind(pick.pins_from)
        .bind(pick.now)
        .bind(pick.booking)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The live rows on one host (not deleted, not failed), oldest first: what a heartbeat's
    /// list of held instances is compared with.
    pub async fn live_vms_on_host(&self, host_id: &str) -> Result<Vec<VmRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(
            format!(
                "select {VM_COLUMNS} from vms
             where host_id = $1 and deleted_at is null and creation_failed_at is null
             order by created_at, id
             limit 100"
            )
        ))
        .bind(host_id)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}

/// What placement remembers of a host (migration 0008): the creates it failed in a row and
/// its bench. The bench is *in effect* until a heartbeat later than it arrives.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct HostBenchRow {
    pub host_id: String,
    pub consecutive_failures: i32,
    /// Why the last create failed there, as the agent (or its silence) said.
    pub last_failure: Option<String>,
    pub last_failure_at: Option<DateTime<Utc>>,
    pub benched_at: Option<DateTime<Utc>>,
    /// The host's last heartbeat, if it ever beat.
    pub seen_at: Option<DateTime<Utc>>,
}

impl HostBenchRow {
    /// Benched and no heartbeat since: pick_hosts_for_gpu skips the host.
    pub fn in_effect(&self) -> bool {
        match (self.benched_at, self.seen_at) {
            (Some(benched), Some(seen)) => seen <= benched,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }
}

/// What [`Store::record_placement_failure`] left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementScore {
    pub consecutive_failures: i32,
    /// The host is benched from this failure's time.
    pub benched: bool,
}

impl Store {
    /// A create this host refused or never took: count it, and bench the host once it has
    /// failed `bench_after` in a row (a bench already lifted by a heartbeat is set again
    /// at the next failure, since the count runs on until a create succeeds or an operator
    /// clears it).
    pub async fn record_placement_failure(
        &self,
        host_id: &str,
        reason: &str,
        bench_after: u32,
        now: DateTime<Utc>,
    ) -> Result<PlacementScore> {
        let bench_after = i32::try_from(bench_after.max(1)).unwrap_or(i32::MAX);
        let reason: String = reason.chars().take(300).collect();
        let failures: i32 = on_pool!(self, |p| sqlx::query_scalar(
            "insert into host_placement
               (host_id, consecutive_failures, last_failure, last_failure_at, benched_at)
             values ($1, 1, $2, $3, case when 1 >= $4 then $3 else null end)
             on conflict (host_id) do update set
               consecutive_failures = host_placement.consecutive_failures + 1,
               last_failure = excluded.last_failure,
               last_failure_at = excluded.last_failure_at,
               benched_at = case when host_placement.consecutive_failures + 1 >= $4
                                 then excluded.last_failure_at else host_placement.benched_at end
             returning consecutive_failures"
        )
        .bind(host_id)
        .bind(&reason)
        .bind(now)
        .bind(bench_after)
        .fetch_one(p)
        .await)?;
        Ok(PlacementScore {
            consecutive_failures: failures,
            benched: failures >= bench_after,
        })
    }

    /// A create the host took: its count of failures starts again and any bench ends.
    pub async fn record_placement_success(&self, host_id: &str) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "delete from host_placement where host_id = $1"
        )
        .bind(host_id)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// An operator clears a host's bench and its count. `false` when there was none.
    pub async fn clear_placement_bench(&self, host_id: &str) -> Result<bool> {
        let done = on_pool!(self, |p| sqlx::query(
            "delete from host_placement where host_id = $1"
        )
        .bind(host_id)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done > 0)
    }

    /// What placement remembers of a host, with its last heartbeat (for /admin).
    pub async fn host_bench(&self, host_id: &str) -> Result<Option<HostBenchRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, HostBenchRow>(
            "select b.host_id, b.consecutive_failures, b.last_failure, b.last_failure_at,
                    b.benched_at, s.seen_at
             from host_placement b left join host_status s on s.host_id = b.host_id
             where b.host_id = $1"
        )
        .bind(host_id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }
}

/// A delete that was accepted and is not confirmed (notify-stuck-deletes).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct StuckDeleteRow {
    pub id: String,
    pub name: String,
    pub user_sub: String,
    pub host_id: Option<String>,
    pub host_slug: Option<String>,
    pub delete_requested_at: DateTime<Utc>,
}

impl Store {
    /// Rows whose delete was requested at or before `requested_before` and never
    /// confirmed, oldest first (step 80 is what this scans for).
    pub async fn stuck_deletes(
        &self,
        requested_before: DateTime<Utc>,
    ) -> Result<Vec<StuckDeleteRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, StuckDeleteRow>(
            "select v.id, v.name, v.user_sub, v.host_id, h.slug as host_slug, v.delete_requested_at
             from vms v left join hosts h on h.id = v.host_id
             where v.deleted_at is null and v.delete_requested_at is not null
               and v.delete_requested_at <= $1
             order by v.delete_requested_at, v.id
             limit 1000"
        )
        .bind(requested_before)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}
