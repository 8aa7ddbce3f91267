//! Billing as the operators see it (issue #40): the accounts held by a declined invoice, every
//! account's recent invoices, and the owners' payouts not yet transferred. Above both
//! `billing` and `payouts`, which never import it.

use byo_wire::billing::{AdminBillingView, AdminInvoice, AdminPayout, HeldAccount};

use super::billing;
use crate::error::AppResult;
use crate::state::AppState;

/// How many invoices the operators' billing page lists.
pub const ADMIN_INVOICES_LISTED: i64 = 100;

/// The operators' view: accounts held by a declined, unpaid invoice (oldest decline first)
/// with when their instances stop and how many are stopped, then every account's recent
/// invoices.
pub async fn admin_view(state: &AppState) -> AppResult<AdminBillingView> {
    let Some(stripe) = state.stripe.as_deref() else {
        return Ok(AdminBillingView {
            enabled: false,
            held: Vec::new(),
            invoices: Vec::new(),
            pending_payouts: Vec::new(),
        });
    };
    let mut emails: std::collections::BTreeMap<String, String> = Default::default();
    let mut email_of = async |sub: &str| -> AppResult<String> {
        if let Some(e) = emails.get(sub) {
            return Ok(e.clone());
        }
        let e = state
            .store
            .user(sub)
            .await?
            .map_or_else(|| sub.to_owned(), |u| u.email);
        emails.insert(sub.to_owned(), e.clone());
        Ok(e)
    };
    let mut held = Vec::new();
    for i in state.store.declined_unpaid_invoices().await? {
        let Some(declined) = i.payment_failed_at else {
            continue;
        };
        held.push(HeldAccount {
            email: email_of(&i.user_sub).await?,
            stop_at: super::unpaid::stop_at(declined, stripe.config.payment_grace_hours),
            stopped_instances: state.store.payment_stops_of(&i.user_sub).await?,
            invoice: billing::invoice_view(i),
        });
    }
    let mut invoices = Vec::new();
    for i in state.store.recent_invoices(ADMIN_INVOICES_LISTED).await? {
        invoices.push(AdminInvoice {
            email: email_of(&i.user_sub).await?,
            invoice: billing::invoice_view(i),
        });
    }
    let mut pending_payouts = Vec::new();
    for p in state.store.pending_payouts().await? {
        pending_payouts.push(AdminPayout {
            email: email_of(&p.user_sub).await?,
            payout: super::payouts::payout_view(p),
        });
    }
    Ok(AdminBillingView {
        enabled: true,
        held,
        invoices,
        pending_payouts,
    })
}
