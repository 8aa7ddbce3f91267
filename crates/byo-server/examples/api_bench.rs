//! Every authenticated request (issue #41, 3; DESIGN §7): `GET /api/vms` with a session cookie,
//! over keep-alive HTTP on loopback to `byo_server::serve` — what `byo-server serve` and
//! `byo up` run: the listener with its limits, the middleware stack, the session check (a
//! read, never a write), the customer's instances (`--vms`, default 3) as JSON. `--clients`
//! callers (default 32) for `--seconds` (default 10), each call's latency as the caller sees
//! it. Target: at least 15,000 requests/s with p99 under 5 ms.
//!
//! cargo run --release -p byo-server --example api_bench -- [sqlite|postgres|both]
//!     [--clients N] [--seconds N] [--vms N]
//! PostgreSQL comes from BYO_TEST_POSTGRES_URL (a database is created on it per run).

use std::time::{Duration, Instant};

use byo_core::testing::{Target, figure_line, percentile_ms};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::Backend;
use byo_db::hosts::NewHost;
use byo_db::users::NewUser;
use byo_db::vms::NewVm;
use byo_server::config::PasswordHashing;
use byo_server::{AppState, Config};

struct Args {
    backends: Vec<Backend>,
    clients: usize,
    seconds: u64,
    vms: usize,
}

fn args() -> Args {
    let mut a = Args {
        backends: vec![Backend::Sqlite, Backend::Postgres],
        clients: 32,
        seconds: 10,
        vms: 3,
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
            "--clients" => a.clients = num("--clients"),
            "--seconds" => a.seconds = num("--seconds") as u64,
            "--vms" => a.vms = num("--vms"),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

async fn run(backend: Backend, a: &Args) {
    let Some(db) = byo_db::testing::fresh(backend).await else {
        println!("{backend}: skipped (set BYO_TEST_POSTGRES_URL)");
        return;
    };
    let now = chrono::Utc::now();
    let customer = db
        .create_user(
            NewUser {
                email: "customer@example.com",
                display_name: "",
                password_hash: "$argon2id$bench",
            },
            now,
        )
        .await
        .unwrap()
        .sub;
    for i in 0..a.vms {
        let host = db
            .insert_host(
                NewHost {
                    slug: &format!("spark-{i}"),
                    owner_sub: &customer,
                    profile_id: "gb10-spark-1",
                    gpu_type: "spark-1",
                },
                now,
            )
            .await
            .unwrap()
            .id;
        db.create_vm(
            NewVm {
                user_sub: &customer,
                host_id: Some(&host),
                name: &format!("vm-{i}"),
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            now,
        )
        .await
        .unwrap();
    }
    let session = SecretToken::generate(TokenKind::Session);
    db.create_session(
        &session.hash(),
        &customer,
        now,
        now + chrono::Duration::hours(12),
    )
    .await
    .unwrap();
    let config = Config {
        metrics_listen: None,
        cookie_secure: false,
        password_hashing: PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        ..Config::default()
    };
    let cookie = format!(
        "{}={}",
        byo_server::auth::session::session_cookie(false),
        session.expose()
    );
    let state = AppState::new(db.store.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api/vms", listener.local_addr().unwrap());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(byo_server::serve(state, listener, async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    }));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(a.clients)
        .build()
        .unwrap();
    // The answer is the customer's instances, each call.
    let first = client
        .get(url.as_str())
        .header("cookie", cookie.as_str())
        .send()
        .await
        .unwrap();
    assert_eq!(first.status().as_u16(), 200);
    let listed: serde_json::Value = first.json().await.unwrap();
    assert_eq!(
        listed.as_array().map(Vec::len),
        Some(a.vms),
        "the customer's instances: {listed}"
    );

    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.clients {
        let (client, url, cookie) = (client.clone(), url.clone(), cookie.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let resp = client
                    .get(url.as_str())
                    .header("cookie", cookie.as_str())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status().as_u16(), 200);
                resp.bytes().await.unwrap();
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
    let rate = all.len() as f64 / elapsed;
    println!(
        "{backend:>8} GET /api/vms over HTTP: {} clients, {} instances, {elapsed:.1} s: {} requests, \
         {rate:.0} req/s; latency p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms",
        a.clients,
        a.vms,
        all.len(),
        percentile_ms(&all, 0.50),
        percentile_ms(&all, 0.90),
        percentile_ms(&all, 0.99),
        percentile_ms(&all, 0.999),
        percentile_ms(&all, 1.0),
    );
    let what = format!("{backend} GET /api/vms over HTTP ({} clients)", a.clients);
    println!(
        "{}",
        figure_line(
            "api_bench",
            &what,
            rate,
            "req/s",
            Some(Target::AtLeast(15_000.0))
        )
    );
    println!(
        "{}",
        figure_line(
            "api_bench",
            &format!("{backend} GET /api/vms p99"),
            percentile_ms(&all, 0.99),
            "ms",
            Some(Target::AtMost(5.0)),
        )
    );
    let _ = stop_tx.send(true);
    server.await.unwrap().unwrap();
    db.store.close().await;
}

#[tokio::main]
async fn main() {
    let a = args();
    for backend in a.backends.clone() {
        run(backend, &a).await;
    }
}
