//! admin-operator-keys (M) through the API: changes add up in one draft, refusals change
//! nothing, a signature is checked with the agent's verifier before publishing, and the
//! signed bytes reach every host — here, agents built on the real agent code.

use crate::support;
use crate::with_world;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use byo_agent::operator_keys::{OperatorKeys, Paths};
use byo_core::keylist::check_key;
use byo_core::keylist_testing as testing;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::hosts::AgentTargetRow;
use byo_server::agents::{HostAgents, HttpAgents};
use byo_server::seal::{SealedAt, Sealer};
use serde_json::{Value, json};
use ssh_key::PrivateKey;
use support::agents::{Answer, FakeAgents, Op};
use support::{TestApp, User, test_config};

/// The hosts' operator keys, kept by the real agent's `OperatorKeys` code on temporary
/// directories; the fake agent hands every key push it answers to `receive`.
#[derive(Clone, Default)]
struct HostKeys(Arc<Mutex<HashMap<String, (tempfile::TempDir, OperatorKeys)>>>);

impl HostKeys {
    fn add(&self, host_id: &str, signing: &PrivateKey) {
        let dir = tempfile::tempdir().unwrap();
        let keys = OperatorKeys {
            paths: Paths {
                trusted: dir.path().join("signing-keys"),
                held: dir.path().join("operator-keys.signed"),
                authorized_keys: dir.path().join("authorized_keys"),
                request: dir.path().join("operator-keys-requested"),
            },
            environment: "production".into(),
            host: None,
        };
        keys.trust(&signing.public_key().to_openssh().unwrap())
            .unwrap();
        self.0
            .lock()
            .unwrap()
            .insert(host_id.to_owned(), (dir, keys));
    }

    fn authorized_keys(&self, host_id: &str) -> Option<String> {
        let hosts = self.0.lock().unwrap();
        std::fs::read_to_string(&hosts[host_id].1.paths.authorized_keys).ok()
    }

