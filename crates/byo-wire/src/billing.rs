//! Billing's API shapes (issue #13, 4): the account's billing status and a Checkout link.

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
}

/// A Stripe Checkout page to send the customer to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CheckoutView {
    pub url: String,
}
