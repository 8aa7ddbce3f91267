//! Provisioning (A), redeem (B, steps 28–29), approval (D) and reap, through the API on both
//! backends. Every refusal proves nothing changed.

use crate::support;
use crate::{on_each_backend, with_world};

use byo_wire::states::EnrollmentState;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_server::clock::Clock;
use byo_server::providers::local::{LocalRelays, LocalTunnels};
use byo_server::providers::{ProviderError, TunnelInfo, TunnelProvider};
use futures::future::BoxFuture;
use serde_json::{Value, json};
use support::{TestApp, User};
use tower::ServiceExt;

/// Tunnels whose delete fails while `fail` is set, to interrupt a reap half-way.
#[derive(Default)]
struct FlakyTunnels {
    inner: LocalTunnels,
    fail: AtomicBool,
}

impl TunnelProvider for FlakyTunnels {
    fn create<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<TunnelInfo, ProviderError>> {
        self.inner.create(slug)
    }
    fn delete<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            if self.fail.load(Ordering::SeqCst) {
                return Err(ProviderError("cloudflare: 503 service unavailable".into()));
            }
            self.inner.delete(slug).await
        })
    }
    fn point_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
        address: &'a str,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.inner.point_ssh_wildcard(name, address)
    }
    fn remove_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.inner.remove_ssh_wildcard(name)
    }
}

struct World {
    app: TestApp,
    clock: Clock,
    relays: Arc<LocalRelays>,
    tunnels: Arc<FlakyTunnels>,
    owner: User,
    op: User,
    customer: User,
}

async fn world(backend: byo_db::Backend) -> Option<World> {
    let mut app = TestApp::new(backend).await?;
    app.publish_operator_keys().await;
    let clock = Clock::manual("2026-11-29T12:00:00Z".parse().unwrap());
    let relays = Arc::new(LocalRelays::default());
    let tunnels = Arc::new(FlakyTunnels::default());
    app.state = app
        .state
        .clone()
        .with_clock(clock.clone())
        .with_providers(relays.clone(), tunnels.clone());
    app.router = byo_server::router(app.state.clone());
    let owner = app.community_host("owner@example.com").await;
    let op = app.operator("op@example.com").await;
    let customer = app.customer("customer@example.com").await;
    Some(World {
        app,
        clock,
        relays,
        tunnels,
        owner,
        op,
        customer,
    })
}

impl World {
    async fn provision(&self, user: &User, profile: &str) -> support::Reply {
        user.post("/api/hosts", json!({"profile_id": profile}))
            .await
    }

    async fn enroll(&self, token: &str, body: Value) -> support::Reply {
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

    async fn relay_settled(&self, host_id: &str) {
        for _ in 0..100 {
            if let Some(h) = self.app.db.host(host_id).await.unwrap()
                && h.relay_ip.is_some()
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("relay-provision did not record the relay");
    }
}

fn spark() -> Value {
    json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": "3f2a", "hardware_id": "b41c", "node_index": 0, "rails": []
    })
}

async fn a1_provisioning_allocates_everything_before_the_box_is_touched(w: World) {
    let r = w.provision(&w.owner, "gb10-spark-1").await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let p = r.json();
    assert_eq!(p["slug"], "spark-1");
    let token = p["token"].as_str().unwrap();
    assert!(
        SecretToken::parse(TokenKind::Enrollment, token).is_ok(),
        "a token leak scanners recognise"
    );
    assert!(
        p["command"]
            .as_str()
            .unwrap()
            .ends_with(&format!("--token {token}")),
        "{}",
        p["command"]
    );
    let host_id = p["host_id"].as_str().unwrap();
    let host = w.app.db.host(host_id).await.unwrap().unwrap();
    assert!(!host.active, "step 11 writes active = false");
    assert_eq!(
        (host.owner_sub.as_str(), host.gpu_type.as_str()),
        (w.owner.sub.as_str(), "spark-1")
    );
    let e = w
        .app
        .db
        .enrollment(p["enrollment_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.state, EnrollmentState::Pending);
    assert_eq!(
        e.token_expires_at,
        w.clock.now() + chrono::Duration::minutes(60),
        "dies within the hour"
    );
    // The relay is recorded on the hosts row once relay-provision finishes; nobody waits.
    w.relay_settled(host_id).await;
    let host = w.app.db.host(host_id).await.unwrap().unwrap();
    assert_eq!(host.relay_name.as_deref(), Some("spark-1-relay"));
    assert!(w.relays.relays.lock().unwrap().contains_key("spark-1"));
    // F: every instance name of this host resolves to its relay.
    assert_eq!(
        w.tunnels
            .inner
            .wildcards
            .lock()
            .unwrap()
            .get("*.spark-1.ssh.localhost"),
        host.relay_ip.as_ref()
    );
    assert!(
        w.tunnels
            .inner
            .tunnels
            .lock()
            .unwrap()
            .contains_key("spark-1")
    );
    // Only the token's hash is stored.
    let dump = w.app.db.dump_text().await.unwrap();
    assert!(dump.iter().all(|v| !v.value.contains(token)));
    let stored = SecretToken::parse(TokenKind::Enrollment, token)
        .unwrap()
        .hash();
    assert!(
        dump.iter().any(|v| v.value == stored.as_str()),
        "the hash is what is kept"
    );

    // A pair's command carries the peer marker and the node count.
    let pair = w.provision(&w.owner, "gb10-spark-2").await.json();
    assert_eq!(pair["slug"], "spark-2");
    assert!(
        pair["command"]
            .as_str()
            .unwrap()
            .ends_with(" --peer --nodes=2"),
        "{}",
        pair["command"]
    );
}

async fn a4_provisioning_refusals_change_nothing(w: World) {
    let hosts_before = w.app.db.agent_targets().await.unwrap().len();
    let r = w.provision(&w.customer, "gb10-spark-1").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.text().contains("community_host"));
    let r = w.provision(&w.owner, "gb10-spark-9").await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("unknown_profile"))
    );
    // It names the profiles this owner may add, and not the staff-only one.
    let said = r.json()["message"].as_str().unwrap().to_owned();
    assert!(
        said.ends_with("you may add gb10-spark-1, gb10-spark-2, gb10-spark-4"),
        "{said}"
    );
    let r = w.provision(&w.owner, "linux-test").await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "the test profile is staff only"
    );
    assert_eq!(w.app.db.agent_targets().await.unwrap().len(), hosts_before);

    for _ in 0..3 {
        assert_eq!(
            w.provision(&w.owner, "gb10-spark-1").await.status,
            StatusCode::CREATED
        );
    }
    let r = w.provision(&w.owner, "gb10-spark-1").await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("allocation_cap"))
    );
    assert_eq!(
        w.app
            .db
            .outstanding_allocations(&w.owner.sub)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        w.app.db.agent_targets().await.unwrap().len(),
        hosts_before + 3
    );
}

