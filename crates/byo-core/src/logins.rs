//! Attributable logins (I, "What the operator gets"; #16, 5): every operator logs in as
//! `spark` with their own key, sshd logs the fingerprint of the key it accepted, and the
//! host's signed list maps fingerprints to operators. This module reads sshd's accepted-login
//! lines out of journald's JSON export and attributes each against the applied list. Pure:
//! the agent runs `journalctl` and keeps the cursor; time is the journal's own.
//!
//! What is reported, decided here:
//! - only logins to [`ACCOUNT`] (`spark`), the one account operators use. A login to any other
//!   account is the owner's own business on their machine and is never read out;
//! - only `publickey` logins: spark has no password, and a key is what attributes a login;
//! - a key on the applied list is that entry's operator (`user_sub`); any other key that
//!   opened spark is reported without one — "not an operator key" — which is exactly what
//!   an owner and an operator want to see.
//!
//! The cursor moves past every entry read (login or not), but never past a login that did
//! not fit in the beat: the surplus is read again on the next one, so nothing is lost or
//! repeated as long as the cursor is kept only once the beat is delivered.

use std::net::IpAddr;

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::keylist::CheckedKey;
use byo_wire::vm::OperatorLogin;

/// The account every operator logs in to.
pub const ACCOUNT: &str = "spark";

/// What one `Accepted …` line of sshd says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    pub method: String,
    pub user: String,
    pub source: IpAddr,
    pub source_port: u16,
    /// `ED25519`, `ED25519-SK`, `ED25519-CERT`, … (publickey logins only).
    pub key_type: Option<String>,
    /// `SHA256:…` (publickey logins only).
    pub fingerprint: Option<String>,
    /// `<ID> (serial N)` when the key came with a certificate (`…-CERT` types).
    pub certificate: Option<String>,
}

/// The longest fingerprint taken from a line: `SHA256:` and 43 base64 characters is 50.
const MAX_FINGERPRINT: usize = 80;

/// One sshd message: `Accepted publickey for spark from 10.8.0.1 port 50522 ssh2: ED25519
/// SHA256:…`. Anything else — another message, a line cut short, an address that is not
/// one — is `None`; never a panic.
pub fn parse_message(message: &str) -> Option<Accepted> {
    let rest = message.trim().strip_prefix("Accepted ")?;
    let mut words = rest.split(' ');
    let method = words.next()?;
    if words.next()? != "for" {
        return None;
    }
    // "for USER from ADDR port PORT ssh2[: TYPE FP …]"; a user name has no spaces on Linux.
    let user = words.next()?;
    if words.next()? != "from" {
        return None;
    }
    let source: IpAddr = words.next()?.parse().ok()?;
    if words.next()? != "port" {
        return None;
    }
    let source_port: u16 = words.next()?.parse().ok()?;
    let proto = words.next()?;
    let (key_type, fingerprint, certificate) = if proto == "ssh2:" {
        let key_type = words.next()?;
        let fingerprint = words.next()?;
        if !is_fingerprint(fingerprint) || key_type.is_empty() || key_type.len() > 32 {
            return None;
        }
        let certificate = if key_type.ends_with("-CERT") {
            Some(certificate_name(&words.collect::<Vec<_>>().join(" "))?)
        } else {
            None
        };
        (
            Some(key_type.to_owned()),
            Some(fingerprint.to_owned()),
            certificate,
        )
    } else if proto == "ssh2" {
        (None, None, None)
    } else {
        return None;
    };
    if method.is_empty() || user.is_empty() || user.len() > 64 {
        return None;
    }
    Some(Accepted {
        method: method.to_owned(),
        user: user.to_owned(),
        source,
        source_port,
        key_type,
        fingerprint,
        certificate,
    })
}

/// What follows a certificate's fingerprint in sshd's line: `ID <id> (serial <n>) CA <type>
/// <fp>`; the ID and serial as sshd wrote them, or `None` when that does not read (a line cut
/// short, an ID too long or with control characters).
fn certificate_name(rest: &str) -> Option<String> {
    let rest = rest.strip_prefix("ID ")?;
    let at = rest.rfind(" (serial ")?;
    let (id, tail) = rest.split_at(at);
    let serial = tail.strip_prefix(" (serial ")?.split(')').next()?;
    if serial.is_empty() || !serial.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let name = format!("{id} (serial {serial})");
    (!id.is_empty()
        && name.chars().count() <= byo_wire::vm::MAX_LOGIN_CERTIFICATE
        && !name.chars().any(char::is_control))
    .then_some(name)
}

