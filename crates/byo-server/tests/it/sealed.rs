//! Sealed values bound to where they are kept (issue #36, 8; docs/security.md 6f), on both
//! backends, through provisioning, redeem, the agent client and a relay's secrets fetch: a
//! sealed value copied into another host's row, or into another column, does not open
//! there; `sealed:v1:` values kept before the binding are re-sealed in place once, when the
//! server starts, and still work; a v1 value written after that never opens.

use crate::support;
use crate::with_world;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use base64::Engine;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::hosts::AgentTargetRow;
use byo_db::sealed::SealedColumn;
use byo_server::agents::{HostAgents, HttpAgents};
use byo_server::relay_ca::{RelayCaSource, relay_name};
use byo_server::seal::{SealedAt, V1_PREFIX, V2_PREFIX};
use chacha20poly1305::aead::{Aead, KeyInit};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use support::{TestApp, User};

struct World {
    app: TestApp,
    owner: User,
}

async fn world(backend: byo_db::Backend) -> Option<World> {
    let app = TestApp::new(backend).await?;
    app.publish_operator_keys().await;
    let owner = app.community_host("owner@example.com").await;
    Some(World { app, owner })
}

with_world!(
    a36_8_a_sealed_value_copied_to_another_row_or_column_does_not_open_there,
    a36_8_v1_values_are_resealed_in_place_once_at_start_and_a_later_one_never_opens,
);

/// A host as host-provision leaves it: its id, slug and enrolment token.
struct Provisioned {
    id: String,
    slug: String,
    token: String,
}

impl World {
    fn db(&self) -> &byo_db::Store {
        &self.app.db.store
    }

    /// "Add a GPU", waiting for relay-provision to record the relay (at 127.0.0.1).
    async fn provisioned(&self) -> Provisioned {
        let r = self
            .owner
            .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        let p = r.json();
        let id = p["host_id"].as_str().unwrap().to_owned();
        self.app.relay_recorded(&id).await;
        Provisioned {
            id,
            slug: p["slug"].as_str().unwrap().to_owned(),
            token: p["token"].as_str().unwrap().to_owned(),
        }
    }

