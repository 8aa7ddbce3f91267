//! Talking to hosts' agents. The agent's API is reached through the host's relay (Caddy
//! proxies :8080 to it) and authenticated by the host's agent token, which the backend
//! keeps sealed. Behind a trait so tests drive a fake agent built on the real agent code.

use std::time::Duration;

use byo_db::hosts::AgentTargetRow;
use futures::future::BoxFuture;

use crate::seal::Sealer;

pub trait HostAgents: Send + Sync {
    /// Deliver a signed operator-key list, exactly as stored. `Err` carries the reason
    /// shown to operators.
    fn push_operator_keys<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        envelope: &'a [u8],
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// The real client: HTTP through the relay.
pub struct HttpAgents {
    client: reqwest::Client,
    sealer: Option<Sealer>,
    port: u16,
}

impl HttpAgents {
    pub fn new(sealer: Option<Sealer>) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(20))
            .build()
            .expect("an HTTP client with timeouts builds");
        HttpAgents {
            client,
            sealer,
            port: 8080,
        }
    }

    /// Reach agents on another port (tests run the agent side on an ephemeral one).
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    fn endpoint(&self, host: &AgentTargetRow, path: &str) -> Result<(String, String), String> {
        let relay = host
            .relay_ip
            .as_deref()
            .ok_or("the host has no relay address yet")?;
        let sealed = host
            .agent_token
            .as_deref()
            .ok_or("the host has no agent token (not enrolled)")?;
        let sealer = self
            .sealer
            .as_ref()
            .ok_or("this server has no secret_key to open agent tokens")?;
        let token = sealer.open(sealed).map_err(|e| e.to_string())?;
        Ok((format!("http://{relay}:{}{path}", self.port), token))
    }
}

impl HostAgents for HttpAgents {
    fn push_operator_keys<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        envelope: &'a [u8],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let (url, token) = self.endpoint(host, "/v1/operator-keys")?;
            let resp = self
                .client
                .put(url)
                .bearer_auth(token)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(envelope.to_vec())
                .send()
                .await
                .map_err(|e| format!("could not reach the agent: {}", without_url(&e)))?;
            if resp.status().is_success() {
                return Ok(());
            }
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            let body: String = body.chars().filter(|c| !c.is_control()).take(300).collect();
            Err(format!("the agent answered {status}: {body}"))
        })
    }
}

/// reqwest's errors name the URL; ours are shown to operators, who know which host.
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "the agent");
    }
    s
}
