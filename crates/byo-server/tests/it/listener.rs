//! The server's listener under slow clients (#16 item 7): `byo_server::serve`, what `main`
//! runs, with `[listener]` set to a short header timeout and a small connection cap.

use crate::support;

use std::time::Duration;

use byo_server::AppState;

async fn slow_clients_hold_no_connection_others_need(backend: byo_db::Backend) {
    let Some(db) = byo_db::testing::fresh(backend).await else {
        return;
    };
    let mut config = support::test_config();
    config.listener = byo_listen::Limits {
        header_read_timeout_secs: 2,
        body_read_timeout_secs: 2,
        max_connections: 4,
    };
    let state = AppState::new(db.store.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(byo_server::serve(state, listener, std::future::pending()));
    byo_listen::testing::slow_clients_hold_nothing(
        addr,
        Duration::from_secs(2),
        4,
        "GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        200,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_hold_no_connection_others_need_sqlite() {
    slow_clients_hold_no_connection_others_need(byo_db::Backend::Sqlite).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_hold_no_connection_others_need_postgres() {
    slow_clients_hold_no_connection_others_need(byo_db::Backend::Postgres).await
}
