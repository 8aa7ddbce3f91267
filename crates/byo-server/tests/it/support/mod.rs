//! A test app over a fresh database, driven in-process (crates.io's pattern).

#![allow(dead_code)] // each test binary uses a different part

pub mod agents;
pub mod fake_cloudflare;
pub mod fake_gcp;
pub mod fake_stripe;
pub mod relay_tls;
pub mod smtp;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::Backend;
use byo_db::hosts::NewHost;
use byo_db::testing::TestDb;
use byo_db::users::NewUser;
use byo_server::config::PasswordHashing;
use byo_server::{AppState, Config};
use byo_wire::Role;
use http_body_util::BodyExt;
use tower::ServiceExt;

/// Generates `<scenario>::sqlite` and `<scenario>::postgres` tests.
#[macro_export]
macro_rules! on_each_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                if let Some(app) = $crate::support::TestApp::new(byo_db::Backend::Sqlite).await {
                    super::$name(app).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(app) = $crate::support::TestApp::new(byo_db::Backend::Postgres).await {
                    super::$name(app).await
                }
            }
        }
    )*};
}

/// Like `on_each_backend!`, for test files whose scenarios take a richer `World` built by
/// their own `async fn world(backend) -> Option<World>`.
#[macro_export]
macro_rules! with_world {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                if let Some(w) = super::world(byo_db::Backend::Sqlite).await {
                    super::$name(w).await
                }
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(w) = super::world(byo_db::Backend::Postgres).await {
                    super::$name(w).await
                }
            }
        }
    )*};
}

pub const PASSWORD: &str = "correct horse battery staple";

pub struct TestApp {
    pub db: TestDb,
    pub state: AppState,
    pub router: Router,
}

/// A whole answer as [`Reply::as_seen`] gives it: status, headers (name, value), body.
pub type AsSeen = (StatusCode, Vec<(String, Vec<u8>)>, Vec<u8>);

/// The request of one heartbeat from a host's agent that holds nothing, all well.
pub fn idle_beat(host_token: &str) -> Request<Body> {
    Request::post("/api/host/heartbeat")
        .header(header::AUTHORIZATION, format!("Bearer {host_token}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(
            serde_json::json!({"agent_version": "0.7.3", "lxd": "ok", "relay": "ok",
                   "tunnel": "ok", "gpu": "ok", "storage": "ok", "instances": 0})
            .to_string(),
        ))
        .unwrap()
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// The whole answer as a caller sees it — status, every header (name, value, in order),
    /// body — less `x-request-id`, which is each request's own id by design. What "one
    /// byte-identical answer" compares: a header that told two refusals apart fails it.
    pub fn as_seen(&self) -> AsSeen {
        let headers = self
            .headers
            .iter()
            .filter(|(n, _)| n.as_str() != byo_server::telemetry::REQUEST_ID_HEADER)
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect();
        (self.status, headers, self.body.clone())
    }
    /// The value of the session cookie this reply sets, if any.
    pub fn session_cookie(&self) -> Option<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .find_map(|v| {
                let v = v.to_str().ok()?;
                let rest = v.strip_prefix("__Host-byo_session=")?;
                let value = rest.split(';').next()?;
                (!value.is_empty()).then(|| value.to_owned())
            })
    }
}

/// The signing key the lists [`TestApp::publish_operator_keys`] publishes are signed with;
/// [`test_config`] trusts it.
pub fn signing_key() -> &'static ssh_key::PrivateKey {
    static KEY: std::sync::OnceLock<ssh_key::PrivateKey> = std::sync::OnceLock::new();
    KEY.get_or_init(byo_core::keylist_testing::private_key)
}

pub fn test_config() -> Config {
    let mut config = Config {
        metrics_listen: None,
        public_url: "http://localhost:8080".into(),
        password_hashing: PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        secret_key: Some(byo_server::seal::Sealer::generate_hex().into()),
        // Sign-up's mail is tested where it is (`accounts::a36_…`); elsewhere a sign-up
        // makes its account at once, as under `byo up`.
        signup_without_mail: true,
        // Tests sign in far more often than a person: the limits have their own test.
        rate_limits: byo_server::config::RateLimitConfig {
            per_address_per_minute: 100_000,
            per_account_per_minute: 100_000,
        },
        ..Config::default()
    };
    config.operator_keys.signing_keys = vec![signing_key().public_key().to_openssh().unwrap()];
    config
}

