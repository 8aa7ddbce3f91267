//! Talking to hosts' agents. The agent's API is reached through the host's relay (Caddy
//! proxies :8080 to it) and authenticated by the host's agent token, which the backend
//! keeps sealed. Behind a trait so tests drive a fake agent built on the real agent code.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use byo_db::hosts::AgentTargetRow;
use byo_wire::vm::{
    AgentErrorCode, AgentRefusal, CreateVm, VmAction, VmCreated, VmStateChange, is_instance_name,
};
use futures::future::BoxFuture;

use crate::relay_ca::{RelayCaSource, relay_name};
use crate::seal::{SealedAt, Sealer};

/// How long the real client lets one VM call run. The callers (`crate::app::instances`) bound
/// their own wait, which may be shorter; these only keep a request from outliving it.
pub const CREATE_TIMEOUT: Duration = Duration::from_secs(120);
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(90);
pub const ACTION_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a delete waits for the host (G.4): well past the ~30 s a pair takes.
pub const DELETE_WAIT: Duration = Duration::from_secs(90);
/// How long a create waits for the host. The design names none; a zfs pool creates in
/// about a second and a pair in tens of seconds, so two minutes is "never answered".
pub const CREATE_WAIT: Duration = Duration::from_secs(120);

/// The waits, injectable so tests do not sit through 90 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AgentWaits {
    pub create: Duration,
    pub delete: Duration,
    /// How long a path walk keeps trying its first login (issue #38, 4).
    pub login: Duration,
}

/// How long a path walk keeps trying its first login: a fresh container's sshd is up within
/// seconds, the relay's mapping within a heartbeat.
pub const LOGIN_WAIT: Duration = Duration::from_secs(60);

impl Default for AgentWaits {
    fn default() -> Self {
        AgentWaits {
            create: CREATE_WAIT,
            delete: DELETE_WAIT,
            login: LOGIN_WAIT,
        }
    }
}

/// Why a VM call did not succeed. The two cases are handled differently: a host that
/// never answered may still be doing the work, one that refused said so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AgentError {
    /// No answer: no address or token, no connection, or no answer in time.
    Unreachable(String),
    /// The agent answered and refused: its status, its code when it sent its own refusal,
    /// and its reason — for operators (the log, the audit, /admin); a customer is told
    /// [`AgentError::in_our_words`].
    Refused {
        status: u16,
        code: Option<AgentErrorCode>,
        reason: String,
    },
    /// A create refused because the host already holds an instance (`host_occupied`): the
    /// agent's reason, which names that instance (for operators, not the customer).
    Occupied(String),
}

impl std::fmt::Display for AgentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AgentError::Unreachable(why) => write!(f, "the host did not answer: {why}"),
            AgentError::Refused { status, reason, .. } => {
                write!(f, "the host refused ({status}): {reason}")
            }
            AgentError::Occupied(reason) => {
                write!(f, "the host refused (host_occupied): {reason}")
            }
        }
    }
}

impl AgentError {
    /// What a customer is told (issue #36, 8): our words for what happened, never the
    /// agent's own text nor a connection error, which name the host's insides (addresses,
    /// another customer's instance, LXD's messages). Those stay with operators: the log,
    /// the audit and /admin keep [`Display`](std::fmt::Display)'s whole reason.
    pub fn in_our_words(&self) -> &'static str {
        match self {
            AgentError::Unreachable(_) => "the host did not answer",
            AgentError::Occupied(_) => "the host is busy with another instance",
            AgentError::Refused { code, .. } => match code {
                Some(AgentErrorCode::NotPrepared) => "the host is not serving yet",
                Some(AgentErrorCode::HostOccupied | AgentErrorCode::HostPreparing) => {
                    "the host is busy"
                }
                Some(AgentErrorCode::Conflict) => "the instance is not in a state that allows it",
                Some(AgentErrorCode::NotFound) => "the host does not hold this instance",
                Some(AgentErrorCode::Reverted | AgentErrorCode::Failed) => {
                    "the host could not carry it out and took back what it had done"
                }
                _ => "the host could not carry it out",
            },
        }
    }
}

/// How a delete was confirmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gone {
    /// The agent deleted the container.
    Deleted,
    /// The agent has no such container (404): the orphan case, which confirms (G.5).
    NotFound,
}

