//! API tokens (issue #43, 1): made on the account (page or API, from a session only), shown
//! once and kept as a hash, listed with their last use, revoked at once; every refusal
//! proved to change nothing. What each scope reaches, route by route, is the role matrix's
//! (`authorization::api_tokens_reach_exactly_their_scope`).

use crate::on_each_backend;
use crate::support::{self, TestApp, User};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_server::clock::Clock;
use chrono::TimeDelta;
use serde_json::{Value, json};

const KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl laptop";

struct World {
    app: TestApp,
    clock: Clock,
    customer: User,
}

async fn world(mut app: TestApp) -> World {
    let clock = Clock::manual("2026-12-06T12:00:00Z".parse().unwrap());
    app.state = app.state.clone().with_clock(clock.clone());
    app.router = byo_server::router(app.state.clone());
    let customer = app.customer("customer@example.com").await;
    World {
        app,
        clock,
        customer,
    }
}

impl World {
    async fn make(&self, who: &User, body: Value) -> support::Reply {
        who.request(Method::POST, "/api/me/tokens", Some(body))
            .await
    }

    async fn token(&self, who: &User, name: &str, scope: &str) -> (String, String) {
        let made = self.make(who, json!({"name": name, "scope": scope})).await;
        assert_eq!(made.status, StatusCode::CREATED, "{}", made.text());
        let body = made.json();
        (
            body["token"].as_str().unwrap().to_owned(),
            body["api_token"]["id"].as_str().unwrap().to_owned(),
        )
    }

    async fn with(
        &self,
        token: &str,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> support::Reply {
        self.app.request_with_token(method, path, token, body).await
    }

    async fn keys_of(&self, who: &User) -> usize {
        self.app.db.ssh_keys_of(&who.sub).await.unwrap().len()
    }

    async fn tokens_of(&self, who: &User) -> Vec<byo_db::api_tokens::ApiTokenRow> {
        self.app.db.api_tokens_of(&who.sub).await.unwrap()
    }
}

fn code(reply: &support::Reply) -> String {
    reply.json()["error"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The secret is in the create's answer and nowhere after; the store holds its SHA-256;
/// the token then acts as its person on the API, and its use is noted with its source.
async fn a_token_is_shown_once_kept_as_its_hash_and_acts_as_its_person(app: TestApp) {
    let w = world(app).await;
    let made = w
        .make(&w.customer, json!({"name": "laptop", "scope": "instances"}))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.text());
    let body = made.json();
    let secret = body["token"].as_str().unwrap().to_owned();
    assert!(
        SecretToken::parse(TokenKind::Api, &secret).is_ok(),
        "{secret}"
    );
    assert_eq!(body["api_token"]["scope"], "instances");
    // Ninety days unless asked otherwise.
    let expires: chrono::DateTime<chrono::Utc> = body["api_token"]["expires_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(expires - w.clock.now(), TimeDelta::days(90));

    let listed = w.customer.get("/api/me/tokens").await;
    assert_eq!(listed.status, StatusCode::OK);
    assert!(
        !listed.text().contains(&secret),
        "the list shows the secret"
    );
    assert_eq!(listed.json()[0]["name"], "laptop");
    assert_eq!(listed.json()[0]["last_used_at"], Value::Null);
    let page = w.customer.get("/account").await;
    assert!(page.text().contains("laptop") && !page.text().contains(&secret));
    // Found by its SHA-256, which is what the row holds.
    let found = w
        .app
        .db
        .api_token_by_hash(&SecretToken::parse(TokenKind::Api, &secret).unwrap().hash())
        .await
        .unwrap()
        .expect("the row holds the secret's hash");
    assert_eq!(found.token.name, "laptop");
    let mut req = Request::builder()
        .uri("/api/me")
        .header(header::AUTHORIZATION, format!("Bearer {secret}"))
        .body(Body::empty())
        .unwrap();
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::new(
            "192.0.2.7".parse().unwrap(),
            40_000,
        )));
    let me = w.app.send(req).await;
    assert_eq!(me.status, StatusCode::OK, "{}", me.text());
    assert_eq!(me.json()["email"], "customer@example.com");
    let row = &w.tokens_of(&w.customer).await[0];
    assert_eq!(row.last_used_at, Some(w.clock.now()));
    assert_eq!(row.last_used_from.as_deref(), Some("192.0.2.7"));
    let listed = w.customer.get("/api/me/tokens").await.json();
    assert_eq!(listed[0]["last_used_from"], "192.0.2.7");

    // It rents: a key added with it is the customer's, audited under the token's name.
    let added = w
        .with(
            &secret,
            Method::POST,
            "/api/ssh-keys",
            Some(json!({"name": "laptop", "public_key": KEY})),
        )
        .await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.text());
    assert_eq!(w.keys_of(&w.customer).await, 1);
    let audit = w.app.db.audit_log(50).await.unwrap();
    let add = audit.iter().find(|a| a.action == "ssh_key.add").unwrap();
    assert_eq!(add.actor_sub.as_deref(), Some(w.customer.sub.as_str()));
    assert_eq!(add.via_token.as_deref(), Some("laptop"));
    let create = audit
        .iter()
        .find(|a| a.action == "api_token.create")
        .unwrap();
    assert_eq!(create.via_token, None, "made from a session");
    assert!(!create.details.0.to_string().contains(&secret));
}

