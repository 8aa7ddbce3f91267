//! What every instances test starts from: the world (an app on a manual clock, the fake
//! agents, the recording queue drain, an owner, two customers and an operator), its hosts
//! and the requests the tests repeat. The imports are the tests' prelude.

pub(crate) use std::collections::HashSet;
pub(crate) use std::io::Write;
pub(crate) use std::sync::{Arc, Mutex};
pub(crate) use std::time::Duration;

pub(crate) use crate::support::agents::{self, FakeAgents, FakeHosts, Op};
pub(crate) use crate::support::{Reply, TestApp, User};
pub(crate) use axum::body::Body;
pub(crate) use axum::http::{Request, StatusCode, header};
pub(crate) use byo_core::keylist_testing::public_key_line;
pub(crate) use byo_core::tokens::{SecretToken, TokenKind};
pub(crate) use byo_db::Store;
pub(crate) use byo_db::hosts::{AgentTargetRow, NewHost};
pub(crate) use byo_db::vms::VmRow;
pub(crate) use byo_server::agents::AgentWaits;
pub(crate) use byo_server::agents::{AgentError, Gone, HostAgents, HttpAgents};
pub(crate) use byo_server::clock::Clock;
pub(crate) use byo_server::config::PlacementConfig;
pub(crate) use byo_server::queue::QueueDrain;
pub(crate) use byo_wire::states::{RelayState, VmStatus};
pub(crate) use byo_wire::vm::{Advisory, CreateVm, VmAction};
pub(crate) use chrono::{DateTime, TimeDelta, Utc};
pub(crate) use futures::future::BoxFuture;
pub(crate) use serde_json::{Value, json};

/// How the fake hosts behave, in these tests' words; `World::answer_creates` and
/// `answer_deletes` turn it into the fake agent's script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
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
pub(crate) struct RecordingDrain {
    pub(crate) store: Store,
    /// (gpu_type, host_id, whether that host was pickable when the drain ran)
    pub(crate) calls: Mutex<Vec<(String, String, bool)>>,
}

