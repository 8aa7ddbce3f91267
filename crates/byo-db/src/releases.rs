//! Published agent builds and fleet upgrades (issue #14, items 1 and 5; migration 0018).
//! A release row is written only after the server verified its signature; the newest row of
//! an arch is what the installer's path serves. A fleet upgrade is one run row and a row per
//! host, written as `byo fleet upgrade` goes, so it can be resumed and /admin shows it.

use byo_wire::states::{FleetHostState, FleetRunState};
use chrono::{DateTime, Utc};

use crate::{DbError, Result, Store, new_id};

#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize)]
pub struct ReleaseRow {
    pub id: String,
    pub arch: String,
    pub version: String,
    pub sha256: String,
    pub build: String,
    pub signature: String,
    pub size_bytes: i64,
    pub published_by: String,
    pub published_at: DateTime<Utc>,
}

#[derive(Clone, Debug)]
pub struct NewRelease<'a> {
    pub arch: &'a str,
    pub version: &'a str,
    pub sha256: &'a str,
    pub signature: &'a str,
    pub size_bytes: i64,
    pub published_by: &'a str,
}

const RELEASE_COLUMNS: &str =
    "id, arch, version, sha256, build, signature, size_bytes, published_by, published_at";

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct FleetRunRow {
    pub id: String,
    pub build: String,
    #[sqlx(try_from = "String")]
    pub state: FleetRunState,
    pub canary: i32,
    pub growth: i32,
    pub wait_secs: i32,
    pub halt_reason: Option<String>,
    pub started_by: String,
    pub started_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub closed_at: Option<DateTime<Utc>>,
}

const RUN_COLUMNS: &str = "id, build, state, canary, growth, wait_secs, halt_reason, started_by, \
                           started_at, updated_at, closed_at";

/// One host of a run, with what the judge and the pages need about the host now.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct FleetHostRow {
    pub host_id: String,
    pub slug: String,
    pub tunnel_hostname: Option<String>,
    pub position: i32,
    pub wave: i32,
    #[sqlx(try_from = "String")]
    pub state: FleetHostState,
    pub reason: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub judged_at: Option<DateTime<Utc>>,
}

/// A host a fleet upgrade may cover (prepared, not retired), with the facts the planner
/// judges it by.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct FleetCandidateRow {
    pub host_id: String,
    pub slug: String,
    /// node0's `uname -m`, as it enrolled.
    pub arch: Option<String>,
    /// Out of placement: inactive after a de-pool or a revoke.
    pub depooled: bool,
    /// An instance is being created, or its delete is requested and not confirmed.
    pub mid_create: bool,
    pub agent_version: Option<String>,
}

/// A new run's host.
#[derive(Clone, Debug)]
pub struct NewFleetHost {
    pub host_id: String,
    pub wave: i32,
    pub state: FleetHostState,
    pub reason: Option<String>,
}