pub trait HostAgents: Send + Sync {
    /// Deliver a signed operator-key list, exactly as stored. `Err` carries the reason
    /// shown to operators.
    fn push_operator_keys<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        envelope: &'a [u8],
    ) -> BoxFuture<'a, Result<(), String>>;

    /// `POST /v1/vms`. `Ok(None)` is a success whose body could not be read: a 2xx means
    /// the container exists (E2: "accepted — including an answer that will not parse").
    fn create_vm<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        req: &'a CreateVm,
    ) -> BoxFuture<'a, Result<Option<VmCreated>, AgentError>>;

    /// `DELETE /v1/vms/{name}`. A 2xx, or the agent's own 404, confirms.
    fn delete_vm<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Gone, AgentError>>;

    /// `POST /v1/vms/{name}/state`.
    fn vm_action<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        name: &'a str,
        action: VmAction,
    ) -> BoxFuture<'a, Result<(), AgentError>>;

    /// `POST /v1/host/reboot` (L4): 202, each satellite told first, node0 going down shortly.
    fn reboot_host<'a>(
        &'a self,
        host: &'a AgentTargetRow,
    ) -> BoxFuture<'a, Result<byo_wire::vm::HostRebooting, AgentError>>;
}

/// The real client: HTTPS to the host's relay, which proxies only to the agent on the
/// tunnel. The relay is reached at its recorded address under its own name
/// (`<slug>.relay.<domain>`, never looked up in DNS), and its certificate must be that
/// name's, issued by this installation's relay CA: the agent token is sent to nothing else.
pub struct HttpAgents {
    sealer: Option<Sealer>,
    relay_ca: RelayCaSource,
    public_url: String,
    port: u16,
    /// Built on first use, trusting only the relay CA (made on first use too).
    client: tokio::sync::OnceCell<reqwest::Client>,
    /// Relay names to their addresses: the client's only resolver.
    names: RelayNames,
}

/// The resolver of the agent client: a relay's name resolves to the address recorded for
/// it, and nothing else resolves, so the client cannot be pointed anywhere else.
#[derive(Clone, Default)]
struct RelayNames(Arc<Mutex<HashMap<String, IpAddr>>>);

impl reqwest::dns::Resolve for RelayNames {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let found = self
            .0
            .lock()
            .expect("relay names lock")
            .get(name.as_str())
            .copied();
        Box::pin(async move {
            match found {
                Some(ip) => {
                    let addrs: reqwest::dns::Addrs =
                        Box::new(std::iter::once(std::net::SocketAddr::new(ip, 0)));
                    Ok(addrs)
                }
                None => Err(format!("{} is not a relay this server knows", name.as_str()).into()),
            }
        })
    }
}

impl HttpAgents {
    /// `public_url` names the installation's relays (`crate::relay_ca::relay_name`).
    pub fn new(sealer: Option<Sealer>, relay_ca: RelayCaSource, public_url: &str) -> Self {
        HttpAgents {
            sealer,
            relay_ca,
            public_url: public_url.to_owned(),
            port: 443,
            client: tokio::sync::OnceCell::new(),
            names: RelayNames::default(),
        }
    }

    /// Reach relays on another port (tests run the TLS front on an ephemeral one).
    pub fn with_port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    async fn client(&self) -> Result<&reqwest::Client, String> {
        self.client
            .get_or_try_init(|| async {
                let ca = self
                    .relay_ca
                    .get()
                    .await
                    .map_err(|e| format!("the relay CA is not available: {e}"))?;
                let root = reqwest::Certificate::from_pem(ca.cert_pem().as_bytes())
                    .map_err(|e| format!("the relay CA does not parse: {e}"))?;
                reqwest::Client::builder()
                    .use_rustls_tls()
                    .tls_built_in_root_certs(false)
                    .add_root_certificate(root)
                    .https_only(true)
                    .dns_resolver(Arc::new(self.names.clone()))
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(Duration::from_secs(20))
                    .build()
                    .map_err(|e| format!("building the agent client: {e}"))
            })
            .await
    }

    /// The client, the URL of `path` on the host's agent and the token to present.
    async fn endpoint(
        &self,
        host: &AgentTargetRow,
        path: &str,
    ) -> Result<(&reqwest::Client, String, String), String> {
        let relay: IpAddr = host
            .relay_ip
            .as_deref()
            .ok_or("the host has no relay address yet")?
            .parse()
            .map_err(|_| "the host's relay address is not an IP address")?;
        let sealed = host
            .agent_token
            .as_deref()
            .ok_or("the host has no agent token (not enrolled)")?;
        let sealer = self
            .sealer
            .as_ref()
            .ok_or("this server has no secret_key to open agent tokens")?;
        let token = sealer
            .open(&SealedAt::agent_token(&host.id), sealed)
            .map_err(|e| e.to_string())?;
        let client = self.client().await?;
        let name = relay_name(&host.slug, &self.public_url);
        self.names
            .0
            .lock()
            .expect("relay names lock")
            .insert(name.clone(), relay);
        Ok((client, format!("https://{name}:{}{path}", self.port), token))
    }
}

