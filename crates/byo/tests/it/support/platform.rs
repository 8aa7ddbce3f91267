//! What the platform scenarios share (`golden_path.rs` and the cabled ones): the server's
//! API as a signed-in person calls it, people with sessions, waiting on a condition, the
//! customer's plain `ssh` to a relay, and the relays removed however a test ends.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use byo::local_relay::LxdRelays;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::users::NewUser;
use byo_wire::Role;
use serde_json::Value;

pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
}

impl Api {
    /// The API at `base`, each call bounded at 150 s.
    pub fn new(base: &str) -> Api {
        Api {
            base: base.to_owned(),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(150))
                .build()
                .unwrap(),
        }
    }

    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        session: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("cookie", format!("byo_session={session}"));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

/// A person with `roles` and a session: the session token, as the cookie carries it.
pub async fn user(store: &byo_db::Store, email: &str, roles: &[Role]) -> String {
    let now = chrono::Utc::now();
    let user = store
        .create_user(
            NewUser {
                email,
                display_name: "",
                password_hash: "$argon2id$unused",
            },
            now,
        )
        .await
        .unwrap();
    for role in roles {
        store.grant_role(&user.sub, *role, None, now).await.unwrap();
    }
    let token = SecretToken::generate(TokenKind::Session);
    store
        .create_session(
            &token.hash(),
            &user.sub,
            now,
            now + chrono::Duration::hours(2),
        )
        .await
        .unwrap();
    token.expose().to_owned()
}

/// Where the customer's plain `ssh root@<relay>` lands: the machine's hostname.
pub fn customer_ssh(relay: &str, key: &Path) -> Option<String> {
    super::ssh(key, &[&format!("root@{relay}"), "hostname"]).ok()
}

/// Deletes the test's relay containers however the test ends.
pub struct RemoveRelays(pub Arc<LxdRelays>);

impl Drop for RemoveRelays {
    fn drop(&mut self) {
        self.0.remove_all();
    }
}

/// `probe`'s first answer, every half second, failing the test after `within`.
pub async fn until<T>(
    what: &str,
    within: Duration,
    mut probe: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            started.elapsed() < within,
            "{what} did not happen within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The server's configuration in a platform scenario: reached at `base` (the test bridge's
/// gateway), the agent releases in `releases`, the relay daemon it serves its relays, and
/// `signing` as the operator-key lists' signing key.
pub fn config(
    base: &str,
    releases: std::path::PathBuf,
    signing: &ssh_key::PrivateKey,
) -> byo_server::config::Config {
    let mut signing_public = signing.public_key().clone();
    signing_public.set_comment("");
    byo_server::config::Config {
        metrics_listen: None,
        public_url: base.to_owned(),
        cookie_secure: false,
        password_hashing: byo_server::config::PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        secret_key: Some(byo_server::seal::Sealer::generate_hex().into()),
        release_dir: Some(releases),
        release_key: Some(super::release_public()),
        operator_keys: byo_server::config::OperatorKeysConfig {
            signing_keys: vec![signing_public.to_openssh().unwrap()],
            ..Default::default()
        },
        relay_release: Some(byo_server::config::RelayRelease {
            url: format!("{base}/relay/byo-relay-{}", std::env::consts::ARCH),
            sha256: super::relay_sha256(),
        }),
        ..byo_server::config::Config::default()
    }
}

/// `key`'s private half at `path`, 0600, as ssh wants it.
pub fn key_file(path: &Path, key: &ssh_key::PrivateKey) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(
        path,
        key.to_openssh(ssh_key::LineEnding::LF).unwrap().as_bytes(),
    )
    .unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path.to_owned()
}

/// M: `op_key` added by the operator and the list signed and published by staff, through
/// the API: every enrolled host receives the push, and a host that enrols later receives the
/// list at enrolment. The push's outcome (`version`, `delivered`, `failed`).
pub async fn publish_operator_key(
    api: &Api,
    operator: &str,
    staff: &str,
    signing: &ssh_key::PrivateKey,
    op_key: &ssh_key::PrivateKey,
) -> Value {
    let (status, draft) = api
        .call(
            reqwest::Method::POST,
            "/api/admin/operator-keys/changes",
            operator,
            Some(serde_json::json!({"action": "add",
                "public_key": op_key.public_key().to_openssh().unwrap(), "label": "laptop"})),
        )
        .await;
    assert_eq!(status, 200, "{draft}");
    let signature = byo_core::keylist_testing::sign(draft["body"].as_str().unwrap(), signing);
    let (status, published) = api
        .call(
            reqwest::Method::POST,
            &format!("/api/admin/operator-keys/{}/signatures", draft["version"]),
            staff,
            Some(serde_json::json!({"signature": signature})),
        )
        .await;
    assert!(status < 300, "{status} {published}");
    published
}

