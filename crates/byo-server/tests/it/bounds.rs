//! Issue #20: every input bounded, every race on a limit closed, every answer in one shape.
//! Each test is named after the item it proves; every refusal shows nothing changed. Run on
//! both backends. docs/security.md lists every limit with its value and its test here.

use crate::support;
use crate::with_world;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use byo_server::clock::Clock;
use byo_server::config::loopback_origins;
use byo_server::providers::local::{LocalRelays, LocalTunnels};
use byo_wire::limits;
use serde_json::{Value, json};
use support::{TestApp, User};

struct World {
    app: TestApp,
    clock: Clock,
    owner: User,
    op: User,
    customer: User,
}

async fn world(backend: byo_db::Backend) -> Option<World> {
    let mut app = TestApp::new(backend).await?;
    app.publish_operator_keys().await;
    let clock = Clock::manual("2026-11-29T12:00:00Z".parse().unwrap());
    app.state = app.state.clone().with_clock(clock.clone()).with_providers(
        Arc::new(LocalRelays::default()),
        Arc::new(LocalTunnels::default()),
    );
    app.router = byo_server::router(app.state.clone());
    let owner = app.community_host("owner@example.com").await;
    let op = app.operator("op@example.com").await;
    let customer = app.customer("customer@example.com").await;
    Some(World {
        app,
        clock,
        owner,
        op,
        customer,
    })
}

fn spark() -> Value {
    json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": "3f2a", "hardware_id": "b41c", "node_index": 0, "rails": []
    })
}

fn step(name: &str, error: Option<&str>) -> Value {
    json!({"step": name, "state": if error.is_some() { "failed" } else { "applied" },
           "attempt": 1, "error": error, "final": false, "at": "2026-11-29T12:05:00Z"})
}

fn beat(details: Value) -> Value {
    json!({
        "agent_version": "0.1.0", "lxd": "ok", "relay": "ok", "tunnel": "unknown",
        "gpu": "ok", "storage": "ok", "instances": 0, "details": details
    })
}

/// A raw request: `bearer` as the host or enrolment token, `body` as given.
fn raw(
    method: Method,
    path: &str,
    bearer: Option<&str>,
    ctype: &str,
    body: String,
) -> Request<Body> {
    let mut r = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, ctype);
    if let Some(t) = bearer {
        r = r.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    r.body(Body::from(body)).unwrap()
}

impl World {
    async fn provision(&self) -> Value {
        let r = self
            .owner
            .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        r.json()
    }

    async fn enroll(&self, token: &str, body: &Value) -> support::Reply {
        self.app
            .send(raw(
                Method::POST,
                "/api/enroll",
                Some(token),
                "application/json",
                body.to_string(),
            ))
            .await
    }

    async fn host_call(&self, path: &str, token: &str, body: &Value) -> support::Reply {
        self.app
            .send(raw(
                Method::POST,
                path,
                Some(token),
                "application/json",
                body.to_string(),
            ))
            .await
    }

    /// A provisioned and enrolled host: (host id, host token).
    async fn enrolled(&self) -> (String, String) {
        let p = self.provision().await;
        let r = self.enroll(p["token"].as_str().unwrap(), &spark()).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        (
            p["host_id"].as_str().unwrap().to_owned(),
            r.json()["host_token"].as_str().unwrap().to_owned(),
        )
    }
}

fn assert_too_long(r: &support::Reply, field: &str, limit: usize) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let body = r.json();
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(field) && message.contains(&limit.to_string()),
        "the refusal names {field} and {limit}: {body}"
    );
}

// ---- 1. A bound on every field we store or render -------------------------------------

