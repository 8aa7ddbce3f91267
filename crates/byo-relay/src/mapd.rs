//! ssh_mapd: the relay's HTTP API for its SSH map, on 10.8.0.1:8754 inside the tunnel.
//!
//! The caller is the host's agent (E1 step 49), authenticated by this relay's own token —
//! one per relay, whose SHA-256 is all the relay keeps, compared in constant time and never
//! logged. A per-host relay forwards only to its one host, so any other target is refused:
//! the token grants nothing a compromised host does not already have. `GET /map` reads the
//! kernel, never a copy the daemon remembers.

use std::net::Ipv4Addr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use byo_core::tokens::{SecretToken, TokenHash, TokenKind};
use byo_wire::relay::{MapEntry, MapTarget, SshMap};
use serde_json::json;
use tokio::sync::Mutex;

use byo_core::render::nft::{self as rules, Layout, Mapping};

use crate::nft::{self, NftCli};

/// Ports a mapping may never take: the relay's own services.
pub const RESERVED_PORTS: &[u16] = &[80, 443, 8754, 51820];

/// The only public ports a mapping may take (#16 item 7). Step 49: a per-host relay
/// forwards the host's instance SSH on the relay's public :22 — standard port 22, no client
/// software (F note 1) — to one port on that host, which is all the agent ever asks for
/// (`byo_agent::vms::PUBLIC_SSH_PORT`). Any other public port would open a hole in the
/// relay the design never made, so it is refused before the kernel sees it.
pub const MAPPABLE_PORTS: &[u16] = &[22];

/// The largest body ssh_mapd reads: a whole map of the mappable ports is a few hundred
/// bytes.
pub const BODY_LIMIT: usize = 16 * 1024;

#[derive(Clone)]
pub struct Mapd {
    pub token_hash: Arc<TokenHash>,
    pub layout: Layout,
    pub nft: NftCli,
    /// Serialises writers, so a read-then-write replace cannot interleave with another.
    pub writes: Arc<Mutex<()>>,
}

#[derive(Debug)]
enum MapdError {
    Unauthorized,
    Invalid(String),
    Kernel(String),
}

impl IntoResponse for MapdError {
    fn into_response(self) -> Response {
        let (status, code, message) = match self {
            MapdError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid relay token is required".to_owned(),
            ),
            MapdError::Invalid(m) => (StatusCode::BAD_REQUEST, "invalid", m),
            MapdError::Kernel(m) => {
                tracing::error!(error = %m, "nftables refused a change");
                (StatusCode::INTERNAL_SERVER_ERROR, "kernel", m)
            }
        };
        (status, Json(json!({"error": code, "message": message}))).into_response()
    }
}

fn authorise(state: &Mapd, headers: &HeaderMap) -> Result<(), MapdError> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| SecretToken::parse(TokenKind::SshMap, t).ok())
        .filter(|t| state.token_hash.matches(t))
        .map(|_| ())
        .ok_or(MapdError::Unauthorized)
}

/// Check one mapping against the rules; the error says which and why.
pub fn validate(
    layout: &Layout,
    port: u16,
    target: &str,
    target_port: u16,
) -> Result<Mapping, String> {
    if port == 0 || target_port == 0 {
        return Err("ports are 1 to 65535".into());
    }
    if RESERVED_PORTS.contains(&port) {
        return Err(format!(
            "port {port} is one of the relay's own services and cannot be mapped"
        ));
    }
    if !MAPPABLE_PORTS.contains(&port) {
        return Err(format!(
            "port {port} is not a port this relay maps: only {MAPPABLE_PORTS:?}"
        ));
    }
    let addr: Ipv4Addr = target
        .parse()
        .map_err(|_| format!("target {target:?} is not an IPv4 address"))?;
    if addr != layout.host {
        return Err(format!(
            "this relay forwards only to its own host {}, not {addr}",
            layout.host
        ));
    }
    Ok(Mapping { port, target_port })
}

