//! Configuration: defaults, then a TOML file, then `BYO_*` environment variables (nested
//! keys with `__`, e.g. `BYO_PASSWORD_HASHING__MEMORY_KIB`). Secrets are `SecretString`,
//! whose `Debug` is redacted, so printing the config never prints them.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use figment::Figment;
use figment::providers::{Env, Format, Toml};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::providers::{
    ProviderError, Providers, RelayProvider, TunnelProvider, cloudflare, gcp, local, notify, stripe,
};

/// The top-level keys, for filtering the environment.
const KEYS: &[&str] = &[
    "listen",
    "metrics_listen",
    "database_url",
    "public_url",
    "log_format",
    "cookie_secure",
    "session_hours",
    "allow_signup",
    "instances",
    "password_hashing",
    "environment",
    "secret_key",
    "operator_keys",
    "relay_release",
    "relays",
    "release_dir",
    "release_key",
    "cloudflared",
    "tunnels",
    "ssh_domain",
    "placement",
    "rate_limits",
    "billing",
    "listener",
    "notices",
];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where the API and pages listen.
    #[serde(default = "defaults::listen")]
    pub listen: SocketAddr,
    /// Where `/metrics` (Prometheus) listens; kept off the public listener. `None` disables it.
    #[serde(default = "defaults::metrics_listen")]
    pub metrics_listen: Option<SocketAddr>,
    /// `sqlite://path/byo.db` or `postgres://user:password@host:port/db`.
    #[serde(default = "defaults::database_url")]
    pub database_url: SecretString,
    /// The URL people reach the pages at; used for links and to check the Origin of
    /// state-changing requests.
    #[serde(default = "defaults::public_url")]
    pub public_url: String,
    #[serde(default)]
    pub log_format: LogFormat,
    /// Mark the session cookie `Secure`. Browsers accept Secure cookies from
    /// http://localhost, so this stays on even for `byo up`.
    #[serde(default = "defaults::yes")]
    pub cookie_secure: bool,
    #[serde(default = "defaults::session_hours")]
    pub session_hours: i64,
    /// Whether anyone may create an account at /signup.
    #[serde(default = "defaults::yes")]
    pub allow_signup: bool,
    /// `byo up` only: its customers may rent the staff-only test profiles (`linux-test`), a
    /// local platform's only hosts being test hosts (issue #42). `byo up` sets it in code; no
    /// file or environment variable reaches it (`serde(skip)`), so no installation can.
    #[serde(skip)]
    pub test_hosts_for_everyone: bool,
    /// `byo up` only: a sign-up makes the account at once, with no mail confirming the
    /// address, a platform on one machine having no mail to send (issue #36). Everywhere
    /// else a sign-up is confirmed by mail (`[notices] smtp_url`), and refused while none is
    /// configured. Set in code only, like `test_hosts_for_everyone`.
    #[serde(skip)]
    pub signup_without_mail: bool,
    #[serde(default)]
    pub password_hashing: PasswordHashing,
    /// This installation's id, inside every signed operator-key list so a list for one
    /// installation never opens another's hosts.
    #[serde(default = "defaults::environment")]
    pub environment: String,
    /// 32 bytes, hex: seals the agent tokens the backend must present to hosts, so the
    /// database holds none in plaintext. Without it, nothing can be sent to a host.
    #[serde(default)]
    pub secret_key: Option<SecretString>,
    #[serde(default)]
    pub operator_keys: OperatorKeysConfig,
    /// The relay daemon a new relay fetches at first boot, and its SHA-256. Without it no
    /// bootstrap can be written, and only the `local` relay provider works.
    #[serde(default)]
    pub relay_release: Option<RelayRelease>,
    /// Who builds relays: `local` (this machine; `byo up`, tests) or `gcp`.
    #[serde(default)]
    pub relays: RelaysConfig,
    /// Where the agent builds are, served at /agent/: `byo-agent-<arch>` and
    /// `byo-agent-<arch>.sha256` (as `uname -m` names the arch).
    #[serde(default)]
    pub release_dir: Option<std::path::PathBuf>,
    /// The release key's public half (an OpenSSH line): install.sh carries it, a host pins it
    /// at its first install, and every build it installs must carry its SSHSIG
    /// (`byo-agent-<arch>.sig`, `byo_core::release`). The private half never reaches a server.
    #[serde(default)]
    pub release_key: Option<String>,
    /// The operator tunnel's connector, which neither DGX OS nor Debian ships: the release
    /// directory may hold `cloudflared-<arch>`, served at /cloudflared/, and this pins its
    /// SHA-256 per arch. Enrolment hands a host the URL and the digest for its arch.
    #[serde(default)]
    pub cloudflared: CloudflaredConfig,
    /// Operator tunnels and their DNS: Cloudflare when configured, `local` otherwise.
    #[serde(default)]
    pub tunnels: TunnelsConfig,
    /// Customers reach an instance at `<instance>.<host slug>.ssh.<ssh_domain>`, which
    /// resolves to that host's relay. Defaults to the host part of `public_url`.
    #[serde(default)]
    pub ssh_domain: Option<String>,
    /// How creates choose among hosts: heartbeat age and benching (issue #12, 6).
    #[serde(default)]
    pub placement: PlacementConfig,
    /// `[rate_limits]`: sign-in, sign-up, password changes and redeem, per address and per
    /// account (#16).
    #[serde(default)]
    pub rate_limits: RateLimitConfig,
    /// `[instances]`: the rules every create shares (issue #13, 5).
    #[serde(default)]
    pub instances: InstancesConfig,
    /// Origins besides `public_url`'s that state-changing requests may come from. Never
    /// read from a file or the environment: only `byo up` sets it, to the other names of
    /// its own loopback listener (`127.0.0.1`, `[::1]`), so a production server accepts
    /// exactly its public URL.
    #[serde(skip)]
    pub loopback_origins: Vec<String>,
    /// Billing on Stripe (issue #13, 4). Absent, billing is off (`byo up`).
    #[serde(default)]
    pub billing: Option<stripe::BillingConfig>,
    /// `[listener]`: the header-read (and idle) timeout, the body-read timeout and the cap on
    /// concurrent connections of the API's listener (#16, `byo_listen::Limits`).
    #[serde(default)]
    pub listener: byo_listen::Limits,
    /// `[notices]`: where notices are sent (issue #38, 3); neither channel set, they stay
    /// in the outbox at /admin/outbox.
    #[serde(default)]
    pub notices: notify::NoticesConfig,
}

