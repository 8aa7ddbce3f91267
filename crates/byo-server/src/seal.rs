//! Sealing the few secrets the backend must be able to read back — the agent token it
//! presents to a host, the tunnel's connector token, the relay's WireGuard key, an
//! enrolment's secrets, the relay CA's key — so the database never holds them in plaintext.
//! XChaCha20-Poly1305 with a random nonce per value, keyed by the server's `secret_key`.
//!
//! A value is bound to where it is kept (issue #36, 8): `sealed:v2:` values carry, as the
//! AEAD's associated data, the table, column and row that hold them
//! (`hosts.agent_token:<host id>`; [`SealedAt`]), so someone who can write the database but
//! not read the key cannot copy one host's sealed token into another host's row, or into
//! another column, and have the server open it there: it fails as a wrong key does.
//! `sealed:v1:` values, sealed before that binding, are never opened by [`Sealer::open`];
//! only [`Sealer::reseal_v1`] reads one, for the pass at the server's start that re-seals
//! them in place (`app::sealed`).

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;

pub use byo_db::sealed::SealedColumn;

/// Values sealed with no associated data, before issue #36 (8).
pub const V1_PREFIX: &str = "sealed:v1:";
/// Values sealed for their table, column and row.
pub const V2_PREFIX: &str = "sealed:v2:";

#[derive(Clone)]
pub struct Sealer(XChaCha20Poly1305);

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("secret_key must be 64 hex characters (32 bytes)")]
    BadKey,
    #[error("a sealed value is malformed or was sealed with another key")]
    Open,
}

/// Where a sealed value is kept: its column and the key of its row. Every seal and open
/// names one, so a value opens only where it was sealed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealedAt<'a> {
    column: SealedColumn,
    row: &'a str,
}

impl<'a> SealedAt<'a> {
    pub fn new(column: SealedColumn, row: &'a str) -> Self {
        SealedAt { column, row }
    }

    /// `hosts.agent_token` of host `host_id`.
    pub fn agent_token(host_id: &'a str) -> Self {
        Self::new(SealedColumn::AgentToken, host_id)
    }

    /// `hosts.tunnel_token` of host `host_id`.
    pub fn tunnel_token(host_id: &'a str) -> Self {
        Self::new(SealedColumn::TunnelToken, host_id)
    }

    /// `hosts.relay_wg_key` of host `host_id`.
    pub fn relay_wg_key(host_id: &'a str) -> Self {
        Self::new(SealedColumn::RelayWgKey, host_id)
    }

    /// `host_enrollments.wg_config` of enrolment `enrollment_id`.
    pub fn enrollment_secrets(enrollment_id: &'a str) -> Self {
        Self::new(SealedColumn::EnrollmentSecrets, enrollment_id)
    }

    /// `relay_ca.sealed_key` of its one row.
    pub fn relay_ca_key() -> SealedAt<'static> {
        SealedAt::new(SealedColumn::RelayCaKey, byo_db::sealed::RELAY_CA_ROW)
    }

    /// The associated data: `table.column:row`. The column's name has no `:`, so no two
    /// places share one.
    fn associated_data(&self) -> String {
        format!("{}:{}", self.column.name(), self.row)
    }
}

impl Sealer {
    pub fn from_hex(key: &str) -> Result<Sealer, SealError> {
        let bytes = hex::decode(key.trim()).map_err(|_| SealError::BadKey)?;
        if bytes.len() != 32 {
            return Err(SealError::BadKey);
        }
        Ok(Sealer(
            XChaCha20Poly1305::new_from_slice(&bytes).map_err(|_| SealError::BadKey)?,
        ))
    }

