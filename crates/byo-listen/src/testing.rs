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

/// The limits [`held_connections_are_cut`] is run with: a 2 s body-read timeout and a 3 s
/// body deadline, a cap of 8 and a share of 3 per address.
pub const HELD_PROBE_LIMITS: crate::Limits = crate::Limits {
    header_read_timeout_secs: 2,
    body_read_timeout_secs: 2,
    body_deadline_secs: 3,
    write_timeout_secs: 2,
    max_connections: 8,
    max_connections_per_source: 3,
    shutdown_grace_secs: 1,
};

/// A connection to `addr` from the loopback address `from` (127.0.0.0/8 is all this
/// machine's), so a test can be several sources at once.
pub async fn connect_from(from: std::net::Ipv4Addr, addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("bind a loopback source");
    socket.connect(addr).await.expect("connect")
}

/// The probes of issue #36.1, run against a listener serving with a body-read timeout of
/// `limits.body_read_timeout_secs`, a body deadline of `limits.body_deadline_secs` and
/// `limits.max_connections_per_source` (the header timeout and the cap as in
/// [`slow_clients_hold_nothing`]). `post` is a request head announcing a body of 4096 bytes
/// on a route that reads it; `request` a whole request answered with `want`.
///
/// 1. Clients trickle a body one byte a second, each byte well inside the body-read
///    timeout: each is cut by the deadline at the latest (the event: EOF), while another
///    client from elsewhere is answered promptly.
/// 2. One address opens more connections than its share: the ones past it are closed at
///    once, long before any timeout, while another address is answered promptly.
pub async fn held_connections_are_cut(
    addr: SocketAddr,
    limits: crate::Limits,
    post: &str,
    request: &str,
    want: u16,
) {
    let deadline = Duration::from_secs(limits.body_deadline_secs);
    let per_byte = Duration::from_secs(1);
    assert!(
        limits.body_read_timeout_secs >= 2 && deadline >= Duration::from_secs(3),
        "a byte a second must keep the read timeout from firing"
    );
    assert!(!post.contains("Connection: close") && post.contains("Content-Length: 4096"));
    let trickler = std::net::Ipv4Addr::new(127, 0, 36, 1);
    let elsewhere = std::net::Ipv4Addr::new(127, 0, 36, 2);

    // 1. Trickled bodies.
    let began = Instant::now();
    let mut tricklers = Vec::new();
    for _ in 0..limits.max_connections_per_source.min(3) {
        let s = connect_from(trickler, addr).await;
        let (mut read, mut write) = s.into_split();
        write
            .write_all(post.as_bytes())
            .await
            .expect("write the head");
        let writer = tokio::spawn(async move {
            for _ in 0..4096 {
                if write.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(per_byte).await;
            }
        });
        let reader = tokio::spawn(async move {
            tokio::time::timeout(GUARD, async {
                let mut buf = [0u8; 4096];
                while let Ok(n) = read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            })
            .await
            .expect("a trickled body was never cut");
            began.elapsed()
        });
        tricklers.push((writer, reader));
    }
    let (got, took) = ask_from(elsewhere, addr, request).await;
    assert_eq!(got, want, "the other client's answer");
    assert!(
        took < Duration::from_secs(1),
        "another client waited {took:?} behind trickled bodies"
    );
    for (writer, reader) in tricklers {
        let cut_at = reader.await.expect("reader");
        writer.abort();
        // Cut by the deadline at the latest (a route that refuses before reading the body
        // cuts it sooner; `lib.rs`'s own test pins the deadline itself).
        assert!(
            cut_at < deadline + Duration::from_secs(4),
            "a trickled body was cut after {cut_at:?} (the deadline is {deadline:?})"
        );
    }

    // 2. One address past its share.
    let share = limits.max_connections_per_source;
    let mut held = Vec::new();
    for _ in 0..share {
        let mut s = connect_from(trickler, addr).await;
        s.write_all(b"GET /v1 HTT")
            .await
            .expect("write half a line");
        held.push(s);
    }
    // The server takes a connection when it accepts it: wait until the share is taken.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    for _ in 0..3 {
        let mut s = connect_from(trickler, addr).await;
        let _ = s.write_all(b"GET /v1 HTT").await;
        let sent = until_closed(&mut s).await;
        assert!(sent.is_empty(), "a connection past the share was answered");
    }
    let refused_in = started.elapsed();
    assert!(
        refused_in < Duration::from_secs(limits.header_read_timeout_secs),
        "connections past the share were closed after {refused_in:?}, by a timeout, not at once"
    );
    let (got, took) = ask_from(elsewhere, addr, request).await;
    assert_eq!(got, want);
    assert!(
        took < Duration::from_secs(1),
        "another address waited {took:?}"
    );
    assert!(held.iter().all(still_open), "the share itself is served");
}

/// [`ask`] from the loopback address `from`.
pub async fn ask_from(
    from: std::net::Ipv4Addr,
    addr: SocketAddr,
    request: &str,
) -> (u16, Duration) {
    let started = Instant::now();
    let mut s = connect_from(from, addr).await;
    s.write_all(request.as_bytes()).await.expect("write");
    let reply = until_closed(&mut s).await;
    (status(&reply), started.elapsed())
}
