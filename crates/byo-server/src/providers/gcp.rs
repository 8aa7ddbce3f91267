//! The `gcp` relay provider: Compute Engine's REST API. relay-provision reserves
//! `<slug>-relay-ip`, reads the address back, and creates `<slug>-relay` with that address
//! and its bootstrap as the startup script, polling each operation to the end. Release
//! deletes both; a 404 means it is already gone.
//!
//! What was learnt against real GCP (provisioning note 5): `accessConfigs[].natIP` takes
//! the address *literal*, not the address resource's self-link — a self-link fails every
//! create with 400. The test fake answers exactly that way.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{ProviderError, RelayInfo, RelayProvider};

/// Where and how relays are built.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct GcpConfig {
    pub project: String,
    pub region: String,
    pub zone: String,
    /// A service account's JSON key file, with the Compute Instance Admin role.
    pub service_account_key_file: std::path::PathBuf,
    #[serde(default = "defaults::machine_type")]
    pub machine_type: String,
    #[serde(default = "defaults::image")]
    pub image: String,
    #[serde(default = "defaults::network")]
    pub network: String,
    #[serde(default = "defaults::api_base")]
    pub api_base: String,
}

mod defaults {
    pub fn machine_type() -> String {
        "e2-micro".into()
    }
    pub fn image() -> String {
        "projects/debian-cloud/global/images/family/debian-12".into()
    }
    pub fn network() -> String {
        "global/networks/default".into()
    }
    pub fn api_base() -> String {
        "https://compute.googleapis.com/compute/v1".into()
    }
}

/// The fields of a service-account key file we use.
#[derive(Clone, Deserialize)]
pub struct ServiceAccountKey {
    pub client_email: String,
    pub private_key: String,
    pub token_uri: String,
}

impl std::fmt::Debug for ServiceAccountKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccountKey")
            .field("client_email", &self.client_email)
            .finish_non_exhaustive()
    }
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: i64,
    exp: i64,
}

struct CachedToken {
    token: String,
    until: Instant,
}

pub struct GcpRelays {
    config: GcpConfig,
    key: ServiceAccountKey,
    client: reqwest::Client,
    token: Mutex<Option<CachedToken>>,
    /// How long to wait between operation polls.
    poll_every: Duration,
}

const SCOPE: &str = "https://www.googleapis.com/auth/compute";

fn err(what: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError(format!("gcp: {what}: {e}"))
}

impl GcpRelays {
    pub fn new(config: GcpConfig) -> Result<GcpRelays, ProviderError> {
        let text = std::fs::read_to_string(&config.service_account_key_file).map_err(|e| {
            err(
                &format!("reading {}", config.service_account_key_file.display()),
                e,
            )
        })?;
        let key: ServiceAccountKey =
            serde_json::from_str(&text).map_err(|e| err("the service-account key", e))?;
        Ok(Self::with_key(config, key))
    }

    pub fn with_key(config: GcpConfig, key: ServiceAccountKey) -> GcpRelays {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .expect("an HTTP client with timeouts builds");
        GcpRelays {
            config,
            key,
            client,
            token: Mutex::new(None),
            poll_every: Duration::from_secs(2),
        }
    }

    pub fn with_poll_interval(mut self, every: Duration) -> Self {
        self.poll_every = every;
        self
    }

