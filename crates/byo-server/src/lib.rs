//! The control plane: the API (the design's edge functions), the owner's, customer's and
//! operator's pages, and the scheduled jobs. Stateless over one database, so many replicas
//! can share one PostgreSQL.
//!
//! Layout by role: [`config`] and [`telemetry`] at start-up; [`auth`] for who is calling;
//! [`mod@app`] holds the rules; [`routes`] is the one router listing every route, each
//! handler unpacking a request for one `app` function; [`pages`] renders HTML over the same
//! functions; [`error`] is the one error type every handler returns.

pub mod agents;
pub mod app;
pub mod auth;
pub mod billing;
pub mod clock;
pub mod config;
pub mod error;
pub mod extract;
pub mod job_trigger;
pub mod metrics;
pub mod pages;
pub mod password;
pub mod providers;
pub mod queue;
pub mod rate_limit;
pub mod relay_ca;
pub mod routes;
pub mod seal;
pub mod state;
pub mod telemetry;

use std::future::Future;

use anyhow::Context;
use tokio::net::TcpListener;

pub use config::Config;
pub use routes::router;
pub use state::AppState;

/// How often the reap sweep runs.
pub const REAP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Serve the API and pages on `listener` (and metrics on their own listener, when
/// configured) until `shutdown` resolves; in-flight requests are allowed to finish. Sealed
/// values written before they were bound to their place are re-sealed first
/// (`app::sealed`), so no request or job reads one.
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    app::sealed::reseal_at_start(&state)
        .await
        .context("re-sealing the sealed values in place")?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = match state.config.metrics_listen {
        Some(addr) => {
            let metrics_listener = TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding the metrics listener on {addr}"))?;
            tracing::info!(addr = %metrics_listener.local_addr()?, "metrics listening");
            let router = metrics_router(&state);
            let mut rx = stop_rx.clone();
            let limits = state.config.listener;
            Some(tokio::spawn(async move {
                byo_listen::serve(metrics_listener, router, limits, async move {
                    let _ = rx.wait_for(|stop| *stop).await;
                })
                .await
            }))
        }
        None => None,
    };
    let jobs =
        app::jobs::JobDriver::new(state.clone(), app::jobs::registry()).spawn(stop_rx.clone());
    tracing::info!(addr = %listener.local_addr()?, backend = %state.store.backend(), "serving");
    if state.config.allow_signup
        && !state.config.signup_without_mail
        && !state.notifier.sends_email()
    {
        tracing::warn!(
            "sign-up is open but refused: it confirms each address by mail and [notices] \
             smtp_url is not set (set it, or allow_signup = false)"
        );
    }
    let store = state.store.clone();
    let limits = state.config.listener;
    byo_listen::serve(listener, router(state), limits, async move {
        shutdown.await;
        tracing::info!("shutting down: finishing requests in flight");
        let _ = stop_tx.send(true);
    })
    .await
    .context("serving HTTP")?;
    for job in jobs {
        let _ = job.await;
    }
    if let Some(task) = metrics_task {
        task.await
            .context("metrics task")?
            .context("serving metrics")?;
    }
    store.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// The metrics listener's router, as `serve` runs it and tests drive it: each scrape reads the
/// fleet's gauges first (`app::fleet_metrics::refresh`).
pub fn metrics_router(state: &AppState) -> axum::Router {
    let scraped = state.clone();
    let refresh: metrics::Refresh = std::sync::Arc::new(move || {
        let state = scraped.clone();
        Box::pin(async move { app::fleet_metrics::refresh(&state).await })
    });
    metrics::router(state.metrics.clone(), refresh)
}