async fn b28_redeem_returns_everything_once_and_then_never_again(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    w.relay_settled(&host_id).await;
    let token = p["token"].as_str().unwrap();
    let r = w.enroll(token, spark()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let e = r.json();
    assert_eq!(e["slug"], "spark-1");
    assert!(e["host_token"].as_str().unwrap().starts_with("byo_hst_"));
    assert!(e["agent_token"].as_str().unwrap().starts_with("byo_agt_"));
    assert!(e["ssh_map_token"].as_str().unwrap().starts_with("byo_map_"));
    assert_eq!(e["wireguard"]["address"], "10.8.0.2/24");
    assert_eq!(e["wireguard"]["endpoint"], "127.0.0.1:51820");
    assert_eq!(e["ssh_map_endpoint"], "10.8.0.1:8754");
    assert!(e["tunnel_connector_token"].is_string());
    assert!(e["cloudflared"].is_null(), "no cloudflared build is pinned");
    assert_eq!(e["constants"]["gpu_model"], "GB10");
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert!(host.pubkey.is_some() && !host.active);
    let nodes = w.app.db.host_nodes(&host_id).await.unwrap();
    assert_eq!((nodes.len(), nodes[0].hardware_id.as_str()), (1, "b41c"));
    // Nothing the host was handed is in the database in plaintext.
    let dump = w.app.db.dump_text().await.unwrap();
    for secret in [
        "host_token",
        "agent_token",
        "ssh_map_token",
        "tunnel_connector_token",
    ] {
        let s = e[secret].as_str().unwrap();
        assert!(
            dump.iter().all(|v| !v.value.contains(s)),
            "{secret} stored in plaintext"
        );
    }
    assert!(dump.iter().all(|v| {
        !v.value
            .contains(e["wireguard"]["private_key"].as_str().unwrap())
    }));

    // Spent, unknown, malformed and expired all get one byte-identical answer.
    let spent = w.enroll(token, spark()).await;
    let unknown = w
        .enroll(
            SecretToken::generate(TokenKind::Enrollment).expose(),
            spark(),
        )
        .await;
    let malformed = w.enroll("byo_enr_not-a-token", spark()).await;
    let other_kind = w
        .enroll(SecretToken::generate(TokenKind::Host).expose(), spark())
        .await;
    let p2 = w.provision(&w.owner, "gb10-spark-1").await.json();
    w.clock.advance(chrono::Duration::minutes(61));
    let expired = w
        .enroll(
            p2["token"].as_str().unwrap(),
            json!({"node_index": 0, "hardware_id": "zz"}),
        )
        .await;
    for r in [&unknown, &malformed, &other_kind, &expired] {
        assert_eq!(r.as_seen(), spent.as_seen(), "headers included");
    }
    assert_eq!(spent.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        w.app.db.host_nodes(&host_id).await.unwrap().len(),
        1,
        "nothing changed"
    );
}

async fn b28_hardware_that_is_not_the_profiles_is_rejected_and_released(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    w.relay_settled(&host_id).await;
    let mut x86 = spark();
    x86["arch"] = json!("x86_64");
    let r = w.enroll(p["token"].as_str().unwrap(), x86).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains("arch is x86_64"),
        "{}",
        r.text()
    );
    let e = w
        .app
        .db
        .enrollment(p["enrollment_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        e.state,
        EnrollmentState::Rejected,
        "the row parks as rejected, with what turned up"
    );
    // The allocation it was holding is handed back: host row, relay, tunnel.
    for _ in 0..100 {
        if w.app.db.host(&host_id).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(w.app.db.host(&host_id).await.unwrap().is_none());
    assert!(w.relays.relays.lock().unwrap().is_empty());
    assert!(w.tunnels.inner.tunnels.lock().unwrap().is_empty());
    // The token is spent.
    assert_eq!(
        w.enroll(p["token"].as_str().unwrap(), spark()).await.status,
        StatusCode::UNAUTHORIZED
    );
}

async fn k127_one_box_cannot_become_two_hosts(w: World) {
    let a = w.provision(&w.owner, "gb10-spark-1").await.json();
    let b = w.provision(&w.owner, "gb10-spark-1").await.json();
    assert_eq!(
        w.enroll(a["token"].as_str().unwrap(), spark()).await.status,
        StatusCode::OK
    );
    let r = w.enroll(b["token"].as_str().unwrap(), spark()).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().contains("already enrolled"));
    assert!(
        w.app
            .db
            .host_nodes(b["host_id"].as_str().unwrap())
            .await
            .unwrap()
            .is_empty()
    );
}

async fn d3_activation_is_refused_until_preparation_finished(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    let enrolled = w.enroll(p["token"].as_str().unwrap(), spark()).await;
    assert_eq!(enrolled.status, StatusCode::OK);
    let host_token = enrolled.json()["host_token"].as_str().unwrap().to_owned();
    let path = format!("/api/admin/hosts/{host_id}/activate");
    let r = w.op.post(&path, json!({"placement": "shared"})).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_prepared"))
    );
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert!(!host.active && host.placement.is_none());

    w.app
        .db
        .mark_host_prepared(&host_id, w.clock.now())
        .await
        .unwrap();
    // Prepared by its own report is not enough (issue #36, 8): its agent has never beaten,
    // or beat longer ago than placement's age, and the activation is refused, naming why.
    let refused_unheard = |r: support::Reply, why: &str| {
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (StatusCode::CONFLICT, Some("not_healthy")),
            "{}",
            r.text()
        );
        assert!(r.text().contains(why), "{}", r.text());
    };
    let audits = w.app.db.audit_log(1000).await.unwrap().len();
    let r = w.op.post(&path, json!({"placement": "shared"})).await;
    refused_unheard(r, "agent unreachable (no heartbeat ever arrived)");
    w.app.idle_heartbeat(&host_token).await;
    w.clock.advance(chrono::Duration::minutes(10));
    let r = w.op.post(&path, json!({"placement": "shared"})).await;
    refused_unheard(r, "agent unreachable (last heartbeat ");
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert!(!host.active && host.placement.is_none(), "nothing changed");
    assert_eq!(w.app.db.audit_log(1000).await.unwrap().len(), audits);
    // A fresh, healthy beat (and its customer path walked): it goes into service.
    w.app.idle_heartbeat(&host_token).await;
    w.app.path_walked(&host_id).await;
    let r = w.op.post(&path, json!({"placement": "shared"})).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert!(host.active);
    assert_eq!(
        (host.placement.as_deref(), host.gpu_type.as_str()),
        (Some("shared"), "spark-1")
    );
}

