//! The fleet in numbers (issue #38): what `/metrics` exports for an operator to alert on, read
//! in one statement per scrape so the figures agree with each other.

use chrono::{DateTime, Utc};

use crate::{Result, Store};

/// Counts and oldest instants across the fleet, as of one read.
#[derive(Clone, Debug, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct FleetGauges {
    /// Hosts in placement (not retired).
    pub hosts_active: i64,
    /// Hosts taken out of placement (de-pooled, revoking, stopped hosting), not retired.
    pub hosts_depooled: i64,
    /// Hosts that redeemed and have not finished preparing.
    pub hosts_preparing: i64,
    /// Hosts in placement not heard from since `heard_since` (never, or too long ago).
    pub hosts_unreachable: i64,
    /// The oldest last heartbeat among hosts in placement.
    pub oldest_heartbeat: Option<DateTime<Utc>>,
    /// Deletes asked for at or before `stuck_since` and not confirmed.
    pub stuck_deletes: i64,
    /// The oldest delete asked for and not confirmed.
    pub oldest_delete: Option<DateTime<Utc>>,
    /// Rows in the queue not closed, and the oldest of them.
    pub queue_open: i64,
    pub oldest_queued: Option<DateTime<Utc>>,
    /// Instances still `creating`.
    pub creates_open: i64,
    /// Pre-bookings open and not paid.
    pub bookings_unpaid: i64,
    /// Hosts not retired whose last operator-key push failed.
    pub key_pushes_failed: i64,
    /// Fleet-upgrade runs halted (by a failed canary or an operator) and not closed.
    pub fleet_upgrades_halted: i64,
}

/// One job's last runs, for `byo_job_*`.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct JobHealth {
    pub job: String,
    pub last_success: Option<DateTime<Utc>>,
    pub last_run: DateTime<Utc>,
    /// Whether the newest run failed.
    pub last_failed: bool,
}