    /// A fresh random key, hex-encoded (for `byo up`).
    pub fn generate_hex() -> String {
        let mut key = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut key);
        hex::encode(key)
    }

    /// `plaintext` sealed for `at`, and only there.
    pub fn seal(&self, at: &SealedAt<'_>, plaintext: &str) -> String {
        let ad = at.associated_data();
        let mut nonce = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let ct = self
            .0
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: ad.as_bytes(),
                },
            )
            .expect("encryption with a valid key cannot fail");
        let mut out = nonce.to_vec();
        out.extend(ct);
        format!("{V2_PREFIX}{}", STANDARD_NO_PAD.encode(out))
    }

    /// A value sealed for `at`. One sealed for another place, with another key, or before
    /// values were bound to their place (`sealed:v1:`) is [`SealError::Open`].
    pub fn open(&self, at: &SealedAt<'_>, sealed: &str) -> Result<String, SealError> {
        let raw = sealed.strip_prefix(V2_PREFIX).ok_or(SealError::Open)?;
        self.decrypt(raw, at.associated_data().as_bytes())
    }

    /// A `sealed:v1:` value, sealed again for `at`: the pass at the server's start, the only
    /// reader of v1 values, which trusts that the value is where it was first written.
    pub fn reseal_v1(&self, at: &SealedAt<'_>, sealed_v1: &str) -> Result<String, SealError> {
        let raw = sealed_v1.strip_prefix(V1_PREFIX).ok_or(SealError::Open)?;
        let plaintext = self.decrypt(raw, b"")?;
        Ok(self.seal(at, &plaintext))
    }

    fn decrypt(&self, raw: &str, ad: &[u8]) -> Result<String, SealError> {
        let bytes = STANDARD_NO_PAD.decode(raw).map_err(|_| SealError::Open)?;
        if bytes.len() < 24 {
            return Err(SealError::Open);
        }
        let (nonce, ct) = bytes.split_at(24);
        let nonce: [u8; 24] = nonce.try_into().map_err(|_| SealError::Open)?;
        let pt = self
            .0
            .decrypt(&XNonce::from(nonce), Payload { msg: ct, aad: ad })
            .map_err(|_| SealError::Open)?;
        String::from_utf8(pt).map_err(|_| SealError::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value as a server before issue #36 (8) sealed it: no associated data.
    fn seal_v1(sealer: &Sealer, plaintext: &str) -> String {
        let nonce = [7u8; 24];
        let ct = sealer
            .0
            .encrypt(&XNonce::from(nonce), plaintext.as_bytes())
            .unwrap();
        let mut out = nonce.to_vec();
        out.extend(ct);
        format!("{V1_PREFIX}{}", STANDARD_NO_PAD.encode(out))
    }

    #[test]
    fn sealed_values_open_only_with_their_key() {
        let a = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
        let b = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
        let at = SealedAt::agent_token("host-1");
        let sealed = a.seal(&at, "byo_agt_secret");
        assert!(sealed.starts_with(V2_PREFIX));
        assert!(!sealed.contains("byo_agt_secret"));
        assert_ne!(
            sealed,
            a.seal(&at, "byo_agt_secret"),
            "a fresh nonce each time"
        );
        assert_eq!(a.open(&at, &sealed).unwrap(), "byo_agt_secret");
        assert!(b.open(&at, &sealed).is_err());
        assert!(a.open(&at, "plaintext").is_err());
        assert!(a.open(&at, "sealed:v2:").is_err());
        assert!(Sealer::from_hex("abcd").is_err());
    }

    /// Issue #36 (8): a value copied to another row, another column of the same row, or
    /// another table does not open there.
    #[test]
    fn a_value_opens_only_at_the_place_it_was_sealed_for() {
        let s = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
        let sealed = s.seal(&SealedAt::agent_token("host-a"), "byo_agt_a");
        for elsewhere in [
            SealedAt::agent_token("host-b"),
            SealedAt::agent_token("host-a "),
            SealedAt::agent_token(""),
            SealedAt::tunnel_token("host-a"),
            SealedAt::relay_wg_key("host-a"),
            SealedAt::enrollment_secrets("host-a"),
            SealedAt::relay_ca_key(),
        ] {
            assert!(
                matches!(s.open(&elsewhere, &sealed), Err(SealError::Open)),
                "opened at {elsewhere:?}"
            );
        }
        assert_eq!(
            s.open(&SealedAt::agent_token("host-a"), &sealed).unwrap(),
            "byo_agt_a"
        );
        let ca = s.seal(&SealedAt::relay_ca_key(), "PEM");
        assert!(s.open(&SealedAt::relay_wg_key("1"), &ca).is_err());
        assert_eq!(s.open(&SealedAt::relay_ca_key(), &ca).unwrap(), "PEM");
    }

    /// A `sealed:v1:` value is never opened, wherever it is read; the start's pass alone
    /// re-seals it, for the place it names, and only with the key that sealed it.
    #[test]
    fn a_v1_value_is_not_opened_only_resealed_for_its_place() {
        let s = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
        let other = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
        let at = SealedAt::agent_token("host-a");
        let v1 = seal_v1(&s, "byo_agt_a");
        assert!(matches!(s.open(&at, &v1), Err(SealError::Open)));
        let v2 = s.reseal_v1(&at, &v1).unwrap();
        assert!(v2.starts_with(V2_PREFIX));
        assert_eq!(s.open(&at, &v2).unwrap(), "byo_agt_a");
        assert!(s.open(&SealedAt::agent_token("host-b"), &v2).is_err());
        assert!(matches!(other.reseal_v1(&at, &v1), Err(SealError::Open)));
        assert!(
            matches!(s.reseal_v1(&at, &v2), Err(SealError::Open)),
            "a v2 value is not re-sealed"
        );
    }
}
