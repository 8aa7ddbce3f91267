//! Signed agent builds (J; issue #14, item 2): a build is signed offline with the release key,
//! whose private half never reaches a server, as an SSHSIG in [`NAMESPACE`]. The installer
//! verifies it with `ssh-keygen -Y verify` against the key pinned on the host at its first
//! install ([`allowed_signers`] is the file it writes for that), never against a digest fetched
//! beside the binary alone.

use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

/// The SSHSIG namespace agent builds are signed in (never an operator-key list's).
pub const NAMESPACE: &str = "byo-agent-release@byo";
/// The principal the installer's allowed-signers line names.
pub const PRINCIPAL: &str = "byo-release";
/// Where a host keeps the release key it pinned at its first install.
pub const PINNED: &str = "/etc/enverge/release-key";

/// The armored signature of `build` with the release key.
pub fn sign(key: &PrivateKey, build: &[u8]) -> Result<String, String> {
    SshSig::sign(key, NAMESPACE, HashAlg::Sha512, build)
        .and_then(|s| s.to_pem(LineEnding::LF))
        .map_err(|e| format!("signing the build: {e}"))
}

/// Whether `armored` is `key`'s signature of `build` in [`NAMESPACE`].
pub fn verify(key: &PublicKey, build: &[u8], armored: &str) -> Result<(), String> {
    let sig = SshSig::from_pem(armored).map_err(|e| format!("not an SSH signature: {e}"))?;
    if sig.namespace() != NAMESPACE {
        return Err(format!(
            "signed in namespace {:?}, not {NAMESPACE:?}",
            sig.namespace()
        ));
    }
    key.verify(NAMESPACE, build, &sig)
        .map_err(|_| "the signature does not match this build and the release key".to_owned())
}

/// The `ssh-keygen -Y verify -f` file admitting exactly `key` for builds.
pub fn allowed_signers(key: &str) -> String {
    format!("{PRINCIPAL} namespaces=\"{NAMESPACE}\" {}\n", key.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_verifies_only_with_its_key_its_bytes_and_its_namespace() {
        let key = crate::keylist_testing::private_key();
        let other = crate::keylist_testing::private_key();
        let sig = sign(&key, b"build").unwrap();
        assert_eq!(verify(key.public_key(), b"build", &sig), Ok(()));
        assert!(verify(key.public_key(), b"tampered", &sig).is_err());
        assert!(verify(other.public_key(), b"build", &sig).is_err());
        assert!(verify(key.public_key(), b"build", "garbage").is_err());
        let list = crate::keylist_testing::sign("build", &key);
        assert!(
            verify(key.public_key(), b"build", &list)
                .unwrap_err()
                .contains("namespace")
        );
        assert_eq!(
            allowed_signers("ssh-ed25519 AAAA x\n"),
            "byo-release namespaces=\"byo-agent-release@byo\" ssh-ed25519 AAAA x\n"
        );
    }
}