impl HostAgents for HttpAgents {
    fn push_operator_keys<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        envelope: &'a [u8],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let (client, url, token) = self.endpoint(host, "/v1/operator-keys").await?;
            let resp = client
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
            Err(push_refusal(status.as_u16(), &body))
        })
    }

    fn create_vm<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        req: &'a CreateVm,
    ) -> BoxFuture<'a, Result<Option<VmCreated>, AgentError>> {
        Box::pin(self.create(host, req))
    }

    fn delete_vm<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Gone, AgentError>> {
        Box::pin(self.delete(host, name))
    }

    fn vm_action<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        name: &'a str,
        action: VmAction,
    ) -> BoxFuture<'a, Result<(), AgentError>> {
        Box::pin(self.action(host, name, action))
    }

    fn reboot_host<'a>(
        &'a self,
        host: &'a AgentTargetRow,
    ) -> BoxFuture<'a, Result<byo_wire::vm::HostRebooting, AgentError>> {
        Box::pin(self.reboot(host))
    }
}

impl HttpAgents {
    /// Send one VM call; a transport failure or a timeout is [`AgentError::Unreachable`],
    /// any answer comes back as it is.
    async fn vm_call(
        &self,
        host: &AgentTargetRow,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<reqwest::Response, AgentError> {
        let (client, url, token) = self
            .endpoint(host, path)
            .await
            .map_err(AgentError::Unreachable)?;
        let mut req = client
            .request(method, url)
            .bearer_auth(token)
            .timeout(timeout);
        if let Some(body) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        req.send().await.map_err(|e| {
            AgentError::Unreachable(if e.is_timeout() {
                "no answer in time".to_owned()
            } else {
                format!("could not reach the agent: {}", without_url(&e))
            })
        })
    }
}

/// Who answered a call that did not succeed: the agent with its own refusal, the relay's
/// proxy with nothing behind it (502/503/504 without the agent's body: a host whose serving
/// unit is not running yet, or is down, or whose tunnel is down — nothing was done), or
/// something else whose body is all there is.
enum Answered {
    Agent(AgentRefusal),
    NothingBehindRelay,
    Other(String),
}

fn answered(status: u16, body: &str) -> Answered {
    match serde_json::from_str::<AgentRefusal>(body) {
        Ok(r) => Answered::Agent(r),
        Err(_) if matches!(status, 502..=504) => Answered::NothingBehindRelay,
        Err(_) => Answered::Other(body.to_owned()),
    }
}

/// Why a push did not land, as /admin shows it.
fn push_refusal(status: u16, body: &str) -> String {
    match answered(status, body) {
        Answered::Agent(r) => format!(
            "the agent refused the list ({status}): {}",
            printable(&r.message)
        ),
        Answered::NothingBehindRelay => {
            "not serving yet: the host's agent does not answer behind its relay (preparation \
             has not finished, or serving is down); send again once it reports in"
                .to_owned()
        }
        Answered::Other(body) => format!("the relay answered {status}: {}", printable(&body)),
    }
}

/// At most 300 characters, none of them control characters: what an operator is shown.
fn printable(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(300).collect()
}

/// The agent's refusal as the caller is shown it: its `message` when it sent its own
/// [`AgentRefusal`], else the first printable part of the body. `host_occupied` is told
/// apart: the backend answers it as no capacity, and so is `host_preparing` (an operator
/// is preparing the host again: it is busy, not broken, and must not be benched).
async fn refusal(resp: reqwest::Response) -> AgentError {
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap_or_default();
    let (code, reason) = match answered(status, &body) {
        Answered::Agent(r) => (Some(r.error), r.message),
        Answered::NothingBehindRelay => (
            None,
            format!(
                "the host's agent does not answer behind its relay (the relay answered {status}): \
                 the host is not serving, or its tunnel to the relay is down"
            ),
        ),
        Answered::Other(body) => (None, body),
    };
    if matches!(
        code,
        Some(AgentErrorCode::HostOccupied | AgentErrorCode::HostPreparing)
    ) {
        return AgentError::Occupied(printable(&reason));
    }
    AgentError::Refused {
        status,
        code,
        reason: printable(&reason),
    }
}

/// Whether a 404 is the agent's own "no such instance" (`not_found`) rather than a route or
/// a proxy that does not know the path, which must not close a row.
fn agents_own_not_found(body: &str) -> bool {
    serde_json::from_str::<AgentRefusal>(body).is_ok_and(|r| r.error == AgentErrorCode::NotFound)
}

/// A container name goes into a URL path: anything that is not an instance name is refused
/// here rather than escaped.
fn name_in_path(name: &str) -> Result<&str, AgentError> {
    if is_instance_name(name) {
        Ok(name)
    } else {
        Err(AgentError::Refused {
            status: 400,
            code: None,
            reason: format!("{name:?} is not an instance name"),
        })
    }
}

impl HttpAgents {
    async fn create(
        &self,
        host: &AgentTargetRow,
        req: &CreateVm,
    ) -> Result<Option<VmCreated>, AgentError> {
        let body = serde_json::to_vec(req).expect("CreateVm serialises");
        let resp = self
            .vm_call(
                host,
                reqwest::Method::POST,
                "/v1/vms",
                Some(body),
                CREATE_TIMEOUT,
            )
            .await?;
        if !resp.status().is_success() {
            return Err(refusal(resp).await);
        }
        Ok(resp.json::<VmCreated>().await.ok())
    }

