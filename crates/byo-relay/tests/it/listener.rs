//! ssh_mapd's listener under slow clients (#16 item 7): `mapd::serve`, what `byo-relay
//! serve` runs, with a short header timeout and a small connection cap. The request the
//! other client makes is refused for its missing token before nftables is touched, so no
//! network namespace is needed.

use std::sync::Arc;
use std::time::Duration;

use byo_core::render::nft::Layout;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_relay::mapd::{self, Mapd};
use byo_relay::nft::NftCli;

fn mapd() -> Mapd {
    Mapd {
        token_hash: Arc::new(SecretToken::generate(TokenKind::SshMap).hash()),
        layout: Layout::default(),
        nft: NftCli,
        writes: Arc::new(tokio::sync::Mutex::new(())),
    }
}

/// #36.1: a trickled body and one address past its share, through `mapd::serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a36_1_held_connections_are_cut() {
    let limits = byo_listen::testing::HELD_PROBE_LIMITS;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(mapd::serve(
        listener,
        mapd(),
        limits,
        std::future::pending(),
    ));
    byo_listen::testing::held_connections_are_cut(
        addr,
        limits,
        "PUT /map/22 HTTP/1.1\r\nHost: relay\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n",
        "GET /map HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n",
        401,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_hold_no_connection_the_agent_needs() {
    let state = mapd();
    let limits = byo_listen::Limits {
        header_read_timeout_secs: 2,
        body_read_timeout_secs: 2,
        max_connections: 4,
        ..byo_listen::Limits::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(mapd::serve(listener, state, limits, std::future::pending()));
    byo_listen::testing::slow_clients_hold_nothing(
        addr,
        Duration::from_secs(2),
        4,
        "GET /map HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n",
        401,
    )
    .await;
}
