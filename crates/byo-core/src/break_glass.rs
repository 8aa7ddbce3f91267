//! The last resort when the operator-key list has expired (#39, 5; M's expiry, I's relay
//! path): a short-lived OpenSSH user certificate, signed by a key the host already trusts to
//! sign its lists, admitted only from the relay's end of the tunnel and only while the list
//! the host holds has expired.
//!
//! Why a certificate and why only then:
//! - An expired list locks every operator out at once (sshd's `expiry-time`), break glass
//!   included, since break glass is the same key. Renewal needs the server to push the signed
//!   list through each agent's API; when that path is what is broken, only the relay and the
//!   host's own sshd are left. sshd can check a certificate against a CA line by itself, with
//!   no agent and no server.
//! - The CA is the list's signing trust (the pin, or the successors the held list names), so
//!   nobody gains power by it: whoever signs can already sign a list adding their key. One
//!   signature suffices although a list may need `threshold` of them (a certificate carries
//!   one); that is why the lines are written only once the held list has expired, and go at
//!   the first list that has not.
//! - The lines carry `from="10.8.0.1"` (only the relay: IAP to it is a credential of its own)
//!   and `principals="<slug>"` (a certificate opens the hosts it names, not the fleet); the
//!   certificate itself carries `source-address` and lasts at most [`MAX_MINUTES`].
//! - sshd logs each login with the certificate's ID and serial, and the fingerprint of the
//!   operator's key, which the agent reports on the beat like every other login to `spark`.

use chrono::{DateTime, Utc};
use ssh_key::certificate::CertType;
use ssh_key::{Certificate, PublicKey};

/// The relay's end of every host's WireGuard tunnel: where break glass comes from.
pub const RELAY_TUNNEL_ADDRESS: &str = "10.8.0.1";

/// The longest a break-glass certificate may be valid.
pub const MAX_MINUTES: u32 = 60;

/// The default validity of one.
pub const DEFAULT_MINUTES: u32 = 15;

/// How far back a certificate's validity starts, for a host whose clock runs behind.
pub const BACKDATE_MINUTES: u32 = 5;

/// What the host needs to write the CA lines: the name a certificate must carry for this
/// host, and the keys it trusts to sign.
#[derive(Clone, Copy, Debug)]
pub struct Trust<'a> {
    pub host: &'a str,
    pub signers: &'a [PublicKey],
}

/// A host's slug as a certificate principal: what the server's slugs look like (lower-case
/// letters, digits, dashes), so nothing in it can close the option's quotes.
pub fn is_host_principal(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
}

/// The authorized_keys lines that admit a break-glass certificate for `trust.host`, one per
/// signing key. Empty when the slug does not read as one (never a line that could widen).
pub fn authorized_lines(trust: Trust<'_>) -> String {
    if !is_host_principal(trust.host) {
        return String::new();
    }
    let mut out = String::from(
        "# The operator-key list has expired: break glass from the relay, with a certificate its signer issued.\n",
    );
    for signer in trust.signers {
        let Ok(key) = signer.to_openssh() else {
            continue;
        };
        let key: String = key.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
        out.push_str(&format!(
            "cert-authority,principals=\"{}\",from=\"{RELAY_TUNNEL_ADDRESS}\" {key} byo-break-glass\n",
            trust.host
        ));
    }
    out
}

/// Why a request for a certificate is refused before anything is signed, or what it came
/// back without.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    NoHost,
    BadHost(String),
    BadDuration(u32),
    BadOperator,
    Mismatch(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NoHost => write!(f, "name at least one host (--host spark-7)"),
            Refusal::BadHost(h) => write!(
                f,
                "{h:?} is not a host's name: lower-case letters, digits and dashes"
            ),
            Refusal::BadDuration(m) => {
                write!(f, "a certificate lasts 1 to {MAX_MINUTES} minutes, not {m}")
            }
            Refusal::BadOperator => write!(
                f,
                "the operator's name must be 1 to 64 printable characters without spaces"
            ),
            Refusal::Mismatch(what) => {
                write!(f, "the certificate does not say what was asked: {what}")
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// What one certificate is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub hosts: Vec<String>,
    /// Who asks: into the key ID, which sshd logs with every login.
    pub operator: String,
    pub minutes: u32,
    pub serial: u64,
}

impl Request {
    pub fn check(&self) -> Result<(), Refusal> {
        if self.hosts.is_empty() {
            return Err(Refusal::NoHost);
        }
        if let Some(h) = self.hosts.iter().find(|h| !is_host_principal(h)) {
            return Err(Refusal::BadHost(h.clone()));
        }
        if self.minutes == 0 || self.minutes > MAX_MINUTES {
            return Err(Refusal::BadDuration(self.minutes));
        }
        if self.operator.is_empty()
            || self.operator.len() > 64
            || self
                .operator
                .chars()
                .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(Refusal::BadOperator);
        }
        Ok(())
    }

    pub fn key_id(&self) -> String {
        format!("break-glass:{}:{}", self.operator, self.hosts.join(","))
    }

    /// `ssh-keygen`'s arguments after `-s <signer>` (and `-U` when the signer is in an
    /// agent), before the public key to certify: what production runs, and the tests too.
    pub fn keygen_args(&self) -> Vec<String> {
        vec![
            "-I".into(),
            self.key_id(),
            "-n".into(),
            self.hosts.join(","),
            "-V".into(),
            format!("-{BACKDATE_MINUTES}m:+{}m", self.minutes),
            "-z".into(),
            self.serial.to_string(),
            "-O".into(),
            "clear".into(),
            "-O".into(),
            "permit-pty".into(),
            "-O".into(),
            format!("source-address={RELAY_TUNNEL_ADDRESS}/32"),
        ]
    }

    /// Read back what ssh-keygen wrote before anyone relies on it: a user certificate for
    /// `subject`, signed by `signer`, naming exactly the hosts asked for, bound to the relay,
    /// and valid now for no longer than asked.
    pub fn verify(
        &self,
        cert: &Certificate,
        subject: &PublicKey,
        signer: &PublicKey,
        now: DateTime<Utc>,
    ) -> Result<(), Refusal> {
        let mismatch = |what: &str| Err(Refusal::Mismatch(what.into()));
        if cert.cert_type() != CertType::User {
            return mismatch("not a user certificate");
        }
        if cert.public_key() != subject.key_data() {
            return mismatch("it certifies another key");
        }
        if cert.signature_key() != signer.key_data()
            || cert
                .validate_at(
                    now.timestamp().max(0) as u64,
                    [&signer.fingerprint(Default::default())],
                )
                .is_err()
        {
            return mismatch("it does not verify against the signing key, now");
        }
        let mut named = cert.valid_principals().to_vec();
        let mut asked = self.hosts.clone();
        named.sort();
        asked.sort();
        if named != asked {
            return mismatch("it names other hosts");
        }
        if cert.key_id() != self.key_id() || cert.serial() != self.serial {
            return mismatch("its ID or serial differs");
        }
        let bound = cert
            .critical_options()
            .get("source-address")
            .map(String::as_str);
        if bound != Some(&format!("{RELAY_TUNNEL_ADDRESS}/32")) {
            return mismatch("it is not bound to the relay");
        }
        // That it is valid now was checked with the signature (`validate_at`); what is left
        // is that it lasts no longer than asked, with the backdating and a minute's slack.
        let longest = u64::from(self.minutes + BACKDATE_MINUTES) * 60 + 60;
        if cert.valid_before().saturating_sub(cert.valid_after()) > longest {
            return mismatch("its validity is not the window asked for");
        }
        Ok(())
    }
}
