//! Notices to people (issue #38, 3), on both backends: a condition the sweep judges (a
//! host unreachable, a job failing run after run) reaches exactly the right people once,
//! is cleared when it goes away and noticed again when it comes back; what a person turned
//! off is never raised; delivery goes over a real SMTP server (Debian's aiosmtpd, started
//! here) and a signed webhook on loopback, each channel once, through a server refusing and
//! coming back; a permanent refusal is given up. Queue and booking events are asserted where
//! they happen (`queue.rs`).

use crate::with_world;

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use byo_core::notices::{WEBHOOK_ID_HEADER, WEBHOOK_SIGNATURE_HEADER, WEBHOOK_TIMESTAMP_HEADER};
use byo_db::Backend;
use byo_db::jobs::NewJobRun;
use byo_server::app::notices::{self, Delivered};
use byo_server::clock::Clock;
use byo_server::providers::notify::NoticesConfig;
use byo_server::{AppState, Config};
use byo_wire::states::NoticeKind;
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::{Value, json};

use crate::support::smtp::Smtp;
use crate::support::{self, TestApp, User};

with_world!(
    an_unreachable_host_is_noticed_once_to_operators_and_its_owner_and_again_after_it_returns,
    a_job_failing_run_after_run_is_noticed_to_operators_until_it_succeeds,
    each_swept_failure_reaches_exactly_its_people_once,
    a_retired_host_is_told_to_its_owner,
    what_a_person_turned_off_is_not_raised_and_a_kind_not_theirs_is_refused,
);

const SECRET: &str = "a webhook secret of thirty-two or more characters";

fn start() -> DateTime<Utc> {
    "2026-12-01T12:00:00Z".parse().unwrap()
}

struct World {
    app: TestApp,
    clock: Clock,
    op: User,
    root: User,
    owner: User,
    customer: User,
}

async fn world_with(backend: Backend, config: Config) -> Option<World> {
    let db = byo_db::testing::fresh(backend).await?;
    let clock = Clock::manual(start());
    let state = AppState::new(db.store.clone(), config).with_clock(clock.clone());
    let router = byo_server::router(state.clone());
    let app = TestApp { db, state, router };
    let op = app.operator("op@example.com").await;
    let root = app.superadmin("root@example.com").await;
    let owner = app.community_host("owner@example.com").await;
    let customer = app.customer("customer@example.com").await;
    Some(World {
        app,
        clock,
        op,
        root,
        owner,
        customer,
    })
}

async fn world(backend: Backend) -> Option<World> {
    world_with(backend, support::test_config()).await
}

impl World {
    fn db(&self) -> &byo_db::Store {
        &self.app.db.store
    }

    /// The newest notice of `sub`'s.
    async fn notice_of(&self, sub: &str) -> byo_db::notices::NoticeRow {
        self.db().notices(Some(sub), 10).await.unwrap().remove(0)
    }

    async fn sweep(&self) -> notices::Sweep {
        notices::sweep_once(&self.app.state).await.unwrap()
    }

    /// (kind, recipient, cleared) of every notice, sorted.
    async fn rows(&self) -> Vec<(String, String, bool)> {
        let mut all: Vec<_> = self
            .db()
            .notices(None, 1000)
            .await
            .unwrap()
            .into_iter()
            .map(|n| (n.kind, n.recipient_sub, n.cleared_at.is_some()))
            .collect();
        all.sort();
        all
    }
}

fn sorted(mut v: Vec<(String, String, bool)>) -> Vec<(String, String, bool)> {
    v.sort();
    v
}

fn row(kind: NoticeKind, to: &User, cleared: bool) -> (String, String, bool) {
    (kind.as_str().to_owned(), to.sub.clone(), cleared)
}