/// Issue #36: the heartbeat's answer names the address the beat came from, which the host's
/// tenant firewall keeps tenants from (the owner's public address). Only a host's own
/// accepted beat hears it; a stranger's beat is refused without it.
async fn a36_the_heartbeat_answer_names_the_address_the_beat_came_from(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let enrolled = w.enroll(p["token"].as_str().unwrap(), spark()).await;
    let host_token = enrolled.json()["host_token"].as_str().unwrap().to_owned();
    let beat = |token: &str| {
        let mut req = support::idle_beat(token);
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(std::net::SocketAddr::new(
                "198.51.100.7".parse().unwrap(),
                40_000,
            )));
        req
    };
    let r = w.app.send(beat(&host_token)).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert_eq!(
        r.headers
            .get(byo_wire::vm::SEEN_FROM_HEADER)
            .map(|v| v.to_str().unwrap()),
        Some("198.51.100.7")
    );
    let stranger = SecretToken::generate(TokenKind::Host).expose().to_owned();
    let r = w.app.send(beat(&stranger)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.headers.get(byo_wire::vm::SEEN_FROM_HEADER).is_none());
    // Where the listener did not say (a request built in-process), nothing is said.
    let r = w.app.idle_heartbeat(&host_token).await;
    assert!(r.headers.get(byo_wire::vm::SEEN_FROM_HEADER).is_none());
}