    fn receive(&self, host: &AgentTargetRow, envelope: &[u8]) -> Result<(), String> {
        let hosts = self.0.lock().unwrap();
        let (_, keys) = hosts.get(&host.id).ok_or("no such agent")?;
        keys.receive(envelope, chrono::Utc::now())
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// What a host that cannot be reached answers a push.
fn unreachable() -> Answer {
    Answer::unreachable("could not reach the agent: connection refused")
}

struct World {
    /// The test database, for reading rows back.
    app: TestApp,
    agents: Arc<FakeAgents>,
    keys: HostKeys,
    signing: PrivateKey,
    root: User,
    op: User,
    hosts: Vec<String>,
}

async fn world(backend: byo_db::Backend) -> Option<World> {
    let signing = testing::private_key();
    let mut config = test_config();
    config.operator_keys.signing_keys = vec![signing.public_key().to_openssh().unwrap()];
    let mut app = TestApp::with_config(backend, config).await?;
    let agents = Arc::new(FakeAgents::new());
    let keys = HostKeys::default();
    let receiving = keys.clone();
    agents.receive_keys_with(move |host, envelope| receiving.receive(host, envelope));
    // These hosts run no instances here.
    for op in [Op::Create, Op::Delete, Op::Power] {
        agents.answer(op, Answer::unreachable("no VM API in this test"));
    }
    app.state = app.state.clone().with_agents(agents.clone());
    app.router = byo_server::router(app.state.clone());
    let root = app.superadmin("root@example.com").await;
    let op = app.operator("op@example.com").await;
    let mut hosts = Vec::new();
    for slug in ["spark-1", "spark-2"] {
        app.give_host(&root.sub, slug).await;
    }
    for h in app.db.agent_targets().await.unwrap() {
        keys.add(&h.id, &signing);
        hosts.push(h.id);
    }
    Some(World {
        app,
        agents,
        keys,
        signing,
        root,
        op,
        hosts,
    })
}

fn login_key() -> String {
    testing::public_key_line()
}

impl World {
    async fn change(&self, user: &User, body: Value) -> support::Reply {
        user.post("/api/admin/operator-keys/changes", body).await
    }
    async fn add(&self, user: &User, label: &str) -> String {
        let key = login_key();
        let r = self
            .change(
                user,
                json!({"action": "add", "public_key": key, "label": label}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        key
    }
    async fn overview(&self) -> Value {
        self.op.get("/api/admin/operator-keys").await.json()
    }
    fn sign(&self, body: &str, key: &PrivateKey) -> String {
        testing::sign(body, key)
    }
    async fn upload(&self, version: i64, signature: &str) -> support::Reply {
        self.root
            .post(
                &format!("/api/admin/operator-keys/{version}/signatures"),
                json!({"signature": signature}),
            )
            .await
    }
    async fn publish_draft(&self) -> Value {
        let o = self.overview().await;
        let version = o["draft"]["version"].as_i64().unwrap();
        let sig = self.sign(o["draft"]["body"].as_str().unwrap(), &self.signing);
        let r = self.upload(version, &sig).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        r.json()
    }
}

fn fingerprint(public_key: &str) -> String {
    check_key(&byo_core::keylist::OperatorKey {
        user_sub: "x".into(),
        label: "x".into(),
        public_key: public_key.into(),
    })
    .unwrap()
    .fingerprint
}

async fn m10_two_operators_changes_end_in_one_version_holding_both(w: World) {
    let a = w.add(&w.root, "root laptop").await;
    let b = w.add(&w.op, "op desktop").await;
    let o = w.overview().await;
    assert_eq!(o["draft"]["version"], 1);
    assert!(o["published"].is_null());
    let keys = o["draft"]["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    // Each key names its operator by email, beside the account id the list binds.
    let mut named: Vec<(&str, &str)> = keys
        .iter()
        .map(|k| {
            (
                k["user_sub"].as_str().unwrap(),
                k["email"].as_str().unwrap(),
            )
        })
        .collect();
    named.sort();
    let mut expected = vec![
        (w.root.sub.as_str(), w.root.email.as_str()),
        (w.op.sub.as_str(), w.op.email.as_str()),
    ];
    expected.sort();
    assert_eq!(named, expected);
    let changes = o["draft_changes"].as_array().unwrap();
    let who: Vec<&str> = changes
        .iter()
        .map(|c| c["user_sub"].as_str().unwrap())
        .collect();
    assert_eq!(
        who,
        [w.root.sub.as_str(), w.op.sub.as_str()],
        "who changed what"
    );
    assert_eq!(changes[0]["fingerprint"], fingerprint(&a));
    assert_eq!(changes[1]["fingerprint"], fingerprint(&b));
}

async fn m_refused_changes_change_nothing(w: World) {
    let mine = w.add(&w.op, "laptop").await;
    let theirs = w.add(&w.root, "root laptop").await;
    let before = w.overview().await;
    let cases = [
        (
            json!({"action": "remove", "fingerprint": fingerprint(&theirs)}),
            StatusCode::FORBIDDEN,
        ),
        (
            json!({"action": "add", "public_key": mine.clone(), "label": "again"}),
            StatusCode::CONFLICT,
        ),
        (
            json!({"action": "add", "public_key": "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7", "label": "rsa"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"action": "add", "public_key": format!("no-pty {}", login_key()), "label": "opts"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"action": "add", "public_key": login_key(), "label": "bell\u{7}"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"action": "remove", "fingerprint": "SHA256:not-listed"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"action": "rename"}),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ];
    for (body, status) in cases {
        let r = w.change(&w.op, body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert_eq!(w.overview().await, before, "{body} changed something");
    }
    // Removing the last key is refused (M.2).
    let r = w
        .change(
            &w.root,
            json!({"action": "remove", "fingerprint": fingerprint(&theirs)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let after_one = w.overview().await;
    let r = w
        .change(
            &w.op,
            json!({"action": "remove", "fingerprint": fingerprint(&mine)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["error"], "no_operator_left");
    assert_eq!(w.overview().await, after_one);
}

async fn m7_publish_verifies_then_pushes_the_exact_bytes_to_every_host(w: World) {
    let key = w.add(&w.op, "laptop").await;
    let o = w.overview().await;
    let body = o["draft"]["body"].as_str().unwrap().to_owned();

    // A signature from any other key is refused and nothing is published.
    let stranger = testing::private_key();
    let r = w.upload(1, &w.sign(&body, &stranger)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"], "signature_refused");
    assert!(w.overview().await["published"].is_null());
    // Only a superadmin uploads: an operator's session is not enough.
    let r =
        w.op.post(
            "/api/admin/operator-keys/1/signatures",
            json!({"signature": w.sign(&body, &w.signing)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    let outcome = w.publish_draft().await;
    assert_eq!(outcome, json!({"version": 1, "delivered": 2, "failed": 0}));
    let o = w.overview().await;
    assert_eq!(
        o["published"]["body"],
        body.as_str(),
        "published exactly as signed"
    );
    assert!(o["draft"].is_null());
    for h in &w.hosts {
        let ak = w.keys.authorized_keys(h).unwrap();
        assert!(ak.contains(&key) && ak.contains("expiry-time="), "{ak}");
    }
    for h in o["hosts"].as_array().unwrap() {
        assert_eq!(
            (h["version"].as_i64(), h["error"].as_str()),
            (Some(1), None)
        );
    }
    // The fingerprint sshd logs maps to the operator.
    let owner =
        w.op.get(&format!(
            "/api/admin/operator-keys/owner?fingerprint={}",
            fingerprint(&key).replace('/', "%2F").replace('+', "%2B")
        ))
        .await
        .json();
    assert_eq!(owner[0]["email"], "op@example.com");
    assert_eq!(owner[0]["label"], "laptop");
    // Signing the published version again is refused.
    let r = w.upload(1, &w.sign(&body, &w.signing)).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
}

async fn m6_a_failed_push_is_shown_and_sending_again_needs_no_signature(w: World) {
    let first = w.add(&w.op, "laptop").await;
    w.agents
        .answer_on(&w.hosts[1], Op::PushKeys, Some(unreachable()));
    let outcome = w.publish_draft().await;
    assert_eq!(outcome, json!({"version": 1, "delivered": 1, "failed": 1}));
    let o = w.overview().await;
    let down = o["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["host_id"] == w.hosts[1].as_str())
        .unwrap()
        .clone();
    assert!(down["version"].is_null());
    assert!(
        down["error"]
            .as_str()
            .unwrap()
            .contains("connection refused")
    );
    assert!(w.keys.authorized_keys(&w.hosts[1]).is_none());

    // Nothing retries on its own; an operator sends again once the host is back.
    w.agents.answer_on(&w.hosts[1], Op::PushKeys, None);
    let r =
        w.op.post_empty(&format!(
            "/api/admin/operator-keys/hosts/{}/send",
            w.hosts[1]
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["delivered"], 1);
    assert!(
        w.keys
            .authorized_keys(&w.hosts[1])
            .unwrap()
            .contains(&first)
    );
    let o = w.overview().await;
    assert!(
        o["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|h| h["version"] == 1 && h["error"].is_null())
    );
}

async fn m10_concurrent_publishes_of_one_version_exactly_one_wins(w: World) {
    w.add(&w.op, "laptop").await;
    let o = w.overview().await;
    let sig = w.sign(o["draft"]["body"].as_str().unwrap(), &w.signing);
    let (a, b) = tokio::join!(w.upload(1, &sig), w.upload(1, &sig));
    let mut statuses = [a.status, b.status];
    statuses.sort();
    assert_eq!(
        statuses,
        [StatusCode::OK, StatusCode::CONFLICT],
        "{} / {}",
        a.text(),
        b.text()
    );
}

async fn m10_only_the_newest_version_can_be_signed(w: World) {
    w.add(&w.op, "laptop").await;
    w.publish_draft().await;
    w.add(&w.op, "desktop").await;
    let o = w.overview().await;
    let r = w
        .upload(
            1,
            &w.sign(o["published"]["body"].as_str().unwrap(), &w.signing),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    let r = w
        .upload(3, &w.sign(o["draft"]["body"].as_str().unwrap(), &w.signing))
        .await;
    assert_eq!(r.json()["error"], "not_the_newest_draft");
    assert_eq!(w.overview().await, o, "nothing changed");
}

async fn m12_a_withdrawn_draft_is_gone_for_everyone(w: World) {
    let kept = w.add(&w.op, "laptop").await;
    w.publish_draft().await;
    w.add(&w.op, "desktop").await;
    let r = w.root.delete("/api/admin/operator-keys/draft").await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let o = w.overview().await;
    assert!(o["draft"].is_null() && o["draft_changes"].as_array().unwrap().is_empty());
    let r = w.root.delete("/api/admin/operator-keys/draft").await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "nothing left to withdraw"
    );
    // The next change starts from the published list again.
    w.add(&w.op, "tablet").await;
    let o = w.overview().await;
    assert_eq!(o["draft"]["version"], 2);
    let labels: Vec<&str> = o["draft"]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels.len(), 2);
    assert!(labels.contains(&"laptop") && labels.contains(&"tablet"));
    assert!(w.keys.authorized_keys(&w.hosts[0]).unwrap().contains(&kept));
}

with_world!(
    m10_two_operators_changes_end_in_one_version_holding_both,
    m_refused_changes_change_nothing,
    m7_publish_verifies_then_pushes_the_exact_bytes_to_every_host,
    m6_a_failed_push_is_shown_and_sending_again_needs_no_signature,
    m10_concurrent_publishes_of_one_version_exactly_one_wins,
    m10_only_the_newest_version_can_be_signed,
    m12_a_withdrawn_draft_is_gone_for_everyone,
);

/// The real HTTP client against the agent's real serving API on loopback: the sealed token
/// is opened and presented, and the agent applies the list; a wrong token is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_client_delivers_to_the_agents_serving_api() {
    use byo_core::tokens::{SecretToken, TokenKind};
    let dir = tempfile::tempdir().unwrap();
    let signing = testing::private_key();
    let keys = OperatorKeys {
        paths: Paths {
            trusted: dir.path().join("signing-keys"),
            held: dir.path().join("held"),
            authorized_keys: dir.path().join("authorized_keys"),
            request: dir.path().join("operator-keys-requested"),
        },
        environment: "production".into(),
        host: None,
    };
    keys.trust(&signing.public_key().to_openssh().unwrap())
        .unwrap();
    let token = SecretToken::generate(TokenKind::Agent);
    // Root's half on the host (`enverge-operator-keys`, #36): what serving passes on is
    // applied by the agent's own `apply_requested`, as root's unit runs it.
    let root = keys.clone();
    let root_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let root_stop = root_done.clone();
    let root = std::thread::spawn(move || {
        while !root_stop.load(std::sync::atomic::Ordering::Relaxed) {
            if root.paths.request.exists() {
                let _ = root.apply_requested(chrono::Utc::now());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    });
    let agent = byo_agent::serve::router(byo_agent::serve::Serving {
        token_hash: Arc::new(token.hash()),
        operator_keys: keys,
        vms: None,
    });
    // Behind its relay's TLS front, with the certificate relay-provision issues.
    let ca = byo_server::relay_ca::RelayCa::generate().unwrap();
    let public_url = "https://app.example.com";
    let cert = ca
        .issue(
            &byo_server::relay_ca::relay_name("spark-1", public_url),
            chrono::Utc::now(),
        )
        .unwrap();
    let (port, _) = support::relay_tls::serve(agent, &cert).await;

    let sealer = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
    let client = HttpAgents::new(
        Some(sealer.clone()),
        byo_server::relay_ca::RelayCaSource::fixed(ca),
        public_url,
    )
    .with_port(port);
    let list = testing::list(
        "production",
        1,
        vec![testing::login_key("op", "l")],
        chrono::Utc::now(),
    );
    let envelope = testing::envelope(&list, &[&signing]);
    let target = |sealed: Option<String>, relay: Option<&str>| AgentTargetRow {
        id: "h".into(),
        slug: "spark-1".into(),
        relay_ip: relay.map(str::to_owned),
        agent_token: sealed,
    };
    let wrong = SecretToken::generate(TokenKind::Agent);
    let refused = client
        .push_operator_keys(
            &target(
                Some(sealer.seal(&SealedAt::agent_token("h"), wrong.expose())),
                Some("127.0.0.1"),
            ),
            &envelope,
        )
        .await;
    assert!(refused.unwrap_err().contains("401"));
    assert!(
        !dir.path().join("authorized_keys").exists(),
        "a wrong token changes nothing"
    );
    let unenrolled = client
        .push_operator_keys(&target(None, Some("127.0.0.1")), &envelope)
        .await;
    assert!(unenrolled.unwrap_err().contains("no agent token"));
    let no_relay = client
        .push_operator_keys(
            &target(
                Some(sealer.seal(&SealedAt::agent_token("h"), token.expose())),
                None,
            ),
            &envelope,
        )
        .await;
    assert!(no_relay.unwrap_err().contains("no relay"));
    let garbage = client
        .push_operator_keys(
            &target(
                Some(sealer.seal(&SealedAt::agent_token("h"), token.expose())),
                Some("127.0.0.1"),
            ),
            b"{}",
        )
        .await;
    assert!(
        garbage.unwrap_err().contains("422"),
        "the agent's refusal reaches the operator"
    );

    client
        .push_operator_keys(
            &target(
                Some(sealer.seal(&SealedAt::agent_token("h"), token.expose())),
                Some("127.0.0.1"),
            ),
            &envelope,
        )
        .await
        .unwrap();
    assert!(
        std::fs::read_to_string(dir.path().join("authorized_keys"))
            .unwrap()
            .contains("byo-operator:op:l")
    );
    root_done.store(true, std::sync::atomic::Ordering::Relaxed);
    root.join().unwrap();
}

async fn the_operators_page_shows_the_draft_changes_hosts_and_refusals(w: World) {
    const CHANGES: &str = "/admin/operator-keys/changes";
    let key = login_key();
    let added =
        w.op.post_form(
            CHANGES,
            &[
                ("action", "add"),
                ("label", "work laptop"),
                ("public_key", &key),
            ],
        )
        .await;
    assert_eq!(added.status, StatusCode::SEE_OTHER, "{}", added.text());
    let page = w.op.get("/admin/operator-keys").await.text();
    assert!(
        page.contains("Waiting for a signature") && page.contains("work laptop"),
        "{page}"
    );
    assert!(page.contains(&fingerprint(&key)));
    assert!(
        page.contains("op@example.com") && page.contains("added"),
        "who changed what"
    );
    assert!(
        page.contains("spark-1") && page.contains("spark-2"),
        "every host is listed"
    );
    assert!(page.contains("byo keys sign --server"));

    let refused =
        w.op.post_form(
            CHANGES,
            &[
                ("action", "add"),
                ("label", "x"),
                ("public_key", "ssh-rsa AAAAB3NzaC1yc2E"),
            ],
        )
        .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.text().contains("not allowed"), "{}", refused.text());

    w.publish_draft().await;
    let page = w.op.get("/admin/operator-keys").await.text();
    assert!(page.contains("Send again") && page.contains("Nothing is waiting"));
}

with_world!(the_operators_page_shows_the_draft_changes_hosts_and_refusals);

/// The rows a key change would touch: the newest list and the changes it collected.
async fn key_rows(w: &World) -> (Option<(i32, String)>, Vec<(String, String, String)>) {
    let newest = w.app.db.newest_key_list().await.unwrap();
    let changes = match &newest {
        Some(l) => w
            .app
            .db
            .key_changes(l.version)
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.action, c.fingerprint, c.label))
            .collect(),
        None => Vec::new(),
    };
    (newest.map(|l| (l.version, l.body)), changes)
}

/// The part of the keys page inside the add-a-key form.
fn add_form(page: &str) -> &str {
    let start = page
        .find(r#"<form id="add-key""#)
        .expect("the add-a-key form");
    let end = start + page[start..].find("</form>").unwrap();
    &page[start..end]
}

/// An ordinary `.pub` line goes in as it is: the list gets the bare key, and the comment
/// names the machine unless a name was given.
async fn the_key_form_takes_a_pub_line_and_its_comment_names_the_machine(w: World) {
    const CHANGES: &str = "/admin/operator-keys/changes";
    let bare = login_key();
    let line = format!("{bare} op@laptop\n");
    let r =
        w.op.post_form(
            CHANGES,
            &[("action", "add"), ("label", ""), ("public_key", &line)],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let named = format!("{} named by the form", login_key());
    let r =
        w.op.post_form(
            CHANGES,
            &[
                ("action", "add"),
                ("label", "desk"),
                ("public_key", &format!("{named} kept out")),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());

    let (newest, changes) = key_rows(&w).await;
    let body = newest.unwrap().1;
    let list = byo_core::keylist::KeyList::from_canonical(&body).unwrap();
    let keys: Vec<(&str, &str)> = list
        .keys
        .iter()
        .map(|k| (k.label.as_str(), k.public_key.as_str()))
        .collect();
    let named_bare = named.split(' ').take(2).collect::<Vec<_>>().join(" ");
    assert!(keys.contains(&("op@laptop", bare.as_str())), "{keys:?}");
    assert!(keys.contains(&("desk", named_bare.as_str())), "{keys:?}");
    assert!(
        !body.contains("named by the form") && !body.contains("kept out"),
        "the signed list carries keys without comments: {body}"
    );
    assert_eq!(
        changes
            .iter()
            .map(|(_, _, label)| label.as_str())
            .collect::<Vec<_>>(),
        ["op@laptop", "desk"]
    );
    // The API takes the same line, through the same rule.
    let r = w
        .change(
            &w.root,
            json!({"action": "add", "public_key": format!("{} root@box", login_key()), "label": ""}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.text().contains("root@box"));
}

/// Every refusal shows the form again with what was typed and the reason beside it, with a
/// 4xx, and changes no row.
async fn the_key_form_keeps_what_was_typed_and_says_why_when_it_refuses(w: World) {
    const CHANGES: &str = "/admin/operator-keys/changes";
    let mine = w.add(&w.op, "laptop").await;
    let before = (key_rows(&w).await, w.overview().await);
    let key = login_key();
    let cases: Vec<(String, &str, StatusCode, &str)> = vec![
        (
            format!("no-pty {key} op@laptop"),
            "",
            StatusCode::BAD_REQUEST,
            "options in front of it",
        ),
        (
            format!(r#"from="10.0.0.1" {key}"#),
            "desk",
            StatusCode::BAD_REQUEST,
            "options in front of it",
        ),
        (
            "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 me@old".into(),
            "old",
            StatusCode::BAD_REQUEST,
            "not allowed",
        ),
        (key.clone(), "", StatusCode::BAD_REQUEST, "name the machine"),
        (
            format!("{mine} again@laptop"),
            "",
            StatusCode::CONFLICT,
            "already",
        ),
    ];
    for (public_key, label, status, reason) in cases {
        let r =
            w.op.post_form(
                CHANGES,
                &[
                    ("action", "add"),
                    ("label", label),
                    ("public_key", &public_key),
                ],
            )
            .await;
        assert_eq!(r.status, status, "{public_key}: {}", r.text());
        let page = r.text();
        let form = add_form(&page);
        assert!(
            form.contains(r#"class="error""#) && form.contains(reason),
            "{public_key}: the reason at the form: {form}"
        );
        let typed = public_key.replace('"', "&quot;");
        assert!(
            form.contains(&format!(r#"value="{typed}""#))
                && form.contains(&format!(
                    r#"name="label" maxlength="128" placeholder="work laptop" value="{label}""#
                )),
            "{public_key}: what was typed is kept: {form}"
        );
        assert_eq!(
            (key_rows(&w).await, w.overview().await),
            before,
            "{public_key} changed something"
        );
    }
}

/// A GB10 host through host-provision and redeem, as its agent would: its slug and the
/// enrolment answer.
async fn enrolled_host(w: &World) -> (String, Value) {
    let p = w
        .root
        .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
        .await;
    assert_eq!(p.status, StatusCode::CREATED, "{}", p.text());
    let p = p.json();
    let spark = json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": "3f2a", "hardware_id": "b41c", "node_index": 0, "rails": []
    });
    let enrolled = w
        .app
        .send(
            axum::http::Request::post("/api/enroll")
                .header(
                    axum::http::header::AUTHORIZATION,
                    format!("Bearer {}", p["token"].as_str().unwrap()),
                )
                .header(axum::http::header::CONTENT_TYPE, "application/json")
                .body(axum::body::Body::from(spark.to_string()))
                .unwrap(),
        )
        .await;
    assert_eq!(enrolled.status, StatusCode::OK, "{}", enrolled.text());
    (p["slug"].as_str().unwrap().to_owned(), enrolled.json())
}

/// A host holds the list its enrolment answer carried (step 29) from the moment it is
/// handed over: the page shows that version and when, not "—" and "never".
async fn a_host_holds_the_version_it_enrolled_with(w: World) {
    w.add(&w.op, "laptop").await;
    w.publish_draft().await;
    let (slug, enrolled) = enrolled_host(&w).await;
    let slug = slug.as_str();
    let envelope: Value =
        serde_json::from_str(enrolled["operator_keys"].as_str().unwrap()).unwrap();
    assert!(
        envelope["body"]
            .as_str()
            .unwrap()
            .contains("\"version\":1,"),
        "the answer carries version 1: {envelope}"
    );

    let hosts = w.overview().await["hosts"].clone();
    let host = hosts
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["slug"] == slug)
        .unwrap_or_else(|| panic!("{slug} in {hosts}"));
    assert_eq!(host["version"], 1, "{host}");
    assert!(
        host["attempted_at"].is_string() && host["error"].is_null(),
        "{host}"
    );
    let page = w.op.page("/admin/operator-keys").await;
    let row_start = page.find(&format!("<td>{slug}</td>")).unwrap();
    let row = &page[row_start..row_start + page[row_start..].find("</tr>").unwrap()];
    assert!(
        row.starts_with(&format!("<td>{slug}</td><td>1</td><td>20")),
        "{row}"
    );
    assert!(!row.contains("never") && !row.contains('—'), "{row}");
}

/// A host still preparing is not serving, so no push reaches it: its preparation asks for
/// the published list with its host token (the agent's own client, against the real
/// handler on loopback) and keeps it only if it verifies as a push would. A list published
/// after its enrolment reaches it that way; a token that is no live host's gets
/// host-report's one answer.
async fn a_preparing_host_fetches_the_published_list_and_keeps_it_only_if_it_verifies(w: World) {
    use byo_agent::report::Reporter;
    w.add(&w.op, "laptop").await;
    w.publish_draft().await;
    let (slug, enrolled) = enrolled_host(&w).await;
    let host_token = enrolled["host_token"].as_str().unwrap().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let host = |environment: &str| OperatorKeys {
        paths: Paths {
            trusted: dir.path().join("signing-keys"),
            held: dir.path().join("operator-keys.signed"),
            authorized_keys: dir.path().join("authorized_keys"),
            request: dir.path().join("operator-keys-requested"),
        },
        environment: environment.into(),
        host: None,
    };
    let keys = host(enrolled["environment"].as_str().unwrap());
    keys.trust(&w.signing.public_key().to_openssh().unwrap())
        .unwrap();
    keys.keep(
        enrolled["operator_keys"].as_str().unwrap().as_bytes(),
        chrono::Utc::now(),
    )
    .unwrap();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    let router = w.app.router.clone();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let fetch = |token: String| {
        let server = server.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                Reporter::new(&server, &token)
                    .unwrap()
                    .published_operator_keys()
            })
            .await
            .unwrap()
        }
    };

    // Version 2, published after the enrolment: the push finds no serving agent there.
    w.add(&w.op, "desktop").await;
    let pushed = w.publish_draft().await;
    assert_eq!(pushed["version"], 2);
    let fetched = fetch(host_token.clone()).await.unwrap().unwrap();
    let published = w.app.db.published_key_list().await.unwrap().unwrap();
    assert_eq!(
        fetched,
        published.envelope.unwrap().into_bytes(),
        "the exact signed bytes a push sends"
    );
    let kept = keys.keep(&fetched, chrono::Utc::now()).unwrap();
    assert_eq!((kept.version, kept.keys), (2, 2));
    assert_eq!(keys.held().unwrap().unwrap().1.version, 2);
    assert!(
        !keys.paths.authorized_keys.exists(),
        "preparation's operator-access writes authorized_keys, as spark's"
    );
    let hosts = w.overview().await["hosts"].clone();
    let row = hosts
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["slug"] == slug.as_str())
        .unwrap_or_else(|| panic!("{slug} in {hosts}"));
    assert!(
        row["version"] == 2 && row["error"].is_null(),
        "the operators see the host holding what it fetched: {row}"
    );

    // Kept only if it verifies as a push would: a host of another environment refuses it
    // and keeps what it held.
    let held_before = std::fs::read(&keys.paths.held).unwrap();
    let elsewhere = host("staging");
    assert!(elsewhere.keep(&fetched, chrono::Utc::now()).is_err());
    assert_eq!(std::fs::read(&keys.paths.held).unwrap(), held_before);

    // An unknown token: host-report's one answer, headers and body.
    let unknown = SecretToken::generate(TokenKind::Host).expose().to_owned();
    let ask = |token: &str, method: axum::http::Method, path: &str, body: &str| {
        axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(axum::http::header::AUTHORIZATION, format!("Bearer {token}"))
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body.to_owned()))
            .unwrap()
    };
    let list = w
        .app
        .send(ask(
            &unknown,
            axum::http::Method::GET,
            "/api/host/operator-keys",
            "",
        ))
        .await;
    let report = w
        .app
        .send(ask(
            &unknown,
            axum::http::Method::POST,
            "/api/host/report",
            "{}",
        ))
        .await;
    assert_eq!(list.status, StatusCode::UNAUTHORIZED);
    assert_eq!(list.as_seen(), report.as_seen(), "headers included");
    assert!(fetch(unknown).await.unwrap_err().contains("401"));
}

with_world!(
    the_key_form_takes_a_pub_line_and_its_comment_names_the_machine,
    the_key_form_keeps_what_was_typed_and_says_why_when_it_refuses,
    a_host_holds_the_version_it_enrolled_with,
    a_preparing_host_fetches_the_published_list_and_keeps_it_only_if_it_verifies,
);

/// I: "leaving is one action". Revoking an operator's role drafts every key of theirs off
/// the list in the same request; the next signed list's push takes them off every host's
/// authorized_keys (the real agent code writes those files here).
async fn i_revoking_an_operators_role_takes_their_keys_off_every_host(w: World) {
    let theirs = w.add(&w.op, "op laptop").await;
    let kept = w.add(&w.root, "root laptop").await;
    w.publish_draft().await;
    for h in &w.hosts {
        assert!(w.keys.authorized_keys(h).unwrap().contains(&theirs));
    }
    let r = w
        .root
        .delete(&format!("/api/admin/users/{}/roles/operator", w.op.sub))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // Read as the superadmin: the one who left reads nothing here any more.
    let o: Value = w.root.get("/api/admin/operator-keys").await.json();
    assert_eq!(o["draft"]["version"], 2, "the revoke drafted the removal");
    let draft_keys: Vec<&str> = o["draft"]["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["public_key"].as_str().unwrap())
        .collect();
    assert_eq!(draft_keys, [kept.as_str()]);
    assert_eq!(o["draft_changes"][0]["action"], "depart");
    let sig = w.sign(o["draft"]["body"].as_str().unwrap(), &w.signing);
    let r = w.upload(2, &sig).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    for h in &w.hosts {
        let ak = w.keys.authorized_keys(h).unwrap();
        assert!(!ak.contains(&theirs), "{ak}");
        assert!(ak.contains(&kept), "{ak}");
    }
}

/// I: a superadmin removes any operator's key; an operator still removes only their own.
async fn i_a_superadmin_removes_any_operators_key(w: World) {
    let theirs = w.add(&w.op, "op laptop").await;
    w.add(&w.root, "root laptop").await;
    let r = w
        .change(
            &w.root,
            json!({"action": "remove", "fingerprint": fingerprint(&theirs)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let keys = r.json()["keys"].as_array().unwrap().len();
    assert_eq!(keys, 1);
}

/// M.13 through the route: only a superadmin drafts a rotation; the draft publishes only
/// with the current key's and the successor's signatures (a refusal publishes nothing);
/// afterwards hosts take lists the successor signs and refuse the old key's, and a host
/// enrolling now pins the successor.
async fn m13_a_rotation_is_published_with_both_signatures_and_the_old_key_signs_nothing_after(
    w: World,
) {
    w.add(&w.root, "root laptop").await;
    w.publish_draft().await;
    let successor = testing::private_key();
    let successor_line = successor.public_key().to_openssh().unwrap();
    let rotate = json!({"action": "rotate_signing_keys", "signing_keys": [successor_line]});
    let r = w.change(&w.op, rotate.clone()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    let r = w.change(&w.root, rotate).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let o = w.overview().await;
    let body = o["draft"]["body"].as_str().unwrap().to_owned();
    let version = o["draft"]["version"].as_i64().unwrap();
    let old_sig = w.sign(&body, &w.signing);
    let new_sig = w.sign(&body, &successor);
    let r = w.upload(version, &old_sig).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.text().contains("signature"), "{}", r.text());
    assert_eq!(
        w.overview().await["published"]["version"],
        1,
        "nothing published"
    );
    let r = w
        .root
        .post(
            &format!("/api/admin/operator-keys/{version}/signatures"),
            json!({"signature": old_sig, "more_signatures": [new_sig]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let o = w.overview().await;
    let successor_fp = successor
        .public_key()
        .fingerprint(ssh_key::HashAlg::Sha256)
        .to_string();
    assert_eq!(o["signing_keys"], json!([successor_fp]));
    // The next change: the old key's signature is refused, the successor's publishes.
    let added = w.add(&w.op, "op laptop").await;
    let o = w.overview().await;
    let body = o["draft"]["body"].as_str().unwrap().to_owned();
    let version = o["draft"]["version"].as_i64().unwrap();
    let r = w.upload(version, &w.sign(&body, &w.signing)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let r = w.upload(version, &w.sign(&body, &successor)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    for h in &w.hosts {
        assert!(w.keys.authorized_keys(h).unwrap().contains(&added));
    }
}

with_world!(
    i_revoking_an_operators_role_takes_their_keys_off_every_host,
    i_a_superadmin_removes_any_operators_key,
    m13_a_rotation_is_published_with_both_signatures_and_the_old_key_signs_nothing_after,
);

/// #16 renewal: nothing is drafted before two thirds of the published list's validity have
/// passed; after, the same keys are drafted as the next version with a fresh expiry, once;
/// /admin warns from 14 days out and names an expired list; a host reporting an expired
/// list in its heartbeat is named on its page's problems.
async fn renewal_is_drafted_at_two_thirds_of_validity_and_the_pages_warn(mut w: World) {
    let clock = byo_server::clock::Clock::manual(chrono::Utc::now());
    w.app.state = w.app.state.clone().with_clock(clock.clone());
    w.app.router = byo_server::router(w.app.state.clone());
    let app_state = w.app.state.clone();
    w.add(&w.root, "root laptop").await;
    let body = w.overview().await["draft"]["body"]
        .as_str()
        .unwrap()
        .to_owned();
    w.publish_draft().await;
    let published = byo_core::keylist::KeyList::from_canonical(&body).unwrap();
    let validity = published.expires - published.issued_at;
    let due = published.issued_at + validity * 2 / 3;
    clock.advance(validity / 2);
    assert_eq!(
        byo_server::app::operator_keys::renew_if_due(&app_state)
            .await
            .unwrap(),
        None
    );
    // A second before two thirds, nothing; at two thirds exactly, the renewal.
    clock.advance(due - clock.now() - chrono::Duration::seconds(1));
    assert_eq!(
        byo_server::app::operator_keys::renew_if_due(&app_state)
            .await
            .unwrap(),
        None
    );
    clock.advance(chrono::Duration::seconds(1));
    assert_eq!(clock.now(), due);
    assert_eq!(
        byo_server::app::operator_keys::renew_if_due(&app_state)
            .await
            .unwrap(),
        Some(2)
    );
    assert_eq!(
        byo_server::app::operator_keys::renew_if_due(&app_state)
            .await
            .unwrap(),
        None,
        "a draft is waiting: nothing more"
    );
    let draft = w.app.db.newest_key_list().await.unwrap().unwrap();
    let renewed = byo_core::keylist::KeyList::from_canonical(&draft.body).unwrap();
    assert_eq!(renewed.keys, published.keys);
    assert!(renewed.expires > published.expires);
    let changes = w.app.db.key_changes(2).await.unwrap();
    assert_eq!(changes[0].action, "renew");
    // The page warns within 14 days, and names an expired list as such. (Sessions from
    // then: the first ones have lapsed on the test's clock.)
    let page = |n: u32, path: &'static str| {
        let app = &w.app;
        async move {
            let root = app
                .superadmin(&format!("later-{n}-{}@example.com", path.len()))
                .await;
            root.get(path).await.text()
        }
    };
    // The fleet's page says it too, for every host at once (issue #39, 5).
    assert!(
        !page(1, "/admin/operator-keys")
            .await
            .contains("within 14 day")
    );
    assert!(!page(1, "/admin").await.contains("fleet-keys"));
    clock.advance(validity / 3 - chrono::Duration::days(10));
    assert!(
        page(2, "/admin/operator-keys")
            .await
            .contains("within 14 day(s)")
    );
    let fleet = page(2, "/admin").await;
    assert!(
        fleet.contains("id=\"fleet-keys\"") && fleet.contains("within 14 day(s)"),
        "{fleet}"
    );
    clock.advance(chrono::Duration::days(11));
    let text = page(3, "/admin/operator-keys").await;
    assert!(
        text.contains("expired") && text.contains("stops at operator-access"),
        "{text}"
    );
    let fleet = page(3, "/admin").await;
    assert!(
        fleet.contains("The operator-key list expired") && fleet.contains("refuses every operator"),
        "{fleet}"
    );
}

with_world!(renewal_is_drafted_at_two_thirds_of_validity_and_the_pages_warn);
/// M.10 through the route: two operators' changes arrive together when no draft is open,
/// so both try to open the next version and one loses on its key; the server applies the
/// loser again on top of the winner. Both are answered 200 and both keys are in the one
/// draft, with both changes recorded against it. Several rounds (each published before
/// the next) so the two inserts collide on PostgreSQL, where they run in parallel.
async fn m10_two_changes_racing_through_the_route_both_end_in_the_draft(w: World) {
    let mut expected: Vec<String> = Vec::new();
    for round in 1..=4 {
        let start = Arc::new(tokio::sync::Barrier::new(2));
        let racers: Vec<_> = [(&w.root, "root"), (&w.op, "op")]
            .into_iter()
            .map(|(user, who)| {
                let (user, start) = (user.clone(), start.clone());
                let key = login_key();
                let label = format!("{who} machine {round}");
                tokio::spawn(async move {
                    start.wait().await;
                    let r = user
                        .post(
                            "/api/admin/operator-keys/changes",
                            json!({"action": "add", "public_key": key, "label": label}),
                        )
                        .await;
                    (r, key)
                })
            })
            .collect();
        for r in racers {
            let (r, key) = r.await.unwrap();
            assert_eq!(r.status, StatusCode::OK, "round {round}: {}", r.text());
            expected.push(fingerprint(&key));
        }
        let o = w.overview().await;
        assert_eq!(o["draft"]["version"], round, "one draft, the next version");
        let mut in_draft: Vec<String> = o["draft"]["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| fingerprint(k["public_key"].as_str().unwrap()))
            .collect();
        in_draft.sort();
        let mut want = expected.clone();
        want.sort();
        assert_eq!(
            in_draft, want,
            "round {round}: every key so far is in the draft"
        );
        let changes = o["draft_changes"].as_array().unwrap();
        assert_eq!(
            changes.len(),
            2,
            "round {round}: both changes, against this draft"
        );
        w.publish_draft().await;
    }
}

with_world!(m10_two_changes_racing_through_the_route_both_end_in_the_draft,);

/// M.10's one publish per version, through the route, made to overlap: eight uploads of
/// one signature at once, over three versions. Exactly one is answered 200 and pushed to
/// the hosts; the other seven get 409 `already_published` whether they lost at the draft
/// check or at the store's guarded write — so a dropped guard (`state = 'draft'`) fails
/// here on SQLite as on PostgreSQL.
async fn m10_eight_overlapping_publishes_of_one_version_one_wins_one_push(w: World) {
    for version in 1..=3 {
        w.add(&w.op, &format!("machine {version}")).await;
        let o = w.overview().await;
        assert_eq!(o["draft"]["version"], version);
        let sig = w.sign(o["draft"]["body"].as_str().unwrap(), &w.signing);
        let pushes_before = w.agents.calls(Op::PushKeys).len();
        let start = Arc::new(tokio::sync::Barrier::new(8));
        let uploads: Vec<_> = (0..8)
            .map(|_| {
                let (root, sig, start) = (w.root.clone(), sig.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    root.post(
                        &format!("/api/admin/operator-keys/{version}/signatures"),
                        json!({"signature": sig}),
                    )
                    .await
                })
            })
            .collect();
        let mut ok = 0;
        for u in uploads {
            let r = u.await.unwrap();
            match r.status {
                StatusCode::OK => ok += 1,
                StatusCode::CONFLICT => {
                    assert_eq!(r.json()["error"], "already_published", "{}", r.text())
                }
                other => panic!("{other}: {}", r.text()),
            }
        }
        assert_eq!(ok, 1, "version {version}: exactly one publish wins");
        assert_eq!(
            w.agents.calls(Op::PushKeys).len() - pushes_before,
            w.hosts.len(),
            "version {version}: pushed once to each host"
        );
        let published = w.app.db.published_key_list().await.unwrap().unwrap();
        assert_eq!(published.version, version);
        let publishes = w
            .app
            .db
            .audit_log(1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.action == "operator_keys.publish")
            .count();
        assert_eq!(
            publishes, version as usize,
            "one publish audited per version"
        );
    }
}

with_world!(m10_eight_overlapping_publishes_of_one_version_one_wins_one_push,);
