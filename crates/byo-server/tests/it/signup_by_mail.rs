//! Issue #36 (8): an address is confirmed by mail before an account is made with it, on
//! both backends, over a real SMTP server (Debian's aiosmtpd on loopback). Sign-up answers
//! alike for a new address and a taken one, and each gets a mail: a link for the new one,
//! a note for the taken one's owner. The account exists only once the link is followed with
//! the password chosen at sign-up — so a stranger's sign-up with someone's address never
//! becomes an account, and sign-in before confirming reads like any wrong password.

use axum::http::{Method, StatusCode};
use byo_db::Backend;
use byo_server::Config;
use byo_server::app::jobs::{JobDriver, Tick, registry};
use byo_server::providers::notify::NoticesConfig;
use serde_json::json;

use crate::support::smtp::Smtp;
use crate::support::{self, PASSWORD, TestApp};

macro_rules! on_each_backend_mailing {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(byo_db::Backend::Sqlite).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                super::$name(byo_db::Backend::Postgres).await
            }
        }
    )*};
}

on_each_backend_mailing!(
    a36_8_an_address_is_confirmed_by_mail_before_its_account_exists,
    a36_8_without_mail_sign_up_is_refused_and_writes_nothing,
    a36_8_a_mail_that_cannot_go_is_said_and_a_link_too_old_makes_nothing,
);

/// Sign-up as everywhere but `byo up`: confirmed by mail, over `smtp`.
fn mailing_config(smtp: Option<&Smtp>) -> Config {
    let mut config = support::test_config();
    config.signup_without_mail = false;
    if let Some(smtp) = smtp {
        config.notices = NoticesConfig {
            smtp_url: Some(format!("smtp://127.0.0.1:{}", smtp.port).into()),
            from: "byo <noreply@example.com>".to_owned(),
            ..NoticesConfig::default()
        };
    }
    config
}

/// The link a mail holds, if it holds one.
fn link_in(mail: &str) -> Option<String> {
    let at = mail.find("http://localhost:8080/signup/confirm?token=")?;
    Some(mail[at..].split_whitespace().next().unwrap().to_owned())
}

fn token_of(link: &str) -> String {
    link.rsplit_once("token=").unwrap().1.to_owned()
}

async fn confirm(app: &TestApp, token: &str, password: &str) -> support::Reply {
    app.request(
        Method::POST,
        "/api/auth/signup/confirm",
        None,
        Some(json!({"token": token, "password": password})),
    )
    .await
}

