//! Rate limits on the doors that check a secret (#16): sign-in, sign-up, password change,
//! redeem and a relay's fetch of its secrets, from the `governor` crate: each a burst of the
//! configured size per minute, refilled evenly. Past one, 429 with `Retry-After` — the backoff — and nothing else
//! happens: no hash is computed and no row is read.
//!
//! - **Per address**: every such request, before any rule or hash runs
//!   (`routes::limit_by_address`).
//! - **Per account and address** (sign-in by the email asked for, a password change by the
//!   user): guessing one account's password from one place.
//! - **Per account, for sources it has not been signed in from** (issue #36): guessing from
//!   many places. A source the account signed in from lately ([`KNOWN_FOR`]) is exempt from
//!   this one, so nobody can lock the real user out by knocking on their account from
//!   elsewhere: a limit that counted every try against the account alone, before the
//!   password was checked, let one wrong try every 5 s from anywhere keep its owner out.
//!
//! The address is the TCP peer's (`ConnectInfo`, read by [`source_of`]); behind a reverse
//! proxy that is the proxy's, which then limits everyone together — put the limit in the
//! proxy there too.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::config::RateLimitConfig;
use crate::error::AppError;

/// The requests limited per address: the doors that check a secret.
pub const LIMITED: &[(&str, &str)] = &[
    ("POST", "/api/auth/login"),
    ("POST", "/api/auth/signup"),
    ("POST", "/api/auth/signup/confirm"),
    ("PUT", "/api/me/password"),
    ("POST", "/api/enroll"),
    ("POST", "/api/relay/secrets"),
    ("POST", "/login"),
    ("POST", "/signup"),
    ("POST", "/signup/confirm"),
];

/// How long a good sign-in makes its source known to the account.
pub const KNOWN_FOR: TimeDelta = TimeDelta::days(30);
/// The most (account, source) pairs remembered; past it the oldest are forgotten first.
const KNOWN_MAX: usize = 100_000;

/// The address a request came from: the TCP peer's, or `0.0.0.0` where the listener did
/// not say (requests built in-process). The per-address limit reads it the same way.
pub fn source_of(extensions: &axum::http::Extensions) -> IpAddr {
    extensions
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip())
}

/// The extractor for [`source_of`]: never refuses.
#[derive(Clone, Copy, Debug)]
pub struct Source(pub IpAddr);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Source {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Source(source_of(&parts.extensions)))
    }
}

pub struct RateLimits {
    by_address: DefaultKeyedRateLimiter<IpAddr>,
    by_account_and_source: DefaultKeyedRateLimiter<(String, IpAddr)>,
    by_account: DefaultKeyedRateLimiter<String>,
    /// (account, source) → the last good sign-in from there.
    known: Mutex<HashMap<(String, IpAddr), DateTime<Utc>>>,
}

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n.max(1)).expect("at least one"))
}

impl RateLimits {
    pub fn new(config: &RateLimitConfig) -> Self {
        RateLimits {
            by_address: RateLimiter::keyed(per_minute(config.per_address_per_minute)),
            by_account_and_source: RateLimiter::keyed(per_minute(config.per_account_per_minute)),
            by_account: RateLimiter::keyed(per_minute(config.per_account_per_minute)),
            known: Mutex::new(HashMap::new()),
        }
    }

    fn refused(wait: governor::NotUntil<governor::clock::QuantaInstant>) -> AppError {
        let secs = wait.wait_time_from(DefaultClock::default().now()).as_secs() + 1;
        AppError::TooManyRequests {
            retry_after_secs: secs,
        }
    }

    /// One attempt from `address`.
    pub fn address(&self, address: IpAddr) -> Result<(), AppError> {
        self.by_address.check_key(&address).map_err(Self::refused)
    }

    /// One attempt at `account` (a normalised email, or a user's sub) from `source`: its
    /// own limit per source, and the account's across every source it is not known from.
    pub fn account(
        &self,
        account: &str,
        source: IpAddr,
        now: DateTime<Utc>,
    ) -> Result<(), AppError> {
        let key = (account.to_owned(), source);
        self.by_account_and_source
            .check_key(&key)
            .map_err(Self::refused)?;
        if self.is_known(&key, now) {
            return Ok(());
        }
        self.by_account.check_key(&key.0).map_err(Self::refused)
    }

    fn is_known(&self, key: &(String, IpAddr), now: DateTime<Utc>) -> bool {
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.get(key).is_some_and(|at| now - *at < KNOWN_FOR)
    }

    /// `account` signed in from `source` with the right password: the source is known to
    /// it from now on, for [`KNOWN_FOR`].
    pub fn signed_in(&self, account: &str, source: IpAddr, now: DateTime<Utc>) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        if known.len() >= KNOWN_MAX {
            known.retain(|_, at| now - *at < KNOWN_FOR);
            if known.len() >= KNOWN_MAX {
                // Still full of recent ones: forget the oldest tenth in one pass.
                let mut ages: Vec<DateTime<Utc>> = known.values().copied().collect();
                ages.sort_unstable();
                let cut = ages[KNOWN_MAX / 10];
                known.retain(|_, at| *at > cut);
            }
        }
        known.insert((account.to_owned(), source), now);
    }

    /// Forget keys that are back to a full burst (called now and then, so the maps do not
    /// grow with every address ever seen).
    pub fn tidy(&self, now: DateTime<Utc>) {
        self.by_address.retain_recent();
        self.by_account_and_source.retain_recent();
        self.by_account.retain_recent();
        self.known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, at| now - *at < KNOWN_FOR);
    }
}
