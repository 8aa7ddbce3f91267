//! Sealing the few secrets the backend must be able to read back — the agent token it
//! presents to a host — so the database never holds them in plaintext. XChaCha20-Poly1305
//! with a random nonce per value, keyed by the server's `secret_key`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;

const PREFIX: &str = "sealed:v1:";

#[derive(Clone)]
pub struct Sealer(XChaCha20Poly1305);

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("secret_key must be 64 hex characters (32 bytes)")]
    BadKey,
    #[error("a sealed value is malformed or was sealed with another key")]
    Open,
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

    pub fn seal(&self, plaintext: &str) -> String {
        let mut nonce = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let ct = self
            .0
            .encrypt(&XNonce::from(nonce), plaintext.as_bytes())
            .expect("encryption with a valid key cannot fail");
        let mut out = nonce.to_vec();
        out.extend(ct);
        format!("{PREFIX}{}", STANDARD_NO_PAD.encode(out))
    }

    pub fn open(&self, sealed: &str) -> Result<String, SealError> {
        let raw = sealed.strip_prefix(PREFIX).ok_or(SealError::Open)?;
        let bytes = STANDARD_NO_PAD.decode(raw).map_err(|_| SealError::Open)?;
        if bytes.len() < 24 {
            return Err(SealError::Open);
        }
        let (nonce, ct) = bytes.split_at(24);
        let nonce: [u8; 24] = nonce.try_into().map_err(|_| SealError::Open)?;
        let pt = self
            .0
            .decrypt(&XNonce::from(nonce), ct)
            .map_err(|_| SealError::Open)?;
        String::from_utf8(pt).map_err(|_| SealError::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key() {
        let a = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
        let b = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
        let sealed = a.seal("byo_agt_secret");
        assert!(!sealed.contains("byo_agt_secret"));
        assert_ne!(sealed, a.seal("byo_agt_secret"), "a fresh nonce each time");
        assert_eq!(a.open(&sealed).unwrap(), "byo_agt_secret");
        assert!(b.open(&sealed).is_err());
        assert!(a.open("plaintext").is_err());
        assert!(Sealer::from_hex("abcd").is_err());
    }
}
