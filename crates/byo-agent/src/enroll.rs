//! The agent's side of enrolment (B): one call, and the agent has everything. Credentials
//! are kept root-only under /etc/enverge; a machine that already enrolled and runs the
//! one-liner again reuses them and calls nothing (scenario 5). While the backend cannot be
//! reached, the agent retries in-process for as long as the token can live.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use byo_core::tokens::{SecretToken, TokenKind};
use byo_wire::enroll::{EnrollRequest, EnrollResponse};

use crate::operator_keys::{OperatorKeys, Paths, write_atomic};
use crate::report::chain;

/// Where enrolment keeps the environment the host enrolled into (on a host).
pub const ENVIRONMENT_FILE: &str = "/etc/enverge/environment";

/// Where enrolment keeps what it was given, under `root` (`/` on a host; a temporary
/// directory in tests).
#[derive(Clone, Debug)]
pub struct EnrollPaths {
    pub root: PathBuf,
}

impl EnrollPaths {
    pub fn system() -> Self {
        EnrollPaths {
            root: PathBuf::from("/"),
        }
    }
    fn at(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
    /// Everything redeem returned, root-only (0600).
    pub fn credentials(&self) -> PathBuf {
        self.at("etc/enverge/credentials.json")
    }
    /// The SHA-256 of the agent token, which serving checks the backend's calls against.
    pub fn agent_token_hash(&self) -> PathBuf {
        self.at("etc/enverge/agent-token.sha256")
    }
    /// The environment this host enrolled into: every operator-key list must name it.
    /// World-readable, like the token's hash: serving (spark) reads it.
    pub fn environment(&self) -> PathBuf {
        self.at(ENVIRONMENT_FILE.trim_start_matches('/'))
    }
    /// The signing key(s) operator-key lists are checked against (M.7), pinned here.
    pub fn signing_keys(&self) -> PathBuf {
        self.at("etc/enverge/signing-keys")
    }
    /// Root's copy of the signed list (#36: serving reads it, never writes it).
    pub fn operator_keys(&self) -> PathBuf {
        self.at(byo_core::render::units::OPERATOR_KEYS_HELD.trim_start_matches('/'))
    }
    /// Where serving passes a pushed list to root's helper.
    pub fn operator_keys_request(&self) -> PathBuf {
        self.at(byo_core::render::units::OPERATOR_KEYS_FLAG.trim_start_matches('/'))
    }
    pub fn authorized_keys(&self) -> PathBuf {
        self.at("home/spark/.ssh/authorized_keys")
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnrollOutcome {
    Enrolled {
        slug: String,
    },
    /// Scenario 5: credentials were already here; nothing was called.
    AlreadyEnrolled {
        slug: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// The token will not redeem: refused here for its shape, or by the server.
    #[error("{0}")]
    InvalidToken(TokenRefusal),
    #[error("the server turned this machine away: {0}")]
    Rejected(String),
    #[error("{0}")]
    Unreachable(Unreached),
    /// Step 125 found no pair to enrol for as long as the token lives (node1's login
    /// refused, node1 silent, a self-pair): nothing was sent, the token is unspent.
    #[error("the other machines of this host were not found: {0}")]
    NoPeer(String),
    #[error("the server answered something unexpected: {0}")]
    Protocol(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

/// Why a token will not redeem. Owners read this: which side refused it matters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenRefusal {
    /// Not the shape of an enrolment token (cut short or mistyped: its checksum fails);
    /// refused on this machine, before any call to the server.
    Malformed,
    /// The server's one answer for unknown, spent and expired tokens (its message).
    Server(String),
}

impl std::fmt::Display for TokenRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenRefusal::Malformed => f.write_str(
                "this is not a whole enrolment token (checked on this machine, before any call to the server): \
                 it looks cut short or mistyped; copy the whole command from the dashboard again",
            ),
            TokenRefusal::Server(message) => write!(f, "the server refused this token: {message}"),
        }
    }
}

/// The server could not be reached (or answered only 5xx) for as long as we tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreached {
    pub server: String,
    /// What the last attempt ran into.
    pub last: String,
    pub tried_for: Duration,
}

impl std::fmt::Display for Unreached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "could not reach {}: {} (gave up after {} s)",
            self.server,
            self.last,
            self.tried_for.as_secs()
        )
    }
}

