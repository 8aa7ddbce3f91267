//! Owners' payouts through Stripe Connect (issue #40, 6; `docs/billing.md`, "Payouts").
//!
//! - An owner connects a Stripe account from their page: an Express account made once
//!   (`POST /v1/accounts`, key `connect-account-<sub>`), then Stripe's onboarding
//!   (`POST /v1/account_links`). Whether it can take transfers is asked of Stripe live — on
//!   the owner's page until it can, and before every payout.
//! - The job `pay-owners`, once a month has ended: each connected owner's payout for it is
//!   made here first — their part of every charge and credit on their hosts whose invoice was
//!   paid before the month ended and that no payout took, each line split exactly as the
//!   earnings page splits it — and then transferred (`POST /v1/transfers`).
//! - A refused or unanswered transfer is counted, its reason shown to the owner and the
//!   operators, and tried again after a backoff. Stripe answers a key's first result again for
//!   24 hours, errors included, so each attempt has its own key (`payout-<id>-<attempt>`);
//!   what keeps a payout from being paid twice is its transfer group (`payout-<id>`), which
//!   every attempt after the first looks up before it transfers.

use std::time::Duration;

use byo_db::payouts::{NewPayout, PayoutRow};
use byo_wire::billing::{CheckoutView, PayoutAccountView, PayoutView, PayoutsView};
use chrono::{DateTime, TimeDelta, Utc};

use super::billing::{self, StripeBilling};
use crate::auth::CurrentUser;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// The job's name.
pub const PAY_OWNERS: &str = "pay-owners";
/// How often `pay-owners` runs: payouts are monthly, retries hourly at the soonest.
pub const PAY_OWNERS_EVERY: Duration = Duration::from_secs(60 * 60);
/// How many payouts an owner's page lists (two years of months).
pub const PAYOUTS_LISTED: i64 = 24;

/// After a payout's `attempts`-th refused transfer, how long until the next: an hour,
/// doubling, at most a day.
pub fn backoff(attempts: i32) -> TimeDelta {
    let doublings = attempts.clamp(1, 6) - 1;
    TimeDelta::hours(1 << doublings).min(TimeDelta::hours(24))
}

/// The payout due now: the month that ended last (`2026-11` in December), and the cutoff —
/// lines whose invoice was paid before the first of this month.
pub fn due_month(now: DateTime<Utc>) -> (String, DateTime<Utc>) {
    let cutoff = billing::invoicing::month_start(now);
    let month = (cutoff - TimeDelta::days(1)).format("%Y-%m").to_string();
    (month, cutoff)
}

/// A payout's transfer group at Stripe: the one name every attempt shares.
pub fn transfer_group(payout_id: &str) -> String {
    format!("payout-{payout_id}")
}

/// One payout as its owner and the operators read it.
pub(crate) fn payout_view(p: PayoutRow) -> PayoutView {
    PayoutView {
        id: p.id,
        month: p.month,
        amount_cents: p.amount_cents,
        currency: p.currency,
        status: p.status,
        stripe_transfer_id: p.stripe_transfer_id,
        attempts: p.attempts,
        last_error: p.last_error,
        next_attempt_at: p.next_attempt_at,
        paid_at: p.paid_at,
    }
}

/// A Stripe onboarding page for the caller's connected account, made on first use. Refused
/// with billing off, and for an account that has never had a host (payouts are an owner's).
pub async fn connect(state: &AppState, user: &CurrentUser) -> AppResult<CheckoutView> {
    let stripe = billing::stripe_of(state)?;
    if state.store.hosts_of(&user.user.sub).await?.is_empty() {
        return Err(AppError::conflict(
            "not_an_owner",
            "payouts are for owners: add a GPU on /hosts first, then connect where its earnings are paid",
        ));
    }
    let account = match state.store.payout_account(&user.user.sub).await? {
        Some(a) => a.stripe_account_id,
        None => {
            let made = stripe
                .client
                .create_account(&user.user.sub, &user.user.email)
                .await
                .map_err(billing::stripe_failed)?;
            let kept = state
                .store
                .keep_payout_account(&user.user.sub, &made.id, state.clock.now())
                .await?;
            state
                .store
                .audit(
                    Some(&user.user.sub),
                    "payouts.account_connected",
                    Some(&user.user.sub),
                    serde_json::json!({ "stripe_account_id": kept.stripe_account_id }),
                    state.clock.now(),
                )
                .await?;
            kept.stripe_account_id
        }
    };
    let link = stripe
        .client
        .account_link(
            &account,
            &billing::page_url(state, "/hosts#payouts"),
            &billing::page_url(state, "/hosts?connected=1#payouts"),
        )
        .await
        .map_err(billing::stripe_failed)?;
    Ok(CheckoutView { url: link.url })
}

