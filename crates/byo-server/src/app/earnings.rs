//! Owners' earnings (issue #40, 6): every cent invoiced for an instance on an owner's host —
//! each instance-day charged, less each credit given back — split between the owner and the
//! platform at `owner_share_bps`. Each line is split on its own (the owner's part truncated
//! toward zero, the platform's the rest), so the two parts of every line add up to it exactly
//! and every cent invoiced is one or the other. Summed by month and host for the page and
//! the API; line by line for the CSV.

use byo_db::invoices::EarningLine;
use byo_wire::billing::{EarningsMonth, EarningsView};
use byo_wire::states::InvoiceStatus;

use crate::error::AppResult;
use crate::state::AppState;

/// One line's split: (the owner's, the platform's). Exact: they add up to `amount`.
pub fn split(amount_cents: i64, owner_share_bps: u32) -> (i64, i64) {
    let owner = amount_cents * i64::from(owner_share_bps.min(10_000)) / 10_000;
    (owner, amount_cents - owner)
}

/// The lines summed by month and host, newest month first.
pub fn by_month(lines: &[EarningLine], owner_share_bps: u32) -> Vec<EarningsMonth> {
    let mut months: std::collections::BTreeMap<(String, String), EarningsMonth> =
        Default::default();
    for l in lines {
        let month = l.at.format("%Y-%m").to_string();
        let m = months
            .entry((month.clone(), l.host_slug.clone()))
            .or_insert_with(|| EarningsMonth {
                month,
                host_slug: l.host_slug.clone(),
                seconds: 0,
                amount_cents: 0,
                owner_cents: 0,
                platform_cents: 0,
                owner_paid_cents: 0,
            });
        let (owner, platform) = split(l.amount_cents, owner_share_bps);
        m.seconds += l.seconds;
        m.amount_cents += l.amount_cents;
        m.owner_cents += owner;
        m.platform_cents += platform;
        if l.invoice_status == InvoiceStatus::Paid {
            m.owner_paid_cents += owner;
        }
    }
    let mut out: Vec<_> = months.into_values().collect();
    out.sort_by(|a, b| b.month.cmp(&a.month).then(a.host_slug.cmp(&b.host_slug)));
    out
}

/// The share in force: the installation's with billing on; nothing is invoiced without it.
fn share(state: &AppState) -> (u32, String) {
    match state.stripe.as_deref() {
        Some(s) => (s.config.owner_share_bps, s.config.currency.clone()),
        None => (0, "usd".to_owned()),
    }
}

/// The owner's earnings by month and host.
pub async fn mine(state: &AppState, owner_sub: &str) -> AppResult<EarningsView> {
    let (bps, currency) = share(state);
    let lines = state.store.earning_lines(Some(owner_sub)).await?;
    Ok(EarningsView {
        owner_share_bps: bps,
        currency,
        months: by_month(&lines, bps),
    })
}

/// The owner's earnings line by line, as CSV: one row per instance-day and per credit, with
/// the payout that paid the owner's part of it once one has.
pub async fn csv(state: &AppState, owner_sub: &str) -> AppResult<String> {
    let (bps, _) = share(state);
    let lines = state.store.earning_lines(Some(owner_sub)).await?;
    let mut out = String::from(
        "date,host,instance,kind,seconds,amount_cents,owner_cents,platform_cents,currency,invoice,invoice_status,payout\n",
    );
    for l in &lines {
        let (owner, platform) = split(l.amount_cents, bps);
        // Every field is ours (ids, slugs, words): none holds a comma or a quote.
        out.push_str(&format!(
            "{},{},{},{},{},{},{},{},{},{},{},{}\n",
            l.at.format("%Y-%m-%d"),
            l.host_slug,
            l.vm_id,
            l.kind,
            l.seconds,
            l.amount_cents,
            owner,
            platform,
            l.currency,
            l.invoice_id,
            l.invoice_status,
            l.payout_id.as_deref().unwrap_or("")
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::split;
    use proptest::prelude::*;

    #[test]
    fn a_line_splits_at_the_share_toward_the_platform() {
        assert_eq!(split(2880, 7000), (2016, 864));
        assert_eq!(
            split(1, 7000),
            (0, 1),
            "a cent too small to split is the platform's"
        );
        assert_eq!(split(-60, 7000), (-42, -18), "a credit comes back off both");
        assert_eq!(split(999, 10_000), (999, 0));
        assert_eq!(split(999, 0), (0, 999));
        assert_eq!(split(999, 20_000), (999, 0), "at most everything");
    }

    proptest! {
        #[test]
        fn every_cent_invoiced_is_the_owners_or_the_platforms(
            amount in -1_000_000i64..1_000_000, bps in 0u32..=10_000,
        ) {
            let (owner, platform) = split(amount, bps);
            prop_assert_eq!(owner + platform, amount);
            prop_assert!(owner.abs() <= amount.abs() && platform.abs() <= amount.abs());
        }
    }
}
