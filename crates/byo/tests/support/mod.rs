//! What the platform tests in this crate share: the binaries `cargo test --workspace` built
//! beside them, and a release directory holding the agent the installer fetches.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A sibling binary of this test, built by `cargo test --workspace`.
pub fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(
        bin.exists(),
        "{} is not built: run the workspace's tests (cargo test --workspace)",
        bin.display()
    );
    bin
}

/// A release directory holding the agent for `arches`, and the relay daemon
/// (`byo-relay-<arch>`, what a relay's first-boot script fetches).
pub fn release(dir: &Path, arches: &[&str]) -> PathBuf {
    use sha2::Digest;
    std::fs::create_dir_all(dir).unwrap();
    let relay = std::fs::read(sibling("byo-relay")).unwrap();
    std::fs::write(
        dir.join(format!("byo-relay-{}", std::env::consts::ARCH)),
        relay,
    )
    .unwrap();
    let agent = std::fs::read(sibling("byo-agent")).unwrap();
    for arch in arches {
        std::fs::write(dir.join(format!("byo-agent-{arch}")), &agent).unwrap();
        std::fs::write(
            dir.join(format!("byo-agent-{arch}.sha256")),
            format!(
                "{}  byo-agent-{arch}\n",
                hex::encode(sha2::Sha256::digest(&agent))
            ),
        )
        .unwrap();
    }
    dir.to_owned()
}

/// The relay daemon's sha256 (hex), as a relay's first-boot script checks it.
pub fn relay_sha256() -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(
        std::fs::read(sibling("byo-relay")).unwrap(),
    ))
}
