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
use prometheus_client::metrics::gauge::Gauge;
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct JobLabels {
    pub job: String,
}

type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// The fleet's gauges (issue #38), set from the database at each scrape by
/// `app::fleet_metrics::refresh`.
#[derive(Default)]
pub struct FleetMetrics {
    pub hosts: Family<StateLabels, Gauge>,
    pub heartbeat_oldest_age: FloatGauge,
    pub stuck_deletes: Gauge,
    pub delete_oldest_age: FloatGauge,
    pub queue_open: Gauge,
    pub queue_oldest_age: FloatGauge,
    pub creates_open: Gauge,
    pub bookings_unpaid: Gauge,
    pub job_last_success: Family<JobLabels, FloatGauge>,
    pub job_last_failed: Family<JobLabels, Gauge>,
    pub key_list_expiry: FloatGauge,
    pub key_pushes_failed: Gauge,
    pub fleet_upgrades_halted: Gauge,
    pub read_ok: Gauge,
}

impl FleetMetrics {
    fn register(&self, registry: &mut Registry) {
        let g =
            |r: &mut Registry, name: &str, help: &str, m: &Gauge| r.register(name, help, m.clone());
        let f = |r: &mut Registry, name: &str, help: &str, m: &FloatGauge| {
            r.register(name, help, m.clone())
        };
        registry.register(
            "hosts",
            "Hosts not retired, by state: active (in placement), depooled, preparing, unreachable (in placement, no heartbeat within the placement bound)",
            self.hosts.clone(),
        );
        f(
            registry,
            "heartbeat_oldest_age_seconds",
            "Age of the oldest last heartbeat among hosts in placement",
            &self.heartbeat_oldest_age,
        );
        g(
            registry,
            "stuck_deletes",
            "Deletes asked for over 10 minutes ago and not confirmed (G.3)",
            &self.stuck_deletes,
        );
        f(
            registry,
            "delete_oldest_age_seconds",
            "Age of the oldest delete not confirmed",
            &self.delete_oldest_age,
        );
        g(
            registry,
            "queue_open",
            "Queued creates not placed, cancelled or closed",
            &self.queue_open,
        );
        f(
            registry,
            "queue_oldest_age_seconds",
            "Age of the oldest open queued create",
            &self.queue_oldest_age,
        );
        g(
            registry,
            "creates_open",
            "Instances still being created",
            &self.creates_open,
        );
        g(
            registry,
            "bookings_unpaid",
            "Open pre-bookings not paid",
            &self.bookings_unpaid,
        );
        registry.register(
            "job_last_success_timestamp_seconds",
            "When each background job last succeeded (0: never)",
            self.job_last_success.clone(),
        );
        registry.register(
            "job_last_run_failed",
            "Whether each background job's newest run failed",
            self.job_last_failed.clone(),
        );
        f(
            registry,
            "operator_keys_expiry_timestamp_seconds",
            "When the published operator-key list expires (0: none published)",
            &self.key_list_expiry,
        );
        g(
            registry,
            "key_pushes_failed",
            "Hosts whose last operator-key push failed (M): their operators' access is not what was signed",
            &self.key_pushes_failed,
        );
        g(
            registry,
            "fleet_upgrades_halted",
            "Fleet-upgrade runs halted and not closed: the rest of the fleet waits on an operator",
            &self.fleet_upgrades_halted,
        );
        g(
            registry,
            "fleet_read_ok",
            "Whether the last scrape read the fleet from the database",
            &self.read_ok,
        );
    }
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub latency: Family<RequestLabels, Histogram>,
    pub logins: Family<OutcomeLabels, Counter>,
    pub fleet: FleetMetrics,
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
        let fleet = FleetMetrics::default();
        fleet.register(&mut registry);
        Metrics {
            registry,
            requests,
            latency,
            logins,
            fleet,
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

/// What a scrape runs before it encodes: the server reads the fleet's gauges
/// (`app::fleet_metrics::refresh`).
pub type Refresh = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

pub fn router(metrics: Arc<Metrics>, refresh: Refresh) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(
                |State((m, refresh)): State<(Arc<Metrics>, Refresh)>| async move {
                    refresh().await;
                    (
                        [(
                            CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                        .into_response()
                },
            ),
        )
        .with_state((metrics, refresh))
}
