//! Releases as rows (issue #14, 1; J "publishing is not delivery") and the fleet upgrade's
//! rules on the server (issue #14, 5; J note 9), on both backends. Builds are real ELF
//! executables (this test binary, and it with bytes appended: an ELF ignores trailing
//! bytes), signed with byo_core::release::sign as `byo release sign` signs them.

use crate::support;
use crate::with_world;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine;
use byo_server::AppState;
use byo_server::clock::Clock;
use byo_wire::fleet::SIGNATURE_HEADER;
use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};
use support::{Reply, TestApp, User};

fn release_key() -> &'static ssh_key::PrivateKey {
    static KEY: std::sync::OnceLock<ssh_key::PrivateKey> = std::sync::OnceLock::new();
    KEY.get_or_init(byo_core::keylist_testing::private_key)
}

const ARCH: &str = std::env::consts::ARCH;

fn other_arch() -> &'static str {
    if ARCH == "x86_64" {
        "aarch64"
    } else {
        "x86_64"
    }
}

/// A build: this test binary, with `marker` appended so each marker is another build.
fn build(marker: &str) -> Vec<u8> {
    let mut b = std::fs::read("/proc/self/exe").unwrap();
    b.extend_from_slice(marker.as_bytes());
    b
}

fn sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

struct World {
    app: TestApp,
    admin: User,
    op: User,
    release_dir: tempfile::TempDir,
    clock: Clock,
    now: DateTime<Utc>,
}

async fn world(backend: byo_db::Backend) -> Option<World> {
    let release_dir = tempfile::tempdir().unwrap();
    let mut config = support::test_config();
    config.release_dir = Some(release_dir.path().to_owned());
    config.release_key = Some(release_key().public_key().to_openssh().unwrap());
    let db = byo_db::testing::fresh(backend).await?;
    let now = DateTime::from_timestamp(1_900_000_000, 0).unwrap();
    let clock = Clock::manual(now);
    let state = AppState::new(db.store.clone(), config).with_clock(clock.clone());
    let router = byo_server::router(state.clone());
    let app = TestApp { db, state, router };
    let admin = app.superadmin("root@example.com").await;
    let op = app.operator("op@example.com").await;
    Some(World {
        app,
        admin,
        op,
        release_dir,
        clock,
        now,
    })
}

impl World {
    async fn publish_as(
        &self,
        who: &User,
        arch: &str,
        bytes: &[u8],
        signature: Option<&str>,
    ) -> Reply {
        let mut req = Request::post(format!(
            "/api/admin/releases/{arch}?version=byo-agent%200.1.0"
        ))
        .header(
            header::COOKIE,
            format!("__Host-byo_session={}", who.session),
        )
        .header(header::CONTENT_TYPE, "application/octet-stream");
        if let Some(s) = signature {
            req = req.header(
                SIGNATURE_HEADER,
                base64::engine::general_purpose::STANDARD.encode(s),
            );
        }
        self.app
            .send(req.body(Body::from(bytes.to_vec())).unwrap())
            .await
    }

    async fn publish(&self, arch: &str, bytes: &[u8]) -> Reply {
        let sig = byo_core::release::sign(release_key(), bytes).unwrap();
        self.publish_as(&self.admin, arch, bytes, Some(&sig)).await
    }

