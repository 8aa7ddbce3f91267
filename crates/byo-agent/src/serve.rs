//! The serving unit's HTTP API, reached by the backend through the relay (Caddy proxies
//! :8080 to it) and authenticated by the host's agent token: the operator-key push (M) and
//! the VM API (E1, G).
//!
//! The agent keeps only the SHA-256 of its token and compares in constant time, so
//! reading the agent's files does not yield a credential that works against it.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post, put};
use byo_core::keylist::MAX_ENVELOPE_BYTES;
use byo_core::tokens::{SecretToken, TokenHash, TokenKind};
use byo_wire::vm::{AgentErrorCode, AgentRefusal, CreateVm, VmStateChange};
use serde_json::json;

use crate::host::LocalHost;
use crate::operator_keys::{OperatorKeys, ReceiveError};
use crate::vms::{self, VmConfig, VmError, VmService};

#[derive(Clone)]
pub struct Serving {
    pub token_hash: Arc<TokenHash>,
    pub operator_keys: OperatorKeys,
    /// The VM API; `None` until preparation handed the credentials over.
    pub vms: Option<Arc<VmService>>,
}

fn authorised(state: &Serving, headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|t| SecretToken::parse(TokenKind::Agent, t).ok())
        .is_some_and(|t| state.token_hash.matches(&t))
}

/// Every refusal the agent sends, in the one shape the backend reads (`AgentRefusal`).
fn answer(status: StatusCode, error: AgentErrorCode, message: &str) -> Response {
    (
        status,
        axum::Json(AgentRefusal {
            error,
            message: message.to_owned(),
        }),
    )
        .into_response()
}

/// How long a push waits for root's `enverge-operator-keys` to apply the list.
const ROOT_TAKES_A_LIST: std::time::Duration = std::time::Duration::from_secs(20);

async fn put_operator_keys(
    State(state): State<Serving>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !authorised(&state, &headers) {
        return answer(
            StatusCode::UNAUTHORIZED,
            AgentErrorCode::Unauthorized,
            "a valid agent token is required",
        );
    }
    let keys = state.operator_keys.clone();
    let machines = state
        .vms
        .as_ref()
        .map_or_else(crate::machines::Machines::single, |v| {
            v.config.machines.clone()
        });
    // File IO with fsyncs, and SSH to the satellites: off the async workers.
    let result = tokio::task::spawn_blocking(move || {
        // Root keeps and writes the list (#36); serving verifies it for the answer and waits
        // for root's word.
        let applied = keys.receive_through_root(&body, chrono::Utc::now(), ROOT_TAKES_A_LIST)?;
        // M.4: a pair's satellites get the same list (their spark's own login file).
        let missed = match keys.held()? {
            Some((_, list)) => {
                crate::workers::push_operator_keys(&machines, &list.authorized_keys())
            }
            None => Vec::new(),
        };
        Ok::<_, ReceiveError>((applied, missed))
    })
    .await;
    match result {
        Ok(Ok((applied, missed))) if !missed.is_empty() => {
            tracing::error!(version = applied.version, missed = ?missed, "operator-key list applied on node0, not on every satellite");
            answer(
                StatusCode::BAD_GATEWAY,
                AgentErrorCode::Failed,
                &format!(
                    "version {} applied on node0, not written on {}; send again once they answer",
                    applied.version,
                    missed.join("; ")
                ),
            )
        }
        Ok(Ok((applied, _))) => {
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
            answer(
                StatusCode::UNPROCESSABLE_ENTITY,
                AgentErrorCode::Refused,
                &r.to_string(),
            )
        }
        Ok(Err(e)) => {
            tracing::error!(error = %e, "operator-key list not applied");
            answer(
                StatusCode::INTERNAL_SERVER_ERROR,
                AgentErrorCode::Failed,
                &e.to_string(),
            )
        }
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            AgentErrorCode::Failed,
            &e.to_string(),
        ),
    }
}

fn vm_error(e: VmError) -> Response {
    let (status, code) = match &e {
        VmError::Invalid(_) => (StatusCode::BAD_REQUEST, AgentErrorCode::Invalid),
        VmError::NotFound => (StatusCode::NOT_FOUND, AgentErrorCode::NotFound),
        VmError::Conflict(_) => (StatusCode::CONFLICT, AgentErrorCode::Conflict),
        VmError::Occupied(_) => (StatusCode::CONFLICT, AgentErrorCode::HostOccupied),
        VmError::Preparing => (StatusCode::CONFLICT, AgentErrorCode::HostPreparing),
        VmError::Reverted(_) => (StatusCode::BAD_GATEWAY, AgentErrorCode::Reverted),
        VmError::Failed(_) => (StatusCode::INTERNAL_SERVER_ERROR, AgentErrorCode::Failed),
    };
    tracing::warn!(error = %e, "VM operation refused");
    answer(status, code, &e.to_string())
}