impl QueueDrain for RecordingDrain {
    fn capacity_freed<'a>(&'a self, gpu_type: &'a str, host_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let pickable = self
                .store
                .pick_hosts_for_gpu(byo_db::vms::HostPick::new(
                    gpu_type,
                    "someone-waiting",
                    DateTime::<Utc>::UNIX_EPOCH,
                    DateTime::<Utc>::UNIX_EPOCH,
                ))
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
pub(crate) const WAIT: Duration = Duration::from_millis(400);

pub(crate) struct World {
    pub(crate) app: TestApp,
    pub(crate) clock: Clock,
    pub(crate) agents: Arc<FakeAgents>,
    pub(crate) drain: Arc<RecordingDrain>,
    pub(crate) owner_sub: String,
    pub(crate) customer: User,
    pub(crate) other: User,
    pub(crate) op: User,
}

/// What a test host is like; the default is one every create may land on.
#[derive(Clone)]
pub(crate) struct Spec {
    pub(crate) gpu_type: &'static str,
    pub(crate) active: bool,
    pub(crate) prepared: bool,
    pub(crate) reachable: bool,
    pub(crate) placement: &'static str,
    pub(crate) dedicated_to: Option<String>,
    pub(crate) retired: bool,
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

pub(crate) struct TestHost {
    pub(crate) id: String,
    pub(crate) token: String,
}

/// Placement as these tests have it unless they say otherwise: a heartbeat of any age
/// will do and no host is benched, so the tests that move the clock by minutes test what
/// they are about. The tests of placement take the defaults (`world_with`).
pub(crate) fn lenient_placement() -> PlacementConfig {
    PlacementConfig {
        max_heartbeat_age_secs: 10 * 365 * 86_400,
        bench_after_failures: 1_000,
    }
}

pub(crate) async fn world(backend: byo_db::Backend) -> Option<World> {
    world_with(backend, lenient_placement()).await
}

/// A world whose placement is configured so (a test module's own `world` may call this).
pub(crate) async fn world_with(
    backend: byo_db::Backend,
    placement: PlacementConfig,
) -> Option<World> {
    let mut config = crate::support::test_config();
    config.placement = placement;
    let mut app = TestApp::with_config(backend, config).await?;
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
        .with_fake_hosts(&agents)
        .with_drain(drain.clone())
        .with_waits(AgentWaits {
            create: WAIT,
            delete: WAIT,
            login: WAIT,
        });
    app.router = byo_server::router(app.state.clone());
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
    pub(crate) fn db(&self) -> &Store {
        &self.app.db.store
    }

    /// Sign everyone in again (a session lasts an hour of the manual clock), for a test
    /// that moves the clock by days.
    pub(crate) async fn sign_in_again(&mut self) {
        for user in [&mut self.customer, &mut self.other, &mut self.op] {
            user.session = self.app.session_for(&user.sub).await;
        }
    }

    /// The host's agent beats (step 133) as the agent would, listing the instances it holds
    /// as (name, LXD status); the answer's status.
    pub(crate) async fn beat(&self, host: &TestHost, vms: &[(&str, &str)]) -> StatusCode {
        let vms: Vec<Value> = vms
            .iter()
            .map(|(name, status)| json!({"name": name, "status": status, "ssh_port": 22000}))
            .collect();
        let body = json!({
            "agent_version": "0.1.0", "lxd": "ok", "relay": "ok", "tunnel": "ok",
            "gpu": "ok", "storage": "ok", "instances": vms.len(), "details": {}, "vms": vms,
        });
        let req = Request::post("/api/host/heartbeat")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {}", host.token))
            .body(Body::from(body.to_string()))
            .unwrap();
        let r = self.app.send(req).await;
        r.status
    }

    /// How the hosts answer creates from now on.
    pub(crate) fn answer_creates(&self, a: Answer) {
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
    pub(crate) fn answer_deletes(&self, a: Answer) {
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
    pub(crate) async fn host(&self, slug: &str, spec: Spec) -> TestHost {
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
            let sealed = self.app.state.sealer.as_ref().unwrap().seal(
                &byo_server::seal::SealedAt::agent_token(&id),
                agent.expose(),
            );
            self.db()
                .execute_unchecked(&format!(
                    "update hosts set token_hash = '{}', agent_token = '{sealed}' where id = '{id}'",
                    token.hash().as_str()
                ))
                .await
                .unwrap();
            self.db()
                .record_relay(&id, Some("10.8.0.1"), RelayState::Ready, None)
                .await
                .unwrap();
        }
        if spec.prepared {
            self.db().mark_host_prepared(&id, now).await.unwrap();
        }
        if spec.active {
            self.db()
                .activate_host(&id, spec.placement, None, false, &self.op.sub, now)
                .await
                .unwrap();
        }
        if spec.reachable && !spec.retired {
            // Serving beats as soon as it starts; a host never heard from is not picked.
            let beat = byo_db::testing::healthy_beat();
            self.db()
                .record_heartbeat(&token.hash(), &beat, now)
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

    pub(crate) async fn add_key(&self, user: &User) -> String {
        let r = user
            .post(
                "/api/ssh-keys",
                json!({"name": "laptop", "public_key": public_key_line()}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        r.json()["id"].as_str().unwrap().to_owned()
    }

    pub(crate) async fn create(&self, user: &User, gpu_type: &str, key: &str) -> Reply {
        user.post("/api/vms", json!({"gpu_type": gpu_type, "ssh_key_id": key}))
            .await
    }

    /// A running instance of the customer's on whichever host is free.
    pub(crate) async fn running(&self) -> VmRow {
        let key = self.add_key_once(&self.customer).await;
        let r = self.create(&self.customer, "spark-1", &key).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        let id = r.json()["instance"]["id"].as_str().unwrap().to_owned();
        let row = self.vm(&id).await;
        assert_eq!(row.status, VmStatus::Running);
        row
    }

    pub(crate) async fn add_key_once(&self, user: &User) -> String {
        let list = user.get("/api/ssh-keys").await.json();
        match list.as_array().unwrap().first() {
            Some(k) => k["id"].as_str().unwrap().to_owned(),
            None => self.add_key(user).await,
        }
    }

    pub(crate) async fn vm(&self, id: &str) -> VmRow {
        self.db().vm(id).await.unwrap().unwrap()
    }

    pub(crate) async fn delete(&self, user: &User, vm_id: &str) -> Reply {
        user.delete(&format!("/api/vms/{vm_id}")).await
    }

    pub(crate) async fn admin_delete(&self, user: &User, vm_id: &str) -> Reply {
        user.post_empty(&format!("/api/admin/vms/{vm_id}/delete"))
            .await
    }

    pub(crate) async fn audits(&self, action: &str) -> Vec<byo_db::audit::AuditRow> {
        self.db()
            .audit_log(1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.action == action)
            .collect()
    }

    pub(crate) async fn all_vms(&self) -> Vec<VmRow> {
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

    pub(crate) async fn stuck_list(&self) -> Reply {
        self.op.get("/api/admin/stuck-deletes").await
    }

    pub(crate) async fn pickable(&self, host_id: &str) -> bool {
        self.db()
            .pick_hosts_for_gpu(byo_server::app::instances::host_pick(
                &self.app.state,
                "spark-1",
                &self.other.sub,
                None,
            ))
            .await
            .unwrap()
            .iter()
            .any(|h| h.id == host_id)
    }
}
