//! The database: the one place SQL is written.
//!
//! One [`Store`] API over two backends — PostgreSQL in production, SQLite as the embedded
//! default. Every query is written once: `$n` placeholders and `RETURNING` mean the same on
//! both, and each function runs its statement against whichever pool the store holds (see
//! [`on_pool!`]). Where the two differ — row locks — the difference is confined to
//! [`in_tx!`]. Time is always passed in: no query reads a database clock.
//!
//! Constraints the design states live in the schema (`migrations/`), so they hold for every
//! writer, including one that bypasses this crate.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

/// Run `$body` against the store's pool, whichever backend it is. The body is compiled
/// once per backend, so it must be valid SQL and valid Rust for both.
macro_rules! on_pool {
    ($store:expr, |$p:ident| $body:expr) => {
        match &$store.pool {
            $crate::Pool::Postgres($p) => $body,
            $crate::Pool::Sqlite($p) => $body,
        }
    };
}

/// Run `$body` in a transaction that serialises writers. On PostgreSQL rows are locked
/// with `$for_update` (" for update"); SQLite has no row locks, so the transaction takes
/// the database's write lock up front (`BEGIN IMMEDIATE`) and `$for_update` is empty.
/// A `?` inside the body drops the transaction, which rolls it back.
macro_rules! in_tx {
    ($store:expr, |$tx:ident, $for_update:ident| $body:expr) => {
        match &$store.pool {
            $crate::Pool::Postgres(p) => {
                let mut $tx = p.begin().await?;
                let $for_update: &str = " for update";
                let out = $body;
                $tx.commit().await?;
                out
            }
            $crate::Pool::Sqlite(p) => {
                let mut $tx = p.begin_with("BEGIN IMMEDIATE").await?;
                let $for_update: &str = "";
                let out = $body;
                $tx.commit().await?;
                out
            }
        }
    };
}

pub mod api_tokens;
pub mod audit;
mod beats;
pub mod billing;
pub mod enrollments;
mod error;
pub mod fleet;
pub mod hosts;
pub mod inspect;
pub mod invoices;
pub mod jobs;
pub mod lifecycle;
pub mod logins;
pub mod notices;
pub mod operator_keys;
pub mod path_walks;
pub mod payouts;
pub mod prebookings;
pub mod profiles;
pub mod provisioning;
pub mod queue;
pub mod relay_ca;
pub mod releases;
pub mod sealed;
pub mod sessions;
pub mod signups;
pub mod ssh_keys;
#[cfg(feature = "testing")]
pub mod testing;
pub mod users;
pub mod vms;

pub use error::{DbError, Result, Rule};
/// The wrapper of the rows' JSON columns (`prepare_state`, `details`…), for whoever builds one.
pub use sqlx::types::Json;

/// A handle on the database. Cheap to clone; every clone shares one pool.
#[derive(Clone, Debug)]
pub struct Store {
    pool: Pool,
    /// SQLite takes one writer at a time, and a writer that finds the lock taken sleeps in
    /// SQLite's busy handler (1, 2, 5, 10… ms). Writes at fleet rate — the heartbeat — queue
    /// here instead, in order, so they wait only as long as the writer ahead of them. Hold it
    /// for one statement only, never around another store call. `None` on PostgreSQL.
    write_gate: Option<std::sync::Arc<tokio::sync::Mutex<()>>>,
    /// Heartbeats waiting to be written together (group commit, `beats`).
    beats: std::sync::Arc<beats::Beats>,
}

#[derive(Clone, Debug)]
enum Pool {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        })
    }
}

/// Outcome of a write guarded by `... is null`: the first writer wins, later ones are
/// no-ops, and the caller learns which it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardedWrite {
    Written,
    AlreadySet,
}

impl GuardedWrite {
    fn from_rows(rows: u64) -> Self {
        if rows == 0 {
            GuardedWrite::AlreadySet
        } else {
            GuardedWrite::Written
        }
    }
}

impl Store {
    /// Connect by URL: `sqlite://path/to/byo.db` (created if missing) or
    /// `postgres://user@host:port/db`.
    pub async fn connect(url: &str) -> Result<Store> {
        let pool = if url.starts_with("sqlite:") {
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(|e| DbError::Config(format!("bad sqlite URL: {e}")))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .foreign_keys(true)
                .busy_timeout(Duration::from_secs(30));
            Pool::Sqlite(
                SqlitePoolOptions::new()
                    .max_connections(8)
                    .connect_with(opts)
                    .await?,
            )
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Pool::Postgres(
                PgPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(url)
                    .await?,
            )
        } else {
            return Err(DbError::Config(
                "database URL must start with sqlite:// or postgres://".into(),
            ));
        };
        let write_gate = match pool {
            Pool::Sqlite(_) => Some(Default::default()),
            Pool::Postgres(_) => None,
        };
        // Heartbeat writers (group commit): on PostgreSQL two, so one batch is written while
        // the next is sent (one, three and four measured no better or worse: docs/performance.md);
        // SQLite has one writer.
        let beats = std::sync::Arc::new(beats::Beats::new(match pool {
            Pool::Postgres(_) => 2,
            Pool::Sqlite(_) => 1,
        }));
        Ok(Store {
            pool,
            write_gate,
            beats,
        })
    }

