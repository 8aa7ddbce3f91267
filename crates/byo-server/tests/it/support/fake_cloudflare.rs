//! A fake Cloudflare API that keeps the real one's shapes: the `{success, errors, result}`
//! envelope, tunnels found by name, the connector token as a bare string result, a second
//! record for one name refused with 81053 — with fault injection (`fail`: every request of
//! one method answered 503). `cloudflare_tunnels.rs` tests the client against it;
//! `lifecycle.rs` runs the server on it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Json, Router};
use byo_server::providers::cloudflare::{CloudflareConfig, CloudflareTunnels};
use serde_json::{Value, json};

#[derive(Default)]
pub struct Fake {
    pub tunnels: BTreeMap<String, Value>,
    pub configs: BTreeMap<String, Value>,
    pub records: BTreeMap<String, Value>,
    pub next: u32,
    /// Fault injection: every request with this method is answered 503 while set.
    pub fail: Option<axum::http::Method>,
}

pub type Shared = Arc<Mutex<Fake>>;

fn ok(result: Value) -> Response {
    Json(json!({"success": true, "errors": [], "messages": [], "result": result})).into_response()
}

fn fail(status: StatusCode, code: u32, message: &str) -> Response {
    (status, Json(json!({"success": false, "errors": [{"code": code, "message": message}], "messages": [], "result": null}))).into_response()
}

/// Fault injection: a request whose method is the one set fails as Cloudflare does when it
/// is having a bad day.
async fn fault(
    State(s): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let failing = s.lock().unwrap().fail.clone();
    if failing.as_ref() == Some(req.method()) {
        return fail(
            StatusCode::SERVICE_UNAVAILABLE,
            10001,
            "service temporarily unavailable",
        );
    }
    next.run(req).await
}

fn authorised(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer cf-token")
}

macro_rules! guard {
    ($h:expr) => {
        if !authorised(&$h) {
            return fail(StatusCode::FORBIDDEN, 10000, "Authentication error");
        }
    };
}

async fn tunnels(
    State(s): State<Shared>,
    h: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    guard!(h);
    let f = s.lock().unwrap();
    let name = q.get("name").cloned().unwrap_or_default();
    ok(Value::Array(
        f.tunnels
            .values()
            .filter(|t| t["name"] == name.as_str())
            .cloned()
            .collect(),
    ))
}

async fn create_tunnel(State(s): State<Shared>, h: HeaderMap, Json(body): Json<Value>) -> Response {
    guard!(h);
    let mut f = s.lock().unwrap();
    f.next += 1;
    let id = format!("c1744f8b-faa1-48a4-9e5c-{:012}", f.next);
    let t = json!({"id": id, "name": body["name"], "status": "inactive"});
    f.tunnels.insert(id, t.clone());
    ok(t)
}

async fn configure(
    State(s): State<Shared>,
    h: HeaderMap,
    Path((_a, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    guard!(h);
    let mut f = s.lock().unwrap();
    if !f.tunnels.contains_key(&id) {
        return fail(StatusCode::NOT_FOUND, 1003, "tunnel not found");
    }
    f.configs.insert(id, body["config"].clone());
    ok(json!({"tunnel_id": "x"}))
}

async fn token(
    State(s): State<Shared>,
    h: HeaderMap,
    Path((_a, id)): Path<(String, String)>,
) -> Response {
    guard!(h);
    if !s.lock().unwrap().tunnels.contains_key(&id) {
        return fail(StatusCode::NOT_FOUND, 1003, "tunnel not found");
    }
    ok(json!(format!("eyJhIjoi{id}")))
}

async fn delete_tunnel(
    State(s): State<Shared>,
    h: HeaderMap,
    Path((_a, id)): Path<(String, String)>,
) -> Response {
    guard!(h);
    match s.lock().unwrap().tunnels.remove(&id) {
        Some(t) => ok(t),
        None => fail(StatusCode::NOT_FOUND, 1003, "tunnel not found"),
    }
}

async fn records(
    State(s): State<Shared>,
    h: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    guard!(h);
    let f = s.lock().unwrap();
    let name = q.get("name").cloned().unwrap_or_default();
    ok(Value::Array(
        f.records
            .values()
            .filter(|r| r["name"] == name.as_str())
            .cloned()
            .collect(),
    ))
}

async fn create_record(State(s): State<Shared>, h: HeaderMap, Json(body): Json<Value>) -> Response {
    guard!(h);
    let mut f = s.lock().unwrap();
    if f.records.values().any(|r| r["name"] == body["name"]) {
        return fail(
            StatusCode::BAD_REQUEST,
            81053,
            "An A, AAAA, or CNAME record with that host already exists.",
        );
    }
    f.next += 1;
    let id = format!("rec{}", f.next);
    let mut r = body.clone();
    r["id"] = json!(id);
    f.records.insert(id, r.clone());
    ok(r)
}

async fn delete_record(
    State(s): State<Shared>,
    h: HeaderMap,
    Path((_z, id)): Path<(String, String)>,
) -> Response {
    guard!(h);
    match s.lock().unwrap().records.remove(&id) {
        Some(_) => ok(json!({"id": id})),
        None => fail(StatusCode::NOT_FOUND, 81044, "Record does not exist."),
    }
}

async fn update_record(
    State(s): State<Shared>,
    h: HeaderMap,
    Path((_z, id)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    guard!(h);
    let mut f = s.lock().unwrap();
    match f.records.get_mut(&id) {
        Some(r) => {
            let mut new = body.clone();
            new["id"] = json!(id);
            *r = new.clone();
            ok(new)
        }
        None => fail(StatusCode::NOT_FOUND, 81044, "Record does not exist."),
    }
}

/// A fake Cloudflare API on a loopback port, and the real client pointed at it with
/// `api_token` (the fake accepts only `cf-token`).
pub async fn start(api_token: &str) -> (Shared, CloudflareTunnels) {
    let fake: Shared = Default::default();
    let app = Router::new()
        .route(
            "/client/v4/accounts/{a}/cfd_tunnel",
            get(tunnels).post(create_tunnel),
        )
        .route(
            "/client/v4/accounts/{a}/cfd_tunnel/{id}",
            delete(delete_tunnel),
        )
        .route(
            "/client/v4/accounts/{a}/cfd_tunnel/{id}/configurations",
            put(configure),
        )
        .route("/client/v4/accounts/{a}/cfd_tunnel/{id}/token", get(token))
        .route(
            "/client/v4/zones/{z}/dns_records",
            get(records).post(create_record),
        )
        .route(
            "/client/v4/zones/{z}/dns_records/{id}",
            delete(delete_record).put(update_record),
        )
        .layer(axum::middleware::from_fn_with_state(fake.clone(), fault))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/client/v4", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let tunnels = CloudflareTunnels::new(CloudflareConfig {
        account_id: "acct".into(),
        zone_id: "zone".into(),
        tunnel_domain: "hosts.example.com".into(),
        api_token: api_token.to_owned().into(),
        api_base: base,
    });
    (fake, tunnels)
}