impl TestApp {
    /// `POST /api/auth/login` with an email and a password.
    pub async fn sign_in(&self, email: &str, password: &str) -> Reply {
        self.request(
            axum::http::Method::POST,
            "/api/auth/login",
            None,
            Some(serde_json::json!({"email": email, "password": password})),
        )
        .await
    }

    /// `POST /api/auth/signup` with an email, a password and a display name.
    pub async fn sign_up(&self, email: &str, password: &str, name: &str) -> Reply {
        self.request(
            axum::http::Method::POST,
            "/api/auth/signup",
            None,
            Some(serde_json::json!({"email": email, "password": password, "display_name": name})),
        )
        .await
    }

    pub async fn new(backend: Backend) -> Option<TestApp> {
        Self::with_config(backend, test_config()).await
    }

    pub async fn with_config(backend: Backend, config: Config) -> Option<TestApp> {
        let db = byo_db::testing::fresh(backend).await?;
        // No test logs in over real ssh from here: a walk's login is the fake's (issue #38, 4).
        let state = AppState::new(db.store.clone(), config)
            .with_customer_ssh(std::sync::Arc::new(agents::FakeCustomerSsh::over(None)));
        let router = byo_server::router(state.clone());
        Some(TestApp { db, state, router })
    }

    /// A fixture: the host's customer path walked and passed now (issue #38, 4), for tests
    /// of what follows activation on hosts with no path to walk.
    pub async fn path_walked(&self, host_id: &str) {
        let store = &self.state.store;
        let now = self.state.clock.now();
        let w = store
            .start_path_walk(host_id, "vm-walked0", None, now, now)
            .await
            .unwrap()
            .expect("no walk of the host is running");
        let end = byo_db::path_walks::WalkEnd {
            passed: true,
            ..Default::default()
        };
        store.finish_path_walk(&w.id, &end, now).await.unwrap();
    }