async fn a36_8_an_address_is_confirmed_by_mail_before_its_account_exists(backend: Backend) {
    let Some(smtp) = Smtp::start() else { return };
    let Some(app) = TestApp::with_config(backend, mailing_config(Some(&smtp))).await else {
        return;
    };
    let db = &app.db;
    let (taken_sub, _) = app.user_with("taken@example.com", &[]).await;
    let taken_hash = db.user(&taken_sub).await.unwrap().unwrap().password_hash;

    // A new address and a taken one: one answer, no session, and no account made.
    let new = app.sign_up(" Ana@Example.com ", PASSWORD, "Ana").await;
    assert_eq!(new.status, StatusCode::ACCEPTED, "{}", new.text());
    assert!(new.text().contains("Check your mail"), "{}", new.text());
    assert!(new.session_cookie().is_none());
    let taken = app
        .sign_up("taken@example.com", "a different long passphrase", "Other")
        .await;
    assert_eq!(new.as_seen(), taken.as_seen(), "headers included");
    assert!(db.user_by_email("ana@example.com").await.unwrap().is_none());
    assert_eq!(db.signups_waiting("ana@example.com").await.unwrap(), 1);
    assert_eq!(db.signups_waiting("taken@example.com").await.unwrap(), 0);
    let taken_now = db.user(&taken_sub).await.unwrap().unwrap();
    assert_eq!(
        taken_now.password_hash, taken_hash,
        "the taken account is untouched"
    );

    // Each address got its own mail: a link to the new one, a note (no link) to the taken.
    let mails = smtp.read();
    assert_eq!(mails.len(), 2, "{mails:?}");
    assert!(mails[0].contains("To: ana@example.com"), "{}", mails[0]);
    let link = link_in(&mails[0]).unwrap_or_else(|| panic!("no link: {}", mails[0]));
    assert!(link.contains("token=byo_cnf_"), "{link}");
    assert!(mails[1].contains("To: taken@example.com"), "{}", mails[1]);
    assert!(mails[1].contains("already has one"), "{}", mails[1]);
    assert!(!mails[1].contains("byo_cnf_"), "{}", mails[1]);
    // Only the token's hash is kept: the database never holds the link.
    let token = token_of(&link);
    let dump = db.dump_text().await.unwrap();
    assert!(
        !dump.iter().any(|v| v.value.contains(&token)),
        "the plain token is stored"
    );

    // Before confirming, sign-in reads like a wrong password, and says what to do.
    let early = app.sign_in("ana@example.com", PASSWORD).await;
    let wrong = app
        .sign_in("taken@example.com", "not the password at all")
        .await;
    assert_eq!(early.status, StatusCode::UNAUTHORIZED);
    assert_eq!(early.as_seen(), wrong.as_seen());
    assert!(
        early.text().contains("follow the link mailed to you"),
        "{}",
        early.text()
    );

    // A stranger signs up with Ana's address and their own password: Ana gets that link
    // too, and following it with her password makes nothing.
    let stranger = app
        .sign_up(
            "ana@example.com",
            "the stranger's own passphrase",
            "Mallory",
        )
        .await;
    assert_eq!(stranger.status, StatusCode::ACCEPTED);
    let strangers_link = link_in(&smtp.read()[2]).unwrap();
    let refused = confirm(&app, &token_of(&strangers_link), PASSWORD).await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{}",
        refused.text()
    );
    assert_eq!(refused.json()["error"], "wrong_password");
    assert!(db.user_by_email("ana@example.com").await.unwrap().is_none());
    assert_eq!(db.signups_waiting("ana@example.com").await.unwrap(), 2);

    // Opening the link changes nothing (a mail scanner follows links); the page asks for
    // the password and carries the token.
    let path = link.strip_prefix("http://localhost:8080").unwrap();
    let page = app.get(path, None).await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.text());
    assert!(
        page.text()
            .contains(&format!("value=\"{}\"", token_of(&link)))
    );
    assert!(db.user_by_email("ana@example.com").await.unwrap().is_none());

    // Her own link with her password: the account, signed in, and every waiting sign-up of
    // the address forgotten.
    let made = confirm(&app, &token_of(&link), PASSWORD).await;
    assert_eq!(made.status, StatusCode::OK, "{}", made.text());
    assert_eq!(made.json()["email"], "ana@example.com");
    assert_eq!(made.json()["display_name"], "Ana");
    let session = made.session_cookie().expect("signed in");
    assert_eq!(
        app.get("/api/me", Some(&session)).await.status,
        StatusCode::OK
    );
    assert_eq!(db.signups_waiting("ana@example.com").await.unwrap(), 0);
    let ana = db.user_by_email("ana@example.com").await.unwrap().unwrap();
    let audit = db.audit_log(50).await.unwrap();
    assert!(
        audit
            .iter()
            .any(|a| a.action == "user.signup" && a.target.as_deref() == Some(&ana.sub)),
        "{audit:?}"
    );

    // Neither link makes anything again; she signs in as anyone does.
    for used in [&link, &strangers_link] {
        let again = confirm(&app, &token_of(used), PASSWORD).await;
        assert_eq!(again.status, StatusCode::BAD_REQUEST);
        assert_eq!(again.json()["error"], "link_expired");
    }
    assert_eq!(
        app.sign_in("ana@example.com", PASSWORD).await.status,
        StatusCode::OK
    );

    // The pages do the same: sign up, the mailed link's form, signed in.
    let page = app
        .send(form_post(
            "/signup",
            &[("email", "bo@example.com"), ("password", PASSWORD)],
        ))
        .await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text().contains("Check your mail"), "{}", page.text());
    let bo_link = link_in(smtp.read().last().unwrap()).unwrap();
    let done = app
        .send(form_post(
            "/signup/confirm",
            &[("token", &token_of(&bo_link)), ("password", PASSWORD)],
        ))
        .await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.text());
    assert!(done.session_cookie().is_some());
    assert!(db.user_by_email("bo@example.com").await.unwrap().is_some());
}

