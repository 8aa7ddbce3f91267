//! host-report from the agent's side: progress after every prepare step, presented with
//! the host token. A report that does not land is logged and preparation goes on — the
//! host's state is the truth, the report is a view of it. With the same token, preparation
//! asks for the published operator-key list ([`Reporter::published_operator_keys`]).

use std::time::Duration;

use byo_wire::prepare::HostReport;

pub struct Reporter {
    url: String,
    heartbeat_url: String,
    operator_keys_url: String,
    host_token: String,
    client: reqwest::blocking::Client,
    failed: bool,
}

impl std::fmt::Debug for Reporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reporter")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl Reporter {
    pub fn new(server: &str, host_token: &str) -> Result<Self, String> {
        let client = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(15))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Reporter {
            url: format!("{}/api/host/report", server.trim_end_matches('/')),
            heartbeat_url: format!("{}/api/host/heartbeat", server.trim_end_matches('/')),
            operator_keys_url: format!("{}/api/host/operator-keys", server.trim_end_matches('/')),
            host_token: host_token.to_owned(),
            client,
            failed: false,
        })
    }

    /// POST `body` with the host token; `Err` says why it did not land.
    fn post(
        &self,
        url: &str,
        body: &impl serde::Serialize,
    ) -> Result<reqwest::header::HeaderMap, String> {
        let resp = self
            .client
            .post(url)
            .bearer_auth(&self.host_token)
            .json(body)
            .send()
            .map_err(|e| format!("could not reach the backend: {}", e.without_url()))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp.headers().clone());
        }
        let body = resp.text().unwrap_or_default();
        Err(format!(
            "the backend answered {status}: {}",
            body.chars().take(200).collect::<String>()
        ))
    }

    /// Where the host's relay is now (`GET /api/host/relay`): its endpoint once it has an
    /// address. `Err` says why there is no answer.
    pub fn relay(&self) -> Result<byo_wire::enroll::HostRelay, String> {
        let url = self.url.replace("/api/host/report", "/api/host/relay");
        let resp = self
            .client
            .get(&url)
            .bearer_auth(&self.host_token)
            .send()
            .map_err(|e| format!("could not reach the backend: {}", e.without_url()))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().unwrap_or_default();
            return Err(format!(
                "the backend answered {status}: {}",
                body.chars().take(200).collect::<String>()
            ));
        }
        resp.json()
            .map_err(|e| format!("the backend's answer does not parse: {e}"))
    }

    /// Tell the backend this host was uninstalled (`POST /api/host/uninstalled`, issue #39,
    /// 3): the last thing `byo-agent uninstall` does, with the token it read before the
    /// uninstall removed it. `Err` says why it did not land.
    pub fn uninstalled(&self) -> Result<(), String> {
        let url = self
            .url
            .replace("/api/host/report", "/api/host/uninstalled");
        self.post(&url, &serde_json::json!({})).map(|_| ())
    }

    /// Send one report; `Err` says why it did not land.
    pub fn send(&mut self, report: &HostReport) -> Result<(), String> {
        self.post(&self.url, report)?;
        self.failed = false;
        Ok(())
    }

    /// One heartbeat (host_status).
    /// `Ok` carries the address the backend saw the beat come from, when it said one.
    pub fn heartbeat(
        &mut self,
        beat: &byo_wire::vm::Heartbeat,
    ) -> Result<Option<std::net::IpAddr>, String> {
        let headers = self.post(&self.heartbeat_url, beat)?;
        Ok(headers
            .get(byo_wire::vm::SEEN_FROM_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok()))
    }

    /// The operator-key list the backend publishes now, as signed bytes, unverified (the
    /// caller verifies it as a push); `None` while none is published. `Err` says why it
    /// could not be had.
    pub fn published_operator_keys(&self) -> Result<Option<Vec<u8>>, String> {
        let resp = self
            .client
            .get(&self.operator_keys_url)
            .bearer_auth(&self.host_token)
            .send()
            .map_err(|e| format!("could not reach the backend: {}", e.without_url()))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .map_err(|e| format!("reading the list: {}", e.without_url()))?;
        match status.as_u16() {
            200 => Ok(Some(body.to_vec())),
            409 => Ok(None),
            _ => Err(format!(
                "the backend answered {status}: {}",
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            )),
        }
    }

    /// One machine's rails as a rail step left them (130–132), logged when it does not
    /// land: like progress, a view of the host's state, not a condition of preparing it.
    pub fn send_rails_or_log(&mut self, rails: &byo_wire::prepare::NodeRails) {
        let url = self.url.replace("/api/host/report", "/api/host/rails");
        if let Err(e) = self.post(&url, rails) {
            eprintln!(
                "byo-agent: node{}'s rails not reported ({e}); preparation goes on",
                rails.node
            );
        }
    }

    /// Send, and log (once per outage) when it does not land.
    pub fn send_or_log(&mut self, report: &HostReport) {
        if let Err(e) = self.send(report) {
            if !self.failed {
                eprintln!("byo-agent: progress not reported ({e}); preparation goes on");
            }
            self.failed = true;
        }
    }
}

/// This build as the heartbeat reports it (`agent_version`): the version and the first 12
/// hex digits of the running binary's SHA-256, so two builds of one version tell apart (an
/// upgrade shows on the host's row). Read once: after an upgrade replaced the file, the
/// running process still is the build it started as.
pub fn build_version() -> &'static str {
    static BUILD: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BUILD.get_or_init(|| {
        use sha2::{Digest, Sha256};
        let digest = std::fs::read("/proc/self/exe")
            .map(|b| hex::encode(&Sha256::digest(&b)[..6]))
            .unwrap_or_else(|_| "unknown".into());
        format!("{} ({digest})", env!("CARGO_PKG_VERSION"))
    })
}

/// An error and its causes, one line: reqwest hides "connection refused" in its sources.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}