impl Store {
    /// Record a verified build. `agent_releases_once` refuses the same bytes for the same
    /// arch twice (`DbError::Conflict`).
    pub async fn insert_release(
        &self,
        new: NewRelease<'_>,
        now: DateTime<Utc>,
    ) -> Result<ReleaseRow> {
        let build = byo_core::release::build_id(new.sha256);
        on_pool!(self, |p| sqlx::query_as::<_, ReleaseRow>(
            sqlx::AssertSqlSafe(format!(
                "insert into agent_releases
               (id, arch, version, sha256, build, signature, size_bytes, published_by, published_at)
             values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             returning {RELEASE_COLUMNS}"
            ))
        )
        .bind(new_id())
        .bind(new.arch)
        .bind(new.version)
        .bind(new.sha256)
        .bind(&build)
        .bind(new.signature)
        .bind(new.size_bytes)
        .bind(new.published_by)
        .bind(now)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    /// Every published build, newest first.
    pub async fn releases(&self, limit: i64) -> Result<Vec<ReleaseRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, ReleaseRow>(
            sqlx::AssertSqlSafe(format!(
                "select {RELEASE_COLUMNS} from agent_releases
             order by published_at desc, id desc limit $1"
            ))
        )
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The build the installer serves for `arch`: the newest published.
    pub async fn newest_release(&self, arch: &str) -> Result<Option<ReleaseRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, ReleaseRow>(
            sqlx::AssertSqlSafe(format!(
                "select {RELEASE_COLUMNS} from agent_releases where arch = $1
             order by published_at desc, id desc limit 1"
            ))
        )
        .bind(arch)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// The releases of one build (its 12-hex name), one per arch it was published for.
    pub async fn releases_of_build(&self, build: &str) -> Result<Vec<ReleaseRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, ReleaseRow>(
            sqlx::AssertSqlSafe(format!(
                "select {RELEASE_COLUMNS} from agent_releases where build = $1 order by arch"
            ))
        )
        .bind(build)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Every host a fleet upgrade may cover, by slug.
    pub async fn fleet_candidates(&self) -> Result<Vec<FleetCandidateRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, FleetCandidateRow>(
            "select h.id as host_id, h.slug,
                    (select n.fingerprint ->> 'arch' from host_nodes n
                      where n.host_id = h.id and n.\"index\" = 0) as arch,
                    (h.active = false and (h.depooled_at is not null
                                           or h.revoke_requested_at is not null)) as depooled,
                    exists (select 1 from vms v where v.host_id = h.id and v.deleted_at is null
                              and v.creation_failed_at is null
                              and (v.status = 'creating' or v.delete_requested_at is not null))
                      as mid_create,
                    s.agent_version
             from hosts h left join host_status s on s.host_id = h.id
             where h.retired_at is null and h.prepared_at is not null
             order by h.slug"
        )
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Open a run with its hosts, in one transaction. `fleet_upgrades_one_open` refuses a
    /// second open run (`DbError::Conflict`), whoever writes.
    pub async fn open_fleet_run(
        &self,
        build: &str,
        (canary, growth, wait_secs): (i32, i32, i32),
        hosts: &[NewFleetHost],
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<FleetRunRow> {
        let id = new_id();
        let run = in_tx!(self, |tx, _for_update| {
            let run = sqlx::query_as::<_, FleetRunRow>(sqlx::AssertSqlSafe(format!(
                "insert into fleet_upgrades
                   (id, build, state, open_marker, canary, growth, wait_secs, started_by,
                    started_at, updated_at)
                 values ($1, $2, 'running', 'open', $3, $4, $5, $6, $7, $7)
                 returning {RUN_COLUMNS}"
            )))
            .bind(&id)
            .bind(build)
            .bind(canary)
            .bind(growth)
            .bind(wait_secs)
            .bind(by)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            for (position, h) in hosts.iter().enumerate() {
                sqlx::query(
                    "insert into fleet_upgrade_hosts
                       (run_id, host_id, position, wave, state, reason, judged_at)
                     values ($1, $2, $3, $4, $5, $6, $7)",
                )
                .bind(&id)
                .bind(&h.host_id)
                .bind(i32::try_from(position).unwrap_or(i32::MAX))
                .bind(h.wave)
                .bind(h.state.as_str())
                .bind(h.reason.as_deref())
                .bind((h.state != FleetHostState::Waiting).then_some(now))
                .execute(&mut *tx)
                .await?;
            }
            run
        });
        Ok(run)
    }

    /// The open run (running or halted), if there is one.
    pub async fn open_fleet_run_row(&self) -> Result<Option<FleetRunRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, FleetRunRow>(
            sqlx::AssertSqlSafe(format!(
                "select {RUN_COLUMNS} from fleet_upgrades where open_marker = 'open'"
            ))
        )
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn fleet_run(&self, id: &str) -> Result<Option<FleetRunRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, FleetRunRow>(
            sqlx::AssertSqlSafe(format!(
                "select {RUN_COLUMNS} from fleet_upgrades where id = $1"
            ))
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// The newest runs, newest first.
    pub async fn fleet_runs(&self, limit: i64) -> Result<Vec<FleetRunRow>> {
        on_pool!(self, |p| {
            sqlx::query_as::<_, FleetRunRow>(sqlx::AssertSqlSafe(format!(
            "select {RUN_COLUMNS} from fleet_upgrades order by started_at desc, id desc limit $1"
        )))
        .bind(limit)
        .fetch_all(p)
        .await
        })
        .map_err(Into::into)
    }

    /// A run's hosts, in the order they were planned.
    pub async fn fleet_run_hosts(&self, run_id: &str) -> Result<Vec<FleetHostRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, FleetHostRow>(
            "select f.host_id, h.slug, h.tunnel_hostname, f.position, f.wave, f.state, f.reason,
                    f.started_at, f.judged_at
             from fleet_upgrade_hosts f join hosts h on h.id = f.host_id
             where f.run_id = $1 order by f.position"
        )
        .bind(run_id)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Move one host of an open run from `from` to `to`: `upgrading` stamps `started_at`,
    /// the verdicts stamp `judged_at`. `false` when the host was not in `from` (another
    /// caller moved it first) or the run is closed: nothing written.
    pub async fn move_fleet_host(
        &self,
        run_id: &str,
        host_id: &str,
        from: FleetHostState,
        to: FleetHostState,
        reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let upgrading = to == FleetHostState::Upgrading;
        let judged = matches!(
            to,
            FleetHostState::Healthy | FleetHostState::Failed | FleetHostState::Skipped
        );
        let rows = on_pool!(self, |p| sqlx::query(
            "update fleet_upgrade_hosts set state = $4, reason = $5,
                    started_at = case when $6 then $8 else started_at end,
                    judged_at = case when $7 then $8 else null end
             where run_id = $1 and host_id = $2 and state = $3
               and exists (select 1 from fleet_upgrades r where r.id = $1 and r.state <> 'closed')"
        )
        .bind(run_id)
        .bind(host_id)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(reason)
        .bind(upgrading)
        .bind(judged)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(rows == 1)
    }

    /// Move an open run between running and halted (with the reason), or close it.
    /// `false` when it was not in `from`.
    pub async fn move_fleet_run(
        &self,
        run_id: &str,
        from: FleetRunState,
        to: FleetRunState,
        halt_reason: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        if from == FleetRunState::Closed {
            return Err(DbError::Refused(
                "fleet_upgrades_closed_stays_closed".into(),
            ));
        }
        let closing = to == FleetRunState::Closed;
        let rows = on_pool!(self, |p| sqlx::query(
            "update fleet_upgrades set state = $3,
                    halt_reason = case when $3 = 'halted' then $4 else halt_reason end,
                    open_marker = case when $5 then null else open_marker end,
                    closed_at = case when $5 then $6 else closed_at end,
                    updated_at = $6
             where id = $1 and state = $2"
        )
        .bind(run_id)
        .bind(from.as_str())
        .bind(to.as_str())
        .bind(halt_reason)
        .bind(closing)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(rows == 1)
    }
}