fn form_post(path: &str, pairs: &[(&str, &str)]) -> axum::http::Request<axum::body::Body> {
    axum::http::Request::post(path)
        .header(
            axum::http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .body(axum::body::Body::from(support::form_encode(pairs)))
        .unwrap()
}

async fn a36_8_without_mail_sign_up_is_refused_and_writes_nothing(backend: Backend) {
    let Some(app) = TestApp::with_config(backend, mailing_config(None)).await else {
        return;
    };
    let dump = || async {
        let values = app.db.dump_text().await.unwrap();
        values
            .into_iter()
            .map(|v| (v.table, v.column, v.value))
            .collect::<Vec<_>>()
    };
    let before = dump().await;
    let refused = app.sign_up("ana@example.com", PASSWORD, "Ana").await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.text()
    );
    assert_eq!(refused.json()["error"], "signup_needs_mail");
    assert!(refused.text().contains("smtp_url"), "{}", refused.text());
    let page = app.get("/signup", None).await;
    assert_eq!(page.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(page.text().contains("ask its operator"), "{}", page.text());
    assert_eq!(dump().await, before, "nothing written");
}

async fn a36_8_a_mail_that_cannot_go_is_said_and_a_link_too_old_makes_nothing(backend: Backend) {
    let Some(smtp) = Smtp::start() else { return };
    let clock = byo_server::clock::Clock::manual(chrono::Utc::now());
    let Some(db) = byo_db::testing::fresh(backend).await else {
        return;
    };
    let state = byo_server::AppState::new(db.store.clone(), mailing_config(Some(&smtp)))
        .with_clock(clock.clone());
    let router = byo_server::router(state.clone());
    let app = TestApp { db, state, router };

    // The mail server refusing for now: said, and nothing to follow.
    smtp.refuse(true);
    let later = app.sign_up("ana@example.com", PASSWORD, "").await;
    assert_eq!(
        later.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        later.text()
    );
    assert_eq!(later.json()["error"], "mail_unavailable");
    smtp.refuse(false);
    // A mailbox that does not exist (the sink refuses nobody@ for good).
    let refused = app.sign_up("nobody@example.com", PASSWORD, "").await;
    assert_eq!(
        refused.status,
        StatusCode::BAD_REQUEST,
        "{}",
        refused.text()
    );
    assert_eq!(refused.json()["error"], "mail_refused");
    assert!(smtp.read().is_empty());

    // A link a day and a second old makes nothing, and the reap job forgets it.
    assert_eq!(
        app.sign_up("ana@example.com", PASSWORD, "").await.status,
        StatusCode::ACCEPTED
    );
    let link = link_in(&smtp.read()[0]).unwrap();
    clock.advance(chrono::TimeDelta::hours(24) + chrono::TimeDelta::seconds(1));
    let old = confirm(&app, &token_of(&link), PASSWORD).await;
    assert_eq!(old.status, StatusCode::BAD_REQUEST, "{}", old.text());
    assert_eq!(old.json()["error"], "link_expired");
    assert!(
        app.db
            .user_by_email("ana@example.com")
            .await
            .unwrap()
            .is_none()
    );
    assert!(app.db.signups_waiting("ana@example.com").await.unwrap() >= 1);
    let jobs = JobDriver::new(app.state.clone(), registry());
    assert_eq!(
        jobs.tick("reap").await.unwrap(),
        Some(Tick::Ran { ok: true })
    );
    assert_eq!(app.db.signups_waiting("ana@example.com").await.unwrap(), 0);
}
