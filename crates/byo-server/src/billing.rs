//! Billing's gate (issue #13): whether an account may be charged, asked live by the callers
//! that act with nobody present (E2's drain re-checks it per attempt rather than trusting
//! the queued row). `byo up` runs with billing off: every account may be charged and
//! nothing is. With `[billing]` configured the gate is [`StripeBilling`], which asks Stripe.
//!
//! It sits beside `state` rather than in `app` (as `queue` does) because `AppState` holds
//! it: `state` never imports `app`. The rest of billing (Checkout, the webhook, usage) is
//! `app::billing`, which re-exports these.

use std::sync::Arc;

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

use crate::error::{AppError, AppResult};
use crate::providers::stripe::{BillingConfig, StripeClient};

/// The answer to "may this account be charged now?".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Charge {
    Allowed,
    /// Not chargeable now, with the reason a customer and an operator can read.
    Refused {
        reason: String,
    },
}

/// An amount in the currency's smallest unit, as a person reads it: `12.34 USD`.
pub fn money(cents: i64, currency: &str) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let c = cents.unsigned_abs();
    format!(
        "{sign}{}.{:02} {}",
        c / 100,
        c % 100,
        currency.to_uppercase()
    )
}

/// An expanded payment method as a person reads it: `visa ending 4242, expires 12/2099`;
/// a payment method that is not a card by its type.
fn describe_card(pm: &serde_json::Value) -> Option<String> {
    let card = pm.get("card");
    match card {
        Some(c) => Some(format!(
            "{} ending {}, expires {:02}/{}",
            c["brand"].as_str().unwrap_or("card"),
            c["last4"].as_str().unwrap_or("????"),
            c["exp_month"].as_i64().unwrap_or(0),
            c["exp_year"].as_i64().unwrap_or(0)
        )),
        None => pm["type"].as_str().map(str::to_owned),
    }
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

/// Billing on Stripe: the live gate, and the client and configuration the rest of billing
/// uses.
pub struct StripeBilling {
    pub client: StripeClient,
    pub config: BillingConfig,
    store: byo_db::Store,
}

impl StripeBilling {
    pub fn new(config: BillingConfig, store: byo_db::Store) -> Self {
        StripeBilling {
            client: StripeClient::new(&config),
            config,
            store,
        }
    }

    /// The live check. A definite answer from Stripe (no customer, no default payment
    /// method, the last payment declined, the card expired, the customer gone) is
    /// `Refused`; an outage (no answer, 5xx, 429) is an error, so a caller leaves its work
    /// for later instead of placing an instance nobody can bill.
    pub async fn check(&self, user_sub: &str, now: DateTime<Utc>) -> AppResult<Charge> {
        // A declined invoice still unpaid holds the account (issue #40, 2), whatever Stripe
        // says of the card now: asked here first, so the hold needs no Stripe call.
        if let Some(held) = self.held(user_sub).await? {
            return Ok(held);
        }
        Ok(self.ask_stripe(user_sub, now).await?.0)
    }

    /// [`Self::check`]'s answer and the card on file, for the Billing page (one Stripe call).
    pub async fn inspect(
        &self,
        user_sub: &str,
        now: DateTime<Utc>,
    ) -> AppResult<(Charge, Option<String>)> {
        let (charge, card) = self.ask_stripe(user_sub, now).await?;
        Ok((self.held(user_sub).await?.unwrap_or(charge), card))
    }

    async fn held(&self, user_sub: &str) -> AppResult<Option<Charge>> {
        let Some(unpaid) = self.store.declined_unpaid_invoice(user_sub).await? else {
            return Ok(None);
        };
        let when = unpaid
            .payment_failed_at
            .map(|t| t.format(" on %Y-%m-%d").to_string())
            .unwrap_or_default();
        Ok(Some(Charge::Refused {
            reason: format!(
                "an invoice of {} is unpaid: its payment was declined{when}. Pay it from the \
                 Billing page (/billing)",
                money(i64::from(unpaid.amount_cents), &unpaid.currency)
            ),
        }))
    }

    /// What Stripe says: may the account be charged, and its card as a person reads it.
    async fn ask_stripe(
        &self,
        user_sub: &str,
        now: DateTime<Utc>,
    ) -> AppResult<(Charge, Option<String>)> {
        let refused = |reason: &str| {
            Ok((
                Charge::Refused {
                    reason: reason.to_owned(),
                },
                None,
            ))
        };
        let Some(customer) = self.store.stripe_customer(user_sub).await? else {
            return refused("no payment method: add one on the Billing page");
        };
        let c = match self.client.retrieve_customer(&customer).await {
            Ok(c) => c,
            Err(e) if e.code() == Some("resource_missing") => {
                return refused(
                    "the account's Stripe customer no longer exists: add a payment method again",
                );
            }
            Err(e) if e.is_outage() => {
                return Err(AppError::Internal(anyhow!("the live billing check: {e}")));
            }
            Err(e) => return refused(&format!("Stripe refused the billing check: {e}")),
        };
        if c.deleted {
            return refused(
                "the account's Stripe customer was deleted: add a payment method again",
            );
        }
        let Some(pm) = c
            .invoice_settings
            .default_payment_method
            .filter(|v| !v.is_null())
        else {
            return refused("no payment method: add one on the Billing page");
        };
        let described = describe_card(&pm);
        let refused = |reason: &str| {
            Ok((
                Charge::Refused {
                    reason: reason.to_owned(),
                },
                described.clone(),
            ))
        };
        if c.delinquent {
            return refused("the last payment was declined: add another payment method");
        }
        if let Some(card) = pm.get("card") {
            let (y, m) = (card["exp_year"].as_i64(), card["exp_month"].as_i64());
            if let (Some(y), Some(m)) = (y, m) {
                use chrono::Datelike;
                let (ny, nm) = (i64::from(now.year()), i64::from(now.month()));
                if (y, m) < (ny, nm) {
                    return refused("the card on file has expired: add another payment method");
                }
            }
        }
        Ok((Charge::Allowed, described))
    }
}

/// [`StripeBilling`] as the gate; it reads time from the system clock (the state's clock
/// is not reachable from the trait).
pub struct StripeGate(pub Arc<StripeBilling>, pub crate::clock::Clock);

impl BillingGate for StripeGate {
    fn may_charge<'a>(&'a self, user_sub: &'a str) -> BoxFuture<'a, AppResult<Charge>> {
        Box::pin(async move { self.0.check(user_sub, self.1.now()).await })
    }
    fn enabled(&self) -> bool {
        true
    }
}