impl Store {
    /// The fleet's gauges: a host is unreachable when in placement and not heard from since
    /// `heard_since`; a delete is stuck when asked for at or before `stuck_since`.
    pub async fn fleet_gauges(
        &self,
        heard_since: DateTime<Utc>,
        stuck_since: DateTime<Utc>,
    ) -> Result<FleetGauges> {
        on_pool!(self, |p| sqlx::query_as::<_, FleetGauges>(
            "select
               (select count(*) from hosts where retired_at is null and active = true)
                 as hosts_active,
               (select count(*) from hosts
                  where retired_at is null and active = false and depooled_at is not null)
                 as hosts_depooled,
               (select count(*) from hosts
                  where retired_at is null and active = false and depooled_at is null
                    and pubkey is not null and prepared_at is null)
                 as hosts_preparing,
               (select count(*) from hosts h
                  where h.retired_at is null and h.active = true
                    and not exists (select 1 from host_status s
                                    where s.host_id = h.id and s.seen_at >= $1))
                 as hosts_unreachable,
               (select min(s.seen_at) from hosts h join host_status s on s.host_id = h.id
                  where h.retired_at is null and h.active = true)
                 as oldest_heartbeat,
               (select count(*) from vms
                  where delete_requested_at is not null and deleted_at is null
                    and delete_requested_at <= $2)
                 as stuck_deletes,
               (select min(delete_requested_at) from vms
                  where delete_requested_at is not null and deleted_at is null)
                 as oldest_delete,
               (select count(*) from vm_queue where closed_at is null) as queue_open,
               (select min(created_at) from vm_queue where closed_at is null) as oldest_queued,
               (select count(*) from vms
                  where status = 'creating' and creation_failed_at is null and deleted_at is null)
                 as creates_open,
               (select count(*) from prebookings where closed_at is null and paid_at is null)
                 as bookings_unpaid,
               (select count(*) from host_key_pushes k join hosts h on h.id = k.host_id
                  where h.retired_at is null and k.error is not null)
                 as key_pushes_failed,
               (select count(*) from fleet_upgrades where state = 'halted')
                 as fleet_upgrades_halted"
        )
        .bind(heard_since)
        .bind(stuck_since)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    /// Each job that has run: its newest run, its newest success, and whether the newest run
    /// failed.
    pub async fn job_health(&self) -> Result<Vec<JobHealth>> {
        on_pool!(self, |p| sqlx::query_as::<_, JobHealth>(
            "select j.job,
                    (select max(started_at) from job_runs s
                       where s.job = j.job and s.outcome = 'ok') as last_success,
                    j.last_run,
                    (select outcome = 'failed' from job_runs n
                       where n.job = j.job order by started_at desc, id desc limit 1)
                      as last_failed
             from (select job, max(started_at) as last_run from job_runs group by job) j
             order by j.job"
        )
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}

/// One host as the fleet overview reads it (issue #38, 1): the row, its owner's email and
/// how many live instances it holds.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct FleetHostRow {
    #[sqlx(flatten)]
    pub host: crate::hosts::HostRow,
    pub owner_email: String,
    pub live_instances: i64,
}

/// Everything the overview judges, each read once for the whole fleet (not per host): the
/// hosts, their last heartbeats, placement's memory, the deletes nobody confirmed, and
/// the key-list pushes. Five statements whatever the fleet's size.
#[derive(Clone, Debug, Default)]
pub struct FleetRead {
    pub hosts: Vec<FleetHostRow>,
    pub statuses: Vec<crate::hosts::HostStatusRow>,
    pub benches: Vec<crate::vms::HostBenchRow>,
    /// Instance rows whose delete was asked for and never confirmed.
    pub stuck: Vec<crate::vms::VmRow>,
    pub pushes: Vec<crate::operator_keys::HostKeyPushRow>,
}

impl Store {
    /// The fleet overview's read (see [`FleetRead`]): hosts not retired, by slug. Statuses
    /// and benches are every host's (a retired host's are never looked up).
    pub async fn fleet_read(&self) -> Result<FleetRead> {
        let hosts = async {
            Ok::<_, crate::DbError>(on_pool!(self, |p| sqlx::query_as::<_, FleetHostRow>(
                "select h.id, h.slug, h.owner_sub, h.profile_id, h.gpu_type, h.active, h.dedicated,
                    h.dedicated_to, h.placement, h.prepare_state, h.prepared_at, h.pubkey,
                    h.lockout_owner, h.relay_name, h.relay_ip, h.created_at, h.activated_at,
                    h.retired_at, u.email as owner_email,
                    coalesce(v.n, 0) as live_instances
             from hosts h join users u on u.sub = h.owner_sub
             left join (select host_id, count(*) as n from vms
                        where deleted_at is null and creation_failed_at is null
                          and host_id is not null
                        group by host_id) v on v.host_id = h.id
             where h.retired_at is null"
            )
            .fetch_all(p)
            .await)?)
        };
        let statuses = async {
            Ok::<_, crate::DbError>(on_pool!(self, |p| {
                sqlx::query_as::<_, crate::hosts::HostStatusRow>(
            "select host_id, seen_at, agent_version, lxd, relay, tunnel, gpu, storage, instances,
                    details
             from host_status"
        )
        .fetch_all(p)
        .await
            })?)
        };
        let benches = async {
            Ok::<_, crate::DbError>(on_pool!(self, |p| sqlx::query_as::<
                _,
                crate::vms::HostBenchRow,
            >(
                "select b.host_id, b.consecutive_failures, b.last_failure, b.last_failure_at,
                    b.benched_at, s.seen_at
             from host_placement b left join host_status s on s.host_id = b.host_id"
            )
            .fetch_all(p)
            .await)?)
        };
        let stuck = async {
            Ok::<_, crate::DbError>(on_pool!(self, |p| sqlx::query_as::<_, crate::vms::VmRow>(
                sqlx::AssertSqlSafe(format!(
                    "select {} from vms
                 where deleted_at is null and delete_requested_at is not null",
                    crate::vms::VM_COLUMNS
                ))
            )
            .fetch_all(p)
            .await)?)
        };
        // Only the hosts that were pushed to (a host never pushed to has no row to judge).
        let pushes = async {
            Ok::<_, crate::DbError>(on_pool!(self, |p| sqlx::query_as::<
                _,
                crate::operator_keys::HostKeyPushRow,
            >(
                "select k.host_id, h.slug, k.version, k.attempted_at, k.error
             from host_key_pushes k join hosts h on h.id = k.host_id
             where h.retired_at is null"
            )
            .fetch_all(p)
            .await)?)
        };
        // The five at once, each on its own connection: the read costs its slowest part.
        let (mut hosts, statuses, benches, stuck, pushes) =
            tokio::try_join!(hosts, statuses, benches, stuck, pushes)?;
        // By slug, sorted here: the database's collation sort cost more than the read.
        hosts.sort_unstable_by(|a, b| a.host.slug.cmp(&b.host.slug));
        Ok(FleetRead {
            hosts,
            statuses,
            benches,
            stuck,
            pushes,
        })
    }
}