    /// Wait for our turn to write on SQLite (see `write_gate`); immediate on PostgreSQL.
    pub(crate) async fn write_turn(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        match &self.write_gate {
            Some(gate) => Some(gate.lock().await),
            None => None,
        }
    }

    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Postgres(_) => Backend::Postgres,
            Pool::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// Bring the schema up to date. Each backend has its own migrations folder.
    pub async fn migrate(&self) -> Result<Migrated> {
        let before = self.applied_migrations().await;
        let migrator = match &self.pool {
            Pool::Postgres(p) => {
                let m = sqlx::migrate!("migrations/postgres");
                m.run(p).await?;
                m
            }
            Pool::Sqlite(p) => {
                let m = sqlx::migrate!("migrations/sqlite");
                m.run(p).await?;
                m
            }
        };
        let applied: Vec<i64> = migrator
            .iter()
            .map(|m| m.version)
            .filter(|v| !before.contains(v))
            .collect();
        Ok(Migrated {
            applied,
            latest: migrator.iter().map(|m| m.version).max(),
        })
    }

    /// The versions already applied; none when the table is not there yet (a fresh database).
    async fn applied_migrations(&self) -> Vec<i64> {
        on_pool!(self, |p| sqlx::query_scalar::<_, i64>(
            "select version from _sqlx_migrations where success"
        )
        .fetch_all(p)
        .await)
        .unwrap_or_default()
    }

    /// A cheap round trip, for `/healthz`.
    pub async fn ping(&self) -> Result<()> {
        on_pool!(self, |p| sqlx::query("select 1")
            .execute(p)
            .await
            .map(|r| r.rows_affected()))?;
        Ok(())
    }

    pub async fn close(&self) {
        on_pool!(self, |p| p.close().await)
    }
}

/// What [`Store::migrate`] did: the versions it applied now, and the newest the schema has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Migrated {
    pub applied: Vec<i64>,
    pub latest: Option<i64>,
}

impl std::fmt::Display for Migrated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = self.latest.map_or("none".to_owned(), |v| format!("{v:04}"));
        match (self.applied.first(), self.applied.last()) {
            (Some(first), Some(last)) if first == last => {
                write!(f, "applied migration {first:04}; the schema is at {at}")
            }
            (Some(first), Some(last)) => write!(
                f,
                "applied {} migrations ({first:04}–{last:04}); the schema is at {at}",
                self.applied.len()
            ),
            _ => write!(f, "the schema is up to date (at {at}); nothing to apply"),
        }
    }
}

/// A fresh random id for a row; public so that a caller can seal a value for its row
/// (`sealed`) before the row is written.
/// `n` numbered placeholders from `$first` on, for an `in (…)` list of values each bound
/// in turn (SQLite has no arrays): `marks(2, 3)` is `$2, $3, $4`. Only the count is
/// formatted into a statement, never a value.
pub(crate) fn marks(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A state column that may be null (a left join, or a column not written yet), read as an
/// `Option` of the state its text names. As for the non-null state columns
/// (`#[sqlx(try_from = "String")]`), a spelling this build does not know is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaybeState<S>(pub Option<S>);

impl<S: FromStr<Err = String>> TryFrom<Option<String>> for MaybeState<S> {
    type Error = String;
    fn try_from(text: Option<String>) -> std::result::Result<Self, String> {
        text.map(|t| t.parse()).transpose().map(MaybeState)
    }
}

#[cfg(test)]
mod marks_tests {
    #[test]
    fn marks_number_from_the_first_and_count_n() {
        assert_eq!(super::marks(1, 3), "$1, $2, $3");
        assert_eq!(super::marks(5, 1), "$5");
        assert_eq!(super::marks(2, 0), "");
    }
}

#[cfg(test)]
mod migrated_tests {
    use super::Migrated;

    /// What `byo-server migrate` prints, for one, several and no migrations applied.
    #[test]
    fn migrate_says_one_several_or_none() {
        let said = |applied: Vec<i64>| {
            Migrated {
                applied,
                latest: Some(29),
            }
            .to_string()
        };
        assert_eq!(
            said(vec![29]),
            "applied migration 0029; the schema is at 0029"
        );
        assert_eq!(
            said(vec![28, 29]),
            "applied 2 migrations (0028–0029); the schema is at 0029"
        );
        assert_eq!(
            said(vec![]),
            "the schema is up to date (at 0029); nothing to apply"
        );
    }
}
