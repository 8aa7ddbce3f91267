//! The queue's drain (issue #13: ≥ 2,000 placements/s on PostgreSQL with 4 concurrent
//! drainers, flat from 1,000 to 100,000 queued rows; SQLite with one drainer). A fresh
//! database per size with `--hosts` active hosts (default 1,000) and the queue filled with
//! `--rows` creates (default 1,000, 10,000 and 100,000) through the store's own enqueue;
//! agents that accept every create at once; and a churn task that confirms the deletes of
//! running instances, so hosts free up as the queue is drained (the pick's cost stays the
//! fleet's, the claim's is the queue's). The drainers are `queue_drain::drain_once` — the
//! job's whole run — started over and over until the queue is empty. A checker then reads
//! the tables back: no host ever held two live rows, every queue row was placed at most
//! once (one instance each, none shared), and every create the agents saw is one row.
//!
//! cargo run --release -p byo-server --example drain_bench -- [sqlite|postgres|both]
//!     [--rows N]... [--hosts N] [--drainers N]
//! PostgreSQL comes from BYO_TEST_POSTGRES_URL (a database is created on it per size).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use byo_core::testing::{Target, figure_line};
use byo_db::hosts::AgentTargetRow;
use byo_db::queue::NewQueued;
use byo_db::ssh_keys::NewSshKey;
use byo_db::users::NewUser;
use byo_db::{Backend, Store};
use byo_server::agents::{AgentError, Gone, HostAgents};
use byo_server::app::queue_drain;
use byo_server::config::PasswordHashing;
use byo_server::{AppState, Config};
use byo_wire::vm::{Advisory, CreateVm, VmAction, VmCreated};
use futures::future::BoxFuture;

struct Args {
    backends: Vec<Backend>,
    rows: Vec<usize>,
    hosts: usize,
    drainers: Option<usize>,
}

fn args() -> Args {
    let mut a = Args {
        backends: vec![Backend::Sqlite, Backend::Postgres],
        rows: Vec::new(),
        hosts: 1000,
        drainers: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |what: &str| -> usize {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} takes a number"))
        };
        match arg.as_str() {
            "sqlite" => a.backends = vec![Backend::Sqlite],
            "postgres" => a.backends = vec![Backend::Postgres],
            "both" => a.backends = vec![Backend::Sqlite, Backend::Postgres],
            "--rows" => a.rows.push(num("--rows")),
            "--hosts" => a.hosts = num("--hosts"),
            "--drainers" => a.drainers = Some(num("--drainers")),
            other => panic!("unknown argument {other}"),
        }
    }
    if a.rows.is_empty() {
        a.rows = vec![1_000, 10_000, 100_000];
    }
    a
}

/// Agents that take every create at once, and count them.
#[derive(Default)]
struct Accepting {
    creates: AtomicU64,
}

impl HostAgents for Accepting {
    fn push_operator_keys<'a>(
        &'a self,
        _host: &'a AgentTargetRow,
        _envelope: &'a [u8],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    fn create_vm<'a>(
        &'a self,
        _host: &'a AgentTargetRow,
        req: &'a CreateVm,
    ) -> BoxFuture<'a, Result<Option<VmCreated>, AgentError>> {
        Box::pin(async move {
            self.creates.fetch_add(1, Ordering::Relaxed);
            let ok = Advisory {
                ok: true,
                detail: None,
            };
            Ok(Some(VmCreated {
                name: req.name.clone(),
                ssh_port: 2201,
                gpu_check: ok.clone(),
                startup_script: ok,
            }))
        })
    }
    fn delete_vm<'a>(
        &'a self,
        _host: &'a AgentTargetRow,
        _name: &'a str,
    ) -> BoxFuture<'a, Result<Gone, AgentError>> {
        Box::pin(async { Ok(Gone::Deleted) })
    }
    fn vm_action<'a>(
        &'a self,
        _host: &'a AgentTargetRow,
        _name: &'a str,
        _action: VmAction,
    ) -> BoxFuture<'a, Result<(), AgentError>> {
        Box::pin(async { Ok(()) })
    }
    fn reboot_host<'a>(
        &'a self,
        _: &'a AgentTargetRow,
    ) -> BoxFuture<'a, Result<byo_wire::vm::HostRebooting, AgentError>> {
        Box::pin(async {
            Ok(byo_wire::vm::HostRebooting {
                node0_in_secs: 3,
                satellites: Vec::new(),
            })
        })
    }
}

/// `hosts` hosts every create may land on: active, prepared, reachable, heard from.
async fn fleet(store: &Store, owner: &str, hosts: usize) {
    let now = chrono::Utc::now();
    for i in 1..=hosts {
        byo_db::testing::pickable_host(store, owner, &format!("spark-{i}"), now).await;
    }
}

