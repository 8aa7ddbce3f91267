//! The signed operator-key list (M): its canonical bytes, its signature envelope, and the
//! one verifier both the agent and the backend use.
//!
//! A list is canonical JSON (fixed field order, keys sorted, no whitespace); it is signed
//! as those exact bytes with SSHSIG — what `ssh-keygen -Y sign -n operator-keys@byo`
//! produces — and travels inside an envelope carrying the bytes as a string and any number
//! of signatures. The threshold is inside the signed bytes, so nobody holding only the
//! envelope can lower it; a key that signed twice counts once.
//!
//! Beyond the design, a list carries `expires`: a list past it is refused, so withholding
//! updates cannot freeze a removed operator in place, and each authorized_keys line
//! carries `expiry-time` so sshd enforces the same date.

use std::collections::BTreeSet;
use std::fmt;

use chrono::{DateTime, Timelike, Utc};
use serde::{Deserialize, Serialize};
use ssh_key::{Algorithm, HashAlg, PublicKey, SshSig};

/// The SSHSIG namespace every list is signed in.
pub const NAMESPACE: &str = "operator-keys@byo";
/// The `kind` of a list.
pub const KIND: &str = "byo-operator-keys/v1";
/// Largest envelope accepted, and largest list body.
pub const MAX_ENVELOPE_BYTES: usize = 256 * 1024;
pub const MAX_BODY_BYTES: usize = 64 * 1024;
pub const MAX_KEYS: usize = 256;
const MAX_FIELD_CHARS: usize = 128;
/// Operator login keys: Ed25519, in software or on a security key. RSA, DSA and ECDSA are
/// refused, so one policy holds on every host whatever its sshd allows.
pub const ALLOWED_KEY_TYPES: &[&str] = &["ssh-ed25519", "sk-ssh-ed25519@openssh.com"];

/// The list as signed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyList {
    pub kind: String,
    /// Which installation this list is for (a staging list must not open production).
    pub environment: String,
    pub version: u64,
    pub issued_at: DateTime<Utc>,
    pub expires: DateTime<Utc>,
    /// Distinct trusted signatures needed (1 today).
    pub threshold: u32,
    /// Every operator's keys, one per machine, sorted.
    pub keys: Vec<OperatorKey>,
    /// Signing-key rotation (M.13): the keys that sign every list after this one, named
    /// inside the signed bytes by the keys trusted now. A holder that applies this list
    /// trusts these instead of its pin; absent, the pin stands. Carried forward by every
    /// later change, so a rotation holds until the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_signing_keys: Option<Vec<String>>,
}

/// A list this close to its `expires` is warned about — on /admin, on a host's problems and
/// by `byo keys sign` — in steps of 14, 7 and 1 days: time enough to sign the next one.
pub const KEY_LIST_EXPIRY_WARNING_DAYS: i64 = 14;

/// How urgent a list expiring at `expires` is at `now`: `None` beyond
/// [`KEY_LIST_EXPIRY_WARNING_DAYS`], else the step it is within (14, 7 or 1 days), or 0 once
/// it has expired.
pub fn expiry_warning(expires: DateTime<Utc>, now: DateTime<Utc>) -> Option<i64> {
    let left = expires - now;
    [0, 1, 7, KEY_LIST_EXPIRY_WARNING_DAYS]
        .into_iter()
        .find(|d| left <= chrono::Duration::days(*d))
}

/// The most successor signing keys a list may name.
pub const MAX_SIGNING_KEYS: usize = 8;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorKey {
    /// The operator's user sub: who a login with this key is.
    pub user_sub: String,
    /// Which machine of theirs this key lives on.
    pub label: String,
    /// `<algorithm> <base64>`: no options, no comment.
    pub public_key: String,
}

/// The envelope: the list's exact bytes and the signatures over them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedList {
    pub body: String,
    /// Armored SSHSIG signatures (`-----BEGIN SSH SIGNATURE-----`).
    pub signatures: Vec<String>,
}

