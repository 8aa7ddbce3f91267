//! The fleet at a glance (issue #38, 1: `/admin` and its API at 10,000 hosts, 1,000 with a
//! problem, on PostgreSQL — target p99 under 100 ms). A fresh database with `--hosts` hosts
//! (default 10,000), enrolled, prepared and in placement, every one beating except
//! `--problems` (default 1,000) whose agents went silent an hour ago; every tenth of those
//! also holds a delete nobody confirmed. Then `--requests` (default 200) sequential
//! requests, as one operator paging and filtering, through the real router in-process — the
//! session check, the five reads, the judge and the JSON or the page — alternating the
//! API's first page, its `problem=agent unreachable` filter, and `/admin`. Latency is per
//! request, as the server sees it.
//!
//! cargo run --release -p byo-server --example fleet_bench -- [sqlite|postgres|both]
//!     [--hosts N] [--problems N] [--requests N]
//! PostgreSQL comes from BYO_TEST_POSTGRES_URL (a database is created on it per run).

use std::time::Instant;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use byo_core::testing::{Target, figure_line, percentile_ms};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::Backend;
use byo_db::testing::TestDb;
use byo_db::users::NewUser;
use byo_server::config::PasswordHashing;
use byo_server::{AppState, Config};
use byo_wire::Role;
use tower::ServiceExt;

struct Args {
    backends: Vec<Backend>,
    hosts: usize,
    problems: usize,
    requests: usize,
}

fn args() -> Args {
    let mut a = Args {
        backends: vec![Backend::Postgres],
        hosts: 10_000,
        problems: 1_000,
        requests: 200,
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
            "--problems" => a.problems = num("--problems"),
            "--requests" => a.requests = num("--requests"),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// The fleet, written in a few statements (a recursive series both backends run), and an
/// operator's session cookie.
async fn fleet(db: &TestDb, a: &Args) -> String {
    let now = chrono::Utc::now();
    let at =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, false);
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
    let series = |n: usize| {
        format!(
            "with recursive s(i) as (select 0 union all select i + 1 from s where i < {})",
            n - 1
        )
    };
    db.execute_unchecked(&format!(
        "insert into hosts (id, slug, owner_sub, profile_id, gpu_type, active, prepared_at, pubkey,
                            created_at, activated_at)
         {} select 'h' || i, 'spark-' || i, '{owner}', 'gb10-spark-1', 'spark-1', true, '{t}',
                   'wg-' || i, '{t}', '{t}' from s",
        series(a.hosts),
        t = at(now - chrono::TimeDelta::days(1)),
    ))
    .await
    .unwrap();
    // Every host beats now, but the first `problems`, silent for an hour.
    for (from, to, seen) in [
        (0, a.problems, now - chrono::TimeDelta::hours(1)),
        (a.problems, a.hosts, now),
    ] {
        if to <= from {
            continue;
        }
        db.execute_unchecked(&format!(
            "insert into host_status (host_id, seen_at, agent_version, lxd, relay, tunnel, gpu,
                                      storage, instances, details)
             {} select 'h' || (i + {from}), '{t}', '0.7.3', 'ok', 'ok', 'ok', 'ok', 'ok', 0, '{{}}'
             from s",
            series(to - from),
            t = at(seen),
        ))
        .await
        .unwrap();
    }
    let stuck = a.problems.div_ceil(10).max(1);
    db.execute_unchecked(&format!(
        "insert into vms (id, user_sub, host_id, name, gpu_type, status, created_at,
                          delete_requested_at)
         {} select 'v' || i, '{owner}', 'h' || (i * 10), 'vm-' || i, 'spark-1', 'running', '{t}',
                   '{t}' from s",
        series(stuck),
        t = at(now - chrono::TimeDelta::hours(2)),
    ))
    .await
    .unwrap();
    let op = db
        .create_user(
            NewUser {
                email: "op@example.com",
                display_name: "",
                password_hash: "$argon2id$bench",
            },
            now,
        )
        .await
        .unwrap()
        .sub;
    db.grant_role(&op, Role::Operator, None, now).await.unwrap();
    let token = SecretToken::generate(TokenKind::Session);
    db.create_session(&token.hash(), &op, now, now + chrono::TimeDelta::hours(2))
        .await
        .unwrap();
    format!(
        "{}={}",
        byo_server::auth::session::SECURE_SESSION_COOKIE,
        token.expose()
    )
}

