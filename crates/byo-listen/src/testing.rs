//! Slow clients, for each listener's test: connections that stall half-way through a
//! request line, and the one scenario every listener must pass with them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any one wait may take before the test fails: a guard, never a synchroniser.
const GUARD: Duration = Duration::from_secs(20);

/// A client that sends half a request line and stalls (slowloris).
pub async fn stall(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(b"GET /v1 HTT")
        .await
        .expect("write half a line");
    s
}

/// Whether the server has closed `s` yet, without waiting.
pub fn still_open(s: &TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match s.try_read(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
        Ok(0) | Err(_) => false,
        Ok(_) => false,
    }
}

/// Read until the server closes the connection (the event); what it sent before.
pub async fn until_closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    tokio::time::timeout(GUARD, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the server never closed the connection");
    got
}

/// The status of the answer to `request` (a whole HTTP/1.1 request; the server is left to
/// close the connection, or `Connection: close` is in it).
fn status(reply: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(reply);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text:?}"))
}

/// Send `request` on a fresh connection and read the answer to its end.
pub async fn ask(addr: SocketAddr, request: &str) -> (u16, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let reply = until_closed(&mut s).await;
    (status(&reply), started.elapsed())
}

/// The scenario every listener passes, run against a listener serving with
/// `header_read_timeout_secs` = `timeout` and `max_connections` = `cap`; `request` is a
/// complete request ending the connection (`Connection: close`) answered with `want`.
///
/// 1. `cap - 1` clients stall half-way through a request line; another client is served,
///    promptly, while they all still hold their connections.
/// 2. One more stalls: the cap is reached, and a client arriving now is served only once the
///    header timeout has closed the stalled ones.
/// 3. Every stalled connection is closed by the server, after the timeout and not long after.
/// 4. A kept-alive connection that goes quiet after its answer is closed the same way.
pub async fn slow_clients_hold_nothing(
    addr: SocketAddr,
    timeout: Duration,
    cap: usize,
    request: &str,
    want: u16,
) {
    assert!(cap >= 2 && timeout >= Duration::from_secs(2));
    let opened = Instant::now();
    let mut stalled = Vec::new();
    for _ in 0..cap - 1 {
        stalled.push(stall(addr).await);
    }
    let (got, took) = ask(addr, request).await;
    assert_eq!(got, want, "the other client's answer");
    assert!(
        took < timeout,
        "the other client waited {took:?}, as long as the stalled ones are allowed"
    );
    assert!(
        stalled.iter().all(still_open),
        "the stalled clients were still connected while the other was served"
    );

    stalled.push(stall(addr).await);
    let (got, took) = ask(addr, request).await;
    assert_eq!(got, want, "the client past the cap is served in the end");
    let waited_for_a_slot = opened.elapsed();
    assert!(
        waited_for_a_slot >= timeout - Duration::from_millis(500),
        "past the cap of {cap} a client was served after {took:?}, before any slot was freed"
    );

    for s in &mut stalled {
        let sent = until_closed(s).await;
        let at = opened.elapsed();
        assert!(
            at >= timeout - Duration::from_millis(500) && at < timeout + Duration::from_secs(5),
            "a stalled connection closed after {at:?} (the header timeout is {timeout:?})"
        );
        let sent = String::from_utf8_lossy(&sent);
        assert!(
            sent.is_empty() || sent.starts_with("HTTP/1.1 4"),
            "a stalled client got {sent:?}"
        );
    }

    // Idle: a kept-alive connection that says nothing after its answer.
    let keep_alive = request.replace("Connection: close\r\n", "");
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(keep_alive.as_bytes()).await.expect("write");
    let reply = until_closed(&mut s).await;
    assert_eq!(status(&reply), want);
    let idle = started.elapsed();
    assert!(
        idle >= timeout - Duration::from_millis(500),
        "the kept-alive connection was closed after {idle:?}: it was never kept alive"
    );
}
