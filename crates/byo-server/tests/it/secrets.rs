//! Secrets stay secret: after a full flow no log line and no table holds a password or a
//! plaintext token. Its own test binary, because it installs the process's log subscriber.

use crate::support;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, StatusCode};
use axum::http::{Request, header};
use byo_db::Backend;
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
    let (_, op) = app.user_with("op@example.com", &[Role::Superadmin]).await;
    let me = app.get("/api/me", Some(&s3)).await.json();
    let ana = me["sub"].as_str().unwrap();
    let granted = app
        .request(
            Method::PUT,
            &format!("/api/admin/users/{ana}/roles/community_host"),
            Some(&op),
            None,
        )
        .await;
    assert!(granted.status.is_success(), "{}", granted.text());

    // Provisioning and redeem as a host really goes through them: the enrolment token over
    // `POST /api/enroll`, then the bearer-token routes a host calls with what it was handed.
    app.publish_operator_keys().await;
    let provisioned = app
        .request(
            Method::POST,
            "/api/hosts",
            Some(&s3),
            Some(json!({"profile_id": "gb10-spark-1"})),
        )
        .await;
    assert_eq!(
        provisioned.status,
        StatusCode::CREATED,
        "{}",
        provisioned.text()
    );
    let provisioned = provisioned.json();
    let host_id = provisioned["host_id"].as_str().unwrap();
    app.relay_recorded(host_id).await;
    let enroll_token = provisioned["token"].as_str().unwrap().to_owned();
    let node = json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": "3f2a", "hardware_id": "b41c", "node_index": 0, "rails": []
    });
    let enrolled = bearer(
        &app,
        Method::POST,
        "/api/enroll",
        &enroll_token,
        Some(&node),
    )
    .await;
    assert_eq!(enrolled.status, StatusCode::OK, "{}", enrolled.text());
    let enrolled = enrolled.json();
    let handed: Vec<String> = [
        &enrolled["host_token"],
        &enrolled["agent_token"],
        &enrolled["ssh_map_token"],
        &enrolled["tunnel_connector_token"],
        &enrolled["wireguard"]["private_key"],
    ]
    .iter()
    .map(|v| v.as_str().expect("handed over").to_owned())
    .collect();
    let host_token = &handed[0];
    let beat = json!({
        "agent_version": "0.1.0", "lxd": "ok", "relay": "ok", "tunnel": "ok",
        "gpu": "ok", "storage": "ok", "instances": 0
    });
    let r = bearer(
        &app,
        Method::POST,
        "/api/host/heartbeat",
        host_token,
        Some(&beat),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let r = bearer(
        &app,
        Method::GET,
        "/api/host/operator-keys",
        host_token,
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = bearer(&app, Method::GET, "/api/host/relay", host_token, None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // Spent, and a host token where an enrolment token belongs: refused, still not logged.
    let r = bearer(
        &app,
        Method::POST,
        "/api/enroll",
        &enroll_token,
        Some(&node),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = bearer(&app, Method::POST, "/api/enroll", host_token, Some(&node)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = app
        .request(Method::POST, "/api/auth/logout", Some(&s3), None)
        .await;
    assert!(r.status.is_success(), "{}", r.text());

    let secrets = [
        PASSWORD,
        new_password,
        "wrong-password-typed",
        &s1,
        &s2,
        &s3,
        &op,
        &enroll_token,
        &handed[0],
        &handed[1],
        &handed[2],
        &handed[3],
        &handed[4],
    ];
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    for path in [
        "/api/auth/login",
        "/api/enroll",
        "/api/host/heartbeat",
        "/api/host/operator-keys",
    ] {
        assert!(logged.contains(path), "the capture covers {path}: {logged}");
    }
    for secret in secrets {
        assert!(!logged.contains(secret), "a secret reached the log");
    }
    for prefix in ["byo_ses_", "byo_enr_", "byo_hst_", "byo_agt_", "byo_map_"] {
        assert!(
            !logged.contains(prefix),
            "something token-shaped ({prefix}) was logged"
        );
    }

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

/// A request carrying `token` as a bearer token, as a host sends it.
async fn bearer(
    app: &TestApp,
    method: Method,
    path: &str,
    token: &str,
    body: Option<&serde_json::Value>,
) -> support::Reply {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::CONTENT_TYPE, "application/json");
    let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
    app.send(req.body(body).unwrap()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_log_line_or_a_table() {
    let logs = Captured::default();
    let writer = logs.clone();
    byo_server::telemetry::init_with_writer(LogFormat::Json, move || writer.clone());
    full_flow_leaves_no_secret_in_logs_or_tables(Backend::Sqlite, &logs).await;
    full_flow_leaves_no_secret_in_logs_or_tables(Backend::Postgres, &logs).await;
}
