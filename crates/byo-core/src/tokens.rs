//! Bearer secrets: how they are minted, recognised and stored.
//!
//! Every secret byo mints looks like `byo_<kind>_<40 alphanumerics><6-char checksum>`.
//! The fixed prefix and the CRC let a leak scanner (GitHub secret scanning, trufflehog)
//! recognise one in a paste or a shell history with no false positives, and let us
//! reject a mistyped token without a database lookup. Only the SHA-256 of a token is
//! ever stored: the tokens carry ~238 bits of entropy, so a fast hash is enough and a
//! database dump yields nothing that authenticates.

use std::fmt;

use rand::Rng;
use rand::distributions::Alphanumeric;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const RANDOM_LEN: usize = 40;
const CHECK_LEN: usize = 6;
const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// What a token authorises. The kind is part of the token, so one kind can never be
/// presented where another is expected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenKind {
    /// A signed-in browser session.
    Session,
    /// The single-use enrolment token in the owner's one-liner.
    Enrollment,
    /// What a host presents to the backend (`hosts.token_hash`).
    Host,
    /// What the backend presents to a host's agent (`hosts.agent_token`).
    Agent,
    /// A relay's own ssh_mapd token.
    SshMap,
    /// What a relay presents once, at its first boot, for its WireGuard key and TLS
    /// certificate (`hosts.relay_secrets_token_hash`; spent by that one fetch).
    RelaySecrets,
    /// A person's API token (`api_tokens.token_hash`, issue #43): their account through the
    /// API, within the token's scope.
    Api,
    /// The link mailed to a new address at sign-up (`signup_confirmations.token_hash`,
    /// issue #36): whoever reads that mailbox makes the account, once.
    SignupConfirm,
}

impl TokenKind {
    pub const ALL: [TokenKind; 8] = [
        TokenKind::Session,
        TokenKind::Enrollment,
        TokenKind::Host,
        TokenKind::Agent,
        TokenKind::SshMap,
        TokenKind::RelaySecrets,
        TokenKind::Api,
        TokenKind::SignupConfirm,
    ];

    pub fn prefix(self) -> &'static str {
        match self {
            TokenKind::Session => "byo_ses_",
            TokenKind::Enrollment => "byo_enr_",
            TokenKind::Host => "byo_hst_",
            TokenKind::Agent => "byo_agt_",
            TokenKind::SshMap => "byo_map_",
            TokenKind::RelaySecrets => "byo_rly_",
            TokenKind::Api => "byo_api_",
            TokenKind::SignupConfirm => "byo_cnf_",
        }
    }
}

/// A plaintext token. It has no `Display` and its `Debug` is redacted, so it cannot
/// reach a log line by accident; [`SecretToken::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretToken(String);

impl fmt::Debug for SecretToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretToken(<redacted>)")
    }
}

impl SecretToken {
    /// Mint a fresh token of `kind` from the thread's CSPRNG.
    pub fn generate(kind: TokenKind) -> Self {
        let random: String = rand::thread_rng()
            .sample_iter(&Alphanumeric)
            .take(RANDOM_LEN)
            .map(char::from)
            .collect();
        let check = checksum(&random);
        SecretToken(format!("{}{random}{check}", kind.prefix()))
    }

    /// Accept a token as presented by a caller, if it is well formed for `kind`.
    pub fn parse(kind: TokenKind, presented: &str) -> Result<Self, MalformedToken> {
        let body = presented
            .strip_prefix(kind.prefix())
            .ok_or(MalformedToken)?;
        if body.len() != RANDOM_LEN + CHECK_LEN || !body.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Err(MalformedToken);
        }
        let (random, check) = body.split_at(RANDOM_LEN);
        if checksum(random).as_bytes().ct_eq(check.as_bytes()).into() {
            Ok(SecretToken(presented.to_owned()))
        } else {
            Err(MalformedToken)
        }
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// What the database stores in place of the token.
    pub fn hash(&self) -> TokenHash {
        TokenHash(hex::encode(Sha256::digest(self.0.as_bytes())))
    }
}

/// A token that is not of the expected kind or fails its checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedToken;

impl fmt::Display for MalformedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed token")
    }
}

impl std::error::Error for MalformedToken {}