    /// What a publish may change: the rows, the kept builds, the audit log.
    async fn kept(&self) -> (Vec<String>, Vec<String>, usize) {
        let rows = self
            .app
            .db
            .releases(100)
            .await
            .unwrap()
            .into_iter()
            .map(|r| format!("{} {}", r.arch, r.sha256))
            .collect();
        let mut files: Vec<String> =
            std::fs::read_dir(self.release_dir.path().join("agent-builds"))
                .map(|d| {
                    d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
        files.sort();
        let audit = self.app.db.audit_log(1000).await.unwrap().len();
        (rows, files, audit)
    }

    async fn agent(&self, file: &str) -> Reply {
        self.app.get(&format!("/agent/{file}"), None).await
    }
}

/// J: a signed build is kept and recorded, and the installer's path serves the newest
/// build of its arch — the bytes, its digest line and its signature; the list and
/// /admin/releases say which one is served. Before any is published, the release directory's
/// own files are served as before.
async fn j_a_published_build_is_what_the_installers_path_serves(w: World) {
    std::fs::write(
        w.release_dir.path().join(format!("byo-agent-{ARCH}")),
        b"flat file",
    )
    .unwrap();
    assert_eq!(
        w.agent(&format!("byo-agent-{ARCH}")).await.body,
        b"flat file"
    );

    let first = build("first");
    let r = w.publish(ARCH, &first).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let v = r.json();
    assert_eq!(v["sha256"], sha(&first));
    assert_eq!(v["build"], sha(&first)[..12]);
    assert_eq!(v["version"], "byo-agent 0.1.0");
    assert_eq!(v["served"], true);
    assert_eq!(w.agent(&format!("byo-agent-{ARCH}")).await.body, first);
    assert_eq!(
        w.agent(&format!("byo-agent-{ARCH}.sha256")).await.text(),
        format!("{}  byo-agent-{ARCH}\n", sha(&first))
    );
    let sig = w.agent(&format!("byo-agent-{ARCH}.sig")).await.text();
    byo_core::release::verify(release_key().public_key(), &first, &sig).unwrap();

    w.clock.advance(Duration::seconds(1));
    let second = build("second");
    assert_eq!(w.publish(ARCH, &second).await.status, StatusCode::CREATED);
    assert_eq!(
        w.agent(&format!("byo-agent-{ARCH}")).await.body,
        second,
        "the newest"
    );
    // Another arch's path is untouched by it.
    assert_eq!(
        w.agent(&format!("byo-agent-{}", other_arch())).await.status,
        StatusCode::NOT_FOUND
    );

    let list = w.op.get("/api/admin/releases").await;
    assert_eq!(list.status, StatusCode::OK);
    let list = list.json();
    assert_eq!(list.as_array().unwrap().len(), 2);
    assert_eq!(list[0]["sha256"], sha(&second));
    assert_eq!(list[0]["served"], true);
    assert_eq!(list[1]["served"], false);
    let page = w.op.page("/admin/releases").await;
    assert!(
        page.contains(&sha(&second)[..12]) && page.contains("served"),
        "{page}"
    );
    assert_eq!(
        w.app.db.audit_log(10).await.unwrap()[0].action,
        "release.published"
    );
}

/// One refused publish: what, the arch, the bytes, the signature, the answer and its code.
type Case<'a> = (
    &'a str,
    &'a str,
    &'a [u8],
    Option<&'a str>,
    StatusCode,
    &'a str,
);

/// J: every refusal of a publish names what is wrong and changes nothing — no row, no
/// kept file, no audit line: a signature that is not one, by another key, over other bytes,
/// or missing; a build of another arch than the one claimed, or no ELF at all; the same
/// build again; a bad arch or version; anyone but a superadmin.
async fn j_a_publish_is_refused_with_nothing_changed(w: World) {
    let good = build("good");
    assert_eq!(w.publish(ARCH, &good).await.status, StatusCode::CREATED);
    let before = w.kept().await;
    let other_key = byo_core::keylist_testing::private_key();
    let by_other = byo_core::release::sign(&other_key, &good).unwrap();
    let other_bytes = build("other");
    let over_other = byo_core::release::sign(release_key(), &good).unwrap();
    let script = b"#!/bin/sh\necho byo-agent 0.1.0\n".to_vec();
    let script_sig = byo_core::release::sign(release_key(), &script).unwrap();
    let other_sig = byo_core::release::sign(release_key(), &other_bytes).unwrap();
    let cases: Vec<Case<'_>> = vec![
        (
            "garbage",
            ARCH,
            &other_bytes,
            Some("not a signature"),
            StatusCode::BAD_REQUEST,
            "bad_signature",
        ),
        (
            "another key",
            ARCH,
            &other_bytes,
            Some(&by_other),
            StatusCode::BAD_REQUEST,
            "bad_signature",
        ),
        (
            "other bytes",
            ARCH,
            &other_bytes,
            Some(&over_other),
            StatusCode::BAD_REQUEST,
            "bad_signature",
        ),
        (
            "no signature",
            ARCH,
            &other_bytes,
            None,
            StatusCode::BAD_REQUEST,
            "bad_signature",
        ),
        (
            "another arch",
            other_arch(),
            &other_bytes,
            Some(&other_sig),
            StatusCode::BAD_REQUEST,
            "wrong_arch",
        ),
        (
            "not an ELF",
            ARCH,
            &script,
            Some(&script_sig),
            StatusCode::BAD_REQUEST,
            "wrong_arch",
        ),
        (
            "bad arch",
            "x86-64",
            &other_bytes,
            Some(&other_sig),
            StatusCode::BAD_REQUEST,
            "bad_arch",
        ),
    ];
    for (what, arch, bytes, sig, status, code) in cases {
        let r = w.publish_as(&w.admin, arch, bytes, sig).await;
        assert_eq!(r.status, status, "{what}: {}", r.text());
        assert_eq!(r.json()["error"], code, "{what}: {}", r.text());
        assert!(
            r.json()["message"]
                .as_str()
                .unwrap()
                .contains("nothing was published"),
            "{what}"
        );
        assert_eq!(w.kept().await, before, "{what} changed nothing");
    }
    let sig = byo_core::release::sign(release_key(), &good).unwrap();
    let again = w.publish_as(&w.admin, ARCH, &good, Some(&sig)).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.text());
    assert_eq!(again.json()["error"], "already_published");
    assert_eq!(w.kept().await, before, "a duplicate changed nothing");
    let bad_version = w
        .app
        .send(
            Request::post(format!("/api/admin/releases/{ARCH}?version=%01"))
                .header(
                    header::COOKIE,
                    format!("__Host-byo_session={}", w.admin.session),
                )
                .header(
                    SIGNATURE_HEADER,
                    base64::engine::general_purpose::STANDARD.encode(&other_sig),
                )
                .body(Body::from(other_bytes.clone()))
                .unwrap(),
        )
        .await;
    assert_eq!(
        bad_version.json()["error"],
        "bad_version",
        "{}",
        bad_version.text()
    );
    // An empty build; a version past 128 characters (128 is accepted, below).
    let empty_sig = byo_core::release::sign(release_key(), b"").unwrap();
    let r = w.publish_as(&w.admin, ARCH, b"", Some(&empty_sig)).await;
    assert_eq!(r.json()["error"], "empty_build", "{}", r.text());
    let versioned = |version: String| {
        Request::post(format!("/api/admin/releases/{ARCH}?version={version}"))
            .header(
                header::COOKIE,
                format!("__Host-byo_session={}", w.admin.session),
            )
            .header(
                SIGNATURE_HEADER,
                base64::engine::general_purpose::STANDARD.encode(&other_sig),
            )
            .body(Body::from(other_bytes.clone()))
            .unwrap()
    };
    let r = w.app.send(versioned("v".repeat(129))).await;
    assert_eq!(r.json()["error"], "bad_version", "{}", r.text());
    let r = w.app.send(versioned(String::new())).await;
    assert_eq!(r.json()["error"], "bad_version", "{}", r.text());
    assert_eq!(w.kept().await, before, "nothing changed");
    let r = w
        .publish_as(&w.op, ARCH, &other_bytes, Some(&other_sig))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(w.kept().await, before, "an operator changed nothing");
    assert_eq!(w.agent(&format!("byo-agent-{ARCH}")).await.body, good);
    let r = w.app.send(versioned("v".repeat(128))).await;
    assert_eq!(
        r.status,
        StatusCode::CREATED,
        "128 characters: {}",
        r.text()
    );
}

