//! The real agent's VM API over HTTP, with LXD's REST socket answered by a fake on a Unix
//! socket: the answers the backend acts on, pinned where they are made. The backend reads
//! a delete's 404 as the confirmation that nothing is left (G.5), so its exact body —
//! `byo_wire::vm::AgentRefusal` with `not_found` — is a contract, tested here without LXD
//! and again on a real host in `instances_real_host.rs`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::routing::get;
use byo_agent::host::{Fallible, LocalHost};
use byo_agent::operator_keys::{OperatorKeys, Paths};
use byo_agent::serve::{Serving, router};
use byo_agent::vms::VmService;
use byo_agent::vms::{RelayMap, VmConfig};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_wire::relay::{MapTarget, SshMap};
use byo_wire::vm::{AgentErrorCode, AgentRefusal};
use serde_json::json;

/// A relay that must not be reached: deleting what is not there touches no map.
struct NoRelay;

impl RelayMap for NoRelay {
    fn get(&self) -> Fallible<SshMap> {
        Err("the relay was called".into())
    }
    fn put_port(&self, _: u16, _: &MapTarget) -> Fallible<()> {
        Err("the relay was called".into())
    }
    fn delete_port(&self, _: u16) -> Fallible<()> {
        Err("the relay was called".into())
    }
    fn put(&self, _: &SshMap) -> Fallible<()> {
        Err("the relay was called".into())
    }
}

/// LXD holding one instance of ours, `other-vm`; every other path is LXD's own 404.
async fn fake_lxd(socket: &std::path::Path) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let app = Router::new()
        .route(
            "/1.0/instances",
            get(|| async {
                axum::Json(json!({
                    "type": "sync", "status": "Success", "status_code": 200,
                    "metadata": [{"name": "other-vm", "status": "Running",
                                  "config": {"user.enverge.ssh_port": "2201"}}]
                }))
            }),
        )
        .fallback(|| async {
            (
                axum::http::StatusCode::NOT_FOUND,
                axum::Json(json!({"type": "error", "error": "Not Found", "error_code": 404})),
            )
        })
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let log = log.clone();
                async move {
                    log.lock()
                        .unwrap()
                        .push(format!("{} {}", req.method(), req.uri()));
                    next.run(req).await
                }
            },
        ));
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_deleting_an_instance_the_host_does_not_hold_answers_the_not_found_body() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("lxd.socket");
    let lxd = fake_lxd(&socket).await;
    let token = SecretToken::generate(TokenKind::Agent);
    let serving = Serving {
        token_hash: Arc::new(token.hash()),
        operator_keys: OperatorKeys {
            paths: Paths {
                trusted: dir.path().join("signing-keys"),
                held: dir.path().join("held"),
                authorized_keys: dir.path().join("authorized_keys"),
                request: dir.path().join("operator-keys-requested"),
            },
            environment: "production".into(),
            host: None,
        },
        vms: Some(Arc::new(VmService {
            config: VmConfig {
                ssh_listen: "10.8.0.2".into(),
                gpu: false,
                tunnel: Some(false),
                operator_keys_held: None,
                prepare_lock: None,
                machines: byo_agent::machines::Machines::single(),
                reboot_flag: None,
            },
            relay: Box::new(NoRelay),
            host: Mutex::new(LocalHost {
                root: dir.path().to_owned(),
                lxd_sockets: vec![socket.clone()],
                spawned: 0,
            }),
        })),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(serving)).await.unwrap() });

    let resp = reqwest::Client::new()
        .delete(format!("http://{addr}/v1/vms/missing-vm"))
        .bearer_auth(token.expose())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 404);
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let body = resp.bytes().await.unwrap();
    // The exact bytes the backend parses…
    assert_eq!(
        std::str::from_utf8(&body).unwrap(),
        r#"{"error":"not_found","message":"no such instance on this host"}"#
    );
    // …which are the wire type's not_found.
    let refusal: AgentRefusal = serde_json::from_slice(&body).unwrap();
    assert_eq!(refusal.error, AgentErrorCode::NotFound);
    // It asked LXD what it holds, and deleted nothing.
    let seen = lxd.lock().unwrap().clone();
    assert_eq!(seen, ["GET /1.0/instances?recursion=1"], "{seen:?}");
}

/// Host configuration after go-live (L): while an operator prepares the host again
/// (`byo-agent prepare --again` holds the lock exclusively), a create, a start and a reboot
/// are refused at once with `host_preparing` — which the backend answers as no capacity —
/// and nothing reaches LXD for them; once the run lets go, the same create is judged as
/// usual (here: the host holds `other-vm`, host_occupied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l_creates_and_starts_are_refused_host_preparing_while_a_re_prepare_holds_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("lxd.socket");
    let lxd = fake_lxd(&socket).await;
    let lock = dir.path().join("prepare.lock");
    let token = SecretToken::generate(TokenKind::Agent);
    let serving = Serving {
        token_hash: Arc::new(token.hash()),
        operator_keys: OperatorKeys {
            paths: Paths {
                trusted: dir.path().join("signing-keys"),
                held: dir.path().join("held"),
                authorized_keys: dir.path().join("authorized_keys"),
                request: dir.path().join("operator-keys-requested"),
            },
            environment: "production".into(),
            host: None,
        },
        vms: Some(Arc::new(VmService {
            config: VmConfig {
                ssh_listen: "10.8.0.2".into(),
                gpu: false,
                tunnel: Some(false),
                operator_keys_held: None,
                prepare_lock: Some(lock.clone()),
                machines: byo_agent::machines::Machines::single(),
                reboot_flag: None,
            },
            relay: Box::new(NoRelay),
            host: Mutex::new(LocalHost {
                root: dir.path().to_owned(),
                lxd_sockets: vec![socket.clone()],
                spawned: 0,
            }),
        })),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(serving)).await.unwrap() });
    let client = reqwest::Client::new();
    let key = byo_core::keylist_testing::private_key()
        .public_key()
        .to_openssh()
        .unwrap();
    let create = || {
        client
            .post(format!("http://{addr}/v1/vms"))
            .bearer_auth(token.expose())
            .json(&json!({"name": "c-new", "ssh_public_key": key, "ssh_hostname": "c-new.example"}))
            .send()
    };

    let run = byo_agent::prepare::again::lock_exclusive(&lock).unwrap();
    let resp = create().await.unwrap();
    assert_eq!(resp.status().as_u16(), 409);
    let refusal: AgentRefusal = resp.json().await.unwrap();
    assert_eq!(refusal.error, AgentErrorCode::HostPreparing);
    assert!(
        refusal.message.contains("preparing this host again")
            && refusal.message.contains("nothing was done"),
        "{}",
        refusal.message
    );
    assert!(
        lxd.lock().unwrap().is_empty(),
        "a refused create reached LXD"
    );
    for action in ["start", "reboot"] {
        let resp = client
            .post(format!("http://{addr}/v1/vms/other-vm/state"))
            .bearer_auth(token.expose())
            .json(&json!({"action": action}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 409, "{action}");
        let refusal: AgentRefusal = resp.json().await.unwrap();
        assert_eq!(refusal.error, AgentErrorCode::HostPreparing, "{action}");
    }
    // Only the reads that found the instance: no state change was asked of LXD.
    let seen = lxd.lock().unwrap().clone();
    assert_eq!(seen, ["GET /1.0/instances?recursion=1"; 2], "{seen:?}");

    drop(run);
    let resp = create().await.unwrap();
    let refusal: AgentRefusal = resp.json().await.unwrap();
    assert_eq!(
        refusal.error,
        AgentErrorCode::HostOccupied,
        "{}",
        refusal.message
    );
}
