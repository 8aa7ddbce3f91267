//! Notices' decisions (issue #38, 3), pure with time passed in: when a failed delivery is
//! tried again and when it is given up, which open conditions have cleared, and the
//! signature an outbound webhook carries.

use chrono::TimeDelta;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A notice is given up after this many attempts that each failed for a reason that may
/// pass (a refused connection, a 4xx from SMTP, a webhook answering 503). With the backoff
/// below that is about five hours of trying.
pub const MAX_ATTEMPTS: i32 = 12;

/// The first retry's wait; each later one doubles, to at most [`MAX_RETRY_WAIT_MINUTES`].
pub const FIRST_RETRY_SECS: i64 = 30;
pub const MAX_RETRY_WAIT_MINUTES: i64 = 60;

/// How long to wait before the next try, after `attempts` failed ones (1 for the first).
pub fn retry_after(attempts: i32) -> TimeDelta {
    let doublings = u32::try_from(attempts.saturating_sub(1))
        .unwrap_or(0)
        .min(16);
    let secs = FIRST_RETRY_SECS.saturating_mul(1_i64 << doublings);
    TimeDelta::seconds(secs.min(MAX_RETRY_WAIT_MINUTES * 60))
}

/// What becomes of a notice after an attempt in which something failed: tried again after
/// [`retry_after`], or given up when the failure is permanent (a 5xx from SMTP: the address
/// does not exist) or the attempts are spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    RetryIn(TimeDelta),
    GiveUp,
}

/// `attempts` counts this one.
pub fn after_failure(attempts: i32, permanent: bool) -> AfterFailure {
    if permanent || attempts >= MAX_ATTEMPTS {
        AfterFailure::GiveUp
    } else {
        AfterFailure::RetryIn(retry_after(attempts))
    }
}

/// The open conditions that are no longer present: each is cleared, so its return is a
/// new notice.
pub fn cleared<'a>(open: &'a [String], present: &[String]) -> Vec<&'a str> {
    open.iter()
        .filter(|c| !present.contains(c))
        .map(String::as_str)
        .collect()
}

/// The days before a key list's expiry at which operators are told (issue #39, 5): a month
/// out, then at the pages' own warnings (14, 7, 1), and once it has expired (0).
pub const KEY_LIST_NOTICE_DAYS: [i64; 5] = [0, 1, 7, 14, 30];

/// Which of [`KEY_LIST_NOTICE_DAYS`] a list expiring at `expires` is within at `now`, the
/// nearest first; `None` more than a month out.
pub fn key_list_notice(
    expires: chrono::DateTime<chrono::Utc>,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<i64> {
    let left = expires - now;
    KEY_LIST_NOTICE_DAYS
        .into_iter()
        .find(|d| left <= TimeDelta::days(*d))
}

/// The header an outbound webhook's signature travels in: `v1=<hex>`, the HMAC-SHA256
/// under the shared secret of `<timestamp>.<body>` (the timestamp is the
/// [`WEBHOOK_TIMESTAMP_HEADER`]'s, Unix seconds), so a receiver can refuse a replayed body.
pub const WEBHOOK_SIGNATURE_HEADER: &str = "byo-signature";
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "byo-timestamp";
/// The notice's id: the same id on a re-delivery lets a receiver drop the duplicate.
pub const WEBHOOK_ID_HEADER: &str = "byo-notice-id";

pub fn webhook_signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_thirty_seconds_to_an_hour() {
        let waits: Vec<i64> = (1..=9).map(|a| retry_after(a).num_seconds()).collect();
        assert_eq!(waits, [30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert_eq!(retry_after(0).num_seconds(), 30);
        assert_eq!(retry_after(i32::MAX).num_seconds(), 3600);
        let total: i64 = (1..MAX_ATTEMPTS)
            .map(|a| retry_after(a).num_seconds())
            .sum();
        assert_eq!(total, 18_210, "about five hours of trying");
    }

    #[test]
    fn a_permanent_refusal_or_the_last_attempt_gives_up() {
        assert_eq!(after_failure(1, true), AfterFailure::GiveUp);
        assert_eq!(after_failure(MAX_ATTEMPTS, false), AfterFailure::GiveUp);
        assert_eq!(
            after_failure(MAX_ATTEMPTS - 1, false),
            AfterFailure::RetryIn(retry_after(MAX_ATTEMPTS - 1))
        );
        assert_eq!(
            after_failure(1, false),
            AfterFailure::RetryIn(TimeDelta::seconds(30))
        );
    }

    #[test]
    fn the_key_list_is_noticed_a_month_out_then_at_14_7_1_and_expired() {
        let expires: chrono::DateTime<chrono::Utc> = "2027-03-01T12:00:00Z".parse().unwrap();
        let at = |d: i64, s: i64| expires - TimeDelta::days(d) - TimeDelta::seconds(s);
        assert_eq!(key_list_notice(expires, at(30, 1)), None);
        assert_eq!(key_list_notice(expires, at(30, 0)), Some(30));
        assert_eq!(key_list_notice(expires, at(14, 1)), Some(30));
        assert_eq!(key_list_notice(expires, at(14, 0)), Some(14));
        assert_eq!(key_list_notice(expires, at(7, 0)), Some(7));
        assert_eq!(key_list_notice(expires, at(1, 0)), Some(1));
        assert_eq!(key_list_notice(expires, at(0, 1)), Some(1));
        assert_eq!(key_list_notice(expires, at(0, 0)), Some(0));
        assert_eq!(key_list_notice(expires, at(-3, 0)), Some(0));
    }

    #[test]
    fn only_conditions_no_longer_present_clear() {
        let open = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
        assert_eq!(
            cleared(&open, &["b".to_owned(), "d".to_owned()]),
            ["a", "c"]
        );
        assert!(cleared(&open, &open).is_empty());
        assert!(cleared(&[], &open).is_empty());
    }

    #[test]
    fn the_signature_covers_the_timestamp_and_the_body() {
        // RFC 4231 test case 2's key and a body of our own, computed once with openssl:
        // printf '1700000000.{"a":1}' | openssl dgst -sha256 -hmac Jefe
        let sig = webhook_signature(b"Jefe", 1_700_000_000, br#"{"a":1}"#);
        assert_eq!(
            sig,
            "v1=fa5f6481efc59da48b19c9dc10196c9953e5651f8304b3a318b6b87d70272e0a"
        );
        assert_ne!(
            sig,
            webhook_signature(b"Jefe", 1_700_000_001, br#"{"a":1}"#)
        );
        assert_ne!(
            sig,
            webhook_signature(b"Jefe", 1_700_000_000, br#"{"a":2}"#)
        );
        assert_ne!(
            sig,
            webhook_signature(b"jefe", 1_700_000_000, br#"{"a":1}"#)
        );
    }
}
