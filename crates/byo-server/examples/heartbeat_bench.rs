//! Heartbeat ingest (DESIGN §7: in-process ≥ 10,000 writes/s on PostgreSQL and ≥ 8,000/s on
//! SQLite, p99 ≤ 10 ms; over HTTP ≥ 1.5 times the database's own limit for the one
//! statement). A fresh database with `--hosts` enrolled hosts (default 1,000), then
//! `--clients` concurrent callers (default 32), each for `--seconds` (default 10), three ways:
//!
//! 1. **the statement alone**: `Store::record_heartbeat_alone`, the one upsert a beat writes, called
//!    straight through the pool — the database's own limit through our driver, the anchor
//!    the other two are read against (pgbench's role in DESIGN §7);
//! 2. **in-process**: `POST /api/host/heartbeat` through the real router — the whole
//!    middleware stack, the token check and the upsert, no sockets;
//! 3. **over HTTP**: the same requests over keep-alive connections on loopback to
//!    `byo_server::serve` — what `byo-server serve` runs: the listener with its limits, the
//!    router, the jobs beside it;
//! 4. **pgbench** (PostgreSQL, when `pgbench` is installed): `pgbench -M prepared` with the
//!    same clients and seconds running the very upsert, each call's token hash computed in
//!    the statement from the host's number (the hosts' hashes are rewritten for it after the
//!    three runs above) — the figure DESIGN §7 and issue #41 read the HTTP rate against. Without
//!    pgbench the statement alone stands in for it.
//!
//! Latency is per call, as the caller sees it.
//!
//! cargo run --release -p byo-server --example heartbeat_bench -- [sqlite|postgres|both]
//!     [--hosts N] [--clients N] [--seconds N]
//! PostgreSQL comes from BYO_TEST_POSTGRES_URL (a database is created on it per run).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use byo_core::testing::{Target, figure_line, percentile_ms};
use byo_core::tokens::{SecretToken, TokenHash, TokenKind};
use byo_db::Backend;
use byo_db::hosts::NewHost;
use byo_db::testing::TestDb;
use byo_db::users::NewUser;
use byo_server::config::PasswordHashing;
use byo_server::{AppState, Config};
use byo_wire::vm::Heartbeat;
use tower::ServiceExt;

struct Args {
    backends: Vec<Backend>,
    hosts: usize,
    clients: usize,
    seconds: u64,
}