async fn an_unreachable_host_is_noticed_once_to_operators_and_its_owner_and_again_after_it_returns(
    w: World,
) {
    let t = w.clock.now();
    // In service, last heard from an hour ago: unreachable by placement's 90 s.
    let host =
        byo_db::testing::pickable_host(w.db(), &w.owner.sub, "spark-7", t - TimeDelta::hours(1))
            .await;
    let s = w.sweep().await;
    assert_eq!((s.present, s.raised, s.cleared), (1, 3, 0), "{s:?}");
    let unreachable = NoticeKind::HostUnreachable;
    assert_eq!(
        w.rows().await,
        sorted(vec![
            row(unreachable, &w.op, false),
            row(unreachable, &w.root, false),
            row(unreachable, &w.owner, false),
        ]),
        "operators and the owner; never the customer"
    );
    let mine = w.owner.get("/api/me/notices").await.json();
    let n = &mine["recent"][0];
    assert_eq!(
        n["subject"],
        "spark-7 has been unreachable since 2026-12-01 11:00 UTC"
    );
    assert!(
        n["body"]
            .as_str()
            .unwrap()
            .contains("systemctl status enverge-agent"),
        "{n}"
    );
    assert_eq!(n["to"], "owner@example.com");
    assert_eq!(n["delivery"], "kept here", "no channel is configured");

    // Still unreachable a sweep later: nothing new.
    w.clock.advance(TimeDelta::minutes(1));
    let s = w.sweep().await;
    assert_eq!((s.present, s.raised, s.cleared), (1, 0, 0), "{s:?}");

    // It beats again: cleared for everyone.
    let now = w.clock.now();
    w.db()
        .execute_unchecked(&format!(
            "update host_status set seen_at = '{}' where host_id = '{host}'",
            now.to_rfc3339()
        ))
        .await
        .unwrap();
    let s = w.sweep().await;
    assert_eq!((s.present, s.raised, s.cleared), (0, 0, 3), "{s:?}");
    assert!(w.rows().await.iter().all(|(_, _, cleared)| *cleared));

    // Silent again: a new notice each.
    w.clock.advance(TimeDelta::minutes(10));
    let s = w.sweep().await;
    assert_eq!((s.present, s.raised, s.cleared), (1, 3, 0), "{s:?}");
    assert_eq!(w.rows().await.len(), 6);

    // The operators' outbox lists them; a customer's own list has none.
    let outbox = w.op.get("/api/admin/outbox").await.json();
    assert_eq!(outbox.as_array().unwrap().len(), 6, "{outbox}");
    let page = w.op.page("/admin/outbox").await;
    assert!(
        page.contains("spark-7 has been unreachable since"),
        "{page}"
    );
    assert!(
        page.contains("no [notices] channel is configured"),
        "{page}"
    );
    let theirs = w.customer.get("/api/me/notices").await.json();
    assert!(theirs["recent"].as_array().unwrap().is_empty(), "{theirs}");

    // An owner who stopped hosting is not told their quiet host is quiet; operators are.
    w.db()
        .execute_unchecked(&format!(
            "update hosts set active = false where id = '{host}'"
        ))
        .await
        .unwrap();
    w.db()
        .execute_unchecked(&format!(
            "update host_status set seen_at = '{}' where host_id = '{host}'",
            w.clock.now().to_rfc3339()
        ))
        .await
        .unwrap();
    w.sweep().await;
    w.clock.advance(TimeDelta::minutes(10));
    let s = w.sweep().await;
    assert_eq!(s.raised, 2, "{s:?}");
}

