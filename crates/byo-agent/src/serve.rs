//! The serving unit's HTTP API, reached by the backend through the relay (Caddy proxies
//! :8080 to it) and authenticated by the host's agent token. Today it answers the
//! operator-key push; the VM API joins it with the instances work.
//!
//! The agent keeps only the SHA-256 of its token and compares in constant time, so
//! reading the agent's files does not yield a credential that works against it.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use byo_core::keylist::MAX_ENVELOPE_BYTES;
use byo_core::tokens::{SecretToken, TokenHash, TokenKind};
use serde_json::json;

use crate::operator_keys::{OperatorKeys, ReceiveError};

#[derive(Clone)]
pub struct Serving {
    pub token_hash: Arc<TokenHash>,
    pub operator_keys: OperatorKeys,
}

fn authorised(state: &Serving, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| SecretToken::parse(TokenKind::Agent, t).ok())
        .is_some_and(|t| state.token_hash.matches(&t))
}

fn answer(status: StatusCode, error: &str, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": error, "message": message})),
    )
        .into_response()
}

async fn put_operator_keys(
    State(state): State<Serving>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorised(&state, &headers) {
        return answer(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid agent token is required",
        );
    }
    let keys = state.operator_keys.clone();
    // File IO with fsyncs: off the async workers.
    let result = tokio::task::spawn_blocking(move || keys.receive(&body, chrono::Utc::now())).await;
    match result {
        Ok(Ok(applied)) => {
            tracing::info!(
                version = applied.version,
                keys = applied.keys,
                "operator-key list applied"
            );
            (
                StatusCode::OK,
                axum::Json(json!({"version": applied.version, "keys": applied.keys})),
            )
                .into_response()
        }
        Ok(Err(ReceiveError::Refused(r))) => {
            tracing::warn!(reason = %r, "operator-key list refused");
            answer(StatusCode::UNPROCESSABLE_ENTITY, "refused", &r.to_string())
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "operator-key list not applied");
            answer(StatusCode::INTERNAL_SERVER_ERROR, "io", &e.to_string())
        }
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            &e.to_string(),
        ),
    }
}

pub fn router(state: Serving) -> Router {
    Router::new()
        .route("/v1/operator-keys", put(put_operator_keys))
        .layer(DefaultBodyLimit::max(MAX_ENVELOPE_BYTES))
        .with_state(state)
}
