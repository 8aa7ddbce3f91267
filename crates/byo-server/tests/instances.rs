//! Instances through the API on both backends: SSH keys, the dashboard create (E1), the
//! delete every caller shares (G), notify-stuck-deletes and the heartbeat (133). The hosts'
//! agents are a fake that records every call and answers as told: ok, refuse, hang, 404,
//! or not at all. Every refusal reads the rows back to show nothing changed.

mod support;

use std::collections::HashSet;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use byo_core::keylist_testing::public_key_line;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::Store;
use byo_db::hosts::{AgentTargetRow, NewHost};
use byo_db::vms::VmRow;
use byo_server::agents::AgentWaits;
use byo_server::agents::{AgentError, Gone, HostAgents, HttpAgents};
use byo_server::clock::Clock;
use byo_server::queue::QueueDrain;
use byo_wire::vm::{Advisory, CreateVm, VmAction};
use chrono::{DateTime, TimeDelta, Utc};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use support::agents::{self, FakeAgents, Op};
use support::{Reply, TestApp, User};

/// How the fake hosts behave, in these tests' words; `World::answer_creates` and
/// `answer_deletes` turn it into the fake agent's script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    /// Answers with a refusal (an HTTP error with a reason).
    Refuse,
    /// Never answers: the backend's wait runs out.
    Hang,
    /// The agent's own 404: no such container.
    NotFound,
    /// No connection at all.
    Unreachable,
}

/// Step 84 as a recorder: what the drain would see when it runs.
struct RecordingDrain {
    store: Store,
    /// (gpu_type, host_id, whether that host was pickable when the drain ran)
    calls: Mutex<Vec<(String, String, bool)>>,
}

impl QueueDrain for RecordingDrain {
    fn capacity_freed<'a>(&'a self, gpu_type: &'a str, host_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let pickable = self
                .store
                .pick_hosts_for_gpu(gpu_type, "someone-waiting")
                .await
                .unwrap()
                .iter()
                .any(|h| h.id == host_id);
            self.calls
                .lock()
                .unwrap()
                .push((gpu_type.to_owned(), host_id.to_owned(), pickable));
        })
    }
}

/// The backend's waits in these tests: long enough for the fake, short enough to hang.
const WAIT: Duration = Duration::from_millis(400);

struct World {
    app: TestApp,
    clock: Clock,
    agents: Arc<FakeAgents>,
    drain: Arc<RecordingDrain>,
    owner_sub: String,
    customer: User,
    other: User,
    op: User,
}

/// What a test host is like; the default is one every create may land on.
#[derive(Clone)]
struct Spec {
    gpu_type: &'static str,
    active: bool,
    prepared: bool,
    reachable: bool,
    placement: &'static str,
    dedicated_to: Option<String>,
    retired: bool,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            gpu_type: "spark-1",
            active: true,
            prepared: true,
            reachable: true,
            placement: "shared",
            dedicated_to: None,
            retired: false,
        }
    }
}

struct TestHost {
    id: String,
    token: String,
}

async fn world(backend: byo_db::Backend) -> Option<World> {
    let mut app = TestApp::new(backend).await?;
    let clock = Clock::manual("2026-11-29T12:00:00Z".parse().unwrap());
    let agents = Arc::new(
        FakeAgents::new()
            .with_clock(clock.clone())
            .observing(app.db.store.clone()),
    );
    // A create's GPU check fails, to show it is reported and not fatal (47–48).
    agents.gpu_check(Advisory {
        ok: false,
        detail: Some("nvidia-smi: no devices".into()),
    });
    let drain = Arc::new(RecordingDrain {
        store: app.db.store.clone(),
        calls: Mutex::new(Vec::new()),
    });
    app.state = app
        .state
        .clone()
        .with_clock(clock.clone())
        .with_agents(agents.clone())
        .with_drain(drain.clone())
        .with_waits(AgentWaits {
            create: WAIT,
            delete: WAIT,
        });
    app.router = byo_server::app(app.state.clone());
    let owner_sub = app.community_host("owner@example.com").await.sub;
    let customer = app.customer("customer@example.com").await;
    let other = app.customer("other@example.com").await;
    let op = app.operator("op@example.com").await;
    Some(World {
        app,
        clock,
        agents,
        drain,
        owner_sub,
        customer,
        other,
        op,
    })
}

impl World {
    fn db(&self) -> &Store {
        &self.app.db.store
    }

    /// How the hosts answer creates from now on.
    fn answer_creates(&self, a: Answer) {
        let answer = match a {
            Answer::Ok => agents::Answer::Ok,
            Answer::Refuse => agents::Answer::refused(409, "the relay refused the SSH map: 403"),
            Answer::Hang => agents::Answer::Hang,
            Answer::NotFound => agents::Answer::refused(404, "not found"),
            Answer::Unreachable => {
                agents::Answer::unreachable("could not reach the agent: connection refused")
            }
        };
        self.agents.answer(Op::Create, answer);
    }

    /// How the hosts answer deletes, and power changes (one knob for "how the host
    /// behaves"), from now on.
    fn answer_deletes(&self, a: Answer) {
        let (delete, power) = match a {
            Answer::Ok => (agents::Answer::Ok, agents::Answer::Ok),
            Answer::NotFound => (agents::Answer::NotFound, agents::Answer::Ok),
            Answer::Refuse => (
                agents::Answer::refused(500, "lxd: the instance is busy"),
                agents::Answer::refused(409, "lxd: the instance is busy"),
            ),
            Answer::Hang => (agents::Answer::Hang, agents::Answer::Hang),
            Answer::Unreachable => (
                agents::Answer::unreachable("connection refused"),
                agents::Answer::unreachable("connection refused"),
            ),
        };
        self.agents.answer(Op::Delete, delete);
        self.agents.answer(Op::Power, power);
    }

    /// A host as `spec` says, built the way onboarding leaves one: tokens from redeem, the
    /// relay from relay-provision, prepared, activated with a placement.
    async fn host(&self, slug: &str, spec: Spec) -> TestHost {
        let now = self.clock.now();
        let id = self
            .db()
            .insert_host(
                NewHost {
                    slug,
                    owner_sub: &self.owner_sub,
                    profile_id: "gb10-spark-1",
                    gpu_type: spec.gpu_type,
                },
                now,
            )
            .await
            .unwrap()
            .id;
        let token = SecretToken::generate(TokenKind::Host);
        if spec.reachable {
            let agent = SecretToken::generate(TokenKind::Agent);
            let sealed = self.app.state.sealer.as_ref().unwrap().seal(agent.expose());
            self.db()
                .execute_unchecked(&format!(
                    "update hosts set token_hash = '{}', agent_token = '{sealed}' where id = '{id}'",
                    token.hash().as_str()
                ))
                .await
                .unwrap();
            self.db()
                .record_relay(&id, Some("10.8.0.1"), "ready", None)
                .await
                .unwrap();
        }
        if spec.prepared {
            self.db().mark_host_prepared(&id, now).await.unwrap();
        }
        if spec.active {
            self.db()
                .activate_host(&id, spec.placement, &self.op.sub, now)
                .await
                .unwrap();
        }
        if let Some(user) = &spec.dedicated_to {
            self.db().set_host_dedicated(&id, Some(user)).await.unwrap();
        }
        if spec.retired {
            self.db()
                .execute_unchecked(&format!(
                    "update hosts set active = false, dedicated = false where id = '{id}'"
                ))
                .await
                .unwrap();
            self.db().retire_host(&id, now).await.unwrap();
        }
        TestHost {
            id,
            token: token.expose().to_owned(),
        }
    }

