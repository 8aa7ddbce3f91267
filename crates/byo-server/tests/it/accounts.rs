//! Accounts, sessions and the error contract, through the HTTP API and pages.

use crate::on_each_backend;
use crate::support;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use byo_wire::Role;
use serde_json::json;
use support::{PASSWORD, TestApp};

/// Sign-up opens no session (it answers alike for a taken address, docs/security.md):
/// the new account signs in next.
async fn signup_then_sign_in_and_logout_ends_the_session(app: TestApp) {
    let reply = app.sign_up(" Ana@Example.com ", PASSWORD, "Ana").await;
    assert_eq!(reply.status, StatusCode::ACCEPTED, "{}", reply.text());
    assert!(reply.session_cookie().is_none());
    let reply = app
        .request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": "ana@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["email"], "ana@example.com");
    assert_eq!(reply.json()["roles"], json!([]));
    let cookie = reply
        .headers
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    for attr in ["HttpOnly", "Secure", "SameSite=Lax", "Path=/"] {
        assert!(cookie.contains(attr), "cookie lacks {attr}: {cookie}");
    }
    // #16: Secure cookies carry the __Host- prefix (no Domain, so no subdomain shadows it).
    assert!(cookie.starts_with("__Host-byo_session="), "{cookie}");
    assert!(!cookie.to_ascii_lowercase().contains("domain="), "{cookie}");
    let session = reply.session_cookie().unwrap();

    let me = app.get("/api/me", Some(&session)).await;
    assert_eq!(me.status, StatusCode::OK);
    assert_eq!(me.json()["display_name"], "Ana");

    let out = app
        .request(Method::POST, "/api/auth/logout", Some(&session), None)
        .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    assert_eq!(
        app.get("/api/me", Some(&session)).await.status,
        StatusCode::UNAUTHORIZED
    );
}

async fn bad_signups_are_refused_and_create_nothing(app: TestApp) {
    app.user_with("taken@example.com", &[]).await;
    for (body, code) in [
        (
            json!({"email": "not-an-email", "password": PASSWORD}),
            "invalid_email",
        ),
        (
            json!({"email": "short@example.com", "password": "short"}),
            "weak_password",
        ),
        // Issue #36, 8: an address or a name that passes for another.
        (
            json!({"email": "t\u{430}ken@example.com", "password": PASSWORD}),
            "invalid_email",
        ),
        (
            json!({"email": "taken@example.com.", "password": PASSWORD}),
            "invalid_email",
        ),
        (
            json!({"email": "ana@example.com", "password": PASSWORD,
                   "display_name": "\u{410}dministrator"}),
            "invalid_name",
        ),
        (
            json!({"email": "ana@example.com", "password": PASSWORD,
                   "display_name": "Admin\u{200B}istrator"}),
            "invalid_name",
        ),
        (
            json!({"email": "ana@example.com", "password": PASSWORD,
                   "display_name": "Administr\u{3b1}tor"}),
            "invalid_name",
        ),
    ] {
        let reply = app
            .request(Method::POST, "/api/auth/signup", None, Some(body))
            .await;
        assert!(reply.status.is_client_error(), "{}", reply.text());
        assert_eq!(reply.json()["error"], code);
        assert!(reply.session_cookie().is_none());
    }
    let malformed = app
        .send(
            Request::post("/api/auth/signup")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{\"email\": 5"))
                .unwrap(),
        )
        .await;
    assert!(malformed.status.is_client_error());
    assert_eq!(
        app.db.users_overview().await.unwrap().len(),
        1,
        "only the first user exists"
    );
}

async fn wrong_password_and_unknown_email_get_the_same_answer(app: TestApp) {
    app.user_with("ana@example.com", &[]).await;
    let wrong = app
        .request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": "ana@example.com", "password": "wrong password!!"})),
        )
        .await;
    let unknown = app
        .request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": "bob@example.com", "password": "wrong password!!"})),
        )
        .await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.as_seen(), unknown.as_seen(), "headers included");
    assert!(wrong.session_cookie().is_none());

    let ok = app
        .request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": "ANA@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK);
    assert!(ok.session_cookie().is_some());
}

