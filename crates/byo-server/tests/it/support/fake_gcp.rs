//! A fake Compute Engine that keeps the real API's shapes (the service-account JWT grant,
//! long-running operations not done on the first look, 404s for what is gone, "resource in
//! use" for an address still attached, a self-link `natIP` answered 400), with fault
//! injection (`fail`: every request of one method answered 503). `gcp_relays.rs` tests the
//! client against it; `lifecycle.rs` runs the server on it.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Form, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use byo_server::providers::gcp::{GcpConfig, GcpRelays, ServiceAccountKey};
use serde_json::{Value, json};

#[derive(Default)]
pub struct Fake {
    pub public_key_pem: Vec<u8>,
    pub audience: String,
    pub addresses: BTreeMap<String, String>,
    pub instances: BTreeMap<String, Value>,
    /// Operation name → polls left before DONE.
    pub ops: BTreeMap<String, u32>,
    pub polls: u32,
    pub next: u32,
    /// Addresses handed out so far: each reservation gets a new one, as GCP's would.
    pub reserved: u32,
    /// Fault injection: every request with this method is answered 503 while set.
    pub fail: Option<axum::http::Method>,
}

pub type Shared = Arc<Mutex<Fake>>;

/// Fault injection: a request whose method is the one set fails as GCP does when it is
/// having a bad day.
async fn fault(
    State(s): State<Shared>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let failing = s.lock().unwrap().fail.clone();
    if failing.as_ref() == Some(req.method()) {
        return gcp_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "The service is currently unavailable.",
        );
    }
    next.run(req).await
}

fn gcp_error(status: StatusCode, message: &str) -> Response {
    (status, Json(json!({"error": {"code": status.as_u16(), "message": message, "errors": [{"message": message}]}}))).into_response()
}

fn authorised(headers: &HeaderMap) -> bool {
    headers.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer fake-access-token")
}

fn op(fake: &mut Fake) -> Value {
    fake.next += 1;
    let name = format!("operation-{}", fake.next);
    fake.ops.insert(name.clone(), 1);
    json!({"kind": "compute#operation", "name": name, "status": "RUNNING"})
}