/// `SHA256:` and base64 without padding, as sshd and [`CheckedKey::fingerprint`] spell it.
pub fn is_fingerprint(s: &str) -> bool {
    s.len() <= MAX_FINGERPRINT
        && s.strip_prefix("SHA256:").is_some_and(|b64| {
            !b64.is_empty()
                && b64
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
        })
}

/// One entry of `journalctl -o json`: its cursor, its time, and its message when it has a
/// readable one (journald sends a message that is not UTF-8 as an array of bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalEntry {
    pub cursor: String,
    pub at: DateTime<Utc>,
    pub message: Option<String>,
}

/// One line of `journalctl -o json`; `None` for a line that is not an entry (no cursor, no
/// time), never a panic.
pub fn parse_journal_line(line: &str) -> Option<JournalEntry> {
    let v: Value = serde_json::from_str(line).ok()?;
    let cursor = v.get("__CURSOR")?.as_str()?;
    if cursor.is_empty() || cursor.len() > 512 || cursor.chars().any(char::is_control) {
        return None;
    }
    let micros: i64 = v.get("__REALTIME_TIMESTAMP")?.as_str()?.parse().ok()?;
    let at = DateTime::<Utc>::from_timestamp_micros(micros)?;
    let message = match v.get("MESSAGE") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(bytes)) => bytes
            .iter()
            .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect::<Option<Vec<u8>>>()
            .and_then(|b| String::from_utf8(b).ok()),
        _ => None,
    };
    Some(JournalEntry {
        cursor: cursor.to_owned(),
        at,
        message,
    })
}

/// A login to `account` ([`ACCOUNT`] on a host) accepted at `at`, attributed against the
/// applied list's checked keys; `None` when it is not one this module reports (another
/// account, not a key).
pub fn attribute(
    accepted: &Accepted,
    account: &str,
    at: DateTime<Utc>,
    keys: &[CheckedKey],
) -> Option<OperatorLogin> {
    if accepted.user != account || accepted.method != "publickey" {
        return None;
    }
    let fingerprint = accepted.fingerprint.clone()?;
    let user_sub = keys
        .iter()
        .find(|k| k.fingerprint == fingerprint)
        .map(|k| k.key.user_sub.clone());
    Some(OperatorLogin {
        at,
        source: accepted.source.to_string(),
        source_port: accepted.source_port,
        fingerprint,
        user_sub,
        certificate: accepted.certificate.clone(),
    })
}

/// What one read of the journal gives a beat.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    /// At most the `max` asked for, oldest first.
    pub logins: Vec<OperatorLogin>,
    /// Where the next read starts (`--after-cursor`), once this batch is delivered; `None`
    /// when nothing was read (keep the old one).
    pub cursor: Option<String>,
    /// Logins are left for the next beat.
    pub more: bool,
}

