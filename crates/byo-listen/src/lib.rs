//! The one way a byo daemon listens for HTTP (#16 item 7, issue #36.1): the server, the
//! agent's API and ssh_mapd each serve their router through [`serve`], so the same limits
//! hold on all three. Nothing an unauthenticated client can do holds a connection for long:
//!
//! - **A header-read timeout**, which is also the idle timeout: hyper's timer starts as soon
//!   as a connection waits for a request head — a fresh connection and a kept-alive one
//!   between requests alike — and the connection is closed if no complete head arrives in
//!   time. A client that sends half a request line and stalls (slowloris), or connects and
//!   says nothing, holds its slot for at most this long.
//! - **A body-read timeout** (`tower_http::timeout::RequestBodyTimeoutLayer`): a body that
//!   stops arriving for this long fails the request; and **a body deadline**: a body must
//!   arrive whole within this long of its head however it trickles (one byte every 20 s
//!   restarted the read timeout forever). Handlers themselves are not timed: some (an
//!   instance's delete) wait on the host for a minute and more.
//! - **A write timeout**: an answer the client stops reading (a write that makes no
//!   progress) for this long closes the connection, so a reader that never reads holds
//!   nothing either.
//! - **A cap on concurrent connections**: a permit from a semaphore is taken *before*
//!   `accept`, so past the cap new connections wait in the kernel's backlog until one closes,
//!   instead of each costing a task and a buffer; and **a cap per source address**, below
//!   it: past that, a source's next connection is closed at once, so one client cannot take
//!   every slot.
//! - **Shutdown ends stragglers**: after the grace period, connections still open are cut.
//! - HTTP/1.1 only. hyper-util's auto builder first reads the HTTP/2 preface with no timer at
//!   all, which is exactly the hole this module closes; none of our clients speaks h2c.
//!
//! Body *size* limits stay with each router (`DefaultBodyLimit`), beside the shapes they
//! bound. Every accepted request carries `axum::extract::ConnectInfo<SocketAddr>`, the peer's
//! address, for the server's per-address rate limits.
//!
//! Its own crate because the three listeners live in three crates (byo-server, byo-agent,
//! byo-relay) and the server may link neither of the other two; byo-wire and byo-core are
//! kept free of tokio and hyper on purpose.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::RequestBodyTimeoutLayer;

mod held;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use held::{DeadlineBody, WriteTimeout};

/// The limits one listener holds every connection to. The server reads them from its
/// `[listener]` table; the agent and the relay take them as flags (`#[command(flatten)]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::Args)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Seconds a connection may take to send a complete request head, counted from when it
    /// starts waiting for one: after connecting, and after each response on a kept-alive
    /// connection (so this is the idle timeout too).
    #[arg(long, default_value_t = HEADER_READ_TIMEOUT_SECS)]
    pub header_read_timeout_secs: u64,
    /// Seconds a request body may go without sending anything.
    #[arg(long, default_value_t = BODY_READ_TIMEOUT_SECS)]
    pub body_read_timeout_secs: u64,
    /// Seconds a request body may take in all, from its head, however it trickles.
    #[arg(long, default_value_t = BODY_DEADLINE_SECS)]
    pub body_deadline_secs: u64,
    /// Seconds an answer may go unread (a write making no progress) before the connection
    /// is closed.
    #[arg(long, default_value_t = WRITE_TIMEOUT_SECS)]
    pub write_timeout_secs: u64,
    /// Connections served at once; more wait in the kernel's backlog.
    #[arg(long, default_value_t = MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Connections served at once from one address; more from it are closed at once.
    #[arg(long, default_value_t = MAX_CONNECTIONS_PER_SOURCE)]
    pub max_connections_per_source: usize,
    /// Seconds a shutdown waits for the requests in flight before cutting what is left.
    #[arg(long, default_value_t = SHUTDOWN_GRACE_SECS)]
    pub shutdown_grace_secs: u64,
}

