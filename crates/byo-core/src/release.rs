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

/// How many hex digits of a build's sha256 name it: what the heartbeat's `agent_version`
/// carries (`<version> (<12 hex>)`, `byo_agent::report::build_version`).
pub const BUILD_ID_HEX: usize = 12;

/// The build a sha256 (hex) names: its first [`BUILD_ID_HEX`] digits, lower case.
pub fn build_id(sha256_hex: &str) -> String {
    sha256_hex
        .chars()
        .take(BUILD_ID_HEX)
        .collect::<String>()
        .to_ascii_lowercase()
}

/// The build an `agent_version` names (`0.1.0 (0123456789ab)` → `0123456789ab`), if it
/// names one.
pub fn build_of_version(agent_version: &str) -> Option<&str> {
    let inner = agent_version.trim().strip_suffix(')')?.rsplit_once(" (")?.1;
    (inner.len() == BUILD_ID_HEX && inner.bytes().all(|b| b.is_ascii_hexdigit())).then_some(inner)
}

/// An architecture as `uname -m` spells it and the installer's path carries it
/// (`byo-agent-<arch>`): ASCII letters, digits and underscores, 1–32 of them.
pub fn is_arch(arch: &str) -> bool {
    (1..=32).contains(&arch.len()) && arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The architecture a 64-bit little-endian ELF executable is built for, as `uname -m` names
/// it, read from its header (`e_machine`); `None` for anything else. Cheap, and enough to
/// refuse a build published under an architecture it is not for.
pub fn elf_arch(bytes: &[u8]) -> Option<&'static str> {
    if bytes.len() < 20 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return None;
    }
    match u16::from_le_bytes([bytes[18], bytes[19]]) {
        62 => Some("x86_64"),
        183 => Some("aarch64"),
        _ => None,
    }
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

    #[test]
    fn a_build_is_named_by_its_digest_and_read_back_from_the_heartbeat() {
        let sha = "0123456789ABcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(build_id(sha), "0123456789ab");
        assert_eq!(
            build_of_version("0.1.0 (0123456789ab)"),
            Some("0123456789ab")
        );
        assert_eq!(
            build_of_version(" 0.1.0 (0123456789ab) "),
            Some("0123456789ab")
        );
        for no in [
            "0.1.0",
            "0.1.0 (unknown)",
            "0.1.0 (0123456789a)",
            "0.1.0 (0123456789abc)",
            "0.1.0 (0123456789ag)",
            "0.1.0 0123456789ab)",
        ] {
            assert_eq!(build_of_version(no), None, "{no}");
        }
        assert!(is_arch("x86_64") && is_arch("aarch64") && is_arch(&"a".repeat(32)));
        for no in ["", "x86-64", "../x", "a b", &"a".repeat(33)] {
            assert!(!is_arch(no), "{no}");
        }
    }

    #[test]
    fn an_elf_names_its_architecture_and_nothing_else_does() {
        let elf = |class: u8, data: u8, machine: u16| {
            let mut b = vec![0u8; 64];
            b[..4].copy_from_slice(b"\x7fELF");
            b[4] = class;
            b[5] = data;
            b[18..20].copy_from_slice(&machine.to_le_bytes());
            b
        };
        assert_eq!(elf_arch(&elf(2, 1, 62)), Some("x86_64"));
        assert_eq!(elf_arch(&elf(2, 1, 183)), Some("aarch64"));
        assert_eq!(elf_arch(&elf(2, 1, 40)), None, "32-bit ARM");
        assert_eq!(elf_arch(&elf(1, 1, 62)), None, "32-bit class");
        assert_eq!(elf_arch(&elf(2, 2, 62)), None, "big-endian");
        assert_eq!(elf_arch(&elf(2, 1, 62)[..19]), None, "too short");
        assert_eq!(elf_arch(&elf(2, 1, 62)[..20]), Some("x86_64"));
        assert_eq!(elf_arch(b"#!/bin/sh\necho 0.1.0\n"), None);
        let mut not_elf = elf(2, 1, 62);
        not_elf[1] = b'X';
        assert_eq!(elf_arch(&not_elf), None);
        let me = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(elf_arch(&me), Some(std::env::consts::ARCH));
    }
}
