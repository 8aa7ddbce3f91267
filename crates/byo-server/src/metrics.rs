//! Prometheus metrics, served on their own listener (`metrics_listen`).

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    /// The route pattern (`/api/admin/users/{sub}/roles/{role}`), never the raw path, so
    /// ids do not explode the label space.
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<RequestLabels, Histogram>,
    pub logins: Family<OutcomeLabels, Counter>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("byo");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 14))
        });
        let logins = Family::<OutcomeLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests served", requests.clone());
        registry.register(
            "http_request_duration_seconds",
            "Time to serve an HTTP request",
            latency.clone(),
        );
        registry.register(
            "logins",
            "Password sign-in attempts by outcome",
            logins.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            logins,
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Count and time every request by its route pattern.
pub async fn track(State(metrics): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().to_string();
    let started = Instant::now();
    let response = next.run(request).await;
    let labels = RequestLabels {
        method,
        route,
        status: response.status().as_u16(),
    };
    metrics.requests.get_or_create(&labels).inc();
    metrics
        .latency
        .get_or_create(&labels)
        .observe(started.elapsed().as_secs_f64());
    response
}

pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move {
                (
                    [(
                        CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    m.encode(),
                )
                    .into_response()
            }),
        )
        .with_state(metrics)
}
