//! The one way a byo daemon listens for HTTP (#16 item 7): the server, the agent's API and
//! ssh_mapd each serve their router through [`serve`], so the same limits hold on all three.
//!
//! - **A header-read timeout**, which is also the idle timeout: hyper's timer starts as soon
//!   as a connection waits for a request head — a fresh connection and a kept-alive one
//!   between requests alike — and the connection is closed if no complete head arrives in
//!   time. A client that sends half a request line and stalls (slowloris), or connects and
//!   says nothing, holds its slot for at most this long.
//! - **A body-read timeout** (`tower_http::timeout::RequestBodyTimeoutLayer`): a body that
//!   stops arriving for this long fails the request, so a trickled body cannot hold a
//!   connection either. Handlers themselves are not timed: some (an instance's delete) wait
//!   on the host for a minute and more.
//! - **A cap on concurrent connections**: a permit from a semaphore is taken *before*
//!   `accept`, so past the cap new connections wait in the kernel's backlog until one closes,
//!   instead of each costing a task and a buffer.
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

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::timeout::RequestBodyTimeoutLayer;

#[cfg(feature = "testing")]
pub mod testing;

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
    /// Connections served at once; more wait in the kernel's backlog.
    #[arg(long, default_value_t = MAX_CONNECTIONS)]
    pub max_connections: usize,
}

pub const HEADER_READ_TIMEOUT_SECS: u64 = 10;
pub const BODY_READ_TIMEOUT_SECS: u64 = 30;
pub const MAX_CONNECTIONS: usize = 512;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout_secs: HEADER_READ_TIMEOUT_SECS,
            body_read_timeout_secs: BODY_READ_TIMEOUT_SECS,
            max_connections: MAX_CONNECTIONS,
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
}

/// Serve `router` on `listener` under `limits` until `shutdown` resolves; then stop
/// accepting, let the requests in flight finish and close every connection.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
        let service = tower::ServiceBuilder::new()
            .map_request(move |mut req: hyper::Request<_>| {
                req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                req
            })
            .layer(RequestBodyTimeoutLayer::new(limits.body_read_timeout()))
            .service(router.clone());
        let conn = http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection closed");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