/// Without a release key configured, nothing can be verified, so nothing is published.
async fn j_a_server_without_a_release_key_publishes_nothing(w: World) {
    let mut config = support::test_config();
    config.release_dir = Some(w.release_dir.path().to_owned());
    let keyless = TestApp {
        router: byo_server::router(AppState::new(w.app.db.store.clone(), config)),
        state: w.app.state.clone(),
        db: byo_db::testing::sqlite().await,
    };
    let bytes = build("x");
    let sig = byo_core::release::sign(release_key(), &bytes).unwrap();
    let before = w.kept().await;
    let r = keyless
        .send(
            Request::post(format!("/api/admin/releases/{ARCH}?version=v"))
                .header(
                    header::COOKIE,
                    format!("__Host-byo_session={}", w.admin.session),
                )
                .header(
                    SIGNATURE_HEADER,
                    base64::engine::general_purpose::STANDARD.encode(&sig),
                )
                .body(Body::from(bytes))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(r.json()["error"], "no_release_key");
    assert_eq!(w.kept().await, before);
}

// The fleet upgrade's rules (issue #14, 5).

struct Host {
    id: String,
    token: String,
}

async fn hosts(w: &World, n: usize) -> Vec<Host> {
    let mut out = Vec::new();
    for i in 1..=n {
        let slug = format!("spark-{i}");
        let (id, token) =
            byo_db::testing::fleet_host(&w.app.db, &w.admin.sub, &slug, ARCH, w.now).await;
        out.push(Host { id, token });
    }
    out
}

impl World {
    /// A heartbeat from `h` reporting `build` (12 hex), healthy or not, rolled back or not.
    /// `rollback`: what the rollback recorded — from the build of that sha256, at that time.
    async fn beat(
        &self,
        h: &Host,
        build: &str,
        lxd: &str,
        rollback: Option<(&str, DateTime<Utc>)>,
    ) {
        let details = match rollback {
            Some((from, at)) => json!({"rollback": {
                "at": at.to_rfc3339(),
                "from_sha256": from,
                "to_sha256": "0".repeat(64),
            }}),
            None => json!({}),
        };
        let r = self
            .app
            .send(
                Request::post("/api/host/heartbeat")
                    .header(header::AUTHORIZATION, format!("Bearer {}", h.token))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(
                        json!({"agent_version": format!("0.1.0 ({build})"), "lxd": lxd, "relay": "ok",
                               "tunnel": "ok", "gpu": "ok", "storage": "ok", "instances": 0,
                               "details": details})
                        .to_string(),
                    ))
                    .unwrap(),
            )
            .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    }

    async fn start(&self, body: Value) -> Reply {
        self.admin.post("/api/admin/fleet-upgrades", body).await
    }

    async fn advance(&self, run: &str, report: Value) -> Reply {
        self.admin
            .post(&format!("/api/admin/fleet-upgrades/{run}/advance"), report)
            .await
    }

    async fn runs(&self) -> usize {
        self.app.db.fleet_runs(100).await.unwrap().len()
    }

    /// Each host's (slug, wave, state, reason) in the run `v` describes.
    fn states(v: &Value) -> Vec<(String, i64, String)> {
        v["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["slug"].as_str().unwrap().to_owned(),
                    h["wave"].as_i64().unwrap(),
                    h["state"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}

fn upgrading(id: &str) -> Value {
    json!({"report": {"host_id": id, "state": "upgrading"}})
}

/// J note 9: a canary first, then a doubling cohort, each host judged by its own
/// heartbeat (a fresh beat reporting the build, healthy) before the next wave; a host mid-
/// create and a de-pooled host are skipped with the reason; the run closes when every host
/// is judged, and /admin/releases shows it.
async fn j9_a_fleet_upgrade_goes_in_waves_judged_by_heartbeats(w: World) {
    let hs = hosts(&w, 5).await;
    let bytes = build("fleet");
    assert_eq!(w.publish(ARCH, &bytes).await.status, StatusCode::CREATED);
    let b = sha(&bytes)[..12].to_owned();
    // spark-4 is de-pooled, spark-5 has an instance being created.
    w.app
        .db
        .depool_host(&hs[3].id, "maintenance", &w.admin.sub, w.now)
        .await
        .unwrap();
    w.app
        .db
        .create_vm(
            byo_db::vms::NewVm {
                user_sub: &w.admin.sub,
                host_id: Some(&hs[4].id),
                name: "box",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            w.now,
        )
        .await
        .unwrap();
    let r = w.start(json!({"build": sha(&bytes)})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    let run = v["id"].as_str().unwrap().to_owned();
    assert_eq!(v["build"], b);
    assert_eq!(
        World::states(&v),
        [
            ("spark-1".into(), 0, "waiting".into()),
            ("spark-2".into(), 1, "waiting".into()),
            ("spark-3".into(), 1, "waiting".into()),
            ("spark-4".into(), -1, "skipped".into()),
            ("spark-5".into(), -1, "skipped".into()),
        ]
    );
    assert!(
        v["hosts"][3]["reason"]
            .as_str()
            .unwrap()
            .starts_with("de-pooled")
    );
    assert!(
        v["hosts"][4]["reason"]
            .as_str()
            .unwrap()
            .contains("being created")
    );
    assert_eq!(v["next"], json!({"kind": "upgrade", "hosts": [hs[0].id]}));

    // The canary: started, then judged by its heartbeat only.
    let v = w.advance(&run, upgrading(&hs[0].id)).await.json();
    assert_eq!(v["next"], json!({"kind": "wait", "hosts": [hs[0].id]}));
    w.beat(&hs[0], "000000000000", "ok", None).await;
    w.clock.advance(Duration::seconds(2));
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(
        v["next"]["kind"], "wait",
        "a beat with the old build is not it"
    );
    w.beat(&hs[0], &b, "down", None).await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(v["next"]["kind"], "wait", "the build, but not healthy");
    w.beat(&hs[0], &b, "ok", None).await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(v["hosts"][0]["state"], "healthy");
    assert_eq!(
        v["next"],
        json!({"kind": "upgrade", "hosts": [hs[1].id, hs[2].id]})
    );

    // The second wave: both start, both report.
    w.advance(&run, upgrading(&hs[1].id)).await;
    let v = w.advance(&run, upgrading(&hs[2].id)).await.json();
    assert_eq!(
        v["next"],
        json!({"kind": "wait", "hosts": [hs[1].id, hs[2].id]})
    );
    w.clock.advance(Duration::seconds(1));
    w.beat(&hs[1], &b, "ok", None).await;
    w.beat(&hs[2], &b, "ok", None).await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(v["next"], json!({"kind": "done"}));
    assert_eq!(v["state"], "closed");
    let page = w.op.page("/admin/releases").await;
    assert!(
        page.contains(&format!("fleet-{run}-spark-3")) && page.contains("healthy"),
        "{page}"
    );
    // A new run may start now; every host is on the build, so none waits.
    let again = w.start(json!({"build": b})).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert_eq!(again.json()["next"], json!({"kind": "done"}));
}

/// J note 9: the first failure halts the run with its reason — the one-liner failing on a
/// host, a rollback its heartbeat reports, no healthy beat within the wait — and the next
/// wave does not start; resuming tries the failed host again and leaves judged ones alone.
async fn j9_the_first_failure_halts_and_a_resume_picks_it_up(w: World) {
    let hs = hosts(&w, 3).await;
    let bytes = build("halt");
    w.publish(ARCH, &bytes).await;
    let b = sha(&bytes)[..12].to_owned();
    let v = w.start(json!({"build": b, "wait_secs": 60})).await.json();
    let run = v["id"].as_str().unwrap().to_owned();
    // The canary's one-liner fails: halted, with what it printed.
    w.advance(&run, upgrading(&hs[0].id)).await;
    let v = w
        .advance(
            &run,
            json!({"report": {"host_id": hs[0].id, "state": "failed",
                              "reason": "the one-liner exited 8: not signed by the release key"}}),
        )
        .await
        .json();
    assert_eq!(v["state"], "halted");
    assert_eq!(
        v["next"],
        json!({"kind": "halted", "reason": "spark-1: the one-liner exited 8: not signed by the release key"})
    );
    // Halted: nothing more is recorded, nothing starts.
    let r = w.advance(&run, upgrading(&hs[1].id)).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["error"], "run_not_running");
    // Resumed: the failed host waits again and is upgraded; its rollback halts the run.
    let v = w.start(json!({"build": b, "resume": true})).await.json();
    assert_eq!(v["state"], "running");
    assert_eq!(v["next"], json!({"kind": "upgrade", "hosts": [hs[0].id]}));
    w.advance(&run, upgrading(&hs[0].id)).await;
    w.clock.advance(Duration::seconds(5));
    let rolled_back_at = w.clock.now();
    w.beat(
        &hs[0],
        "000000000000",
        "ok",
        Some((&sha(&bytes), rolled_back_at)),
    )
    .await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(v["state"], "halted");
    assert!(
        v["halt_reason"]
            .as_str()
            .unwrap()
            .contains("spark-1: it rolled back"),
        "{v}"
    );
    // Resumed again, the canary becomes healthy (the rollback it still reports until its
    // next install is from before this attempt); the next wave's silence past the wait halts.
    w.clock.advance(Duration::seconds(1));
    w.start(json!({"build": b, "resume": true})).await;
    w.advance(&run, upgrading(&hs[0].id)).await;
    w.beat(
        &hs[0],
        "000000000000",
        "ok",
        Some((&sha(&bytes), rolled_back_at)),
    )
    .await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(v["next"]["kind"], "wait", "{v}");
    w.clock.advance(Duration::seconds(1));
    w.beat(&hs[0], &b, "ok", None).await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(
        v["next"],
        json!({"kind": "upgrade", "hosts": [hs[1].id, hs[2].id]})
    );
    w.advance(&run, upgrading(&hs[1].id)).await;
    w.advance(&run, upgrading(&hs[2].id)).await;
    w.clock.advance(Duration::seconds(30));
    w.beat(&hs[1], &b, "ok", None).await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(v["next"], json!({"kind": "wait", "hosts": [hs[2].id]}));
    w.clock.advance(Duration::seconds(30));
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(v["state"], "halted");
    let reason = v["halt_reason"].as_str().unwrap();
    assert!(
        reason.starts_with("spark-3: no heartbeat reporting build")
            && reason.contains("within 60 s"),
        "{reason}"
    );
    assert_eq!(
        World::states(&v)
            .iter()
            .map(|s| s.2.as_str())
            .collect::<Vec<_>>(),
        ["healthy", "healthy", "failed"]
    );
    let resumed = w.start(json!({"build": b, "resume": true})).await.json();
    assert_eq!(
        World::states(&resumed)
            .iter()
            .map(|s| s.2.as_str())
            .collect::<Vec<_>>(),
        ["healthy", "healthy", "waiting"],
        "only the failed host is tried again"
    );
}

/// J note 9: a host's facts are read again just before its wave. One de-pooled since the
/// plan is skipped with the reason while the rest of its wave goes on; when the whole last
/// wave is skipped, the run closes in that same step.
async fn j9_a_host_that_became_busy_since_the_plan_is_skipped_at_its_wave(w: World) {
    let hs = hosts(&w, 4).await;
    let bytes = build("busy");
    w.publish(ARCH, &bytes).await;
    let b = sha(&bytes)[..12].to_owned();
    let v = w.start(json!({"build": b})).await.json();
    let run = v["id"].as_str().unwrap().to_owned();
    let waves: Vec<i64> = World::states(&v).iter().map(|s| s.1).collect();
    assert_eq!(waves, [0, 1, 1, 2], "{v}");
    // Host `h` upgraded and healthy, then host `then` de-pooled before the next step.
    let healthy_then_depool = |h: usize, then: usize| {
        let (w, hs, b, run) = (&w, &hs, &b, &run);
        async move {
            w.advance(run, upgrading(&hs[h].id)).await;
            w.clock.advance(Duration::seconds(1));
            w.beat(&hs[h], b, "ok", None).await;
            w.app
                .db
                .depool_host(&hs[then].id, "maintenance", &w.admin.sub, w.clock.now())
                .await
                .unwrap();
        }
    };
    // spark-3 is de-pooled after the plan: at its wave it is skipped, spark-2 goes on.
    healthy_then_depool(0, 2).await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(
        v["next"],
        json!({"kind": "upgrade", "hosts": [hs[1].id]}),
        "{v}"
    );
    assert_eq!(v["hosts"][2]["state"], "skipped");
    assert!(
        v["hosts"][2]["reason"]
            .as_str()
            .unwrap()
            .starts_with("de-pooled"),
        "{v}"
    );
    // The last wave's only host is de-pooled too: skipped, and the run is done.
    healthy_then_depool(1, 3).await;
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(
        World::states(&v)
            .iter()
            .map(|s| s.2.as_str())
            .collect::<Vec<_>>(),
        ["healthy", "healthy", "skipped", "skipped"]
    );
    assert_eq!(v["next"], json!({"kind": "done"}));
    assert_eq!(v["state"], "closed", "{v}");
}

/// J note 9: starts that race each other open one run; every loser is told which run is
/// open (`run_in_progress`, the same answer as a start after it), never a database error.
async fn j9_starts_that_race_open_one_run_and_every_loser_is_told_which(w: World) {
    hosts(&w, 2).await;
    let bytes = build("race");
    w.publish(ARCH, &bytes).await;
    let b = sha(&bytes)[..12].to_owned();
    // Several rounds: how far the starts overlap is the scheduler's to choose.
    for round in 1..=4 {
        let replies =
            futures::future::join_all((0..12).map(|_| w.start(json!({"build": b})))).await;
        let won: Vec<_> = replies
            .iter()
            .filter(|r| r.status == StatusCode::OK)
            .collect();
        assert_eq!(won.len(), 1, "one start wins");
        let run = won[0].json()["id"].as_str().unwrap().to_owned();
        for r in replies.iter().filter(|r| r.status != StatusCode::OK) {
            assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
            assert_eq!(r.json()["error"], "run_in_progress", "{}", r.text());
            assert!(
                r.json()["message"].as_str().unwrap().contains(&run),
                "{}",
                r.text()
            );
        }
        assert_eq!(w.runs().await, round);
        // Closed, so the next round may start one.
        assert!(
            w.app
                .db
                .move_fleet_run(
                    &run,
                    byo_wire::states::FleetRunState::Running,
                    byo_wire::states::FleetRunState::Closed,
                    None,
                    w.clock.now(),
                )
                .await
                .unwrap()
        );
    }
}

/// J note 9: refused with nothing started — a build nobody published, a build the
/// installer does not serve for a host's arch, a second run while one is open, a resume
/// with none open or of another build, a report a host's state does not allow, anyone but
/// a superadmin. A superadmin halts and closes a run on /admin/releases.
async fn j9_a_fleet_upgrade_is_refused_with_nothing_started(w: World) {
    let hs = hosts(&w, 2).await;
    let mine = build("mine");
    w.publish(ARCH, &mine).await;
    let b = sha(&mine)[..12].to_owned();
    let refused = |r: Reply, status: StatusCode, code: &str| {
        assert_eq!(r.status, status, "{code}: {}", r.text());
        assert_eq!(r.json()["error"], code, "{}", r.text());
    };
    refused(
        w.start(json!({"build": "abcdefabcdef"})).await,
        StatusCode::CONFLICT,
        "unknown_build",
    );
    refused(
        w.start(json!({"build": "abc"})).await,
        StatusCode::BAD_REQUEST,
        "bad_build",
    );
    refused(
        w.start(json!({"build": "xyzxyzxyzxyz"})).await,
        StatusCode::BAD_REQUEST,
        "bad_build",
    );
    refused(
        w.start(json!({"build": b, "resume": true})).await,
        StatusCode::CONFLICT,
        "no_open_run",
    );
    let r =
        w.op.post("/api/admin/fleet-upgrades", json!({"build": b}))
            .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // A newer build served for the arch: the older one is not what the one-liner installs.
    w.clock.advance(Duration::seconds(1));
    let newer = build("newer");
    w.publish(ARCH, &newer).await;
    let r = w.start(json!({"build": b})).await;
    refused(r, StatusCode::CONFLICT, "not_served");
    // A host of another arch with no build served for it.
    let (_, _) =
        byo_db::testing::fleet_host(&w.app.db, &w.admin.sub, "spark-9", other_arch(), w.now).await;
    let r = w.start(json!({"build": sha(&newer)})).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains(&format!("for {}, which spark-9 runs on", other_arch())),
        "{}",
        r.text()
    );
    assert_eq!(w.runs().await, 0, "nothing was started");
    w.app
        .db
        .depool_host(
            &w.app
                .db
                .fleet_candidates()
                .await
                .unwrap()
                .iter()
                .find(|c| c.slug == "spark-9")
                .unwrap()
                .host_id,
            "gone",
            &w.admin.sub,
            w.now,
        )
        .await
        .unwrap();

    let v = w.start(json!({"build": sha(&newer)})).await.json();
    let run = v["id"].as_str().unwrap().to_owned();
    refused(
        w.start(json!({"build": sha(&newer)})).await,
        StatusCode::CONFLICT,
        "run_in_progress",
    );
    refused(
        w.start(json!({"build": b, "resume": true})).await,
        StatusCode::CONFLICT,
        "other_build",
    );
    assert_eq!(w.runs().await, 1);
    // Reports the host's state does not allow: nothing recorded.
    refused(
        w.advance(
            &run,
            json!({"report": {"host_id": hs[1].id, "state": "failed", "reason": "x"}}),
        )
        .await,
        StatusCode::CONFLICT,
        "host_not_in_that_state",
    );
    refused(
        w.advance(
            &run,
            json!({"report": {"host_id": hs[0].id, "state": "healthy"}}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "bad_report",
    );
    w.advance(&run, upgrading(&hs[0].id)).await;
    refused(
        w.advance(
            &run,
            json!({"report": {"host_id": hs[0].id, "state": "failed", "reason": " "}}),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "bad_report",
    );
    let r =
        w.op.post(
            &format!("/api/admin/fleet-upgrades/{run}/advance"),
            json!({}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        World::states(&w.advance(&run, json!({})).await.json())
            .iter()
            .map(|s| s.2.as_str())
            .collect::<Vec<_>>(),
        ["upgrading", "waiting", "skipped"]
    );
    assert_eq!(
        w.admin
            .post("/api/admin/fleet-upgrades/nope/advance", json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // /admin/releases: an operator may look, not halt; a superadmin halts, then closes.
    let r =
        w.op.post_form(&format!("/admin/fleet-upgrades/{run}/halt"), &[])
            .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = w
        .admin
        .post_form(&format!("/admin/fleet-upgrades/{run}/halt"), &[])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let v = w.advance(&run, json!({})).await.json();
    assert_eq!(
        v["next"],
        json!({"kind": "halted", "reason": "halted by root@example.com on /admin/releases"})
    );
    let r = w
        .admin
        .post_form(&format!("/admin/fleet-upgrades/{run}/halt"), &[])
        .await;
    assert_eq!(
        r.status,
        StatusCode::CONFLICT,
        "halting a halted run: {}",
        r.text()
    );
    let r = w
        .admin
        .post_form(&format!("/admin/fleet-upgrades/{run}/close"), &[])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(
        w.advance(&run, json!({})).await.json()["next"],
        json!({"kind": "done"})
    );
    let r = w
        .admin
        .post_form(&format!("/admin/fleet-upgrades/{run}/close"), &[])
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        w.admin
            .post_form("/admin/fleet-upgrades/nope/close", &[])
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    // Closed: a new run may start; its settings are kept within their bounds.
    let r = w
        .start(json!({"build": sha(&newer), "canary": 0, "growth": 3, "wait_secs": 999_999}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (
            v["canary"].as_i64(),
            v["growth"].as_i64(),
            v["wait_secs"].as_i64()
        ),
        (Some(1), Some(3), Some(86_400))
    );
    assert_eq!(v["build"], sha(&newer)[..12]);
    assert_eq!(w.runs().await, 2);
}

with_world!(
    j_a_published_build_is_what_the_installers_path_serves,
    j_a_publish_is_refused_with_nothing_changed,
    j_a_server_without_a_release_key_publishes_nothing,
    j9_a_fleet_upgrade_goes_in_waves_judged_by_heartbeats,
    j9_the_first_failure_halts_and_a_resume_picks_it_up,
    j9_a_host_that_became_busy_since_the_plan_is_skipped_at_its_wave,
    j9_starts_that_race_open_one_run_and_every_loser_is_told_which,
    j9_a_fleet_upgrade_is_refused_with_nothing_started,
);
