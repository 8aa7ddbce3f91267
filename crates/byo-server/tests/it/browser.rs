//! The onboarding pages in a real browser: Chromium, headless with the flags of DESIGN.md §3,
//! driven through chromedriver, against the app served on loopback over SQLite. What the
//! server-rendered tests cannot see is checked here: the script loads and does its work (the
//! copy button, the one-liner's countdown, progress that changes while the page is open), and
//! the operator's clicks land. Every check is on the page's text or on database rows.
//!
//! Chromium and chromedriver come from apt (`chromium chromium-driver`); `scripts/test`
//! installs them. Without them these tests skip loudly, and under `CI=true` they fail.

#[path = "support/browser.rs"]
mod chromium;
use crate::support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::Html;
use axum::routing::get;
use byo_core::keylist_testing::public_key_line;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_server::agents::HostAgents;
use byo_wire::Role;
use chromium::{Browser, components};
use fantoccini::{Client, Locator};
use serde_json::{Value, json};
use support::agents::FakeAgents;
use support::{PASSWORD, Reply, TestApp};

/// How long a live part may take to show a change: one poll (2 s) plus slack for a busy
/// two-core machine.
const LIVE: Duration = Duration::from_secs(8);

/// The app served on loopback (its public URL is that address, so the browser's Origin is
/// the app's own) and a browser pointed at it.
struct Site {
    app: TestApp,
    base: String,
    browser: Browser,
}

/// The countdown's end, which a real one-liner reaches only after an hour: the production
/// script on a page whose expiry is two seconds after the server's now.
async fn countdown_fixture() -> Html<String> {
    let now = chrono::Utc::now();
    let expires = now + chrono::Duration::seconds(2);
    let at =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    Html(format!(
        r#"<!DOCTYPE html><html lang="en"><head><title>countdown</title>
<script src="/assets/app.js" defer></script></head><body>
<section data-expires-scope>
<p>Until <time datetime="{}" data-now="{}" data-countdown="left">then</time> <strong id="left"></strong></p>
<pre><code id="cmd">curl</code></pre><button type="button" data-copy="cmd" hidden>Copy</button>
</section></body></html>"#,
        at(expires),
        at(now)
    ))
}

async fn site() -> Option<Site> {
    site_with(None).await
}

/// The site, with the hosts' agents replaced when `agents` is given.
async fn site_with(agents: Option<Arc<dyn HostAgents>>) -> Option<Site> {
    let (chromium, chromedriver) = components()?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let mut config = support::test_config();
    config.public_url = base.clone();
    let mut app = TestApp::with_config(byo_db::Backend::Sqlite, config).await?;
    app.publish_operator_keys().await;
    if let Some(agents) = agents {
        app.state = app.state.clone().with_agents(agents);
        app.router = byo_server::router(app.state.clone());
    }
    let router = app
        .router
        .clone()
        .route("/test/countdown", get(countdown_fixture));
    tokio::spawn(async move { axum::serve(listener, router).await });
    let browser = Browser::start(chromium, chromedriver).await;
    Some(Site { app, base, browser })
}

impl Site {
    fn c(&self) -> &Client {
        &self.browser.client
    }

    async fn goto(&self, path: &str) {
        self.c()
            .goto(&format!("{}{path}", self.base))
            .await
            .unwrap();
    }

