//! The `cloudflare` tunnel provider against a fake Cloudflare API that keeps the real one's
//! shapes: the `{success, errors, result}` envelope, tunnels found by name, the connector
//! token as a bare string result, and a second CNAME for one name refused with 81053.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Json, Router};
use byo_server::providers::TunnelProvider;
use byo_server::providers::cloudflare::{CloudflareConfig, CloudflareTunnels};
use serde_json::{Value, json};

#[derive(Default)]
struct Fake {
    tunnels: BTreeMap<String, Value>,
    configs: BTreeMap<String, Value>,
    records: BTreeMap<String, Value>,
    next: u32,
}

type Shared = Arc<Mutex<Fake>>;

fn ok(result: Value) -> Response {
    Json(json!({"success": true, "errors": [], "messages": [], "result": result})).into_response()
}

fn fail(status: StatusCode, code: u32, message: &str) -> Response {
    (status, Json(json!({"success": false, "errors": [{"code": code, "message": message}], "messages": [], "result": null}))).into_response()
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

async fn world(api_token: &str) -> (Shared, CloudflareTunnels) {
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

#[tokio::test]
async fn the_operator_tunnel_gets_its_ingress_its_name_and_a_connector_token() {
    let (fake, cf) = world("cf-token").await;
    let t = cf.create("spark-7").await.unwrap();
    assert_eq!(t.hostname, "spark-7.hosts.example.com");
    assert!(t.connector_token.starts_with("eyJ"));
    let f = fake.lock().unwrap();
    assert_eq!(f.tunnels.len(), 1);
    let ingress = &f.configs[&t.id]["ingress"];
    assert_eq!(
        ingress[0],
        json!({"hostname": "spark-7.hosts.example.com", "service": "ssh://localhost:22"})
    );
    assert_eq!(
        ingress[1]["service"], "http_status:404",
        "nothing else is served"
    );
    let record = f.records.values().next().unwrap();
    assert_eq!(record["type"], "CNAME");
    assert_eq!(record["content"], format!("{}.cfargotunnel.com", t.id));
    assert_eq!(record["proxied"], true);
}

#[tokio::test]
async fn creating_again_and_deleting_twice_are_calm() {
    let (fake, cf) = world("cf-token").await;
    let first = cf.create("spark-7").await.unwrap();
    let again = cf.create("spark-7").await.unwrap();
    assert_eq!(first.id, again.id, "found by name, not made twice");
    {
        let f = fake.lock().unwrap();
        assert_eq!(
            (f.tunnels.len(), f.records.len()),
            (1, 1),
            "no second tunnel, no 81053"
        );
    }
    cf.delete("spark-7").await.unwrap();
    {
        let f = fake.lock().unwrap();
        assert!(f.tunnels.is_empty() && f.records.is_empty());
    }
    cf.delete("spark-7").await.unwrap();
}

#[tokio::test]
async fn a_bad_api_token_is_a_clear_error_and_creates_nothing() {
    let (fake, cf) = world("wrong").await;
    let err = cf.create("spark-7").await.unwrap_err();
    assert!(err.0.contains("Authentication error"), "{err}");
    assert!(fake.lock().unwrap().tunnels.is_empty());
}

#[tokio::test]
async fn the_customer_ssh_wildcard_is_a_dns_only_a_record_pointed_again_and_removed() {
    let (fake, cf) = world("cf-token").await;
    let name = "*.spark-7.ssh.example.com";
    cf.point_ssh_wildcard(name, "203.0.113.7").await.unwrap();
    cf.point_ssh_wildcard(name, "203.0.113.7").await.unwrap();
    let records = |f: &Shared| -> Vec<Value> {
        f.lock()
            .unwrap()
            .records
            .values()
            .filter(|r| r["name"] == name)
            .cloned()
            .collect()
    };
    let r = records(&fake);
    assert_eq!(r.len(), 1, "idempotent: {r:?}");
    assert_eq!(
        (
            r[0]["type"].as_str(),
            r[0]["content"].as_str(),
            r[0]["proxied"].as_bool()
        ),
        (Some("A"), Some("203.0.113.7"), Some(false))
    );
    // A replaced relay: the same record, pointed at the new address.
    cf.point_ssh_wildcard(name, "198.51.100.9").await.unwrap();
    let r = records(&fake);
    assert_eq!(
        (r.len(), r[0]["content"].as_str()),
        (1, Some("198.51.100.9"))
    );
    cf.remove_ssh_wildcard(name).await.unwrap();
    cf.remove_ssh_wildcard(name).await.unwrap();
    assert!(records(&fake).is_empty());
}
