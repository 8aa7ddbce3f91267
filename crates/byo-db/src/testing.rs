//! Fresh databases for tests, on either backend (feature `testing`).
//!
//! PostgreSQL comes from `BYO_TEST_POSTGRES_URL`, a server the test command starts; each
//! call creates a new database on it. Without that variable the PostgreSQL half of a test
//! is skipped loudly — except under CI (`CI=true`), where a missing component is a failure.

use crate::{Backend, Result, Store};

/// A migrated store that lives as long as this value (the SQLite file is removed on drop).
#[derive(Debug)]
pub struct TestDb {
    pub store: Store,
    /// The URL `store` was opened with, for a second connection to the same database (two
    /// servers on one database).
    pub url: String,
    _dir: Option<tempfile::TempDir>,
}

impl std::ops::Deref for TestDb {
    type Target = Store;
    fn deref(&self) -> &Store {
        &self.store
    }
}

pub const POSTGRES_URL_VAR: &str = "BYO_TEST_POSTGRES_URL";

pub async fn sqlite() -> TestDb {
    sqlite_migrated_to(None).await
}

/// A fresh SQLite database migrated up to and including `version` (`None`: all of them).
async fn sqlite_migrated_to(version: Option<i64>) -> TestDb {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("byo.db").display());
    let store = Store::connect(&url).await.expect("open sqlite");
    store.migrate_to(version).await.expect("migrate sqlite");
    TestDb {
        store,
        url,
        _dir: Some(dir),
    }
}

/// A fresh PostgreSQL database, or `None` (with a loud line on stderr) when no server was
/// provided outside CI.
pub async fn postgres() -> Option<TestDb> {
    postgres_migrated_to(None).await
}

/// A fresh PostgreSQL database migrated up to and including `version` (`None`: all).
async fn postgres_migrated_to(version: Option<i64>) -> Option<TestDb> {
    let admin_url = match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.is_empty() => url,
        _ => {
            byo_core::testing::skip(
                "PostgreSQL",
                &format!("{POSTGRES_URL_VAR} is not set; run ./scripts/test to start a server"),
            );
            return None;
        }
    };
    let name = format!(
        "{TEST_DB_PREFIX}{}_{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    );
    let admin = Store::connect(&admin_url)
        .await
        .expect("connect to test PostgreSQL");
    drop_databases_of_ended_processes(&admin).await;
    admin
        .execute_unchecked(&format!("create database {name}"))
        .await
        .expect("create test database");
    admin.close().await;
    let (base, _) = admin_url.rsplit_once('/').expect("URL has a database path");
    let url = format!("{base}/{name}");
    let store = Store::connect(&url).await.expect("connect");
    store.migrate_to(version).await.expect("migrate postgres");
    Some(TestDb {
        store,
        url,
        _dir: None,
    })
}

/// A test database's name: the prefix, the pid of the process that made it, a uuid.
const TEST_DB_PREFIX: &str = "byo_test_p";