fn view(layout: &Layout, mappings: &[Mapping]) -> SshMap {
    SshMap {
        mappings: mappings
            .iter()
            .map(|m| MapEntry {
                port: m.port,
                target: layout.host.to_string(),
                target_port: m.target_port,
            })
            .collect(),
    }
}

async fn kernel<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, nft::NftError> + Send + 'static,
) -> Result<T, MapdError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| MapdError::Kernel(e.to_string()))?
        .map_err(|e| MapdError::Kernel(e.to_string()))
}

async fn read(state: &Mapd) -> Result<Vec<Mapping>, MapdError> {
    let nft = state.nft.clone();
    kernel(move || nft.mappings()).await
}

async fn get_map(State(state): State<Mapd>, headers: HeaderMap) -> Result<Json<SshMap>, MapdError> {
    authorise(&state, &headers)?;
    Ok(Json(view(&state.layout, &read(&state).await?)))
}

fn port_param(raw: &str) -> Result<u16, MapdError> {
    raw.parse()
        .map_err(|_| MapdError::Invalid(format!("{raw:?} is not a port")))
}

/// Set one mapping. The answer is the mapping the kernel committed: the transaction
/// either took whole or failed.
async fn put_port(
    State(state): State<Mapd>,
    headers: HeaderMap,
    Path(port): Path<String>,
    body: Result<Json<MapTarget>, JsonRejection>,
) -> Result<Json<MapEntry>, MapdError> {
    authorise(&state, &headers)?;
    let port = port_param(&port)?;
    let Json(target) = body.map_err(|e| MapdError::Invalid(e.body_text()))?;
    let m = validate(&state.layout, port, &target.target, target.target_port)
        .map_err(MapdError::Invalid)?;
    let _guard = state.writes.lock().await;
    let nft = state.nft.clone();
    kernel(move || nft.set(m)).await?;
    tracing::info!(port, target_port = m.target_port, "mapped");
    Ok(Json(MapEntry {
        port: m.port,
        target: state.layout.host.to_string(),
        target_port: m.target_port,
    }))
}

/// Clear one mapping. Clearing what is not mapped is not an error: the caller wants it gone.
async fn delete_port(
    State(state): State<Mapd>,
    headers: HeaderMap,
    Path(port): Path<String>,
) -> Result<StatusCode, MapdError> {
    authorise(&state, &headers)?;
    let port = port_param(&port)?;
    let _guard = state.writes.lock().await;
    let nft = state.nft.clone();
    kernel(move || nft.clear(port)).await?;
    tracing::info!(port, "cleared");
    Ok(StatusCode::NO_CONTENT)
}

async fn put_map(
    State(state): State<Mapd>,
    headers: HeaderMap,
    body: Result<Json<SshMap>, JsonRejection>,
) -> Result<Json<SshMap>, MapdError> {
    authorise(&state, &headers)?;
    let Json(want) = body.map_err(|e| MapdError::Invalid(e.body_text()))?;
    let mut mappings = Vec::with_capacity(want.mappings.len());
    for e in &want.mappings {
        mappings.push(
            validate(&state.layout, e.port, &e.target, e.target_port)
                .map_err(MapdError::Invalid)?,
        );
    }
    mappings.sort();
    if mappings.windows(2).any(|w| w[0].port == w[1].port) {
        return Err(MapdError::Invalid("a port is mapped twice".into()));
    }
    let _guard = state.writes.lock().await;
    let nft = state.nft.clone();
    kernel(move || nft.apply(&rules::reconcile_batch(&mappings))).await?;
    Ok(Json(view(&state.layout, &read(&state).await?)))
}

pub fn router(state: Mapd) -> Router {
    Router::new()
        .route("/map", get(get_map).put(put_map))
        .route("/map/{port}", put(put_port).delete(delete_port))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// Serve ssh_mapd on `listener` under `limits` (`byo_listen`: header, idle, body and
/// connection limits) until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Mapd,
    limits: byo_listen::Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    byo_listen::serve(listener, router(state), limits, shutdown).await
}