async fn a_job_failing_run_after_run_is_noticed_to_operators_until_it_succeeds(w: World) {
    let run = |outcome: &'static str, error: Option<&'static str>, at: DateTime<Utc>| NewJobRun {
        job: "reap",
        started_at: at,
        duration_ms: 5,
        outcome,
        summary: None,
        error,
    };
    let t = w.clock.now();
    for i in 0..2 {
        w.db()
            .record_job_run(run(
                "failed",
                Some("cloudflare said 500"),
                t + TimeDelta::seconds(i),
            ))
            .await
            .unwrap();
    }
    assert_eq!(
        w.sweep().await.raised,
        0,
        "two failures are not yet repeatedly"
    );
    w.db()
        .record_job_run(run(
            "failed",
            Some("cloudflare said 500"),
            t + TimeDelta::seconds(2),
        ))
        .await
        .unwrap();
    let s = w.sweep().await;
    assert_eq!(s.raised, 2, "{s:?}");
    let failing = NoticeKind::JobFailing;
    assert_eq!(
        w.rows().await,
        sorted(vec![
            row(failing, &w.op, false),
            row(failing, &w.root, false)
        ]),
        "operators only"
    );
    let n = &w.root.get("/api/me/notices").await.json()["recent"][0];
    assert_eq!(n["subject"], "The reap job keeps failing");
    assert!(
        n["body"].as_str().unwrap().contains("cloudflare said 500"),
        "{n}"
    );
    w.db()
        .record_job_run(run("ok", None, t + TimeDelta::seconds(3)))
        .await
        .unwrap();
    let s = w.sweep().await;
    assert_eq!((s.raised, s.cleared), (0, 2), "{s:?}");
}