/// `[rate_limits]`: how often one address, and one account, may knock on the doors that
/// check a secret (sign-in, sign-up, password change, redeem). Each is a burst of that many,
/// refilled evenly over a minute; past it the answer is 429 with `Retry-After`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    #[serde(default = "defaults::per_address_per_minute")]
    pub per_address_per_minute: u32,
    #[serde(default = "defaults::per_account_per_minute")]
    pub per_account_per_minute: u32,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            per_address_per_minute: defaults::per_address_per_minute(),
            per_account_per_minute: defaults::per_account_per_minute(),
        }
    }
}

/// `[placement]`: which hosts a create may land on besides the design's rules.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PlacementConfig {
    /// A host whose last heartbeat is older than this is not picked (we trust the absence
    /// of a heartbeat). Default 90 s: three of the agent's 30 s beats.
    #[serde(default = "defaults::max_heartbeat_age_secs")]
    pub max_heartbeat_age_secs: u64,
    /// A host that failed this many creates in a row (refused, or could not be reached) is
    /// benched: not picked until a heartbeat later than the bench, or an operator clears it.
    #[serde(default = "defaults::bench_after_failures")]
    pub bench_after_failures: u32,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        PlacementConfig {
            max_heartbeat_age_secs: defaults::max_heartbeat_age_secs(),
            bench_after_failures: defaults::bench_after_failures(),
        }
    }
}

impl PlacementConfig {
    /// The oldest heartbeat a pickable host may have, at `now`.
    pub fn seen_since(&self, now: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
        let age = i64::try_from(self.max_heartbeat_age_secs).unwrap_or(i64::MAX / 2_000);
        now - chrono::Duration::seconds(age.min(100 * 365 * 86_400))
    }
}