/// Why a list was refused. Every refusal leaves the holder's state as it was.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    Oversized,
    Malformed(String),
    NotCanonical,
    WrongKind,
    WrongEnvironment {
        expected: String,
        found: String,
    },
    /// No signing key is trusted yet (a host enrolled before signed lists).
    NoTrustedKey,
    /// Fewer distinct trusted signatures than the threshold.
    BadSignature {
        valid: usize,
        threshold: u32,
    },
    Expired {
        expires: DateTime<Utc>,
    },
    Empty,
    TooManyKeys,
    OlderVersion {
        held: u64,
        offered: u64,
    },
    SameVersionDifferentKeys {
        version: u64,
    },
    /// The successor signing keys are not a sorted, distinct list of 1 to
    /// [`MAX_SIGNING_KEYS`] bare Ed25519 keys.
    BadSuccessor(String),
    /// A list that changes who signs next must carry the successors' own signatures too
    /// (threshold of them): proof that someone holds the keys every later list needs.
    SuccessorUnproven {
        valid: usize,
        threshold: u32,
    },
    KeyOptions(String),
    DisallowedKeyType(String),
    DuplicateKey(String),
    ControlCharacters(String),
    BadKey(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Oversized => write!(f, "the list is larger than {MAX_BODY_BYTES} bytes"),
            Refusal::Malformed(why) => write!(f, "the list is malformed: {why}"),
            Refusal::NotCanonical => f.write_str("the list is not in canonical form"),
            Refusal::WrongKind => write!(f, "not an operator-key list (kind must be {KIND})"),
            Refusal::WrongEnvironment { expected, found } => {
                write!(
                    f,
                    "the list is for environment {found:?}, this is {expected:?}"
                )
            }
            Refusal::NoTrustedKey => f.write_str(
                "no signing key is trusted on this host; an operator must set one over the tunnel",
            ),
            Refusal::BadSignature { valid, threshold } => write!(
                f,
                "{valid} valid signature(s) from trusted keys, {threshold} needed"
            ),
            Refusal::Expired { expires } => write!(f, "the list expired at {expires}"),
            Refusal::Empty => f.write_str("the list has no keys; it would lock every operator out"),
            Refusal::TooManyKeys => write!(f, "the list has more than {MAX_KEYS} keys"),
            Refusal::OlderVersion { held, offered } => {
                write!(f, "version {offered} is older than the held version {held}")
            }
            Refusal::SameVersionDifferentKeys { version } => {
                write!(f, "version {version} is already held with different keys")
            }
            Refusal::BadSuccessor(why) => write!(f, "the successor signing keys: {why}"),
            Refusal::SuccessorUnproven { valid, threshold } => write!(
                f,
                "the list names new signing keys but carries {valid} signature(s) from them, \
                 {threshold} needed: every successor must sign the list that names it"
            ),
            Refusal::KeyOptions(k) => write!(f, "key {k} carries options or a comment"),
            Refusal::DisallowedKeyType(t) => {
                write!(
                    f,
                    "key type {t} is not allowed (ssh-ed25519 or sk-ssh-ed25519 only)"
                )
            }
            Refusal::DuplicateKey(fp) => write!(f, "key {fp} appears more than once"),
            Refusal::ControlCharacters(field) => {
                write!(f, "{field} contains control characters")
            }
            Refusal::BadKey(why) => write!(f, "a key does not parse: {why}"),
        }
    }
}

impl std::error::Error for Refusal {}

/// A key that passed every check, with its fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckedKey {
    pub key: OperatorKey,
    pub public_key: PublicKey,
    /// `SHA256:…`, as sshd logs it.
    pub fingerprint: String,
}