/// Expired, revoked, malformed, unknown, its person disabled: each a 401 that says which,
/// and the request it carried changes nothing.
async fn a_token_that_does_not_authenticate_says_why_and_changes_nothing(app: TestApp) {
    let w = world(app).await;
    let (revoked, revoked_id) = w.token(&w.customer, "old-laptop", "instances").await;
    let (expiring, _) = w.token(&w.customer, "ci", "instances").await;
    let live = w
        .make(
            &w.customer,
            json!({"name": "fresh", "scope": "instances", "expires_in_days": 365}),
        )
        .await
        .json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let gone = w
        .customer
        .request(
            Method::DELETE,
            &format!("/api/me/tokens/{revoked_id}"),
            None,
        )
        .await;
    assert_eq!(gone.status, StatusCode::NO_CONTENT);
    let listed = w.customer.get("/api/me/tokens").await.json();
    assert_eq!(
        listed.as_array().unwrap().len(),
        2,
        "a revoked token leaves the list"
    );
    // The name is free again.
    w.token(&w.customer, "old-laptop", "read").await;

    let mut broken = expiring.clone();
    broken.pop();
    broken.push(if expiring.ends_with('A') { 'B' } else { 'A' });
    let unknown = SecretToken::generate(TokenKind::Api).expose().to_owned();
    let host_kind = SecretToken::generate(TokenKind::Host).expose().to_owned();

    let key = json!({"name": "laptop", "public_key": KEY});
    let try_add = |token: String| {
        let w = &w;
        let key = key.clone();
        async move {
            w.with(&token, Method::POST, "/api/ssh-keys", Some(key))
                .await
        }
    };
    let r = try_add(revoked.clone()).await;
    assert_eq!(
        (r.status, code(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "token_revoked"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("old-laptop"), "{}", r.text());
    let r = try_add(broken).await;
    assert_eq!(
        (r.status, code(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "invalid_token")
    );
    let r = try_add(unknown).await;
    assert_eq!(
        (r.status, code(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "invalid_token")
    );
    let r = try_add(host_kind).await;
    assert_eq!(
        (r.status, code(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "invalid_token")
    );

    w.clock.advance(TimeDelta::days(90));
    let r = try_add(expiring.clone()).await;
    assert_eq!(
        (r.status, code(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "token_expired"),
        "{}",
        r.text()
    );
    // (The customer's session ended long ago: a new one.)
    let session = w.app.session_for(&w.customer.sub).await;
    let listed = w.app.get("/api/me/tokens", Some(&session)).await.json();
    let ci = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ci")
        .unwrap();
    assert_eq!(ci["expired"], true, "an expired token stays listed, marked");

    // A disabled person's tokens die with their sessions.
    w.app
        .db
        .execute_unchecked(&format!(
            "update users set disabled_at = created_at where sub = '{}'",
            w.customer.sub
        ))
        .await
        .unwrap();
    let r = try_add(live).await;
    assert_eq!(
        (r.status, code(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "invalid_token")
    );

    assert_eq!(
        w.keys_of(&w.customer).await,
        0,
        "a refused token added a key"
    );
}

/// A scope that does not reach a route, or a route only a session reaches: 403 with the
/// code that says which, and nothing changed.
async fn a_token_outside_its_scope_changes_nothing(app: TestApp) {
    let w = world(app).await;
    let (read, _) = w.token(&w.customer, "dashboard", "read").await;
    let (hosts, _) = w.token(&w.customer, "owner-script", "hosts").await;
    let key = json!({"name": "laptop", "public_key": KEY});
    for token in [&read, &hosts] {
        let r = w
            .with(token, Method::POST, "/api/ssh-keys", Some(key.clone()))
            .await;
        assert_eq!(
            (r.status, code(&r).as_str()),
            (StatusCode::FORBIDDEN, "out_of_scope"),
            "{}",
            r.text()
        );
    }
    assert_eq!(w.keys_of(&w.customer).await, 0);
    // Reading is what read does.
    let r = w.with(&read, Method::GET, "/api/ssh-keys", None).await;
    assert_eq!(r.status, StatusCode::OK);

    // No token makes, lists or revokes tokens, or changes the password.
    let (instances, id) = w.token(&w.customer, "rentals", "instances").await;
    let before = w.tokens_of(&w.customer).await.len();
    for (method, path, body) in [
        (
            Method::POST,
            "/api/me/tokens".to_owned(),
            Some(json!({"name": "more", "scope": "read"})),
        ),
        (Method::GET, "/api/me/tokens".to_owned(), None),
        (Method::DELETE, format!("/api/me/tokens/{id}"), None),
        (
            Method::PUT,
            "/api/me/password".to_owned(),
            Some(
                json!({"current_password": support::PASSWORD, "new_password": "another long password"}),
            ),
        ),
    ] {
        let r = w.with(&instances, method.clone(), &path, body).await;
        assert_eq!(
            (r.status, code(&r).as_str()),
            (StatusCode::FORBIDDEN, "session_only"),
            "{method} {path}: {}",
            r.text()
        );
    }
    assert_eq!(w.tokens_of(&w.customer).await.len(), before);
    let r = w.with(&instances, Method::GET, "/api/me", None).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "the token still works: nothing revoked it"
    );
    let signed_in = w.customer.get("/api/me").await;
    assert_eq!(
        signed_in.status,
        StatusCode::OK,
        "the password did not change"
    );
}

/// A customer cannot make an admin token; a bad name, expiry or a second live token of a
/// name is refused; past fifty live tokens a create is refused — each leaving the list as
/// it was.
async fn making_a_token_refuses_what_it_must(app: TestApp) {
    let w = world(app).await;
    w.token(&w.customer, "laptop", "read").await;
    for (body, status, want) in [
        (
            json!({"name": "root", "scope": "admin"}),
            StatusCode::FORBIDDEN,
            "scope_above_roles",
        ),
        (
            json!({"name": "laptop", "scope": "hosts"}),
            StatusCode::CONFLICT,
            "name_taken",
        ),
        (
            json!({"name": "  ", "scope": "read"}),
            StatusCode::BAD_REQUEST,
            "invalid_name",
        ),
        (
            json!({"name": "long", "scope": "read", "expires_in_days": 366}),
            StatusCode::BAD_REQUEST,
            "invalid_expiry",
        ),
        (
            json!({"name": "never", "scope": "read", "expires_in_days": 0}),
            StatusCode::BAD_REQUEST,
            "invalid_expiry",
        ),
        (
            json!({"name": "x".repeat(65), "scope": "read"}),
            StatusCode::BAD_REQUEST,
            "too_long",
        ),
        (
            json!({"name": "odd", "scope": "everything"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request",
        ),
    ] {
        let r = w.make(&w.customer, body.clone()).await;
        assert_eq!(
            (r.status, code(&r).as_str()),
            (status, want),
            "{body}: {}",
            r.text()
        );
    }
    assert_eq!(w.tokens_of(&w.customer).await.len(), 1);

    // A year is the longest; staff may hold admin.
    let year = w
        .make(
            &w.customer,
            json!({"name": "year", "scope": "read", "expires_in_days": 365}),
        )
        .await;
    assert_eq!(year.status, StatusCode::CREATED);
    let op = w.app.operator("op@example.com").await;
    w.token(&op, "automation", "admin").await;

    for i in 2..byo_db::api_tokens::MAX_LIVE_TOKENS {
        w.token(&w.customer, &format!("t{i}"), "read").await;
    }
    assert_eq!(
        w.tokens_of(&w.customer).await.len() as i64,
        byo_db::api_tokens::MAX_LIVE_TOKENS
    );
    let r = w
        .make(&w.customer, json!({"name": "one-more", "scope": "read"}))
        .await;
    assert_eq!(
        (r.status, code(&r).as_str()),
        (StatusCode::CONFLICT, "too_many_tokens")
    );
    assert_eq!(
        w.tokens_of(&w.customer).await.len() as i64,
        byo_db::api_tokens::MAX_LIVE_TOKENS
    );
}

/// A request with a token is the token's alone: a session cookie riding along is not read,
/// no page admits it, no Origin check stops it (no browser adds the header), and the
/// person's roles still gate it — an admin token whose maker is no longer staff reaches
/// nothing of the operations.
async fn a_token_is_judged_alone_and_never_above_its_persons_roles(app: TestApp) {
    let w = world(app).await;
    let op = w.app.operator("op@example.com").await;
    let (admin, _) = w.token(&op, "automation", "admin").await;

    // A cookie of someone else's riding along is not read.
    let req = Request::builder()
        .uri("/api/me")
        .header(header::AUTHORIZATION, format!("Bearer {admin}"))
        .header(
            header::COOKIE,
            format!("__Host-byo_session={}", w.customer.session),
        )
        .body(Body::empty())
        .unwrap();
    let me = w.app.send(req).await;
    assert_eq!(me.json()["email"], "op@example.com");
    // A page: nobody, even with a good cookie beside the token.
    let req = Request::builder()
        .uri("/instances")
        .header(header::AUTHORIZATION, format!("Bearer {admin}"))
        .header(header::COOKIE, format!("__Host-byo_session={}", op.session))
        .body(Body::empty())
        .unwrap();
    let page = w.app.send(req).await;
    assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.text());
    assert_eq!(page.headers[header::LOCATION], "/login");

    // A foreign Origin stops a session's write, not a token's.
    let (rentals, _) = w.token(&w.customer, "rentals", "instances").await;
    let key = json!({"name": "laptop", "public_key": KEY});
    let foreign = |auth: (header::HeaderName, String)| {
        Request::builder()
            .method(Method::POST)
            .uri("/api/ssh-keys")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ORIGIN, "https://attacker.example")
            .header(auth.0, auth.1)
            .body(Body::from(key.to_string()))
            .unwrap()
    };
    let by_session = w
        .app
        .send(foreign((
            header::COOKIE,
            format!("__Host-byo_session={}", w.customer.session),
        )))
        .await;
    assert_eq!(by_session.status, StatusCode::FORBIDDEN);
    assert_eq!(w.keys_of(&w.customer).await, 0);
    let by_token = w
        .app
        .send(foreign((
            header::AUTHORIZATION,
            format!("Bearer {rentals}"),
        )))
        .await;
    assert_eq!(by_token.status, StatusCode::CREATED, "{}", by_token.text());

    // Roles gate after the scope: the operator's admin token reads the users, and stops
    // when the operator stops being one.
    let r = w.with(&admin, Method::GET, "/api/admin/users", None).await;
    assert_eq!(r.status, StatusCode::OK);
    let sa = w.app.superadmin("sa@example.com").await;
    let demoted = sa
        .request(
            Method::DELETE,
            &format!("/api/admin/users/{}/roles/operator", op.sub),
            None,
        )
        .await;
    assert_eq!(demoted.status, StatusCode::OK, "{}", demoted.text());
    let r = w.with(&admin, Method::GET, "/api/admin/users", None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
}

/// The account page: make a token (its secret on the answering page, once), see it listed
/// without it, revoke it, and the token is refused at once.
async fn the_account_page_makes_shows_once_and_revokes(app: TestApp) {
    let w = world(app).await;
    let form = |body: &str| {
        Request::builder()
            .method(Method::POST)
            .uri("/account/tokens")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(
                header::COOKIE,
                format!("__Host-byo_session={}", w.customer.session),
            )
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    let page = w.customer.get("/account").await.text();
    assert!(page.contains("No tokens yet"), "{page}");
    assert!(
        !page.contains("value=\"admin\""),
        "a customer is offered admin"
    );

    let refused = w
        .app
        .send(form("name=laptop&scope=read&expires_in_days=400"))
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(
        refused.text().contains("1 to 365 days"),
        "{}",
        refused.text()
    );
    assert!(
        refused.text().contains("value=\"laptop\""),
        "the form lost what was typed"
    );
    assert!(w.tokens_of(&w.customer).await.is_empty());

    let made = w
        .app
        .send(form("name=laptop&scope=instances&expires_in_days=30"))
        .await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.text());
    let html = made.text();
    let shown = html.find("new-token-secret").expect("the secret's box");
    let start = shown
        + html[shown..]
            .find("byo_api_")
            .expect("the secret is on the page");
    let secret: String = html[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    assert!(
        SecretToken::parse(TokenKind::Api, &secret).is_ok(),
        "{secret}"
    );
    let again = w.customer.get("/account").await.text();
    assert!(again.contains("laptop") && !again.contains(&secret));

    let r = w.with(&secret, Method::GET, "/api/vms", None).await;
    assert_eq!(r.status, StatusCode::OK);
    let id = w.tokens_of(&w.customer).await[0].id.clone();
    let revoke = Request::builder()
        .method(Method::POST)
        .uri(format!("/account/tokens/{id}/revoke"))
        .header(
            header::COOKIE,
            format!("__Host-byo_session={}", w.customer.session),
        )
        .body(Body::empty())
        .unwrap();
    let done = w.app.send(revoke).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER);
    let r = w.with(&secret, Method::GET, "/api/vms", None).await;
    assert_eq!(
        (r.status, code(&r).as_str()),
        (StatusCode::UNAUTHORIZED, "token_revoked")
    );
    let audit = w.app.db.audit_log(10).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|a| a.action == "api_token.revoke" && a.target.as_deref() == Some(id.as_str()))
    );
}

/// Using a token notes its last use at most once a minute from one address, at once from
/// another: a busy script does not write on every call.
async fn a_tokens_last_use_is_noted_without_a_write_per_call(app: TestApp) {
    let w = world(app).await;
    let (secret, _) = w.token(&w.customer, "poller", "read").await;
    w.with(&secret, Method::GET, "/api/vms", None).await;
    let first = w.tokens_of(&w.customer).await[0].last_used_at.unwrap();
    w.clock.advance(TimeDelta::seconds(30));
    w.with(&secret, Method::GET, "/api/vms", None).await;
    assert_eq!(w.tokens_of(&w.customer).await[0].last_used_at, Some(first));
    w.clock.advance(TimeDelta::seconds(31));
    w.with(&secret, Method::GET, "/api/vms", None).await;
    assert_eq!(
        w.tokens_of(&w.customer).await[0].last_used_at,
        Some(w.clock.now())
    );
}

/// The rules refuse a token's caller too, not only the routes (the pages reach the same
/// rules): whoever holds a token cannot make, list or revoke tokens through them.
async fn the_token_rules_refuse_a_tokens_caller_whatever_the_route(app: TestApp) {
    use byo_server::app::api_tokens;
    use byo_server::auth::CurrentUser;
    use byo_server::auth::api_token::TokenUse;
    let w = world(app).await;
    let (_, id) = w.token(&w.customer, "laptop", "read").await;
    let user = w.app.db.user(&w.customer.sub).await.unwrap().unwrap();
    let caller = CurrentUser {
        user,
        roles: vec![],
        via: Some(TokenUse {
            id: id.clone(),
            name: "laptop".into(),
            scope: byo_wire::states::ApiScope::Read,
        }),
    };
    let req = byo_wire::api::NewApiToken {
        name: "more".into(),
        scope: byo_wire::states::ApiScope::Read,
        expires_in_days: None,
    };
    let made = api_tokens::create(&w.app.state, &caller, &req)
        .await
        .unwrap_err();
    assert_eq!(made.code(), "session_only");
    assert_eq!(
        api_tokens::list(&w.app.state, &caller)
            .await
            .unwrap_err()
            .code(),
        "session_only"
    );
    assert_eq!(
        api_tokens::revoke(&w.app.state, &caller, &id)
            .await
            .unwrap_err()
            .code(),
        "session_only"
    );
    let left = w.tokens_of(&w.customer).await;
    assert_eq!((left.len(), left[0].revoked_at), (1, None));
}

on_each_backend!(
    the_token_rules_refuse_a_tokens_caller_whatever_the_route,
    a_token_is_shown_once_kept_as_its_hash_and_acts_as_its_person,
    a_token_that_does_not_authenticate_says_why_and_changes_nothing,
    a_token_outside_its_scope_changes_nothing,
    making_a_token_refuses_what_it_must,
    a_token_is_judged_alone_and_never_above_its_persons_roles,
    the_account_page_makes_shows_once_and_revokes,
    a_tokens_last_use_is_noted_without_a_write_per_call,
);
