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
        ..byo_listen::Limits::default()
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

/// #36.1: a trickled body and one address past its share, through `byo_server::serve`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a36_1_held_connections_are_cut() {
    let Some(db) = byo_db::testing::fresh(byo_db::Backend::Sqlite).await else {
        return;
    };
    let mut config = support::test_config();
    let limits = byo_listen::testing::HELD_PROBE_LIMITS;
    config.listener = limits;
    let state = AppState::new(db.store.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(byo_server::serve(state, listener, std::future::pending()));
    byo_listen::testing::held_connections_are_cut(
        addr,
        limits,
        "POST /api/auth/login HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n",
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

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// #36.4: clients that ask for an agent build and never read it hold no copy of it. Twenty
/// of them against a 48 MB build, through `byo_server::serve`: the server's memory grows by
/// far less than one build each (it held the whole file per response, 20 readers took it
/// from 68 to 231 MB), `/healthz` still answers, and a client that reads gets every byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a36_4_readers_that_never_read_a_build_hold_no_copy_of_it() {
    use sha2::Digest;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const BUILD: usize = 48 << 20;
    const READERS: usize = 20;
    let Some(db) = byo_db::testing::fresh(byo_db::Backend::Sqlite).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut digest = sha2::Sha256::new();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.path().join("byo-agent-x86_64")).unwrap();
        let mut chunk = vec![0u8; 1 << 20];
        for i in 0..(BUILD >> 20) {
            chunk
                .iter_mut()
                .enumerate()
                .for_each(|(j, b)| *b = (i * 31 + j * 7) as u8);
            digest.update(&chunk);
            f.write_all(&chunk).unwrap();
        }
    }
    let want = digest.finalize();
    let mut config = support::test_config();
    config.release_dir = Some(dir.path().to_owned());
    config.listener.max_connections = 64;
    let state = AppState::new(db.store.clone(), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(byo_server::serve(state, listener, std::future::pending()));
    let get = "GET /agent/byo-agent-x86_64 HTTP/1.1\r\nHost: localhost\r\n\r\n";

    let before = rss();
    let mut held = Vec::new();
    for _ in 0..READERS {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(get.as_bytes()).await.unwrap();
        // The answer has begun (its head is here); from now on this client reads nothing.
        let mut head = [0u8; 512];
        let n = s.read(&mut head).await.unwrap();
        assert!(
            head[..n].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&head[..n])
        );
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss().saturating_sub(before);
    assert!(
        grown < (BUILD as u64) * 2,
        "{READERS} readers that never read grew the server by {} MB: a copy each",
        grown >> 20
    );

    let healthz = reqwest::get(format!("http://{addr}/healthz"))
        .await
        .unwrap();
    assert_eq!(healthz.status(), 200);
    let whole = reqwest::get(format!("http://{addr}/agent/byo-agent-x86_64"))
        .await
        .unwrap();
    assert_eq!(
        whole.headers()["content-length"].to_str().unwrap(),
        BUILD.to_string()
    );
    let body = whole.bytes().await.unwrap();
    assert_eq!(sha2::Sha256::digest(&body), want, "every byte, in order");
    drop(held);
}
