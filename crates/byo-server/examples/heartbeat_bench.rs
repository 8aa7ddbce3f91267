//! Heartbeat ingest (DESIGN §7: in-process ≥ 10,000 writes/s on PostgreSQL and ≥ 8,000/s on
//! SQLite, server p99 ≤ 10 ms). A fresh database with `--hosts` enrolled hosts (default 1,000),
//! then `--clients` concurrent callers (default 32) drive `POST /api/host/heartbeat`
//! through the real router in-process — the whole middleware stack, the token check and
//! the upsert — for `--seconds` (default 10). Latency is per request, as the server
//! sees it.
//!
//! cargo run --release -p byo-server --example heartbeat_bench -- [sqlite|postgres|both]
//! PostgreSQL comes from BYO_TEST_POSTGRES_URL (a database is created on it per run).

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use byo_core::testing::{Target, figure_line};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::Backend;
use byo_db::hosts::NewHost;
use byo_db::testing::TestDb;
use byo_db::users::NewUser;
use byo_server::config::PasswordHashing;
use byo_server::{AppState, Config};
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

/// `hosts` enrolled hosts, each with the host token its heartbeats present.
async fn enrolled(db: &TestDb, hosts: usize) -> Vec<String> {
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
        tokens.push(format!("Bearer {}", token.expose()));
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

fn percentile(sorted: &[u32], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[i]) / 1000.0
}

async fn run(backend: Backend, a: &Args) {
    let Some(db) = byo_db::testing::fresh(backend).await else {
        println!("{backend}: skipped (set BYO_TEST_POSTGRES_URL)");
        return;
    };
    let tokens = enrolled(&db, a.hosts).await;
    let config = Config {
        metrics_listen: None,
        password_hashing: PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        ..Config::default()
    };
    let router = byo_server::router(AppState::new(db.store.clone(), config));
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
    for (i, t) in tokens.iter().enumerate() {
        send(router.clone(), t.clone(), beat(i)).await;
    }

    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..a.clients {
        let mine: Vec<(String, String)> = tokens
            .iter()
            .enumerate()
            .filter(|(i, _)| i % a.clients == c)
            .map(|(i, t)| (t.clone(), beat(i)))
            .collect();
        let router = router.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut k = 0;
            while Instant::now() < deadline {
                let (auth, body) = &mine[k % mine.len()];
                k += 1;
                let t0 = Instant::now();
                send(router.clone(), auth.clone(), body.clone()).await;
                latencies.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
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
    println!(
        "{backend:>8}: {} hosts, {} clients, {:.1} s: {} heartbeats, {:.0} writes/s; \
         latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        a.hosts,
        a.clients,
        elapsed,
        all.len(),
        all.len() as f64 / elapsed,
        percentile(&all, 0.50),
        percentile(&all, 0.90),
        percentile(&all, 0.99),
        percentile(&all, 0.999),
        percentile(&all, 1.0),
    );
    let floor = match backend {
        Backend::Postgres => 10_000.0,
        Backend::Sqlite => 8_000.0,
    };
    println!(
        "{}",
        figure_line(
            "heartbeat_bench",
            &format!("{backend} beats in-process ({} clients)", a.clients),
            all.len() as f64 / elapsed,
            "writes/s",
            Some(Target::AtLeast(floor)),
        )
    );
    println!(
        "{}",
        figure_line(
            "heartbeat_bench",
            &format!("{backend} beat p99"),
            percentile(&all, 0.99),
            "ms",
            Some(Target::AtMost(10.0)),
        )
    );
    db.store.close().await;
}

#[tokio::main]
async fn main() {
    let a = args();
    for backend in a.backends.clone() {
        run(backend, &a).await;
    }
}