/// Why a VM route refused before doing anything.
enum Gate {
    Unauthorized,
    NotPrepared,
}

impl IntoResponse for Gate {
    fn into_response(self) -> Response {
        match self {
            Gate::Unauthorized => answer(
                StatusCode::UNAUTHORIZED,
                AgentErrorCode::Unauthorized,
                "a valid agent token is required",
            ),
            Gate::NotPrepared => answer(
                StatusCode::SERVICE_UNAVAILABLE,
                AgentErrorCode::NotPrepared,
                "this host has not completed preparation",
            ),
        }
    }
}

/// The guard every VM route starts with: the agent token, and a prepared host.
fn vm_service(state: &Serving, headers: &HeaderMap) -> Result<Arc<VmService>, Gate> {
    if !authorised(state, headers) {
        return Err(Gate::Unauthorized);
    }
    state.vms.clone().ok_or(Gate::NotPrepared)
}

async fn post_vm(State(state): State<Serving>, headers: HeaderMap, body: Bytes) -> Response {
    let svc = match vm_service(&state, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let req: CreateVm = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return answer(
                StatusCode::BAD_REQUEST,
                AgentErrorCode::Invalid,
                &e.to_string(),
            );
        }
    };
    match svc
        .with(move |h, relay, config| vms::create(h, relay, config, &req))
        .await
    {
        Ok(Ok(created)) => {
            tracing::info!(name = %created.name, port = created.ssh_port, "instance created");
            (StatusCode::CREATED, axum::Json(created)).into_response()
        }
        Ok(Err(e)) => vm_error(e),
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            AgentErrorCode::Failed,
            &e,
        ),
    }
}

async fn get_vms(State(state): State<Serving>, headers: HeaderMap) -> Response {
    let svc = match vm_service(&state, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    match svc.with(|h, _, _| vms::list(h)).await {
        Ok(Ok(list)) => axum::Json(list).into_response(),
        Ok(Err(e)) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            AgentErrorCode::Failed,
            &e,
        ),
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            AgentErrorCode::Failed,
            &e,
        ),
    }
}

async fn delete_vm(
    State(state): State<Serving>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let svc = match vm_service(&state, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    match svc
        .with(move |h, relay, config| vms::delete(h, relay, config, &name))
        .await
    {
        Ok(Ok(())) => (StatusCode::OK, axum::Json(json!({"deleted": true}))).into_response(),
        Ok(Err(e)) => vm_error(e),
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            AgentErrorCode::Failed,
            &e,
        ),
    }
}

async fn post_vm_state(
    State(state): State<Serving>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let svc = match vm_service(&state, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let change: VmStateChange = match serde_json::from_slice(&body) {
        Ok(c) => c,
        Err(e) => {
            return answer(
                StatusCode::BAD_REQUEST,
                AgentErrorCode::Invalid,
                &e.to_string(),
            );
        }
    };
    match svc
        .with(move |h, relay, config| vms::change_state(h, relay, config, &name, change.action))
        .await
    {
        Ok(Ok(())) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => vm_error(e),
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            AgentErrorCode::Failed,
            &e,
        ),
    }
}

/// L4: a reboot of this host (and, on a pair, of node1 first): 202 before anything goes down.
async fn post_host_reboot(State(state): State<Serving>, headers: HeaderMap) -> Response {
    let svc = match vm_service(&state, &headers) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    match svc.with(|_, _, config| vms::reboot_host(config)).await {
        Ok(Ok(rebooting)) => (StatusCode::ACCEPTED, axum::Json(rebooting)).into_response(),
        Ok(Err(e)) => vm_error(e),
        Err(e) => answer(
            StatusCode::INTERNAL_SERVER_ERROR,
            AgentErrorCode::Failed,
            &e,
        ),
    }
}

/// Every route's first check, before its body is read (issue #36.5): a caller without the
/// token costs the agent one header, not a body it would wait for. The handlers check it
/// again through their gates.
async fn token_first(
    State(state): State<Serving>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if !authorised(&state, request.headers()) {
        return Gate::Unauthorized.into_response();
    }
    next.run(request).await
}