    async fn delete(&self, host: &AgentTargetRow, name: &str) -> Result<Gone, AgentError> {
        let path = format!("/v1/vms/{}", name_in_path(name)?);
        let resp = self
            .vm_call(host, reqwest::Method::DELETE, &path, None, DELETE_TIMEOUT)
            .await?;
        let status = resp.status();
        if status.is_success() {
            return Ok(Gone::Deleted);
        }
        if status == reqwest::StatusCode::NOT_FOUND {
            let body = resp.text().await.unwrap_or_default();
            if agents_own_not_found(&body) {
                return Ok(Gone::NotFound);
            }
            return Err(AgentError::Refused {
                status: 404,
                code: None,
                reason: "a 404 that is not the agent's own answer; not taken as confirmation"
                    .to_owned(),
            });
        }
        Err(refusal(resp).await)
    }

    async fn action(
        &self,
        host: &AgentTargetRow,
        name: &str,
        action: VmAction,
    ) -> Result<(), AgentError> {
        let path = format!("/v1/vms/{}/state", name_in_path(name)?);
        let body = serde_json::to_vec(&VmStateChange { action }).expect("serialises");
        let resp = self
            .vm_call(
                host,
                reqwest::Method::POST,
                &path,
                Some(body),
                ACTION_TIMEOUT,
            )
            .await?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(refusal(resp).await)
        }
    }
}

impl HttpAgents {
    async fn reboot(
        &self,
        host: &AgentTargetRow,
    ) -> Result<byo_wire::vm::HostRebooting, AgentError> {
        let resp = self
            .vm_call(
                host,
                reqwest::Method::POST,
                "/v1/host/reboot",
                None,
                ACTION_TIMEOUT,
            )
            .await?;
        if resp.status() != reqwest::StatusCode::ACCEPTED {
            return Err(refusal(resp).await);
        }
        resp.json().await.map_err(|e| AgentError::Refused {
            status: 202,
            code: None,
            reason: format!("the reboot's answer does not parse: {}", without_url(&e)),
        })
    }
}

/// reqwest's errors name the URL; ours are shown to operators, who know which host.
/// The causes are kept ("invalid peer certificate: UnknownIssuer" is what says a relay is
/// not ours).
fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cause = c.source();
    }
    if let Some(url) = e.url() {
        s = s.replace(url.as_str(), "the agent");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A push to a host whose serving unit is not up reaches the relay's proxy and nothing
    /// behind it: /admin says "not serving yet", not a bare 502, and still tells the agent's
    /// own refusal apart.
    #[test]
    fn a_push_to_a_host_not_serving_yet_says_so() {
        for status in [502, 503, 504] {
            let why = push_refusal(status, "<html>Bad Gateway</html>");
            assert!(why.starts_with("not serving yet"), "{why}");
        }
        let refused = serde_json::to_string(&AgentRefusal {
            error: AgentErrorCode::Refused,
            message: "version 3 is older than the held version 4".into(),
        })
        .unwrap();
        assert_eq!(
            push_refusal(422, &refused),
            "the agent refused the list (422): version 3 is older than the held version 4"
        );
        // The agent's own 503 (it answers, but is not prepared) is its refusal, not silence.
        let not_prepared = serde_json::to_string(&AgentRefusal {
            error: AgentErrorCode::NotPrepared,
            message: "this host has not completed preparation".into(),
        })
        .unwrap();
        assert!(push_refusal(503, &not_prepared).starts_with("the agent refused"));
        assert_eq!(
            push_refusal(404, "no route\n"),
            "the relay answered 404: no route"
        );
    }
}
