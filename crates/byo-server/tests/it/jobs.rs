//! The background-job driver (issue #13, deliverable 1; docs/jobs.md): one replica at a
//! time per job on PostgreSQL (two servers on one database), each run recorded with its
//! outcome, duration and error, a failing job run again, the runs on /admin/jobs and
//! `/api/admin/jobs`, and the driver's schedule and triggers running the jobs on SQLite.

use crate::on_each_backend;
use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use byo_db::Store;
use byo_server::AppState;
use byo_server::app::jobs::{Job, JobDriver, Tick, registry};
use support::TestApp;

/// A job that sleeps `hold` and tracks how many of its runs are in flight at once.
#[derive(Default)]
struct Tracker {
    now: AtomicUsize,
    max: AtomicUsize,
    runs: AtomicUsize,
}

fn tracked(name: &str, every: Duration, hold: Duration, t: Arc<Tracker>) -> Job {
    Job::new(name, every, move |_state| {
        let t = t.clone();
        Box::pin(async move {
            let in_flight = t.now.fetch_add(1, Ordering::SeqCst) + 1;
            t.max.fetch_max(in_flight, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            t.now.fetch_sub(1, Ordering::SeqCst);
            let n = t.runs.fetch_add(1, Ordering::SeqCst) + 1;
            Ok(format!("run {n}"))
        })
    })
}

/// A second server over the same database: its own pool (its own sessions), its own state
/// and driver.
async fn second_server(app: &TestApp) -> AppState {
    let store = Store::connect(&app.db.url).await.unwrap();
    AppState::new(store, support::test_config())
}

/// Two servers on one PostgreSQL database, each driving the same job on its schedule, on
/// its trigger and on direct ticks: the job never runs twice at once, every run is
/// recorded with its outcome and duration, and the server that lost the lock recorded
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_servers_on_one_postgres_never_run_a_job_twice_at_once() {
    let Some(app) = TestApp::new(byo_db::Backend::Postgres).await else {
        return;
    };
    let other = second_server(&app).await;
    let t = Arc::new(Tracker::default());
    let hold = Duration::from_millis(40);
    let job = || tracked("contended", Duration::from_millis(15), hold, t.clone());
    let a = JobDriver::new(app.state.clone(), vec![job()]);
    let b = JobDriver::new(other.clone(), vec![job()]);
    // First, direct ticks from both servers at once.
    let mut ticks = Vec::new();
    for i in 0..40 {
        let d = if i % 2 == 0 { a.clone() } else { b.clone() };
        ticks.push(tokio::spawn(async move {
            d.tick("contended").await.unwrap().unwrap()
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut ran_here = 0;
    let mut skipped = 0;
    for t in ticks {
        match t.await.unwrap() {
            Tick::Ran { ok } => {
                assert!(ok);
                ran_here += 1
            }
            Tick::Skipped => skipped += 1,
        }
    }
    // Then both servers' schedules, with both triggers nudged over and over.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = a.spawn(stop_rx.clone());
    tasks.extend(b.spawn(stop_rx));
    for _ in 0..40 {
        a.trigger("contended").unwrap().nudge();
        b.trigger("contended").unwrap().nudge();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop_tx.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }

    assert_eq!(
        t.max.load(Ordering::SeqCst),
        1,
        "the job ran on both servers at once"
    );
    assert!(skipped > 0, "the direct ticks were never contended");
    assert!(ran_here > 0, "no direct tick ever got the lock");
    let runs = t.runs.load(Ordering::SeqCst);
    assert!(
        runs >= ran_here + 2,
        "the schedules ran nothing: {runs} runs"
    );
    let recorded = app.db.job_runs("contended", 1000).await.unwrap();
    assert_eq!(
        recorded.len(),
        runs.min(byo_db::jobs::KEEP_RUNS_PER_JOB as usize),
        "one row per run that happened, none for a skipped tick"
    );
    for r in &recorded {
        assert_eq!(r.outcome, "ok");
        assert!(
            r.duration_ms >= hold.as_millis() as i32,
            "duration {}",
            r.duration_ms
        );
        assert!(r.summary.as_deref().unwrap().starts_with("run "));
        assert_eq!(r.error, None);
    }
    // Runs never overlap in the record either: each starts after the one before ended.
    let mut by_start = recorded.clone();
    by_start.sort_by_key(|r| r.started_at);
    for w in by_start.windows(2) {
        let ended = w[0].started_at + chrono::TimeDelta::milliseconds(w[0].duration_ms as i64);
        assert!(w[1].started_at >= ended - chrono::TimeDelta::milliseconds(1));
    }
    // The lock is free afterwards: either server takes it at once.
    assert!(matches!(
        b.tick("contended").await.unwrap(),
        Some(Tick::Ran { ok: true })
    ));
    assert!(matches!(
        a.tick("contended").await.unwrap(),
        Some(Tick::Ran { ok: true })
    ));
}

/// Two replicas started together, as docs/for-operators.md deploys them: each period's
/// scheduled tick runs the job once across both, not once on each in turn (the walk of that
/// guide found every job run twice a period); a nudge still runs it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_run_a_scheduled_tick_once_between_them() {
    let Some(app) = TestApp::new(byo_db::Backend::Postgres).await else {
        return;
    };
    let other = second_server(&app).await;
    let t = Arc::new(Tracker::default());
    // An hour's period: the schedules' first ticks come at once, the next not in this test.
    let job = || {
        tracked(
            "hourly",
            Duration::from_secs(3600),
            Duration::from_millis(10),
            t.clone(),
        )
    };
    let a = JobDriver::new(app.state.clone(), vec![job()]);
    let b = JobDriver::new(other.clone(), vec![job()]);
    // The second replica's schedule starts once the first one's run is over: replicas'
    // timers are never in step, so each finds the lock free in turn.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = a.spawn(stop_rx.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(app.db.job_runs("hourly", 10).await.unwrap().len(), 1);
    tasks.extend(b.spawn(stop_rx));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        app.db.job_runs("hourly", 10).await.unwrap().len(),
        1,
        "both replicas ran the period's tick"
    );
    b.trigger("hourly").unwrap().nudge();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_tx.send(true).unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        app.db.job_runs("hourly", 10).await.unwrap().len(),
        2,
        "a nudge runs"
    );
    assert_eq!(t.runs.load(Ordering::SeqCst), 2);
}

/// A job that fails records its error (bounded) and a failed outcome; the next run still
/// happens and records success.
async fn a_failing_job_records_its_error_and_runs_again(app: TestApp) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let job = Job::new("flaky", Duration::from_secs(3600), move |_state| {
        let c = c.clone();
        Box::pin(async move {
            match c.fetch_add(1, Ordering::SeqCst) {
                0 => Err(byo_server::error::AppError::Conflict {
                    code: "flaky",
                    message: "the first run fails ".repeat(200),
                }),
                1 => panic!("the second run panics"),
                _ => Ok("fine".to_owned()),
            }
        })
    });
    let d = JobDriver::new(app.state.clone(), vec![job]);
    assert_eq!(
        d.tick("flaky").await.unwrap(),
        Some(Tick::Ran { ok: false })
    );
    assert_eq!(
        d.tick("flaky").await.unwrap(),
        Some(Tick::Ran { ok: false })
    );
    assert_eq!(d.tick("flaky").await.unwrap(), Some(Tick::Ran { ok: true }));
    assert_eq!(d.tick("no-such-job").await.unwrap(), None);
    let runs = app.db.job_runs("flaky", 10).await.unwrap();
    let outcomes: Vec<_> = runs.iter().map(|r| r.outcome.as_str()).collect();
    assert_eq!(outcomes, ["ok", "failed", "failed"]);
    assert_eq!(runs[0].summary.as_deref(), Some("fine"));
    assert_eq!(runs[0].error, None);
    assert!(
        runs[1]
            .error
            .as_deref()
            .unwrap()
            .contains("the second run panics")
    );
    let first = runs[2].error.as_deref().unwrap();
    assert!(first.contains("the first run fails"));
    assert_eq!(
        first.chars().count(),
        byo_server::app::jobs::MAX_TEXT + 1,
        "the error is bounded"
    );
}

/// Inside one process (SQLite's only guard) a job never overlaps itself: ticks fired at
/// once while a run is in flight are skipped, and record nothing.
async fn one_process_never_overlaps_a_job_with_itself(app: TestApp) {
    let t = Arc::new(Tracker::default());
    let d = JobDriver::new(
        app.state.clone(),
        vec![tracked(
            "solo",
            Duration::from_secs(3600),
            Duration::from_millis(100),
            t.clone(),
        )],
    );
    let ticks: Vec<_> = (0..10)
        .map(|_| {
            let d = d.clone();
            tokio::spawn(async move { d.tick("solo").await.unwrap().unwrap() })
        })
        .collect();
    let mut ran = 0;
    for tick in ticks {
        if tick.await.unwrap() != Tick::Skipped {
            ran += 1;
        }
    }
    assert_eq!(t.max.load(Ordering::SeqCst), 1, "the job overlapped itself");
    assert_eq!(ran, t.runs.load(Ordering::SeqCst));
    assert!(ran < 10, "no tick was skipped");
    assert_eq!(app.db.job_runs("solo", 100).await.unwrap().len(), ran);
}

/// Only the newest runs of a job are kept.
async fn only_the_newest_runs_of_a_job_are_kept(app: TestApp) {
    let t = Arc::new(Tracker::default());
    let d = JobDriver::new(
        app.state.clone(),
        vec![tracked(
            "busy",
            Duration::from_secs(3600),
            Duration::ZERO,
            t,
        )],
    );
    let keep = byo_db::jobs::KEEP_RUNS_PER_JOB as usize;
    for _ in 0..keep + 5 {
        d.tick("busy").await.unwrap();
    }
    let runs = app.db.job_runs("busy", 1000).await.unwrap();
    assert_eq!(runs.len(), keep);
    assert_eq!(
        runs[0].summary.as_deref(),
        Some(&*format!("run {}", keep + 5))
    );
}

/// The driver's schedule and its trigger run the jobs; stopping ends its tasks.
async fn the_driver_runs_the_jobs_on_their_period_and_trigger(app: TestApp) {
    let often = Arc::new(Tracker::default());
    let nudged = Arc::new(Tracker::default());
    let d = JobDriver::new(
        app.state.clone(),
        vec![
            tracked(
                "often",
                Duration::from_millis(50),
                Duration::ZERO,
                often.clone(),
            ),
            tracked(
                "nudged",
                Duration::from_secs(3600),
                Duration::ZERO,
                nudged.clone(),
            ),
        ],
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tasks = d.spawn(stop_rx);
    // The first tick of an interval is at once: "nudged" runs once at start.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(nudged.runs.load(Ordering::SeqCst), 1);
    d.trigger("nudged").unwrap().nudge();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(nudged.runs.load(Ordering::SeqCst), 2, "the nudge ran it");
    stop_tx.send(true).unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .expect("the driver stops")
            .unwrap();
    }
    let often_runs = often.runs.load(Ordering::SeqCst);
    assert!(often_runs >= 4, "the period ran it {often_runs} times");
    assert_eq!(
        app.db.job_runs("often", 1000).await.unwrap().len(),
        often_runs
    );
    assert_eq!(app.db.job_runs("nudged", 1000).await.unwrap().len(), 2);
}

/// reap and notify-stuck-deletes are on the driver; their runs are on /admin/jobs and
/// `/api/admin/jobs`, an error included, for operators only.
async fn the_admin_jobs_page_shows_the_runs(app: TestApp) {
    let names: Vec<_> = registry().into_iter().map(|j| j.name).collect();
    assert_eq!(
        names,
        [
            "reap",
            "notify-stuck-deletes",
            "notices",
            "settle-creates",
            "retire-stopped",
            "renew-operator-keys",
            "bill-usage",
            "pay-owners",
            "launch-prebookings",
            "expire-prebook",
            "expire-queue",
            "queue-drain"
        ]
    );
    let d = JobDriver::new(app.state.clone(), registry());
    assert_eq!(d.tick("reap").await.unwrap(), Some(Tick::Ran { ok: true }));
    assert_eq!(
        d.tick("notify-stuck-deletes").await.unwrap(),
        Some(Tick::Ran { ok: true })
    );
    app.db
        .record_job_run(byo_db::jobs::NewJobRun {
            job: "notify-stuck-deletes",
            started_at: app.state.clock.now() + chrono::TimeDelta::seconds(1),
            duration_ms: 7,
            outcome: "failed",
            summary: None,
            error: Some("database unreachable <b>"),
        })
        .await
        .unwrap();

    let op = app.operator("op@example.com").await;
    let page = op.get("/admin/jobs").await;
    assert_eq!(page.status, StatusCode::OK);
    let html = page.text();
    assert!(
        html.contains(r#"href="/admin/jobs""#),
        "linked from the nav"
    );
    assert!(html.contains(r#"id="job-reap""#));
    assert!(html.contains("every 1 min"));
    assert!(html.contains("every 5 min"));
    assert!(
        html.contains("released 0, failed 0, 0 expired sessions and 0 expired sign-ups purged")
    );
    assert!(html.contains("0 stuck deletes"));
    assert!(
        html.contains("database unreachable &lt;b&gt;"),
        "the error, escaped"
    );

    let api = op.get("/api/admin/jobs").await;
    assert_eq!(api.status, StatusCode::OK);
    let jobs = api.json();
    assert_eq!(jobs[0]["name"], "reap");
    assert_eq!(jobs[0]["every_secs"], 60);
    assert_eq!(jobs[0]["runs"][0]["outcome"], "ok");
    assert_eq!(
        jobs[0]["runs"][0]["summary"],
        "released 0, failed 0, 0 expired sessions and 0 expired sign-ups purged"
    );
    assert_eq!(jobs[1]["name"], "notify-stuck-deletes");
    assert_eq!(jobs[1]["runs"][0]["outcome"], "failed");
    assert_eq!(jobs[1]["runs"][0]["error"], "database unreachable <b>");
    assert_eq!(jobs[1]["runs"][0]["duration_ms"], 7);
    assert_eq!(jobs[1]["runs"][1]["outcome"], "ok");

    let customer = app.customer("c@example.com").await;
    assert_eq!(
        customer.get("/admin/jobs").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        customer.get("/api/admin/jobs").await.status,
        StatusCode::FORBIDDEN
    );
}

/// Issue #36, 8: a session past its expiry is refused at once and deleted by the next run of
/// `reap`; a live one stays and still signs its user in.
async fn reap_purges_expired_sessions_and_keeps_live_ones(app: TestApp) {
    use byo_core::tokens::{SecretToken, TokenKind};
    let customer = app.customer("c@example.com").await;
    let now = app.state.clock.now();
    let user = app
        .db
        .user_by_email("c@example.com")
        .await
        .unwrap()
        .unwrap();
    let expired = SecretToken::generate(TokenKind::Session).hash();
    app.db
        .create_session(
            &expired,
            &user.sub,
            now - chrono::TimeDelta::days(31),
            now - chrono::TimeDelta::seconds(1),
        )
        .await
        .unwrap();
    // Whether the row is there: a no-op update counts it.
    let kept = |app: &TestApp| {
        let db = app.db.clone();
        let sql = format!(
            "update sessions set expires_at = expires_at where token_hash = '{}'",
            expired.as_str()
        );
        async move { db.execute_unchecked(&sql).await.unwrap() == 1 }
    };
    assert!(kept(&app).await);
    let d = JobDriver::new(app.state.clone(), registry());
    assert_eq!(d.tick("reap").await.unwrap(), Some(Tick::Ran { ok: true }));
    let runs = app.db.job_runs("reap", 1).await.unwrap();
    assert_eq!(
        runs[0].summary.as_deref(),
        Some("released 0, failed 0, 1 expired sessions and 0 expired sign-ups purged")
    );
    assert!(!kept(&app).await, "the expired one is gone");
    assert!(
        app.db.session_user(&expired, now).await.unwrap().is_none(),
        "and it was refused before"
    );
    assert_eq!(
        customer.get("/api/me").await.status,
        StatusCode::OK,
        "a live session is kept"
    );
}

on_each_backend!(
    reap_purges_expired_sessions_and_keeps_live_ones,
    a_failing_job_records_its_error_and_runs_again,
    one_process_never_overlaps_a_job_with_itself,
    only_the_newest_runs_of_a_job_are_kept,
    the_driver_runs_the_jobs_on_their_period_and_trigger,
    the_admin_jobs_page_shows_the_runs,
);

/// The jobs and their periods are the ones docs/jobs.md's table lists, in its order: an
/// operator reads the period there, so a changed constant or a new job changes the table.
#[test]
fn the_jobs_and_their_periods_are_the_ones_docs_jobs_md_lists() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/jobs.md"))
        .unwrap();
    let documented: Vec<(String, u64)> = doc
        .lines()
        .filter_map(|line| {
            let cells: Vec<_> = line.split('|').map(str::trim).collect();
            let name = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let (_, period) = cells.get(2)?.split_once(" = ")?;
            let mut words = period.split_whitespace();
            let n: u64 = words.next()?.parse().ok()?;
            let unit = match words.next()?.trim_end_matches(',') {
                "s" => 1,
                "min" => 60,
                "h" => 3600,
                other => panic!("docs/jobs.md: unknown unit {other:?} in {line:?}"),
            };
            Some((name.to_owned(), n * unit))
        })
        .collect();
    let registered: Vec<(String, u64)> = registry()
        .into_iter()
        .map(|j| (j.name, j.every.as_secs()))
        .collect();
    assert_eq!(registered, documented);
}