pub fn router(state: Serving) -> Router {
    Router::new()
        .route("/v1/operator-keys", put(put_operator_keys))
        .route("/v1/vms", post(post_vm).get(get_vms))
        .route("/v1/vms/{name}", delete(delete_vm))
        .route("/v1/vms/{name}/state", post(post_vm_state))
        .route("/v1/host/reboot", post(post_host_reboot))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            token_first,
        ))
        .layer(DefaultBodyLimit::max(MAX_ENVELOPE_BYTES))
        .with_state(state)
}

/// What `byo-agent serve` is started with.
pub struct ServeOptions {
    /// Where the relay's Caddy reaches the agent (wg0's host address).
    pub listen: std::net::SocketAddr,
    /// The file holding the SHA-256 (hex) of the agent token the backend presents.
    pub agent_token_hash: std::path::PathBuf,
    /// What preparation handed over; without it the VM API answers 503.
    pub serving_file: std::path::PathBuf,
    /// Seconds between heartbeats (at least one).
    pub heartbeat_every: u64,
    pub operator_keys: OperatorKeys,
    /// The listener's limits (`byo_listen`).
    pub limits: byo_listen::Limits,
}

/// Answer the backend on `listener` under `limits` until `shutdown`: the agent's API through
/// the one limited listener every byo daemon uses (`byo_listen`).
pub async fn answer_on(
    listener: tokio::net::TcpListener,
    state: Serving,
    limits: byo_listen::Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    byo_listen::serve(listener, router(state), limits, shutdown).await
}

/// The serving unit (enverge-agent, as spark): bring authorized_keys to the kept operator-key
/// list, then answer the backend on one thread, with the heartbeat on its own once prepared.
pub fn run(options: ServeOptions) -> anyhow::Result<()> {
    use anyhow::Context;
    let ServeOptions {
        listen,
        agent_token_hash: token_hash_file,
        serving_file,
        heartbeat_every,
        mut operator_keys,
        limits,
    } = options;
    let heartbeat_every = std::time::Duration::from_secs(heartbeat_every.max(1));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .compact()
        .init();
    let hash = std::fs::read_to_string(&token_hash_file)
        .with_context(|| format!("reading {}", token_hash_file.display()))?;
    let hash = hash.trim();
    anyhow::ensure!(
        hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{} must hold a SHA-256 in hex",
        token_hash_file.display()
    );
    let vms = match std::fs::read(&serving_file) {
        Ok(bytes) => {
            let handed: crate::machines::HandOver = serde_json::from_slice(&bytes)
                .with_context(|| format!("{} does not parse", serving_file.display()))?;
            Some(handed)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!("not prepared yet: the VM API answers 503 until preparation hands over");
            None
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", serving_file.display())),
    };
    operator_keys.host = vms.as_ref().map(|h| h.slug.clone());
    if operator_keys.reconcile_through_root(chrono::Utc::now())? {
        tracing::info!("root asked to bring authorized_keys to the kept operator-key list");
    }
    let service = vms.as_ref().map(|handed| {
        Arc::new(VmService {
            config: VmConfig {
                ssh_listen: handed.ssh_listen.clone(),
                gpu: handed.gpu,
                tunnel: handed.tunnel,
                operator_keys_held: Some(operator_keys.paths.held.clone()),
                prepare_lock: Some(crate::lock::PREPARE_LOCK.into()),
                reboot_flag: Some(byo_core::render::units::REBOOT_FLAG.into()),
                machines: crate::machines::Machines::handed(
                    &handed.pair,
                    Arc::new(crate::machines::SshSatelliteHosts {
                        dir: crate::machines::SERVING_STATE.into(),
                    }),
                    byo_core::render::units::RAILS_FLAG.into(),
                ),
            },
            relay: Box::new(vms::HttpRelayMap::new(
                &handed.ssh_map_endpoint,
                &handed.ssh_map_token,
            )),
            host: std::sync::Mutex::new(LocalHost::serving()),
        })
    });
    let state = Serving {
        vms: service.clone(),
        token_hash: Arc::new(TokenHash::from_stored(hash.to_ascii_lowercase())),
        operator_keys,
    };
    // One thread: the agent's steady state is to answer the backend and otherwise sit still.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        tracing::info!(%listen, "serving");
        if let (Some(svc), Some(handed)) = (service, vms) {
            let keys = state.operator_keys.clone();
            std::thread::spawn(move || crate::heartbeat::run(svc, handed, keys, heartbeat_every));
        }
        answer_on(listener, state, limits, async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
        Ok(())
    })
}