async fn token(State(s): State<Shared>, Form(form): Form<BTreeMap<String, String>>) -> Response {
    if form.get("grant_type").map(String::as_str)
        != Some("urn:ietf:params:oauth:grant-type:jwt-bearer")
    {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "unsupported_grant_type"})),
        )
            .into_response();
    }
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(&s.lock().unwrap().public_key_pem).unwrap();
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    let audience = s.lock().unwrap().audience.clone();
    validation.set_audience(&[audience]);
    validation.set_issuer(&["relays@byo-test.iam.gserviceaccount.com"]);
    match jsonwebtoken::decode::<Value>(form.get("assertion").map_or("", String::as_str), &key, &validation) {
        Ok(t) if t.claims["scope"] == "https://www.googleapis.com/auth/compute" => {
            Json(json!({"access_token": "fake-access-token", "expires_in": 3599, "token_type": "Bearer"})).into_response()
        }
        _ => (StatusCode::BAD_REQUEST, Json(json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."}))).into_response(),
    }
}

async fn get_op(
    State(s): State<Shared>,
    headers: HeaderMap,
    Path((_p, _scope, _where, name)): Path<(String, String, String, String)>,
) -> Response {
    if !authorised(&headers) {
        return gcp_error(
            StatusCode::UNAUTHORIZED,
            "Request is missing required authentication credential.",
        );
    }
    let mut f = s.lock().unwrap();
    f.polls += 1;
    match f.ops.get_mut(&name) {
        None => gcp_error(StatusCode::NOT_FOUND, "operation not found"),
        Some(left) => {
            let status = if *left == 0 {
                "DONE"
            } else {
                *left -= 1;
                "RUNNING"
            };
            Json(json!({"name": name, "status": status})).into_response()
        }
    }
}

async fn addresses(
    State(s): State<Shared>,
    headers: HeaderMap,
    Path((_p, _r)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    if !authorised(&headers) {
        return gcp_error(StatusCode::UNAUTHORIZED, "unauthenticated");
    }
    let mut f = s.lock().unwrap();
    let name = body["name"].as_str().unwrap_or_default().to_owned();
    if f.addresses.contains_key(&name) {
        return gcp_error(
            StatusCode::CONFLICT,
            &format!("The resource '{name}' already exists"),
        );
    }
    f.reserved += 1;
    let ip = format!("34.1.2.{}", f.reserved);
    f.addresses.insert(name, ip);
    Json(op(&mut f)).into_response()
}

async fn address(
    State(s): State<Shared>,
    headers: HeaderMap,
    method: axum::http::Method,
    Path((p, r, name)): Path<(String, String, String)>,
) -> Response {
    if !authorised(&headers) {
        return gcp_error(StatusCode::UNAUTHORIZED, "unauthenticated");
    }
    let mut f = s.lock().unwrap();
    let Some(ip) = f.addresses.get(&name).cloned() else {
        return gcp_error(
            StatusCode::NOT_FOUND,
            &format!("The resource 'projects/{p}/regions/{r}/addresses/{name}' was not found"),
        );
    };
    if method == axum::http::Method::DELETE {
        if f.instances
            .values()
            .any(|i| i["networkInterfaces"][0]["accessConfigs"][0]["natIP"] == ip.as_str())
        {
            return gcp_error(
                StatusCode::BAD_REQUEST,
                &format!("The address resource '{name}' is already being used"),
            );
        }
        f.addresses.remove(&name);
        return Json(op(&mut f)).into_response();
    }
    Json(json!({"name": name, "address": ip, "status": "RESERVED",
        "selfLink": format!("https://www.googleapis.com/compute/v1/projects/{p}/regions/{r}/addresses/{name}")}))
    .into_response()
}

async fn instances(
    State(s): State<Shared>,
    headers: HeaderMap,
    Path((p, _z)): Path<(String, String)>,
    Json(body): Json<Value>,
) -> Response {
    if !authorised(&headers) {
        return gcp_error(StatusCode::UNAUTHORIZED, "unauthenticated");
    }
    let mut f = s.lock().unwrap();
    let nat = body["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if nat.parse::<Ipv4Addr>().is_err() || !f.addresses.values().any(|a| *a == nat) {
        return gcp_error(
            StatusCode::BAD_REQUEST,
            &format!(
                "Invalid value for field 'resource.networkInterfaces[0].accessConfigs[0].natIP': '{nat}'. The specified external IP address '{nat}' was not found in region 'projects/{p}'."
            ),
        );
    }
    let name = body["name"].as_str().unwrap_or_default().to_owned();
    if f.instances.contains_key(&name) {
        return gcp_error(
            StatusCode::CONFLICT,
            &format!("The resource '{name}' already exists"),
        );
    }
    f.instances.insert(name, body);
    Json(op(&mut f)).into_response()
}

async fn instance(
    State(s): State<Shared>,
    headers: HeaderMap,
    method: axum::http::Method,
    Path((_p, _z, name)): Path<(String, String, String)>,
) -> Response {
    if !authorised(&headers) {
        return gcp_error(StatusCode::UNAUTHORIZED, "unauthenticated");
    }
    let mut f = s.lock().unwrap();
    let Some(body) = f.instances.get(&name).cloned() else {
        return gcp_error(
            StatusCode::NOT_FOUND,
            &format!("The resource '{name}' was not found"),
        );
    };
    if method == axum::http::Method::DELETE {
        f.instances.remove(&name);
        return Json(op(&mut f)).into_response();
    }
    Json(body).into_response()
}

/// The real client, pointed at the fake on `base`, signing with the key in `key`.
pub fn client(base: &str, key: &std::path::Path) -> GcpRelays {
    let config = GcpConfig {
        project: "byo-test".into(),
        region: "europe-west4".into(),
        zone: "europe-west4-a".into(),
        service_account_key_file: key.to_owned(),
        machine_type: "e2-micro".into(),
        image: "projects/debian-cloud/global/images/family/debian-12".into(),
        network: "global/networks/default".into(),
        api_base: format!("{base}/compute/v1"),
    };
    let sa = ServiceAccountKey {
        client_email: "relays@byo-test.iam.gserviceaccount.com".into(),
        private_key: std::fs::read_to_string(key).unwrap(),
        token_uri: format!("{base}/token"),
    };
    GcpRelays::with_key(config, sa).with_poll_interval(Duration::from_millis(5))
}

pub struct FakeGcp {
    pub fake: Shared,
    pub relays: GcpRelays,
    pub base: String,
    /// Holds the service account's key file.
    pub dir: tempfile::TempDir,
}

/// A fake Compute Engine on a loopback port, and the real client pointed at it.
pub async fn start() -> FakeGcp {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sa.pem");
    let out = Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let public = Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&key)
        .output()
        .unwrap()
        .stdout;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let fake: Shared = Arc::new(Mutex::new(Fake {
        public_key_pem: public,
        audience: format!("{base}/token"),
        ..Default::default()
    }));
    let app = Router::new()
        .route("/token", post(token))
        .route(
            "/compute/v1/projects/{p}/{scope}/{where}/operations/{name}",
            get(get_op),
        )
        .route(
            "/compute/v1/projects/{p}/regions/{r}/addresses",
            post(addresses),
        )
        .route(
            "/compute/v1/projects/{p}/regions/{r}/addresses/{name}",
            get(address).delete(address),
        )
        .route(
            "/compute/v1/projects/{p}/zones/{z}/instances",
            post(instances),
        )
        .route(
            "/compute/v1/projects/{p}/zones/{z}/instances/{name}",
            get(instance).delete(instance),
        )
        .layer(axum::middleware::from_fn_with_state(fake.clone(), fault))
        .with_state(fake.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let relays = client(&base, &key);
    FakeGcp {
        fake,
        relays,
        base,
        dir,
    }
}
