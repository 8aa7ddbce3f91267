//! Root's LXD gate (`byo-agent lxd-gate`, the unit `enverge-lxd-gate`, issue #36): serving
//! is not in LXD's `lxd` group, which would make it root, and reaches LXD only through this
//! socket, open to spark's group alone. Each request is judged by
//! [`byo_core::lxd_gate::judge`] before LXD sees it; what passes is forwarded over LXD's
//! own socket as root, and what does not is answered 403 in LXD's error shape and logged.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use byo_core::lxd_gate::{self, Rules, Verdict};
use serde_json::{Value, json};

use crate::host::{Fallible, Host as _, LocalHost, LxdBody};
use crate::machines::HandOver;
use crate::names::{
    BASE_ALIAS, DUAL_PROFILE, FIRST_SSH_PORT, HEAD_KEY, PORT_KEY, PROFILE_NAME, SSH_PORTS,
};

/// The largest request forwarded: serving pushes scripts, keys and a banner, never more.
const MAX_BODY: usize = 4 << 20;

/// The rules as this host stands: the tunnel address from preparation's hand-over, read
/// at each request (absent before preparation completed: no SSH device is admitted).
pub fn rules(serving_file: &Path) -> Rules {
    let ssh_listen = std::fs::read(serving_file)
        .ok()
        .and_then(|b| serde_json::from_slice::<HandOver>(&b).ok())
        .map(|h| h.ssh_listen);
    Rules {
        base_alias: BASE_ALIAS.into(),
        profiles: vec![PROFILE_NAME.into(), DUAL_PROFILE.into()],
        markers: vec![PORT_KEY.into(), HEAD_KEY.into()],
        port_key: PORT_KEY.into(),
        ports: FIRST_SSH_PORT..=FIRST_SSH_PORT + (SSH_PORTS - 1),
        ssh_listen,
    }
}

struct Gate {
    serving_file: PathBuf,
}

/// An answer in LXD's own error shape, which serving's client reads like LXD's.
fn refusal(status: u16, why: &str) -> (u16, Vec<u8>) {
    let body = json!({
        "type": "error", "status": "", "status_code": 0, "operation": "",
        "error_code": status, "error": format!("refused by the LXD gate: {why}"), "metadata": null,
    });
    (status, body.to_string().into_bytes())
}

impl Gate {
    fn answer(
        &self,
        method: &str,
        target: &str,
        headers: &HeaderMap,
        body: &[u8],
    ) -> (u16, Vec<u8>) {
        let rules = rules(&self.serving_file);
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let verdict = lxd_gate::judge(&rules, method, target, &header, body);
        let mut lxd = LocalHost::default();
        let outcome = match verdict {
            Verdict::Refuse(why) => {
                tracing::warn!(method, target, %why, "refused");
                return refusal(403, &why);
            }
            Verdict::Forward => forward(&mut lxd, method, target, headers, body),
            Verdict::IfOurs(name) => {
                match lxd.lxd("GET", &format!("/1.0/instances/{name}"), LxdBody::None) {
                    Ok(r) if r.status == 404 => Ok((r.status, r.body)),
                    Ok(r) if lxd_gate::is_ours(&rules, &r.json()["metadata"]) => {
                        forward(&mut lxd, method, target, headers, body)
                    }
                    Ok(_) => {
                        tracing::warn!(method, target, "refused: not an instance of ours");
                        return refusal(403, &format!("{name} is not an instance of ours"));
                    }
                    Err(e) => Err(e),
                }
            }
            Verdict::ListOurs => forward(&mut lxd, method, target, headers, body).map(|(s, b)| {
                match serde_json::from_slice::<Value>(&b) {
                    Ok(v) => (s, lxd_gate::only_ours(&rules, v).to_string().into_bytes()),
                    // Not a list LXD would send: nothing of it passes.
                    Err(_) => refusal(502, "LXD's list did not parse"),
                }
            }),
        };
        outcome.unwrap_or_else(|e| refusal(503, &e))
    }
}

fn forward(
    lxd: &mut LocalHost,
    method: &str,
    target: &str,
    headers: &HeaderMap,
    body: &[u8],
) -> Fallible<(u16, Vec<u8>)> {
    // LXD's file headers and the content type ride along; nothing else of the caller's does.
    let pass: Vec<(&str, String)> = headers
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-lxd-") || *k == header::CONTENT_TYPE)
        .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?.to_owned())))
        .collect();
    let body = if body.is_empty() && pass.is_empty() {
        LxdBody::None
    } else {
        LxdBody::Raw {
            bytes: body,
            headers: &pass,
        }
    };
    let reply = lxd.lxd(method, target, body)?;
    Ok((reply.status, reply.body))
}

async fn handle(
    State(gate): State<std::sync::Arc<Gate>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let target = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned());
    let answered =
        tokio::task::spawn_blocking(move || gate.answer(method.as_str(), &target, &headers, &body))
            .await
            .unwrap_or_else(|_| refusal(500, "the gate failed"));
    let (status, body) = answered;
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// Tell systemd the socket answers (`Type=notify`): serving is ordered after the gate, so a
/// gate that cannot start fails its start at once rather than after a wait. Nothing when
/// not started by systemd.
fn ready() {
    use std::os::linux::net::SocketAddrExt as _;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let path = path.to_string_lossy().into_owned();
    let sent = (|| {
        let socket = std::os::unix::net::UnixDatagram::unbound()?;
        match path.strip_prefix('@') {
            Some(name) => {
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
                socket.send_to_addr(b"READY=1", &addr)
            }
            None => socket.send_to(b"READY=1", &path),
        }
    })();
    if let Err(e) = sent {
        tracing::warn!(error = %e, "could not tell systemd the gate is ready");
    }
}

/// `byo-agent lxd-gate`: listen on `socket` (0660, the process's group: the unit runs it
/// with spark's) and answer until stopped.
pub fn run(socket: &Path, serving_file: &Path) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .compact()
        .init();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let gate = std::sync::Arc::new(Gate {
        serving_file: serving_file.to_owned(),
    });
    rt.block_on(async move {
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", socket.display()));
            }
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(socket)
            .with_context(|| format!("binding {}", socket.display()))?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o660))
            .with_context(|| format!("chmod {}", socket.display()))?;
        tracing::info!(socket = %socket.display(), "the LXD gate is answering");
        ready();
        let app = Router::new()
            .fallback(handle)
            .layer(DefaultBodyLimit::max(MAX_BODY))
            .with_state(gate);
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("the LXD gate")
    })
}
