//! What enverge-agent-rollback runs when serving will not stay up (L1): go back to
//! `byo-agent.previous` once, and never to the build already running.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::{Digest, Sha256};

/// Restore `<bin>.previous` over `bin` and restart serving, unless it is the build already
/// running (then the host stays down and is alerted).
pub fn run(bin: &Path) -> anyhow::Result<()> {
    let mut previous = bin.as_os_str().to_owned();
    previous.push(".previous");
    let previous = PathBuf::from(previous);
    let digest = |p: &Path| std::fs::read(p).map(|b| Sha256::digest(&b));
    let old = digest(&previous)
        .with_context(|| format!("no previous build at {}", previous.display()))?;
    let now = digest(bin).with_context(|| format!("reading {}", bin.display()))?;
    if old == now {
        std::fs::remove_file(&previous)?;
        anyhow::bail!(
            "the previous build is the one already running; not restoring it (the host stays down and is alerted)"
        );
    }
    // Consumed: a second failure finds nothing to go back to.
    std::fs::rename(&previous, bin).with_context(|| format!("restoring {}", previous.display()))?;
    println!("restored the previous build at {}", bin.display());
    let _ = std::process::Command::new("systemctl")
        .args(["--no-block", "restart", byo_core::render::units::SERVING])
        .status();
    Ok(())
}
