//! A stand-in for the relay's ssh_mapd (its API: `GET|PUT /map`, `PUT|DELETE /map/{port}`,
//! bearer token) and the few backend routes a prepared host calls, on this machine, for the
//! real-host suites that need a relay without the whole platform (the golden path runs the
//! real one).
#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Json;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, put};
use byo_wire::relay::{MapEntry, MapTarget, SshMap};
use serde_json::{Value, json};

#[derive(Clone, Default)]
pub struct FakeMapd {
    pub map: Arc<Mutex<SshMap>>,
    pub refuse: Arc<Mutex<bool>>,
    pub token: String,
    /// The host container, once known: each whole-map PUT then records what LXD in it
    /// runs at that moment (L2.3: the head runs before the relay is pointed).
    pub host: Arc<Mutex<Option<String>>>,
    /// Each whole-map PUT: when it arrived, the map, and `lxc list` inside the host then.
    pub puts: Arc<Mutex<Vec<(Instant, SshMap, String)>>>,
    /// The backend's side, in the same fake: every host-report the agent sent.
    pub reports: Arc<Mutex<Vec<Value>>>,
    /// Every heartbeat the agent sent.
    pub beats: Arc<Mutex<Vec<Value>>>,
    /// What the heartbeat's answer says the beat came from (`Byo-Seen-From`), when set: the
    /// owner's public address, as the backend would see it through the owner's router.
    pub seen_from: Arc<Mutex<Option<String>>>,
}

fn authorised(m: &FakeMapd, headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {}", m.token))
}

async fn get_map(State(m): State<FakeMapd>, h: HeaderMap) -> Result<Json<SshMap>, StatusCode> {
    if !authorised(&m, &h) {
        return Err(StatusCode::UNAUTHORIZED);
    }
    Ok(Json(m.map.lock().unwrap().clone()))
}

async fn put_map(State(m): State<FakeMapd>, h: HeaderMap, Json(map): Json<SshMap>) -> StatusCode {
    if !authorised(&m, &h) {
        return StatusCode::UNAUTHORIZED;
    }
    let at = Instant::now();
    let host = m.host.lock().unwrap().clone();
    // Asked while the agent waits for this answer: what runs as the relay is pointed.
    let running = host
        .map(|name| {
            let out = std::process::Command::new("lxc")
                .args([
                    "exec", &name, "--", "lxc", "list", "--format", "csv", "-c", "ns",
                ])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
        .unwrap_or_default();
    m.puts.lock().unwrap().push((at, map.clone(), running));
    *m.map.lock().unwrap() = map;
    StatusCode::NO_CONTENT
}

/// host-report, as the backend takes it (recorded, not judged: the server's own tests
/// judge it).
async fn post_report(State(m): State<FakeMapd>, Json(report): Json<Value>) -> StatusCode {
    m.reports.lock().unwrap().push(report);
    StatusCode::NO_CONTENT
}

async fn post_beat(State(m): State<FakeMapd>, Json(beat): Json<Value>) -> axum::response::Response {
    use axum::response::IntoResponse;
    m.beats.lock().unwrap().push(beat);
    match m.seen_from.lock().unwrap().clone() {
        Some(addr) => (
            StatusCode::NO_CONTENT,
            [(byo_wire::vm::SEEN_FROM_HEADER, addr)],
        )
            .into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

async fn put_port(
    State(m): State<FakeMapd>,
    UrlPath(port): UrlPath<u16>,
    h: HeaderMap,
    Json(t): Json<MapTarget>,
) -> (StatusCode, Json<Value>) {
    if !authorised(&m, &h) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "unauthorized"})),
        );
    }
    if *m.refuse.lock().unwrap() {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"error": "kernel", "message": "nft: Could not process rule"})),
        );
    }
    let mut map = m.map.lock().unwrap();
    map.mappings.retain(|e| e.port != port);
    map.mappings.push(MapEntry {
        port,
        target: t.target,
        target_port: t.target_port,
    });
    (StatusCode::NO_CONTENT, Json(json!({})))
}

async fn delete_port(
    State(m): State<FakeMapd>,
    UrlPath(port): UrlPath<u16>,
    h: HeaderMap,
) -> StatusCode {
    if !authorised(&m, &h) {
        return StatusCode::UNAUTHORIZED;
    }
    m.map.lock().unwrap().mappings.retain(|e| e.port != port);
    StatusCode::NO_CONTENT
}

/// Serve the fake on every address of this machine (the host container reaches it through
/// the test bridge), on a thread of its own.
pub fn start_mapd(m: FakeMapd) -> u16 {
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new()
                .route("/map", get(get_map).put(put_map))
                .route("/map/{port}", put(put_port).delete(delete_port))
                .route("/api/host/report", axum::routing::post(post_report))
                .route("/api/host/heartbeat", axum::routing::post(post_beat))
                .route(
                    "/api/host/relay",
                    get(|| async { Json(json!({"endpoint": null})) }),
                )
                // No list published: preparation goes on with the one the host holds.
                .route(
                    "/api/host/operator-keys",
                    get(|| async { StatusCode::CONFLICT }),
                )
                .with_state(m);
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    port
}
