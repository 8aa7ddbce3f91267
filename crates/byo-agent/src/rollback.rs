//! What enverge-agent-rollback runs when serving will not stay up (L1): go back to
//! `byo-agent.previous` once, and never to the build already running.
//!
//! systemd also fires serving's `OnFailure=` when serving's start job fails only because
//! preparation did (its `Requires=`), and a failed preparation is retried every 30 s. That
//! is not serving failing to stay up: until preparation has handed over, there is nothing
//! to roll back, and restoring `.previous` then would undo the build an owner just
//! installed to get past the failure.

use std::path::{Path, PathBuf};

use anyhow::Context;
use sha2::{Digest, Sha256};

/// What a rollback leaves for the heartbeat to report (`details.rollback`), next to the
/// hand-over record: /admin names "rollback fired" from it. The next install (an operator's
/// upgrade) removes it.
pub const ROLLED_BACK: &str = "/etc/enverge/rolled-back.json";

/// Restore `<bin>.previous` over `bin` and restart serving, unless it is the build already
/// running (then the host stays down and is alerted), or preparation has not handed over
/// (`handed_over`, the record it writes last, is absent: serving never ran).
pub fn run(bin: &Path, handed_over: &Path) -> anyhow::Result<()> {
    if !handed_over.exists() {
        println!(
            "preparation has not handed over ({} is absent), so serving never ran: nothing to roll back",
            handed_over.display()
        );
        return Ok(());
    }
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
    // Told, not hidden: serving reports it on every beat until the next install.
    let record = serde_json::json!({
        "at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "from_sha256": hex(&now),
        "to_sha256": hex(&old),
    });
    let path = handed_over.with_file_name("rolled-back.json");
    if let Err(e) = std::fs::write(&path, record.to_string()) {
        eprintln!("could not record the rollback at {}: {e}", path.display());
    }
    let _ = std::process::Command::new("systemctl")
        .args(["--no-block", "restart", byo_core::render::units::SERVING])
        .status();
    Ok(())
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}