fn args() -> Args {
    let mut a = Args {
        backends: vec![Backend::Sqlite, Backend::Postgres],
        hosts: 1000,
        clients: 32,
        seconds: 10,
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
            "--hosts" => a.hosts = num("--hosts"),
            "--clients" => a.clients = num("--clients"),
            "--seconds" => a.seconds = num("--seconds") as u64,
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// `hosts` enrolled hosts, each with the host token its heartbeats present (as the header
/// carries it) and the hash the database keeps of it.
async fn enrolled(db: &TestDb, hosts: usize) -> Vec<(String, TokenHash)> {
    let now = chrono::Utc::now();
    let owner = db
        .create_user(
            NewUser {
                email: "owner@example.com",
                display_name: "",
                password_hash: "$argon2id$bench",
            },
            now,
        )
        .await
        .unwrap()
        .sub;
    let mut tokens = Vec::with_capacity(hosts);
    for i in 1..=hosts {
        let id = db
            .insert_host(
                NewHost {
                    slug: &format!("spark-{i}"),
                    owner_sub: &owner,
                    profile_id: "gb10-spark-1",
                    gpu_type: "spark-1",
                },
                now,
            )
            .await
            .unwrap()
            .id;
        let token = SecretToken::generate(TokenKind::Host);
        db.execute_unchecked(&format!(
            "update hosts set token_hash = '{}' where id = '{id}'",
            token.hash().as_str()
        ))
        .await
        .unwrap();
        tokens.push((format!("Bearer {}", token.expose()), token.hash()));
    }
    tokens
}

fn beat(i: usize) -> String {
    serde_json::json!({
        "agent_version": "0.1.0", "lxd": "ok", "relay": "ok", "tunnel": "ok",
        "gpu": "ok", "storage": "ok", "instances": i % 2,
        "details": {"relay_map": null}
    })
    .to_string()
}

/// `a.clients` callers for `a.seconds`, caller `c` beating for hosts `c`, `c + clients`, …
/// in turn: each call's latency in µs, sorted, and the seconds it all took.
async fn drive<F, Fut>(a: &Args, hosts: usize, call: F) -> (Vec<u32>, f64)
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..a.clients.min(hosts) {
        let call = call.clone();
        let clients = a.clients;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = c;
            while Instant::now() < deadline {
                let t0 = Instant::now();
                call(i).await;
                latencies.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                i += clients;
                if i >= hosts {
                    i = c;
                }
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    (all, elapsed)
}

/// One way's line for a person and its figures for `scripts/bench`: the rate against
/// `floor` and, when `p99_target`, the p99 against 10 ms. Returns the rate.
fn report(
    backend: Backend,
    a: &Args,
    way: &str,
    (all, elapsed): &(Vec<u32>, f64),
    floor: Option<f64>,
    p99_target: bool,
) -> f64 {
    let rate = all.len() as f64 / elapsed;
    println!(
        "{backend:>8} {way:<20}: {} hosts, {} clients, {elapsed:.1} s: {} heartbeats, \
         {rate:.0} writes/s; latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, \
         max {:.2} ms",
        a.hosts,
        a.clients,
        all.len(),
        percentile_ms(all, 0.50),
        percentile_ms(all, 0.90),
        percentile_ms(all, 0.99),
        percentile_ms(all, 0.999),
        percentile_ms(all, 1.0),
    );
    let what = format!("{backend} beats, {way} ({} clients)", a.clients);
    println!(
        "{}",
        figure_line(
            "heartbeat_bench",
            &what,
            rate,
            "writes/s",
            floor.map(Target::AtLeast)
        )
    );
    println!(
        "{}",
        figure_line(
            "heartbeat_bench",
            &format!("{backend} beat p99, {way}"),
            percentile_ms(all, 0.99),
            "ms",
            p99_target.then_some(Target::AtMost(10.0)),
        )
    );
    rate
}

async fn run(backend: Backend, a: &Args) {
    let Some(db) = byo_db::testing::fresh(backend).await else {
        println!("{backend}: skipped (set BYO_TEST_POSTGRES_URL)");
        return;
    };
    let hosts = enrolled(&db, a.hosts).await;
    let beats: Vec<String> = (0..hosts.len()).map(beat).collect();
    let config = Config {
        metrics_listen: None,
        password_hashing: PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        ..Config::default()
    };
    let state = AppState::new(db.store.clone(), config);
    let router = byo_server::router(state.clone());
    let send = |router: axum::Router, auth: String, body: String| async move {
        let req = Request::post("/api/host/heartbeat")
            .header(header::AUTHORIZATION, auth)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap();
        let resp = router.oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    };
    // One beat from every host first: each writes its row, and the pools warm up.
    for ((auth, _), body) in hosts.iter().zip(&beats) {
        send(router.clone(), auth.clone(), body.clone()).await;
    }
    let floor = match backend {
        Backend::Postgres => 10_000.0,
        Backend::Sqlite => 8_000.0,
    };

    // 1. The statement alone.
    let parsed: Arc<Vec<(TokenHash, Heartbeat)>> = Arc::new(
        hosts
            .iter()
            .zip(&beats)
            .map(|((_, hash), b)| (hash.clone(), serde_json::from_str(b).unwrap()))
            .collect(),
    );
    let store = db.store.clone();
    let statement = drive(a, hosts.len(), move |i| {
        let (store, parsed) = (store.clone(), parsed.clone());
        async move {
            let (hash, beat) = &parsed[i];
            let kept = store
                .record_heartbeat_alone(hash, beat, chrono::Utc::now())
                .await
                .unwrap();
            assert!(kept.is_some(), "the host's token is known");
        }
    })
    .await;
    let anchor = report(backend, a, "the statement alone", &statement, None, false);

    // 2. In-process, through the router.
    let calls: Arc<Vec<(String, String)>> = Arc::new(
        hosts
            .iter()
            .zip(&beats)
            .map(|((auth, _), b)| (auth.clone(), b.clone()))
            .collect(),
    );
    let (r, c) = (router.clone(), calls.clone());
    let in_process = drive(a, hosts.len(), move |i| {
        let (auth, body) = c[i].clone();
        send(r.clone(), auth, body)
    })
    .await;
    report(backend, a, "in-process", &in_process, Some(floor), true);

    // 3. Over HTTP, to what `byo-server serve` runs.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/api/host/heartbeat",
        listener.local_addr().unwrap()
    );
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(byo_server::serve(state, listener, async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    }));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.clients)
        .build()
        .unwrap();
    let over_http = drive(a, hosts.len(), move |i| {
        let (client, url, calls) = (client.clone(), url.clone(), calls.clone());
        async move {
            let (auth, body) = &calls[i];
            let resp = client
                .post(url.as_str())
                .header(header::AUTHORIZATION, auth.as_str())
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 204);
        }
    })
    .await;
    let http = report(backend, a, "over HTTP", &over_http, None, true);
    // DESIGN §7 reads the HTTP figure against the database's own limit for the statement:
    // at least 1.5 times it (group commit). That limit is pgbench's where it runs; our pool's
    // own run of the statement stands in for it where it does not.
    let pgbench = match backend {
        Backend::Postgres => pgbench(&db, a, hosts.len()).await,
        Backend::Sqlite => None,
    };
    // The server closes the store's pool as it stops.
    let _ = stop_tx.send(true);
    server.await.unwrap().unwrap();
    println!(
        "{}",
        figure_line(
            "heartbeat_bench",
            &format!("{backend} over HTTP / the statement alone"),
            http / anchor,
            "x",
            pgbench.is_none().then_some(Target::AtLeast(1.5)),
        )
    );
    if let Some(tps) = pgbench {
        println!(
            "{}",
            figure_line(
                "heartbeat_bench",
                &format!(
                    "{backend} beats, pgbench -M prepared ({} clients)",
                    a.clients
                ),
                tps,
                "writes/s",
                None,
            )
        );
        println!(
            "{}",
            figure_line(
                "heartbeat_bench",
                &format!("{backend} over HTTP / pgbench"),
                http / tps,
                "x",
                Some(Target::AtLeast(1.5)),
            )
        );
    }
    db.store.close().await;
}