/// `[instances]`: the rules every create shares, whoever creates (E0).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct InstancesConfig {
    /// How many instances one account may hold, live and queued together, so one account
    /// cannot hold every free host. Counted in the transaction that writes the row.
    #[serde(default = "defaults::max_per_account")]
    pub max_per_account: u32,
    /// How long a queued create waits for a host before it lapses (closed `expired`), and
    /// how far "keep waiting" moves it from now: an intent days old is not one to act on
    /// unasked (E2). At most 30 days.
    #[serde(default = "defaults::queue_expires_after_hours")]
    pub queue_expires_after_hours: u32,
}

impl InstancesConfig {
    /// When a row queued (or kept waiting) at `now` lapses.
    pub fn queue_expires_at(&self, now: DateTime<Utc>) -> DateTime<Utc> {
        now + chrono::Duration::hours(i64::from(
            self.queue_expires_after_hours.min(MAX_QUEUE_HOURS),
        ))
    }
}

/// The longest `[instances] queue_expires_after_hours` may be: 30 days.
pub const MAX_QUEUE_HOURS: u32 = 30 * 24;

impl Default for InstancesConfig {
    fn default() -> Self {
        InstancesConfig {
            max_per_account: defaults::max_per_account(),
            queue_expires_after_hours: defaults::queue_expires_after_hours(),
        }
    }
}

/// `[cloudflared.sha256]`: `aarch64 = "<hex>"`, `x86_64 = "<hex>"` (as `uname -m` names them).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CloudflaredConfig {
    #[serde(default)]
    pub sha256: std::collections::BTreeMap<String, String>,
}

