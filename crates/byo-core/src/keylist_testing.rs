//! Keys and signed lists for tests (feature `testing`): one way to make them, shared by the
//! core's, the agent's, the server's and the CLI's tests.

use chrono::{DateTime, Duration, Utc};
use ssh_key::rand_core::OsRng;
use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey, SshSig};

use crate::keylist::{KIND, KeyList, NAMESPACE, OperatorKey, SignedList};

/// A fresh Ed25519 key.
pub fn private_key() -> PrivateKey {
    PrivateKey::random(&mut OsRng, Algorithm::Ed25519).expect("the OS RNG works")
}

/// A fresh public key as a list carries it: `ssh-ed25519 AAAA…`, no comment.
pub fn public_key_line() -> String {
    let mut public = private_key().public_key().clone();
    public.set_comment("");
    public.to_openssh().expect("an Ed25519 key encodes")
}

/// A fresh login key of operator `user_sub` on machine `label`.
pub fn login_key(user_sub: &str, label: &str) -> OperatorKey {
    OperatorKey {
        user_sub: user_sub.into(),
        label: label.into(),
        public_key: public_key_line(),
    }
}

/// A list issued `now`, valid for 90 days, threshold 1.
pub fn list(
    environment: &str,
    version: u64,
    keys: Vec<OperatorKey>,
    now: DateTime<Utc>,
) -> KeyList {
    KeyList {
        kind: KIND.into(),
        environment: environment.into(),
        version,
        issued_at: now,
        expires: now + Duration::days(90),
        threshold: 1,
        keys,
        next_signing_keys: None,
    }
}

/// An armored SSHSIG over `body` in our namespace.
pub fn sign(body: &str, key: &PrivateKey) -> String {
    SshSig::sign(key, NAMESPACE, HashAlg::Sha512, body.as_bytes())
        .and_then(|s| s.to_pem(LineEnding::LF))
        .expect("signing with an Ed25519 key works")
}

/// The envelope of `list` signed by each of `signers`.
pub fn envelope(list: &KeyList, signers: &[&PrivateKey]) -> Vec<u8> {
    let body = list.to_canonical();
    let signatures = signers.iter().map(|k| sign(&body, k)).collect();
    SignedList { body, signatures }.to_bytes()
}
