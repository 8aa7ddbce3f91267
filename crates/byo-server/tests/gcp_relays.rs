//! relay-provision's `gcp` client against a fake Compute Engine that keeps the real API's
//! shapes: the service-account JWT grant, long-running operations that are not done on the
//! first look, 404s for what is gone, "resource in use" for an address still attached, and
//! the quirk provisioning note 5 records — `natIP` must be the address literal; a self-link
//! is answered 400.

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
use byo_server::providers::RelayProvider;
use byo_server::providers::gcp::{GcpConfig, GcpRelays, ServiceAccountKey};
use serde_json::{Value, json};

#[derive(Default)]
struct Fake {
    public_key_pem: Vec<u8>,
    audience: String,
    addresses: BTreeMap<String, String>,
    instances: BTreeMap<String, Value>,
    /// Operation name → polls left before DONE.
    ops: BTreeMap<String, u32>,
    polls: u32,
    next: u32,
}

type Shared = Arc<Mutex<Fake>>;

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
    let ip = format!("34.1.2.{}", f.addresses.len() + 1);
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
fn client(base: &str, key: &std::path::Path) -> GcpRelays {
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

struct World {
    fake: Shared,
    relays: GcpRelays,
    base: String,
    _dir: tempfile::TempDir,
}

async fn world() -> World {
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
        .with_state(fake.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let relays = client(&base, &key);
    World {
        fake,
        relays,
        base,
        _dir: dir,
    }
}

#[tokio::test]
async fn relay_provision_reserves_the_address_and_creates_the_relay_with_the_literal() {
    let w = world().await;
    let info = w
        .relays
        .provision("spark-7", Some("#!/usr/bin/env bash\necho hi\n"))
        .await;
    let info = match info {
        Ok(i) => i,
        Err(e) if e.0.contains("Invalid JWT") => panic!("the JWT grant was refused: {e}"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        (info.name.as_str(), info.address.as_str()),
        ("spark-7-relay", "34.1.2.1")
    );
    let f = w.fake.lock().unwrap();
    assert_eq!(
        f.addresses.get("spark-7-relay-ip").map(String::as_str),
        Some("34.1.2.1")
    );
    let instance = &f.instances["spark-7-relay"];
    assert_eq!(
        instance["networkInterfaces"][0]["accessConfigs"][0]["natIP"],
        "34.1.2.1"
    );
    assert_eq!(instance["metadata"]["items"][0]["key"], "startup-script");
    assert_eq!(
        instance["metadata"]["items"][0]["value"],
        "#!/usr/bin/env bash\necho hi\n"
    );
    assert_eq!(instance["canIpForward"], true);
    assert!(f.polls >= 2, "operations were followed to DONE");
}

#[tokio::test]
async fn provisioning_again_changes_nothing_and_release_leaves_nothing() {
    let w = world().await;
    let first = w.relays.provision("spark-7", Some("script")).await.unwrap();
    let again = w.relays.provision("spark-7", Some("script")).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(w.fake.lock().unwrap().instances.len(), 1);
    w.relays.release("spark-7").await.unwrap();
    {
        let f = w.fake.lock().unwrap();
        assert!(
            f.instances.is_empty() && f.addresses.is_empty(),
            "instance and address both gone"
        );
    }
    // Releasing what is gone succeeds: reap is idempotent.
    w.relays.release("spark-7").await.unwrap();
}

#[tokio::test]
async fn no_bootstrap_means_no_relay() {
    let w = world().await;
    let err = w.relays.provision("spark-8", None).await.unwrap_err();
    assert!(err.0.contains("relay_release"), "{err}");
    let f = w.fake.lock().unwrap();
    assert!(
        f.addresses.is_empty() && f.instances.is_empty(),
        "nothing was reserved"
    );
}

#[tokio::test]
async fn the_fake_answers_a_self_link_nat_ip_with_400_as_gcp_does() {
    let w = world().await;
    w.relays.provision("spark-9", Some("script")).await.unwrap();
    let self_link = format!(
        "{}/compute/v1/projects/byo-test/regions/europe-west4/addresses/spark-9-relay-ip",
        w.base
    );
    let resp = reqwest::Client::new()
        .post(format!("{}/compute/v1/projects/byo-test/zones/europe-west4-a/instances", w.base))
        .bearer_auth("fake-access-token")
        .json(&json!({"name": "other-relay", "networkInterfaces": [{"accessConfigs": [{"natIP": self_link}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("natIP"));
}

#[tokio::test]
async fn a_service_account_key_that_does_not_match_is_refused_cleanly() {
    let w = world().await;
    let other = tempfile::tempdir().unwrap();
    let key = other.path().join("other.pem");
    assert!(
        Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out"
            ])
            .arg(&key)
            .output()
            .unwrap()
            .status
            .success()
    );
    let wrong = client(&w.base, &key);
    let err = wrong
        .provision("spark-10", Some("script"))
        .await
        .unwrap_err();
    assert!(err.0.contains("token endpoint refused"), "{err}");
    assert!(w.fake.lock().unwrap().addresses.is_empty());
}
