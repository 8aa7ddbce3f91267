//! The deliberate run (L, "Host configuration after go-live"; issue #14 item 6):
//! `byo-agent prepare --again`, what an operator runs as root over the operator tunnel (I)
//! when a newer agent changes what a step does.
//!
//! - Only on a host that completed preparation: a host still preparing is the unit's to
//!   finish (it retries on its own), not an operator's to restart.
//! - Only on an idle host (rule 5): no instance of ours running. A stopped one does not
//!   hold the rails; its customer's start waits for the run (the lock below).
//! - C in full: every step's check runs again, whatever the done list says (a step's name
//!   says nothing about what it now does), each step reported through host-report as usual.
//! - A failure is reported and left: nothing is rolled back, serving is not touched, and the
//!   rollback (which judges serving only, rule 2) does not fire.
//!
//! The lock: `PREPARE_LOCK`, a `flock` taken exclusively by the run for its whole length
//! and shared by serving around anything that makes an instance run (a create, a start, a
//! reboot). Whoever comes second is refused at once, by name: serving answers
//! `host_preparing` (the backend's "no capacity"), and the run refuses while a create is
//! under way. The lock is in the kernel, so a run that dies releases it.

use std::fs::File;
use std::path::Path;

use crate::host::Host;

use crate::lock::open;
pub use crate::lock::{PREPARE_LOCK, lock_shared};

/// Why the deliberate run did not start, or how it ended. Each has its own exit status.
#[derive(Debug, thiserror::Error)]
pub enum AgainError {
    #[error(
        "this host has not completed preparation: enverge-agent-prepare runs it and tries again on its own (systemctl status enverge-agent-prepare); --again is for a host already serving. Nothing was changed"
    )]
    NotPrepared,
    #[error(
        "an instance holds the rails: {} running on this host, and preparation does not touch a live host (L, rule 5). Run it again once the host is idle. Nothing was changed",
        .0.join(", ")
    )]
    Held(Vec<String>),
    #[error(
        "LXD does not answer ({0}), so whether an instance holds the rails cannot be known. Nothing was changed"
    )]
    Unknown(String),
    #[error(
        "the VM API is creating or starting an instance right now, or another re-prepare is running (/var/lib/enverge-agent/prepare.lock is held). Run it again in a minute. Nothing was changed"
    )]
    Busy,
    #[error("{0}")]
    Io(String),
    #[error(
        "re-prepare failed at {step}: {error}. Nothing was rolled back and serving keeps running; /admin shows it on the host's page. Fix the cause and run it again"
    )]
    Failed { step: String, error: String },
}

impl AgainError {
    /// The exit status: 1 a step failed, 3 an instance holds the rails, 4 not prepared,
    /// 5 the lock is held, 6 LXD does not answer, 7 anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            AgainError::Failed { .. } => 1,
            AgainError::Held(_) => 3,
            AgainError::NotPrepared => 4,
            AgainError::Busy => 5,
            AgainError::Unknown(_) => 6,
            AgainError::Io(_) => 7,
        }
    }
}

/// The deliberate run's hold: released when dropped (or when the process dies).
#[derive(Debug)]
pub struct Exclusive(#[allow(dead_code)] File);

/// Take the lock for the deliberate run, or refuse at once when anyone holds it.
pub fn lock_exclusive(path: &Path) -> Result<Exclusive, AgainError> {
    let file = open(path).map_err(|e| AgainError::Io(format!("{}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(Exclusive(file)),
        Err(std::fs::TryLockError::WouldBlock) => Err(AgainError::Busy),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(AgainError::Io(format!("locking {}: {e}", path.display())))
        }
    }
}

/// Rule 5 on node0: the instances of ours that hold the rails (running, or anything but
/// stopped). LXD not answering is not an answer.
pub fn holding<H: Host + ?Sized>(host: &mut H) -> Result<Vec<String>, AgainError> {
    crate::vms::live(host).map_err(AgainError::Unknown)
}

/// Rule 5 on a pair or a ring: each satellite is asked over the management network (as
/// spark, its LXD through the host adapter) what it runs; one that cannot be reached, or
/// whose LXD does not answer, is not waited for — node0's answer is enough then. A satellite
/// runs nothing but the workers of node0's instances (and, while preparing, the image
/// build), so every other instance there that is not stopped holds the rails.
pub fn satellites_holding(plan: &super::Plan) -> Vec<String> {
    let Some(sats) = plan.satellites.as_ref() else {
        return Vec::new();
    };
    let mut held = Vec::new();
    for peer in &plan.peers {
        let Ok(mut node) = sats.spark(peer) else {
            continue;
        };
        let Ok(list) = crate::lxd::instances(&mut node) else {
            continue;
        };
        for i in &list {
            let name = i["name"].as_str().unwrap_or_default();
            if i["status"] != "Stopped" && name != super::BUILD_INSTANCE {
                held.push(format!("{name} on node{}", peer.index));
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_and_serving_exclude_each_other_and_a_dead_holder_releases() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prepare.lock");
        // A create under way: the run is refused, by name.
        let create = lock_shared(&path).unwrap().expect("free");
        let second = lock_shared(&path).unwrap();
        assert!(second.is_some(), "creates do not exclude each other here");
        assert!(matches!(lock_exclusive(&path), Err(AgainError::Busy)));
        drop((create, second));
        // The run holds it: serving's creates and starts are refused.
        let run = lock_exclusive(&path).unwrap();
        assert!(lock_shared(&path).unwrap().is_none());
        assert!(matches!(lock_exclusive(&path), Err(AgainError::Busy)));
        drop(run);
        assert!(lock_shared(&path).unwrap().is_some());
    }

    #[test]
    fn each_refusal_says_nothing_changed_and_has_its_own_status() {
        let all = [
            AgainError::NotPrepared,
            AgainError::Held(vec!["c1".into()]),
            AgainError::Unknown("no socket".into()),
            AgainError::Busy,
        ];
        let mut codes: Vec<u8> = all.iter().map(AgainError::exit_code).collect();
        for e in &all {
            assert!(e.to_string().ends_with("Nothing was changed"), "{e}");
        }
        assert!(
            AgainError::Held(vec!["c1".into()])
                .to_string()
                .contains("c1 running")
        );
        let failed = AgainError::Failed {
            step: "earlyoom".into(),
            error: "apply failed: masked".into(),
        };
        assert!(
            failed
                .to_string()
                .starts_with("re-prepare failed at earlyoom: apply failed")
        );
        codes.push(failed.exit_code());
        codes.push(AgainError::Io(String::new()).exit_code());
        let mut unique = codes.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), codes.len(), "{codes:?}");
        assert!(!codes.contains(&0));
    }
}