async fn run(backend: Backend, a: &Args) {
    let Some(db) = byo_db::testing::fresh(backend).await else {
        println!("{backend}: skipped (set BYO_TEST_POSTGRES_URL)");
        return;
    };
    let fill = Instant::now();
    let cookie = fleet(&db, a).await;
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
    let router = byo_server::router(AppState::new(db.store.clone(), config));
    let paths = [
        "/api/admin/fleet",
        "/api/admin/fleet?problem=agent%20unreachable&page=3",
        "/admin",
    ];
    let get = |path: &'static str| {
        let router = router.clone();
        let cookie = cookie.clone();
        async move {
            let req = Request::get(path)
                .header(header::COOKIE, cookie)
                .body(Body::empty())
                .unwrap();
            let resp = router.oneshot(req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{path}");
            axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .unwrap()
        }
    };
    // Once, to check what it says and warm the pools.
    let first: serde_json::Value = serde_json::from_slice(&get(paths[0]).await).unwrap();
    assert_eq!(first["counts"]["total"], a.hosts);
    assert_eq!(first["counts"]["unreachable"], a.problems);
    assert_eq!(first["counts"]["with_problem"], a.problems);
    let mut per_path: Vec<Vec<u32>> = vec![Vec::new(); paths.len()];
    let started = Instant::now();
    for k in 0..a.requests {
        let which = k % paths.len();
        let t0 = Instant::now();
        get(paths[which]).await;
        per_path[which].push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Where a request's time goes: the read, and the judging of what was read.
    let (mut reads, mut judged) = (Vec::new(), Vec::new());
    let now = chrono::Utc::now();
    for _ in 0..20 {
        let t0 = Instant::now();
        let read = db.fleet_read().await.unwrap();
        reads.push(t0.elapsed().as_micros() as u32);
        let t1 = Instant::now();
        let o = byo_server::app::fleet_overview::overview(
            &read,
            None,
            now - chrono::TimeDelta::seconds(90),
            now,
            &byo_server::app::fleet_overview::FleetFilter::default(),
        );
        judged.push(t1.elapsed().as_micros() as u32);
        assert_eq!(o.counts.total as usize, a.hosts);
    }
    reads.sort_unstable();
    judged.sort_unstable();
    println!(
        "{backend}: {} hosts ({} with a problem), filled in {filled:.1} s; {} requests in {elapsed:.1} s",
        a.hosts, a.problems, a.requests
    );
    println!(
        "  of which: the read p50 {:.1} ms, the judging p50 {:.1} ms",
        percentile_ms(&reads, 0.5),
        percentile_ms(&judged, 0.5)
    );
    for (path, mut l) in paths.iter().zip(per_path) {
        l.sort_unstable();
        println!(
            "  {path:<55} p50 {:>7.1} ms  p99 {:>7.1} ms  max {:>7.1} ms",
            percentile_ms(&l, 0.50),
            percentile_ms(&l, 0.99),
            percentile_ms(&l, 1.0)
        );
        // The target is PostgreSQL's (issue #38, 1).
        println!(
            "{}",
            figure_line(
                "fleet_bench",
                &format!("{backend} {path} p99 ({} hosts)", a.hosts),
                percentile_ms(&l, 0.99),
                "ms",
                (backend == Backend::Postgres).then_some(Target::AtMost(100.0)),
            )
        );
    }
}

#[tokio::main]
async fn main() {
    let a = args();
    for backend in a.backends.clone() {
        run(backend, &a).await;
    }
}
