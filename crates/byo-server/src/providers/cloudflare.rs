//! The `cloudflare` tunnel provider (place 6): the operator tunnel a host's cloudflared
//! connects with, its connector token, its ingress (SSH to the host), and the DNS record
//! that names it. Every call is idempotent: a tunnel is found by name before one is made,
//! and deleting what is gone succeeds.

use std::time::Duration;

use futures::future::BoxFuture;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ProviderError, TunnelInfo, TunnelProvider};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloudflareConfig {
    pub account_id: String,
    pub zone_id: String,
    /// Operator tunnels are named `<slug>.<tunnel_domain>`.
    pub tunnel_domain: String,
    /// An API token with Cloudflare Tunnel and DNS edit rights.
    pub api_token: SecretString,
    #[serde(default = "default_api_base")]
    pub api_base: String,
}

fn default_api_base() -> String {
    "https://api.cloudflare.com/client/v4".into()
}

pub struct CloudflareTunnels {
    config: CloudflareConfig,
    client: reqwest::Client,
}

fn err(what: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError(format!("cloudflare: {what}: {e}"))
}

impl CloudflareTunnels {
    pub fn new(config: CloudflareConfig) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client with timeouts builds");
        CloudflareTunnels { config, client }
    }

    fn hostname(&self, slug: &str) -> String {
        format!("{slug}.{}", self.config.tunnel_domain)
    }

    /// Call the API; Cloudflare wraps every answer in `{success, errors, result}`.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Option<Value>, ProviderError> {
        let url = format!("{}/{path}", self.config.api_base.trim_end_matches('/'));
        let mut req = self
            .client
            .request(method.clone(), url)
            .bearer_auth(self.config.api_token.expose_secret());
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| err(&format!("{method} {path}"), e.without_url()))?;
        if resp.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let status = resp.status();
        let value: Value = resp.json().await.unwrap_or(Value::Null);
        if !status.is_success() || value["success"] != true {
            let message = value["errors"]
                .as_array()
                .and_then(|e| e.first())
                .and_then(|e| e["message"].as_str())
                .map_or_else(|| value.to_string(), str::to_owned);
            return Err(ProviderError(format!(
                "cloudflare: {method} {path}: {status}: {message}"
            )));
        }
        Ok(Some(value["result"].clone()))
    }

    async fn find_tunnel(&self, name: &str) -> Result<Option<String>, ProviderError> {
        let path = format!(
            "accounts/{}/cfd_tunnel?name={name}&is_deleted=false",
            self.config.account_id
        );
        let found = self
            .call(reqwest::Method::GET, &path, None)
            .await?
            .unwrap_or(Value::Null);
        Ok(found
            .as_array()
            .and_then(|a| a.first())
            .and_then(|t| t["id"].as_str())
            .map(str::to_owned))
    }

    async fn dns_records(&self, name: &str) -> Result<Vec<String>, ProviderError> {
        Ok(self
            .dns_record_values(name)
            .await?
            .iter()
            .filter_map(|r| r["id"].as_str().map(str::to_owned))
            .collect())
    }

    /// The records named `name`, whole.
    async fn dns_record_values(&self, name: &str) -> Result<Vec<Value>, ProviderError> {
        let path = format!("zones/{}/dns_records?name={name}", self.config.zone_id);
        let found = self
            .call(reqwest::Method::GET, &path, None)
            .await?
            .unwrap_or(Value::Null);
        Ok(found.as_array().cloned().unwrap_or_default())
    }
}

impl TunnelProvider for CloudflareTunnels {
    fn publishes_dns(&self) -> bool {
        true
    }

    fn create<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<TunnelInfo, ProviderError>> {
        Box::pin(async move {
            let acct = &self.config.account_id;
            let hostname = self.hostname(slug);
            let id = match self.find_tunnel(&hostname).await? {
                Some(id) => id,
                None => {
                    let made = self
                        .call(
                            reqwest::Method::POST,
                            &format!("accounts/{acct}/cfd_tunnel"),
                            Some(json!({"name": hostname, "config_src": "cloudflare"})),
                        )
                        .await?
                        .ok_or_else(|| err("creating the tunnel", "404"))?;
                    made["id"]
                        .as_str()
                        .ok_or_else(|| err("creating the tunnel", "no id"))?
                        .to_owned()
                }
            };
            // The tunnel carries operators' SSH to the host (I); nothing else.
            self.call(
                reqwest::Method::PUT,
                &format!("accounts/{acct}/cfd_tunnel/{id}/configurations"),
                Some(json!({"config": {"ingress": [
                    {"hostname": hostname, "service": "ssh://localhost:22"},
                    {"service": "http_status:404"}
                ]}})),
            )
            .await?;
            if self.dns_records(&hostname).await?.is_empty() {
                self.call(
                    reqwest::Method::POST,
                    &format!("zones/{}/dns_records", self.config.zone_id),
                    Some(json!({"type": "CNAME", "name": hostname, "content": format!("{id}.cfargotunnel.com"), "proxied": true})),
                )
                .await?;
            }
            let token = self
                .call(
                    reqwest::Method::GET,
                    &format!("accounts/{acct}/cfd_tunnel/{id}/token"),
                    None,
                )
                .await?
                .and_then(|t| t.as_str().map(str::to_owned))
                .ok_or_else(|| err("the connector token", "missing"))?;
            Ok(TunnelInfo {
                id,
                hostname,
                connector_token: token,
            })
        })
    }

    fn delete<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let hostname = self.hostname(slug);
            for record in self.dns_records(&hostname).await? {
                self.call(
                    reqwest::Method::DELETE,
                    &format!("zones/{}/dns_records/{record}", self.config.zone_id),
                    None,
                )
                .await?;
            }
            if let Some(id) = self.find_tunnel(&hostname).await? {
                self.call(
                    reqwest::Method::DELETE,
                    &format!("accounts/{}/cfd_tunnel/{id}", self.config.account_id),
                    None,
                )
                .await?;
            }
            Ok(())
        })
    }

    fn point_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
        address: &'a str,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            let zone = &self.config.zone_id;
            // DNS only: Cloudflare's proxy carries HTTP, never a customer's ssh.
            let record =
                json!({"type": "A", "name": name, "content": address, "ttl": 60, "proxied": false});
            match self.dns_record_values(name).await?.first() {
                Some(r) if r["content"] == address && r["proxied"] == false => Ok(()),
                Some(r) => {
                    let id = r["id"]
                        .as_str()
                        .ok_or_else(|| err("the wildcard record", "no id"))?;
                    self.call(
                        reqwest::Method::PUT,
                        &format!("zones/{zone}/dns_records/{id}"),
                        Some(record),
                    )
                    .await
                    .map(drop)
                }
                None => self
                    .call(
                        reqwest::Method::POST,
                        &format!("zones/{zone}/dns_records"),
                        Some(record),
                    )
                    .await
                    .map(drop),
            }
        })
    }

    fn remove_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            for record in self.dns_records(name).await? {
                self.call(
                    reqwest::Method::DELETE,
                    &format!("zones/{}/dns_records/{record}", self.config.zone_id),
                    None,
                )
                .await?;
            }
            Ok(())
        })
    }
}