    /// Redeem `token` for a machine whose hardware id is `hardware_id`.
    async fn enroll(&self, token: &str, hardware_id: &str) -> support::Reply {
        let machine = json!({
            "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
            "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
            "machine_id": format!("m-{hardware_id}"), "hardware_id": hardware_id,
            "node_index": 0, "rails": []
        });
        self.app
            .send(
                Request::post("/api/enroll")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(machine.to_string()))
                    .unwrap(),
            )
            .await
    }

    /// `column`'s value in `row`, as the Store reads sealed values.
    async fn sealed(&self, column: SealedColumn, row: &str) -> Option<String> {
        self.db()
            .sealed_values(column, "sealed:")
            .await
            .unwrap()
            .into_iter()
            .find(|v| v.row == row)
            .map(|v| v.sealed)
    }

    /// Write `value` into `column` of `row`, as someone with write access to the database
    /// would: a raw update, bypassing every rule.
    async fn write_raw(&self, column: SealedColumn, row: &str, value: &str) {
        let (table, col) = column.name().split_once('.').unwrap();
        let written = self
            .app
            .db
            .execute_unchecked(&format!(
                "update {table} set {col} = '{value}' where cast(id as text) = '{row}'"
            ))
            .await
            .unwrap();
        assert_eq!(written, 1, "{} of {row}", column.name());
    }

    /// The server's agent client, reaching relays on `port`.
    fn agent_client(&self, port: u16) -> HttpAgents {
        HttpAgents::new(
            self.app.state.sealer.clone(),
            self.app.state.relay_ca.clone(),
            &self.app.state.config.public_url,
        )
        .with_port(port)
    }

    /// A stub of `host`'s agent behind its relay's TLS front (a certificate from this
    /// installation's relay CA): it accepts only `token`. Its port and how many requests
    /// reached it.
    async fn agent_behind_relay(
        &self,
        host: &Provisioned,
        token: &str,
    ) -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
        let expected = format!("Bearer {token}");
        let agent = axum::Router::new().route(
            "/v1/operator-keys",
            axum::routing::put(move |h: axum::http::HeaderMap| async move {
                if h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
                    == Some(expected.as_str())
                {
                    StatusCode::NO_CONTENT
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        );
        let cert = self
            .app
            .state
            .relay_ca
            .get()
            .await
            .unwrap()
            .issue(
                &relay_name(&host.slug, &self.app.state.config.public_url),
                chrono::Utc::now(),
            )
            .unwrap();
        support::relay_tls::serve(agent, &cert).await
    }

    async fn target(&self, host_id: &str) -> AgentTargetRow {
        self.db()
            .agent_targets()
            .await
            .unwrap()
            .into_iter()
            .find(|t| t.id == host_id)
            .unwrap()
    }

    /// A relay's first-boot fetch of `host_id`'s secrets, with a token issued now.
    async fn relay_secrets(&self, host_id: &str) -> support::Reply {
        let token = SecretToken::generate(TokenKind::RelaySecrets);
        self.db()
            .issue_relay_secrets_token(
                host_id,
                token.hash().as_str(),
                self.app.state.clock.now() + chrono::Duration::hours(1),
            )
            .await
            .unwrap();
        self.app
            .send(
                Request::post("/api/relay/secrets")
                    .header(header::AUTHORIZATION, format!("Bearer {}", token.expose()))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
    }

    /// `plaintext` sealed as a server before issue #36 (8) sealed it: `sealed:v1:`, no
    /// associated data. Written out here rather than taken from `seal`, so that the format
    /// in the field is pinned by the test, not by the code it tests.
    fn seal_v1(&self, plaintext: &str) -> String {
        let key = hex::decode(
            self.app
                .state
                .config
                .secret_key
                .as_ref()
                .unwrap()
                .expose_secret(),
        )
        .unwrap();
        v1_with_key(&key, plaintext)
    }
}

fn v1_with_key(key: &[u8], plaintext: &str) -> String {
    let cipher = chacha20poly1305::XChaCha20Poly1305::new_from_slice(key).unwrap();
    let nonce: [u8; 24] = rand::random();
    let mut out = nonce.to_vec();
    out.extend(
        cipher
            .encrypt(&chacha20poly1305::XNonce::from(nonce), plaintext.as_bytes())
            .unwrap(),
    );
    format!(
        "{V1_PREFIX}{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(out)
    )
}

/// Someone who can write the database but not read the server's key copies host A's sealed
/// values into host B's rows, or one column's into another: each is refused where it lands
/// (the agent client sends no token, redeem hands over nothing, a relay gets no key), and
/// B's own values, put back, work.
async fn a36_8_a_sealed_value_copied_to_another_row_or_column_does_not_open_there(w: World) {
    let a = w.provisioned().await;
    let b = w.provisioned().await;
    let a_enrollment = w
        .db()
        .enrollment_views(None)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.host_id.as_deref() == Some(a.id.as_str()))
        .unwrap()
        .id;
    let b_enrollment = w
        .db()
        .enrollment_views(None)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.host_id.as_deref() == Some(b.id.as_str()))
        .unwrap()
        .id;
    let a_secrets = w
        .sealed(SealedColumn::EnrollmentSecrets, &a_enrollment)
        .await
        .unwrap();
    let b_secrets = w
        .sealed(SealedColumn::EnrollmentSecrets, &b_enrollment)
        .await
        .unwrap();
    assert!(a_secrets.starts_with(V2_PREFIX) && b_secrets.starts_with(V2_PREFIX));

    // A's enrolment secrets (its WireGuard key, its ssh-map token) in B's enrolment: B's
    // redeem is refused as our fault, writing nothing, and B's token stays good.
    w.write_raw(SealedColumn::EnrollmentSecrets, &b_enrollment, &a_secrets)
        .await;
    let refused = w.enroll(&b.token, "hw-b").await;
    assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!refused.text().contains("byo_map_"));
    assert!(w.db().host(&b.id).await.unwrap().unwrap().pubkey.is_none());
    w.write_raw(SealedColumn::EnrollmentSecrets, &b_enrollment, &b_secrets)
        .await;

    // A's tunnel token in B's row: B's redeem hands over no connector token.
    let a_tunnel = w.sealed(SealedColumn::TunnelToken, &a.id).await.unwrap();
    w.write_raw(SealedColumn::TunnelToken, &b.id, &a_tunnel)
        .await;
    let enrolled_a = w.enroll(&a.token, "hw-a").await;
    assert_eq!(enrolled_a.status, StatusCode::OK, "{}", enrolled_a.text());
    let enrolled_a = enrolled_a.json();
    assert!(enrolled_a["tunnel_connector_token"].is_string());
    let enrolled_b = w.enroll(&b.token, "hw-b").await;
    assert_eq!(enrolled_b.status, StatusCode::OK, "{}", enrolled_b.text());
    let enrolled_b = enrolled_b.json();
    assert_eq!(enrolled_b["tunnel_connector_token"], Value::Null);
    assert_ne!(
        enrolled_b["wireguard"]["private_key"],
        enrolled_a["wireguard"]["private_key"]
    );

    // B's agent, behind B's relay, takes B's agent token; the server presents it.
    let b_agent_token = enrolled_b["agent_token"].as_str().unwrap();
    let (port, reached) = w.agent_behind_relay(&b, b_agent_token).await;
    let client = w.agent_client(port);
    client
        .push_operator_keys(&w.target(&b.id).await, b"{}")
        .await
        .unwrap();
    assert_eq!(reached.load(Ordering::SeqCst), 1);

    // A's sealed agent token in B's row: the server does not open it, so B's relay (or
    // whoever holds B's relay name) is sent nothing, A's token least of all.
    let a_sealed_agent = w.sealed(SealedColumn::AgentToken, &a.id).await.unwrap();
    let b_sealed_agent = w.sealed(SealedColumn::AgentToken, &b.id).await.unwrap();
    w.write_raw(SealedColumn::AgentToken, &b.id, &a_sealed_agent)
        .await;
    let refused = client
        .push_operator_keys(&w.target(&b.id).await, b"{}")
        .await
        .unwrap_err();
    assert!(refused.contains("sealed"), "{refused}");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        1,
        "nothing reached B's relay"
    );
    // B's own, put back, is sent again.
    w.write_raw(SealedColumn::AgentToken, &b.id, &b_sealed_agent)
        .await;
    client
        .push_operator_keys(&w.target(&b.id).await, b"{}")
        .await
        .unwrap();
    assert_eq!(reached.load(Ordering::SeqCst), 2);

    // The relay's WireGuard key: A's in B's row, or B's own agent token in B's key column,
    // and B's relay gets no key.
    let a_relay_key = w.sealed(SealedColumn::RelayWgKey, &a.id).await.unwrap();
    let b_relay_key = w.sealed(SealedColumn::RelayWgKey, &b.id).await.unwrap();
    let served = w.relay_secrets(&b.id).await;
    assert_eq!(served.status, StatusCode::OK, "{}", served.text());
    for wrong in [&a_relay_key, &b_sealed_agent] {
        w.write_raw(SealedColumn::RelayWgKey, &b.id, wrong).await;
        let refused = w.relay_secrets(&b.id).await;
        assert_eq!(refused.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!refused.text().contains("PRIVATE KEY"));
    }
    w.write_raw(SealedColumn::RelayWgKey, &b.id, &b_relay_key)
        .await;
    assert_eq!(
        wireguard_key(&w.relay_secrets(&b.id).await.text()),
        wireguard_key(&served.text())
    );

    // The relay CA's key sealed for a host's relay key column is not the CA's key.
    let ca_key = w
        .sealed(SealedColumn::RelayCaKey, byo_db::sealed::RELAY_CA_ROW)
        .await
        .unwrap();
    w.write_raw(
        SealedColumn::RelayCaKey,
        byo_db::sealed::RELAY_CA_ROW,
        &b_relay_key,
    )
    .await;
    let fresh = RelayCaSource::new(w.db().clone(), w.app.state.sealer.clone());
    assert!(fresh.get().await.is_err());
    w.write_raw(
        SealedColumn::RelayCaKey,
        byo_db::sealed::RELAY_CA_ROW,
        &ca_key,
    )
    .await;
    let fresh = RelayCaSource::new(w.db().clone(), w.app.state.sealer.clone());
    assert!(fresh.get().await.is_ok());
}