    pub async fn request(
        &self,
        method: Method,
        path: &str,
        session: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> Reply {
        send(&self.router, json_request(method, path, session, body)).await
    }

    pub async fn send(&self, req: Request<Body>) -> Reply {
        send(&self.router, req).await
    }

    /// Wait (up to 5 s) for relay-provision, which runs after "Add a GPU" answers, to record
    /// the host's relay address.
    pub async fn relay_recorded(&self, host_id: &str) {
        for _ in 0..500 {
            let host = self.db.host(host_id).await.unwrap().unwrap();
            if host.relay_ip.is_some() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// One heartbeat from a host's agent that holds nothing, all well: what an operator's
    /// activation waits for (issue #36, 8).
    pub async fn idle_heartbeat(&self, host_token: &str) -> Reply {
        let r = self.send(idle_beat(host_token)).await;
        assert!(r.status.is_success(), "the heartbeat: {}", r.text());
        r
    }

    /// [`request`](Self::request) with an API token (`Authorization: Bearer`) and no session.
    pub async fn request_with_token(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<serde_json::Value>,
    ) -> Reply {
        let mut req = json_request(method, path, None, body);
        req.headers_mut().insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        send(&self.router, req).await
    }

    /// An API token of `sub`'s with `scope`, made in the store (as the account page makes
    /// one), living `days` more days; its secret.
    pub async fn api_token_for(
        &self,
        sub: &str,
        name: &str,
        scope: byo_wire::states::ApiScope,
        days: i64,
    ) -> String {
        let token = SecretToken::generate(TokenKind::Api);
        let now = self.state.clock.now();
        self.db
            .insert_api_token(
                byo_db::api_tokens::NewApiToken {
                    user_sub: sub,
                    name,
                    scope,
                    token_hash: &token.hash(),
                    expires_at: now + chrono::Duration::days(days),
                },
                now,
            )
            .await
            .unwrap();
        token.expose().to_owned()
    }

    /// [`request`](Self::request) as if it came from `from` (the listener's `ConnectInfo`).
    pub async fn request_from(
        &self,
        from: std::net::IpAddr,
        method: Method,
        path: &str,
        session: Option<&str>,
        body: Option<serde_json::Value>,
    ) -> Reply {
        let mut req = json_request(method, path, session, body);
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(std::net::SocketAddr::new(
                from, 40_000,
            )));
        send(&self.router, req).await
    }

    pub async fn get(&self, path: &str, session: Option<&str>) -> Reply {
        self.request(Method::GET, path, session, None).await
    }

    /// Publish operator-key list v1 (one operator's key), signed by [`signing_key`], as an
    /// installation has one before any host is provisioned (host-provision refuses
    /// otherwise). Returns the published list's envelope.
    pub async fn publish_operator_keys(&self) -> String {
        use byo_core::keylist::check_key;
        use byo_core::keylist_testing as keys;
        use byo_db::operator_keys::{KeyChange, PublishedKey};
        let (sub, _) = self
            .user_with("keys-operator@example.com", &[Role::Operator])
            .await;
        let now = self.state.clock.now();
        let login = keys::login_key(&sub, "laptop");
        let list = keys::list(&self.state.config.environment, 1, vec![login.clone()], now);
        let body = list.to_canonical();
        let fingerprint = check_key(&login).unwrap().fingerprint;
        self.db
            .apply_key_change(
                KeyChange {
                    user_sub: &sub,
                    action: "add",
                    fingerprint: &fingerprint,
                    label: "laptop",
                },
                now,
                |_, _| Ok(body.clone()),
            )
            .await
            .unwrap();
        let envelope = String::from_utf8(keys::envelope(&list, &[signing_key()])).unwrap();
        let published = PublishedKey {
            user_sub: login.user_sub.clone(),
            label: login.label.clone(),
            public_key: login.public_key.clone(),
            fingerprint,
        };
        self.db
            .publish_key_list(1, &envelope, &[published], &sub, now)
            .await
            .unwrap();
        envelope
    }

    /// A user with `roles`, created directly in the store, and a session for them.
    pub async fn user_with(&self, email: &str, roles: &[Role]) -> (String, String) {
        let hash = self.state.passwords.hash(PASSWORD.into()).await.unwrap();
        let now = self.state.clock.now();
        let user = self
            .db
            .create_user(
                NewUser {
                    email,
                    display_name: "",
                    password_hash: &hash,
                },
                now,
            )
            .await
            .unwrap();
        for role in roles {
            self.db
                .grant_role(&user.sub, *role, None, now)
                .await
                .unwrap();
        }
        let session = self.session_for(&user.sub).await;
        (user.sub, session)
    }

    /// A user with `roles` whose requests carry their session (crates.io's `MockCookieUser`).
    /// The user sends through the router as it is now: make users after replacing it.
    pub async fn user(&self, email: &str, roles: &[Role]) -> User {
        let (sub, session) = self.user_with(email, roles).await;
        User {
            router: self.router.clone(),
            sub,
            email: email.to_owned(),
            session,
        }
    }

    /// A user with no role: a customer.
    pub async fn customer(&self, email: &str) -> User {
        self.user(email, &[]).await
    }

    pub async fn operator(&self, email: &str) -> User {
        self.user(email, &[Role::Operator]).await
    }

    pub async fn superadmin(&self, email: &str) -> User {
        self.user(email, &[Role::Superadmin]).await
    }

    pub async fn community_host(&self, email: &str) -> User {
        self.user(email, &[Role::CommunityHost]).await
    }

    pub async fn session_for(&self, sub: &str) -> String {
        let token = SecretToken::generate(TokenKind::Session);
        let now = self.state.clock.now();
        self.db
            .create_session(&token.hash(), sub, now, now + chrono::Duration::hours(1))
            .await
            .unwrap();
        token.expose().to_owned()
    }

    /// Give `sub` a host, making them an owner.
    pub async fn give_host(&self, sub: &str, slug: &str) {
        self.db
            .insert_host(
                NewHost {
                    slug,
                    owner_sub: sub,
                    profile_id: "gb10-spark-1",
                    gpu_type: "spark-1",
                },
                self.state.clock.now(),
            )
            .await
            .unwrap();
    }
}

/// A signed-in user: every request carries their session cookie. No Origin header is sent,
/// as from the CLI; the cross-site refusal passes such requests.
#[derive(Clone)]
pub struct User {
    router: Router,
    pub sub: String,
    pub email: String,
    /// The session token, for the few tests that hand it on (a browser, a raw request).
    pub session: String,
}

impl User {
    /// The same signed-in user, against another router (a state with its own clock).
    pub fn on(&self, router: Router) -> User {
        User {
            router,
            sub: self.sub.clone(),
            email: self.email.clone(),
            session: self.session.clone(),
        }
    }

    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Reply {
        let req = json_request(method, path, Some(&self.session), body);
        send(&self.router, req).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.request(Method::GET, path, None).await
    }

    /// A POST with a JSON body.
    pub async fn post(&self, path: &str, body: serde_json::Value) -> Reply {
        self.request(Method::POST, path, Some(body)).await
    }

    /// A POST with no body.
    pub async fn post_empty(&self, path: &str) -> Reply {
        self.request(Method::POST, path, None).await
    }

    pub async fn put(&self, path: &str, body: serde_json::Value) -> Reply {
        self.request(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.request(Method::DELETE, path, None).await
    }

    /// A form POST as a browser sends it.
    pub async fn post_form(&self, path: &str, pairs: &[(&str, &str)]) -> Reply {
        let req = Request::post(path)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(
                header::COOKIE,
                format!("__Host-byo_session={}", self.session),
            )
            .body(Body::from(form_encode(pairs)))
            .unwrap();
        send(&self.router, req).await
    }

    /// A page that must be there: its HTML.
    pub async fn page(&self, path: &str) -> String {
        let r = self.get(path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
        r.text()
    }
}

fn json_request(
    method: Method,
    path: &str,
    session: Option<&str>,
    body: Option<serde_json::Value>,
) -> Request<Body> {
    let mut req = Request::builder().method(method).uri(path);
    if let Some(s) = session {
        req = req.header(header::COOKIE, format!("__Host-byo_session={s}"));
    }
    match body {
        Some(b) => req
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(b.to_string())),
        None => req.body(Body::empty()),
    }
    .unwrap()
}

pub async fn send(router: &Router, req: Request<Body>) -> Reply {
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

/// A form as a browser sends it (`application/x-www-form-urlencoded`).
/// The design's example request at 126: a pair, node1 reported by node0.
pub fn pair_request() -> serde_json::Value {
    serde_json::json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": "3f2a", "hardware_id": "b41c", "node_index": 0,
        "rails": [
            { "device": "rocep1s0f0", "iface": "enp1s0f0np0", "mtu": 1500, "active_mtu": 1024, "neighbours_discovered": 1, "index": 0 },
            { "device": "roceP2p1s0f0", "iface": "enP2p1s0f0np0", "mtu": 1500, "active_mtu": 1024, "neighbours_discovered": 1, "index": 1 },
            { "device": "rocep1s0f1", "iface": "enp1s0f1np1", "mtu": 1500, "neighbours_discovered": 0 }
        ],
        "peers": [
            { "gpu_model": "GB10", "gpu_count": 1, "arch": "aarch64", "machine_id": "9c17", "hardware_id": "7e08", "os_id": "ubuntu", "node_index": 1,
              "rails": [ { "iface": "enp1s0f0np0", "index": 0, "neighbours_discovered": 1 }, { "iface": "enP2p1s0f1np1", "index": 1, "neighbours_discovered": 1 } ] }
        ]
    })
}

pub fn form_encode(pairs: &[(&str, &str)]) -> String {
    let encode = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b' ' => "+".to_owned(),
                other => format!("%{other:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}