impl EnrollError {
    /// `byo-agent enroll`'s exit status for this failure; install.sh passes it on, and
    /// docs/onboarding.md lists them. 1 is anything else (clap's usage error is 2).
    pub fn exit_code(&self) -> u8 {
        match self {
            EnrollError::InvalidToken(TokenRefusal::Server(_)) => 3,
            EnrollError::InvalidToken(TokenRefusal::Malformed) => 4,
            EnrollError::Rejected(_) => 5,
            EnrollError::Unreachable(_) => 6,
            EnrollError::NoPeer(_) => 9,
            EnrollError::Protocol(_) | EnrollError::Io { .. } => 1,
        }
    }
}

fn io(context: &str) -> impl FnOnce(std::io::Error) -> EnrollError + '_ {
    move |source| EnrollError::Io {
        context: context.to_owned(),
        source,
    }
}

#[derive(Clone, Debug)]
pub struct Enroller {
    /// The control plane, e.g. https://app.enverge.ai.
    pub server: String,
    pub paths: EnrollPaths,
    pub retry_every: Duration,
    /// How long to keep trying an unreachable backend: the token's lifetime.
    pub give_up_after: Duration,
    /// How often step 125 looks again while node1 cannot be reached or logged into.
    pub probe_every: Duration,
    /// How long it keeps looking: the token's lifetime (the token stays unspent).
    pub probe_for: Duration,
}

/// What the backend said in an error body.
fn message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| body.chars().filter(|c| !c.is_control()).take(300).collect())
}

impl Enroller {
    pub fn new(server: &str, paths: EnrollPaths) -> Self {
        Enroller {
            server: server.trim_end_matches('/').to_owned(),
            paths,
            retry_every: Duration::from_secs(60),
            give_up_after: Duration::from_secs(3600),
            probe_every: Duration::from_secs(60),
            probe_for: Duration::from_secs(3600),
        }
    }

