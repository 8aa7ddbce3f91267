//! The public API as the customer's and owner's commands reach it: an API token
//! (`Authorization: Bearer byo_api_…`, docs/api-tokens.md) kept by `byo login` in the user's
//! config directory, and one client that turns every answer into the API's own types or
//! into an [`ApiError`] that says which exit code it earns (docs/cli.md).

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use byo_wire::api::ErrorBody;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Exit codes of the commands that talk to the API (docs/cli.md). 2 is clap's, for usage.
pub const EXIT_REFUSED: u8 = 1;
pub const EXIT_UNREACHABLE: u8 = 3;

/// Why a call did not give what was asked, in the words the person at the terminal needs.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered and said no: its own message.
    #[error("{message} ({status}, {code})")]
    Refused {
        status: StatusCode,
        code: String,
        message: String,
    },
    /// Nothing answered, or something that is not a byo server did.
    #[error("could not reach {server}: {reason}")]
    Unreachable { server: String, reason: String },
    /// No `byo login` on this machine yet (or its file is unreadable).
    #[error("{0}")]
    NotLoggedIn(String),
    /// Anything else that stopped the command on this side (a file, bad input).
    #[error("{0}")]
    Local(String),
}

impl ApiError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ApiError::Unreachable { .. } => EXIT_UNREACHABLE,
            _ => EXIT_REFUSED,
        }
    }

    /// Whether the server refused with `status`.
    pub fn is_status(&self, want: StatusCode) -> bool {
        matches!(self, ApiError::Refused { status, .. } if *status == want)
    }
}

/// What `byo login` keeps: which server, and the token that acts for you there.
#[derive(Clone, Serialize, Deserialize)]
pub struct Credentials {
    pub server: String,
    pub token: String,
}

// Hand-written so the token never reaches a log line or a panic message.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Where the credentials live: `$BYO_CONFIG_DIR`, else `$XDG_CONFIG_HOME/byo`, else
/// `~/.config/byo`.
pub fn config_dir() -> Result<PathBuf, ApiError> {
    let from = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = from("BYO_CONFIG_DIR") {
        return Ok(dir);
    }
    if let Some(dir) = from("XDG_CONFIG_HOME") {
        return Ok(dir.join("byo"));
    }
    from("HOME")
        .map(|home| home.join(".config").join("byo"))
        .ok_or_else(|| {
            ApiError::Local(
                "no HOME, XDG_CONFIG_HOME or BYO_CONFIG_DIR to keep the token in".into(),
            )
        })
}

fn credentials_path() -> Result<PathBuf, ApiError> {
    Ok(config_dir()?.join("credentials.json"))
}

impl Credentials {
    /// The saved credentials, or how to get some.
    pub fn load() -> Result<Credentials, ApiError> {
        let path = credentials_path()?;
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ApiError::NotLoggedIn(format!(
                    "not logged in on this machine (no {}): run `byo login --server https://… ` \
                     with an API token from your account page",
                    path.display()
                )));
            }
            Err(e) => {
                return Err(ApiError::NotLoggedIn(format!(
                    "reading {}: {e}",
                    path.display()
                )));
            }
        };
        serde_json::from_str(&text).map_err(|e| {
            ApiError::NotLoggedIn(format!(
                "{} is not what `byo login` writes ({e}): run `byo login` again",
                path.display()
            ))
        })
    }

    /// Writes them readable by you alone (0600 in a 0700 directory), replacing any before.
    pub fn save(&self) -> Result<PathBuf, ApiError> {
        let path = credentials_path()?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let local = |what: &str, e: std::io::Error| ApiError::Local(format!("{what}: {e}"));
        std::fs::create_dir_all(dir)
            .map_err(|e| local(&format!("creating {}", dir.display()), e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| local(&format!("restricting {}", dir.display()), e))?;
        // Written beside and renamed over, so a crash never leaves half a file, and created
        // 0600 so the token is never readable by others, not even for a moment.
        let tmp = dir.join(".credentials.json.tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| local(&format!("creating {}", tmp.display()), e))?;
        let body = serde_json::to_vec_pretty(self).expect("credentials serialise");
        file.write_all(&body)
            .and_then(|()| file.sync_all())
            .map_err(|e| local(&format!("writing {}", tmp.display()), e))?;
        std::fs::rename(&tmp, &path)
            .map_err(|e| local(&format!("replacing {}", path.display()), e))?;
        Ok(path)
    }

    /// Forgets them; whether there were any.
    pub fn remove() -> Result<Option<PathBuf>, ApiError> {
        let path = credentials_path()?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(Some(path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ApiError::Local(format!("removing {}: {e}", path.display()))),
        }
    }
}

/// The server's address as typed, without a trailing slash; only http(s).
pub fn normalise_server(server: &str) -> Result<String, ApiError> {
    let server = server.trim().trim_end_matches('/');
    let url = reqwest::Url::parse(server)
        .map_err(|e| ApiError::Local(format!("--server {server:?} is not a URL: {e}")))?;
    match url.scheme() {
        "https" => {}
        // A token crosses the network only inside TLS; plain http only to this machine
        // (`byo up`, on loopback or on the LXD bridge's address here).
        "http" if url.host_str().is_some_and(on_this_machine) => {}
        "http" => {
            return Err(ApiError::Local(format!(
                "--server {server} is plain http: a token is sent only over https (or to an \
                 address of this machine)"
            )));
        }
        other => {
            return Err(ApiError::Local(format!(
                "--server {server}: {other}:// is not http(s)"
            )));
        }
    }
    Ok(server.to_owned())
}

/// Whether `host` (as a URL spells it) is this machine: `localhost`, a loopback address, or an
/// address one of its interfaces holds (binding to it succeeds only then), so a request to it
/// never leaves the machine.
fn on_this_machine(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    literal
        .parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback() || std::net::TcpListener::bind((ip, 0)).is_ok())
}

