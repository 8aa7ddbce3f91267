//! The agent's API listener under slow clients (#16 item 7): `serve::answer_on`, what
//! `byo-agent serve` runs, with a short header timeout and a small connection cap.

use std::sync::Arc;
use std::time::Duration;

use byo_agent::operator_keys::{OperatorKeys, Paths};
use byo_agent::serve::{Serving, answer_on};
use byo_core::tokens::{SecretToken, TokenKind};

fn serving(dir: &std::path::Path) -> Serving {
    Serving {
        token_hash: Arc::new(SecretToken::generate(TokenKind::Agent).hash()),
        operator_keys: OperatorKeys {
            paths: Paths {
                trusted: dir.join("signing-keys"),
                held: dir.join("held"),
                authorized_keys: dir.join("authorized_keys"),
                request: dir.join("operator-keys-requested"),
            },
            environment: "production".into(),
            host: None,
        },
        vms: None,
    }
}

/// #36.1: a trickled body and one address past its share, through `answer_on`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a36_1_held_connections_are_cut() {
    let dir = tempfile::tempdir().unwrap();
    let limits = byo_listen::testing::HELD_PROBE_LIMITS;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(answer_on(
        listener,
        serving(dir.path()),
        limits,
        std::future::pending(),
    ));
    byo_listen::testing::held_connections_are_cut(
        addr,
        limits,
        "POST /v1/vms HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n",
        "GET /v1/vms HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n",
        401,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_hold_no_connection_the_backend_needs() {
    let dir = tempfile::tempdir().unwrap();
    let serving = serving(dir.path());
    let limits = byo_listen::Limits {
        header_read_timeout_secs: 2,
        body_read_timeout_secs: 2,
        max_connections: 4,
        ..byo_listen::Limits::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(answer_on(listener, serving, limits, std::future::pending()));
    byo_listen::testing::slow_clients_hold_nothing(
        addr,
        Duration::from_secs(2),
        4,
        "GET /v1/vms HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n",
        401,
    )
    .await;
}

/// #36.5: the token is checked before any body is read. A request announcing a body it never
/// sends, without the token, is answered 401 at once, not after the body-read timeout (30 s
/// here, the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a36_5_the_token_is_checked_before_the_body_is_read() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = byo_listen::Limits::default();
    tokio::spawn(answer_on(
        listener,
        serving(dir.path()),
        limits,
        std::future::pending(),
    ));
    for head in [
        "POST /v1/vms HTTP/1.1\r\nHost: agent\r\nContent-Length: 4096\r\n\r\n",
        "PUT /v1/operator-keys HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer byo_agent_wrong\r\nContent-Length: 4096\r\n\r\n",
    ] {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        let mut got = [0u8; 512];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut got))
            .await
            .expect("the agent waited for a body before checking the token")
            .unwrap();
        let got = String::from_utf8_lossy(&got[..n]);
        assert!(got.starts_with("HTTP/1.1 401"), "{got}");
        assert!(got.contains("unauthorized"), "{got}");
    }
}