/// The SHA-256 (lowercase hex) of a token: safe to store, log-safe, and looked up by
/// equality, which leaks nothing useful since the preimage cannot be searched.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenHash(String);

impl TokenHash {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn from_stored(hex: String) -> Self {
        TokenHash(hex)
    }

    /// Constant-time comparison, for the places a hash is compared in memory rather than
    /// looked up (a relay checking its one token, say).
    pub fn matches(&self, token: &SecretToken) -> bool {
        self.0.as_bytes().ct_eq(token.hash().0.as_bytes()).into()
    }
}

fn checksum(random: &str) -> String {
    let mut n = crc32fast::hash(random.as_bytes()) as u64;
    let mut out = [b'0'; CHECK_LEN];
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(n % 62) as usize];
        n /= 62;
    }
    // 62^6 > 2^32, so the whole CRC always fits.
    String::from_utf8(out.to_vec()).expect("alphabet is ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksum is CRC-32 written in base 62, six digits: a fixed vector, so a token
    /// minted by one build parses in every other.
    #[test]
    fn the_checksum_is_crc32_in_base62() {
        assert_eq!(checksum(&"a".repeat(40)), "3gcfED");
        assert_eq!(checksum(&"0".repeat(40)), "2kaqcA");
        let t = format!("byo_enr_{}3gcfED", "a".repeat(40));
        assert!(SecretToken::parse(TokenKind::Enrollment, &t).is_ok());
    }

    /// Length and alphabet are checked before the checksum: a short body is refused (not a
    /// panic), and a body of the right length with a character outside the alphabet is
    /// refused even when its checksum is right.
    #[test]
    fn length_and_alphabet_are_checked_on_their_own() {
        for short in ["byo_enr_", "byo_enr_abc", "byo_enr_3gcfED"] {
            assert_eq!(
                SecretToken::parse(TokenKind::Enrollment, short),
                Err(MalformedToken)
            );
        }
        let random = format!("{}-", "a".repeat(39));
        let t = format!("byo_enr_{random}{}", checksum(&random));
        assert_eq!(
            SecretToken::parse(TokenKind::Enrollment, &t),
            Err(MalformedToken)
        );
        assert_eq!(MalformedToken.to_string(), "malformed token");
    }

    #[test]
    fn minted_tokens_parse_back_and_are_distinct() {
        for kind in TokenKind::ALL {
            let a = SecretToken::generate(kind);
            let b = SecretToken::generate(kind);
            assert_ne!(a, b);
            assert!(a.expose().starts_with(kind.prefix()));
            assert_eq!(
                a.expose().len(),
                kind.prefix().len() + RANDOM_LEN + CHECK_LEN
            );
            assert_eq!(SecretToken::parse(kind, a.expose()).unwrap(), a);
        }
    }

    #[test]
    fn a_token_of_another_kind_or_with_a_typo_is_malformed() {
        let t = SecretToken::generate(TokenKind::Enrollment);
        assert_eq!(
            SecretToken::parse(TokenKind::Host, t.expose()),
            Err(MalformedToken)
        );
        let mut typo = t.expose().to_owned().into_bytes();
        let i = TokenKind::Enrollment.prefix().len() + 3;
        typo[i] = if typo[i] == b'a' { b'b' } else { b'a' };
        let typo = String::from_utf8(typo).unwrap();
        assert_eq!(
            SecretToken::parse(TokenKind::Enrollment, &typo),
            Err(MalformedToken)
        );
        assert_eq!(
            SecretToken::parse(TokenKind::Enrollment, ""),
            Err(MalformedToken)
        );
        assert_eq!(
            SecretToken::parse(TokenKind::Enrollment, &format!("{}é", t.expose())),
            Err(MalformedToken)
        );
    }

    #[test]
    fn the_stored_hash_is_not_the_token_and_matches_only_it() {
        let t = SecretToken::generate(TokenKind::Session);
        let h = t.hash();
        assert_eq!(h.as_str().len(), 64);
        assert!(!h.as_str().contains(t.expose()));
        assert!(h.matches(&t));
        assert!(!h.matches(&SecretToken::generate(TokenKind::Session)));
        assert_eq!(format!("{t:?}"), "SecretToken(<redacted>)");
    }
}