/// One API, one token.
pub struct Api {
    client: reqwest::Client,
    pub server: String,
    token: String,
}

impl Api {
    pub fn new(credentials: &Credentials) -> Api {
        Api {
            client: reqwest::Client::builder()
                .user_agent(concat!("byo-cli/", env!("CARGO_PKG_VERSION")))
                .timeout(std::time::Duration::from_secs(120))
                .build()
                .expect("the HTTP client builds"),
            server: credentials.server.clone(),
            token: credentials.token.clone(),
        }
    }

    /// The API as `byo login` left it on this machine.
    pub fn from_saved() -> Result<Api, ApiError> {
        Ok(Api::new(&Credentials::load()?))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        let (_, body) = self.call(Method::GET, path, None::<&()>).await?;
        self.read(path, &body)
    }

    /// A call with a JSON body (or none); the status and the answer's body, read as `T`.
    pub async fn send<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(StatusCode, T), ApiError> {
        let (status, bytes) = self.call(method, path, body).await?;
        Ok((status, self.read(path, &bytes)?))
    }

    /// A call whose answer has no body to read (204).
    pub async fn send_empty(&self, method: Method, path: &str) -> Result<StatusCode, ApiError> {
        Ok(self.call(method, path, None::<&()>).await?.0)
    }

    async fn call<B: Serialize>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<(StatusCode, Vec<u8>), ApiError> {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.server))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let unreachable = |reason: String| ApiError::Unreachable {
            server: self.server.clone(),
            reason,
        };
        let response = request
            .send()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        if status.is_success() {
            return Ok((status, bytes.to_vec()));
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(err) => Err(ApiError::Refused {
                status,
                code: err.error,
                message: err.message,
            }),
            // Not byo's error shape: a proxy, a wrong address, something else on the port.
            Err(_) => Err(unreachable(format!(
                "{path} answered {status} without byo's error body: is {} a byo server?",
                self.server
            ))),
        }
    }

    fn read<T: DeserializeOwned>(&self, path: &str, body: &[u8]) -> Result<T, ApiError> {
        serde_json::from_slice(body).map_err(|e| ApiError::Unreachable {
            server: self.server.clone(),
            reason: format!("{path} answered something this byo cannot read ({e}): is the CLI older than the server?"),
        })
    }
}

/// reqwest's error and its causes on one line ("error sending request: … Connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::normalise_server;

    #[test]
    fn a_token_goes_over_plain_http_only_to_this_machine() {
        for here in [
            "http://localhost:8080",
            "http://127.0.0.1:8080/",
            "http://[::1]:8080",
            "https://app.enverge.ai/",
        ] {
            assert!(normalise_server(here).is_ok(), "{here}");
        }
        assert_eq!(
            normalise_server("https://app.enverge.ai/").unwrap(),
            "https://app.enverge.ai"
        );
        // TEST-NET-1 and a name: another machine, whatever DNS says.
        for away in [
            "http://192.0.2.1:8080",
            "http://byo.example.com",
            "ftp://localhost",
        ] {
            assert!(normalise_server(away).is_err(), "{away}");
        }
    }
}