async fn run(backend: Backend, rows: usize, a: &Args) {
    let Some(db) = byo_db::testing::fresh(backend).await else {
        println!("{backend}: skipped (set BYO_TEST_POSTGRES_URL)");
        return;
    };
    let store = db.store.clone();
    let now = chrono::Utc::now();
    let user = |email: &'static str| NewUser {
        email,
        display_name: "",
        password_hash: "$argon2id$bench",
    };
    let owner = store
        .create_user(user("owner@example.com"), now)
        .await
        .unwrap()
        .sub;
    let customer = store
        .create_user(user("customer@example.com"), now)
        .await
        .unwrap()
        .sub;
    let key = store
        .insert_ssh_key(
            NewSshKey {
                user_sub: &customer,
                name: "laptop",
                public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBench bench",
                fingerprint: "SHA256:bench",
            },
            now,
        )
        .await
        .unwrap()
        .id;
    fleet(&store, &owner, a.hosts).await;
    // The queue: on SQLite through the store's own enqueue (the limit set out of the way);
    // on PostgreSQL in one insert (the enqueue counts the account's held rows, so one
    // account filling 100,000 rows through it is quadratic: a fill cost, not the drain's).
    let fill = Instant::now();
    let writers = if backend == Backend::Postgres { 0 } else { 1 };
    if backend == Backend::Postgres {
        store
            .execute_unchecked(&format!(
                "insert into vm_queue (id, user_sub, gpu_type, ssh_key_id, created_at, expires_at)
                 select 'bench-' || lpad(i::text, 7, '0'), '{customer}', 'spark-1', '{key}',
                        timestamptz '{}' + i * interval '1 millisecond',
                        timestamptz '{}' + interval '72 hours'
                 from generate_series(0, {}) i",
                now.to_rfc3339(),
                now.to_rfc3339(),
                rows - 1
            ))
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for w in 0..writers {
        let store = store.clone();
        let (customer, key) = (customer.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            for i in (w..rows).step_by(writers) {
                let at = now + chrono::TimeDelta::milliseconds(i as i64);
                let new = NewQueued {
                    user_sub: &customer,
                    gpu_type: "spark-1",
                    ssh_key_id: &key,
                    expires_at: at + chrono::TimeDelta::hours(72),
                };
                store.enqueue_vm(new, at, u32::MAX).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let filled = fill.elapsed().as_secs_f64();

    let config = Config {
        metrics_listen: None,
        password_hashing: PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        ..Config::default()
    };
    let agents = Arc::new(Accepting::default());
    let state = AppState::new(store.clone(), config).with_agents(agents.clone());
    let drainers = a
        .drainers
        .unwrap_or(if backend == Backend::Postgres { 4 } else { 1 });

    // Churn: the hosts' instances are deleted as fast as they run, so hosts free up.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let churn = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut beat = 0u64;
            while !*stop_rx.borrow() {
                store
                    .execute_unchecked(&format!(
                        "update vms set deleted_at = '{}', status = 'deleted'
                         where deleted_at is null and creation_failed_at is null
                           and status = 'running'",
                        chrono::Utc::now().to_rfc3339()
                    ))
                    .await
                    .unwrap();
                // The hosts keep beating (about once a second): placement picks only hosts
                // heard from lately.
                beat += 1;
                if beat.is_multiple_of(200) {
                    store
                        .execute_unchecked(&format!(
                            "update host_status set seen_at = '{}'",
                            chrono::Utc::now().to_rfc3339()
                        ))
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..drainers {
        let state = state.clone();
        tasks.push(tokio::spawn(async move {
            let mut total = queue_drain::DrainReport::default();
            loop {
                let r = queue_drain::drain_once(&state).await.unwrap();
                total.placed += r.placed;
                total.skipped += r.skipped;
                total.claimed += r.claimed;
                total.waiting += r.waiting;
                let open = state.store.open_queue_count().await.unwrap();
                if open == 0 {
                    return total;
                }
                if r.placed == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }));
    }
    let mut total = queue_drain::DrainReport::default();
    for t in tasks {
        let r = t.await.unwrap();
        total.placed += r.placed;
        total.skipped += r.skipped;
        total.claimed += r.claimed;
        total.waiting += r.waiting;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    churn.await.unwrap();

    // The checker: every queue row placed exactly once, by one instance row that no other
    // row names, each the one create the agents saw for it; no host with two live rows.
    let t = store.queue_tally().await.unwrap();
    let creates = agents.creates.load(Ordering::Relaxed) as i64;
    let doubles =
        (t.placed - t.placed_instances) + (t.instances - t.placed) + t.hosts_with_two_live;
    let ok = doubles == 0 && t.open == 0 && t.placed == rows as i64 && creates == t.instances;
    println!(
        "{backend:>8}: {rows:>7} rows, {} hosts, {drainers} drainers: filled in {filled:.1} s; \
         drained in {elapsed:.2} s = {:.0} placements/s; claims {}, skipped {}; \
         instance rows {}, agent creates {creates}; double placements {doubles}; checker {}",
        a.hosts,
        t.placed as f64 / elapsed,
        total.claimed,
        total.skipped,
        t.instances,
        if ok { "ok" } else { "FAILED" },
    );
    // The target is PostgreSQL's, with 4 drainers (issue #13); SQLite's one writer has none.
    let target =
        (backend == Backend::Postgres && drainers >= 4).then_some(Target::AtLeast(2_000.0));
    println!(
        "{}",
        figure_line(
            "drain_bench",
            &format!("{backend} drain, {rows} rows, {drainers} drainers"),
            t.placed as f64 / elapsed,
            "placements/s",
            target,
        )
    );
    assert!(ok, "the checker found a double placement or a lost row");
    db.store.close().await;
}

#[tokio::main]
async fn main() {
    let a = args();
    for backend in a.backends.clone() {
        for rows in a.rows.clone() {
            run(backend, rows, &a).await;
        }
    }
}