    /// The credentials kept by an earlier enrolment, if any.
    pub fn kept(&self) -> Result<Option<EnrollResponse>, EnrollError> {
        match std::fs::read(self.paths.credentials()) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
                EnrollError::Protocol(format!("the kept credentials do not parse: {e}"))
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io("reading the kept credentials")(e)),
        }
    }

    pub async fn enroll(
        &self,
        token: &str,
        request: &EnrollRequest,
    ) -> Result<EnrollOutcome, EnrollError> {
        if let Some(kept) = self.kept()? {
            return Ok(EnrollOutcome::AlreadyEnrolled { slug: kept.slug });
        }
        let token = SecretToken::parse(TokenKind::Enrollment, token.trim())
            .map_err(|_| EnrollError::InvalidToken(TokenRefusal::Malformed))?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| EnrollError::Protocol(e.to_string()))?;
        let started = Instant::now();
        loop {
            let sent = client
                .post(format!("{}/api/enroll", self.server))
                .bearer_auth(token.expose())
                .json(request)
                .send()
                .await;
            let retry = match sent {
                Err(e) => chain(&e.without_url()),
                Ok(resp) => {
                    let status = resp.status();
                    let body = resp.text().await.unwrap_or_default();
                    match status.as_u16() {
                        200 => {
                            let response: EnrollResponse =
                                serde_json::from_str(&body).map_err(|e| {
                                    EnrollError::Protocol(format!("the enrolment answer: {e}"))
                                })?;
                            self.keep(&response, &body)?;
                            return Ok(EnrollOutcome::Enrolled {
                                slug: response.slug,
                            });
                        }
                        401 => {
                            return Err(EnrollError::InvalidToken(TokenRefusal::Server(message(
                                &body,
                            ))));
                        }
                        422 => return Err(EnrollError::Rejected(message(&body))),
                        400..=499 => {
                            return Err(EnrollError::Protocol(format!(
                                "{status}: {}",
                                message(&body)
                            )));
                        }
                        _ => format!("the server answered {status}"),
                    }
                }
            };
            if started.elapsed() >= self.give_up_after {
                return Err(EnrollError::Unreachable(Unreached {
                    server: self.server.clone(),
                    last: retry,
                    tried_for: started.elapsed(),
                }));
            }
            eprintln!(
                "byo-agent: could not reach {}: {retry}; trying again in {} s",
                self.server,
                self.retry_every.as_secs()
            );
            tokio::time::sleep(self.retry_every).await;
        }
    }

    /// Keep what redeem returned: the whole answer root-only, the agent token's hash, the
    /// pinned signing key, and the signed operator-key list — kept only if it verifies.
    fn keep(&self, response: &EnrollResponse, raw: &str) -> Result<(), EnrollError> {
        for dir in [self.paths.credentials(), self.paths.operator_keys()] {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io("creating the credentials directory"))?;
            }
        }
        write_atomic(&self.paths.credentials(), raw.as_bytes(), 0o600)
            .map_err(io("keeping the credentials"))?;
        let agent_token = SecretToken::parse(TokenKind::Agent, &response.agent_token)
            .map_err(|_| EnrollError::Protocol("the agent token is malformed".into()))?;
        write_atomic(
            &self.paths.agent_token_hash(),
            format!("{}\n", agent_token.hash().as_str()).as_bytes(),
            0o644,
        )
        .map_err(io("keeping the agent token's hash"))?;
        write_atomic(
            &self.paths.environment(),
            format!("{}\n", response.environment).as_bytes(),
            0o644,
        )
        .map_err(io("keeping the environment"))?;
        if !response.signing_keys.is_empty() && !self.paths.signing_keys().exists() {
            let keys = response
                .signing_keys
                .iter()
                .map(|k| format!("{}\n", k.trim()))
                .collect::<String>();
            write_atomic(&self.paths.signing_keys(), keys.as_bytes(), 0o644)
                .map_err(io("pinning the signing key"))?;
        }
        if let Some(list) = &response.operator_keys {
            let keys = self.operator_keys(&response.environment);
            match keys.accept(list.as_bytes(), chrono::Utc::now()) {
                Ok(_) => keys
                    .persist(list.as_bytes())
                    .map_err(|e| EnrollError::Protocol(e.to_string()))?,
                Err(e) => {
                    eprintln!("byo-agent: the operator-key list from enrolment was not kept: {e}")
                }
            }
        }
        Ok(())
    }

    /// Keep `endpoint` as the relay's WireGuard endpoint in the kept credentials (root-only,
    /// replaced whole): a host that redeemed before its relay had an address was given
    /// none, and learns it later (`GET /api/host/relay`). Every other field is kept as
    /// received.
    pub fn keep_relay_endpoint(&self, endpoint: &str) -> Result<(), EnrollError> {
        let path = self.paths.credentials();
        let bytes = std::fs::read(&path).map_err(io("reading the kept credentials"))?;
        let mut creds: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            EnrollError::Protocol(format!("the kept credentials do not parse: {e}"))
        })?;
        let wireguard = creds
            .get_mut("wireguard")
            .and_then(|w| w.as_object_mut())
            .ok_or_else(|| {
                EnrollError::Protocol("the kept credentials hold no WireGuard config".into())
            })?;
        wireguard.insert("endpoint".into(), endpoint.into());
        write_atomic(&path, creds.to_string().as_bytes(), 0o600)
            .map_err(io("keeping the relay's endpoint"))
    }

    pub fn operator_keys(&self, environment: &str) -> OperatorKeys {
        OperatorKeys {
            paths: Paths {
                trusted: self.paths.signing_keys(),
                held: self.paths.operator_keys(),
                authorized_keys: self.paths.authorized_keys(),
                request: self.paths.operator_keys_request(),
            },
            environment: environment.to_owned(),
            host: None,
        }
    }
}

