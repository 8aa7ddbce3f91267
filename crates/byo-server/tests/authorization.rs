//! Who may call what: for every API route (read from the generated OpenAPI document, so a
//! new route cannot be missed) and every page, which of anonymous / customer / owner /
//! community host / operator / superadmin may call it. Allowed means the gate let the
//! caller through (not 401/403); denied means 401 for anonymous and 403 for the rest.

mod support;

use std::collections::BTreeSet;

use axum::http::{Method, StatusCode, header};
use byo_wire::Role;
use serde_json::{Value, json};
use support::{PASSWORD, TestApp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Actor {
    Anonymous,
    Customer,
    Owner,
    CommunityHost,
    Operator,
    Superadmin,
}

use Actor::*;

const EVERYONE: &[Actor] = &[
    Anonymous,
    Customer,
    Owner,
    CommunityHost,
    Operator,
    Superadmin,
];
const SIGNED_IN: &[Actor] = &[Customer, Owner, CommunityHost, Operator, Superadmin];
const OPERATORS: &[Actor] = &[Operator, Superadmin];
const SUPERADMIN: &[Actor] = &[Superadmin];
/// Adding a GPU: an owner granted community_host, or a superadmin (A note 4).
const HOSTERS: &[Actor] = &[CommunityHost, Superadmin];

/// Routes authenticated by a token, not a session: a session grants nothing there, so every
/// actor without the token gets the same answer.
fn token_table() -> Vec<Row> {
    vec![
        Row {
            method: Method::POST,
            path: "/api/enroll",
            allowed: &[],
            body: |_| Some(json!({"node_index": 0})),
        },
        Row {
            method: Method::POST,
            path: "/api/host/report",
            allowed: &[],
            body: |_| Some(json!({"node": 0})),
        },
    ]
}

struct Row {
    method: Method,
    path: &'static str,
    allowed: &'static [Actor],
    body: fn(n: usize) -> Option<Value>,
}

fn none(_: usize) -> Option<Value> {
    None
}

/// Every API route. The test fails if the OpenAPI document lists one not here.
fn api_table() -> Vec<Row> {
    vec![
        Row {
            method: Method::GET,
            path: "/healthz",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/api/auth/signup",
            allowed: EVERYONE,
            body: |n| Some(json!({"email": format!("new{n}@example.com"), "password": PASSWORD})),
        },
        Row {
            method: Method::POST,
            path: "/api/auth/login",
            allowed: EVERYONE,
            body: |_| Some(json!({"email": "login@example.com", "password": PASSWORD})),
        },
        Row {
            method: Method::POST,
            path: "/api/auth/logout",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/api/me",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::PUT,
            path: "/api/me/password",
            allowed: SIGNED_IN,
            body: |_| {
                Some(
                    json!({"current_password": PASSWORD, "new_password": "a different long password"}),
                )
            },
        },
        Row {
            method: Method::GET,
            path: "/api/admin/users",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::PUT,
            path: "/api/admin/users/{sub}/roles/{role}",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::DELETE,
            path: "/api/admin/users/{sub}/roles/{role}",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/api/admin/audit",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/api/hosts",
            allowed: HOSTERS,
            body: |_| Some(json!({"profile_id": "gb10-spark-1"})),
        },
        Row {
            method: Method::POST,
            path: "/api/admin/hosts/{host_id}/activate",
            allowed: OPERATORS,
            body: |_| Some(json!({"placement": "shared"})),
        },
        Row {
            method: Method::POST,
            path: "/api/admin/enrollments/{enrollment_id}/revoke",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/api/admin/operator-keys",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/api/admin/operator-keys/changes",
            allowed: OPERATORS,
            body: |_| Some(json!({"action": "remove", "fingerprint": "SHA256:none"})),
        },
        Row {
            method: Method::DELETE,
            path: "/api/admin/operator-keys/draft",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/api/admin/operator-keys/{version}/signatures",
            allowed: SUPERADMIN,
            body: |_| Some(json!({"signature": "-----BEGIN SSH SIGNATURE-----"})),
        },
        Row {
            method: Method::POST,
            path: "/api/admin/operator-keys/hosts/{host_id}/send",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/api/admin/operator-keys/owner?fingerprint=SHA256:x",
            allowed: OPERATORS,
            body: none,
        },
    ]
}

/// Pages: a page denies anonymous callers by sending them to /login.
fn page_table() -> Vec<Row> {
    vec![
        Row {
            method: Method::GET,
            path: "/openapi.json",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/login",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/signup",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/assets/style.css",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/users",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/users/{sub}/roles/{role}/grant",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/users/{sub}/roles/{role}/revoke",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/hosts",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/install.sh",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/hosts",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/enrollments/{enrollment_id}/revoke",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/operator-keys",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/operator-keys/withdraw",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/operator-keys/hosts/{host_id}/send",
            allowed: OPERATORS,
            body: none,
        },
    ]
}

struct Actors {
    subs: Vec<(Actor, String)>,
    target: String,
}

async fn actors(app: &TestApp) -> Actors {
    let mut subs = Vec::new();
    for (actor, email, roles) in [
        (Customer, "customer@example.com", &[][..]),
        (Owner, "owner@example.com", &[][..]),
        (
            CommunityHost,
            "host@example.com",
            &[Role::CommunityHost][..],
        ),
        (Operator, "operator@example.com", &[Role::Operator][..]),
        (
            Superadmin,
            "superadmin@example.com",
            &[Role::Superadmin][..],
        ),
    ] {
        let (sub, _) = app.user_with(email, roles).await;
        subs.push((actor, sub));
    }
    let owner = &subs.iter().find(|(a, _)| *a == Owner).unwrap().1;
    app.give_host(owner, "spark-1").await;
    app.user_with("login@example.com", &[]).await;
    let (target, _) = app.user_with("target@example.com", &[]).await;
    Actors { subs, target }
}

async fn check(app: &TestApp, actors: &Actors, rows: &[Row], page: bool) {
    let mut n = 0;
    let mut failures = Vec::new();
    for row in rows {
        let path = row
            .path
            .replace("{sub}", &actors.target)
            .replace("{role}", "community_host")
            .replace("{version}", "1")
            .replace("{host_id}", "no-such-host")
            .replace("{enrollment_id}", "no-such-enrollment");
        for actor in EVERYONE {
            n += 1;
            let session = match actors.subs.iter().find(|(a, _)| a == actor) {
                Some((_, sub)) => Some(app.session_for(sub).await),
                None => None,
            };
            let reply = app
                .request(row.method.clone(), &path, session.as_deref(), (row.body)(n))
                .await;
            let allowed = row.allowed.contains(actor);
            let ok = match (allowed, *actor, page) {
                (true, _, _) => {
                    let gated = matches!(
                        reply.status,
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                    );
                    let sent_to_login = reply
                        .headers
                        .get(header::LOCATION)
                        .is_some_and(|l| l == "/login");
                    let denied_by_page = page && sent_to_login;
                    !(gated || denied_by_page)
                }
                (false, Anonymous, false) => reply.status == StatusCode::UNAUTHORIZED,
                (false, Anonymous, true) => {
                    reply.status.is_redirection()
                        && reply
                            .headers
                            .get(header::LOCATION)
                            .is_some_and(|l| l == "/login")
                }
                (false, _, _) => reply.status == StatusCode::FORBIDDEN,
            };
            if !ok {
                failures.push(format!(
                    "{} {} as {actor:?}: expected {}, got {} {}",
                    row.method,
                    row.path,
                    if allowed { "allowed" } else { "denied" },
                    reply.status,
                    reply.text()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "authorisation table violated:\n{}",
        failures.join("\n")
    );
}

async fn every_api_route_has_an_authorisation_row(app: TestApp) {
    let doc = app.get("/openapi.json", None).await.json();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let tabled: BTreeSet<_> = api_table()
        .iter()
        .chain(token_table().iter())
        .map(|r| {
            (
                r.method.to_string(),
                r.path.split('?').next().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        documented, tabled,
        "the OpenAPI document and the authorisation table disagree"
    );
}

async fn api_routes_admit_exactly_the_roles_in_the_table(app: TestApp) {
    let actors = actors(&app).await;
    check(&app, &actors, &api_table(), false).await;
}

async fn pages_admit_exactly_the_roles_in_the_table(app: TestApp) {
    let actors = actors(&app).await;
    check(&app, &actors, &page_table(), true).await;
}

async fn token_routes_give_every_session_the_same_answer(app: TestApp) {
    let actors = actors(&app).await;
    for row in token_table() {
        let mut answers = BTreeSet::new();
        for actor in EVERYONE {
            let session = match actors.subs.iter().find(|(a, _)| a == actor) {
                Some((_, sub)) => Some(app.session_for(sub).await),
                None => None,
            };
            let reply = app
                .request(
                    row.method.clone(),
                    row.path,
                    session.as_deref(),
                    (row.body)(0),
                )
                .await;
            assert_eq!(
                reply.status,
                StatusCode::UNAUTHORIZED,
                "{} as {actor:?}",
                row.path
            );
            answers.insert(reply.body);
        }
        assert_eq!(answers.len(), 1, "{}: one answer whoever asks", row.path);
    }
}

async fn operators_cannot_grant_operator_or_superadmin(app: TestApp) {
    let actors = actors(&app).await;
    let op = &actors.subs.iter().find(|(a, _)| *a == Operator).unwrap().1;
    let session = app.session_for(op).await;
    for role in ["operator", "superadmin"] {
        let path = format!("/api/admin/users/{}/roles/{role}", actors.target);
        let reply = app.request(Method::PUT, &path, Some(&session), None).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{role}");
    }
    assert!(
        app.db.roles_of(&actors.target).await.unwrap().is_empty(),
        "nothing was granted"
    );

    let sa = &actors
        .subs
        .iter()
        .find(|(a, _)| *a == Superadmin)
        .unwrap()
        .1;
    let session = app.session_for(sa).await;
    let path = format!("/api/admin/users/{}/roles/operator", actors.target);
    let reply = app.request(Method::PUT, &path, Some(&session), None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["roles"], json!(["operator"]));
}

on_each_backend!(
    every_api_route_has_an_authorisation_row,
    api_routes_admit_exactly_the_roles_in_the_table,
    pages_admit_exactly_the_roles_in_the_table,
    operators_cannot_grant_operator_or_superadmin,
    token_routes_give_every_session_the_same_answer,
);