async fn i1_the_enrolment_request_is_bounded_at_the_wire(w: World) {
    let p = w.provision().await;
    let token = p["token"].as_str().unwrap();
    let host_id = p["host_id"].as_str().unwrap();
    // One past, in node0's field, a peer's field, a rail and the number of peers: refused
    // naming the field, and the token is still good (nothing was judged or stored).
    let mut past = spark();
    past["os_version"] = json!("9".repeat(limits::SHORT + 1));
    assert_too_long(&w.enroll(token, &past).await, "os_version", limits::SHORT);
    let mut peer = spark();
    peer["node_index"] = json!(1);
    peer["rails"] = json!([{"iface": "x".repeat(limits::SHORT + 1), "neighbours_discovered": 1}]);
    let mut past = spark();
    past["peers"] = json!([peer]);
    assert_too_long(
        &w.enroll(token, &past).await,
        "peers[0].rails[0].iface",
        limits::SHORT,
    );
    let mut past = spark();
    past["peers"] = json!(vec![spark(); limits::PEERS + 1]);
    assert_too_long(&w.enroll(token, &past).await, "peers", limits::PEERS);
    let e = w.app.db.enrollment_views(None).await.unwrap();
    assert!(e.iter().all(|e| e.fingerprint.is_none()), "nothing stored");
    assert!(
        w.app
            .db
            .host(host_id)
            .await
            .unwrap()
            .unwrap()
            .pubkey
            .is_none()
    );
    // At the limit: enrolled, stored as sent.
    let mut at = spark();
    at["os_version"] = json!("9".repeat(limits::SHORT));
    let r = w.enroll(token, &at).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

async fn i1_host_report_steps_and_messages_are_bounded(w: World) {
    let (host_id, host_token) = w.enrolled().await;
    let at = json!({"node": 0, "state": step(&"s".repeat(limits::SHORT), Some(&"e".repeat(limits::MESSAGE)))});
    let r = w.host_call("/api/host/report", &host_token, &at).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let kept = w
        .app
        .db
        .host(&host_id)
        .await
        .unwrap()
        .unwrap()
        .prepare_state;
    for past in [
        json!({"node": 0, "state": step(&"s".repeat(limits::SHORT + 1), None)}),
        json!({"node": 0, "state": step("lxd-install", Some(&"e".repeat(limits::MESSAGE + 1)))}),
    ] {
        let r = w.host_call("/api/host/report", &host_token, &past).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
        let m = r.json()["message"].as_str().unwrap().to_owned();
        assert!(m.contains("state.") && m.contains("limit of"), "{m}");
        assert_eq!(
            w.app
                .db
                .host(&host_id)
                .await
                .unwrap()
                .unwrap()
                .prepare_state
                .map(|j| j.0),
            kept.clone().map(|j| j.0),
            "nothing changed"
        );
    }
    // The owner's progress fragment carries the message bounded.
    let page = w.owner.get(&format!("/hosts/{host_id}/progress")).await;
    assert!(page.body.len() < 64 * 1024, "{} bytes", page.body.len());
}

async fn i1_heartbeat_details_are_bounded(w: World) {
    let (host_id, host_token) = w.enrolled().await;
    // `{"d":"…"}` serialises to 8 bytes around the string.
    let at = beat(json!({"d": "x".repeat(limits::DETAILS - 8)}));
    let r = w.host_call("/api/host/heartbeat", &host_token, &at).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let seen = w
        .app
        .db
        .host_status(&host_id)
        .await
        .unwrap()
        .unwrap()
        .seen_at;
    w.clock.advance(chrono::Duration::seconds(30));
    let past = beat(json!({"tunnel": "x".repeat(limits::DETAILS - 12)}));
    let r = w.host_call("/api/host/heartbeat", &host_token, &past).await;
    assert_too_long(&r, "details", limits::DETAILS);
    let mut past = beat(json!({}));
    past["agent_version"] = json!("v".repeat(limits::SHORT + 1));
    assert_too_long(
        &w.host_call("/api/host/heartbeat", &host_token, &past).await,
        "agent_version",
        limits::SHORT,
    );
    let status = w.app.db.host_status(&host_id).await.unwrap().unwrap();
    assert_eq!(status.seen_at, seen, "nothing changed");
}

async fn i1_names_and_labels_are_bounded(w: World) {
    let key = byo_core::keylist_testing::public_key_line();
    // At the limit: kept.
    let r = w
        .customer
        .post(
            "/api/ssh-keys",
            json!({"name": "é".repeat(limits::KEY_NAME_CHARS), "public_key": key}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = w
        .customer
        .post(
            "/api/ssh-keys",
            json!({"name": "é".repeat(limits::KEY_NAME_CHARS + 1), "public_key": key}),
        )
        .await;
    assert_too_long(&r, "name", limits::KEY_NAME_CHARS);
    let r = w
        .customer
        .post(
            "/api/ssh-keys",
            json!({"name": "k", "public_key": "k".repeat(limits::PUBLIC_KEY + 1)}),
        )
        .await;
    assert_too_long(&r, "public_key", limits::PUBLIC_KEY);
    assert_eq!(
        w.customer
            .get("/api/ssh-keys")
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let r = w
        .op
        .post(
            "/api/admin/operator-keys/changes",
            json!({"action": "add", "public_key": key, "label": "l".repeat(limits::NAME_CHARS + 1)}),
        )
        .await;
    assert_too_long(&r, "label", limits::NAME_CHARS);
    let r = w
        .app
        .request(
            Method::POST,
            "/api/auth/signup",
            None,
            Some(
                json!({"email": "n@example.com", "password": support::PASSWORD,
                        "display_name": "n".repeat(limits::NAME_CHARS + 1)}),
            ),
        )
        .await;
    assert_too_long(&r, "display_name", limits::NAME_CHARS);
    assert!(
        w.app
            .db
            .user_by_email("n@example.com")
            .await
            .unwrap()
            .is_none()
    );
}

// ---- 2. Limits that cannot be raced ---------------------------------------------------

async fn i2_fifty_simultaneous_provisions_take_exactly_the_cap(w: World) {
    let attempts = (0..50).map(|_| {
        let owner = w.owner.clone();
        tokio::spawn(async move {
            owner
                .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
                .await
        })
    });
    let mut created = 0;
    for r in futures::future::join_all(attempts).await {
        let r = r.unwrap();
        match r.status {
            StatusCode::CREATED => created += 1,
            StatusCode::CONFLICT => assert_eq!(r.json()["error"], "allocation_cap"),
            other => panic!("{other}: {}", r.text()),
        }
    }
    let cap = byo_db::provisioning::MAX_OUTSTANDING;
    assert_eq!(created, cap);
    assert_eq!(
        w.app
            .db
            .outstanding_allocations(&w.owner.sub)
            .await
            .unwrap(),
        cap
    );
}

async fn i2_slugs_are_never_reused_across_reject_revoke_and_retire(w: World) {
    let slug = |p: &Value| p["slug"].as_str().unwrap().to_owned();
    // Rejected (not a GB10) and reaped at once: its slug stays spent.
    let first = w.provision().await;
    let mut not_a_spark = spark();
    not_a_spark["gpu_model"] = json!("RTX 4090");
    let r = w
        .enroll(first["token"].as_str().unwrap(), &not_a_spark)
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    byo_server::app::reap::reap_once(&w.app.state)
        .await
        .unwrap();
    assert!(
        w.app
            .db
            .host(first["host_id"].as_str().unwrap())
            .await
            .unwrap()
            .is_none()
    );
    let second = w.provision().await;
    assert_eq!(
        (slug(&first), slug(&second)),
        ("spark-1".into(), "spark-2".into())
    );
    // Revoked: its host row is gone, its slug is not handed out again.
    let r =
        w.op.post_empty(&format!(
            "/api/admin/enrollments/{}/revoke",
            second["enrollment_id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let third = w.provision().await;
    assert_eq!(slug(&third), "spark-3");
    // Retired: the row stays, and so does the mark.
    w.app
        .db
        .retire_host(third["host_id"].as_str().unwrap(), w.clock.now())
        .await
        .unwrap();
    let fourth = w.provision().await;
    assert_eq!(slug(&fourth), "spark-4");
}

// ---- 3. Placement as a closed set -----------------------------------------------------

async fn i3_placement_is_a_closed_set_and_reactivation_is_an_explicit_audited_change(w: World) {
    let (host_id, host_token) = w.enrolled().await;
    w.app
        .db
        .mark_host_prepared(&host_id, w.clock.now())
        .await
        .unwrap();
    w.app.idle_heartbeat(&host_token).await;
    w.app.path_walked(&host_id).await;
    let path = format!("/api/admin/hosts/{host_id}/activate");
    for bad in [
        json!({"placement": "pool-of-mine"}),
        json!({"placement": "shared\u{202E}"}),
        json!({"placement": "dedicated"}),
        json!({}),
    ] {
        let r = w.op.post(&path, bad.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{bad}: {}",
            r.text()
        );
        assert!(r.json()["error"].is_string());
        assert!(!w.app.db.host(&host_id).await.unwrap().unwrap().active);
    }
    // The override's reason is kept in the audit: bounded (`limits::MESSAGE`).
    let long = json!({"placement": "shared", "walk_override": "x".repeat(2049)});
    let r = w.op.post(&path, long).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("too_long"))
    );
    assert!(!w.app.db.host(&host_id).await.unwrap().unwrap().active);
    let r = w.op.post(&path, json!({"placement": "shared"})).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    // Again, without saying it is a change: refused, nothing changed, nothing audited.
    let audits = w.app.db.audit_log(1000).await.unwrap().len();
    let r =
        w.op.post(
            &path,
            json!({"placement": "dedicated", "dedicated_to": w.customer.sub}),
        )
        .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("already_active"))
    );
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert_eq!(
        (host.placement.as_deref(), host.dedicated),
        (Some("shared"), false)
    );
    assert_eq!(w.app.db.audit_log(1000).await.unwrap().len(), audits);
    // A change on a host in service is not held to a fresh heartbeat (its agent silent ten
    // minutes here): it does not put the host into service (issue #36, 8).
    w.clock.advance(chrono::Duration::minutes(10));
    // A dedicated_to naming no one is refused.
    let r =
        w.op.post(
            &path,
            json!({"placement": "dedicated", "dedicated_to": "nobody", "change": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    // An explicit change: made, and audited with what it replaced.
    let r =
        w.op.post(
            &path,
            json!({"placement": "dedicated", "dedicated_to": w.customer.sub, "change": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert_eq!(
        (
            host.placement.as_deref(),
            host.dedicated,
            host.dedicated_to.as_deref()
        ),
        (Some("dedicated"), true, Some(w.customer.sub.as_str()))
    );
    let log = w.app.db.audit_log(1000).await.unwrap();
    let change: Vec<_> = log
        .iter()
        .filter(|e| e.action == "host.placement_change")
        .collect();
    assert_eq!(change.len(), 1);
    assert_eq!(change[0].details.0["was"]["placement"], "shared");
    assert_eq!(change[0].details.0["placement"], "dedicated");
    // The schema holds the closed set for every writer.
    let err = w
        .app
        .db
        .execute_unchecked(&format!(
            "update hosts set placement = 'owner-pool' where id = '{host_id}'"
        ))
        .await
        .unwrap_err();
    assert!(err.is_constraint("hosts_placement_closed_set"), "{err}");
}

// ---- 4. One answer shape --------------------------------------------------------------

async fn i4_framework_rejections_answer_in_one_shape(w: World) {
    let check_json = |r: &support::Reply, status: StatusCode| {
        assert_eq!(r.status, status, "{}", r.text());
        let body = r.json();
        assert!(
            body["error"].is_string() && body["message"].is_string(),
            "{status}: {body}"
        );
    };
    let big = format!("{{\"profile_id\": \"{}\"}}", "x".repeat(300 * 1024));
    let session = w.owner.session.as_str();
    let send = |method: Method, path: &str, ctype: &str, body: String| {
        let mut r = Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, ctype)
            .header(header::COOKIE, format!("__Host-byo_session={}", session));
        if path == "/api/enroll" {
            r = r.header(header::AUTHORIZATION, "Bearer byo_enr_x");
        }
        r.body(Body::from(body)).unwrap()
    };
    let r = w
        .app
        .send(send(
            Method::POST,
            "/api/hosts",
            "application/json",
            big.clone(),
        ))
        .await;
    check_json(&r, StatusCode::PAYLOAD_TOO_LARGE);
    let r = w
        .app
        .send(send(
            Method::POST,
            "/api/enroll",
            "application/json",
            big.clone(),
        ))
        .await;
    check_json(&r, StatusCode::PAYLOAD_TOO_LARGE);
    let r = w
        .app
        .send(send(Method::POST, "/api/hosts", "text/plain", "{}".into()))
        .await;
    check_json(&r, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let r = w
        .app
        .send(send(
            Method::POST,
            "/api/hosts",
            "application/json",
            "{".into(),
        ))
        .await;
    check_json(&r, StatusCode::BAD_REQUEST);
    let r = w
        .app
        .send(send(
            Method::POST,
            "/api/hosts",
            "application/json",
            "{}".into(),
        ))
        .await;
    check_json(&r, StatusCode::UNPROCESSABLE_ENTITY);
    let r = w
        .app
        .send(send(
            Method::DELETE,
            "/api/hosts",
            "application/json",
            "{}".into(),
        ))
        .await;
    check_json(&r, StatusCode::METHOD_NOT_ALLOWED);
    let r = w.owner.get("/api/no-such-thing").await;
    check_json(&r, StatusCode::NOT_FOUND);
    assert_eq!(
        w.app
            .db
            .outstanding_allocations(&w.owner.sub)
            .await
            .unwrap(),
        0
    );
    // Pages answer with a page.
    for (r, status) in [
        (w.owner.get("/no-such-page").await, StatusCode::NOT_FOUND),
        (
            w.app
                .send(send(
                    Method::POST,
                    "/hosts",
                    "application/x-www-form-urlencoded",
                    "x".repeat(300 * 1024),
                ))
                .await,
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ] {
        assert_eq!(r.status, status, "{}", r.text());
        let ct = r.headers[header::CONTENT_TYPE].to_str().unwrap().to_owned();
        assert!(ct.starts_with("text/html"), "{ct}");
        assert!(r.text().contains("<h1>"), "{}", r.text());
    }
}

async fn i4_answers_carrying_a_secret_are_never_cached(w: World) {
    let no_store = |r: &support::Reply| {
        assert_eq!(
            r.headers
                .get(header::CACHE_CONTROL)
                .map(|v| v.to_str().unwrap()),
            Some("no-store"),
            "{}",
            r.status
        );
    };
    // The one-liner, from the API and from the page.
    let r = w
        .owner
        .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    no_store(&r);
    let token = r.json()["token"].as_str().unwrap().to_owned();
    let r = w
        .owner
        .post_form("/hosts", &[("profile_id", "gb10-spark-1")])
        .await;
    assert!(r.text().contains("byo_enr_"), "{}", r.status);
    no_store(&r);
    // The enrolment answer (host token, agent token, WireGuard key).
    let r = w.enroll(&token, &spark()).await;
    assert_eq!(r.status, StatusCode::OK);
    no_store(&r);
    // A sign-in's session cookie.
    let r = w
        .app
        .request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": "owner@example.com", "password": support::PASSWORD})),
        )
        .await;
    assert!(r.session_cookie().is_some());
    no_store(&r);
    // What a route gave its own rule keeps it.
    let css = w.app.get("/assets/style.css", None).await;
    assert!(
        css.headers[header::CACHE_CONTROL]
            .to_str()
            .unwrap()
            .starts_with("public")
    );
}

// ---- 5. Accounts ----------------------------------------------------------------------

async fn i5_sign_up_does_not_tell_whether_an_email_has_an_account(w: World) {
    let fresh = w
        .app
        .sign_up("new@example.com", "plum kettle ferry orbit", "")
        .await;
    let taken = w
        .app
        .sign_up("customer@example.com", "plum kettle ferry orbit", "")
        .await;
    assert_eq!(fresh.status, StatusCode::ACCEPTED, "{}", fresh.text());
    assert_eq!((fresh.status, fresh.json()), (taken.status, taken.json()));
    assert!(fresh.session_cookie().is_none() && taken.session_cookie().is_none());
    // The existing account is untouched: its password still signs in, the new one does not.
    let login = |email: &'static str, password: &'static str| {
        w.app.request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": email, "password": password})),
        )
    };
    assert_eq!(
        login("customer@example.com", support::PASSWORD)
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        login("customer@example.com", "plum kettle ferry orbit")
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        login("new@example.com", "plum kettle ferry orbit")
            .await
            .status,
        StatusCode::OK
    );
    // The page says the same words either way.
    let page = |email: &str| {
        let body = support::form_encode(&[
            ("email", email),
            ("password", "plum kettle ferry orbit"),
            ("display_name", ""),
        ]);
        w.app.send(
            Request::post("/signup")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .unwrap(),
        )
    };
    let (a, b) = (
        page("other@example.com").await,
        page("customer@example.com").await,
    );
    assert_eq!((a.status, a.text()), (b.status, b.text()));
}

async fn i5_common_and_trivial_passwords_are_refused(w: World) {
    for weak in [
        "passwordpassword",
        "aaaaaaaaaaaa",
        "            ",
        "weak@example.com1",
    ] {
        let r = w.app.sign_up("weak@example.com", weak, "").await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("weak_password")),
            "{weak:?}"
        );
    }
    assert!(
        w.app
            .db
            .user_by_email("weak@example.com")
            .await
            .unwrap()
            .is_none()
    );
}

async fn i5_names_are_normalised_and_cannot_pose_as_another(w: World) {
    let r = w
        .app
        .sign_up(
            "a@example.com",
            "plum kettle ferry orbit",
            "Admin\u{200B}istrator",
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let r = w
        .app
        .sign_up(
            "b@example.com",
            "plum kettle ferry orbit",
            "\u{202E}Ame\u{301}lie\u{2069}  Ro",
        )
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let user = w
        .app
        .db
        .user_by_email("b@example.com")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(user.display_name, "Am\u{e9}lie Ro");
    assert!(
        w.app
            .db
            .user_by_email("a@example.com")
            .await
            .unwrap()
            .is_none()
    );
}

// ---- 6. byo up's origins ----------------------------------------------------------------

async fn form(app: &TestApp, origin: &str) -> support::Reply {
    app.send(
        Request::post("/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::ORIGIN, origin)
            .body(Body::from(support::form_encode(&[
                ("email", "owner@example.com"),
                ("password", support::PASSWORD),
            ])))
            .unwrap(),
    )
    .await
}

async fn i6_loopback_names_are_origins_only_where_configured(w: World) {
    // Production (the test config: public_url http://localhost:8080) keeps exactly it.
    assert_eq!(
        form(&w.app, "http://127.0.0.1:8080").await.status,
        StatusCode::FORBIDDEN
    );
    assert!(
        form(&w.app, "http://localhost:8080")
            .await
            .status
            .is_redirection()
    );
    // byo up's listener on loopback: both names are its origins, nothing else is.
    let mut config = (*w.app.state.config).clone();
    config.loopback_origins = loopback_origins("127.0.0.1:8080".parse().unwrap());
    let state = byo_server::AppState::new(w.app.db.store.clone(), config);
    let up = TestApp {
        router: byo_server::router(state.clone()),
        state,
        db: w.app.db,
    };
    assert!(
        form(&up, "http://127.0.0.1:8080")
            .await
            .status
            .is_redirection()
    );
    assert!(
        form(&up, "http://localhost:8080")
            .await
            .status
            .is_redirection()
    );
    assert_eq!(
        form(&up, "http://127.0.0.1:9999").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        form(&up, "https://evil.example").await.status,
        StatusCode::FORBIDDEN
    );
    assert!(loopback_origins("192.0.2.1:8080".parse().unwrap()).is_empty());
}

// ---- 7. Property tests: every outside-facing wire type, hostile values -------------------

mod hostile {
    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};
    use serde_json::{Value, json};

    /// A value for a field whose bound is `limit` bytes: strings on both sides of it (in
    /// two-byte characters too), arbitrary Unicode, bidi and zero-width characters, markup,
    /// NULs, and values of the wrong type.
    pub fn field(limit: usize) -> BoxedStrategy<Value> {
        prop_oneof![
            (0..limit + 3).prop_map(|n| json!("x".repeat(n))),
            (limit / 2..limit + 3).prop_map(|n| json!("é".repeat(n))),
            any::<String>().prop_map(Value::from),
            Just(json!("\u{202E}\u{200B}\u{0}<script>&amp;\u{FEFF}")),
            Just(json!("&".repeat(limit + 1))),
            any::<i64>().prop_map(Value::from),
            Just(Value::Null),
            Just(json!([1, {"a": "b"}])),
        ]
        .boxed()
    }

    /// A JSON value of any shape, nested a few levels, with big strings.
    pub fn blob() -> BoxedStrategy<Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            (0..12_000usize).prop_map(|n| json!("&".repeat(n))),
            any::<String>().prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
                prop::collection::btree_map("[a-z]{1,8}", inner, 0..8).prop_map(|m| json!(m)),
            ]
        })
        .boxed()
    }

    /// `n` values drawn from `strategy` (deterministic per run; no shrinking — a failure
    /// prints the value).
    pub fn draw(strategy: BoxedStrategy<Value>, n: usize) -> Vec<Value> {
        let mut runner = TestRunner::new(Config {
            failure_persistence: None,
            ..Config::default()
        });
        (0..n)
            .map(|_| strategy.new_tree(&mut runner).unwrap().current())
            .collect()
    }
}

const CASES: usize = 40;

fn node_strategy() -> proptest::strategy::BoxedStrategy<Value> {
    use proptest::prelude::*;
    let s = || hostile::field(limits::SHORT);
    (
        (s(), s(), s(), s(), s(), s(), s()),
        prop::collection::vec((s(), s()), 0..limits::RAILS + 3),
        prop_oneof![Just(json!(0)), any::<i64>().prop_map(Value::from)],
    )
        .prop_map(|((gpu, arch, os, osv, drv, mid, hid), rails, index)| {
            json!({"gpu_model": gpu, "gpu_count": 1, "gpu_mem_mib": 122880, "arch": arch,
                   "os_id": os, "os_version": osv, "driver_version": drv, "machine_id": mid,
                   "hardware_id": hid, "node_index": index,
                   "rails": rails.into_iter().map(|(iface, device)| json!({
                       "iface": iface, "device": device, "neighbours_discovered": 1}))
                       .collect::<Vec<_>>()})
        })
        .boxed()
}

async fn i7_hostile_enrolment_requests_are_never_stored_unbounded_nor_answered_500(w: World) {
    use proptest::prelude::*;
    let strategy = (
        node_strategy(),
        prop::collection::vec(node_strategy(), 0..limits::PEERS + 3),
    )
        .prop_map(|(mut node, peers)| {
            node["peers"] = json!(peers);
            node
        })
        .boxed();
    let mut token = None::<String>;
    for case in hostile::draw(strategy, CASES) {
        if token.is_none() {
            byo_server::app::reap::reap_once(&w.app.state)
                .await
                .unwrap();
            token = Some(w.provision().await["token"].as_str().unwrap().to_owned());
        }
        let r = w.enroll(token.as_deref().unwrap(), &case).await;
        assert!(!r.status.is_server_error(), "{case}: {}", r.text());
        // A request refused before it was judged leaves the token good; any other spent it.
        if r.status != StatusCode::BAD_REQUEST && r.status != StatusCode::UNPROCESSABLE_ENTITY
            || r.json()["error"] == "rejected"
        {
            token = None;
        }
    }
    for e in w.app.db.enrollment_views(None).await.unwrap() {
        let stored = e.fingerprint.map_or(0, |f| f.0.to_string().len());
        assert!(stored <= 64 * 1024, "{stored} bytes stored");
    }
    let page = w.op.page("/admin/hosts").await;
    assert!(
        page.len() <= 1024 * 1024,
        "/admin/hosts is {} bytes",
        page.len()
    );
}

async fn i7_hostile_host_reports_are_never_stored_unbounded_nor_answered_500(w: World) {
    use proptest::prelude::*;
    let (host_id, host_token) = w.enrolled().await;
    let strategy = (
        hostile::field(limits::SHORT),
        hostile::field(limits::MESSAGE),
        prop_oneof![Just(json!(0)), any::<i64>().prop_map(Value::from)],
        prop_oneof![Just(json!("applied")), hostile::field(limits::SHORT)],
    )
        .prop_map(|(name, error, node, state)| {
            json!({"node": node, "state": {"step": name, "state": state, "attempt": 1,
                   "error": error, "final": false, "at": "2026-11-29T12:05:00Z"}})
        })
        .boxed();
    for case in hostile::draw(strategy, CASES) {
        let r = w.host_call("/api/host/report", &host_token, &case).await;
        assert!(!r.status.is_server_error(), "{case}: {}", r.text());
        let stored = w
            .app
            .db
            .host(&host_id)
            .await
            .unwrap()
            .unwrap()
            .prepare_state;
        let size = stored.map_or(0, |s| serde_json::to_string(&s.0).unwrap().len());
        assert!(
            size <= limits::SHORT + limits::MESSAGE * 6 + 256,
            "{size} bytes"
        );
    }
    let page = w.owner.get(&format!("/hosts/{host_id}/progress")).await;
    assert!(!page.status.is_server_error());
    assert!(page.body.len() < 64 * 1024, "{} bytes", page.body.len());
}

async fn i7_hostile_heartbeats_are_never_stored_unbounded_nor_answered_500(w: World) {
    use proptest::prelude::*;
    let (host_id, host_token) = w.enrolled().await;
    let strategy = (
        hostile::field(limits::SHORT),
        prop_oneof![Just(json!("ok")), hostile::field(limits::SHORT)],
        hostile::blob(),
    )
        .prop_map(|(version, lxd, details)| {
            json!({"agent_version": version, "lxd": lxd, "relay": "ok", "tunnel": "ok",
                   "gpu": "ok", "storage": "ok", "instances": 0, "details": details})
        })
        .boxed();
    for case in hostile::draw(strategy, CASES) {
        let r = w.host_call("/api/host/heartbeat", &host_token, &case).await;
        assert!(!r.status.is_server_error(), "{}: {}", r.status, r.text());
        if let Some(status) = w.app.db.host_status(&host_id).await.unwrap() {
            let details = serde_json::to_string(&status.details.0).unwrap().len();
            assert!(details <= limits::DETAILS, "{details} bytes of details");
            assert!(status.agent_version.map_or(0, |v| v.len()) <= limits::SHORT);
        }
    }
}

async fn i7_hostile_key_changes_are_never_stored_unbounded_nor_answered_500(w: World) {
    use proptest::prelude::*;
    let strategy = (
        prop_oneof![Just(json!("add")), Just(json!("remove")), hostile::field(limits::SHORT)],
        prop_oneof![
            Just(json!(byo_core::keylist_testing::public_key_line())),
            hostile::field(limits::PUBLIC_KEY),
        ],
        hostile::field(limits::NAME_CHARS * 2),
    )
        .prop_map(|(action, key, label)| {
            json!({"action": action, "public_key": key, "label": label, "fingerprint": label})
        })
        .boxed();
    for case in hostile::draw(strategy, CASES) {
        let r =
            w.op.post("/api/admin/operator-keys/changes", case.clone())
                .await;
        assert!(!r.status.is_server_error(), "{case}: {}", r.text());
    }
    let view = w.op.get("/api/admin/operator-keys").await.json();
    for key in view["draft"]["keys"].as_array().into_iter().flatten() {
        let label = key["label"].as_str().unwrap();
        assert!(label.chars().count() <= limits::NAME_CHARS, "{label:?}");
        assert!(key["public_key"].as_str().unwrap().len() <= limits::PUBLIC_KEY);
    }
}

async fn i7_hostile_instance_requests_are_never_stored_unbounded_nor_answered_500(w: World) {
    let strategy = {
        use proptest::prelude::*;
        (hostile::field(limits::SHORT), hostile::field(limits::SHORT))
            .prop_map(|(gpu, key)| json!({"gpu_type": gpu, "ssh_key_id": key}))
            .boxed()
    };
    for case in hostile::draw(strategy, CASES) {
        let r = w.customer.post("/api/vms", case.clone()).await;
        assert!(!r.status.is_server_error(), "{case}: {}", r.text());
    }
    let vms = w.customer.get("/api/vms").await.json();
    for vm in vms.as_array().into_iter().flatten() {
        assert!(vm["gpu_type"].as_str().unwrap().len() <= limits::SHORT);
    }
}

with_world!(
    i1_the_enrolment_request_is_bounded_at_the_wire,
    i1_host_report_steps_and_messages_are_bounded,
    i1_heartbeat_details_are_bounded,
    i1_names_and_labels_are_bounded,
    i2_fifty_simultaneous_provisions_take_exactly_the_cap,
    i2_slugs_are_never_reused_across_reject_revoke_and_retire,
    i3_placement_is_a_closed_set_and_reactivation_is_an_explicit_audited_change,
    i4_framework_rejections_answer_in_one_shape,
    i4_answers_carrying_a_secret_are_never_cached,
    i5_sign_up_does_not_tell_whether_an_email_has_an_account,
    i5_common_and_trivial_passwords_are_refused,
    i5_names_are_normalised_and_cannot_pose_as_another,
    i6_loopback_names_are_origins_only_where_configured,
    i7_hostile_enrolment_requests_are_never_stored_unbounded_nor_answered_500,
    i7_hostile_host_reports_are_never_stored_unbounded_nor_answered_500,
    i7_hostile_heartbeats_are_never_stored_unbounded_nor_answered_500,
    i7_hostile_key_changes_are_never_stored_unbounded_nor_answered_500,
    i7_hostile_instance_requests_are_never_stored_unbounded_nor_answered_500,
);

/// #16: no page of ours can be framed or run another origin's script, whatever answered —
/// a page, the API, the framework's 404 or a refusal.
async fn every_answer_forbids_framing_and_foreign_scripts(w: World) {
    let answers = [
        w.owner.get("/hosts").await,
        w.owner.get("/api/me").await,
        w.owner.get("/no-such-page").await,
        w.app.get("/api/me", None).await,
    ];
    for r in &answers {
        for (name, value) in byo_server::routes::SECURITY_HEADERS {
            assert_eq!(
                r.headers.get(name).map(|v| v.to_str().unwrap()),
                Some(*value),
                "{name} on a {}",
                r.status
            );
        }
        let csp = r.headers[header::CONTENT_SECURITY_POLICY].to_str().unwrap();
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
    }
}

with_world!(every_answer_forbids_framing_and_foreign_scripts);