    async fn add_key(&self, user: &User) -> String {
        let r = user
            .post(
                "/api/ssh-keys",
                json!({"name": "laptop", "public_key": public_key_line()}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        r.json()["id"].as_str().unwrap().to_owned()
    }

    async fn create(&self, user: &User, gpu_type: &str, key: &str) -> Reply {
        user.post("/api/vms", json!({"gpu_type": gpu_type, "ssh_key_id": key}))
            .await
    }

    /// A running instance of the customer's on whichever host is free.
    async fn running(&self) -> VmRow {
        let key = self.add_key_once(&self.customer).await;
        let r = self.create(&self.customer, "spark-1", &key).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        let id = r.json()["instance"]["id"].as_str().unwrap().to_owned();
        let row = self.vm(&id).await;
        assert_eq!(row.status, "running");
        row
    }

    async fn add_key_once(&self, user: &User) -> String {
        let list = user.get("/api/ssh-keys").await.json();
        match list.as_array().unwrap().first() {
            Some(k) => k["id"].as_str().unwrap().to_owned(),
            None => self.add_key(user).await,
        }
    }

    async fn vm(&self, id: &str) -> VmRow {
        self.db().vm(id).await.unwrap().unwrap()
    }

    async fn delete(&self, user: &User, vm_id: &str) -> Reply {
        user.delete(&format!("/api/vms/{vm_id}")).await
    }

    async fn admin_delete(&self, user: &User, vm_id: &str) -> Reply {
        user.post_empty(&format!("/api/admin/vms/{vm_id}/delete"))
            .await
    }

    async fn audits(&self, action: &str) -> Vec<byo_db::audit::AuditRow> {
        self.db()
            .audit_log(1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.action == action)
            .collect()
    }

    async fn all_vms(&self) -> Vec<VmRow> {
        let mut out = Vec::new();
        for u in self.db().users_overview().await.unwrap() {
            out.extend(
                self.db()
                    .vms_of(&u.user.sub, DateTime::<Utc>::UNIX_EPOCH)
                    .await
                    .unwrap(),
            );
        }
        out
    }

    async fn stuck_list(&self) -> Reply {
        self.op.get("/api/admin/stuck-deletes").await
    }

    async fn pickable(&self, host_id: &str) -> bool {
        self.db()
            .pick_hosts_for_gpu("spark-1", &self.other.sub)
            .await
            .unwrap()
            .iter()
            .any(|h| h.id == host_id)
    }
}

// ---------------------------------------------------------------- SSH keys

async fn ssh_keys_are_checked_kept_once_and_private_to_their_user(w: World) {
    let key = public_key_line();
    async fn add(user: &User, body: Value) -> Reply {
        user.post("/api/ssh-keys", body).await
    }
    let r = add(
        &w.customer,
        json!({"name": "laptop", "public_key": format!("{key} me@laptop")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let k = r.json();
    assert!(k["fingerprint"].as_str().unwrap().starts_with("SHA256:"));
    let id = k["id"].as_str().unwrap().to_owned();

    // The same key again (another comment, another name) is the same key.
    let r = add(
        &w.customer,
        json!({"name": "again", "public_key": format!("{key} other-comment")}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("duplicate_key"))
    );
    // Not a key, options in front, two keys, no name: refused.
    for body in [
        json!({"name": "x", "public_key": "ssh-ed25519 AAAAnotbase64"}),
        json!({"name": "x", "public_key": format!("command=\"/bin/sh\" {}", public_key_line())}),
        json!({"name": "x", "public_key": format!("{}\n{}", public_key_line(), public_key_line())}),
        json!({"name": " ", "public_key": public_key_line()}),
    ] {
        let r = add(&w.customer, body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
    }
    let mine = w.db().ssh_keys_of(&w.customer.sub).await.unwrap();
    assert_eq!(mine.len(), 1, "refusals kept nothing");

    // Another user may hold the same key; each sees only their own.
    assert_eq!(
        add(&w.other, json!({"name": "shared", "public_key": key}))
            .await
            .status,
        StatusCode::CREATED
    );
    let theirs = w.other.get("/api/ssh-keys").await.json();
    assert_eq!(theirs.as_array().unwrap().len(), 1);
    assert_ne!(theirs[0]["id"], id);
    // Deleting someone else's key is a 404, and it stays.
    let r = w.other.delete(&format!("/api/ssh-keys/{id}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(w.db().ssh_keys_of(&w.customer.sub).await.unwrap().len(), 1);
    let r = w.customer.delete(&format!("/api/ssh-keys/{id}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(
        w.db()
            .ssh_keys_of(&w.customer.sub)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(w.db().ssh_keys_of(&w.other.sub).await.unwrap().len(), 1);
}

// ---------------------------------------------------------------- E1

async fn e1_create_stamps_created_at_before_the_host_is_contacted(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let key = w.add_key(&w.customer).await;
    let committed = w.clock.now();
    // The host takes a while: the clock moves on while it works.
    w.agents.takes(Op::Create, TimeDelta::seconds(40));
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let body = r.json();
    let id = body["instance"]["id"].as_str().unwrap();

    let calls = w.agents.calls(Op::Create);
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.host_id, host.id);
    assert_eq!(call.at, committed);
    // When the host was contacted, the row was already there: host, name and SSH name
    // written together, created_at stamped.
    let at_contact = call.row.as_ref().expect("the row precedes dispatch");
    assert_eq!(at_contact.id, id);
    assert_eq!(at_contact.host_id.as_deref(), Some(host.id.as_str()));
    assert_eq!(at_contact.created_at, committed);
    assert_eq!(at_contact.status, "creating");
    assert_eq!(
        at_contact.ssh_hostname.as_deref(),
        Some(format!("{}.spark-1.ssh.localhost", call.name).as_str())
    );

    let row = w.vm(id).await;
    assert_eq!(
        row.created_at, committed,
        "billing runs from the commitment"
    );
    assert!(w.clock.now() > committed);
    assert_eq!(
        (row.status.as_str(), row.ssh_port, row.creation_failed_at),
        ("running", Some(2201), None)
    );
    // The advisories are reported, not fatal (47–48).
    assert_eq!(body["gpu_check"]["ok"], false);
    assert_eq!(body["instance"]["status"], "running");
    assert_eq!(
        body["instance"]["ssh_hostname"].as_str(),
        row.ssh_hostname.as_deref()
    );
    // The customer sees it; nobody else does.
    let mine = w.customer.get("/api/vms").await.json();
    assert_eq!(mine.as_array().unwrap().len(), 1);
    assert_eq!(
        w.customer.get(&format!("/api/vms/{id}")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        w.other.get(&format!("/api/vms/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
    assert!(
        w.other
            .get("/api/vms")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
}

async fn e1_a_host_holding_a_live_row_is_never_picked(w: World) {
    // Every host that must never be picked.
    let never = [
        (
            "spark-1",
            Spec {
                active: false,
                ..Spec::default()
            },
        ),
        (
            "spark-2",
            Spec {
                active: false,
                prepared: false,
                ..Spec::default()
            },
        ),
        (
            "spark-3",
            Spec {
                retired: true,
                ..Spec::default()
            },
        ),
        (
            "spark-4",
            Spec {
                gpu_type: "spark-2",
                ..Spec::default()
            },
        ),
        (
            "spark-5",
            Spec {
                reachable: false,
                ..Spec::default()
            },
        ),
        (
            "spark-6",
            Spec {
                placement: "owner-pool",
                ..Spec::default()
            },
        ),
        (
            "spark-7",
            Spec {
                dedicated_to: Some(w.other.sub.clone()),
                ..Spec::default()
            },
        ),
    ];
    for (slug, spec) in never {
        w.host(slug, spec).await;
    }
    let key = w.add_key(&w.customer).await;
    let audits_before = w.db().audit_log(1000).await.unwrap().len();
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("no_capacity")),
        "{}",
        r.text()
    );
    assert!(r.text().contains("nothing was created"));
    assert!(w.all_vms().await.is_empty(), "nothing was written");
    assert_eq!(w.db().audit_log(1000).await.unwrap().len(), audits_before);
    assert!(
        w.agents.calls(Op::Create).is_empty(),
        "no host was contacted"
    );

    // A dedicated host serves its own user, first.
    let other_key = w.add_key(&w.other).await;
    let r = w.create(&w.other, "spark-1", &other_key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let dedicated = w
        .db()
        .host(&w.agents.calls(Op::Create)[0].host_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dedicated.slug, "spark-7");

    // One free shared host: the first create takes it, and while its row is live the
    // host is never picked again.
    let free = w.host("spark-8", Spec::default()).await;
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let first = r.json()["instance"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        w.vm(&first).await.host_id.as_deref(),
        Some(free.id.as_str())
    );
    assert!(!w.pickable(&free.id).await);
    let live_before = w.all_vms().await.len();
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("no_capacity"))
    );
    assert_eq!(w.all_vms().await.len(), live_before, "nothing was written");
    assert_eq!(w.agents.calls(Op::Create).len(), 2);

    // The rule binds every writer: a second live row on that host is refused by the schema.
    let err = w
        .db()
        .create_vm(
            byo_db::vms::NewVm {
                user_sub: &w.customer.sub,
                host_id: Some(&free.id),
                name: "vm-intruder",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            w.clock.now(),
        )
        .await
        .unwrap_err();
    assert!(err.is_constraint("vms_one_live_per_host"), "{err:?}");

    // Deleted, the host is free again.
    assert_eq!(w.delete(&w.customer, &first).await.status, StatusCode::OK);
    assert!(w.pickable(&free.id).await);
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
}

async fn e1_refusals_before_any_host_write_nothing(w: World) {
    w.host("spark-1", Spec::default()).await;
    let theirs = w.add_key(&w.other).await;
    let mine = w.add_key(&w.customer).await;
    for (key, gpu, code) in [
        (theirs.as_str(), "spark-1", "unknown_ssh_key"),
        ("no-such-key", "spark-1", "unknown_ssh_key"),
        (mine.as_str(), "Spark 1; drop", "invalid_gpu_type"),
    ] {
        let r = w.create(&w.customer, gpu, key).await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code))
        );
    }
    assert!(w.all_vms().await.is_empty());
    assert!(w.agents.calls(Op::Create).is_empty());
    assert!(w.audits("vm.create").await.is_empty());
}

async fn e1_a_host_that_never_answers_marks_creation_failed_and_bills_nothing(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let key = w.add_key(&w.customer).await;
    for (answer, status, code) in [
        (
            Answer::Hang,
            StatusCode::GATEWAY_TIMEOUT,
            "host_unreachable",
        ),
        (
            Answer::Unreachable,
            StatusCode::GATEWAY_TIMEOUT,
            "host_unreachable",
        ),
        (Answer::Refuse, StatusCode::BAD_GATEWAY, "host_refused"),
    ] {
        w.answer_creates(answer);
        w.clock.advance(TimeDelta::minutes(1));
        let started = w.clock.now();
        // While the host is still working on it, the instance cannot be deleted.
        let meanwhile = async {
            if answer != Answer::Hang {
                return;
            }
            tokio::time::sleep(WAIT / 4).await;
            let creating = w
                .all_vms()
                .await
                .into_iter()
                .find(|v| v.status == "creating");
            let creating = creating.expect("the row is written while the host works");
            let r = w.delete(&w.customer, &creating.id).await;
            assert_eq!(
                (r.status, r.json()["error"].as_str()),
                (StatusCode::CONFLICT, Some("still_creating"))
            );
            assert_eq!(w.vm(&creating.id).await.delete_requested_at, None);
        };
        let (r, ()) = tokio::join!(w.create(&w.customer, "spark-1", &key), meanwhile);
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (status, Some(code)),
            "{answer:?}: {}",
            r.text()
        );
        assert!(r.text().contains("nothing is billed"), "{}", r.text());
        if answer == Answer::Refuse {
            assert!(
                r.text().contains("the relay refused the SSH map: 403"),
                "the agent's reason reaches the customer: {}",
                r.text()
            );
        }
        let call = w.agents.calls(Op::Create).pop().unwrap();
        let row = w
            .all_vms()
            .await
            .into_iter()
            .find(|v| v.name == call.name)
            .expect("the row was written before dispatch");
        assert_eq!(row.created_at, started);
        assert_eq!(row.creation_failed_at, Some(w.clock.now()));
        assert_eq!((row.status.as_str(), row.deleted_at), ("failed", None));
        // Not live: the host is free again, and the failure is the customer's to see.
        assert!(w.pickable(&host.id).await, "{answer:?}");
        let listed = w.customer.get("/api/vms").await.json();
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["id"] == row.id.as_str() && v["status"] == "failed")
        );
        // There is nothing to delete, and trying writes nothing.
        let r = w.delete(&w.customer, &row.id).await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (StatusCode::CONFLICT, Some("never_created"))
        );
        assert_eq!(w.vm(&row.id).await.delete_requested_at, None);
    }
    assert!(w.agents.calls(Op::Delete).is_empty());
    assert_eq!(w.audits("vm.creation_failed").await.len(), 3);

    // The host that failed is picked for the next create, which works.
    w.answer_creates(Answer::Ok);
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(w.agents.calls(Op::Create).pop().unwrap().host_id, host.id);
}

// ---------------------------------------------------------------- G

async fn g_delete_writes_two_facts_and_closes_only_when_confirmed(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;

    // The host refuses: the delete is recorded, the row stays live.
    w.answer_deletes(Answer::Refuse);
    w.clock.advance(TimeDelta::minutes(5));
    let requested = w.clock.now();
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let body = r.json();
    assert_eq!(body["state"], "requested");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("the instance is busy")
    );
    let row = w.vm(&vm.id).await;
    assert_eq!(row.delete_requested_at, Some(requested));
    assert_eq!((row.deleted_at, row.status.as_str()), (None, "running"));
    assert!(
        !w.pickable(&host.id).await,
        "the capacity really is still held"
    );
    assert!(w.drain.calls.lock().unwrap().is_empty(), "nothing drains");
    // When the host was asked, the first fact was already written and the second was not.
    let call = w.agents.calls(Op::Delete).pop().unwrap();
    let at_call = call.row.unwrap();
    assert_eq!(
        (at_call.delete_requested_at, at_call.deleted_at),
        (Some(requested), None)
    );

    // Asked again, the host confirms: the row closes, the first fact is kept.
    w.answer_deletes(Answer::Ok);
    w.clock.advance(TimeDelta::minutes(2));
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["state"], "deleted");
    let row = w.vm(&vm.id).await;
    assert_eq!(
        row.delete_requested_at,
        Some(requested),
        "the refund is sized from here"
    );
    assert_eq!(row.deleted_at, Some(w.clock.now()), "billing stops here");
    assert_eq!(row.status, "deleted");
    assert!(w.pickable(&host.id).await);
    assert!(w.agents.containers().is_empty());

    // Step 83 before step 84: when the drain ran, the freed host was already pickable.
    let drained = w.drain.calls.lock().unwrap().clone();
    assert_eq!(drained, vec![("spark-1".to_owned(), host.id.clone(), true)]);
}

async fn g_a_404_confirms(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    // The container went away and the agent's own write never landed: the orphan case.
    w.answer_deletes(Answer::NotFound);
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let row = w.vm(&vm.id).await;
    assert!(row.delete_requested_at.is_some() && row.deleted_at.is_some());
    assert!(w.pickable(&host.id).await);
    let confirmed = w.audits("vm.deleted").await;
    assert_eq!(confirmed.len(), 1);
    assert_eq!(confirmed[0].details.0["confirmed_by"], "not_found");
}

/// Start, stop, reboot: the row moves only once the host carried it out; every refusal
/// changes nothing.
async fn e1_power_changes_reach_the_host_and_move_the_row_only_when_done(w: World) {
    w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    let power = |user: User, action: &'static str| {
        let path = format!("/api/vms/{}/state", vm.id);
        async move { user.post(&path, json!({"action": action})).await }
    };
    let r = power(w.customer.clone(), "stop").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["status"], "stopped");
    assert_eq!(w.vm(&vm.id).await.status, "stopped");
    assert_eq!(w.agents.calls(Op::Power).len(), 1);
    let r = power(w.customer.clone(), "start").await;
    assert_eq!(
        (r.status, w.vm(&vm.id).await.status),
        (StatusCode::OK, "running".to_owned())
    );
    // The page's buttons go the same way.
    let page = w.customer.page("/instances").await;
    assert!(page.contains(&format!("/instances/{}/state", vm.id)) && page.contains(">Stop<"));
    let r = w
        .customer
        .post_form(
            &format!("/instances/{}/state", vm.id),
            &[("action", "stop")],
        )
        .await;
    assert!(location(&r).starts_with("/instances"));
    assert_eq!(w.vm(&vm.id).await.status, "stopped");
    assert!(w.customer.page("/instances").await.contains(">Start<"));
    let r = power(w.customer.clone(), "start").await;
    assert_eq!(r.status, StatusCode::OK);

    // Refusals: someone else's (404, host not asked), a host that refuses (502) or is silent
    // (504): the row keeps its status.
    let asked = w.agents.calls(Op::Power).len();
    let r = power(w.other.clone(), "stop").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        w.agents.calls(Op::Power).len(),
        asked,
        "the host was asked for someone else"
    );
    w.answer_deletes(Answer::Refuse);
    let r = power(w.customer.clone(), "stop").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert!(r.json()["message"].as_str().unwrap().contains("busy"));
    w.answer_deletes(Answer::Unreachable);
    let r = power(w.customer.clone(), "reboot").await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.text());
    assert_eq!(w.vm(&vm.id).await.status, "running");
    let r = power(w.customer.clone(), "hibernate").await;
    assert!(r.status.is_client_error());

    // A deleted instance cannot be started again.
    w.answer_deletes(Answer::Ok);
    assert_eq!(w.delete(&w.customer, &vm.id).await.status, StatusCode::OK);
    let r = power(w.customer.clone(), "start").await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(w.vm(&vm.id).await.status, "deleted");
}

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