/// Show `s` with control characters escaped, for a terminal that must not be driven by
/// what it prints.
pub fn escape_control(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

fn check_text(field: &str, value: &str) -> Result<(), Refusal> {
    if value.chars().any(char::is_control) {
        return Err(Refusal::ControlCharacters(format!(
            "{field} {:?}",
            escape_control(value)
        )));
    }
    if value.is_empty() || value.chars().count() > MAX_FIELD_CHARS {
        return Err(Refusal::Malformed(format!(
            "{field} must be 1 to {MAX_FIELD_CHARS} characters"
        )));
    }
    Ok(())
}

/// Check one operator key: bare `<algorithm> <base64>`, an allowed type, printable fields.
pub fn check_key(key: &OperatorKey) -> Result<CheckedKey, Refusal> {
    check_text("user_sub", &key.user_sub)?;
    check_text("label", &key.label)?;
    if key.public_key.chars().any(char::is_control) {
        return Err(Refusal::ControlCharacters("public_key".into()));
    }
    let fields: Vec<&str> = key.public_key.split(' ').collect();
    if fields.len() != 2 {
        return Err(Refusal::KeyOptions(escape_control(&key.public_key)));
    }
    if !ALLOWED_KEY_TYPES.contains(&fields[0]) {
        return Err(Refusal::DisallowedKeyType(fields[0].to_owned()));
    }
    let public_key =
        PublicKey::from_openssh(&key.public_key).map_err(|e| Refusal::BadKey(e.to_string()))?;
    match public_key.algorithm() {
        Algorithm::Ed25519 | Algorithm::SkEd25519 => {}
        other => return Err(Refusal::DisallowedKeyType(other.to_string())),
    }
    let fingerprint = public_key.fingerprint(HashAlg::Sha256).to_string();
    Ok(CheckedKey {
        key: key.clone(),
        public_key,
        fingerprint,
    })
}

impl KeyList {
    /// The canonical bytes: what is signed, stored and served.
    pub fn to_canonical(&self) -> String {
        let mut sorted = self.clone();
        sorted.keys.sort();
        serde_json::to_string(&sorted).expect("a KeyList always serialises")
    }

    /// Parse canonical bytes; anything else (extra fields, other spacing, unsorted keys) is
    /// refused, so one list has exactly one byte form.
    pub fn from_canonical(body: &str) -> Result<KeyList, Refusal> {
        if body.len() > MAX_BODY_BYTES {
            return Err(Refusal::Oversized);
        }
        let list: KeyList =
            serde_json::from_str(body).map_err(|e| Refusal::Malformed(e.to_string()))?;
        if list.to_canonical() != body {
            return Err(Refusal::NotCanonical);
        }
        Ok(list)
    }

    /// Every check that needs no signature and no clock: kind, size, each key.
    pub fn check(&self) -> Result<Vec<CheckedKey>, Refusal> {
        if self.kind != KIND {
            return Err(Refusal::WrongKind);
        }
        check_text("environment", &self.environment)?;
        if self.keys.is_empty() {
            return Err(Refusal::Empty);
        }
        if self.keys.len() > MAX_KEYS {
            return Err(Refusal::TooManyKeys);
        }
        if self.threshold == 0 {
            return Err(Refusal::Malformed("threshold must be at least 1".into()));
        }
        self.successors()?;
        let mut seen = BTreeSet::new();
        let mut out = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let checked = check_key(key)?;
            if !seen.insert(checked.public_key.key_data().clone()) {
                return Err(Refusal::DuplicateKey(checked.fingerprint));
            }
            out.push(checked);
        }
        Ok(out)
    }

    /// The successor signing keys this list names, parsed: sorted, distinct, 1 to
    /// [`MAX_SIGNING_KEYS`] bare Ed25519 keys. `None` when it names none.
    pub fn successors(&self) -> Result<Option<Vec<PublicKey>>, Refusal> {
        let Some(lines) = &self.next_signing_keys else {
            return Ok(None);
        };
        if lines.is_empty() || lines.len() > MAX_SIGNING_KEYS {
            return Err(Refusal::BadSuccessor(format!(
                "1 to {MAX_SIGNING_KEYS} keys, not {}",
                lines.len()
            )));
        }
        if lines.windows(2).any(|w| w[0] >= w[1]) {
            return Err(Refusal::BadSuccessor("not sorted and distinct".into()));
        }
        lines
            .iter()
            .map(|line| {
                if line.chars().any(char::is_control) || line.split(' ').count() != 2 {
                    return Err(Refusal::BadSuccessor(format!(
                        "{:?} is not a bare `<type> <base64>` key",
                        escape_control(line)
                    )));
                }
                let key = PublicKey::from_openssh(line)
                    .map_err(|e| Refusal::BadSuccessor(e.to_string()))?;
                match key.algorithm() {
                    Algorithm::Ed25519 | Algorithm::SkEd25519 => Ok(key),
                    other => Err(Refusal::BadSuccessor(format!("{other} is not allowed"))),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The authorized_keys file for the `spark` user: one line per key, each carrying
    /// `expiry-time` and a comment naming the operator, so sshd both enforces the list's
    /// expiry and logs a fingerprint that maps to a person.
    pub fn authorized_keys(&self) -> String {
        let expiry = self.expires.format("%Y%m%d%H%M%SZ");
        let mut out = format!(
            "# Managed by byo: operator-key list version {} ({}). Do not edit; changes are overwritten.\n",
            self.version, self.environment
        );
        let mut keys = self.keys.clone();
        keys.sort();
        for k in &keys {
            out.push_str(&format!(
                "expiry-time=\"{expiry}\" {} byo-operator:{}:{}\n",
                k.public_key,
                k.user_sub,
                k.label.replace(' ', "_")
            ));
        }
        out
    }

    /// authorized_keys as a host writes it at `now`: the list's own lines and, only once the
    /// list has expired, the lines that admit a break-glass certificate for this host
    /// ([`crate::break_glass`]). The first list that has not expired takes them away.
    pub fn authorized_keys_at(
        &self,
        now: DateTime<Utc>,
        break_glass: Option<crate::break_glass::Trust<'_>>,
    ) -> String {
        let mut out = self.authorized_keys();
        if let Some(trust) = break_glass
            && now >= self.expires
        {
            out.push_str(&crate::break_glass::authorized_lines(trust));
        }
        out
    }
}

/// One change to the newest list (M.10).
#[derive(Clone, Debug)]
pub enum Change {
    /// Add a key for the operator making the change.
    Add {
        user_sub: String,
        label: String,
        public_key: String,
    },
    /// Remove one of the changing operator's own keys, by fingerprint.
    Remove {
        user_sub: String,
        fingerprint: String,
    },
    /// Remove a key whoever it belongs to (a superadmin, I: "leaving is one action").
    RemoveAny { fingerprint: String },
    /// Remove every key of an operator who is leaving (their role revoked).
    Depart { user_sub: String },
    /// Name the keys that sign every list after this one (M.13).
    RotateSigningKeys { successors: Vec<String> },
    /// The same keys again, as a new version with a fresh expiry (renewal before a list
    /// lapses: every host would otherwise refuse every operator).
    Renew,
}

/// Why a change was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeRefusal {
    /// The key itself is not acceptable (type, options, control characters…).
    Key(Refusal),
    AlreadyListed(String),
    NotFound(String),
    /// Nobody grants or removes access in someone else's name.
    NotYours(String),
    /// A list with no keys would leave a box nobody can administer (M.2).
    NoOperatorLeft,
}

impl fmt::Display for ChangeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChangeRefusal::Key(r) => r.fmt(f),
            ChangeRefusal::AlreadyListed(fp) => write!(f, "key {fp} is already on the list"),
            ChangeRefusal::NotFound(fp) => write!(f, "key {fp} is not on the list"),
            ChangeRefusal::NotYours(fp) => write!(f, "key {fp} belongs to another operator"),
            ChangeRefusal::NoOperatorLeft => {
                f.write_str("that would leave no operator key: every host would be unadministrable")
            }
        }
    }
}

