//! What the platform scenarios share (`golden_path.rs`, `pair_golden_path.rs`): the server's
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