async fn g_a_delete_that_times_out_stays_requested_and_is_listed_as_stuck(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    w.answer_deletes(Answer::Hang);
    let requested = w.clock.now();
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let body = r.json();
    assert_eq!(body["state"], "requested");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no answer within"),
        "{body}"
    );
    assert_eq!(body["instance"]["deleted_at"], Value::Null);
    let row = w.vm(&vm.id).await;
    assert_eq!(
        (row.delete_requested_at, row.deleted_at),
        (Some(requested), None)
    );
    assert!(
        !w.pickable(&host.id).await,
        "still occupied: the honest state"
    );

    // Not yet stuck; after ten minutes it is, to the operator's list and the sweep.
    assert!(w.stuck_list().await.json().as_array().unwrap().is_empty());
    let all =
        w.op.get("/api/admin/stuck-deletes?older_than_minutes=0")
            .await
            .json();
    assert_eq!(
        all.as_array().unwrap().len(),
        1,
        "every delete waiting, on request"
    );
    w.clock.advance(TimeDelta::minutes(11));
    let r = w.stuck_list().await;
    assert_eq!(r.status, StatusCode::OK);
    let stuck = r.json();
    assert_eq!(stuck.as_array().unwrap().len(), 1, "{stuck}");
    assert_eq!(stuck[0]["vm_id"], vm.id.as_str());
    assert_eq!(stuck[0]["host_slug"], "spark-1");
    assert_eq!(stuck[0]["waiting_minutes"], 11);
    assert_eq!(
        stuck[0]["delete_requested_at"]
            .as_str()
            .map(|s| s.parse::<DateTime<Utc>>().unwrap()),
        Some(requested)
    );
    assert_eq!(
        w.customer.get("/api/admin/stuck-deletes").await.status,
        StatusCode::FORBIDDEN
    );

    // The scheduled sweep warns about it, naming the instance, the host and the wait.
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let found = {
        let _guard = tracing::subscriber::set_default(subscriber);
        byo_server::app::notify_stuck_deletes::notify_once(&w.app.state)
            .await
            .unwrap()
    };
    assert_eq!(found.len(), 1);
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("WARN"), "{logged}");
    assert!(logged.contains("stuck delete"), "{logged}");
    assert!(logged.contains(&vm.id), "{logged}");
    assert!(logged.contains("host=spark-1"), "{logged}");
    assert!(logged.contains("waiting_minutes=11"), "{logged}");

    // Asked again, the host answers: the row closes and it leaves the list.
    w.answer_deletes(Answer::Ok);
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(w.vm(&vm.id).await.delete_requested_at, Some(requested));
    assert!(w.stuck_list().await.json().as_array().unwrap().is_empty());
    assert!(
        byo_server::app::notify_stuck_deletes::notify_once(&w.app.state)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn g_both_writes_are_guarded(w: World) {
    w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK);
    let closed = w.vm(&vm.id).await;

    // A second delete, and an operator's, change nothing and do not bother the host.
    w.clock.advance(TimeDelta::minutes(3));
    for r in [
        w.delete(&w.customer, &vm.id).await,
        w.admin_delete(&w.op, &vm.id).await,
    ] {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["message"], "this instance is already deleted");
    }
    let again = w.vm(&vm.id).await;
    assert_eq!(
        (again.delete_requested_at, again.deleted_at),
        (closed.delete_requested_at, closed.deleted_at)
    );
    assert_eq!(w.agents.calls(Op::Delete).len(), 1);

    // Concurrent deletes from both callers: each fact is written once.
    let vm = w.running().await;
    w.agents.delay(Op::Delete, Duration::from_millis(100));
    let (a, b, c, d) = tokio::join!(
        w.delete(&w.customer, &vm.id),
        w.delete(&w.customer, &vm.id),
        w.admin_delete(&w.op, &vm.id),
        w.admin_delete(&w.op, &vm.id),
    );
    for r in [a, b, c, d] {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let requested: Vec<_> = w
        .audits("vm.delete_requested")
        .await
        .into_iter()
        .filter(|a| a.target.as_deref() == Some(vm.id.as_str()))
        .collect();
    let deleted: Vec<_> = w
        .audits("vm.deleted")
        .await
        .into_iter()
        .filter(|a| a.target.as_deref() == Some(vm.id.as_str()))
        .collect();
    assert_eq!((requested.len(), deleted.len()), (1, 1));
    let row = w.vm(&vm.id).await;
    assert_eq!(row.delete_requested_at, Some(requested[0].at));
    assert_eq!(row.deleted_at, Some(deleted[0].at));
    assert_eq!(
        w.drain.calls.lock().unwrap().len(),
        2,
        "one drain per closed row"
    );

    // And at the store: a later write of either fact is a no-op.
    let later = w.clock.now() + TimeDelta::hours(1);
    assert_eq!(
        w.db().request_vm_delete(&vm.id, later).await.unwrap(),
        byo_db::GuardedWrite::AlreadySet
    );
    assert_eq!(
        w.db().confirm_vm_deleted(&vm.id, later).await.unwrap(),
        byo_db::GuardedWrite::AlreadySet
    );
    let unchanged = w.vm(&vm.id).await;
    assert_eq!(
        (unchanged.delete_requested_at, unchanged.deleted_at),
        (row.delete_requested_at, row.deleted_at)
    );
}

