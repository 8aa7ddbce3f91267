use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use byo_wire::api::Healthz;

use crate::state::AppState;

/// Liveness and readiness: 200 when the database answers, 503 when it does not.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, body = Healthz), (status = 503, body = Healthz)))]
pub async fn healthz(State(state): State<AppState>) -> (StatusCode, Json<Healthz>) {
    let (status, database) = match state.store.ping().await {
        Ok(()) => (StatusCode::OK, state.store.backend().to_string()),
        Err(e) => {
            tracing::warn!(error = %e, "health check: database unreachable");
            (StatusCode::SERVICE_UNAVAILABLE, "unreachable".to_owned())
        }
    };
    let body = Healthz {
        status: if status.is_success() {
            "ok"
        } else {
            "degraded"
        }
        .to_owned(),
        database,
        version: env!("CARGO_PKG_VERSION").to_owned(),
    };
    (status, Json(body))
}