/// The owner's payouts. While their account cannot take transfers yet, Stripe is asked live
/// (they may have just finished onboarding); an unanswered ask shows what was last known.
pub async fn mine(state: &AppState, owner_sub: &str) -> AppResult<PayoutsView> {
    let Some(stripe) = state.stripe.as_deref() else {
        return Ok(PayoutsView {
            enabled: false,
            account: None,
            payouts: Vec::new(),
        });
    };
    let mut account = state.store.payout_account(owner_sub).await?;
    if let Some(a) = account.as_mut().filter(|a| !a.transfers_active)
        && let Some(active) =
            ask_transfers_active(state, stripe, owner_sub, &a.stripe_account_id).await?
    {
        a.transfers_active = active;
        a.checked_at = Some(state.clock.now());
    }
    Ok(PayoutsView {
        enabled: true,
        account: account.map(|a| PayoutAccountView {
            stripe_account_id: a.stripe_account_id,
            transfers_active: a.transfers_active,
            checked_at: a.checked_at,
        }),
        payouts: state
            .store
            .payouts_for(owner_sub, PAYOUTS_LISTED)
            .await?
            .into_iter()
            .map(payout_view)
            .collect(),
    })
}

/// Whether Stripe takes transfers to the account now, recorded; None when Stripe did not say.
async fn ask_transfers_active(
    state: &AppState,
    stripe: &StripeBilling,
    owner_sub: &str,
    account: &str,
) -> AppResult<Option<bool>> {
    match stripe.client.retrieve_account(account).await {
        Ok(a) => {
            let active = a.transfers_active();
            state
                .store
                .record_payout_account_check(owner_sub, active, state.clock.now())
                .await?;
            Ok(Some(active))
        }
        Err(e) => {
            tracing::warn!(owner = %owner_sub, account = %account, error = %e, "stripe did not say whether a connected account takes transfers");
            Ok(None)
        }
    }
}

/// What one `pay-owners` run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PayReport {
    /// Payouts made for the month that ended.
    pub opened: u32,
    /// Owners with something to pay whose account cannot take transfers yet (or Stripe did
    /// not say): their lines wait.
    pub waiting: u32,
    /// Transfers Stripe took (or had taken: found in the payout's group).
    pub paid: u32,
    /// Transfers refused or unanswered, each tried again after its backoff.
    pub failed: u32,
}

impl std::fmt::Display for PayReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} payouts made, {} owners waiting on their Stripe account; {} transferred, {} refused or unanswered",
            self.opened, self.waiting, self.paid, self.failed
        )
    }
}