/// Test databases are not dropped when their test ends (a pool outlives the test's last
/// await); instead each new one first drops those whose process has ended. A mutation
/// run makes thousands, which filled 45 GB before this. The pid is read on this machine:
/// the test server is always local (scripts/test starts it).
async fn drop_databases_of_ended_processes(admin: &Store) {
    let crate::Pool::Postgres(p) = &admin.pool else {
        return;
    };
    let names: Vec<String> =
        sqlx::query_scalar("select datname::text from pg_database where starts_with(datname, $1)")
            .bind(TEST_DB_PREFIX)
            .fetch_all(p)
            .await
            .unwrap_or_default();
    for name in names {
        let Some(pid) = name
            .strip_prefix(TEST_DB_PREFIX)
            .and_then(|rest| rest.split_once('_'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Another process may be dropping it too; whichever loses is not a failure.
        let _ = admin
            .execute_unchecked(&format!(r#"drop database if exists "{name}" with (force)"#))
            .await;
    }
}

/// Both backends that are available here: SQLite always, PostgreSQL when provided.
pub async fn each_backend() -> Vec<TestDb> {
    let mut out = vec![sqlite().await];
    out.extend(postgres().await);
    out
}

/// A fresh database on `backend` as one in the field that has run the migrations up to
/// and including `version` and not those after (a migration's own test: rows written
/// before it, then [`Store::migrate`]). `None` when that backend is skipped here.
pub async fn migrated_to(backend: Backend, version: i64) -> Option<TestDb> {
    match backend {
        Backend::Sqlite => Some(sqlite_migrated_to(Some(version)).await),
        Backend::Postgres => postgres_migrated_to(Some(version)).await,
    }
}

/// A fresh database on `backend`, or `None` when that backend is skipped here.
pub async fn fresh(backend: Backend) -> Option<TestDb> {
    match backend {
        Backend::Sqlite => Some(sqlite().await),
        Backend::Postgres => postgres().await,
    }
}

impl Store {
    /// [`Store::migrate`], stopping after `version` (`None`: all of them).
    async fn migrate_to(&self, version: Option<i64>) -> Result<()> {
        let Some(version) = version else {
            return self.migrate().await.map(drop);
        };
        match &self.pool {
            crate::Pool::Postgres(p) => {
                sqlx::migrate!("migrations/postgres")
                    .run_to(version, p)
                    .await?
            }
            crate::Pool::Sqlite(p) => {
                sqlx::migrate!("migrations/sqlite")
                    .run_to(version, p)
                    .await?
            }
        }
        Ok(())
    }

    /// Run a statement outside the Store API, as a careless writer would: tests use this to
    /// prove the schema itself refuses what the design forbids.
    pub async fn execute_unchecked(&self, sql: &str) -> Result<u64> {
        let done = on_pool!(self, |p| sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))?;
        Ok(done)
    }
}

/// A heartbeat from a host whose every part is healthy and which holds no instance.
pub fn healthy_beat() -> byo_wire::vm::Heartbeat {
    use byo_wire::vm::Health;
    byo_wire::vm::Heartbeat {
        agent_version: "0.1.0".into(),
        lxd: Health::Ok,
        relay: Health::Ok,
        tunnel: Health::Ok,
        gpu: Health::Ok,
        storage: Health::Ok,
        instances: 0,
        details: Default::default(),
        vms: Vec::new(),
    }
}

/// A `spark-1` host every create may land on: active and shared, prepared, on its relay,
/// heard from at `now`. Its id.
pub async fn pickable_host(
    store: &Store,
    owner: &str,
    slug: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> String {
    use byo_core::tokens::{SecretToken, TokenKind};
    let id = store
        .insert_host(
            crate::hosts::NewHost {
                slug,
                owner_sub: owner,
                profile_id: "gb10-spark-1",
                gpu_type: "spark-1",
            },
            now,
        )
        .await
        .unwrap()
        .id;
    let token = SecretToken::generate(TokenKind::Host);
    store
        .execute_unchecked(&format!(
            "update hosts set token_hash = '{}', agent_token = 'sealed' where id = '{id}'",
            token.hash().as_str()
        ))
        .await
        .unwrap();
    store
        .record_relay(
            &id,
            Some("10.8.0.1"),
            byo_wire::states::RelayState::Ready,
            None,
        )
        .await
        .unwrap();
    store.mark_host_prepared(&id, now).await.unwrap();
    store
        .activate_host(&id, "shared", None, false, owner, now)
        .await
        .unwrap();
    store
        .record_heartbeat(&token.hash(), &healthy_beat(), now)
        .await
        .unwrap();
    id
}

/// A host a fleet upgrade covers: a [`pickable_host`] whose node0 enrolled as `arch`. Its
/// id and its host token (plaintext), for heartbeats sent as the host.
pub async fn fleet_host(
    store: &Store,
    owner: &str,
    slug: &str,
    arch: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> (String, String) {
    use byo_core::tokens::{SecretToken, TokenKind};
    let id = pickable_host(store, owner, slug, now).await;
    let token = SecretToken::generate(TokenKind::Host);
    store
        .execute_unchecked(&format!(
            "update hosts set token_hash = '{}' where id = '{id}'",
            token.hash().as_str()
        ))
        .await
        .unwrap();
    store
        .insert_host_node(
            crate::hosts::NewHostNode {
                host_id: &id,
                index: 0,
                machine_id: Some(slug),
                hardware_id: slug,
                fingerprint: &serde_json::json!({"arch": arch, "gpu_model": "GB10"}),
                rails: &serde_json::json!({}),
            },
            now,
        )
        .await
        .unwrap();
    (id, token.expose().to_owned())
}