/// Every other condition the sweep judges, injected at once: a stuck delete, a rollback, a
/// halted fleet upgrade (operators), preparation stopped (the owner alone), then the key list
/// nearing expiry (operators, once per threshold: 30, 14, 7 days).
async fn each_swept_failure_reaches_exactly_its_people_once(w: World) {
    let t = w.clock.now();
    let db = w.db();
    let host = byo_db::testing::pickable_host(db, &w.owner.sub, "spark-1", t).await;
    let vm = db
        .create_vm(
            byo_db::vms::NewVm {
                user_sub: &w.customer.sub,
                host_id: Some(&host),
                name: "vm-stuck0001",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            t - TimeDelta::minutes(20),
        )
        .await
        .unwrap();
    db.mark_vm_running(&vm.id, Some(2201)).await.unwrap();
    db.request_vm_delete(&vm.id, t - TimeDelta::minutes(11))
        .await
        .unwrap();
    db.execute_unchecked(&format!(
        r#"update host_status set details = '{{"rollback": {{"at": "2026-12-01T11:58:00Z"}}}}'
           where host_id = '{host}'"#
    ))
    .await
    .unwrap();
    db.execute_unchecked(&format!(
        "insert into fleet_upgrades (id, build, state, open_marker, canary, growth, wait_secs,
                                     halt_reason, started_by, started_at, updated_at)
         values ('run-1', 'aaaaaaaaaaaa', 'halted', 'open', 1, 2, 60, 'the canary rolled back',
                 '{}', '{t}', '{t}')",
        w.root.sub,
        t = t.to_rfc3339()
    ))
    .await
    .unwrap();
    let preparing = db
        .insert_host(
            byo_db::hosts::NewHost {
                slug: "spark-2",
                owner_sub: &w.owner.sub,
                profile_id: "gb10-spark-1",
                gpu_type: "spark-1",
            },
            t,
        )
        .await
        .unwrap()
        .id;
    db.execute_unchecked(&format!(
        r#"update hosts set pubkey = 'wg', prepare_state = '{{"state": "failed", "step": "lxd-install", "attempt": 1, "error": null, "final": false, "at": "2026-11-29T12:00:00Z"}}'
           where id = '{preparing}'"#
    ))
    .await
    .unwrap();

    let s = w.sweep().await;
    assert_eq!(s.present, 4, "{s:?}");
    let mut want = Vec::new();
    for kind in [
        NoticeKind::DeleteStuck,
        NoticeKind::HostRollback,
        NoticeKind::FleetUpgradeHalted,
    ] {
        want.push(row(kind, &w.op, false));
        want.push(row(kind, &w.root, false));
    }
    want.push(row(NoticeKind::HostPrepareStopped, &w.owner, false));
    assert_eq!(w.rows().await, sorted(want.clone()));
    assert_eq!(w.sweep().await.raised, 0, "each once");
    let owners = w.owner.get("/api/me/notices").await.json();
    let n = &owners["recent"][0];
    assert_eq!(
        n["subject"],
        "Preparing spark-2 stopped at step lxd-install"
    );
    assert!(
        n["body"]
            .as_str()
            .unwrap()
            .contains(&format!("/hosts/{preparing}")),
        "{n}"
    );
    let ops = w.op.get("/api/me/notices").await.json();
    let subjects: Vec<&str> = ops["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["subject"].as_str().unwrap())
        .collect();
    for s in [
        "spark-1: a delete was never confirmed",
        "spark-1: an upgrade was rolled back",
        "The fleet upgrade to aaaaaaaaaaaa halted",
    ] {
        assert!(subjects.contains(&s), "{s}: {subjects:?}");
    }

    // Each goes away: each is cleared, and nothing new is raised.
    db.confirm_vm_deleted(&vm.id, t).await.unwrap();
    db.execute_unchecked(&format!(
        "update host_status set details = '{{}}' where host_id = '{host}'"
    ))
    .await
    .unwrap();
    db.execute_unchecked(&format!(
        "update fleet_upgrades set state = 'closed', open_marker = null, closed_at = '{}'",
        t.to_rfc3339()
    ))
    .await
    .unwrap();
    db.execute_unchecked(&format!(
        "update hosts set prepare_state = null where id = '{preparing}'"
    ))
    .await
    .unwrap();
    let s = w.sweep().await;
    assert_eq!((s.present, s.raised, s.cleared), (0, 0, 7), "{s:?}");

    // The key list: nothing while far from expiry; within 14 days, then within 7, a notice each.
    w.app.publish_operator_keys().await;
    db.execute_unchecked("delete from notices").await.unwrap();
    let expires = byo_server::app::host_problems::list_expiry(
        db.published_key_list().await.unwrap().as_ref(),
    )
    .unwrap();
    let keep_beating = |at: DateTime<Utc>| {
        format!(
            "update host_status set seen_at = '{}' where host_id = '{host}'",
            at.to_rfc3339()
        )
    };
    assert_eq!(w.sweep().await.raised, 0);
    // (Publishing made a superadmin of its own: every operator is told.)
    let operators = db.operator_subs().await.unwrap();
    assert_eq!(operators.len(), 3);
    // A month out, then within 14 days, then within 7: each a notice, the one before cleared.
    for (left, cleared) in [(20, 0), (10, 3), (6, 3)] {
        w.clock
            .advance(expires - TimeDelta::days(left) - w.clock.now());
        db.execute_unchecked(&keep_beating(w.clock.now()))
            .await
            .unwrap();
        let s = w.sweep().await;
        assert_eq!(
            (s.present, s.raised, s.cleared),
            (1, 3, cleared),
            "{left} days: {s:?}"
        );
    }
    let rows = w.rows().await;
    assert_eq!(rows.len(), 9);
    assert!(
        rows.iter()
            .all(|(k, to, _)| k == "key_list.expiring" && operators.contains(to)),
        "{rows:?}"
    );
    let subjects: Vec<String> = db
        .notices(Some(&w.op.sub), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.subject)
        .collect();
    assert_eq!(
        subjects,
        [
            "The operator-key list expires within 7 days",
            "The operator-key list expires within 14 days",
            "The operator-key list expires within 30 days"
        ]
    );
}

/// An event raised where it happens: a retire tells the owner (the queue's in `queue.rs`, a
/// booking's launch in `prebookings.rs`).
async fn a_retired_host_is_told_to_its_owner(w: World) {
    let t = w.clock.now();
    let host = byo_db::testing::pickable_host(w.db(), &w.owner.sub, "spark-9", t).await;
    w.db()
        .execute_unchecked("update hosts set pubkey = 'wg'")
        .await
        .unwrap();
    w.db()
        .depool_host(&host, "worn out", &w.op.sub, t)
        .await
        .unwrap();
    let r =
        w.op.post(&format!("/api/admin/hosts/{host}/retire"), json!({}))
            .await;
    assert!(r.status.is_success(), "{}", r.text());
    assert_eq!(
        w.rows().await,
        [row(NoticeKind::HostRetired, &w.owner, false)]
    );
    let n = &w.owner.get("/api/me/notices").await.json()["recent"][0];
    assert_eq!(n["subject"], "Your host spark-9 was retired");
}

async fn what_a_person_turned_off_is_not_raised_and_a_kind_not_theirs_is_refused(w: World) {
    let kinds = |v: &Value| -> Vec<(String, bool)> {
        v["preferences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["kind"].as_str().unwrap().to_owned(),
                    p["on"].as_bool().unwrap(),
                )
            })
            .collect()
    };
    let mine = w.customer.get("/api/me/notices").await.json();
    assert_eq!(
        kinds(&mine),
        [
            ("queue.placed".to_owned(), true),
            ("queue.expired".to_owned(), true),
            ("booking.launched".to_owned(), true),
            ("billing.payment_failed".to_owned(), true),
            ("billing.instances_stopped".to_owned(), true),
            ("instance.ended".to_owned(), true),
        ],
        "a customer is sent only their own queue, bookings, billing and instances"
    );
    assert_eq!(kinds(&w.op.get("/api/me/notices").await.json()).len(), 14);
    assert_eq!(kinds(&w.owner.get("/api/me/notices").await.json()).len(), 9);

    // A kind that is not theirs, and one that does not exist: refused, nothing stored.
    for (kind, status, code) in [
        ("job.failing", StatusCode::BAD_REQUEST, Some("not_yours")),
        ("no.such.kind", StatusCode::UNPROCESSABLE_ENTITY, None),
    ] {
        let r = w
            .customer
            .put("/api/me/notices", json!({"kind": kind, "on": false}))
            .await;
        assert_eq!(r.status, status, "{kind}: {}", r.text());
        if let Some(code) = code {
            assert_eq!(r.json()["error"], code);
        }
        assert!(
            w.db()
                .notice_opt_outs(&w.customer.sub)
                .await
                .unwrap()
                .is_empty()
        );
    }

    // Turned off on the page: not raised; back on through the API: raised.
    let r = w
        .customer
        .post_form("/notices", &[("kind", "queue.expired"), ("on", "false")])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let page = w.customer.page("/notices").await;
    assert!(
        page.contains("A queued instance of mine expired unplaced"),
        "{page}"
    );
    assert!(page.contains("Turn on"), "{page}");
    notices::queue_expired(&w.app.state, "q-1", &w.customer.sub, "spark-1").await;
    assert!(w.rows().await.is_empty(), "turned off: not raised");
    let r = w
        .customer
        .put(
            "/api/me/notices",
            json!({"kind": "queue.expired", "on": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    notices::queue_expired(&w.app.state, "q-1", &w.customer.sub, "spark-1").await;
    notices::queue_expired(&w.app.state, "q-1", &w.customer.sub, "spark-1").await;
    assert_eq!(
        w.rows().await,
        [row(NoticeKind::QueueExpired, &w.customer, false)],
        "one event, one notice"
    );
}

// ------------------------------------------------------------------ delivery, for real

/// What the webhook receiver was sent: each request's headers and body.
type Received = Arc<Mutex<Vec<(HeaderMap, Vec<u8>)>>>;

/// A webhook receiver on loopback answering `status`, keeping what it was sent.
struct Hook {
    url: String,
    status: Arc<AtomicU16>,
    got: Received,
}

async fn hook() -> Hook {
    let status = Arc::new(AtomicU16::new(200));
    let got: Received = Arc::default();
    let (s, g) = (status.clone(), got.clone());
    let app = Router::new().route(
        "/hook",
        post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let (s, g) = (s.clone(), g.clone());
            async move {
                g.lock().unwrap().push((headers, body.to_vec()));
                StatusCode::from_u16(s.load(Ordering::SeqCst)).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Hook { url, status, got }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_sqlite() {
    delivery(Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_postgres() {
    delivery(Backend::Postgres).await
}

/// Email and the webhook, through refusals: each channel takes each notice once.
async fn delivery(backend: Backend) {
    let Some(smtp) = Smtp::start() else { return };
    let hook = hook().await;
    let mut config = support::test_config();
    config.notices = NoticesConfig {
        smtp_url: Some(format!("smtp://127.0.0.1:{}", smtp.port).into()),
        from: "byo <noreply@example.com>".to_owned(),
        webhook_url: Some(hook.url.clone()),
        webhook_secret: Some(SECRET.to_owned().into()),
    };
    let Some(w) = world_with(backend, config).await else {
        return;
    };
    let nobody = w.app.customer("nobody@example.com").await;
    let state = &w.app.state;
    let deliver = || async { notices::deliver_once(state).await.unwrap() };
    let raised = notices::raise(
        state,
        NoticeKind::QueueExpired,
        "queue.expired:q-1",
        &[w.customer.sub.clone(), nobody.sub.clone()],
        "Your queued spark-1 instance expired",
        "No spark-1 host became free in time.",
    )
    .await
    .unwrap();
    assert_eq!(raised, 2);

    // The mail server refuses for now (451), the webhook answers 503.
    smtp.refuse(true);
    hook.status.store(503, Ordering::SeqCst);
    let d = deliver().await;
    assert_eq!(
        d,
        Delivered {
            sent: 0,
            retrying: 1,
            given_up: 1
        },
        "{d:?}"
    );
    let n = w.notice_of(&w.customer.sub).await;
    assert_eq!(
        (n.attempts, n.email_sent_at, n.webhook_sent_at),
        (1, None, None)
    );
    assert_eq!(
        n.next_attempt_at,
        Some(w.clock.now() + TimeDelta::seconds(30))
    );
    assert!(
        n.last_error.as_deref().unwrap().contains("451"),
        "{:?}",
        n.last_error
    );
    let gone = w.notice_of(&nobody.sub).await;
    assert_eq!(gone.given_up_at, Some(w.clock.now()), "550 is permanent");
    assert!(
        gone.last_error.as_deref().unwrap().contains("550"),
        "{:?}",
        gone.last_error
    );
    assert!(smtp.messages().is_empty());
    // Not due yet: nothing is tried.
    assert_eq!(deliver().await, Delivered::default());

    // The mail server is back; the webhook still failing: the mail goes, once.
    smtp.refuse(false);
    w.clock.advance(TimeDelta::seconds(30));
    let d = deliver().await;
    assert_eq!(d.retrying, 1, "{d:?}");
    let n = w.notice_of(&w.customer.sub).await;
    assert_eq!(n.email_sent_at, Some(w.clock.now()));
    assert_eq!(n.webhook_sent_at, None);
    assert_eq!(
        n.next_attempt_at,
        Some(w.clock.now() + TimeDelta::seconds(60))
    );
    let mail = smtp.messages();
    assert_eq!(mail.len(), 1);
    assert!(
        mail[0].contains("Subject: Your queued spark-1 instance expired"),
        "{}",
        mail[0]
    );
    assert!(
        mail[0].contains(&format!("Message-ID: <{}@example.com>", n.id)),
        "{}",
        mail[0]
    );
    assert!(mail[0].contains("customer@example.com"), "{}", mail[0]);

    // The webhook is back: only it is sent again; the mail is not.
    hook.status.store(200, Ordering::SeqCst);
    w.clock.advance(TimeDelta::seconds(60));
    let d = deliver().await;
    assert_eq!(
        d,
        Delivered {
            sent: 1,
            retrying: 0,
            given_up: 0
        },
        "{d:?}"
    );
    let n = w.notice_of(&w.customer.sub).await;
    assert_eq!(
        (n.attempts, n.next_attempt_at, n.webhook_sent_at),
        (3, None, Some(w.clock.now()))
    );
    assert_eq!(smtp.messages().len(), 1, "the mail is never sent twice");
    w.clock.advance(TimeDelta::hours(2));
    assert_eq!(deliver().await, Delivered::default());
    assert_eq!(smtp.messages().len(), 1);

    // What the webhook was sent: the notice, signed over its timestamp and body.
    let got = hook.got.lock().unwrap().clone();
    let (headers, body) = got
        .iter()
        .rev()
        .find(|(h, _)| h[WEBHOOK_ID_HEADER] == n.id.as_str())
        .unwrap();
    let ts: i64 = headers[WEBHOOK_TIMESTAMP_HEADER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        headers[WEBHOOK_SIGNATURE_HEADER].to_str().unwrap(),
        byo_core::notices::webhook_signature(SECRET.as_bytes(), ts, body)
    );
    let sent: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(sent["kind"], "queue.expired");
    assert_eq!(sent["to"], "customer@example.com");
    assert_eq!(sent["subject"], "Your queued spark-1 instance expired");
    // (Two hours on, the first session has expired: a fresh operator reads the outbox.)
    let op = w.app.operator("op2@example.com").await;
    let page = op.page("/admin/outbox").await;
    assert!(page.contains("Sent by email and the webhook"), "{page}");
    assert!(page.contains("given up"), "{page}");
}

#[test]
fn channels_that_would_cross_a_network_in_clear_are_refused_at_load() {
    let check = |smtp: Option<&str>, hook: Option<&str>, secret: Option<&str>| {
        NoticesConfig {
            smtp_url: smtp.map(|s| s.to_owned().into()),
            from: "byo <noreply@example.com>".to_owned(),
            webhook_url: hook.map(str::to_owned),
            webhook_secret: secret.map(|s| s.to_owned().into()),
        }
        .validate()
    };
    let refused = check(Some("smtp://user:pw@mail.example.com:25"), None, None).unwrap_err();
    assert!(
        refused.contains("in clear") && !refused.contains("pw"),
        "{refused}"
    );
    for ok in [
        "smtps://user:pw@mail.example.com",
        "smtp://user:pw@mail.example.com:587?tls=required",
        "smtp://127.0.0.1:2525",
        "smtp://[::1]:25",
        "smtp://localhost:25",
    ] {
        assert_eq!(check(Some(ok), None, None), Ok(()), "{ok}");
    }
    assert!(check(Some("http://mail.example.com"), None, None).is_err());
    assert!(
        check(None, Some("http://hooks.example.com/x"), Some(SECRET))
            .unwrap_err()
            .contains("https")
    );
    assert_eq!(
        check(None, Some("https://hooks.example.com/x"), Some(SECRET)),
        Ok(())
    );
    assert_eq!(
        check(None, Some("http://127.0.0.1:9/x"), Some(SECRET)),
        Ok(())
    );
    assert!(
        check(None, Some("https://hooks.example.com/x"), Some("short"))
            .unwrap_err()
            .contains("32")
    );
    assert!(
        check(None, Some("https://hooks.example.com/x"), None)
            .unwrap_err()
            .contains("together")
    );
    assert!(check(None, None, Some(SECRET)).is_err());
    let mut bad_from = NoticesConfig {
        smtp_url: Some("smtps://mail.example.com".to_owned().into()),
        ..NoticesConfig::default()
    };
    bad_from.from = "not an address".to_owned();
    assert!(bad_from.validate().unwrap_err().contains("notices.from"));
}
