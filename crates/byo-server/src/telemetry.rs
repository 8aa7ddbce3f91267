//! Logs and request ids. Request spans record the method, the path (never the query
//! string, which may carry a token) and the request id; headers are never logged, so
//! cookies and bearer tokens cannot reach a log line.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;
use crate::error::REQUEST_ID;

pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Install the global subscriber (once per process; later calls are no-ops).
pub fn init(format: LogFormat) {
    init_with_writer(format, std::io::stderr);
}

pub fn init_with_writer<W>(format: LogFormat, writer: W)
where
    W: for<'a> MakeWriter<'a> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_from_env("BYO_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn,tower_http=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let _ = match format {
        LogFormat::Pretty => builder.compact().try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Give every request an id (a caller's well-formed `x-request-id` is kept), log one line
/// per request, and make the id available to error responses.
pub async fn request_id(request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 64
                && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
        .map(str::to_owned)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let started = std::time::Instant::now();
    let span = tracing::info_span!("request", request_id = %id, %method, %path);
    let mut response = REQUEST_ID
        .scope(
            id.clone(),
            tracing::Instrument::instrument(next.run(request), span.clone()),
        )
        .await;
    let status = response.status().as_u16();
    span.in_scope(|| {
        tracing::info!(
            status,
            elapsed_ms = started.elapsed().as_secs_f64() * 1e3,
            "served"
        );
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    response
}
