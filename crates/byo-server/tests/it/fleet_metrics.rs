//! The fleet on `/metrics` (issue #38): each failure an operator alerts on, injected into the
//! rows, is named by its gauge at the next scrape — on both databases — and the alerting rules
//! shipped in `docs/alerts.yml` pass `promtool check rules` and their unit tests
//! (`promtool test rules docs/alerts.test.yml`).

use crate::on_each_backend;
use crate::support;

use std::process::Command;

use byo_db::jobs::NewJobRun;
use byo_db::queue::NewQueued;
use byo_db::testing::pickable_host;
use byo_db::vms::NewVm;
use chrono::TimeDelta;
use support::TestApp;

/// The value of the sample `line` starts with (`byo_hosts{state="unreachable"}`).
fn sample(text: &str, line: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line).and_then(|v| v.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
}

/// `GET /metrics` on the metrics listener's own router, as Prometheus scrapes it.
async fn scrape(app: &TestApp) -> String {
    let router = byo_server::metrics_router(&app.state);
    let r = support::send(
        &router,
        axum::http::Request::get("/metrics")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, axum::http::StatusCode::OK);
    r.text()
}

async fn each_failure_is_named_by_its_gauge(app: TestApp) {
    let now = app.state.clock.now();
    let owner = app.community_host("owner@example.com").await;
    let customer = app.customer("customer@example.com").await;

    // A healthy fleet: one host heard from now, nothing waiting.
    let healthy = pickable_host(&app.db, &owner.sub, "spark-1", now).await;
    let text = scrape(&app).await;
    for (line, want) in [
        ("byo_fleet_read_ok", 1.0),
        ("byo_hosts{state=\"active\"}", 1.0),
        ("byo_hosts{state=\"unreachable\"}", 0.0),
        ("byo_stuck_deletes", 0.0),
        ("byo_queue_open", 0.0),
        ("byo_creates_open", 0.0),
        ("byo_operator_keys_expiry_timestamp_seconds", 0.0),
        ("byo_key_pushes_failed", 0.0),
        ("byo_fleet_upgrades_halted", 0.0),
    ] {
        assert_eq!(sample(&text, line), Some(want), "{line}:\n{text}");
    }

    // A host in placement whose last heartbeat is an hour old: unreachable, and the oldest.
    let silent = pickable_host(&app.db, &owner.sub, "spark-2", now - TimeDelta::hours(1)).await;
    // A delete asked for 11 minutes ago and never confirmed, on the healthy host.
    let vm = app
        .db
        .create_vm(
            NewVm {
                user_sub: &customer.sub,
                host_id: Some(&healthy),
                name: "vm-stuck0001",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            now - TimeDelta::minutes(20),
        )
        .await
        .unwrap();
    app.db.mark_vm_running(&vm.id, Some(2201)).await.unwrap();
    app.db
        .request_vm_delete(&vm.id, now - TimeDelta::minutes(11))
        .await
        .unwrap();
    // A create queued 30 minutes ago.
    app.db
        .enqueue_vm(
            NewQueued {
                user_sub: &customer.sub,
                gpu_type: "spark-1",
                ssh_key_id: "key-1",
                expires_at: now + TimeDelta::hours(72),
            },
            now - TimeDelta::minutes(30),
            10,
        )
        .await
        .unwrap();
    // A job whose newest run failed after an earlier success.
    for (at, outcome) in [(-10, "ok"), (-5, "failed")] {
        app.db
            .record_job_run(NewJobRun {
                job: "bill-usage",
                started_at: now + TimeDelta::minutes(at),
                duration_ms: 3,
                outcome,
                summary: None,
                error: (outcome == "failed").then_some("stripe: 500"),
            })
            .await
            .unwrap();
    }
    // A published operator-key list.
    app.publish_operator_keys().await;
    // A key push the healthy host refused, and a fleet upgrade halted by its canary.
    app.db
        .record_key_push(&healthy, Err("sshd would not load the list"), now)
        .await
        .unwrap();
    app.db
        .execute_unchecked(&format!(
            "insert into fleet_upgrades (id, build, state, open_marker, canary, growth, wait_secs,
                                         halt_reason, started_by, started_at, updated_at)
             values ('run-1', 'aaaaaaaaaaaa', 'halted', 'open', 1, 2, 60, 'the canary rolled back',
                     '{}', '{t}', '{t}')",
            owner.sub,
            t = now.to_rfc3339()
        ))
        .await
        .unwrap();

    let text = scrape(&app).await;
    for (line, want) in [
        ("byo_hosts{state=\"active\"}", 2.0),
        ("byo_hosts{state=\"unreachable\"}", 1.0),
        ("byo_stuck_deletes", 1.0),
        ("byo_queue_open", 1.0),
        ("byo_job_last_run_failed{job=\"bill-usage\"}", 1.0),
        ("byo_key_pushes_failed", 1.0),
        ("byo_fleet_upgrades_halted", 1.0),
        (
            "byo_job_last_success_timestamp_seconds{job=\"bill-usage\"}",
            (now - TimeDelta::minutes(10)).timestamp_millis() as f64 / 1000.0,
        ),
    ] {
        assert_eq!(sample(&text, line), Some(want), "{line}:\n{text}");
    }
    let age = |line: &str| sample(&text, line).unwrap_or_else(|| panic!("{line}:\n{text}"));
    assert!((3599.0..3700.0).contains(&age("byo_heartbeat_oldest_age_seconds")));
    assert!((659.0..760.0).contains(&age("byo_delete_oldest_age_seconds")));
    assert!((1799.0..1900.0).contains(&age("byo_queue_oldest_age_seconds")));
    assert!(
        age("byo_operator_keys_expiry_timestamp_seconds") > now.timestamp() as f64,
        "the list expires in the future"
    );

    // The silent host is de-pooled: no longer counted unreachable, counted de-pooled.
    app.db
        .depool_host(&silent, "fan noise", &owner.sub, now)
        .await
        .unwrap();
    let text = scrape(&app).await;
    assert_eq!(sample(&text, "byo_hosts{state=\"unreachable\"}"), Some(0.0));
    assert_eq!(sample(&text, "byo_hosts{state=\"depooled\"}"), Some(1.0));
}

on_each_backend!(each_failure_is_named_by_its_gauge);

/// The rules an operator loads pass Prometheus' own checks, and each fires on its failure
/// and not on a healthy fleet (`docs/alerts.test.yml`).
#[test]
fn the_alerting_rules_pass_promtool() {
    if !byo_core::testing::have_tools(&["promtool"]) {
        return;
    }
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts.test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(docs)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
