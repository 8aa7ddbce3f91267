//! The lock between the deliberate re-prepare (`prepare --again`, which holds it exclusively
//! for its whole run) and serving's creates, starts and reboots (which hold it shared). A
//! floor both sides stand on, so serving never imports preparation for it. The lock is a
//! `flock` in the kernel: a process that dies releases it.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

/// The lock between the deliberate run and serving's creates and starts. In the agent's own
/// state directory, which serving may write (its unit's `ReadWritePaths=`).
pub const PREPARE_LOCK: &str = "/var/lib/enverge-agent/prepare.lock";

pub(crate) fn open(path: &Path) -> io::Result<File> {
    // Serving (spark) can read a lock root created; the one that finds none creates it.
    match File::open(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path),
        other => other,
    }
}

/// Serving's hold around a create, a start or a reboot: `Ok(None)` while a deliberate run
/// holds the lock (the caller refuses, `host_preparing`).
pub fn lock_shared(path: &Path) -> io::Result<Option<File>> {
    let file = open(path)?;
    match file.try_lock_shared() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}