/// D: the operator approves the host — once its agent has beaten with nothing wrong, which
/// serving does as it starts: until then activation is refused (`not_healthy`) and the
/// operator tries again, as they would. Activation walks the host's customer path first
/// (issue #38, 4), which must pass.
pub async fn activate(api: &Api, operator: &str, host_id: &str) {
    let (status, body) = activation(api, operator, host_id).await;
    assert!(status == 204 || status == 200, "{status} {body}");
}

/// The activation's first answer that is not `not_healthy` (retried for 90 s, as
/// [`activate`]).
pub async fn activation(api: &Api, operator: &str, host_id: &str) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (status, body) = api
            .call(
                reqwest::Method::POST,
                &format!("/api/admin/hosts/{host_id}/activate"),
                operator,
                Some(serde_json::json!({"placement": "shared"})),
            )
            .await;
        if !(status == 409 && body["error"] == "not_healthy") {
            return (status, body);
        }
        assert!(Instant::now() < deadline, "{status} {body}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The customer's key, on disk at `path` for their ssh and registered with the API: the
/// file and the key's row.
pub async fn customer_key(api: &Api, customer: &str, path: &Path) -> (std::path::PathBuf, Value) {
    let key = byo_core::keylist_testing::private_key();
    let file = key_file(path, &key);
    let (status, row) = api
        .call(
            reqwest::Method::POST,
            "/api/ssh-keys",
            customer,
            Some(serde_json::json!({"name": "laptop",
                "public_key": key.public_key().to_openssh().unwrap()})),
        )
        .await;
    assert_eq!(status, 201, "{row}");
    (file, row)
}

/// Until serving answers through the relay's tunnel (its 401 to no token): only once the host
/// has dialled the relay, which its beats do. Each try is bounded, or one SYN into a tunnel
/// with no peer endpoint would wait minutes.
pub async fn serving_answers_through(relay: &byo::local_relay::LxdRelay) {
    until(
        "serving to answer through the relay",
        Duration::from_secs(120),
        async || {
            let out = relay
                .exec(&[
                    "curl",
                    "-s",
                    "-m",
                    "3",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_code}",
                ])
                .arg("http://10.8.0.2:8080/v1/vms")
                .output()
                .unwrap();
            (String::from_utf8_lossy(&out.stdout) == "401").then_some(())
        },
    )
    .await;
}

/// E1: the customer creates an instance of `gpu_type` with their key `key_id`, and their
/// plain ssh to the relay lands somewhere: the instance's id and name, where ssh landed,
/// and the seconds from the create to that.
pub async fn rent(
    api: &Api,
    customer: &str,
    gpu_type: &str,
    key_id: &Value,
    relay: &str,
    key_file: &Path,
) -> (String, String, String, f64) {
    let asked = Instant::now();
    let (status, created) = api
        .call(
            reqwest::Method::POST,
            "/api/vms",
            customer,
            Some(serde_json::json!({"gpu_type": gpu_type, "ssh_key_id": key_id})),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let vm_id = created["instance"]["id"].as_str().unwrap().to_owned();
    let name = created["instance"]["name"].as_str().unwrap().to_owned();
    let landed = until("the customer's ssh", Duration::from_secs(30), async || {
        customer_ssh(relay, key_file)
    })
    .await;
    (vm_id, name, landed, asked.elapsed().as_secs_f64())
}

/// The server's listener where a host container reaches it (the test bridge's gateway) and
/// its base URL.
pub async fn listen(gateway: String) -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let base = format!("http://{gateway}:{}", listener.local_addr().unwrap().port());
    (listener, base)
}

/// A platform scenario's three people, by their session tokens.
pub struct People {
    pub staff: String,
    pub operator: String,
    pub customer: String,
}

/// A superadmin, an operator and a customer, each signed in.
pub async fn people(store: &byo_db::Store) -> People {
    People {
        staff: user(store, "staff@example.com", &[Role::Superadmin]).await,
        operator: user(store, "op@example.com", &[Role::Operator]).await,
        customer: user(store, "customer@example.com", &[]).await,
    }
}