/// The upsert a beat writes (`byo_db`'s single statement), as pgbench runs it: the token's
/// hash computed from the host's number, the beat's fields as the bench's beats carry them.
const PGBENCH_SCRIPT: &str = r#"\set i random(1, HOSTS)
insert into host_status
  (host_id, seen_at, agent_version, lxd, relay, tunnel, gpu, storage, instances, details)
select id, now(), '0.1.0', 'ok', 'ok', 'ok', 'ok', 'ok', :i % 2, '{"relay_map": null}'::jsonb
from hosts
where token_hash = encode(sha256(convert_to('pgbench-' || :i, 'UTF8')), 'hex')
  and retired_at is null
on conflict (host_id) do update set
  seen_at = excluded.seen_at, agent_version = excluded.agent_version,
  lxd = excluded.lxd, relay = excluded.relay, tunnel = excluded.tunnel,
  gpu = excluded.gpu, storage = excluded.storage, instances = excluded.instances,
  details = excluded.details
returning host_id, exists (select 1 from vms v where v.host_id = host_status.host_id
                            and v.deleted_at is null and v.creation_failed_at is null);
"#;

/// Run 4: pgbench's transactions per second with the beat's upsert, or `None` (and why)
/// when pgbench is not installed. The hosts' token hashes are rewritten for it: run it last.
async fn pgbench(db: &TestDb, a: &Args, hosts: usize) -> Option<f64> {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(
            std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .map(|d| d.path().join("bin")),
        )
        .map(|d| d.join("pgbench"))
        .find(|p| p.is_file());
    let Some(pgbench) = found else {
        println!("postgres: pgbench not found; the statement alone stands in for it");
        return None;
    };
    db.execute_unchecked(
        "update hosts set token_hash =
           encode(sha256(convert_to('pgbench-' || substr(slug, 7), 'UTF8')), 'hex')",
    )
    .await
    .unwrap();
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        script.path(),
        PGBENCH_SCRIPT.replace("HOSTS", &hosts.to_string()),
    )
    .unwrap();
    let started = chrono::Utc::now() - chrono::TimeDelta::seconds(1);
    let out = tokio::process::Command::new(&pgbench)
        .args(["-n", "-M", "prepared", "-j", "2"])
        .args([
            "-c",
            &a.clients.to_string(),
            "-T",
            &a.seconds.max(1).to_string(),
        ])
        .arg("-f")
        .arg(script.path())
        .arg(&db.url)
        .output()
        .await
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgbench failed: {said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The statement found its hosts (a hash computed wrongly would write nothing, fast).
    let beaten = db
        .execute_unchecked(&format!(
            "update host_status set instances = instances where seen_at >= '{}'",
            started.to_rfc3339()
        ))
        .await
        .unwrap();
    assert!(beaten > 0, "pgbench's beats wrote no host's row");
    let tps = said
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {said}"));
    println!(
        "postgres: pgbench -M prepared, {} clients: {tps:.0} transactions/s",
        a.clients
    );
    Some(tps)
}

#[tokio::main]
async fn main() {
    let a = args();
    for backend in a.backends.clone() {
        run(backend, &a).await;
    }
}