/// The job `pay-owners`: make the payouts due for the month that ended, then transfer every
/// payout whose attempt is due. A database failure ends the run; a Stripe failure is that
/// payout's, recorded, and the run goes on.
pub async fn pay_owners_once(state: &AppState) -> AppResult<PayReport> {
    let mut report = PayReport::default();
    let Some(stripe) = state.stripe.as_deref() else {
        return Ok(report);
    };
    let now = state.clock.now();
    let (month, cutoff) = due_month(now);
    let bps = stripe.config.owner_share_bps;
    for owner in state.store.owners_due_payout(&month, cutoff).await? {
        let active =
            ask_transfers_active(state, stripe, &owner.user_sub, &owner.stripe_account_id).await?;
        if active != Some(true) {
            report.waiting += 1;
            continue;
        }
        let made = state
            .store
            .open_payout(
                &NewPayout {
                    user_sub: &owner.user_sub,
                    month: &month,
                    stripe_account_id: &owner.stripe_account_id,
                    currency: &stripe.config.currency,
                    owner_share_bps: bps,
                    paid_before: cutoff,
                    now,
                },
                |cents| super::earnings::split(cents, bps).0,
            )
            .await?;
        if let Some(p) = made {
            report.opened += 1;
            state
                .store
                .audit(
                    None,
                    "payout.made",
                    Some(&p.user_sub),
                    serde_json::json!({ "payout": p.id, "month": p.month, "amount_cents": p.amount_cents, "currency": p.currency }),
                    now,
                )
                .await?;
        }
    }
    for p in state.store.payouts_to_transfer(now).await? {
        match transfer(stripe, &p).await {
            Ok(transfer_id) => {
                if state.store.payout_paid(&p.id, &transfer_id, now).await?
                    == byo_db::GuardedWrite::Written
                {
                    report.paid += 1;
                    state
                        .store
                        .audit(
                            None,
                            "payout.paid",
                            Some(&p.user_sub),
                            serde_json::json!({ "payout": p.id, "month": p.month, "amount_cents": p.amount_cents, "transfer": transfer_id }),
                            now,
                        )
                        .await?;
                }
            }
            Err(e) => {
                report.failed += 1;
                let next = now + backoff(p.attempts + 1);
                tracing::warn!(payout = %p.id, owner = %p.user_sub, month = %p.month, error = %e, next_attempt = %next, "a payout's transfer failed: tried again later");
                state
                    .store
                    .payout_failed(&p.id, &e.to_string(), next, now)
                    .await?;
            }
        }
    }
    Ok(report)
}

/// Transfer a payout, once: after a first attempt, a transfer already in its group (an
/// attempt whose answer was lost) is the payout's; otherwise a new one under this attempt's
/// key. The transfer's id.
async fn transfer(
    stripe: &StripeBilling,
    p: &PayoutRow,
) -> Result<String, crate::providers::stripe::StripeError> {
    let group = transfer_group(&p.id);
    if p.attempts > 0
        && let Some(t) = stripe
            .client
            .transfers_in_group(&group)
            .await?
            .into_iter()
            .next()
    {
        return Ok(t.id);
    }
    let t = stripe
        .client
        .create_transfer(
            p.amount_cents,
            &p.currency,
            &p.stripe_account_id,
            &group,
            &[
                ("payout_id", &p.id),
                ("user_sub", &p.user_sub),
                ("month", &p.month),
            ],
            &format!("payout-{}-{}", p.id, p.attempts),
        )
        .await?;
    Ok(t.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn the_payout_due_is_the_month_that_ended_paid_before_this_one_began() {
        let now = Utc.with_ymd_and_hms(2026, 12, 1, 0, 30, 0).unwrap();
        assert_eq!(
            due_month(now),
            (
                "2026-11".to_owned(),
                Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()
            )
        );
        let january = Utc.with_ymd_and_hms(2027, 1, 31, 23, 59, 59).unwrap();
        assert_eq!(due_month(january).0, "2026-12", "across the year");
    }

    #[test]
    fn a_run_says_what_it_did() {
        let r = PayReport {
            opened: 1,
            waiting: 2,
            paid: 3,
            failed: 4,
        };
        assert_eq!(
            r.to_string(),
            "1 payouts made, 2 owners waiting on their Stripe account; 3 transferred, 4 refused or unanswered"
        );
    }

    #[test]
    fn a_refused_transfer_backs_off_from_an_hour_to_a_day() {
        let hours: Vec<i64> = (1..=8).map(|a| backoff(a).num_hours()).collect();
        assert_eq!(hours, [1, 2, 4, 8, 16, 24, 24, 24]);
        assert_eq!(backoff(0).num_hours(), 1);
    }
}
