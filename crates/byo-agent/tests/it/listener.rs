//! The agent's API listener under slow clients (#16 item 7): `serve::answer_on`, what
//! `byo-agent serve` runs, with a short header timeout and a small connection cap.

use std::sync::Arc;
use std::time::Duration;

use byo_agent::operator_keys::{OperatorKeys, Paths};
use byo_agent::serve::{Serving, answer_on};
use byo_core::tokens::{SecretToken, TokenKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_hold_no_connection_the_backend_needs() {
    let dir = tempfile::tempdir().unwrap();
    let serving = Serving {
        token_hash: Arc::new(SecretToken::generate(TokenKind::Agent).hash()),
        operator_keys: OperatorKeys {
            paths: Paths {
                trusted: dir.path().join("signing-keys"),
                held: dir.path().join("held"),
                authorized_keys: dir.path().join("authorized_keys"),
            },
            environment: "production".into(),
        },
        vms: None,
    };
    let limits = byo_listen::Limits {
        header_read_timeout_secs: 2,
        body_read_timeout_secs: 2,
        max_connections: 4,
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