async fn a_password_change_ends_every_other_session(app: TestApp) {
    let (sub, first) = app.user_with("ana@example.com", &[]).await;
    let second = app.session_for(&sub).await;
    let refused = app
        .request(
            Method::PUT,
            "/api/me/password",
            Some(&first),
            Some(
                json!({"current_password": "not it at all", "new_password": "a new long password"}),
            ),
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        app.get("/api/me", Some(&second)).await.status,
        StatusCode::OK,
        "nothing changed"
    );

    let reply = app
        .request(
            Method::PUT,
            "/api/me/password",
            Some(&first),
            Some(json!({"current_password": PASSWORD, "new_password": "a new long password"})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NO_CONTENT);
    let renewed = reply.session_cookie().unwrap();
    assert_eq!(
        app.get("/api/me", Some(&second)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.get("/api/me", Some(&first)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.get("/api/me", Some(&renewed)).await.status,
        StatusCode::OK
    );
}

async fn a_cross_site_post_is_refused_and_changes_nothing(app: TestApp) {
    let (_, op) = app.user_with("op@example.com", &[Role::Operator]).await;
    let (target, _) = app.user_with("target@example.com", &[]).await;
    let forged = app
        .send(
            Request::post(format!("/admin/users/{target}/roles/community_host/grant"))
                .header(header::COOKIE, format!("__Host-byo_session={op}"))
                .header(header::ORIGIN, "https://evil.example")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    assert!(app.db.roles_of(&target).await.unwrap().is_empty());

    let same_site = app
        .send(
            Request::post(format!("/admin/users/{target}/roles/community_host/grant"))
                .header(header::COOKIE, format!("__Host-byo_session={op}"))
                .header(header::ORIGIN, "http://localhost:8080")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(same_site.status, StatusCode::SEE_OTHER);
    assert_eq!(
        app.db.roles_of(&target).await.unwrap(),
        vec![Role::CommunityHost]
    );
    let audit = app.db.audit_log(10).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|a| a.action == "role.grant" && a.target.as_deref() == Some(&target))
    );
}

async fn the_last_superadmin_cannot_be_revoked_over_the_api(app: TestApp) {
    let (sub, session) = app.user_with("root@example.com", &[Role::Superadmin]).await;
    let reply = app
        .request(
            Method::DELETE,
            &format!("/api/admin/users/{sub}/roles/superadmin"),
            Some(&session),
            None,
        )
        .await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_eq!(reply.json()["error"], "last_superadmin");
    assert_eq!(app.db.roles_of(&sub).await.unwrap(), vec![Role::Superadmin]);
}

async fn a_5xx_carries_a_request_id_and_no_internals(app: TestApp) {
    let (_, session) = app.user_with("ana@example.com", &[]).await;
    app.db.close().await;
    let reply = app.get("/api/me", Some(&session)).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    let body = reply.json();
    assert_eq!(body["error"], "internal");
    let id = body["request_id"].as_str().unwrap();
    assert_eq!(reply.headers.get("x-request-id").unwrap(), id);
    let text = reply.text().to_lowercase();
    for internal in ["sqlx", "pool", "database", "closed", "sqlite", "postgres"] {
        assert!(
            !text.contains(internal),
            "5xx body leaks {internal:?}: {text}"
        );
    }
    let health = app.get("/healthz", None).await;
    assert_eq!(health.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health.json()["database"], "unreachable");
}

async fn healthz_metrics_and_openapi_answer(app: TestApp) {
    let health = app.get("/healthz", None).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json()["status"], "ok");
    assert_eq!(health.json()["database"], app.db.backend().to_string());

    let doc = app.get("/openapi.json", None).await.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    assert!(doc["components"]["schemas"]["UserView"].is_object());

    let text = app.state.metrics.encode();
    assert!(
        text.contains(r#"byo_http_requests_total{method="GET",route="/healthz",status="200"} 1"#),
        "{text}"
    );
    assert!(text.contains("byo_http_request_duration_seconds_bucket"));
}

async fn pages_sign_in_show_the_home_and_list_users(app: TestApp) {
    app.user_with("op@example.com", &[Role::Operator]).await;
    let form = |body: &str| {
        Request::post("/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    let bad = app.send(form("email=op%40example.com&password=nope")).await;
    assert_eq!(bad.status, StatusCode::UNAUTHORIZED);
    assert!(bad.text().contains("do not match an account"));
    assert!(
        bad.text().contains("value=\"op@example.com\""),
        "the email is kept"
    );

    let ok = app
        .send(form(&format!(
            "email=op%40example.com&password={}",
            PASSWORD.replace(' ', "+")
        )))
        .await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    let session = ok.session_cookie().unwrap();
    let home = app.get("/", Some(&session)).await;
    assert!(home.text().contains("op@example.com") && home.text().contains("operator"));
    let users = app.get("/admin/users", Some(&session)).await;
    assert_eq!(users.status, StatusCode::OK);
    assert!(users.text().contains("Grant community_host"));
    assert!(
        !users.text().contains("Grant superadmin"),
        "an operator is not offered superadmin"
    );
}

/// `app`'s database again, under rate limits of its own: `per_address` and `per_account` a
/// minute (the other tests sign in far more often than a person).
async fn with_rate_limits(app: TestApp, per_address: u32, per_account: u32) -> TestApp {
    let mut config = support::test_config();
    config.rate_limits = byo_server::config::RateLimitConfig {
        per_address_per_minute: per_address,
        per_account_per_minute: per_account,
    };
    let backend = app.db.backend();
    drop(app);
    TestApp::with_config(backend, config).await.unwrap()
}

/// #16: sign-in is limited per account and per address, with Retry-After as the backoff;
/// past a limit nothing happens — the right password opens no session — while another
/// account from elsewhere is still answered.
async fn sign_in_and_sign_up_are_rate_limited_per_account_and_per_address(app: TestApp) {
    let app = with_rate_limits(app, 6, 3).await;
    app.customer("ana@example.com").await;
    let sign_in = |email: &'static str, password: &'static str| app.sign_in(email, password);
    for _ in 0..3 {
        assert_eq!(
            sign_in("ana@example.com", "wrong").await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    // The account's burst is spent: even the right password is refused, and opens nothing.
    let limited = sign_in("ana@example.com", PASSWORD).await;
    assert_eq!(
        limited.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        limited.text()
    );
    assert_eq!(limited.json()["error"], "too_many_requests");
    let wait: u64 = limited.headers[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    assert!(limited.session_cookie().is_none());
    // Another account is still answered (its own 401), until the address's burst is spent.
    assert_eq!(
        sign_in("bob@example.com", "wrong").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        sign_in("cy@example.com", "wrong").await.status,
        StatusCode::UNAUTHORIZED
    );
    let r = app.sign_up("dee@example.com", PASSWORD, "Dee").await;
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the address's sixth: {}",
        r.text()
    );
    assert!(
        app.db
            .user_by_email("dee@example.com")
            .await
            .unwrap()
            .is_none()
    );
    // The page form is the same door.
    let page = app
        .send(
            Request::post("/login")
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from("email=bob%40example.com&password=x"))
                .unwrap(),
        )
        .await;
    assert_eq!(page.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(page.text().contains("<h1>"), "{}", page.text());
}

/// #36.3: the lockout probe. An attacker guessing at ana's password, from one address and
/// then from many, is backed off; ana, from the address she signed in from before, still
/// signs in each time, and the attacker's tries open nothing. A source the account was
/// never signed in from is backed off with the attacker's (the price of the per-account
/// limit), and another account is untouched.
async fn a36_3_the_real_user_signs_in_while_an_attacker_keeps_trying(app: TestApp) {
    use std::net::{IpAddr, Ipv4Addr};
    let app = with_rate_limits(app, 1_000, 3).await;
    app.customer("ana@example.com").await;
    app.customer("bob@example.com").await;
    let ip = |last: u8| IpAddr::V4(Ipv4Addr::new(127, 0, 7, last));
    let sign_in = |from: IpAddr, email: &'static str, password: &'static str| {
        let app = &app;
        async move {
            app.request_from(
                from,
                Method::POST,
                "/api/auth/login",
                None,
                Some(json!({"email": email, "password": password})),
            )
            .await
        }
    };
    let (ana_home, attacker) = (ip(10), ip(66));
    let first = sign_in(ana_home, "ana@example.com", PASSWORD).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());

    // One address: wrong guesses until the account's burst for unknown sources (3, one of
    // them ana's first sign-in, made before her home address was known) is spent, then 429
    // and nothing else.
    for _ in 0..2 {
        let r = sign_in(attacker, "ana@example.com", "wrong").await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    }
    let r = sign_in(attacker, "ana@example.com", PASSWORD).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text());
    assert!(r.session_cookie().is_none());

    // Many addresses, one guess each, interleaved with ana's own sign-ins from home (her
    // own burst there is 3 a minute, the first spent above): every guess is backed off,
    // every one of hers gets in.
    for round in 0..2u8 {
        for n in 0..4u8 {
            let r = sign_in(ip(100 + round * 4 + n), "ana@example.com", PASSWORD).await;
            assert_eq!(
                r.status,
                StatusCode::TOO_MANY_REQUESTS,
                "round {round}: {}",
                r.text()
            );
            assert!(r.session_cookie().is_none());
        }
        let mine = sign_in(ana_home, "ana@example.com", PASSWORD).await;
        assert_eq!(
            mine.status,
            StatusCode::OK,
            "round {round}: {}",
            mine.text()
        );
        assert!(mine.session_cookie().is_some());
    }
    // Bob, from the attacker's own address, is answered as ever.
    let bob = sign_in(attacker, "bob@example.com", PASSWORD).await;
    assert_eq!(bob.status, StatusCode::OK, "{}", bob.text());
}

/// #36.8: the password change (`PUT /api/me/password`) is one of the doors limited per
/// address; past the burst the right current password changes nothing.
async fn a36_8_the_password_change_is_limited_per_address(app: TestApp) {
    let app = with_rate_limits(app, 3, 1_000).await;
    app.customer("ana@example.com").await;
    let login = app
        .request(
            Method::POST,
            "/api/auth/login",
            None,
            Some(json!({"email": "ana@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(login.status, StatusCode::OK, "{}", login.text());
    let session = login.session_cookie().unwrap();
    let before = app
        .db
        .user_by_email("ana@example.com")
        .await
        .unwrap()
        .unwrap()
        .password_hash;
    let change = |current: &'static str| {
        let (app, session) = (&app, &session);
        async move {
            app.request(
                Method::PUT,
                "/api/me/password",
                Some(session),
                Some(json!({"current_password": current,
                            "new_password": "an entirely new passphrase 42"})),
            )
            .await
        }
    };
    for _ in 0..2 {
        let r = change("wrong").await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    }
    let limited = change(PASSWORD).await;
    assert_eq!(
        limited.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        limited.text()
    );
    let after = app
        .db
        .user_by_email("ana@example.com")
        .await
        .unwrap()
        .unwrap()
        .password_hash;
    assert_eq!(before, after, "the refused change changed nothing");
}

/// The longest password accepted signs in, through the form too; one byte longer is never
/// hashed and is refused as any wrong password is.
async fn the_longest_password_signs_in_and_one_byte_more_is_refused_as_wrong(app: TestApp) {
    let longest: String = (0..byo_wire::limits::PASSWORD as u32)
        .map(|i| {
            char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[((i * 37 + i / 7) % 36) as usize])
        })
        .collect();
    let signup = app.sign_up("long@example.com", &longest, "Long").await;
    assert_eq!(signup.status, StatusCode::ACCEPTED, "{}", signup.text());
    let form = |password: &str| {
        Request::post("/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(format!(
                "email=long%40example.com&password={password}"
            )))
            .unwrap()
    };
    let ok = app.send(form(&longest)).await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER, "{}", ok.text());
    assert!(ok.session_cookie().is_some());
    let longer = app.send(form(&format!("{longest}a"))).await;
    let wrong = app.send(form("wrong password!!")).await;
    assert_eq!(longer.status, StatusCode::UNAUTHORIZED);
    assert_eq!(longer.text(), wrong.text());
    assert!(longer.session_cookie().is_none());
}

on_each_backend!(
    a36_3_the_real_user_signs_in_while_an_attacker_keeps_trying,
    a36_8_the_password_change_is_limited_per_address,
    the_longest_password_signs_in_and_one_byte_more_is_refused_as_wrong,
    sign_in_and_sign_up_are_rate_limited_per_account_and_per_address,
    signup_then_sign_in_and_logout_ends_the_session,
    bad_signups_are_refused_and_create_nothing,
    wrong_password_and_unknown_email_get_the_same_answer,
    a_password_change_ends_every_other_session,
    a_cross_site_post_is_refused_and_changes_nothing,
    the_last_superadmin_cannot_be_revoked_over_the_api,
    a_5xx_carries_a_request_id_and_no_internals,
    healthz_metrics_and_openapi_answer,
    pages_sign_in_show_the_home_and_list_users,
    the_navigation_is_by_role,
);

/// Issue #42, 2: the header carries what each person uses — a customer their instances,
/// bookings, billing and notices, and their account (their address links to it); an owner
/// their GPUs too; staff one "Operations" link —
/// and every operations page its own navigation, which no other page has.
async fn the_navigation_is_by_role(app: TestApp) {
    fn header_links(page: &str) -> Vec<String> {
        let header = &page[page.find("<header>").unwrap()..page.find("</header>").unwrap()];
        header
            .split("href=\"")
            .skip(1)
            .map(|rest| rest[..rest.find('"').unwrap()].to_owned())
            .collect()
    }
    let customer = app.customer("customer@example.com").await;
    let owner = app.community_host("owner@example.com").await;
    let op = app.operator("op@example.com").await;
    let mine = [
        "/",
        "/instances",
        "/prebookings",
        "/billing",
        "/notices",
        "/account",
    ];
    let page = customer.page("/instances").await;
    assert_eq!(header_links(&page), mine);
    assert!(!page.contains("nav class=\"ops\""), "{page}");
    assert!(!page.contains("href=\"/admin"), "{page}");
    assert_eq!(
        header_links(&owner.page("/instances").await),
        [
            "/",
            "/instances",
            "/prebookings",
            "/hosts",
            "/billing",
            "/notices",
            "/account"
        ]
    );
    let page = op.page("/instances").await;
    assert_eq!(
        header_links(&page),
        [
            "/",
            "/instances",
            "/prebookings",
            "/hosts",
            "/billing",
            "/notices",
            "/admin",
            "/account"
        ]
    );
    assert!(!page.contains("nav class=\"ops\""), "{page}");
    // Every page the sub-navigation names carries it, whole.
    let operations = byo_server::pages::OPERATIONS;
    assert_eq!(operations.len(), 11);
    for (path, _) in operations {
        let page = op.page(path).await;
        let ops = &page[page
            .find("<nav class=\"ops\"")
            .unwrap_or_else(|| panic!("{path}: {page}"))..];
        let ops = &ops[..ops.find("</nav>").unwrap()];
        for (href, _) in operations {
            assert!(
                ops.contains(&format!("href=\"{href}\"")),
                "{path} lacks {href}"
            );
        }
        assert_eq!(
            header_links(&page).len(),
            8,
            "{path}: the header stays short"
        );
    }
}
