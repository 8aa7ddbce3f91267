//! Billing (issue #13): whether an account may be charged, asked live by the callers that
//! act with nobody present (E2's drain re-checks it per attempt rather than trusting the
//! queued row). `byo up` runs with billing off: every account may be charged and nothing is.

use futures::future::BoxFuture;

use crate::error::AppResult;

/// The answer to "may this account be charged now?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Charge {
    Allowed,
    /// Not chargeable now, with the reason a customer and an operator can read.
    Refused {
        reason: String,
    },
}

/// The live billing check (E2).
pub trait BillingGate: Send + Sync {
    fn may_charge<'a>(&'a self, user_sub: &'a str) -> BoxFuture<'a, AppResult<Charge>>;
    /// Whether billing is on at all (the pages say so when it is not).
    fn enabled(&self) -> bool;
}

/// Billing off (`byo up`, or no Stripe configured): everyone may rent, nobody is charged.
pub struct BillingOff;

impl BillingGate for BillingOff {
    fn may_charge<'a>(&'a self, _user_sub: &'a str) -> BoxFuture<'a, AppResult<Charge>> {
        Box::pin(async { Ok(Charge::Allowed) })
    }
    fn enabled(&self) -> bool {
        false
    }
}