/// Values sealed before the binding (`sealed:v1:`) in every sealed column: none opens
/// before the pass; the server's start (`byo_server::serve`) re-seals each in place for its
/// own row and each works as before; a v1 value that does not open with the key is left and
/// keeps the pass open; once the pass has finished, a v1 value written in (an old copy of
/// another host's) never opens, and a later start does not re-seal it.
async fn a36_8_v1_values_are_resealed_in_place_once_at_start_and_a_later_one_never_opens(w: World) {
    let a = w.provisioned().await;
    let b = w.provisioned().await;
    let enrolled = w.enroll(&a.token, "hw-a").await;
    assert_eq!(enrolled.status, StatusCode::OK, "{}", enrolled.text());
    let a_agent_token = enrolled.json()["agent_token"].as_str().unwrap().to_owned();
    let (port, reached) = w.agent_behind_relay(&a, &a_agent_token).await;
    let client = w.agent_client(port);
    let relay_key_before = w.relay_secrets(&a.id).await;
    assert_eq!(relay_key_before.status, StatusCode::OK);
    let sealer = w.app.state.sealer.clone().unwrap();

    // Every value in every sealed column, written back as the server before the binding
    // wrote it.
    let mut kept = Vec::new();
    for column in SealedColumn::ALL {
        for v in w.db().sealed_values(column, V2_PREFIX).await.unwrap() {
            let plaintext = sealer
                .open(&SealedAt::new(column, &v.row), &v.sealed)
                .unwrap();
            w.write_raw(column, &v.row, &w.seal_v1(&plaintext)).await;
            kept.push((column, v.row, plaintext));
        }
    }
    let columns: std::collections::BTreeSet<_> = kept.iter().map(|k| k.0.name()).collect();
    assert_eq!(columns.len(), SealedColumn::ALL.len(), "{columns:?}");

    // Before the pass a v1 value opens nowhere.
    let refused = client
        .push_operator_keys(&w.target(&a.id).await, b"{}")
        .await
        .unwrap_err();
    assert!(refused.contains("sealed"), "{refused}");
    assert_eq!(reached.load(Ordering::SeqCst), 0);
    assert_eq!(
        w.relay_secrets(&a.id).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );

    // One v1 value sealed with another key: left as it is, and the pass stays open.
    let foreign = v1_with_key(&[9u8; 32], "byo_agt_foreign");
    w.write_raw(SealedColumn::AgentToken, &b.id, &foreign).await;
    let first = byo_server::app::sealed::reseal_at_start(&w.app.state)
        .await
        .unwrap();
    assert_eq!((first.resealed, first.unopened), (kept.len(), 1));
    assert_eq!(
        w.sealed(SealedColumn::AgentToken, &b.id).await.as_deref(),
        Some(foreign.as_str())
    );
    assert!(w.db().sealed_values_resealed_at().await.unwrap().is_none());
    for (column, row, plaintext) in &kept {
        let now = w.sealed(*column, row).await.unwrap();
        assert!(now.starts_with(V2_PREFIX), "{} of {row}", column.name());
        assert_eq!(
            &sealer.open(&SealedAt::new(*column, row), &now).unwrap(),
            plaintext
        );
    }

    // Each works as before: the agent is sent its token, the relay its key, B's redeem its
    // secrets, the relay CA opens.
    client
        .push_operator_keys(&w.target(&a.id).await, b"{}")
        .await
        .unwrap();
    assert_eq!(reached.load(Ordering::SeqCst), 1);
    let relay_key_after = w.relay_secrets(&a.id).await;
    assert_eq!(relay_key_after.status, StatusCode::OK);
    assert_eq!(
        wireguard_key(&relay_key_after.text()),
        wireguard_key(&relay_key_before.text())
    );
    assert!(
        RelayCaSource::new(w.db().clone(), w.app.state.sealer.clone())
            .get()
            .await
            .is_ok()
    );
    w.write_raw(
        SealedColumn::AgentToken,
        &b.id,
        &sealer.seal(&SealedAt::agent_token(&b.id), "byo_agt_b"),
    )
    .await;
    let enrolled_b = w.enroll(&b.token, "hw-b").await;
    assert_eq!(enrolled_b.status, StatusCode::OK, "{}", enrolled_b.text());
    assert!(enrolled_b.json()["tunnel_connector_token"].is_string());

    // The server's start runs the pass: with nothing left that does not open, it finishes
    // and says so. (A second server on the same database: `serve` closes its store when it
    // stops.)
    let store = byo_db::Store::connect(&w.app.db.url).await.unwrap();
    let server = byo_server::AppState::new(store, (*w.app.state.config).clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(byo_server::serve(server, listener, async {
        let _ = stopped.await;
    }));
    let mut finished = None;
    for _ in 0..500 {
        finished = w.db().sealed_values_resealed_at().await.unwrap();
        if finished.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(finished.is_some(), "serve did not run the pass");
    let _ = stop.send(());
    serving.await.unwrap().unwrap();

    // From here a v1 value — an old copy of A's agent token, or of another host's — is
    // never opened, and no later start re-seals it.
    w.write_raw(SealedColumn::AgentToken, &a.id, &w.seal_v1(&a_agent_token))
        .await;
    let again = byo_server::app::sealed::reseal_at_start(&w.app.state)
        .await
        .unwrap();
    assert!(again.already_done && again.resealed == 0);
    assert!(
        w.sealed(SealedColumn::AgentToken, &a.id)
            .await
            .unwrap()
            .starts_with(V1_PREFIX)
    );
    let refused = client
        .push_operator_keys(&w.target(&a.id).await, b"{}")
        .await
        .unwrap_err();
    assert!(refused.contains("sealed"), "{refused}");
    assert_eq!(
        reached.load(Ordering::SeqCst),
        1,
        "nothing more reached A's relay"
    );
}

/// The WireGuard private key in a relay's secrets answer.
fn wireguard_key(answer: &str) -> String {
    answer
        .lines()
        .find(|l| l.starts_with("wireguard-private-key "))
        .unwrap_or_else(|| panic!("no WireGuard key in the answer"))
        .to_owned()
}