    /// An OAuth access token for the service account (JWT bearer grant), cached until a
    /// minute before it expires.
    async fn access_token(&self) -> Result<String, ProviderError> {
        if let Some(t) = self.token.lock().expect("token lock").as_ref()
            && t.until > Instant::now()
        {
            return Ok(t.token.clone());
        }
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            iss: &self.key.client_email,
            scope: SCOPE,
            aud: &self.key.token_uri,
            iat: now,
            exp: now + 3600,
        };
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(self.key.private_key.as_bytes())
            .map_err(|e| err("the service-account private key", e))?;
        let assertion = jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &claims,
            &key,
        )
        .map_err(|e| err("signing the token request", e))?;
        let resp = self
            .client
            .post(&self.key.token_uri)
            .form(&[
                ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer"),
                ("assertion", assertion.as_str()),
            ])
            .send()
            .await
            .map_err(|e| err("reaching the token endpoint", e))?;
        let status = resp.status();
        let body: Value = resp.json().await.map_err(|e| err("the token answer", e))?;
        if !status.is_success() {
            return Err(err("the token endpoint refused", body));
        }
        let token = body["access_token"]
            .as_str()
            .ok_or_else(|| err("the token answer", "no access_token"))?
            .to_owned();
        let lifetime = body["expires_in"]
            .as_u64()
            .unwrap_or(3600)
            .saturating_sub(60);
        *self.token.lock().expect("token lock") = Some(CachedToken {
            token: token.clone(),
            until: Instant::now() + Duration::from_secs(lifetime),
        });
        Ok(token)
    }

    fn url(&self, path: &str) -> String {
        format!(
            "{}/projects/{}/{path}",
            self.config.api_base.trim_end_matches('/'),
            self.config.project
        )
    }

    /// Call the API; `Ok(None)` for a 404, so deletes and gets of what is gone are calm.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Option<Value>, ProviderError> {
        let token = self.access_token().await?;
        let mut req = self
            .client
            .request(method.clone(), self.url(path))
            .bearer_auth(token);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| err(&format!("{method} {path}"), e))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let value: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let message = value["error"]["message"]
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            return Err(ProviderError(format!(
                "gcp: {method} {path}: {status}: {message}"
            )));
        }
        Ok(Some(value))
    }

    /// Follow a long-running operation to DONE; its error, if any, is the call's error.
    async fn wait(&self, op: Value, scope: &str) -> Result<(), ProviderError> {
        let name = op["name"]
            .as_str()
            .ok_or_else(|| err("an operation", "it has no name"))?
            .to_owned();
        let mut op = op;
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            if op["status"] == "DONE" {
                if let Some(e) = op.get("error") {
                    return Err(err(&format!("operation {name}"), e));
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(err(
                    &format!("operation {name}"),
                    "still running after 5 minutes",
                ));
            }
            tokio::time::sleep(self.poll_every).await;
            op = self
                .call(
                    reqwest::Method::GET,
                    &format!("{scope}/operations/{name}"),
                    None,
                )
                .await?
                .ok_or_else(|| err(&format!("operation {name}"), "vanished"))?;
        }
    }

    fn region(&self) -> String {
        format!("regions/{}", self.config.region)
    }

    fn zone(&self) -> String {
        format!("zones/{}", self.config.zone)
    }

    async fn reserve_address(&self, name: &str) -> Result<String, ProviderError> {
        let region = self.region();
        let path = format!("{region}/addresses/{name}");
        if self
            .call(reqwest::Method::GET, &path, None)
            .await?
            .is_none()
        {
            let op = self
                .call(
                    reqwest::Method::POST,
                    &format!("{region}/addresses"),
                    Some(json!({"name": name})),
                )
                .await?
                .ok_or_else(|| err("addresses.insert", "404"))?;
            self.wait(op, &region).await?;
        }
        let address = self
            .call(reqwest::Method::GET, &path, None)
            .await?
            .ok_or_else(|| err("addresses.get", "not found after insert"))?;
        address["address"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| err("addresses.get", "no address literal"))
    }

    fn instance_body(&self, name: &str, address: &str, bootstrap: &str) -> Value {
        json!({
            "name": name,
            "machineType": format!("zones/{}/machineTypes/{}", self.config.zone, self.config.machine_type),
            // The relay forwards DNATed packets into the tunnel.
            "canIpForward": true,
            "disks": [{"boot": true, "autoDelete": true, "initializeParams": {"sourceImage": self.config.image}}],
            "networkInterfaces": [{
                "network": self.config.network,
                // The literal, not the address's self-link (provisioning note 5).
                "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT", "natIP": address}]
            }],
            "metadata": {"items": [{"key": "startup-script", "value": bootstrap}]},
            "tags": {"items": ["byo-relay"]},
            "labels": {"byo": "relay"}
        })
    }
}

impl RelayProvider for GcpRelays {
    fn provision<'a>(
        &'a self,
        slug: &'a str,
        bootstrap: Option<&'a str>,
    ) -> BoxFuture<'a, Result<RelayInfo, ProviderError>> {
        Box::pin(async move {
            let bootstrap = bootstrap.ok_or_else(|| {
                ProviderError("gcp: no relay bootstrap; configure relay_release (the daemon's URL and sha256)".into())
            })?;
            let address = self.reserve_address(&format!("{slug}-relay-ip")).await?;
            let name = format!("{slug}-relay");
            let zone = self.zone();
            if self
                .call(
                    reqwest::Method::GET,
                    &format!("{zone}/instances/{name}"),
                    None,
                )
                .await?
                .is_none()
            {
                let op = self
                    .call(
                        reqwest::Method::POST,
                        &format!("{zone}/instances"),
                        Some(self.instance_body(&name, &address, bootstrap)),
                    )
                    .await?
                    .ok_or_else(|| err("instances.insert", "404"))?;
                self.wait(op, &zone).await?;
            }
            Ok(RelayInfo { name, address })
        })
    }

    fn release_instance<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let zone = self.zone();
            if let Some(op) = self
                .call(
                    reqwest::Method::DELETE,
                    &format!("{zone}/instances/{slug}-relay"),
                    None,
                )
                .await?
            {
                self.wait(op, &zone).await?;
            }
            Ok(())
        })
    }

    fn release<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.release_instance(slug).await?;
            let region = self.region();
            if let Some(op) = self
                .call(
                    reqwest::Method::DELETE,
                    &format!("{region}/addresses/{slug}-relay-ip"),
                    None,
                )
                .await?
            {
                self.wait(op, &region).await?;
            }
            Ok(())
        })
    }
}