/// The environment this host enrolled into, which every operator-key list it takes must
/// name (serving's pushes and the operator-keys commands alike): the file enrolment keeps
/// (`environment_file`), else — a host enrolled before that file was kept — the
/// environment of the list it holds, which was checked against the enrolment's own when it
/// was taken. `None` when neither is there (not enrolled; or enrolled before signed lists,
/// holding none), and every list is then refused.
pub fn enrolled_environment(
    environment_file: &Path,
    held: &Path,
) -> Result<Option<String>, EnrollError> {
    match std::fs::read_to_string(environment_file) {
        Ok(text) if !text.trim().is_empty() => return Ok(Some(text.trim().to_owned())),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("reading the kept environment")(e)),
    }
    let keys = OperatorKeys {
        paths: Paths {
            trusted: PathBuf::new(),
            held: held.to_path_buf(),
            authorized_keys: PathBuf::new(),
            request: PathBuf::new(),
        },
        environment: String::new(),
        host: None,
    };
    let held = keys
        .held()
        .map_err(|e| EnrollError::Protocol(format!("the held operator-key list: {e}")))?;
    Ok(held.map(|(_, list)| list.environment))
}

/// Read the token from an argument, a file, or standard input (in that order).
pub fn read_token(arg: Option<&str>, file: Option<&Path>) -> std::io::Result<String> {
    if let Some(t) = arg {
        return Ok(t.trim().to_owned());
    }
    if let Some(f) = file {
        return Ok(std::fs::read_to_string(f)?.trim().to_owned());
    }
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)?;
    Ok(s.trim().to_owned())
}

/// How long `enroll` keeps at it: the backend every `retry_every` for `give_up_after`, the
/// cable probe (a pair) every `probe_every` for `probe_for`.
#[derive(Clone, Copy, Debug)]
pub struct Patience {
    pub retry_every: Duration,
    pub give_up_after: Duration,
    pub probe_every: Duration,
    pub probe_for: Duration,
}

/// `byo-agent enroll`: enrol this machine once; a machine that already enrolled reuses its
/// credentials (and needs no token). The token comes from `token`, `token_file`, or
/// standard input. An unreachable server is tried every `retry_every` for `give_up_after`
/// (install.sh, in the owner's terminal, gives up quickly). A refusal is an
/// [`EnrollError`] inside the error, for [`EnrollError::exit_code`].
pub fn run(
    server: &str,
    token: Option<String>,
    token_file: Option<PathBuf>,
    root: PathBuf,
    patience: Patience,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let enroller = Enroller {
        retry_every: patience.retry_every,
        give_up_after: patience.give_up_after,
        probe_every: patience.probe_every,
        probe_for: patience.probe_for,
        ..Enroller::new(server, EnrollPaths { root })
    };
    let given = token.is_some() || token_file.is_some();
    let token = if enroller.kept()?.is_some() {
        String::new()
    } else {
        read_token(token.as_deref(), token_file.as_deref())
            .context("reading the enrolment token")?
    };
    match enroll_this_machine(&enroller, &token)?? {
        EnrollOutcome::Enrolled { slug } => println!("enrolled as {slug}"),
        EnrollOutcome::AlreadyEnrolled { slug } => {
            println!("{}", already_enrolled(&slug, given))
        }
    }
    Ok(())
}

/// What `enroll` says on a machine that enrolled before: a token given now is not used,
/// and the owner is told so rather than left to think it enrolled the machine afresh.
fn already_enrolled(slug: &str, token_given: bool) -> String {
    let mut said = format!("already enrolled as {slug}; reusing its credentials");
    if token_given {
        said.push_str(
            "\nthe token given was not used (it stays unredeemed until it lapses): this machine \
             keeps its enrolment. To enrol it afresh, hand it back first with \
             `sudo byo-agent uninstall` (or `install.sh --uninstall`)",
        );
    }
    said
}