impl std::error::Error for ChangeRefusal {}

impl KeyList {
    /// The list `change` makes of `base` (the newest list, if any), as `version`, issued
    /// `now` and valid for `validity`. Pure: the caller stores the result's canonical bytes.
    pub fn with_change(
        base: Option<&KeyList>,
        change: &Change,
        environment: &str,
        version: u64,
        now: DateTime<Utc>,
        validity: chrono::Duration,
    ) -> Result<KeyList, ChangeRefusal> {
        let mut keys = base.map(|b| b.keys.clone()).unwrap_or_default();
        let mut next_signing_keys = base.and_then(|b| b.next_signing_keys.clone());
        let fingerprint_of = |k: &OperatorKey| check_key(k).map(|c| c.fingerprint).ok();
        match change {
            Change::Add {
                user_sub,
                label,
                public_key,
            } => {
                let key = OperatorKey {
                    user_sub: user_sub.clone(),
                    label: label.trim().to_owned(),
                    public_key: public_key.trim().to_owned(),
                };
                let checked = check_key(&key).map_err(ChangeRefusal::Key)?;
                if keys
                    .iter()
                    .any(|k| fingerprint_of(k).as_deref() == Some(&checked.fingerprint))
                {
                    return Err(ChangeRefusal::AlreadyListed(checked.fingerprint));
                }
                keys.push(key);
            }
            Change::Remove {
                user_sub,
                fingerprint,
            } => {
                let i = keys
                    .iter()
                    .position(|k| fingerprint_of(k).as_deref() == Some(fingerprint))
                    .ok_or_else(|| ChangeRefusal::NotFound(fingerprint.clone()))?;
                if &keys[i].user_sub != user_sub {
                    return Err(ChangeRefusal::NotYours(fingerprint.clone()));
                }
                keys.remove(i);
            }
            Change::RemoveAny { fingerprint } => {
                let i = keys
                    .iter()
                    .position(|k| fingerprint_of(k).as_deref() == Some(fingerprint))
                    .ok_or_else(|| ChangeRefusal::NotFound(fingerprint.clone()))?;
                keys.remove(i);
            }
            Change::Depart { user_sub } => {
                let before = keys.len();
                keys.retain(|k| &k.user_sub != user_sub);
                if keys.len() == before {
                    return Err(ChangeRefusal::NotFound(format!("any key of {user_sub}")));
                }
            }
            Change::Renew => {
                if base.is_none() {
                    return Err(ChangeRefusal::NotFound("a list to renew".into()));
                }
            }
            Change::RotateSigningKeys { successors } => {
                let mut lines: Vec<String> = successors
                    .iter()
                    .map(|l| {
                        PublicKey::from_openssh(l.trim())
                            .map(|mut k| {
                                k.set_comment("");
                                k.to_openssh().unwrap_or_default()
                            })
                            .map_err(|e| ChangeRefusal::Key(Refusal::BadSuccessor(e.to_string())))
                    })
                    .collect::<Result<_, _>>()?;
                lines.sort();
                lines.dedup();
                next_signing_keys = Some(lines);
            }
        }
        if keys.is_empty() {
            return Err(ChangeRefusal::NoOperatorLeft);
        }
        keys.sort();
        let issued_at = now.with_nanosecond(0).unwrap_or(now);
        let list = KeyList {
            kind: KIND.to_owned(),
            environment: environment.to_owned(),
            version,
            issued_at,
            expires: issued_at + validity,
            threshold: base.map_or(1, |b| b.threshold.max(1)),
            keys,
            next_signing_keys,
        };
        list.successors().map_err(ChangeRefusal::Key).map(|_| list)
    }
}

