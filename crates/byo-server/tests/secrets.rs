//! Secrets stay secret: after a full flow no log line and no table holds a password or a
//! plaintext token. Its own test binary, because it installs the process's log subscriber.

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::http::{Method, StatusCode};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::Backend;
use byo_db::enrollments::NewEnrollment;
use byo_server::config::LogFormat;
use byo_wire::Role;
use serde_json::json;
use support::{PASSWORD, TestApp};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn full_flow_leaves_no_secret_in_logs_or_tables(backend: Backend, logs: &Captured) {
    let Some(app) = TestApp::new(backend).await else {
        return;
    };
    let new_password = "another very long password";

    let signup = app
        .request(
            Method::POST,
            "/api/auth/signup",
            None,
            Some(json!({"email": "ana@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(signup.status, StatusCode::ACCEPTED, "{}", signup.text());
    let s1 = app
        .request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": "ana@example.com", "password": PASSWORD})),
        )
        .await
        .session_cookie()
        .unwrap();
    let login = app
        .request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": "ana@example.com", "password": PASSWORD})),
        )
        .await;
    let s2 = login.session_cookie().unwrap();
    app.request(
        Method::POST,
        "/api/auth/login",
        None,
        Some(json!({"email": "ana@example.com", "password": "wrong-password-typed"})),
    )
    .await;
    let changed = app
        .request(
            Method::PUT,
            "/api/me/password",
            Some(&s2),
            Some(json!({"current_password": PASSWORD, "new_password": new_password})),
        )
        .await;
    let s3 = changed.session_cookie().unwrap();
    let (op_sub, op) = app.user_with("op@example.com", &[Role::Superadmin]).await;
    let me = app.get("/api/me", Some(&s3)).await.json();
    let ana = me["sub"].as_str().unwrap();
    app.request(
        Method::PUT,
        &format!("/api/admin/users/{ana}/roles/community_host"),
        Some(&op),
        None,
    )
    .await;
    app.give_host(&op_sub, "spark-1").await;
    // An enrolment token, minted and redeemed as provisioning will.
    let host = app.db.host_nodes("none").await.unwrap();
    assert!(host.is_empty());
    let enroll = SecretToken::generate(TokenKind::Enrollment);
    let h = app
        .db
        .insert_host(
            byo_db::hosts::NewHost {
                slug: "spark-9",
                owner_sub: ana,
                profile_id: "gb10-spark-1",
                gpu_type: "spark-1",
            },
            app.state.clock.now(),
        )
        .await
        .unwrap();
    app.db
        .create_enrollment(
            NewEnrollment {
                host_id: &h.id,
                owner_sub: ana,
                profile_id: "gb10-spark-1",
                token_hash: &enroll.hash(),
                token_expires_at: app.state.clock.now() + chrono::Duration::hours(1),
            },
            app.state.clock.now(),
        )
        .await
        .unwrap();
    app.db
        .redeem_enrollment(&enroll.hash(), app.state.clock.now())
        .await
        .unwrap()
        .unwrap();
    app.request(Method::POST, "/api/auth/logout", Some(&s3), None)
        .await;

    let secrets = [
        PASSWORD,
        new_password,
        "wrong-password-typed",
        &s1,
        &s2,
        &s3,
        &op,
        enroll.expose(),
    ];
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(
        logged.contains("/api/auth/login"),
        "the capture works: {logged}"
    );
    for secret in secrets {
        assert!(!logged.contains(secret), "a secret reached the log");
    }
    assert!(!logged.contains("byo_ses_") && !logged.contains("byo_enr_"));

    let dump = app.db.dump_text().await.unwrap();
    assert!(
        dump.iter().any(|v| v.table == "sessions"),
        "the dump covers sessions"
    );
    for v in &dump {
        for secret in secrets {
            assert!(
                !v.value.contains(secret),
                "{}.{} holds a secret in plaintext",
                v.table,
                v.column
            );
        }
        assert!(
            !v.value.contains("byo_"),
            "{}.{} holds something token-shaped",
            v.table,
            v.column
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_or_a_table() {
    let logs = Captured::default();
    let writer = logs.clone();
    byo_server::telemetry::init_with_writer(LogFormat::Json, move || writer.clone());
    full_flow_leaves_no_secret_in_logs_or_tables(Backend::Sqlite, &logs).await;
    full_flow_leaves_no_secret_in_logs_or_tables(Backend::Postgres, &logs).await;
}