impl Config {
    /// The cloudflared build a host of `arch` installs, when this installation pins one.
    pub fn cloudflared_build(&self, arch: &str) -> Option<byo_wire::enroll::ConnectorBuild> {
        let sha256 = self.cloudflared.sha256.get(arch)?;
        Some(byo_wire::enroll::ConnectorBuild {
            url: format!(
                "{}/cloudflared/cloudflared-{arch}",
                self.public_url.trim_end_matches('/')
            ),
            sha256: sha256.trim().to_ascii_lowercase(),
        })
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TunnelsConfig {
    pub cloudflare: Option<cloudflare::CloudflareConfig>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RelaysConfig {
    #[serde(default)]
    pub provider: RelayProviderKind,
    pub gcp: Option<gcp::GcpConfig>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RelayProviderKind {
    #[default]
    Local,
    Gcp,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RelayRelease {
    pub url: String,
    pub sha256: String,
}

/// The signed operator-key lists (M).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct OperatorKeysConfig {
    /// The public half of the signing key(s) hosts pin at enrolment
    /// ("ssh-ed25519 AAAA…"). The private half lives in the operators' password manager
    /// and never reaches a server.
    #[serde(default)]
    pub signing_keys: Vec<String>,
    /// How long a list stays valid after it is issued.
    #[serde(default = "defaults::validity_days")]
    pub validity_days: i64,
}

impl Default for OperatorKeysConfig {
    fn default() -> Self {
        OperatorKeysConfig {
            signing_keys: Vec::new(),
            validity_days: defaults::validity_days(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Pretty,
    /// One JSON object per event, for log shippers.
    Json,
}

/// Argon2id cost. The defaults are OWASP's minimum for argon2id (19 MiB, 2 passes).
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PasswordHashing {
    pub memory_kib: u32,
    pub iterations: u32,
    pub parallelism: u32,
}

impl Default for PasswordHashing {
    fn default() -> Self {
        PasswordHashing {
            memory_kib: 19 * 1024,
            iterations: 2,
            parallelism: 1,
        }
    }
}

mod defaults {
    use std::net::SocketAddr;

    use secrecy::SecretString;

    pub fn listen() -> SocketAddr {
        ([127, 0, 0, 1], 8080).into()
    }
    pub fn metrics_listen() -> Option<SocketAddr> {
        Some(([127, 0, 0, 1], 9464).into())
    }
    pub fn database_url() -> SecretString {
        SecretString::from("sqlite://byo.db")
    }
    pub fn public_url() -> String {
        "http://localhost:8080".into()
    }
    pub fn yes() -> bool {
        true
    }
    pub fn session_hours() -> i64 {
        12
    }
    pub fn environment() -> String {
        "production".into()
    }
    pub fn max_heartbeat_age_secs() -> u64 {
        90
    }

    pub fn bench_after_failures() -> u32 {
        3
    }

    pub fn per_address_per_minute() -> u32 {
        30
    }

    pub fn per_account_per_minute() -> u32 {
        10
    }

    pub fn max_per_account() -> u32 {
        2
    }

    pub fn queue_expires_after_hours() -> u32 {
        72
    }

    pub fn validity_days() -> i64 {
        90
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: defaults::listen(),
            metrics_listen: defaults::metrics_listen(),
            database_url: defaults::database_url(),
            public_url: defaults::public_url(),
            log_format: LogFormat::default(),
            cookie_secure: true,
            session_hours: defaults::session_hours(),
            allow_signup: true,
            test_hosts_for_everyone: false,
            signup_without_mail: false,
            password_hashing: PasswordHashing::default(),
            environment: defaults::environment(),
            secret_key: None,
            operator_keys: OperatorKeysConfig::default(),
            relay_release: None,
            relays: RelaysConfig::default(),
            release_dir: None,
            release_key: None,
            cloudflared: CloudflaredConfig::default(),
            tunnels: TunnelsConfig::default(),
            ssh_domain: None,
            placement: PlacementConfig::default(),
            rate_limits: RateLimitConfig::default(),
            instances: InstancesConfig::default(),
            loopback_origins: Vec::new(),
            billing: None,
            notices: notify::NoticesConfig::default(),
            listener: byo_listen::Limits::default(),
        }
    }
}

impl Config {
    /// The providers this configuration names. Reads the GCP key file, so it can fail.
    pub fn providers(&self) -> Result<Providers, ProviderError> {
        let relays: Arc<dyn RelayProvider> = match (&self.relays.provider, &self.relays.gcp) {
            (RelayProviderKind::Gcp, Some(gcp)) => Arc::new(gcp::GcpRelays::new(gcp.clone())?),
            (RelayProviderKind::Gcp, None) => {
                return Err(ProviderError(
                    "relays.provider is gcp but [relays.gcp] is missing".into(),
                ));
            }
            (RelayProviderKind::Local, _) => Arc::new(local::LocalRelays::default()),
        };
        let tunnels: Arc<dyn TunnelProvider> = match &self.tunnels.cloudflare {
            Some(cf) => Arc::new(cloudflare::CloudflareTunnels::new(cf.clone())),
            None => Arc::new(local::LocalTunnels::default()),
        };
        Ok(Providers { relays, tunnels })
    }

    /// Defaults, then `file` (if given; it must exist), then the environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let mut fig = Figment::new();
        if let Some(path) = file {
            if !path.exists() {
                return Err(ConfigError(format!(
                    "configuration file {} does not exist",
                    path.display()
                )));
            }
            fig = fig.merge(Toml::file(path));
        }
        // Only our own keys: BYO_TEST_* and friends belong to other programs. A typo in the
        // file is refused (deny_unknown_fields); one in the environment is ignored.
        let env = Env::prefixed("BYO_").split("__").filter(|key| {
            let key = key.as_str().to_ascii_lowercase();
            let top = key
                .split("__")
                .next()
                .and_then(|k| k.split('.').next())
                .unwrap_or_default();
            KEYS.contains(&top)
        });
        fig.merge(env)
            .extract::<Config>()
            .map_err(|e| ConfigError(e.to_string()))
            .and_then(|c| c.validate().map(|()| c).map_err(ConfigError))
    }

    fn validate(&self) -> Result<(), String> {
        let url = self.database_url.expose_secret();
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres:")
            || url.starts_with("postgresql:"))
        {
            return Err("database_url must start with sqlite:// or postgres://".to_owned());
        }
        if !(self.public_url.starts_with("http://") || self.public_url.starts_with("https://")) {
            return Err("public_url must start with http:// or https://".to_owned());
        }
        if self.session_hours <= 0 {
            return Err("session_hours must be positive".to_owned());
        }
        if self.placement.max_heartbeat_age_secs == 0 || self.placement.bench_after_failures == 0 {
            return Err(
                "placement.max_heartbeat_age_secs and placement.bench_after_failures must be positive"
                    .to_owned(),
            );
        }
        if self.instances.max_per_account == 0 {
            return Err("instances.max_per_account must be positive".to_owned());
        }
        if !(1..=MAX_QUEUE_HOURS).contains(&self.instances.queue_expires_after_hours) {
            return Err(format!(
                "instances.queue_expires_after_hours must be between 1 and {MAX_QUEUE_HOURS} (30 days)"
            ));
        }
        if self.operator_keys.validity_days <= 0 {
            return Err("operator_keys.validity_days must be positive".to_owned());
        }
        for key in &self.operator_keys.signing_keys {
            ssh_key::PublicKey::from_openssh(key.trim()).map_err(|e| {
                format!("operator_keys.signing_keys holds a key that does not parse ({e}): {key}")
            })?;
        }
        if self.relays.provider == RelayProviderKind::Gcp && self.relays.gcp.is_none() {
            return Err("relays.provider = \"gcp\" needs a [relays.gcp] section".to_owned());
        }
        if let Some(d) = &self.ssh_domain {
            let ok = !d.is_empty()
                && d.len() <= 200
                && d.split('.').all(|label| {
                    !label.is_empty()
                        && label
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !ok {
                return Err(format!(
                    "ssh_domain must be a DNS name, like ssh.example.com: {d:?}"
                ));
            }
        }
        if let Some(b) = &self.billing {
            if b.price_cents_per_hour == 0 {
                return Err("billing.price_cents_per_hour must be positive".to_owned());
            }
            if b.owner_share_bps > 10_000 {
                return Err(format!(
                    "billing.owner_share_bps is in basis points, at most 10000 (100 %): {}",
                    b.owner_share_bps
                ));
            }
            if b.payment_grace_hours > 24 * 30 {
                return Err(format!(
                    "billing.payment_grace_hours must be at most 720 (30 days): {}",
                    b.payment_grace_hours
                ));
            }
            if b.invoice_threshold_cents == 0 {
                return Err(
                    "billing.invoice_threshold_cents must be positive (it is the balance at which an account is invoiced before its month ends)"
                        .to_owned(),
                );
            }
            if b.currency.len() != 3 || !b.currency.bytes().all(|c| c.is_ascii_lowercase()) {
                return Err(format!(
                    "billing.currency must be a lower-case ISO 4217 code, like usd: {:?}",
                    b.currency
                ));
            }
        }
        self.notices.validate()?;
        if let Some(key) = &self.secret_key {
            crate::seal::Sealer::from_hex(key.expose_secret()).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The domain under which instances' SSH names live: `ssh_domain`, or the host part of
    /// `public_url`.
    pub fn ssh_domain(&self) -> String {
        if let Some(d) = self
            .ssh_domain
            .as_deref()
            .map(str::trim)
            .filter(|d| !d.is_empty())
        {
            return d.trim_matches('.').to_ascii_lowercase();
        }
        let url = self.public_url.as_str();
        let after = url.split_once("://").map_or(url, |(_, rest)| rest);
        after
            .split(['/', ':'])
            .next()
            .unwrap_or(after)
            .to_ascii_lowercase()
    }

    /// Whether a state-changing request's Origin is this server's: `public_url`'s origin,
    /// or (`byo up` only) another name of its loopback listener.
    pub fn accepts_origin(&self, origin: &str) -> bool {
        origin == self.public_origin() || self.loopback_origins.iter().any(|o| o == origin)
    }

    /// The origin (scheme://host[:port]) of `public_url`, for Origin checks.
    pub fn public_origin(&self) -> &str {
        let url = self.public_url.as_str();
        let after_scheme = url.find("://").map_or(0, |i| i + 3);
        match url[after_scheme..].find('/') {
            Some(i) => &url[..after_scheme + i],
            None => url,
        }
    }
}

/// The names a browser may reach a loopback listener by besides `localhost` (which `byo
/// up`'s public URL says): `byo up`'s [`Config::loopback_origins`]. None for a listener
/// that is not on loopback.
pub fn loopback_origins(addr: SocketAddr) -> Vec<String> {
    if !addr.ip().is_loopback() {
        return Vec::new();
    }
    let port = addr.port();
    vec![
        format!("http://127.0.0.1:{port}"),
        format!("http://[::1]:{port}"),
    ]
}

/// Why the configuration could not be loaded, in words.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {
    use super::*;

    #[test]
    fn the_file_then_the_environment_override_defaults() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "byo.toml",
                r#"
                listen = "0.0.0.0:9000"
                database_url = "postgres://byo:pw@db:5432/byo"
                public_url = "https://app.example.com/"
                [password_hashing]
                memory_kib = 1024
                iterations = 1
                parallelism = 1
                "#,
            )?;
            jail.set_env("BYO_LISTEN", "127.0.0.1:9999");
            jail.set_env("BYO_LOG_FORMAT", "json");
            jail.set_env("BYO_PASSWORD_HASHING__ITERATIONS", "3");
            let c = Config::load(Some(Path::new("byo.toml"))).expect("loads");
            assert_eq!(c.listen, "127.0.0.1:9999".parse().unwrap());
            assert_eq!(c.log_format, LogFormat::Json);
            assert_eq!(c.password_hashing.memory_kib, 1024);
            assert_eq!(
                c.password_hashing.iterations, 3,
                "nested keys come through the environment"
            );
            assert_eq!(c.public_origin(), "https://app.example.com");
            assert!(
                !format!("{c:?}").contains("pw@db"),
                "the database URL is redacted"
            );
            Ok(())
        });
    }

    #[test]
    fn bad_values_are_refused_with_a_clear_message() {
        figment::Jail::expect_with(|jail| {
            jail.set_env("BYO_DATABASE_URL", "mysql://x");
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("database_url must start with"), "{err}");
            jail.set_env("BYO_DATABASE_URL", "sqlite://x.db");
            jail.set_env("BYO_LISTEN", "not an address");
            assert!(Config::load(None).is_err());
            jail.set_env("BYO_LISTEN", "127.0.0.1:1");
            jail.set_env("BYO_TEST_POSTGRES_URL", "postgres://elsewhere");
            assert!(
                Config::load(None).is_ok(),
                "other programs' BYO_ variables are ignored"
            );
            jail.set_env("BYO_PASSWORD_HASHING__MEMORY_KIB", "512");
            let partial = Config::load(None).expect("one nested key alone is enough");
            assert_eq!(
                (
                    partial.password_hashing.memory_kib,
                    partial.password_hashing.iterations
                ),
                (512, 2)
            );
            jail.create_file("typo.toml", "listne = \"127.0.0.1:1\"")?;
            let err = Config::load(Some(Path::new("typo.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("listne"), "{err}");
            // `byo up`'s own setting (issue #42): no file and no variable turns it on.
            jail.create_file("up.toml", "test_hosts_for_everyone = true")?;
            let err = Config::load(Some(Path::new("up.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("test_hosts_for_everyone"), "{err}");
            jail.set_env("BYO_TEST_HOSTS_FOR_EVERYONE", "true");
            assert!(!Config::load(None).unwrap().test_hosts_for_everyone);
            jail.create_file("mail.toml", "signup_without_mail = true")?;
            let err = Config::load(Some(Path::new("mail.toml")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("signup_without_mail"), "{err}");
            jail.set_env("BYO_SIGNUP_WITHOUT_MAIL", "true");
            assert!(!Config::load(None).unwrap().signup_without_mail);
            Ok(())
        });
        let err = Config::load(Some(Path::new("/nonexistent/byo.toml"))).unwrap_err();
        assert!(err.to_string().contains("does not exist"));
    }
}