/// Read `journalctl -o json` output: the logins to `account` to report, at most `max`, and
/// the cursor of the last entry taken. Lines that are not entries are skipped; an entry past
/// the `max`-th login is not taken, so the next read starts with it.
pub fn read_batch(output: &str, account: &str, keys: &[CheckedKey], max: usize) -> Batch {
    let mut batch = Batch::default();
    for entry in output.lines().filter_map(parse_journal_line) {
        let login = entry
            .message
            .as_deref()
            .and_then(parse_message)
            .and_then(|a| attribute(&a, account, entry.at, keys));
        if let Some(login) = login {
            if batch.logins.len() >= max {
                batch.more = true;
                break;
            }
            batch.logins.push(login);
        }
        batch.cursor = Some(entry.cursor);
    }
    batch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keylist_testing as t;

    /// Lines as Debian's sshd (OpenSSH 9.2) writes them, `sshd -e` and the journal alike.
    const OPERATOR: &str =
        "Accepted publickey for spark from 10.8.0.1 port 50522 ssh2: ED25519 SHA256:";

    fn key() -> CheckedKey {
        crate::keylist::check_key(&t::login_key("op-sub-1", "laptop")).unwrap()
    }

    fn journal(cursor: &str, micros: i64, message: &str) -> String {
        serde_json::json!({
            "__CURSOR": cursor,
            "__REALTIME_TIMESTAMP": micros.to_string(),
            "_SYSTEMD_UNIT": "ssh.service",
            "SYSLOG_IDENTIFIER": "sshd",
            "MESSAGE": message,
        })
        .to_string()
    }

    #[test]
    fn sshds_accepted_lines_are_read_word_for_word() {
        let fp = "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU";
        let got = parse_message(&format!(
            "Accepted publickey for spark from 10.8.0.1 port 50522 ssh2: ED25519 {fp}"
        ))
        .unwrap();
        assert_eq!(
            got,
            Accepted {
                method: "publickey".into(),
                user: "spark".into(),
                source: "10.8.0.1".parse().unwrap(),
                source_port: 50522,
                key_type: Some("ED25519".into()),
                fingerprint: Some(fp.into()),
                certificate: None,
            }
        );
        // A security key, an IPv6 source, a certificate (its own fingerprint first).
        let sk = parse_message(&format!(
            "Accepted publickey for spark from 2001:db8::7 port 22 ssh2: ED25519-SK {fp}"
        ))
        .unwrap();
        assert_eq!(
            (sk.source.to_string().as_str(), sk.key_type.as_deref()),
            ("2001:db8::7", Some("ED25519-SK"))
        );
        let cert = parse_message(&format!("Accepted publickey for spark from 10.8.0.1 port 1 ssh2: ED25519-CERT {fp} ID op (serial 0) CA ED25519 SHA256:abc")).unwrap();
        assert_eq!(cert.fingerprint.as_deref(), Some(fp));
        assert_eq!(cert.certificate.as_deref(), Some("op (serial 0)"));
        // Break glass (#39, 5): the ID `byo keys break-glass` writes, as OpenSSH 9.2 logs it.
        let bg = parse_message(&format!("Accepted publickey for spark from 10.8.0.1 port 40022 ssh2: ED25519-CERT {fp} ID break-glass:op@enverge.ai:spark-7 (serial 7311) CA ED25519 SHA256:abc")).unwrap();
        assert_eq!(
            bg.certificate.as_deref(),
            Some("break-glass:op@enverge.ai:spark-7 (serial 7311)")
        );
        // A certificate line that does not read is not half-read.
        for tail in [
            "",
            "ID  (serial 1) CA ED25519 SHA256:abc",
            "ID op (serial ) CA ED25519 SHA256:abc",
            "ID op (serial x1) CA ED25519 SHA256:abc",
            "op (serial 1) CA ED25519 SHA256:abc",
            "ID op\u{1b}[2J (serial 1) CA ED25519 SHA256:abc",
        ] {
            let line = format!(
                "Accepted publickey for spark from 10.8.0.1 port 1 ssh2: ED25519-CERT {fp} {tail}"
            );
            assert_eq!(parse_message(&line), None, "{line:?}");
        }
        let long = format!(
            "Accepted publickey for spark from 10.8.0.1 port 1 ssh2: ED25519-CERT {fp} ID {} (serial 1) CA ED25519 SHA256:abc",
            "i".repeat(200)
        );
        assert_eq!(parse_message(&long), None);
        // A password login has no key.
        let pw =
            parse_message("Accepted password for owner from 192.168.1.5 port 40000 ssh2").unwrap();
        assert_eq!((pw.method.as_str(), pw.fingerprint), ("password", None));
        // Not accepted lines.
        for line in [
            "",
            "Accepted",
            "Failed publickey for spark from 10.8.0.1 port 50522 ssh2: ED25519 SHA256:abc",
            "Connection closed by authenticating user spark 10.8.0.1 port 50522 [preauth]",
            "Accepted publickey for spark from not-an-address port 1 ssh2: ED25519 SHA256:abc",
            "Accepted publickey for spark from 10.8.0.1 port 99999 ssh2: ED25519 SHA256:abc",
            "Accepted publickey for spark from 10.8.0.1 port 1 ssh2: ED25519 MD5:aa:bb",
            "Accepted publickey for spark from 10.8.0.1 port 1 ssh2: ED25519",
            "Accepted publickey for spark from 10.8.0.1 port 1 ssh3: ED25519 SHA256:abc",
            "Accepted publickey spark from 10.8.0.1 port 1 ssh2: ED25519 SHA256:abc",
            "Accepted publickey for spark to 10.8.0.1 port 1 ssh2: ED25519 SHA256:abc",
            "Accepted publickey for spark from 10.8.0.1 gate 1 ssh2: ED25519 SHA256:abc",
            "Accepted publickey for spark from 10.8.0.1 port 1 ssh2: ED25519 SHA256:",
            "Accepted publickey for spark from 10.8.0.1 port 1 ssh2: ED25519 SHA256:a\u{7}b",
            "Accepted publickey for spark from 10.8.0.1 port 1 ssh2:  SHA256:abc",
            "Accepted publickey for  from 10.8.0.1 port 1 ssh2: ED25519 SHA256:abc",
            "Accepted  for spark from 10.8.0.1 port 1 ssh2: ED25519 SHA256:abc",
        ] {
            assert_eq!(parse_message(line), None, "{line:?}");
        }
        // Bounds: a user, a key type and a fingerprint each no longer than sshd writes them.
        let at_most = |user: usize, kind: usize, fp: usize| {
            parse_message(&format!(
                "Accepted publickey for {} from 10.8.0.1 port 1 ssh2: {} SHA256:{}",
                "u".repeat(user),
                "K".repeat(kind),
                "f".repeat(fp)
            ))
            .is_some()
        };
        assert!(at_most(64, 32, 73));
        assert!(!at_most(65, 32, 73));
        assert!(!at_most(64, 33, 73));
        assert!(!at_most(64, 32, 74));
    }

    #[test]
    fn a_login_is_its_operator_only_by_the_applied_lists_fingerprint() {
        let k = key();
        let at: DateTime<Utc> = "2026-12-01T01:00:00Z".parse().unwrap();
        let ours = parse_message(&format!(
            "{OPERATOR}{}",
            k.fingerprint.trim_start_matches("SHA256:")
        ))
        .unwrap();
        assert_eq!(
            attribute(&ours, ACCOUNT, at, std::slice::from_ref(&k)),
            Some(OperatorLogin {
                at,
                source: "10.8.0.1".into(),
                source_port: 50522,
                fingerprint: k.fingerprint.clone(),
                user_sub: Some("op-sub-1".into()),
                certificate: None,
            })
        );
        // Presented with a certificate (break glass): the certificate goes with the login.
        let certified = Accepted {
            certificate: Some("break-glass:op:spark-7 (serial 1)".into()),
            ..ours.clone()
        };
        let login = attribute(&certified, ACCOUNT, at, std::slice::from_ref(&k)).unwrap();
        assert_eq!(
            (login.user_sub.as_deref(), login.certificate.as_deref()),
            (Some("op-sub-1"), Some("break-glass:op:spark-7 (serial 1)"))
        );
        // The same key against a list without it: not an operator key, still reported.
        assert_eq!(attribute(&ours, ACCOUNT, at, &[]).unwrap().user_sub, None);
        let other = key();
        assert_eq!(
            attribute(&ours, ACCOUNT, at, &[other]).unwrap().user_sub,
            None
        );
        // Another account, or no key: not ours to report.
        let owner = Accepted {
            user: "owner".into(),
            ..ours.clone()
        };
        assert_eq!(
            attribute(&owner, ACCOUNT, at, std::slice::from_ref(&k)),
            None
        );
        let pw = Accepted {
            method: "password".into(),
            fingerprint: None,
            ..ours.clone()
        };
        assert_eq!(attribute(&pw, ACCOUNT, at, std::slice::from_ref(&k)), None);
        let keyboard = Accepted {
            method: "keyboard-interactive/pam".into(),
            ..ours
        };
        assert_eq!(attribute(&keyboard, ACCOUNT, at, &[k]), None);
    }

    #[test]
    fn the_journals_entries_give_cursor_time_and_message() {
        let e = parse_journal_line(&journal("s=1;i=2", 1_764_550_800_123_456, "hello")).unwrap();
        assert_eq!(e.cursor, "s=1;i=2");
        assert_eq!(
            e.at,
            "2025-12-01T01:00:00.123456Z"
                .parse::<DateTime<Utc>>()
                .unwrap()
        );
        assert_eq!(e.message.as_deref(), Some("hello"));
        // A message journald could only give as bytes.
        let bytes = r#"{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":[72,105]}"#;
        assert_eq!(
            parse_journal_line(bytes).unwrap().message.as_deref(),
            Some("Hi")
        );
        let not_utf8 = r#"{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1","MESSAGE":[255,300]}"#;
        assert_eq!(parse_journal_line(not_utf8).unwrap().message, None);
        // A cursor as long as journald's (well under 512) is taken; a longer one is not.
        assert!(parse_journal_line(&journal(&"c".repeat(512), 1, "m")).is_some());
        assert_eq!(parse_journal_line(&journal(&"c".repeat(513), 1, "m")), None);
        let no_message = r#"{"__CURSOR":"c","__REALTIME_TIMESTAMP":"1"}"#;
        assert_eq!(parse_journal_line(no_message).unwrap().message, None);
        for line in [
            "",
            "-- No entries --",
            "{}",
            r#"{"__CURSOR":"c"}"#,
            r#"{"__CURSOR":"","__REALTIME_TIMESTAMP":"1"}"#,
            r#"{"__CURSOR":"c\n","__REALTIME_TIMESTAMP":"1"}"#,
            r#"{"__CURSOR":1,"__REALTIME_TIMESTAMP":"1"}"#,
            r#"{"__CURSOR":"c","__REALTIME_TIMESTAMP":"soon"}"#,
            r#"{"__CURSOR":"c","__REALTIME_TIMESTAMP":"9223372036854775807"}"#,
        ] {
            assert_eq!(parse_journal_line(line), None, "{line:?}");
        }
    }

    #[test]
    fn a_batch_is_bounded_and_its_cursor_never_passes_a_login_left_over() {
        let k = key();
        let login = format!("{OPERATOR}{}", k.fingerprint.trim_start_matches("SHA256:"));
        let out = [
            journal("c1", 1_000_000, "Server listening on 0.0.0.0 port 22."),
            journal("c2", 2_000_000, &login),
            "not json".to_owned(),
            journal(
                "c3",
                3_000_000,
                "Accepted publickey for owner from 192.168.1.5 port 2 ssh2: ED25519 SHA256:abc",
            ),
            journal("c4", 4_000_000, &login.replace("50522", "50523")),
            journal("c5", 5_000_000, &login.replace("50522", "50524")),
            journal(
                "c6",
                6_000_000,
                "Disconnected from user spark 10.8.0.1 port 50522",
            ),
        ]
        .join("\n");
        let keys = std::slice::from_ref(&k);
        let all = read_batch(&out, ACCOUNT, keys, 12);
        assert_eq!(
            all.logins.iter().map(|l| l.source_port).collect::<Vec<_>>(),
            [50522, 50523, 50524]
        );
        assert_eq!((all.cursor.as_deref(), all.more), (Some("c6"), false));
        assert!(
            all.logins
                .iter()
                .all(|l| l.user_sub.as_deref() == Some("op-sub-1"))
        );
        // Two per beat: the third waits, and the cursor stops before it.
        let first = read_batch(&out, ACCOUNT, keys, 2);
        assert_eq!(first.logins.len(), 2);
        assert_eq!((first.cursor.as_deref(), first.more), (Some("c4"), true));
        // The next read starts after c4 (journalctl's --after-cursor): the rest, once.
        let after: String = out.lines().skip(5).collect::<Vec<_>>().join("\n");
        let second = read_batch(&after, ACCOUNT, keys, 2);
        assert_eq!(
            second
                .logins
                .iter()
                .map(|l| l.source_port)
                .collect::<Vec<_>>(),
            [50524]
        );
        assert_eq!((second.cursor.as_deref(), second.more), (Some("c6"), false));
        // Exactly at the bound: not "more".
        let three = read_batch(&out, ACCOUNT, keys, 3);
        assert_eq!((three.logins.len(), three.more), (3, false));
        // Nothing read: the old cursor stands.
        assert_eq!(read_batch("", ACCOUNT, keys, 2), Batch::default());
        assert_eq!(
            read_batch("-- No entries --", ACCOUNT, keys, 2).cursor,
            None
        );
        // A bound of zero takes no login and stops before the first.
        let none = read_batch(&out, ACCOUNT, keys, 0);
        assert_eq!(
            (none.logins.len(), none.cursor.as_deref(), none.more),
            (0, Some("c1"), true)
        );
    }

    mod never_panics {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn on_arbitrary_messages(s in ".{0,300}") {
                let _ = parse_message(&s);
                let _ = parse_message(&format!("Accepted publickey for spark from {s}"));
            }

            #[test]
            fn on_arbitrary_journal_lines(s in ".{0,300}", n in any::<i64>()) {
                let _ = parse_journal_line(&s);
                let line = journal(&s, n, &format!("Accepted publickey for spark from 10.8.0.1 port 1 ssh2: ED25519 {s}"));
                let _ = read_batch(&line, ACCOUNT, &[], 3);
            }
        }
    }
}
