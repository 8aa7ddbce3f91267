//! The background-job driver's two needs (issue #13): one replica at a time per job on
//! PostgreSQL (a session-level advisory lock), and each run recorded in `job_runs`.

use chrono::{DateTime, Utc};
use sqlx::pool::PoolConnection;

use crate::{Pool, Result, Store, new_id};

/// How many runs of each job `job_runs` keeps; older ones are trimmed after each insert.
pub const KEEP_RUNS_PER_JOB: i64 = 50;

/// The advisory-lock key of a job: FNV-1a (64 bit) of its name, so every replica and every
/// build derives the same key from the same name.
pub fn job_lock_key(name: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
}

/// Held while a job runs. On PostgreSQL it owns the connection that holds the session-level
/// advisory lock: [`JobLock::release`] unlocks it and returns the connection to the pool; a
/// lock dropped without `release` (a panic) closes its connection instead, which ends the
/// session and with it the lock, so a lock never leaks into the pool. On SQLite (one
/// process) it holds nothing.
#[derive(Debug)]
pub struct JobLock {
    held: Option<(PoolConnection<sqlx::Postgres>, i64)>,
}

impl JobLock {
    pub async fn release(mut self) -> Result<()> {
        if let Some((mut conn, key)) = self.held.take() {
            sqlx::query("select pg_advisory_unlock($1)")
                .bind(key)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }
}

impl Drop for JobLock {
    fn drop(&mut self) {
        if let Some((conn, _)) = self.held.take() {
            drop(conn.detach());
        }
    }
}

#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize)]
pub struct JobRunRow {
    pub id: String,
    pub job: String,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub outcome: String,
    pub summary: Option<String>,
    pub error: Option<String>,
}

/// One run to record.
#[derive(Clone, Debug)]
pub struct NewJobRun<'a> {
    pub job: &'a str,
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    /// `ok` or `failed` (the schema's closed set).
    pub outcome: &'a str,
    pub summary: Option<&'a str>,
    pub error: Option<&'a str>,
}

impl Store {
    /// Take job `name`'s lock for one run, or `None` when another replica holds it. On
    /// PostgreSQL `pg_try_advisory_lock` on a connection held until `release`; on SQLite
    /// always granted (the driver's in-process guard keeps a job from overlapping itself).
    pub async fn try_job_lock(&self, name: &str) -> Result<Option<JobLock>> {
        match &self.pool {
            Pool::Sqlite(_) => Ok(Some(JobLock { held: None })),
            Pool::Postgres(p) => {
                let key = job_lock_key(name);
                let mut conn = p.acquire().await?;
                let got: bool = sqlx::query_scalar("select pg_try_advisory_lock($1)")
                    .bind(key)
                    .fetch_one(&mut *conn)
                    .await?;
                Ok(got.then(|| JobLock {
                    held: Some((conn, key)),
                }))
            }
        }
    }

    /// Record a run and trim the job's history to the newest [`KEEP_RUNS_PER_JOB`].
    pub async fn record_job_run(&self, run: NewJobRun<'_>) -> Result<()> {
        let _turn = self.write_turn().await;
        on_pool!(self, |p| sqlx::query(
            "insert into job_runs (id, job, started_at, duration_ms, outcome, summary, error)
             values ($1, $2, $3, $4, $5, $6, $7)"
        )
        .bind(new_id())
        .bind(run.job)
        .bind(run.started_at)
        .bind(run.duration_ms)
        .bind(run.outcome)
        .bind(run.summary)
        .bind(run.error)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        on_pool!(self, |p| sqlx::query(
            "delete from job_runs where job = $1 and id not in
               (select id from job_runs where job = $1
                order by started_at desc, id desc limit $2)"
        )
        .bind(run.job)
        .bind(KEEP_RUNS_PER_JOB)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// The newest `limit` runs of job `name`, newest first.
    pub async fn job_runs(&self, name: &str, limit: i64) -> Result<Vec<JobRunRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, JobRunRow>(
            "select id, job, started_at, duration_ms, outcome, summary, error
             from job_runs where job = $1 order by started_at desc, id desc limit $2"
        )
        .bind(name)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::job_lock_key;

    #[test]
    fn a_jobs_lock_key_is_stable() {
        assert_eq!(job_lock_key("reap"), job_lock_key("reap"));
        assert_ne!(job_lock_key("reap"), job_lock_key("notify-stuck-deletes"));
        // FNV-1a of the empty string: the offset basis.
        assert_eq!(job_lock_key(""), 0xcbf2_9ce4_8422_2325_u64 as i64);
    }
}