pub const HEADER_READ_TIMEOUT_SECS: u64 = 10;
pub const BODY_READ_TIMEOUT_SECS: u64 = 30;
pub const BODY_DEADLINE_SECS: u64 = 60;
pub const WRITE_TIMEOUT_SECS: u64 = 30;
pub const MAX_CONNECTIONS: usize = 512;
pub const MAX_CONNECTIONS_PER_SOURCE: usize = 64;
pub const SHUTDOWN_GRACE_SECS: u64 = 10;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout_secs: HEADER_READ_TIMEOUT_SECS,
            body_read_timeout_secs: BODY_READ_TIMEOUT_SECS,
            body_deadline_secs: BODY_DEADLINE_SECS,
            write_timeout_secs: WRITE_TIMEOUT_SECS,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_source: MAX_CONNECTIONS_PER_SOURCE,
            shutdown_grace_secs: SHUTDOWN_GRACE_SECS,
        }
    }
}

impl Limits {
    fn header_read_timeout(&self) -> Duration {
        Duration::from_secs(self.header_read_timeout_secs.max(1))
    }

    fn body_read_timeout(&self) -> Duration {
        Duration::from_secs(self.body_read_timeout_secs.max(1))
    }

    fn body_deadline(&self) -> Duration {
        Duration::from_secs(self.body_deadline_secs.max(1))
    }

    fn write_timeout(&self) -> Duration {
        Duration::from_secs(self.write_timeout_secs.max(1))
    }
}

/// Open connections per source address; a [`SourceSlot`] is one of them.
#[derive(Default)]
struct Sources(Mutex<HashMap<IpAddr, usize>>);

struct SourceSlot {
    sources: Arc<Sources>,
    ip: IpAddr,
}