    async fn sign_in(&self, email: &str) {
        self.goto("/login").await;
        let c = self.c();
        c.find(Locator::Css("input[name=email]"))
            .await
            .unwrap()
            .send_keys(email)
            .await
            .unwrap();
        c.find(Locator::Css("input[name=password]"))
            .await
            .unwrap()
            .send_keys(PASSWORD)
            .await
            .unwrap();
        c.find(Locator::Css("form[action='/login'] button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        self.wait_text(".who", |t| t == email, "signed in").await;
    }

    async fn text(&self, css: &str) -> Option<String> {
        self.browser.text(css).await
    }

    /// Wait until the element's text satisfies `ok`; the page is never reloaded meanwhile.
    async fn wait_text(&self, css: &str, ok: impl Fn(&str) -> bool, what: &str) -> String {
        let deadline = Instant::now() + LIVE;
        loop {
            let text = self.text(css).await;
            if let Some(t) = &text
                && ok(t)
            {
                return t.clone();
            }
            if Instant::now() > deadline {
                let url = self.c().current_url().await.map(|u| u.to_string());
                let body = self.text("body").await;
                panic!("{what}: {css} shows {text:?} at {url:?}; the page reads:\n{body:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn enroll(&self, token: &str, body: Value) -> Reply {
        self.app
            .send(
                Request::post("/api/enroll")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await
    }

    /// The agent's report (host-report), with the host token enrolment handed out.
    async fn report(&self, host_token: &str, body: Value) {
        let r = self
            .app
            .send(
                Request::post("/api/host/report")
                    .header(header::AUTHORIZATION, format!("Bearer {host_token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    }

    /// The host's agent beats (step 133), as serving does as soon as it starts: placement
    /// picks only hosts it has heard from.
    async fn heartbeat(&self, host_token: &str) {
        let body = json!({"agent_version": "0.1.0", "lxd": "ok", "relay": "ok",
            "tunnel": "not_configured", "gpu": "not_configured", "storage": "ok",
            "instances": 0, "vms": []});
        let r = self
            .app
            .send(
                Request::post("/api/host/heartbeat")
                    .header(header::AUTHORIZATION, format!("Bearer {host_token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    }

    /// Mark the open document; `still_same_document` proves no reload replaced it.
    async fn mark_document(&self) {
        self.c()
            .execute("window.byoSameDocument = true;", vec![])
            .await
            .unwrap();
    }

    async fn still_same_document(&self) -> bool {
        self.c()
            .execute("return window.byoSameDocument === true;", vec![])
            .await
            .unwrap()
            == json!(true)
    }

    /// One host of `owner`'s onboarded as an owner's would be — added, enrolled, prepared,
    /// beating — and activated by `op`: its id and slug.
    async fn active_host(
        &self,
        owner: &support::User,
        op: &support::User,
        hw: &str,
    ) -> (String, String) {
        let p = owner
            .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
            .await;
        assert_eq!(p.status, StatusCode::CREATED, "{}", p.text());
        let p = p.json();
        let host_id = p["host_id"].as_str().unwrap().to_owned();
        let slug = p["slug"].as_str().unwrap().to_owned();
        let e = self.enroll(p["token"].as_str().unwrap(), spark(hw)).await;
        assert_eq!(e.status, StatusCode::OK, "{}", e.text());
        let host_token = e.json()["host_token"].as_str().unwrap().to_owned();
        self.report(
            &host_token,
            json!({"node": 0, "state": step("self-check", "satisfied", None, true), "completed": true}),
        )
        .await;
        self.heartbeat(&host_token).await;
        self.app.path_walked(&host_id).await;
        activate(op, &host_id).await;
        (host_id, slug)
    }

    async fn close(self) {
        self.browser.client.close().await.unwrap();
    }
}

fn step(name: &str, state: &str, error: Option<&str>, is_final: bool) -> Value {
    json!({"step": name, "state": state, "attempt": 1, "error": error, "final": is_final,
           "at": "2026-11-29T12:05:00Z"})
}

/// A single Spark as it reports itself at step 126.
fn spark(hardware_id: &str) -> Value {
    json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": format!("m-{hardware_id}"), "hardware_id": hardware_id, "node_index": 0,
        "rails": []
    })
}

/// "expires in mm:ss" as seconds.
fn seconds_left(text: &str) -> u32 {
    let rest = text
        .strip_prefix("expires in ")
        .unwrap_or_else(|| panic!("not a countdown: {text:?}"));
    let (m, s) = rest.split_once(':').unwrap();
    assert_eq!((m.len(), s.len()), (2, 2), "mm:ss: {text:?}");
    m.parse::<u32>().unwrap() * 60 + s.parse::<u32>().unwrap()
}

/// A: an owner granted community_host adds a GPU and gets the one-liner, with a copy button
/// that works and a countdown to the token's expiry that runs (and ends in "add it again").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_an_owner_adds_a_gpu_and_gets_the_one_liner_with_copy_and_countdown() {
    let Some(site) = site().await else { return };
    let (owner_sub, _) = site
        .app
        .user_with("owner@example.com", &[Role::CommunityHost])
        .await;
    site.sign_in("owner@example.com").await;
    site.goto("/hosts").await;
    let c = site.c();
    c.find(Locator::Css("select[name=profile_id]"))
        .await
        .unwrap()
        .select_by_value("gb10-spark-1")
        .await
        .unwrap();
    c.find(Locator::Css("form[action='/hosts'] button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    // The one-liner: the install command from this server, with a token only this
    // enrolment's hash matches.
    let command = site
        .wait_text("#one-liner", |t| !t.is_empty(), "the one-liner")
        .await;
    let prefix = format!(
        "curl -fsSL {}/install.sh | sudo bash -s -- --token ",
        site.base
    );
    let token = command
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{command:?} is not the install command"));
    let parsed = SecretToken::parse(TokenKind::Enrollment, token).expect("an enrolment token");
    let dump = site.app.db.dump_text().await.unwrap();
    assert!(
        dump.iter().any(|v| v.value == parsed.hash().as_str()),
        "the token shown is the one whose hash was stored"
    );
    let enrollments = site
        .app
        .db
        .enrollment_views(Some(&owner_sub))
        .await
        .unwrap();
    assert_eq!(enrollments.len(), 1);
    assert_eq!(
        enrollments[0].state,
        byo_wire::states::EnrollmentState::Pending
    );

    // The absolute expiry, readable without the script, is the stored one.
    let expiry = c.find(Locator::Css("time#one-liner-expiry")).await.unwrap();
    let datetime = expiry.attr("datetime").await.unwrap().unwrap();
    let shown = datetime.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    assert!(
        (shown - enrollments[0].token_expires_at).abs() < chrono::Duration::milliseconds(1),
        "{datetime} is the stored expiry {}",
        enrollments[0].token_expires_at
    );
    assert!(expiry.text().await.unwrap().ends_with(" UTC"));

    // The copy button is the script's (hidden without it) and hands the clipboard exactly
    // the command; the clipboard API is watched, not replaced.
    let copy = c.find(Locator::Css("#copy-one-liner")).await.unwrap();
    assert!(copy.is_displayed().await.unwrap(), "the script showed it");
    assert_eq!(copy.text().await.unwrap(), "Copy");
    site.browser.watch_copies().await;
    copy.click().await.unwrap();
    site.wait_text("#copy-one-liner", |t| t == "Copied", "copy")
        .await;
    assert_eq!(
        site.browser.copied().await.as_deref(),
        Some(command.as_str())
    );

    // The countdown runs: within the hour, and lower a second and a half later.
    let first = site
        .wait_text(
            "#one-liner-countdown",
            |t| t.starts_with("expires in "),
            "countdown",
        )
        .await;
    let first_left = seconds_left(&first);
    assert!(
        (3540..=3600).contains(&first_left),
        "{first:?}: about an hour"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let later = site.text("#one-liner-countdown").await.unwrap();
    let later_left = seconds_left(&later);
    assert!(
        later != first && (1..=3).contains(&(first_left - later_left)),
        "{first:?} then {later:?}"
    );

    // Issue #42, 8: once the machine ran it (the enrolment redeemed), the one-liner is used:
    // the countdown stops and says so, and the copy button no longer offers it.
    let e = site.enroll(token, spark("hw-used")).await;
    assert_eq!(e.status, StatusCode::OK, "{}", e.text());
    site.wait_text(
        "#one-liner-countdown",
        |t| t == "used: your machine enrolled — its progress is below",
        "the one-liner used",
    )
    .await;
    let copy = c.find(Locator::Css("#copy-one-liner")).await.unwrap();
    assert!(
        !copy.is_enabled().await.unwrap(),
        "a used command is not offered"
    );

    // At zero it says so, and the copy button stops offering a dead command.
    site.goto("/test/countdown").await;
    site.wait_text(
        "#left",
        |t| t.starts_with("expires in 00:0"),
        "a short countdown",
    )
    .await;
    site.wait_text(
        "#left",
        |t| t == "expired — add the GPU again",
        "the countdown's end",
    )
    .await;
    let copy = c.find(Locator::Css("button[data-copy]")).await.unwrap();
    assert!(!copy.is_enabled().await.unwrap(), "nothing left to copy");
    site.close().await;
}

/// D: an operator grants community_host on /admin/users, activates the host whose
/// preparation completed (through the real host-report) and sees it active; activation of a
/// host that did not finish is refused with the reason on the page, and it stays inactive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_an_operator_grants_community_host_and_activates_only_a_prepared_host() {
    let Some(site) = site().await else { return };
    site.app
        .user_with("operator@example.com", &[Role::Operator])
        .await;
    let owner = site.app.customer("newowner@example.com").await;
    site.sign_in("operator@example.com").await;
    let c = site.c();

    // The grant, from the users page.
    site.goto("/admin/users").await;
    let row = "//tr[td[normalize-space()='newowner@example.com']]";
    c.find(Locator::XPath(&format!(
        "{row}//button[normalize-space()='Grant community_host']"
    )))
    .await
    .unwrap()
    .click()
    .await
    .unwrap();
    let deadline = Instant::now() + LIVE;
    loop {
        let grants = match c.find(Locator::XPath(&format!("{row}/td[3]"))).await {
            Ok(td) => td.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if grants.contains("community_host") {
            break;
        }
        assert!(Instant::now() < deadline, "the grant shows: {grants:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        site.app.db.roles_of(&owner.sub).await.unwrap(),
        vec![Role::CommunityHost]
    );

    // The newly granted owner adds two GPUs; both enrol; one finishes preparing.
    let mut hosts = Vec::new();
    for hw in ["hw-ready", "hw-half"] {
        let p = owner
            .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
            .await;
        assert_eq!(p.status, StatusCode::CREATED, "{}", p.text());
        let p = p.json();
        let e = site.enroll(p["token"].as_str().unwrap(), spark(hw)).await;
        assert_eq!(e.status, StatusCode::OK, "{}", e.text());
        hosts.push((
            p["host_id"].as_str().unwrap().to_owned(),
            p["slug"].as_str().unwrap().to_owned(),
            e.json()["host_token"].as_str().unwrap().to_owned(),
        ));
    }
    let (ready_id, ready_slug, ready_token) = &hosts[0];
    let (half_id, half_slug, half_token) = &hosts[1];
    site.report(
        ready_token,
        json!({"node": 0, "state": step("self-check", "satisfied", None, true), "completed": true}),
    )
    .await;
    site.report(
        half_token,
        json!({"node": 0, "state": step("lxd-install", "failed", Some("snap: exit 1"), true)}),
    )
    .await;

    // Activate is offered for the prepared host only.
    site.goto("/admin/hosts").await;
    let row_of = |slug: &str| format!("//tr[td[1][normalize-space()='{slug}']]");
    let activate_in =
        |slug: &str| format!("{}//button[normalize-space()='Activate']", row_of(slug));
    assert!(
        c.find_all(Locator::XPath(&activate_in(half_slug)))
            .await
            .unwrap()
            .is_empty(),
        "not offered before preparation finished"
    );
    site.heartbeat(ready_token).await;
    site.app.path_walked(ready_id).await;
    c.find(Locator::XPath(&activate_in(ready_slug)))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let ready_state = format!("{}/td[4]", row_of(ready_slug));
    let deadline = Instant::now() + LIVE;
    loop {
        let state = match c.find(Locator::XPath(&ready_state)).await {
            Ok(td) => td.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if state == "active: renting to customers" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the host shows as active: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let host = site.app.db.host(ready_id).await.unwrap().unwrap();
    assert!(host.active);
    assert_eq!(host.placement.as_deref(), Some("shared"));

    // The unprepared host's activation, sent as a stale or hand-made form would send it.
    c.execute(
        "const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0]; \
         const i = document.createElement('input'); i.type = 'hidden'; i.name = 'placement'; \
         i.value = 'shared'; f.appendChild(i); document.body.appendChild(f); f.submit();",
        vec![json!(format!("/admin/hosts/{half_id}/activate"))],
    )
    .await
    .unwrap();
    let refusal = site
        .wait_text(
            "p.error[role=alert]",
            |t| !t.is_empty(),
            "the refusal on the page",
        )
        .await;
    assert_eq!(
        refusal,
        "this host's preparation has not finished; it cannot be activated"
    );
    assert_eq!(
        site.text("h1").await.as_deref(),
        Some("Hosts and enrolments"),
        "the refusal is shown on the hosts page, not as a bare error"
    );
    let shown = c
        .find(Locator::XPath(&format!("{}/td[4]", row_of(half_slug))))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(shown, "preparing: lxd-install failed (snap: exit 1)");
    let host = site.app.db.host(half_id).await.unwrap().unwrap();
    assert!(!host.active && host.placement.is_none() && host.activated_at.is_none());
    site.close().await;
}

/// D: /admin/hosts at a 1280×800 window, with a prepared host, a rejected pair whose whole
/// request is stored, and an enrolment still waiting: every Activate and Revoke is inside the
/// window and nothing scrolls sideways — also with every stored request opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d_the_operators_hosts_page_keeps_every_action_on_screen_at_1280() {
    let Some(site) = site().await else { return };
    site.app
        .user_with("operator@example.com", &[Role::Operator])
        .await;
    let owner = site.app.community_host("owner@example.com").await;
    let provision = || async {
        let p = owner
            .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
            .await;
        assert_eq!(p.status, StatusCode::CREATED, "{}", p.text());
        p.json()
    };
    let ready = provision().await;
    let e = site
        .enroll(ready["token"].as_str().unwrap(), spark("hw-ready"))
        .await;
    assert_eq!(e.status, StatusCode::OK, "{}", e.text());
    site.report(
        e.json()["host_token"].as_str().unwrap(),
        json!({"node": 0, "state": step("self-check", "satisfied", None, true), "completed": true}),
    )
    .await;
    let mut x86_pair = support::pair_request();
    x86_pair["arch"] = json!("x86_64");
    let rejected = provision().await;
    let r = site
        .enroll(rejected["token"].as_str().unwrap(), x86_pair)
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    provision().await;

    site.sign_in("operator@example.com").await;
    let c = site.c();
    c.set_window_size(1280, 800).await.unwrap();
    site.goto("/admin/hosts").await;
    site.wait_text("h1", |t| t == "Hosts and enrolments", "the hosts page")
        .await;
    let measure = || async {
        c.execute(
            "const buttons = [...document.querySelectorAll('td.actions button')]; \
             const box = document.querySelector('table.hosts').closest('.scroll'); \
             return {width: window.innerWidth, scroll: document.documentElement.scrollWidth, \
               table: box.scrollWidth - box.clientWidth, \
               buttons: buttons.map(b => [b.textContent, b.getBoundingClientRect().right, \
                 b.getBoundingClientRect().right <= window.innerWidth])};",
            vec![],
        )
        .await
        .unwrap()
    };
    let check = |m: &Value, when: &str| {
        let width = m["width"].as_f64().unwrap();
        assert!(width <= 1280.0, "{when}: a 1280 px window: {m}");
        let buttons = m["buttons"].as_array().unwrap();
        let names: Vec<&str> = buttons.iter().map(|b| b[0].as_str().unwrap()).collect();
        assert!(
            names.contains(&"Activate") && names.contains(&"Revoke"),
            "{when}: {m}"
        );
        for b in buttons {
            assert_eq!(
                b[2],
                json!(true),
                "{when}: {} ends past the window: {m}",
                b[0]
            );
        }
        assert!(
            m["scroll"].as_f64().unwrap() <= width,
            "{when}: the page scrolls sideways: {m}"
        );
        // Nor the table inside its own scroller (the walk's sentence beside Activate once
        // pushed it past the window while every button stayed in view).
        assert!(
            m["table"].as_f64().unwrap() <= 0.0,
            "{when}: the table scrolls sideways: {m}"
        );
    };
    check(&measure().await, "as loaded");
    site.browser.screenshot("admin-hosts-1280.png").await;

    // The toggles open the stored requests; the actions stay where they were reachable.
    for d in c
        .find_all(Locator::Css("details.request summary"))
        .await
        .unwrap()
    {
        d.click().await.unwrap();
    }
    let open = c
        .execute(
            "return [...document.querySelectorAll('details.request')].every(d => d.open);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(open, json!(true));
    check(&measure().await, "with every request open");
    site.browser.screenshot("admin-hosts-1280-open.png").await;

    // The fleet at a glance (issue #38, 1) fits the same window, its nav wrapped, its table
    // inside the page.
    site.goto("/admin").await;
    site.wait_text("h1", |t| t == "The fleet", "the fleet page")
        .await;
    let fleet = c
        .execute(
            "return {width: window.innerWidth, scroll: document.documentElement.scrollWidth, \
               rows: document.querySelectorAll('table#fleet tbody tr').length};",
            vec![],
        )
        .await
        .unwrap();
    assert!(fleet["rows"].as_u64().unwrap() >= 1, "{fleet}");
    assert!(
        fleet["scroll"].as_f64().unwrap() <= fleet["width"].as_f64().unwrap(),
        "the fleet page scrolls sideways: {fleet}"
    );
    site.browser.screenshot("admin-fleet-1280.png").await;
    site.close().await;
}

/// C: the owner's page, left open, follows a pair's preparation as the host-reports land —
/// enrolment, node 0's steps, node 1's own track, completion and the operator's approval —
/// without a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_the_owners_page_follows_preparation_live() {
    let Some(site) = site().await else { return };
    site.app
        .user_with("owner@example.com", &[Role::CommunityHost])
        .await;
    let op = site.app.operator("op@example.com").await;
    site.sign_in("owner@example.com").await;
    site.goto("/hosts").await;
    let c = site.c();
    c.find(Locator::Css("select[name=profile_id]"))
        .await
        .unwrap()
        .select_by_value("gb10-spark-2")
        .await
        .unwrap();
    c.find(Locator::Css("form[action='/hosts'] button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let command = site
        .wait_text("#one-liner", |t| !t.is_empty(), "the one-liner")
        .await;
    let token = command
        .split("--token ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    let state = "[data-progress] .state";
    site.wait_text(
        state,
        |t| t.starts_with("waiting for the command"),
        "before the command ran",
    )
    .await;
    site.mark_document().await;

    // The box runs the one-liner.
    let enrolled = site.enroll(&token, support::pair_request()).await;
    assert_eq!(enrolled.status, StatusCode::OK, "{}", enrolled.text());
    let enrolled = enrolled.json();
    let host_token = enrolled["host_token"].as_str().unwrap();
    let host_id = site.app.db.agent_targets().await.unwrap()[0].id.clone();
    assert_eq!(site.app.db.host_nodes(&host_id).await.unwrap().len(), 2);
    site.wait_text(state, |t| t == "enrolled: preparing", "enrolled")
        .await;

    // Node 0's steps, then node 1's own track.
    site.report(
        host_token,
        json!({"node": 0, "state": step("lxd-install", "applied", None, false)}),
    )
    .await;
    site.wait_text(
        state,
        |t| t == "preparing: lxd-install applied",
        "node 0's step",
    )
    .await;
    site.report(
        host_token,
        json!({"node": 1, "state": step("firewall", "failed", Some("nft: exit 1"), false)}),
    )
    .await;
    let progress = site
        .wait_text(
            "[data-progress]",
            |t| t.contains("node 1: firewall failed (nft: exit 1)"),
            "node 1's step",
        )
        .await;
    // A first attempt is not counted aloud, and the time is a person's (issue #42, 8).
    assert!(
        progress.contains("node 0: lxd-install applied, 2026-11-29 12:05:00 UTC")
            && !progress.contains("attempt"),
        "{progress}"
    );
    site.report(
        host_token,
        json!({"node": 1, "state": step("firewall", "applied", None, false)}),
    )
    .await;
    site.wait_text(
        "[data-progress]",
        |t| t.contains("node 1: firewall applied"),
        "node 1 recovers",
    )
    .await;

    // Completion, then the operator's approval.
    site.report(
        host_token,
        json!({"node": 0, "state": step("self-check", "satisfied", None, true), "completed": true}),
    )
    .await;
    let progress = site
        .wait_text(
            "[data-progress]",
            |t| t.starts_with("prepared: waiting for an operator's approval"),
            "prepared",
        )
        .await;
    assert!(progress.contains("prepared at "), "{progress}");
    site.heartbeat(host_token).await;
    site.app.path_walked(&host_id).await;
    activate(&op, &host_id).await;
    site.wait_text(state, |t| t == "active: renting to customers", "active")
        .await;
    assert!(
        site.still_same_document().await,
        "every change arrived without a reload"
    );
    site.close().await;
}

/// E1 and G from the customer's page: a customer reaches their instances from the home
/// page, adds an SSH key, creates an instance on the one active prepared host (onboarded
/// through the API), sees and copies the exact ssh command, and deletes it through the
/// confirmation step. Every check is on the page's text and on the vms row: created_at as
/// shown, and deleted_at written when the host confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e1_g_a_customer_adds_a_key_creates_an_instance_sees_the_ssh_command_and_deletes_it() {
    // Hosts' agents that answer every call at once, and remember what they were asked.
    let agents = Arc::new(FakeAgents::new());
    let Some(site) = site_with(Some(agents.clone())).await else {
        return;
    };
    let owner = site.app.community_host("owner@example.com").await;
    let op = site.app.operator("operator@example.com").await;
    let (customer_sub, _) = site.app.user_with("customer@example.com", &[]).await;

    // One host, onboarded as an owner's would be: added, enrolled, prepared, activated.
    let (host_id, slug) = site.active_host(&owner, &op, "hw-e1").await;
    // Its relay is recorded by relay-provision, in the background.
    let deadline = Instant::now() + LIVE;
    while !site
        .app
        .db
        .pick_hosts_for_gpu(byo_db::vms::HostPick::new(
            "spark-1",
            &customer_sub,
            chrono::DateTime::UNIX_EPOCH,
            chrono::Utc::now(),
        ))
        .await
        .unwrap()
        .iter()
        .any(|h| h.id == host_id)
    {
        assert!(Instant::now() < deadline, "the host never became pickable");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // From the home page to the instances page.
    site.sign_in("customer@example.com").await;
    let c = site.c();
    c.find(Locator::Css("a#home-instances"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    site.wait_text("h1", |t| t == "Your instances", "the instances page")
        .await;
    assert!(site.text("#no-instances").await.is_some());
    assert!(site.text("#needs-key").await.is_some());

    // A key: a name and the contents of a .pub file.
    let line = format!("{} me@laptop", public_key_line());
    c.find(Locator::Css("form#add-key input[name=name]"))
        .await
        .unwrap()
        .send_keys("laptop")
        .await
        .unwrap();
    c.find(Locator::Css("form#add-key textarea[name=public_key]"))
        .await
        .unwrap()
        .send_keys(&line)
        .await
        .unwrap();
    c.find(Locator::Css("form#add-key button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    site.wait_text("#ssh-keys td.name", |t| t == "laptop", "the key listed")
        .await;
    let keys = site.app.db.ssh_keys_of(&customer_sub).await.unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(
        site.text("#ssh-keys td.fingerprint").await.as_deref(),
        Some(keys[0].fingerprint.as_str())
    );

    // Create: the GPU kind and the key.
    c.find(Locator::Css("form#create select[name=gpu_type]"))
        .await
        .unwrap()
        .select_by_value("spark-1")
        .await
        .unwrap();
    c.find(Locator::Css("form#create select[name=ssh_key_id]"))
        .await
        .unwrap()
        .select_by_value(&keys[0].id)
        .await
        .unwrap();
    c.find(Locator::Css("form#create button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    site.wait_text("#instances td.status", |t| t == "running", "running")
        .await;
    // Issue #42, 5: after the create the page says what happened at its top, with the
    // heading and navigation in view: no jump down to the row, which is marked instead.
    site.wait_text("#done", |t| t.contains(" is created."), "the create said")
        .await;
    let top = c
        .execute(
            "return [window.scrollY, document.querySelectorAll('#instances tr.done').length];",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(top, serde_json::json!([0, 1]), "scrolled, or no row marked");
    let epoch = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
    let rows = site.app.db.vms_of(&customer_sub, epoch).await.unwrap();
    assert_eq!(rows.len(), 1);
    let vm = rows[0].clone();
    assert_eq!(vm.host_id.as_deref(), Some(host_id.as_str()));
    assert_eq!(
        agents.log(),
        vec![("create", host_id.clone(), vm.name.clone())]
    );
    let instance = format!("#instance-{}", vm.id);

    // The exact command, and a copy button that hands over exactly it. The test site
    // publishes no DNS (local tunnels, as byo up), so the command that works here is the
    // relay's address; the instance's name is still minted under the host's zone.
    let hostname = vm.ssh_hostname.clone().unwrap();
    assert!(
        hostname.starts_with(&format!("{}.{slug}.ssh.", vm.name)),
        "{hostname}"
    );
    let relay = site
        .app
        .db
        .host(&host_id)
        .await
        .unwrap()
        .unwrap()
        .relay_ip
        .expect("the relay has an address");
    let command = format!("ssh -o HostKeyAlias=byo-{} root@{relay}", vm.id);
    assert_eq!(
        site.text(&format!("#ssh-{}", vm.id)).await.as_deref(),
        Some(command.as_str())
    );
    let copy = c
        .find(Locator::Css(&format!("button[data-copy='ssh-{}']", vm.id)))
        .await
        .unwrap();
    assert!(copy.is_displayed().await.unwrap(), "the script showed it");
    site.browser.watch_copies().await;
    copy.click().await.unwrap();
    site.wait_text(
        &format!("button[data-copy='ssh-{}']", vm.id),
        |t| t == "Copied",
        "copy",
    )
    .await;
    assert_eq!(
        site.browser.copied().await.as_deref(),
        Some(command.as_str())
    );

    // Created: the row's own created_at, readable and machine-readable.
    let created = c
        .find(Locator::Css(&format!("{instance} td.created time")))
        .await
        .unwrap();
    let shown = created.attr("datetime").await.unwrap().unwrap();
    let shown = shown.parse::<chrono::DateTime<chrono::Utc>>().unwrap();
    assert!(
        (shown - vm.created_at).abs() < chrono::Duration::milliseconds(1),
        "{shown} is the stored created_at {}",
        vm.created_at
    );
    // Shown as how long ago (issue #42, 2), the exact time on hover.
    assert_eq!(
        created.attr("title").await.unwrap().as_deref(),
        Some(
            vm.created_at
                .format("%Y-%m-%d %H:%M:%S UTC")
                .to_string()
                .as_str()
        )
    );
    let ago = created.text().await.unwrap();
    assert!(
        ago.ends_with(" s ago") || ago.ends_with(" min ago"),
        "{ago}"
    );
    assert_eq!(
        site.text(&format!("{instance} td.deleted"))
            .await
            .as_deref(),
        Some("—")
    );

    // Delete: the button asks first, and asking changes nothing.
    c.find(Locator::Css(&format!("{instance} a.button")))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let question = format!("Delete {}?", vm.name);
    site.wait_text("h1", |t| t == question, "the confirmation")
        .await;
    let row = site.app.db.vm(&vm.id).await.unwrap().unwrap();
    assert_eq!((row.delete_requested_at, row.deleted_at), (None, None));
    c.find(Locator::Css("form#confirm-delete button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    site.wait_text(
        &format!("{instance} td.status"),
        |t| t == "deleted",
        "deleted",
    )
    .await;
    let row = site.app.db.vm(&vm.id).await.unwrap().unwrap();
    let requested = row.delete_requested_at.expect("delete_requested_at");
    let deleted = row.deleted_at.expect("deleted_at: the host confirmed");
    assert!(vm.created_at <= requested && requested <= deleted);
    assert_eq!(
        (row.status.as_str(), row.created_at),
        ("deleted", vm.created_at)
    );
    let shown = c
        .find(Locator::Css(&format!("{instance} td.deleted time")))
        .await
        .unwrap()
        .attr("datetime")
        .await
        .unwrap()
        .unwrap()
        .parse::<chrono::DateTime<chrono::Utc>>()
        .unwrap();
    assert!((shown - deleted).abs() < chrono::Duration::milliseconds(1));
    assert!(
        c.find_all(Locator::Css(&format!("#ssh-{}", vm.id)))
            .await
            .unwrap()
            .is_empty(),
        "no command for an instance that is gone"
    );
    assert_eq!(
        agents.log().last().cloned(),
        Some(("delete", host_id.clone(), vm.name.clone()))
    );
    assert!(
        site.app
            .db
            .pick_hosts_for_gpu(byo_db::vms::HostPick::new(
                "spark-1",
                &customer_sub,
                chrono::DateTime::UNIX_EPOCH,
                chrono::Utc::now(),
            ))
            .await
            .unwrap()
            .iter()
            .any(|h| h.id == host_id),
        "the host is free again"
    );
    site.close().await;
}

/// Issue #42 (3): every page, as each person meets it with something on it (a host enrolled,
/// prepared and active, a customer's key and running instance), passes axe-core with no
/// serious or critical violation and fits its window without scrolling sideways, at 1,280 px
/// and at a 390 px phone width; a screenshot of each is kept (`target/screenshots/pages/`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_passes_axe_and_fits_at_1280_and_390() {
    let Some(axe) = chromium::axe_source() else {
        return;
    };
    let agents = Arc::new(FakeAgents::new());
    let Some(site) = site_with(Some(agents.clone())).await else {
        return;
    };
    let owner = site.app.community_host("owner@example.com").await;
    let root = site.app.superadmin("root@example.com").await;
    let customer = site.app.customer("customer@example.com").await;

    let (host_id, _) = site.active_host(&owner, &root, "hw-pages").await;
    site.app.relay_recorded(&host_id).await;
    // A second host still waiting for its one-liner, for the pages that list enrolments.
    let waiting = owner
        .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
        .await;
    assert_eq!(waiting.status, StatusCode::CREATED, "{}", waiting.text());
    let key = customer
        .post(
            "/api/ssh-keys",
            json!({"name": "laptop", "public_key": format!("{} me@laptop", public_key_line())}),
        )
        .await;
    assert_eq!(key.status, StatusCode::CREATED, "{}", key.text());
    let created = customer
        .post(
            "/api/vms",
            json!({"gpu_type": "spark-1", "ssh_key_id": key.json()["id"]}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());

    let mut faults = Vec::new();
    faults.extend(
        sweep(
            &site,
            &axe,
            "anonymous",
            &["/login", "/signup", "/signup/confirm?token=byo_cnf_none"].map(str::to_owned),
        )
        .await,
    );
    // The checks themselves fail a page that breaks them: an input with no label, and
    // something wider than the window.
    site.goto("/login").await;
    site.c()
        .execute(
            "document.querySelector('main').insertAdjacentHTML('beforeend', \
               '<input id=unlabelled><div id=wide>wide</div>'); \
             document.getElementById('wide').style.width = '2000px';",
            vec![],
        )
        .await
        .unwrap();
    let broken = chromium::page_faults(site.c(), &axe, 390).await;
    assert!(
        broken.iter().any(|f| f.contains("critical label:")),
        "{broken:?}"
    );
    assert!(
        broken.iter().any(|f| f.contains("px wide in a")),
        "{broken:?}"
    );

    site.sign_in("customer@example.com").await;
    let pages = with_nav(&site, &["/"]).await;
    for must in [
        "/instances",
        "/prebookings",
        "/billing",
        "/notices",
        "/account",
    ] {
        assert!(pages.iter().any(|p| p == must), "{must}: {pages:?}");
    }
    faults.extend(sweep(&site, &axe, "customer", &pages).await);
    site.c().delete_all_cookies().await.unwrap();
    site.sign_in("owner@example.com").await;
    let pages = with_nav(&site, &["/"]).await;
    assert!(pages.iter().any(|p| p == "/hosts"), "{pages:?}");
    faults.extend(sweep(&site, &axe, "owner", &pages).await);
    site.c().delete_all_cookies().await.unwrap();
    site.sign_in("root@example.com").await;
    site.goto("/admin").await;
    let host_page = format!("/admin/hosts/{host_id}");
    let ops = with_nav(&site, &["/", &host_page]).await;
    for (must, _) in byo_server::pages::OPERATIONS {
        assert!(ops.iter().any(|p| p == must), "{must}: {ops:?}");
    }
    faults.extend(sweep(&site, &axe, "operator", &ops).await);

    assert!(
        faults.is_empty(),
        "{} faults:\n{}",
        faults.len(),
        faults.join("\n")
    );
    site.close().await;
}

/// Each of `paths` at 1,280 and 390 px, as the signed-in `who`: its faults
/// ([`chromium::page_faults`]), and a screenshot of each.
async fn sweep(site: &Site, axe: &str, who: &str, paths: &[String]) -> Vec<String> {
    let c = site.c();
    let mut faults = Vec::new();
    for width in [1280, 390] {
        c.set_window_size(width, 900).await.unwrap();
        for path in paths {
            site.goto(path).await;
            for f in chromium::page_faults(c, axe, width).await {
                faults.push(format!("{who} {path} at {f}"));
            }
            // A page named by an id is kept under "one", so runs do not pile up copies.
            let name = path
                .trim_matches('/')
                .split('/')
                .map(|seg| {
                    if seg.matches('-').count() == 4 {
                        "one"
                    } else {
                        seg
                    }
                })
                .collect::<Vec<_>>()
                .join("-")
                .replace(['?', '='], "-");
            let name = if name.is_empty() { "home".into() } else { name };
            site.browser
                .screenshot(&format!("pages/{who}-{name}-{width}.png"))
                .await;
        }
    }
    faults
}

/// `extra` and every page the open page's navigation links to (the header's and the
/// operations' own), once each, in order.
async fn with_nav(site: &Site, extra: &[&str]) -> Vec<String> {
    let found = site
        .c()
        .execute(
            "return [...document.querySelectorAll('header nav a[href^=\"/\"], nav.ops a[href^=\"/\"]')] \
               .map(a => a.getAttribute('href'));",
            vec![],
        )
        .await
        .unwrap();
    let mut pages: Vec<String> = extra.iter().map(|p| (*p).to_owned()).collect();
    for href in found.as_array().unwrap() {
        let href = href.as_str().unwrap().to_owned();
        if !pages.contains(&href) {
            pages.push(href);
        }
    }
    pages
}

/// The operator activates the host, shared: 204.
async fn activate(op: &support::User, host_id: &str) {
    let r = op
        .post(
            &format!("/api/admin/hosts/{host_id}/activate"),
            json!({"placement": "shared"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
}