impl SignedList {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a SignedList always serialises")
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<SignedList, Refusal> {
        if bytes.len() > MAX_ENVELOPE_BYTES {
            return Err(Refusal::Oversized);
        }
        serde_json::from_slice(bytes).map_err(|e| Refusal::Malformed(e.to_string()))
    }
}

/// What the holder already has, for the replay rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub version: u64,
    pub keys: Vec<OperatorKey>,
}

impl From<&KeyList> for Held {
    fn from(list: &KeyList) -> Self {
        let mut keys = list.keys.clone();
        keys.sort();
        Held {
            version: list.version,
            keys,
        }
    }
}

/// A list that passed every rule.
#[derive(Clone, Debug)]
pub struct Verified {
    pub list: KeyList,
    pub keys: Vec<CheckedKey>,
}

/// Count the distinct trusted keys that signed `body` in [`NAMESPACE`].
pub fn valid_signers(body: &str, signatures: &[String], trusted: &[PublicKey]) -> usize {
    let mut signers = BTreeSet::new();
    for armored in signatures {
        let Ok(sig) = SshSig::from_pem(armored) else {
            continue;
        };
        if sig.namespace() != NAMESPACE {
            continue;
        }
        for key in trusted {
            if key.key_data() == sig.public_key()
                && key.verify(NAMESPACE, body.as_bytes(), &sig).is_ok()
            {
                signers.insert(key.key_data().clone());
            }
        }
    }
    signers.len()
}