impl Sources {
    /// A slot for `ip`, unless it already holds `max`.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<SourceSlot> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_default();
        if *n >= max.max(1) {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            sources: self.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.sources.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serve `router` on `listener` under `limits` until `shutdown` resolves; then stop
/// accepting, let the requests in flight finish for the grace period and close every
/// connection (cutting those still open after it).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let sources = Arc::new(Sources::default());
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout())
        .keep_alive(true);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: say so, back off, go on.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(slot) = sources.take(peer.ip(), limits.max_connections_per_source) else {
            // Dropped unanswered: closing is the cheapest thing to do with it.
            tracing::debug!(%peer, "connection refused: its address holds its share already");
            continue;
        };
        let deadline = limits.body_deadline();
        let service = tower::ServiceBuilder::new()
            .map_request(move |req: hyper::Request<hyper::body::Incoming>| {
                let mut req =
                    req.map(|body| axum::body::Body::new(DeadlineBody::new(body, deadline)));
                req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                req
            })
            .layer(RequestBodyTimeoutLayer::new(limits.body_read_timeout()))
            .service(router.clone());
        let io = TokioIo::new(WriteTimeout::new(stream, limits.write_timeout()));
        let conn = http.serve_connection(io, TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        let mut cut_rx = cut_rx.clone();
        tokio::spawn(async move {
            tokio::select! {
                done = conn => if let Err(e) = done {
                    tracing::debug!(%peer, error = %e, "connection closed");
                },
                _ = cut_rx.wait_for(|cut| *cut) => {
                    tracing::debug!(%peer, "connection cut at shutdown");
                }
            }
            drop(slot);
            drop(permit);
        });
    }
    drop(listener);
    let grace = Duration::from_secs(limits.shutdown_grace_secs);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_secs = limits.shutdown_grace_secs,
            "connections still open after the shutdown's grace period: cut"
        );
        let _ = cut.send(true);
        // Give the cut connections' tasks a turn to drop their sockets.
        let _ = permits
            .acquire_many(limits.max_connections.max(1) as u32)
            .await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The limits at their real defaults, against a router of this crate's own.
    use std::net::Ipv4Addr;
    use std::time::Instant;

    use axum::routing::{get, post};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::testing::{ask_from, connect_from, until_closed};

    const BIG: usize = 64 << 20;

    fn router() -> Router {
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/big", get(|| async { vec![7u8; BIG] }))
            .route(
                "/echo",
                post(|body: bytes::Bytes| async move { body.len().to_string() }),
            )
            .route("/forever", get(std::future::pending::<&'static str>))
    }

    async fn start(
        limits: Limits,
    ) -> (
        SocketAddr,
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<std::io::Result<()>>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(listener, router(), limits, async move {
            let _ = stopped.await;
        }));
        (addr, stop, served)
    }

    const HEALTHZ: &str = "GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n";

    /// A body trickled a byte a second never trips the body-read timeout (2 s), and the
    /// deadline (3 s) cuts it all the same: not before, and not long after.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_trickled_body_is_cut_at_its_deadline() {
        let limits = Limits {
            body_read_timeout_secs: 2,
            body_deadline_secs: 3,
            ..Limits::default()
        };
        let (addr, _stop, _served) = start(limits).await;
        let began = Instant::now();
        let s = connect_from(Ipv4Addr::new(127, 0, 37, 1), addr).await;
        let (mut read, mut write) = s.into_split();
        write
            .write_all(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4096\r\n\r\n")
            .await
            .unwrap();
        let trickle = tokio::spawn(async move {
            while write.write_all(b"x").await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), read.read_to_end(&mut got))
            .await
            .expect("never cut")
            .ok();
        let at = began.elapsed();
        trickle.abort();
        assert!(
            at >= Duration::from_millis(2_500) && at < Duration::from_secs(7),
            "cut after {at:?}; the deadline is 3 s"
        );
        let got = String::from_utf8_lossy(&got);
        assert!(got.is_empty() || got.starts_with("HTTP/1.1 4"), "{got:?}");
        // A whole body in time is read as ever.
        let (status, _) = ask_from(
            Ipv4Addr::new(127, 0, 37, 2),
            addr,
            "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc",
        )
        .await;
        assert_eq!(status, 200);
    }

    /// Clients that ask for a 64 MB answer and never read it are closed once a write has
    /// made no progress for the write timeout (2 s here), while another client is answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_that_never_reads_is_closed_after_the_write_timeout() {
        let limits = Limits {
            write_timeout_secs: 2,
            ..Limits::default()
        };
        let (addr, _stop, _served) = start(limits).await;
        let began = Instant::now();
        let mut readers = Vec::new();
        for i in 0..4u8 {
            let mut s = connect_from(Ipv4Addr::new(127, 0, 38, i + 1), addr).await;
            s.write_all(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n")
                .await
                .unwrap();
            readers.push(s);
        }
        let (status, took) = ask_from(Ipv4Addr::new(127, 0, 38, 100), addr, HEALTHZ).await;
        assert_eq!(status, 200);
        assert!(took < Duration::from_secs(1), "{took:?}");
        // The socket buffers fill, the write stalls, and 2 s later the server gives up: the
        // client then reads what was buffered and finds the end, far short of 64 MB.
        tokio::time::sleep(Duration::from_secs(4)).await;
        for mut s in readers {
            let got = until_closed(&mut s).await;
            assert!(
                got.len() < BIG,
                "the whole answer arrived: it was never cut"
            );
        }
        assert!(began.elapsed() < Duration::from_secs(30));
    }

    /// 512 connections from one address at the real cap (512) and share (64): the share
    /// is served, the rest closed at once, and another address is answered promptly.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_address_takes_its_share_of_the_real_cap_and_no_more() {
        let limits = Limits::default();
        let (addr, _stop, _served) = start(limits).await;
        let flood = Ipv4Addr::new(127, 0, 39, 1);
        let mut open = Vec::new();
        let mut closed = 0;
        for _ in 0..MAX_CONNECTIONS {
            let mut s = connect_from(flood, addr).await;
            let _ = s.write_all(b"GET /healthz HTT").await;
            open.push(s);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut still = Vec::new();
        for s in open {
            if crate::testing::still_open(&s) {
                still.push(s);
            } else {
                closed += 1;
            }
        }
        assert_eq!(still.len(), MAX_CONNECTIONS_PER_SOURCE, "{closed} closed");
        let (status, took) = ask_from(Ipv4Addr::new(127, 0, 39, 2), addr, HEALTHZ).await;
        assert_eq!(status, 200);
        assert!(
            took < Duration::from_secs(1),
            "another address waited {took:?}"
        );
    }

    /// Shutdown waits for a request in flight for the grace period, then cuts it: `serve`
    /// returns and the client sees its connection closed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shutdown_cuts_what_is_left_after_the_grace_period() {
        let limits = Limits {
            shutdown_grace_secs: 1,
            ..Limits::default()
        };
        let (addr, stop, served) = start(limits).await;
        let mut s = connect_from(Ipv4Addr::new(127, 0, 40, 1), addr).await;
        s.write_all(b"GET /forever HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let began = Instant::now();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("serve waited on the straggler")
            .unwrap()
            .unwrap();
        let took = began.elapsed();
        assert!(
            took >= Duration::from_millis(900),
            "{took:?}: no grace at all"
        );
        let got = until_closed(&mut s).await;
        assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    }
}