async fn a4_reap_hands_back_a_lapsed_allocation_and_resumes_after_a_failure(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    w.relay_settled(&host_id).await;
    // Not yet lapsed: nothing to reap.
    assert_eq!(
        byo_server::app::reap::reap_once(&w.app.state)
            .await
            .unwrap()
            .released,
        0
    );
    w.clock.advance(chrono::Duration::minutes(61));

    // Cloudflare fails half-way: the names go first, so the relay and its address are kept
    // (no DNS name may point at an address handed back, issue #36, 8); the rest waits for
    // the next sweep.
    w.tunnels.fail.store(true, Ordering::SeqCst);
    let r = byo_server::app::reap::reap_once(&w.app.state)
        .await
        .unwrap();
    assert_eq!((r.released, r.failed), (0, 1));
    assert!(
        w.app.db.host(&host_id).await.unwrap().is_some(),
        "the row goes last"
    );
    assert!(
        w.tunnels.inner.wildcards.lock().unwrap().is_empty(),
        "the ssh wildcard went first"
    );
    assert!(
        !w.relays.relays.lock().unwrap().is_empty(),
        "the relay and its address are kept while a name may still point at them"
    );

    w.tunnels.fail.store(false, Ordering::SeqCst);
    let r = byo_server::app::reap::reap_once(&w.app.state)
        .await
        .unwrap();
    assert_eq!((r.released, r.failed), (1, 0));
    assert!(w.app.db.host(&host_id).await.unwrap().is_none());
    assert!(w.tunnels.inner.tunnels.lock().unwrap().is_empty());
    assert!(
        w.tunnels.inner.wildcards.lock().unwrap().is_empty(),
        "the ssh wildcard goes too"
    );
    let e = w
        .app
        .db
        .enrollment(p["enrollment_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.state, EnrollmentState::Expired);
    // Idempotent: another sweep finds nothing.
    assert_eq!(
        byo_server::app::reap::reap_once(&w.app.state)
            .await
            .unwrap(),
        Default::default()
    );
    // The owner's cap is free again.
    assert_eq!(
        w.app
            .db
            .outstanding_allocations(&w.owner.sub)
            .await
            .unwrap(),
        0
    );
}

async fn h_revoking_before_redeem_releases_the_allocation(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    w.relay_settled(&host_id).await;
    let path = format!(
        "/api/admin/enrollments/{}/revoke",
        p["enrollment_id"].as_str().unwrap()
    );
    assert_eq!(w.op.post_empty(&path).await.status, StatusCode::NO_CONTENT);
    assert!(w.app.db.host(&host_id).await.unwrap().is_none());
    assert_eq!(
        w.enroll(p["token"].as_str().unwrap(), spark()).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(w.op.post_empty(&path).await.status, StatusCode::CONFLICT);
}

/// The page's Revoke goes through the API's rule: the same refusal for a redeemed
/// enrolment, and the same audit entry and release for one that was not.
async fn h_revoking_from_the_page_is_the_apis_revoke(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    let enrollment_id = p["enrollment_id"].as_str().unwrap().to_owned();
    w.relay_settled(&host_id).await;
    let path = format!("/admin/enrollments/{enrollment_id}/revoke");
    assert_eq!(
        w.op.post_form(&path, &[]).await.status,
        StatusCode::SEE_OTHER
    );
    assert!(w.app.db.host(&host_id).await.unwrap().is_none());
    let audited: Vec<_> = w
        .app
        .db
        .audit_log(100)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action == "enrollment.revoke")
        .map(|a| a.target)
        .collect();
    assert_eq!(audited, [Some(enrollment_id.clone())]);
    let again = w.op.post_form(&path, &[]).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert!(
        again
            .text()
            .contains("only an enrolment that has not redeemed")
    );
}

async fn pages_let_an_owner_add_a_gpu_and_an_operator_activate_it(w: World) {
    let form = |user: &User, path: &str, body: &str| {
        Request::post(path)
            .header(
                header::COOKIE,
                format!("__Host-byo_session={}", user.session),
            )
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    let page = w.owner.get("/hosts").await.text();
    assert!(
        page.contains("Add a GPU") && page.contains("gb10-spark-1") && !page.contains("linux-test"),
        "{page}"
    );
    let added = w
        .app
        .send(form(&w.owner, "/hosts", "profile_id=gb10-spark-1"))
        .await;
    assert_eq!(added.status, StatusCode::CREATED);
    let text = added.text();
    assert!(
        text.contains("curl -fsSL")
            && text.contains("--token byo_enr_")
            && text.contains("spark-1"),
        "{text}"
    );
    assert!(text.contains("waiting for the command"));

    let customer = w.customer.get("/hosts").await.text();
    assert!(customer.contains("ask an operator for the community_host grant"));
    let refused = w
        .app
        .send(form(&w.customer, "/hosts", "profile_id=gb10-spark-1"))
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(refused.text().contains("community_host"));

    // The operator sees it, with no Activate until preparation finished.
    let token = text
        .split("--token ")
        .nth(1)
        .unwrap()
        .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .next()
        .unwrap();
    let enrolled = w.enroll(token, spark()).await;
    assert_eq!(enrolled.status, StatusCode::OK);
    let host_token = enrolled.json()["host_token"].as_str().unwrap().to_owned();
    let admin = w.op.get("/admin/hosts").await.text();
    assert!(
        admin.contains("spark-1")
            && admin.contains("owner@example.com")
            && admin.contains("enrolled: preparing")
    );
    assert!(
        !admin.contains(">Activate<"),
        "not offered before preparation finished"
    );
    let host_id = w.app.db.enrollment_views(None).await.unwrap()[0]
        .host_id
        .clone()
        .unwrap();
    let forced = w
        .app
        .send(form(
            &w.op,
            &format!("/admin/hosts/{host_id}/activate"),
            "placement=shared",
        ))
        .await;
    assert_eq!(
        forced.status,
        StatusCode::CONFLICT,
        "the backend refuses whatever sends it"
    );
    assert!(forced.text().contains("preparation has not finished"));
    w.app
        .db
        .mark_host_prepared(&host_id, w.clock.now())
        .await
        .unwrap();
    assert!(w.op.get("/admin/hosts").await.text().contains(">Activate<"));
    w.app.idle_heartbeat(&host_token).await;
    w.app.path_walked(&host_id).await;
    let ok = w
        .app
        .send(form(
            &w.op,
            &format!("/admin/hosts/{host_id}/activate"),
            "placement=shared",
        ))
        .await;
    assert_eq!(ok.status, StatusCode::SEE_OTHER);
    assert!(w.app.db.host(&host_id).await.unwrap().unwrap().active);
}

async fn c_host_report_records_progress_and_completion_gates_activation(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    let enrolled = w.enroll(p["token"].as_str().unwrap(), spark()).await.json();
    let host_token = enrolled["host_token"].as_str().unwrap().to_owned();
    let report = |token: String, body: Value| {
        let app = &w.app;
        async move {
            app.send(
                Request::post("/api/host/report")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await
        }
    };
    let step = |name: &str, state: &str, is_final: bool| json!({"step": name, "state": state, "attempt": 1, "error": null, "final": is_final, "at": "2026-11-29T12:05:00Z"});

    let r = report(
        host_token.clone(),
        json!({"node": 0, "state": step("lxd-install", "applied", false)}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert_eq!(host.prepare_state.unwrap().0.step, "lxd-install");
    assert!(host.prepared_at.is_none());
    let page = w.owner.get("/hosts").await.text();
    assert!(
        page.contains("preparing: lxd-install applied"),
        "the owner watches progress"
    );

    // Refusals change nothing: a wrong token, a node the host does not have, garbage.
    let before = w
        .app
        .db
        .host(&host_id)
        .await
        .unwrap()
        .unwrap()
        .prepare_state;
    let wrong = report(
        SecretToken::generate(TokenKind::Host).expose().to_owned(),
        json!({"node": 0, "state": step("x", "failed", true)}),
    )
    .await;
    let enroll_token_as_host = report(
        p["token"].as_str().unwrap().to_owned(),
        json!({"node": 0, "state": step("x", "failed", true)}),
    )
    .await;
    assert_eq!(
        wrong.as_seen(),
        enroll_token_as_host.as_seen(),
        "headers included"
    );
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    let r = report(
        host_token.clone(),
        json!({"node": 1, "state": step("x", "applied", false)}),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::BAD_REQUEST,
        "a single Spark has no node 1"
    );
    let r = report(host_token.clone(), json!({"node": 0})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        w.app
            .db
            .host(&host_id)
            .await
            .unwrap()
            .unwrap()
            .prepare_state,
        before
    );

    // Completion is the record activation waits for.
    let path = format!("/api/admin/hosts/{host_id}/activate");
    let act = || w.op.post(&path, json!({"placement": "shared"}));
    assert_eq!(act().await.status, StatusCode::CONFLICT);
    let r = report(
        host_token.clone(),
        json!({"node": 0, "state": step("self-check", "satisfied", true), "completed": true}),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(
        w.app
            .db
            .host(&host_id)
            .await
            .unwrap()
            .unwrap()
            .prepared_at
            .is_some()
    );
    w.app.idle_heartbeat(&host_token).await;
    w.app.path_walked(&host_id).await;
    assert_eq!(act().await.status, StatusCode::NO_CONTENT);
}

/// 130–132: host-report's rails. What rail-network configured on a machine replaces its
/// host_nodes.rails whole; once rail-verify proved the cables, verified_at is stamped (by the
/// backend's clock) on each port carrying a rail. Refusals change nothing.
async fn k_131_132_host_report_rails_refresh_a_nodes_rails_then_stamp_verified_at(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-2").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    let r = w
        .enroll(p["token"].as_str().unwrap(), support::pair_request())
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let host_token = r.json()["host_token"].as_str().unwrap().to_owned();
    let post = |token: String, body: Value| {
        let app = &w.app;
        async move {
            app.send(
                Request::post("/api/host/rails")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await
        }
    };
    let rails = async || -> Vec<Value> {
        let nodes = w.app.db.host_nodes(&host_id).await.unwrap();
        nodes.into_iter().map(|n| n.rails.0).collect()
    };
    let at_127 = rails().await;
    assert_eq!(
        at_127[1]["enP2p1s0f1np1"]["address"], "192.168.101.11/24",
        "redeem stamped the plan's address"
    );
    let node1 = |verified: bool| {
        json!({"node": 1, "verified": verified, "ports": [
            {"iface": "enp1s0f0np0", "device": "rocep1s0f0", "mtu": 9000, "active_mtu": 4096,
             "neighbours_discovered": 1, "index": 0, "address": "192.168.100.11/24"},
            {"iface": "enP2p1s0f1np1", "device": "roceP2p1s0f1", "mtu": 9000, "active_mtu": 4096,
             "neighbours_discovered": 1, "index": 1, "address": "192.168.101.11/24"},
            {"iface": "enP2p1s0f0np0", "device": "roceP2p1s0f0", "mtu": 1500, "active_mtu": null,
             "neighbours_discovered": 0, "index": null}]})
    };
    let configured = json!({
        "enp1s0f0np0": {"index": 0, "device": "rocep1s0f0", "mtu": 9000, "active_mtu": 4096,
                        "address": "192.168.100.11/24", "neighbours_discovered": 1},
        "enP2p1s0f1np1": {"index": 1, "device": "roceP2p1s0f1", "mtu": 9000, "active_mtu": 4096,
                          "address": "192.168.101.11/24", "neighbours_discovered": 1},
        "enP2p1s0f0np0": {"device": "roceP2p1s0f0", "mtu": 1500, "neighbours_discovered": 0}
    });

    // 130–131: after rail-network, node1's ports as they are now; node0's row untouched.
    let r = post(host_token.clone(), node1(false)).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert_eq!(rails().await, vec![at_127[0].clone(), configured.clone()]);

    // 132: rail-verify proved the cables; the backend's clock stamps the cabled ports.
    let r = post(host_token.clone(), node1(true)).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let stamp = w
        .clock
        .now()
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut verified = configured.clone();
    verified["enp1s0f0np0"]["verified_at"] = json!(stamp);
    verified["enP2p1s0f1np1"]["verified_at"] = json!(stamp);
    let after = rails().await;
    assert_eq!(after, vec![at_127[0].clone(), verified]);

    // Refusals change nothing: a token that is no host's (the one 401, headers included), a
    // node the host does not have, a body that is not rails, more ports than a machine has.
    let wrong = post(
        SecretToken::generate(TokenKind::Host).expose().to_owned(),
        node1(true),
    )
    .await;
    let enroll_token_as_host = post(p["token"].as_str().unwrap().to_owned(), node1(true)).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.as_seen(), enroll_token_as_host.as_seen());
    let mut other = node1(false);
    other["node"] = json!(2);
    let r = post(host_token.clone(), other).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("unknown_node"))
    );
    let r = post(host_token.clone(), json!({"node": 1})).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_rails"))
    );
    let mut many = node1(false);
    many["ports"] = json!(vec![json!({"iface": "x", "neighbours_discovered": 0}); 9]);
    let r = post(host_token.clone(), many).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.text().contains("ports"), "{}", r.text());
    assert_eq!(rails().await, after);
}

async fn b28_a_fault_on_our_side_leaves_the_token_good(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let token = p["token"].as_str().unwrap();
    // The same database, served by a server that lost its secret_key: the sealed secrets
    // do not open.
    let stranger = byo_server::router(
        byo_server::AppState::new(w.app.db.store.clone(), support::test_config())
            .with_clock(w.clock.clone()),
    );
    let r = stranger
        .oneshot(
            Request::post("/api/enroll")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(spark().to_string()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let e = w
        .app
        .db
        .enrollment(p["enrollment_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (e.state.as_str(), e.redeemed_at),
        ("pending", None),
        "nothing was written"
    );
    // With the right key, the same token still enrols.
    assert_eq!(w.enroll(token, spark()).await.status, StatusCode::OK);
}

with_world!(
    a1_provisioning_allocates_everything_before_the_box_is_touched,
    a4_provisioning_refusals_change_nothing,
    b28_redeem_returns_everything_once_and_then_never_again,
    b28_hardware_that_is_not_the_profiles_is_rejected_and_released,
    k127_one_box_cannot_become_two_hosts,
    d3_activation_is_refused_until_preparation_finished,
    a36_the_heartbeat_answer_names_the_address_the_beat_came_from,
    a4_reap_hands_back_a_lapsed_allocation_and_resumes_after_a_failure,
    h_revoking_before_redeem_releases_the_allocation,
    h_revoking_from_the_page_is_the_apis_revoke,
    pages_let_an_owner_add_a_gpu_and_an_operator_activate_it,
    c_host_report_records_progress_and_completion_gates_activation,
    k_131_132_host_report_rails_refresh_a_nodes_rails_then_stamp_verified_at,
    b28_a_fault_on_our_side_leaves_the_token_good,
    c_the_agents_reporter_lands_on_host_report_and_the_answer_is_a_plan,
    the_operators_hosts_page_summarises_what_turned_up,
    c_a_failed_step_tells_the_owner_whats_wrong_who_fixes_it_and_that_it_tries_again,
    b28_redeem_hands_over_the_pinned_cloudflared_build_for_the_machines_arch,
);

/// The digest a host checks its cloudflared build against travels in the enrolment answer,
/// beside its credentials, never from the server that serves the file: the build for the
/// machine's own arch (as it reported it), at /cloudflared/ on this server.
async fn b28_redeem_hands_over_the_pinned_cloudflared_build_for_the_machines_arch(mut w: World) {
    let pinned = "AB".repeat(32);
    let mut config = (*w.app.state.config).clone();
    config
        .cloudflared
        .sha256
        .insert("aarch64".into(), pinned.clone());
    config
        .cloudflared
        .sha256
        .insert("x86_64".into(), "cd".repeat(32));
    w.app.state.config = Arc::new(config);
    w.app.router = byo_server::router(w.app.state.clone());
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    w.relay_settled(p["host_id"].as_str().unwrap()).await;
    let r = w.enroll(p["token"].as_str().unwrap(), spark()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.json()["cloudflared"],
        json!({
            "url": "http://localhost:8080/cloudflared/cloudflared-aarch64",
            "sha256": pinned.to_ascii_lowercase(),
        })
    );
}

/// A failed step on *Your GPUs* (the page and the fragment it polls): besides the technical
/// line, what is wrong and who fixes it in the owner's words, and that preparation tries
/// again on its own — when, while that is ahead. Once it completes, the advice is gone.
async fn c_a_failed_step_tells_the_owner_whats_wrong_who_fixes_it_and_that_it_tries_again(
    w: World,
) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    let enrolled = w.enroll(p["token"].as_str().unwrap(), spark()).await.json();
    let host_token = enrolled["host_token"].as_str().unwrap().to_owned();
    let report = |body: Value| {
        let (app, token) = (&w.app, host_token.clone());
        async move {
            let r = app
                .send(
                    Request::post("/api/host/report")
                        .header(header::AUTHORIZATION, format!("Bearer {token}"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Body::from(body.to_string()))
                        .unwrap(),
                )
                .await;
            assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
        }
    };
    let failed = |step: &str, error: &str, at: &str| json!({"node": 0, "state": {"step": step, "state": "failed", "attempt": 1, "error": error, "final": true, "at": at}});
    let views = async || {
        (
            w.owner.get("/hosts").await.text(),
            w.owner
                .get(&format!("/hosts/{host_id}/progress"))
                .await
                .text(),
        )
    };

    // The list expired: ours to fix. The clock reads 12:00:00; the step failed at 12:00:10.
    report(failed(
        "operator-access",
        "no operator-key list is kept on this host (enrolment delivers it): nobody could administer it",
        "2026-11-29T12:00:10Z",
    ))
    .await;
    for view in <[String; 2]>::from(views().await) {
        for says in [
            "last step: operator-access failed (no operator-key list is kept on this host",
            "byo's operators cannot log in to this machine yet: the list of their access keys is missing or has expired.",
            "Nothing for you to do: we fix this on our side.",
            "Preparation tries again on its own about every 30 seconds (next try about 12:00:40 UTC), and carries on by itself once the cause is fixed.",
        ] {
            assert!(view.contains(says), "{says:?} is not in:\n{view}");
        }
    }

    // The API words it as the page does (issue #43, 3: `byo hosts show`).
    let listed = w.owner.get("/api/hosts").await.json();
    let listed = &listed.as_array().unwrap()[0];
    assert_eq!(listed["host_id"], json!(host_id));
    assert!(
        listed["state"]
            .as_str()
            .unwrap()
            .starts_with("preparing: operator-access failed (no operator-key list"),
        "{listed}"
    );
    assert!(
        listed["last_step"]
            .as_str()
            .unwrap()
            .starts_with("operator-access failed")
    );
    assert!(
        listed["advice"]
            .as_str()
            .unwrap()
            .starts_with("byo's operators cannot log in to this machine yet")
            && listed["advice"]
                .as_str()
                .unwrap()
                .ends_with("Nothing for you to do: we fix this on our side."),
        "{listed}"
    );
    assert_eq!(listed["may_cancel"], json!(false));

    // apt held by another program: the owner's to fix. Its next try is already past (the
    // host may be off): no time is promised.
    report(failed(
        "lxd-install",
        "apt-get install lxd: Could not get lock /var/lib/dpkg/lock-frontend",
        "2026-11-29T11:00:00Z",
    ))
    .await;
    let (page, _) = views().await;
    for says in [
        "LXD, which runs the customers' containers, could not be installed. A package install failed: most often another program is holding apt",
        "What you can do: let any update on the machine finish, and check that it can reach the internet.",
        "about every 30 seconds, and carries on",
    ] {
        assert!(page.contains(says), "{says:?} is not in:\n{page}");
    }
    assert!(!page.contains("Nothing for you to do") && !page.contains("next try"));

    // A retry that completes: no advice is left.
    report(json!({"node": 0, "state": {"step": "self-check", "state": "satisfied", "attempt": 1, "error": null, "final": true, "at": "2026-11-29T12:01:00Z"}, "completed": true})).await;
    let (page, fragment) = views().await;
    assert!(page.contains("prepared: waiting for an operator"), "{page}");
    let listed = w.owner.get("/api/hosts").await.json();
    assert_eq!(
        listed[0]["state"],
        "prepared: waiting for an operator's approval"
    );
    assert_eq!(listed[0]["advice"], Value::Null);
    for view in [page, fragment] {
        assert!(!view.contains("tries again"), "{view}");
    }

    // Prepared, then an operator's deliberate run failed (L): the same plain words, and
    // no promise of a retry it will not make.
    report(failed(
        "earlyoom",
        "apply failed: Unit file earlyoom.service is masked.",
        "2026-11-29T12:00:10Z",
    ))
    .await;
    for view in <[String; 2]>::from(views().await) {
        assert!(
            view.contains("earlyoom, which stops a runaway program"),
            "{view}"
        );
        assert!(
            view.contains(
                "preparing your machine again after it was ready: it does not try again on its own"
            ),
            "{view}"
        );
        assert!(
            !view.contains("tries again on its own about every"),
            "{view}"
        );
    }
}

/// /admin/hosts says what turned up in a few words — GPU, arch, OS, machine, when — with
/// what was stored behind a toggle, cut to a few KB however much an agent sent.
async fn the_operators_hosts_page_summarises_what_turned_up(w: World) {
    let enrolled = w.provision(&w.owner, "gb10-spark-1").await.json();
    assert_eq!(
        w.enroll(enrolled["token"].as_str().unwrap(), spark())
            .await
            .status,
        StatusCode::OK
    );
    // A rejected request is stored whole (within the wire's bounds, docs/security.md): here
    // a pair of x86 boxes with every port they may report, each with a long device name.
    let rejected = w.provision(&w.owner, "gb10-spark-1").await.json();
    let ports = |prefix: &str| -> Value {
        (0..byo_wire::limits::RAILS)
            .map(|i| {
                json!({"iface": format!("{prefix}{i}s0f0np0"),
                       "device": "d".repeat(byo_wire::limits::SHORT),
                       "neighbours_discovered": 0})
            })
            .collect()
    };
    let mut big = spark();
    big["arch"] = json!("x86_64");
    big["rails"] = ports("enp");
    big["peers"] = json!([{"gpu_model": "GB10", "gpu_count": 1, "machine_id": "9c17",
                           "hardware_id": "7e08", "node_index": 1, "rails": ports("peer")}]);
    let r = w.enroll(rejected["token"].as_str().unwrap(), big).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    w.provision(&w.owner, "gb10-spark-1").await;

    let page = w.op.page("/admin/hosts").await;
    let rows: Vec<&str> = page.split("<tr>").skip(2).collect();
    assert_eq!(rows.len(), 3, "{page}");
    let row = |needle: &str| {
        *rows
            .iter()
            .find(|r| r.contains(needle))
            .unwrap_or_else(|| panic!("no row with {needle}: {page}"))
    };

    let ok = row(">spark-1<");
    for fact in [
        "<dd>GB10 × 1</dd>",
        "<dd>aarch64</dd>",
        "<dd>ubuntu 24.04</dd>",
        r#"<code title="b41c">b41c</code>, 1 node"#,
        "added <time>2026-11-29 12:00</time><br>reported <time>2026-11-29 12:00</time>",
    ] {
        assert!(ok.contains(fact), "{fact} in {ok}");
    }
    assert!(
        ok.contains(r#"<details class="request"><summary>As reported</summary>"#)
            && ok.contains("&quot;gpu_model&quot;: &quot;GB10&quot;"),
        "what was stored, behind the toggle: {ok}"
    );
    assert!(!ok.contains("Cut:"), "a small record is shown whole");

    let no = row("x86_64");
    assert!(
        no.contains("rejected: ") && no.contains("<dd>GB10 × 1</dd>") && no.contains("2 nodes"),
        "{no}"
    );
    let shown = no
        .split("<pre><code>")
        .nth(1)
        .unwrap()
        .split("</code></pre>")
        .next()
        .unwrap()
        .replace("&quot;", "\"");
    assert!(shown.len() <= 4096, "at most 4 KB: {} bytes", shown.len());
    assert!(
        no.contains("Cut: the first 4096 of ") && !no.contains("enp7s0f0np0"),
        "{no}"
    );

    let waiting = row("waiting for the command");
    assert!(
        waiting.contains("nothing yet") && waiting.contains(">Revoke<"),
        "{waiting}"
    );
}

/// The agent's own reporter (blocking HTTP, as preparation runs it) against the real
/// handler, served on loopback; and what redeem returns is a plan preparation can run.
async fn c_the_agents_reporter_lands_on_host_report_and_the_answer_is_a_plan(w: World) {
    use byo_wire::prepare::{HostReport, PrepareState, StepState};
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    let enrolled: byo_wire::enroll::EnrollResponse =
        serde_json::from_value(w.enroll(p["token"].as_str().unwrap(), spark()).await.json())
            .unwrap();
    let plan = byo_agent::prepare::plan_from(&enrolled, None).unwrap();
    assert_eq!(
        plan.profile.prepare.storage_driver,
        byo_wire::profile::StorageDriver::Zfs
    );
    assert_eq!(plan.profile.prepare.lxd, byo_wire::profile::LxdSource::Snap);
    assert_eq!(plan.profile.cuda_repo_arch.as_deref(), Some("sbsa"));
    assert!(!plan.lockout_owner, "hosts.lockout_owner ships false");

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    let router = w.app.router.clone();
    tokio::spawn(async move { axum::serve(listener, router).await });
    let state = |step: &str, state, is_final| PrepareState {
        step: step.into(),
        state,
        attempt: 1,
        error: None,
        is_final,
        at: "2026-11-29T12:05:00Z".parse().unwrap(),
    };
    let token = enrolled.host_token.clone();
    let sent = tokio::task::spawn_blocking(move || {
        let mut r = byo_agent::report::Reporter::new(&server, &token).unwrap();
        let first = r.send(&HostReport {
            node: 0,
            state: state("firewall", StepState::Applied, false),
            completed: false,
        });
        let wrong = byo_agent::report::Reporter::new(&server, "byo_host_wrong")
            .unwrap()
            .send(&HostReport {
                node: 0,
                state: state("x", StepState::Failed, true),
                completed: false,
            });
        (first, wrong, r)
    })
    .await
    .unwrap();
    sent.0.unwrap();
    assert!(sent.1.unwrap_err().contains("401"));
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert_eq!(host.prepare_state.unwrap().0.step, "firewall");
    assert!(host.prepared_at.is_none());
    let mut r = sent.2;
    tokio::task::spawn_blocking(move || {
        r.send(&HostReport {
            node: 0,
            state: state("self-check", StepState::Satisfied, true),
            completed: true,
        })
    })
    .await
    .unwrap()
    .unwrap();
    let host = w.app.db.host(&host_id).await.unwrap().unwrap();
    assert!(host.prepare_state.unwrap().0.is_final);
    assert!(
        host.prepared_at.is_some(),
        "completion is the record activation waits for"
    );
}

#[tokio::test]
async fn install_sh_is_shellcheck_clean_and_serves_only_agent_builds() {
    let Some(mut app) = TestApp::new(byo_db::Backend::Sqlite).await else {
        return;
    };
    let script = app.get("/install.sh", None).await;
    assert_eq!(script.status, StatusCode::OK);
    let text = script.text();
    assert!(text.contains("server='http://localhost:8080'"), "{text}");
    assert!(text.contains("\"$server/agent/byo-agent-$arch\"") && text.contains("sha256sum -c"));
    assert!(
        text.contains("systemd-run --unit=enverge-agent-install --collect --quiet --wait"),
        "the critical section runs detached: it survives a dropped session"
    );
    for unit in [
        "enverge-agent-prepare.service",
        "enverge-agent.service",
        "enverge-agent-rollback.service",
        "enverge-agent-reboot.path",
        "enverge-agent-reboot.service",
        "enverge-agent-rails.path",
        "enverge-agent-rails.service",
        "enverge-tenant-firewall-refresh.path",
        "enverge-tenant-firewall-refresh.service",
    ] {
        assert!(
            text.contains(&format!("/etc/systemd/system/{unit}")),
            "{unit}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    // The script, and the two it carries in heredocs (which shellcheck reads as text): the
    // detached finish and the rollback.
    let inside = |from: &str, to: &str| {
        let start = text.find(from).unwrap() + from.len();
        text[start..start + text[start..].find(to).unwrap()].to_owned()
    };
    let scripts = [
        ("install.sh", text.clone()),
        ("finish.sh", inside("<<'FINISH'\n", "\nFINISH\n")),
        ("rollback.sh", inside("<<'ROLLBACK'\n", "ROLLBACK\n")),
    ];
    for (name, body) in scripts {
        assert!(body.starts_with("#!/"), "{name}: {body}");
        let path = dir.path().join(name);
        std::fs::write(&path, &body).unwrap();
        if byo_core::testing::have_tools(&["shellcheck"]) {
            let out = std::process::Command::new("shellcheck")
                .arg("--severity=style")
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    }

    // Agent builds come from the release directory, by name only.
    std::fs::write(dir.path().join("byo-agent-aarch64"), b"binary").unwrap();
    std::fs::write(dir.path().join("cloudflared-aarch64"), b"connector").unwrap();
    std::fs::write(dir.path().join("cloudflared-aarch64.sha256"), b"beside").unwrap();
    std::fs::write(dir.path().join("byo-agent-aarch64.sig"), b"signature").unwrap();
    std::fs::write(dir.path().join("secret"), b"no").unwrap();
    let mut config = support::test_config();
    config.release_dir = Some(dir.path().to_owned());
    config.release_key = Some("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE release".into());
    app.state = byo_server::AppState::new(app.db.store.clone(), config);
    app.router = byo_server::router(app.state.clone());
    assert_eq!(
        app.get("/agent/byo-agent-aarch64", None).await.body,
        b"binary"
    );
    // The build's signature beside it; the key it must verify against comes in install.sh.
    assert_eq!(
        app.get("/agent/byo-agent-aarch64.sig", None).await.body,
        b"signature"
    );
    assert!(
        app.get("/install.sh", None)
            .await
            .text()
            .contains("release_key='ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIE release'")
    );
    assert_eq!(
        app.get("/cloudflared/cloudflared-aarch64", None).await.body,
        b"connector"
    );
    for bad in [
        "/agent/secret",
        "/agent/byo-agent-..%2Fsecret",
        "/agent/install.sh",
        "/agent/byo-agent-",
        "/agent/cloudflared-aarch64",
        "/cloudflared/byo-agent-aarch64",
        "/cloudflared/cloudflared-..%2Fsecret",
        // The digest a host checks comes with its credentials, never from beside the file.
        "/cloudflared/cloudflared-aarch64.sha256",
    ] {
        assert_eq!(
            app.get(bad, None).await.status,
            StatusCode::NOT_FOUND,
            "{bad}"
        );
    }
}

/// A new installation cannot hand out a one-liner bound to fail: until an operator-key list
/// is published, host-provision refuses with the reason and where to fix it, and allocates
/// nothing; once one is published the same request provisions.
async fn a_provisioning_waits_for_a_published_operator_key_list(app: TestApp) {
    let owner = app.community_host("owner@example.com").await;
    let refused = owner
        .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
        .await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{}", refused.text());
    let body = refused.json();
    assert_eq!(body["error"], "no_operator_keys");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("/admin/operator-keys"),
        "{body}"
    );
    assert_eq!(app.db.outstanding_allocations(&owner.sub).await.unwrap(), 0);
    assert!(app.db.enrollment_views(None).await.unwrap().is_empty());
    // The owner's page shows the same refusal in place.
    let page = owner
        .post_form("/hosts", &[("profile_id", "gb10-spark-1")])
        .await;
    assert_eq!(page.status, StatusCode::CONFLICT);
    assert!(
        page.text().contains("/admin/operator-keys"),
        "{}",
        page.text()
    );
    assert!(app.db.enrollment_views(None).await.unwrap().is_empty());

    app.publish_operator_keys().await;
    let provisioned = owner
        .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
        .await;
    assert_eq!(
        provisioned.status,
        StatusCode::CREATED,
        "{}",
        provisioned.text()
    );
}

on_each_backend!(a_provisioning_waits_for_a_published_operator_key_list);

/// Step 28's single use, through `POST /api/enroll` as host-enroll really runs it: eight
/// machines present one token at once. Exactly one enrols; every other gets the one 401 an
/// unknown token gets — the whole answer, headers included — and nothing of theirs is
/// written: no second node, no rejection parking the enrolment (which would send reap after
/// a host that had just enrolled). On PostgreSQL this is the row lock's test.
async fn b28_eight_concurrent_enrolls_with_one_token_one_wins_every_loser_the_same_401(w: World) {
    use http_body_util::BodyExt;
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    w.relay_settled(&host_id).await;
    let token = p["token"].as_str().unwrap().to_owned();
    let request = |token: &str, hardware_id: String| {
        let mut body = spark();
        body["hardware_id"] = json!(hardware_id);
        Request::post("/api/enroll")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(header::CONTENT_TYPE, "application/json")
            // One id for every caller, so the answers can be compared whole.
            .header("x-request-id", "same-for-every-caller")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let callers: Vec<_> = (0..8)
        .map(|i| {
            let router = w.app.router.clone();
            let req = request(&token, format!("b41c-{i}"));
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let resp = router.oneshot(req).await.unwrap();
                let (parts, body) = resp.into_parts();
                let body = body.collect().await.unwrap().to_bytes().to_vec();
                (format!("b41c-{i}"), parts.status, parts.headers, body)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for c in callers {
        answers.push(c.await.unwrap());
    }
    let statuses: Vec<_> = answers.iter().map(|a| a.1.as_u16()).collect();
    let winners: Vec<_> = answers.iter().filter(|a| a.1 == StatusCode::OK).collect();
    assert_eq!(winners.len(), 1, "one winner: {statuses:?}");
    let losers: Vec<_> = answers
        .iter()
        .filter(|a| a.1 != StatusCode::OK)
        .map(|a| (a.1, a.2.clone(), a.3.clone()))
        .collect();
    assert_eq!(losers.len(), 7);
    for l in &losers {
        assert_eq!(
            l, &losers[0],
            "every loser gets the same answer, headers included"
        );
    }
    assert_eq!(losers[0].0, StatusCode::UNAUTHORIZED, "{statuses:?}");
    // …and it is the answer an unknown token gets.
    let unknown = SecretToken::generate(TokenKind::Enrollment);
    let resp = w.app.send(request(unknown.expose(), "zz".into())).await;
    assert_eq!(
        (resp.status, resp.headers, resp.body),
        losers[0].clone(),
        "a loser learns nothing an unknown token does not"
    );

    // Read back: the winner's machine is the host, and only it.
    let nodes = w.app.db.host_nodes(&host_id).await.unwrap();
    assert_eq!(
        nodes
            .iter()
            .map(|n| n.hardware_id.as_str())
            .collect::<Vec<_>>(),
        [winners[0].0.as_str()]
    );
    let e = w
        .app
        .db
        .enrollment(p["enrollment_id"].as_str().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(e.state, EnrollmentState::Enrolled);
    let rejected = w
        .app
        .db
        .audit_log(100)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action == "host.enroll_rejected")
        .count();
    assert_eq!(rejected, 0, "no loser parked the enrolment as rejected");
    assert!(
        w.app
            .db
            .host(&host_id)
            .await
            .unwrap()
            .unwrap()
            .pubkey
            .is_some()
    );
}

/// H: revoke is for an enrolment that has not redeemed. One that has is refused (409
/// `not_revocable`), through the API and the page, and nothing changes: the enrolment stays
/// enrolled, the host keeps its row, node, relay and tunnel, and no revoke is audited.
async fn h_revoking_a_redeemed_enrolment_is_refused_and_changes_nothing(w: World) {
    let p = w.provision(&w.owner, "gb10-spark-1").await.json();
    let host_id = p["host_id"].as_str().unwrap().to_owned();
    let enrollment_id = p["enrollment_id"].as_str().unwrap().to_owned();
    w.relay_settled(&host_id).await;
    assert_eq!(
        w.enroll(p["token"].as_str().unwrap(), spark()).await.status,
        StatusCode::OK
    );
    let before = w.app.db.enrollment(&enrollment_id).await.unwrap().unwrap();
    let relays = w.relays.relays.lock().unwrap().len();
    let tunnels = w.tunnels.inner.tunnels.lock().unwrap().len();

    let r =
        w.op.post_empty(&format!("/api/admin/enrollments/{enrollment_id}/revoke"))
            .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_revocable"))
    );
    let page =
        w.op.post_form(&format!("/admin/enrollments/{enrollment_id}/revoke"), &[])
            .await;
    assert_eq!(page.status, StatusCode::CONFLICT);

    let after = w.app.db.enrollment(&enrollment_id).await.unwrap().unwrap();
    assert_eq!(
        (after.state, after.redeemed_at),
        (EnrollmentState::Enrolled, before.redeemed_at)
    );
    let host = w
        .app
        .db
        .host(&host_id)
        .await
        .unwrap()
        .expect("the host stays");
    assert!(host.pubkey.is_some());
    assert_eq!(w.app.db.host_nodes(&host_id).await.unwrap().len(), 1);
    assert_eq!(w.relays.relays.lock().unwrap().len(), relays);
    assert_eq!(w.tunnels.inner.tunnels.lock().unwrap().len(), tunnels);
    assert!(
        w.app
            .db
            .audit_log(100)
            .await
            .unwrap()
            .iter()
            .all(|a| a.action != "enrollment.revoke")
    );
    // A sweep after the refusal hands nothing back either.
    byo_server::app::reap::reap_once(&w.app.state)
        .await
        .unwrap();
    assert!(w.app.db.host(&host_id).await.unwrap().is_some());
}

with_world!(
    b28_eight_concurrent_enrolls_with_one_token_one_wins_every_loser_the_same_401,
    h_revoking_a_redeemed_enrolment_is_refused_and_changes_nothing,
);