async fn g_admin_vm_action_uses_the_same_path(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;

    // Only an operator may use it; the customer's own route is theirs alone.
    for (user, status) in [
        (&w.customer, StatusCode::FORBIDDEN),
        (&w.other, StatusCode::FORBIDDEN),
    ] {
        assert_eq!(w.admin_delete(user, &vm.id).await.status, status);
    }
    assert_eq!(
        w.delete(&w.other, &vm.id).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(w.delete(&w.op, &vm.id).await.status, StatusCode::NOT_FOUND);
    let row = w.vm(&vm.id).await;
    assert_eq!((row.delete_requested_at, row.deleted_at), (None, None));
    assert!(w.agents.calls(Op::Delete).is_empty());

    // Not confirmed in time: the same 202, the same first fact, the same live row.
    w.answer_deletes(Answer::Hang);
    let requested = w.clock.now();
    let r = w.admin_delete(&w.op, &vm.id).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let row = w.vm(&vm.id).await;
    assert_eq!(
        (row.delete_requested_at, row.deleted_at),
        (Some(requested), None)
    );
    let audit = w.audits("vm.delete_requested").await;
    assert_eq!(audit[0].actor_sub.as_deref(), Some(w.op.sub.as_str()));
    assert_eq!(audit[0].details.0["by"], "operator");

    // Confirmed: the operator's caller owns the second edge too (G.7).
    w.answer_deletes(Answer::Ok);
    w.clock.advance(TimeDelta::seconds(30));
    let r = w.admin_delete(&w.op, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let row = w.vm(&vm.id).await;
    assert_eq!(row.delete_requested_at, Some(requested));
    assert_eq!(row.deleted_at, Some(w.clock.now()));
    let calls = w.agents.calls(Op::Delete);
    assert_eq!(calls.len(), 2);
    assert!(
        calls
            .iter()
            .all(|c| c.host_id == host.id && c.name == vm.name)
    );
    assert_eq!(
        w.drain.calls.lock().unwrap().clone(),
        vec![("spark-1".to_owned(), host.id.clone(), true)]
    );
    assert_eq!(
        w.admin_delete(&w.op, "no-such-vm").await.status,
        StatusCode::NOT_FOUND
    );
}

// ---------------------------------------------------------------- 133

fn beat() -> Value {
    json!({
        "agent_version": "0.1.0", "lxd": "ok", "relay": "ok", "tunnel": "unknown",
        "gpu": "degraded", "storage": "ok", "instances": 1,
        "details": {"relay_map": "rewritten"}
    })
}

async fn heartbeat(w: &World, auth: Option<&str>, body: &str) -> Reply {
    let mut req =
        Request::post("/api/host/heartbeat").header(header::CONTENT_TYPE, "application/json");
    if let Some(a) = auth {
        req = req.header(header::AUTHORIZATION, a);
    }
    w.app
        .send(req.body(Body::from(body.to_owned())).unwrap())
        .await
}

async fn heartbeat_upserts_host_status_and_refuses_unknown_tokens_identically(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let retired = w
        .host(
            "spark-2",
            Spec {
                retired: true,
                ..Spec::default()
            },
        )
        .await;
    let bearer = |t: &str| format!("Bearer {t}");

    let first = w.clock.now();
    let r = heartbeat(&w, Some(&bearer(&host.token)), &beat().to_string()).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let s = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!(s.seen_at, first, "seen_at is the backend's clock");
    assert_eq!(
        (
            s.lxd.as_deref(),
            s.gpu.as_deref(),
            s.tunnel.as_deref(),
            s.instances
        ),
        (Some("ok"), Some("degraded"), Some("unknown"), Some(1))
    );
    assert_eq!(s.details.0["relay_map"], "rewritten");

    // The next beat replaces it: one row per host.
    w.clock.advance(TimeDelta::seconds(30));
    let mut next = beat();
    next["lxd"] = json!("down");
    next["instances"] = json!(0);
    next["agent_version"] = json!("0.1.1");
    let r = heartbeat(&w, Some(&bearer(&host.token)), &next.to_string()).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let s = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!(s.seen_at, w.clock.now());
    assert_eq!(
        (s.lxd.as_deref(), s.instances, s.agent_version.as_deref()),
        (Some("down"), Some(0), Some("0.1.1"))
    );

    // Whatever is wrong with the credential, one answer — and with a bad body too.
    let unknown = SecretToken::generate(TokenKind::Host);
    let agent_token = SecretToken::generate(TokenKind::Agent);
    let mut answers = HashSet::new();
    let good = beat().to_string();
    for auth in [
        None,
        Some("Bearer".to_owned()),
        Some(bearer("byo_hst_garbage")),
        Some(bearer(unknown.expose())),
        Some(bearer(agent_token.expose())),
        Some(bearer(&retired.token)),
    ] {
        for body in [good.as_str(), "{not json", r#"{"agent_version": ""}"#] {
            let r = heartbeat(&w, auth.as_deref(), body).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{auth:?} {body}");
            answers.insert(r.body);
        }
    }
    assert_eq!(answers.len(), 1, "one identical 401 for every refusal");
    // The host-report refusal is the same answer.
    let report = w
        .app
        .send(
            Request::post("/api/host/report")
                .header(header::AUTHORIZATION, bearer(unknown.expose()))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{}"))
                .unwrap(),
        )
        .await;
    assert!(answers.contains(&report.body));
    assert!(w.db().host_status(&retired.id).await.unwrap().is_none());

    // A live host with a body it cannot use is told so, and nothing changes.
    let before = w.db().host_status(&host.id).await.unwrap().unwrap();
    w.clock.advance(TimeDelta::seconds(30));
    for body in [
        "{not json".to_owned(),
        json!({"agent_version": "", "lxd": "ok", "relay": "ok", "tunnel": "ok", "gpu": "ok", "storage": "ok", "instances": 0}).to_string(),
        {
            let mut b = beat();
            b["details"] = json!("a string");
            b.to_string()
        },
        {
            let mut b = beat();
            b["lxd"] = json!("splendid");
            b.to_string()
        },
    ] {
        let r = heartbeat(&w, Some(&bearer(&host.token)), &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
    }
    let after = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!((after.seen_at, after.lxd), (before.seen_at, before.lxd));
}

// ---------------------------------------------------------------- the pages

/// The text of the first `<p class="{class}" …>` on a page, unescaped.
fn paragraph(page: &str, class: &str) -> Option<String> {
    let start = page.find(&format!("<p class=\"{class}\""))?;
    let rest = &page[start..];
    let text = &rest[rest.find('>')? + 1..rest.find("</p>")?];
    Some(
        text.replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

fn alert(page: &str) -> Option<String> {
    paragraph(page, "error")
}

fn notice(page: &str) -> Option<String> {
    paragraph(page, "notice")
}

/// The table row with this id (`instance-…`, `stuck-…`), or None.
fn row<'a>(page: &'a str, id: &str) -> Option<&'a str> {
    let start = page.find(&format!("<tr id=\"{id}\""))?;
    let rest = &page[start..];
    Some(&rest[..rest.find("</tr>")?])
}

fn location(r: &Reply) -> String {
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    r.headers[header::LOCATION].to_str().unwrap().to_owned()
}

impl World {
    async fn create_on_page(&self, user: &User, gpu_type: &str, key: &str) -> Reply {
        user.post_form("/instances", &[("gpu_type", gpu_type), ("ssh_key_id", key)])
            .await
    }

    /// Nothing live, nothing contacted since `calls` create calls, no new audit entry.
    async fn nothing_created(&self, calls: usize, audits: usize) {
        assert!(
            self.all_vms()
                .await
                .iter()
                .all(|v| v.creation_failed_at.is_some() || v.deleted_at.is_some()),
            "nothing live"
        );
        assert_eq!(self.agents.calls(Op::Create).len(), calls, "no host asked");
        assert_eq!(self.audits("vm.create").await.len(), audits);
    }
}

/// The customer's page: every refusal (a bad or duplicate key, no key, someone else's key,
/// no free host, a host that never answers or refuses, someone else's instance) comes back
/// as the API's own message on the page, with the API's status, and changes nothing; an
/// accepted create shows the exact ssh command; the delete has a confirmation step that
/// changes nothing, and a delete the host does not confirm shows as deleting, not gone.
async fn pages_show_each_refusal_in_place_and_change_nothing(w: World) {
    let page = w.customer.page("/instances").await;
    for kind in ["spark-1", "spark-2", "spark-4"] {
        assert!(
            page.contains(&format!("<option value=\"{kind}\"")),
            "{kind}"
        );
    }
    assert!(!page.contains("linux-test"), "staff only");
    assert!(page.contains("Add an SSH key first"));
    let staff = w.op.page("/instances").await;
    assert!(staff.contains("<option value=\"linux-test\""));
    let home = w.customer.page("/").await;
    assert!(home.contains("href=\"/instances\""), "linked from home");

    // No key yet: refused on the page; no row, no host asked.
    let host = w.host("spark-1", Spec::default()).await;
    let r = w.create_on_page(&w.customer, "spark-1", "").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("you have no SSH key with that id")
    );
    assert!(r.text().contains("<h1>Your instances</h1>"), "on the page");
    w.nothing_created(0, 0).await;

    // Keys: a bad one is refused with the reason, and what was typed is kept.
    let r = w
        .customer
        .post_form(
            "/instances/ssh-keys",
            &[
                ("name", "laptop"),
                ("public_key", "ssh-ed25519 AAAAnotbase64"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(
        alert(&r.text())
            .unwrap()
            .starts_with("that is not an OpenSSH public key"),
        "{}",
        r.text()
    );
    assert!(r.text().contains(">ssh-ed25519 AAAAnotbase64</textarea>"));
    assert!(
        w.db()
            .ssh_keys_of(&w.customer.sub)
            .await
            .unwrap()
            .is_empty()
    );
    let line = format!("{} me@laptop", public_key_line());
    let r = w
        .customer
        .post_form(
            "/instances/ssh-keys",
            &[("name", "laptop"), ("public_key", &line)],
        )
        .await;
    assert_eq!(location(&r), "/instances");
    let keys = w.db().ssh_keys_of(&w.customer.sub).await.unwrap();
    assert_eq!(keys.len(), 1);
    let key = &keys[0];
    let page = w.customer.page("/instances").await;
    let listed = row(&page, &format!("key-{}", key.id)).expect("the key is listed");
    assert!(listed.contains("laptop") && listed.contains(&key.fingerprint));
    assert!(!page.contains("Add an SSH key first"));
    // The same key again: refused, still one.
    let r = w
        .customer
        .post_form(
            "/instances/ssh-keys",
            &[("name", "again"), ("public_key", &line)],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(
        alert(&r.text())
            .unwrap()
            .starts_with("you already have this key")
    );
    // Someone else removing it: told there is no such key; it stays.
    let r = w
        .other
        .post_form(&format!("/instances/ssh-keys/{}/remove", key.id), &[])
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("you have no SSH key with that id")
    );
    assert_eq!(w.db().ssh_keys_of(&w.customer.sub).await.unwrap().len(), 1);

    // Someone else's key answers like no key.
    let theirs = w.add_key(&w.other).await;
    let r = w.create_on_page(&w.customer, "spark-1", &theirs).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("you have no SSH key with that id")
    );
    w.nothing_created(0, 0).await;

    // No free host of that kind; the form keeps the choices.
    let r = w.create_on_page(&w.customer, "spark-2", &key.id).await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("no spark-2 host is free right now; nothing was created and nothing is billed")
    );
    assert!(r.text().contains("<option value=\"spark-2\" selected>"));
    w.nothing_created(0, 0).await;

    // A host that never answers, or refuses: its reason, nothing live, the host free.
    for (n, (answer, status, reason)) in [
        (
            Answer::Unreachable,
            StatusCode::GATEWAY_TIMEOUT,
            "the host did not answer (could not reach the agent: connection refused)",
        ),
        (
            Answer::Hang,
            StatusCode::GATEWAY_TIMEOUT,
            "the host did not answer (no answer in time)",
        ),
        (
            Answer::Refuse,
            StatusCode::BAD_GATEWAY,
            "the host refused the instance: the relay refused the SSH map: 403",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        w.answer_creates(answer);
        let r = w.create_on_page(&w.customer, "spark-1", &key.id).await;
        assert_eq!(r.status, status, "{answer:?}: {}", r.text());
        let shown = alert(&r.text()).unwrap();
        assert!(
            shown.starts_with(reason) && shown.ends_with("nothing is billed"),
            "{answer:?}: {shown}"
        );
        w.nothing_created(n + 1, n + 1).await;
        assert!(w.pickable(&host.id).await, "{answer:?}: the host is free");
        let failed = w.agents.calls(Op::Create).pop().unwrap();
        let failed = w
            .all_vms()
            .await
            .into_iter()
            .find(|v| v.name == failed.name);
        let failed = failed.unwrap();
        let listed = row(&r.text(), &format!("instance-{}", failed.id))
            .unwrap()
            .to_owned();
        assert!(listed.contains("failed: never created, not billed"));
        assert!(!listed.contains("ssh root@") && !listed.contains("/delete"));
    }

    // Accepted: back to the list, which shows the exact command.
    w.answer_creates(Answer::Ok);
    let r = w.create_on_page(&w.customer, "spark-1", &key.id).await;
    let to = location(&r);
    let id = to.strip_prefix("/instances#instance-").unwrap().to_owned();
    let vm = w.vm(&id).await;
    assert_eq!(vm.status, "running");
    let page = w.customer.page("/instances").await;
    let listed = row(&page, &format!("instance-{id}")).unwrap();
    let command = format!("ssh root@{}", vm.ssh_hostname.as_deref().unwrap());
    assert!(
        listed.contains(&format!("<code id=\"ssh-{id}\">{command}</code>")),
        "{listed}"
    );
    assert!(listed.contains(&format!("data-copy=\"ssh-{id}\"")));
    assert!(listed.contains("<td class=\"status\">running</td>"));
    assert!(listed.contains(&format!("href=\"/instances/{id}/delete\"")));

    // The confirmation step asks, and changes nothing.
    let confirm = w.customer.page(&format!("/instances/{id}/delete")).await;
    assert!(confirm.contains(&format!("action=\"/instances/{id}/delete\"")));
    assert!(confirm.contains(&format!("Yes, delete {}", vm.name)));
    assert_eq!(w.vm(&id).await.delete_requested_at, None);
    // Someone else's instance: not found, on both steps; nothing changes.
    let r = w.other.get(&format!("/instances/{id}/delete")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = w
        .other
        .post_form(&format!("/instances/{id}/delete"), &[])
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("you have no instance with that id")
    );
    assert_eq!(w.vm(&id).await.delete_requested_at, None);
    assert!(w.agents.calls(Op::Delete).is_empty());

    // The host does not confirm in time: deleting, not gone, and the API's 202.
    w.answer_deletes(Answer::Hang);
    w.clock.advance(TimeDelta::minutes(3));
    let requested = w.clock.now();
    let r = w
        .customer
        .post_form(&format!("/instances/{id}/delete"), &[])
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert!(
        notice(&r.text())
            .unwrap()
            .contains("the host has not confirmed it (no answer within 0 s)"),
        "{}",
        r.text()
    );
    let page = w.customer.page("/instances").await;
    let listed = row(&page, &format!("instance-{id}")).unwrap();
    assert!(
        listed.contains("<td class=\"status\">deleting: waiting for the host to confirm</td>"),
        "{listed}"
    );
    assert!(listed.contains("Delete again"));
    let row_now = w.vm(&id).await;
    assert_eq!(
        (row_now.delete_requested_at, row_now.deleted_at),
        (Some(requested), None)
    );
    assert!(!w.pickable(&host.id).await, "still held");

    // Asked again, confirmed: gone, with its time, and the first request kept.
    w.answer_deletes(Answer::Ok);
    w.clock.advance(TimeDelta::minutes(1));
    let r = w
        .customer
        .post_form(&format!("/instances/{id}/delete"), &[])
        .await;
    assert_eq!(location(&r), format!("/instances#instance-{id}"));
    let closed = w.vm(&id).await;
    assert_eq!(
        (closed.delete_requested_at, closed.deleted_at),
        (Some(requested), Some(w.clock.now()))
    );
    let page = w.customer.page("/instances").await;
    let listed = row(&page, &format!("instance-{id}")).unwrap();
    assert!(listed.contains("<td class=\"status\">deleted</td>"));
    let deleted_at = w
        .clock
        .now()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert!(listed.contains(&format!("<time datetime=\"{deleted_at}\">")));
    assert!(!listed.contains("ssh root@") && !listed.contains("/delete\""));

    // The key goes; the page says there are none.
    let r = w
        .customer
        .post_form(&format!("/instances/ssh-keys/{}/remove", key.id), &[])
        .await;
    assert_eq!(location(&r), "/instances");
    assert!(
        w.db()
            .ssh_keys_of(&w.customer.sub)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        w.customer
            .page("/instances")
            .await
            .contains("Add an SSH key first")
    );
}

/// The operator's page: every live instance with its host and owner; the delete goes
/// through admin-vm-action (audited as the operator's, the same two facts); a delete
/// unconfirmed for ten minutes is listed with how long it has waited, and leaves the list
/// once confirmed; refusals show in place and change nothing; nobody else gets in.
async fn the_operators_page_deletes_through_admin_vm_action_and_lists_stuck_deletes(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.host("spark-2", Spec::default()).await;
    let mine = w.running().await;
    let key = w.add_key(&w.other).await;
    let r = w.create(&w.other, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let theirs = w.vm(r.json()["instance"]["id"].as_str().unwrap()).await;
    let mut slugs = Vec::new();
    for vm in [&mine, &theirs] {
        let host = w.db().host(vm.host_id.as_deref().unwrap()).await.unwrap();
        slugs.push(host.unwrap().slug);
    }
    let (mine_slug, theirs_slug) = (slugs[0].clone(), slugs[1].clone());
    assert_ne!(mine_slug, theirs_slug);

    // Nobody else may see it or use it.
    for user in [&w.customer, &w.other] {
        for r in [
            user.get("/admin/instances").await,
            user.get(&format!("/admin/instances/{}/delete", theirs.id))
                .await,
            user.post_form(&format!("/admin/instances/{}/delete", theirs.id), &[])
                .await,
        ] {
            assert_eq!(r.status, StatusCode::FORBIDDEN);
        }
    }
    assert!(w.agents.calls(Op::Delete).is_empty());
    assert_eq!(w.vm(&theirs.id).await.delete_requested_at, None);

    // Every live instance, with its host's slug and its owner's email.
    let page = w.op.page("/admin/instances").await;
    for (vm, slug, email) in [
        (&mine, &mine_slug, "customer@example.com"),
        (&theirs, &theirs_slug, "other@example.com"),
    ] {
        let listed = row(&page, &format!("instance-{}", vm.id)).unwrap();
        assert!(
            listed.contains(&format!("<td class=\"host\">{slug}</td>"))
                && listed.contains(&format!("<td class=\"owner\">{email}</td>"))
                && listed.contains(&vm.name),
            "{listed}"
        );
    }
    assert!(page.contains("id=\"no-stuck\""));

    // The customer's delete is not confirmed: deleting at once, stuck after ten minutes.
    w.answer_deletes(Answer::Hang);
    let requested = w.clock.now();
    assert_eq!(
        w.delete(&w.customer, &mine.id).await.status,
        StatusCode::ACCEPTED
    );
    w.clock.advance(TimeDelta::minutes(9));
    let page = w.op.page("/admin/instances").await;
    assert!(page.contains("id=\"no-stuck\""), "not yet ten minutes");
    assert!(
        row(&page, &format!("instance-{}", mine.id))
            .unwrap()
            .contains("deleting: waiting for the host to confirm")
    );
    w.clock.advance(TimeDelta::minutes(3));
    let page = w.op.page("/admin/instances").await;
    let stuck = row(&page, &format!("stuck-{}", mine.id)).expect("listed as stuck");
    assert!(
        stuck.contains(&format!("<td class=\"host\">{mine_slug}</td>"))
            && stuck.contains("<td class=\"owner\">customer@example.com</td>")
            && stuck.contains("<td class=\"waiting\">12 min</td>")
            && stuck.contains(&format!(
                "<time datetime=\"{}\">",
                requested.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            )),
        "{stuck}"
    );
    assert!(row(&page, &format!("stuck-{}", theirs.id)).is_none());

    // The operator deletes someone else's instance: a confirmation first, which changes
    // nothing, then admin-vm-action's delete.
    w.answer_deletes(Answer::Ok);
    let confirm =
        w.op.page(&format!("/admin/instances/{}/delete", theirs.id))
            .await;
    assert!(confirm.contains("other@example.com"));
    assert!(confirm.contains(&format!("action=\"/admin/instances/{}/delete\"", theirs.id)));
    assert_eq!(w.vm(&theirs.id).await.delete_requested_at, None);
    let r =
        w.op.post_form(&format!("/admin/instances/{}/delete", theirs.id), &[])
            .await;
    assert_eq!(location(&r), "/admin/instances");
    let closed = w.vm(&theirs.id).await;
    assert_eq!(
        (closed.delete_requested_at, closed.deleted_at),
        (Some(w.clock.now()), Some(w.clock.now()))
    );
    let by: Vec<_> = w
        .audits("vm.delete_requested")
        .await
        .into_iter()
        .filter(|a| a.target.as_deref() == Some(theirs.id.as_str()))
        .collect();
    assert_eq!(by.len(), 1);
    assert_eq!(by[0].actor_sub.as_deref(), Some(w.op.sub.as_str()));
    assert_eq!(by[0].details.0["by"], "operator");
    assert!(
        w.agents
            .calls(Op::Delete)
            .iter()
            .any(|c| c.name == theirs.name)
    );
    let page = w.op.page("/admin/instances").await;
    assert!(
        row(&page, &format!("instance-{}", theirs.id)).is_none(),
        "not live"
    );

    // The stuck one, when its host still does not answer: the API's 202, still stuck,
    // the first request kept.
    w.answer_deletes(Answer::Hang);
    let r =
        w.op.post_form(&format!("/admin/instances/{}/delete", mine.id), &[])
            .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert!(notice(&r.text()).unwrap().contains("has not confirmed it"));
    assert!(row(&r.text(), &format!("stuck-{}", mine.id)).is_some());
    assert_eq!(w.vm(&mine.id).await.delete_requested_at, Some(requested));
    // Confirmed: it leaves both lists.
    w.answer_deletes(Answer::Ok);
    let r =
        w.op.post_form(&format!("/admin/instances/{}/delete", mine.id), &[])
            .await;
    assert_eq!(location(&r), "/admin/instances");
    let closed = w.vm(&mine.id).await;
    assert_eq!(
        (closed.delete_requested_at, closed.deleted_at),
        (Some(requested), Some(w.clock.now()))
    );
    let page = w.op.page("/admin/instances").await;
    assert!(page.contains("id=\"no-stuck\"") && page.contains("id=\"no-instances\""));

    // Refusals in place: no such instance; one that was never created.
    let r =
        w.op.post_form("/admin/instances/no-such-vm/delete", &[])
            .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("there is no instance with that id")
    );
    w.answer_creates(Answer::Refuse);
    let mine_key = w.add_key_once(&w.customer).await;
    let r = w.create(&w.customer, "spark-1", &mine_key).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let failed = w.agents.calls(Op::Create).pop().unwrap().name;
    let failed = w
        .all_vms()
        .await
        .into_iter()
        .find(|v| v.name == failed)
        .unwrap();
    let r =
        w.op.post_form(&format!("/admin/instances/{}/delete", failed.id), &[])
            .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(
        alert(&r.text())
            .unwrap()
            .starts_with("this instance was never created")
    );
    assert_eq!(w.vm(&failed.id).await.delete_requested_at, None);
    assert_eq!(w.agents.calls(Op::Delete).len(), 4);
}

with_world!(
    ssh_keys_are_checked_kept_once_and_private_to_their_user,
    e1_create_stamps_created_at_before_the_host_is_contacted,
    e1_a_host_holding_a_live_row_is_never_picked,
    e1_refusals_before_any_host_write_nothing,
    e1_a_host_that_never_answers_marks_creation_failed_and_bills_nothing,
    g_delete_writes_two_facts_and_closes_only_when_confirmed,
    g_a_404_confirms,
    e1_power_changes_reach_the_host_and_move_the_row_only_when_done,
    g_a_delete_that_times_out_stays_requested_and_is_listed_as_stuck,
    g_both_writes_are_guarded,
    g_admin_vm_action_uses_the_same_path,
    heartbeat_upserts_host_status_and_refuses_unknown_tokens_identically,
    pages_show_each_refusal_in_place_and_change_nothing,
    the_operators_page_deletes_through_admin_vm_action_and_lists_stuck_deletes,
);

// ---------------------------------------------------------------- the real client

/// HttpAgents against a stub of the agent's VM API on loopback: the sealed token is
/// opened and presented, a create's answer is read, and only the agent's own 404 confirms
/// a delete — a 404 from something that does not know the route does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_client_speaks_the_agents_vm_api() {
    use axum::Router;
    use axum::extract::Path;
    use axum::routing::{delete, post};
    use byo_server::seal::Sealer;

    let token = SecretToken::generate(TokenKind::Agent);
    let expected = format!("Bearer {}", token.expose());
    let authorised = move |h: &axum::http::HeaderMap| {
        h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(expected.as_str())
    };
    let (a1, a2, a3) = (authorised.clone(), authorised.clone(), authorised);
    let agent = Router::new()
        .route(
            "/v1/vms",
            post(move |h: axum::http::HeaderMap, body: String| async move {
                if !a1(&h) {
                    return (StatusCode::UNAUTHORIZED, "{}".to_owned());
                }
                let req: Value = serde_json::from_str(&body).unwrap();
                let name = req["name"].as_str().unwrap().to_owned();
                if name == "vm-garbled" {
                    return (StatusCode::CREATED, "not json".to_owned());
                }
                if name == "vm-taken" {
                    return (
                        StatusCode::CONFLICT,
                        json!({"error": "conflict", "message": "an instance named vm-taken already exists"}).to_string(),
                    );
                }
                let created = json!({"name": name, "ssh_port": 2203,
                    "gpu_check": {"ok": true}, "startup_script": {"ok": true}});
                (StatusCode::CREATED, created.to_string())
            }),
        )
        .route(
            "/v1/vms/{name}",
            delete(move |h: axum::http::HeaderMap, Path(name): Path<String>| async move {
                if !a2(&h) {
                    return (StatusCode::UNAUTHORIZED, "{}".to_owned());
                }
                match name.as_str() {
                    "vm-here" => (StatusCode::OK, json!({"deleted": true}).to_string()),
                    "vm-gone" => (
                        StatusCode::NOT_FOUND,
                        json!({"error": "not_found", "message": "no such instance on this host"}).to_string(),
                    ),
                    _ => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"error": "failed", "message": "lxd: busy"}).to_string(),
                    ),
                }
            }),
        )
        .route(
            "/v1/vms/{name}/state",
            post(move |h: axum::http::HeaderMap| async move {
                if a3(&h) { StatusCode::NO_CONTENT } else { StatusCode::UNAUTHORIZED }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, agent).await });
    // An agent with no VM API at all: its 404s are the router's, with no body.
    let old = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let old_port = old.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(old, Router::new()).await });

    let sealer = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
    let target = AgentTargetRow {
        id: "h".into(),
        slug: "spark-1".into(),
        relay_ip: Some("127.0.0.1".into()),
        agent_token: Some(sealer.seal(token.expose())),
    };
    let client = HttpAgents::new(Some(sealer.clone())).with_port(port);
    let create = |name: &str| CreateVm {
        name: name.into(),
        ssh_public_key: public_key_line(),
        ssh_hostname: None,
    };

    let created = client.create_vm(&target, &create("vm-here")).await.unwrap();
    assert_eq!(created.unwrap().ssh_port, 2203);
    assert_eq!(
        client.create_vm(&target, &create("vm-garbled")).await,
        Ok(None),
        "an unreadable 2xx is still a success"
    );
    assert_eq!(
        client.create_vm(&target, &create("vm-taken")).await,
        Err(AgentError::Refused {
            status: 409,
            reason: "an instance named vm-taken already exists".into()
        })
    );
    assert_eq!(
        client.delete_vm(&target, "vm-here").await,
        Ok(Gone::Deleted)
    );
    assert_eq!(
        client.delete_vm(&target, "vm-gone").await,
        Ok(Gone::NotFound)
    );
    assert!(matches!(
        client.delete_vm(&target, "vm-busy").await,
        Err(AgentError::Refused { status: 500, .. })
    ));
    assert!(matches!(
        client.delete_vm(&target, "../etc").await,
        Err(AgentError::Refused { status: 400, .. })
    ));
    assert_eq!(
        client.vm_action(&target, "vm-here", VmAction::Reboot).await,
        Ok(())
    );

    let wrong = AgentTargetRow {
        agent_token: Some(sealer.seal(SecretToken::generate(TokenKind::Agent).expose())),
        ..target.clone()
    };
    assert!(matches!(
        client.delete_vm(&wrong, "vm-here").await,
        Err(AgentError::Refused { status: 401, .. })
    ));
    let old_client = HttpAgents::new(Some(sealer.clone())).with_port(old_port);
    assert!(
        matches!(
            old_client.delete_vm(&target, "vm-gone").await,
            Err(AgentError::Refused { status: 404, .. })
        ),
        "a 404 that is not the agent's own does not confirm"
    );
    // Nothing listening: never answered.
    drop(client);
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let nobody = HttpAgents::new(Some(sealer)).with_port(closed_port);
    assert!(matches!(
        nobody.create_vm(&target, &create("vm-x")).await,
        Err(AgentError::Unreachable(_))
    ));
}
