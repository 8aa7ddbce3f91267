//! Rate limits on the doors that check a secret (#16): sign-in, sign-up, password change
//! and redeem. One keyed limiter per address (every such request, before any rule or hash
//! runs, `routes::limit_by_address`) and one per account (sign-in by the email asked for, a password change by the
//! user), from the `governor` crate: a burst of the configured size per minute, refilled
//! evenly. Past it, 429 with `Retry-After` — the backoff — and nothing else happens: no
//! hash is computed and no row is read.
//!
//! The address is the TCP peer's (`ConnectInfo`); behind a reverse proxy that is the
//! proxy's, which then limits everyone together — put the limit in the proxy there too.

use std::net::IpAddr;
use std::num::NonZeroU32;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::config::RateLimitConfig;
use crate::error::AppError;

/// The requests limited per address: the doors that check a secret.
pub const LIMITED: &[(&str, &str)] = &[
    ("POST", "/api/auth/login"),
    ("POST", "/api/auth/signup"),
    ("POST", "/api/me/password"),
    ("POST", "/api/enroll"),
    ("POST", "/login"),
    ("POST", "/signup"),
];

pub struct RateLimits {
    by_address: DefaultKeyedRateLimiter<IpAddr>,
    by_account: DefaultKeyedRateLimiter<String>,
}

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n.max(1)).expect("at least one"))
}

impl RateLimits {
    pub fn new(config: &RateLimitConfig) -> Self {
        RateLimits {
            by_address: RateLimiter::keyed(per_minute(config.per_address_per_minute)),
            by_account: RateLimiter::keyed(per_minute(config.per_account_per_minute)),
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

    /// One attempt at `account` (a normalised email, or a user's sub).
    pub fn account(&self, account: &str) -> Result<(), AppError> {
        self.by_account
            .check_key(&account.to_owned())
            .map_err(Self::refused)
    }

    /// Forget keys that are back to a full burst (called now and then, so the maps do not
    /// grow with every address ever seen).
    pub fn tidy(&self) {
        self.by_address.retain_recent();
        self.by_account.retain_recent();
    }
}
