//! The customer's path walked before a customer walks it (issue #38, 4): `path_walks`, one row
//! per walk, at most one running per host (`path_walks_one_running`).

use chrono::{DateTime, Utc};

use crate::{Result, Store, new_id};

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct PathWalkRow {
    pub id: String,
    pub host_id: String,
    pub vm_name: String,
    pub by_sub: Option<String>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// None while it runs.
    pub passed: Option<bool>,
    /// Where a failed walk stopped: `create`, `ssh` or `delete`.
    pub stage: Option<String>,
    pub error: Option<String>,
    pub create_ms: Option<i32>,
    pub ssh_ms: Option<i32>,
    pub delete_ms: Option<i32>,
}

/// How a walk ended.
#[derive(Clone, Debug, Default)]
pub struct WalkEnd<'a> {
    pub passed: bool,
    pub stage: Option<&'a str>,
    pub error: Option<&'a str>,
    pub create_ms: Option<i32>,
    pub ssh_ms: Option<i32>,
    pub delete_ms: Option<i32>,
}

const WALK_COLUMNS: &str = "id, host_id, vm_name, by_sub, started_at, finished_at, passed, stage, \
                            error, create_ms, ssh_ms, delete_ms";

/// What a walk that never ended (its server stopped) is closed with.
pub const WALK_ABANDONED: &str = "the walk did not end: the server running it stopped";

impl Store {
    /// Start a walk of `host_id` with scratch instance `vm_name`, or `None` when one is
    /// already running. A walk still open from before `stale_before` is closed first as
    /// failed ([`WALK_ABANDONED`]): nothing is left to finish it.
    pub async fn start_path_walk(
        &self,
        host_id: &str,
        vm_name: &str,
        by_sub: Option<&str>,
        now: DateTime<Utc>,
        stale_before: DateTime<Utc>,
    ) -> Result<Option<PathWalkRow>> {
        let started = in_tx!(self, |tx, _for_update| {
            sqlx::query(
                "update path_walks set finished_at = $1, passed = false, error = $2
                 where host_id = $3 and finished_at is null and started_at < $4",
            )
            .bind(now)
            .bind(WALK_ABANDONED)
            .bind(host_id)
            .bind(stale_before)
            .execute(&mut *tx)
            .await?;
            sqlx::query_as::<_, PathWalkRow>(sqlx::AssertSqlSafe(format!(
                "insert into path_walks (id, host_id, vm_name, by_sub, started_at)
                 values ($1, $2, $3, $4, $5)
                 on conflict (host_id) where finished_at is null do nothing
                 returning {WALK_COLUMNS}"
            )))
            .bind(new_id())
            .bind(host_id)
            .bind(vm_name)
            .bind(by_sub)
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?
        });
        Ok(started)
    }

    /// Close a running walk with its verdict; a walk already closed is left as it is.
    pub async fn finish_path_walk(
        &self,
        id: &str,
        end: &WalkEnd<'_>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "update path_walks set finished_at = $1, passed = $2, stage = $3, error = $4,
                    create_ms = $5, ssh_ms = $6, delete_ms = $7
             where id = $8 and finished_at is null"
        )
        .bind(now)
        .bind(end.passed)
        .bind(end.stage)
        .bind(end.error)
        .bind(end.create_ms)
        .bind(end.ssh_ms)
        .bind(end.delete_ms)
        .bind(id)
        .execute(p)
        .await
        .map(drop))?;
        Ok(())
    }

    /// The host's newest walk, running or ended.
    pub async fn latest_path_walk(&self, host_id: &str) -> Result<Option<PathWalkRow>> {
        Ok(self.latest_path_walks(&[host_id]).await?.pop())
    }

    /// Each of these hosts' newest walk (a host never walked has none), in host order.
    pub async fn latest_path_walks(&self, host_ids: &[&str]) -> Result<Vec<PathWalkRow>> {
        if host_ids.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "select {WALK_COLUMNS} from path_walks w where host_id in ({})
             and not exists (select 1 from path_walks n where n.host_id = w.host_id
                 and (n.started_at > w.started_at or (n.started_at = w.started_at and n.id > w.id)))
             order by host_id",
            crate::marks(1, host_ids.len())
        );
        on_pool!(self, |p| {
            let mut q = sqlx::query_as::<_, PathWalkRow>(sqlx::AssertSqlSafe(sql.clone()));
            for id in host_ids {
                q = q.bind(*id);
            }
            q.fetch_all(p).await
        })
        .map_err(Into::into)
    }

    /// The host's `limit` newest walks, newest first.
    pub async fn path_walks_of(&self, host_id: &str, limit: i64) -> Result<Vec<PathWalkRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, PathWalkRow>(
            sqlx::AssertSqlSafe(format!(
                "select {WALK_COLUMNS} from path_walks where host_id = $1
                 order by started_at desc, id desc limit $2"
            ))
        )
        .bind(host_id)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The scratch instances of the host's running walks (what orphan removal passes over).
    pub async fn walking_vm_names(&self, host_id: &str) -> Result<Vec<String>> {
        on_pool!(self, |p| sqlx::query_scalar::<_, String>(
            "select vm_name from path_walks where host_id = $1 and finished_at is null"
        )
        .bind(host_id)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}