/// Detect this machine (step 126) and redeem `token`, retrying while the backend is away.
/// On a pair or a ring (`install.sh --peer --nodes=N` wrote peer-nodes, and step 123 left
/// node1's login or ENVERGE_PEER_ADDR names it) step 125 runs first, again every
/// `probe_every` while it finds no pair to enrol, for `probe_for`: the rails and peers it
/// found are the evidence, and peer.json holds their numbering before anything is sent.
pub fn enroll_this_machine(
    enroller: &Enroller,
    token: &str,
) -> anyhow::Result<Result<EnrollOutcome, EnrollError>> {
    let mut report = EnrollRequest {
        node: crate::detect::detect(&crate::detect::LocalProbe),
        peers: Vec::new(),
    };
    let cable = crate::cable::CableProbe {
        root: enroller.paths.root.clone(),
        ..crate::cable::CableProbe::system()
    };
    let pair = cable.nodes() > 1 && (cable.login_file().exists() || cable.peer_addr.is_some());
    if pair && enroller.kept()?.is_none() {
        // A token that cannot redeem is refused before minutes of probing.
        if SecretToken::parse(TokenKind::Enrollment, token.trim()).is_err() {
            return Ok(Err(EnrollError::InvalidToken(TokenRefusal::Malformed)));
        }
        match probe_until(enroller, &cable, &report.node) {
            Ok(found) => {
                report.node.rails = found.rails;
                report.peers = found.peers;
            }
            Err(e) => return Ok(Err(e)),
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(rt.block_on(enroller.enroll(token, &report)))
}

/// Step 125 until it finds a pair to enrol, or the token's lifetime is over.
fn probe_until(
    enroller: &Enroller,
    cable: &crate::cable::CableProbe,
    me: &byo_wire::enroll::NodeReport,
) -> Result<byo_core::probe::Found, EnrollError> {
    use byo_core::probe::Decision;
    let started = Instant::now();
    loop {
        let why = match cable.run_once(&mut crate::host::LocalHost::default()) {
            Ok(Decision::Enroll(found)) => {
                for (iface, v) in &found.verdicts {
                    println!("byo-agent: {iface}: {v}");
                }
                // The same comparison redeem makes: a self-pair costs a retry, not the token.
                if byo_core::probe::self_pair(me, &found.peers) {
                    "a peer is this machine itself (the same GPUs)".to_owned()
                } else {
                    return Ok(found);
                }
            }
            Ok(Decision::Retry { retry, verdicts }) => {
                for (iface, v) in &verdicts {
                    println!("byo-agent: {iface}: {v}");
                }
                retry.to_string()
            }
            Err(e) => e,
        };
        if started.elapsed() + enroller.probe_every > enroller.probe_for {
            return Err(EnrollError::NoPeer(format!(
                "{why} (looked for {} s; nothing was sent and the token is unspent)",
                started.elapsed().as_secs()
            )));
        }
        eprintln!(
            "byo-agent: not enrolling yet: {why}; looking again in {} s",
            enroller.probe_every.as_secs()
        );
        std::thread::sleep(enroller.probe_every);
    }
}

/// `byo-agent probe-cables`: step 125 once; prints the decision as JSON.
pub fn probe_command(root: &Path) -> anyhow::Result<()> {
    let cable = crate::cable::CableProbe {
        root: root.to_path_buf(),
        ..crate::cable::CableProbe::system()
    };
    let d = cable
        .run_once(&mut crate::host::LocalHost::default())
        .map_err(anyhow::Error::msg)?;
    println!(
        "{}",
        serde_json::to_string_pretty(&crate::cable::decision_json(&d))?
    );
    match d {
        byo_core::probe::Decision::Enroll(_) => Ok(()),
        byo_core::probe::Decision::Retry { retry, .. } => {
            Err(EnrollError::NoPeer(retry.to_string()).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::already_enrolled;

    /// Issue #42, 8: a token given to a machine that enrolled before is not used, and the
    /// owner is told so; with none given, the reuse alone is said.
    #[test]
    fn a_token_given_to_an_enrolled_machine_is_said_to_be_unused() {
        let plain = already_enrolled("spark-7", false);
        assert_eq!(
            plain,
            "already enrolled as spark-7; reusing its credentials"
        );
        let told = already_enrolled("spark-7", true);
        assert!(told.starts_with(&plain), "{told}");
        assert!(told.contains("the token given was not used"), "{told}");
        assert!(told.contains("byo-agent uninstall"), "{told}");
    }
}
