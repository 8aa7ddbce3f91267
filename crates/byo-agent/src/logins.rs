//! Attributable logins (#16, 5), the agent's side: each beat reads the journal entries of
//! sshd after the kept cursor (`journalctl -t sshd -t sshd-session -o json --after-cursor`),
//! takes the logins to spark ([`byo_core::logins::read_batch`], at most
//! [`MAX_LOGINS_PER_BEAT`]) attributed against the operator-key list the host applied, and
//! sends them in the beat's details. The cursor is written to [`CURSOR`] only once the beat
//! is delivered: a beat that is not is read again next time (the backend keeps each login
//! once), and a restart starts where the last delivered beat ended. A surplus past the bound
//! stays in the journal for the next beat.
//!
//! By identifier, not by unit: Debian's and Ubuntu's unit is `ssh.service`, others'
//! `sshd.service`, socket-activated sshd runs per connection, and OpenSSH 9.8 logs from
//! `sshd-session`; the identifiers are the same everywhere.

use byo_core::keylist::{CheckedKey, KeyList, SignedList};
use byo_core::logins::{Batch, read_batch};
use byo_wire::vm::{MAX_LOGINS_PER_BEAT, OperatorLogin};

use crate::host::Host;

/// Where the last delivered beat's journal cursor is kept (serving's own state directory).
pub const CURSOR: &str = "/var/lib/enverge-agent/ssh-logins.cursor";

/// The journal read for one beat, after `cursor` (from the start of the journal's memory
/// when none is kept yet: logins since preparation began are reported once).
pub fn journal_argv(cursor: Option<&str>) -> Vec<String> {
    let mut argv: Vec<String> = [
        "journalctl",
        "-t",
        "sshd",
        "-t",
        "sshd-session",
        "-o",
        "json",
        "--output-fields=MESSAGE",
        "--no-pager",
        "-q",
    ]
    .map(String::from)
    .into();
    if let Some(c) = cursor {
        argv.push(format!("--after-cursor={c}"));
    }
    argv
}

/// The keys of the list the host applied, checked (their fingerprints); none when no list is
/// kept or it does not read.
pub fn applied_keys(signed: Option<&[u8]>) -> Vec<CheckedKey> {
    signed
        .and_then(|b| SignedList::from_bytes(b).ok())
        .and_then(|s| KeyList::from_canonical(&s.body).ok())
        .and_then(|l| l.check().ok())
        .unwrap_or_default()
}

/// One beat's read: the logins to send and the cursor to keep once they are delivered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Read {
    pub logins: Vec<OperatorLogin>,
    pub cursor: Option<String>,
    /// Why the journal could not be read, for the beat's details.
    pub error: Option<String>,
}

/// Read the journal after the kept cursor for logins to spark. A journal that cannot be read
/// is named, never fatal to the beat.
pub fn read<H: Host + ?Sized>(host: &mut H, keys: &[CheckedKey]) -> Read {
    read_as(host, byo_core::logins::ACCOUNT, keys)
}

/// [`read`] for logins to `account` (tests log in to a real sshd as the user they run as).
pub fn read_as<H: Host + ?Sized>(host: &mut H, account: &str, keys: &[CheckedKey]) -> Read {
    let kept = match host.read(CURSOR) {
        Ok(b) => b
            .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
            .filter(|c| !c.is_empty()),
        Err(e) => {
            return Read {
                error: Some(format!("the kept cursor: {e}")),
                ..Read::default()
            };
        }
    };
    let argv = journal_argv(kept.as_deref());
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    match host.run(&argv, None) {
        Ok(out) if out.ok() => {
            let Batch { logins, cursor, .. } =
                read_batch(&out.stdout, account, keys, MAX_LOGINS_PER_BEAT);
            Read {
                logins,
                cursor,
                error: None,
            }
        }
        Ok(out) => Read {
            error: Some(format!(
                "journalctl exited {}: {}",
                out.code,
                out.stderr
                    .lines()
                    .next()
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect::<String>()
            )),
            ..Read::default()
        },
        Err(e) => Read {
            error: Some(format!(
                "journalctl: {}",
                e.chars().take(200).collect::<String>()
            )),
            ..Read::default()
        },
    }
}

/// The beat carrying `read`'s logins was delivered: keep its cursor.
pub fn delivered<H: Host + ?Sized>(host: &mut H, cursor: &str) -> Result<(), String> {
    host.write(
        CURSOR,
        format!("{cursor}\n").as_bytes(),
        0o600,
        "spark:spark",
    )
}
