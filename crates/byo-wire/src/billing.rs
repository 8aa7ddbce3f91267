//! Billing's API shapes (issue #13, 4): the account's billing status and a Checkout link.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Whether this installation bills, and whether your account may be charged now (asked of
/// Stripe live).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BillingView {
    /// `false`: billing is off on this installation; nobody is charged.
    pub enabled: bool,
    /// Whether your account may be charged now (always `true` with billing off).
    pub chargeable: bool,
    /// Why not, when it may not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The card on file, as Stripe describes it (`visa ending 4242, expires 12/2099`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<String>,
    /// This month's usage so far, live from the four timestamps (billing on only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub this_month: Option<MonthUsage>,
    /// Your invoices, newest first (issue #40): absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub invoices: Vec<InvoiceView>,
    /// Credits for deletes your hosts confirmed late, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credits: Vec<CreditView>,
}

/// Usage since the first of this month (UTC), per instance, as its days will be charged.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MonthUsage {
    pub since: DateTime<Utc>,
    pub currency: String,
    pub total_cents: i64,
    pub instances: Vec<UsageLine>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UsageLine {
    pub vm_id: String,
    pub name: String,
    /// Billable seconds this month so far.
    pub seconds: i64,
    pub amount_cents: i64,
}

/// A credit for a stuck delete: the time from your delete to the host's confirmation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreditView {
    pub vm_id: String,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub amount_cents: i64,
    pub currency: String,
}

/// One of your invoices: what it covers in total, where it is in Stripe's lifecycle, and
/// Stripe's page where you see and pay it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InvoiceView {
    pub id: String,
    pub created_at: DateTime<Utc>,
    /// `month_end` (the month it covers ended) or `threshold` (the usage reached the
    /// installation's invoicing threshold first).
    pub reason: String,
    /// Usage less credits, in the currency's smallest unit.
    pub amount_cents: i64,
    pub currency: String,
    pub status: crate::states::InvoiceStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosted_invoice_url: Option<String>,
    /// When its payment was declined, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_failed_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
}

/// A Stripe page to send the person to: Checkout, or a connected account's onboarding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckoutView {
    pub url: String,
}

/// An owner's earnings (issue #40, 6): what their hosts sold, invoiced, split between them and
/// the platform at the installation's revenue share, by month and host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EarningsView {
    /// The owner's share of every cent invoiced, in basis points (7000 = 70 %).
    pub owner_share_bps: u32,
    pub currency: String,
    /// Newest month first.
    pub months: Vec<EarningsMonth>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EarningsMonth {
    /// `2026-11` (UTC).
    pub month: String,
    pub host_slug: String,
    /// Hours sold, net of credits, in seconds.
    pub seconds: i64,
    /// Invoiced, net of credits.
    pub amount_cents: i64,
    pub owner_cents: i64,
    pub platform_cents: i64,
    /// Of `owner_cents`, what sits on invoices already paid.
    pub owner_paid_cents: i64,
}

/// An owner's payouts (issue #40, 6): the Stripe account their share is transferred to, and
/// each month's transfer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PayoutsView {
    /// `false`: billing is off; nothing is invoiced, so nothing is paid out.
    pub enabled: bool,
    /// None until the owner connects one.
    pub account: Option<PayoutAccountView>,
    /// Newest month first.
    pub payouts: Vec<PayoutView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PayoutAccountView {
    pub stripe_account_id: String,
    /// Whether Stripe takes transfers to it (its onboarding finished), as last asked.
    pub transfers_active: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_at: Option<DateTime<Utc>>,
}

/// One month's payout: the owner's share of every line whose invoice was paid before the
/// month ended and that no earlier payout took.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PayoutView {
    pub id: String,
    /// `2026-11`: the month whose end it follows.
    pub month: String,
    pub amount_cents: i64,
    pub currency: String,
    pub status: crate::states::PayoutStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe_transfer_id: Option<String>,
    /// Transfers Stripe refused or did not answer; each is tried again later.
    pub attempts: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When a pending payout is tried next.
    pub next_attempt_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
}

/// A payout not yet transferred, as the operators see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminPayout {
    pub email: String,
    pub payout: PayoutView,
}

/// The operators' view of billing (issue #40): accounts held by a declined, unpaid invoice,
/// and every account's recent invoices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminBillingView {
    /// `false`: billing is off; nothing is invoiced.
    pub enabled: bool,
    pub held: Vec<HeldAccount>,
    /// Newest first.
    pub invoices: Vec<AdminInvoice>,
    /// Owners' payouts not yet transferred (a refused transfer's reason on each), oldest
    /// first.
    pub pending_payouts: Vec<AdminPayout>,
}

/// An account held by a declined invoice: what it owes, since when, and its instances' fate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeldAccount {
    pub email: String,
    pub invoice: InvoiceView,
    /// When its running instances stop (or stopped), the decline plus the grace.
    pub stop_at: DateTime<Utc>,
    /// How many of its instances are stopped for payment now.
    pub stopped_instances: i64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminInvoice {
    pub email: String,
    pub invoice: InvoiceView,
}