/// The signing keys a holder trusts for the list after `held`: the successors `held`
/// names (it was verified against the trust before it, so trust only ever moves through
/// signed lists), else the keys pinned at enrolment. Nothing else replaces a pin.
pub fn trusted_after(pinned: &[PublicKey], held: Option<&KeyList>) -> Vec<PublicKey> {
    match held.and_then(|l| l.successors().ok().flatten()) {
        Some(successors) => successors,
        None => pinned.to_vec(),
    }
}

/// The one verifier (M.7). `trusted` is the signing key pinned at enrolment; `held` what
/// this holder applied last. Pure: the caller persists nothing unless this returns `Ok`.
pub fn verify(
    envelope: &[u8],
    trusted: &[PublicKey],
    environment: &str,
    held: Option<&Held>,
    now: DateTime<Utc>,
) -> Result<Verified, Refusal> {
    let signed = SignedList::from_bytes(envelope)?;
    let list = KeyList::from_canonical(&signed.body)?;
    if trusted.is_empty() {
        return Err(Refusal::NoTrustedKey);
    }
    let valid = valid_signers(&signed.body, &signed.signatures, trusted);
    if valid == 0 || valid < list.threshold as usize {
        return Err(Refusal::BadSignature {
            valid,
            threshold: list.threshold.max(1),
        });
    }
    let keys = list.check()?;
    if let Some(successors) = list.successors()? {
        let same = |a: &[PublicKey], b: &[PublicKey]| {
            let set = |k: &[PublicKey]| {
                k.iter()
                    .map(|k| k.key_data().clone())
                    .collect::<BTreeSet<_>>()
            };
            set(a) == set(b)
        };
        if !same(&successors, trusted) {
            let proven = valid_signers(&signed.body, &signed.signatures, &successors);
            if proven < list.threshold.max(1) as usize {
                return Err(Refusal::SuccessorUnproven {
                    valid: proven,
                    threshold: list.threshold.max(1),
                });
            }
        }
    }
    if list.environment != environment {
        return Err(Refusal::WrongEnvironment {
            expected: environment.to_owned(),
            found: list.environment.clone(),
        });
    }
    if now >= list.expires {
        return Err(Refusal::Expired {
            expires: list.expires,
        });
    }
    if let Some(held) = held {
        if list.version < held.version {
            return Err(Refusal::OlderVersion {
                held: held.version,
                offered: list.version,
            });
        }
        if list.version == held.version && Held::from(&list).keys != held.keys {
            return Err(Refusal::SameVersionDifferentKeys {
                version: list.version,
            });
        }
    }
    Ok(Verified { list, keys })
}
