//! Pre-bookings (E3): the customer's booking of a GPU type for a window, and the
//! operators' actions on bookings (recording payment, launching by id, reassigning a pin).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `POST /api/prebookings`: book a box of `gpu_type` for [`start_date`, `end_date`).
/// Both ends are whole hours (UTC), the start in the future, the window at most
/// 31 days long.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PrebookingRequest {
    pub gpu_type: String,
    pub start_date: DateTime<Utc>,
    pub end_date: DateTime<Utc>,
}

/// Where a booking is, in its booker's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PrebookingState {
    /// Not paid yet: it will not launch (E3.1).
    Unpaid,
    /// Paid; its window has not opened.
    PaidWaiting,
    /// Its window is open and its instance is live (`launched_vm_id`).
    Launched,
    /// Paid, its window open, and not launched: `launch_note` says why (the pinned host is
    /// unavailable, no SSH key, …); the launcher tries again each tick.
    Waiting,
    /// Closed: its window ended, or it was cancelled unpaid (`closed_reason`).
    Closed,
}

/// A booking as its booker and operators see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrebookingView {
    pub id: String,
    pub gpu_type: String,
    pub start_date: DateTime<Utc>,
    pub end_date: DateTime<Utc>,
    pub state: PrebookingState,
    pub paid_at: Option<DateTime<Utc>>,
    /// The instance the booking last launched (it may have ended since; `state` says).
    pub launched_vm_id: Option<String>,
    /// Why it has not launched, as of `launch_note_at`.
    pub launch_note: Option<String>,
    pub launch_note_at: Option<DateTime<Utc>>,
    pub closed_at: Option<DateTime<Utc>>,
    /// `ended` or `cancelled`.
    pub closed_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    /// How to pay an unpaid booking.
    pub how_to_pay: Option<String>,
    /// Operators only: the pinned host's slug (none on a legacy row: the pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_slug: Option<String>,
    /// Operators only: the pinned host's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// Operators only: who booked it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booker_email: Option<String>,
}

/// `POST /api/admin/prebookings/{id}/launch` (E0 caller 5): launch now, by booking id.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PrebookingLaunch {
    /// Revive a booking torn down inside its own window (closed, or its instance gone), or
    /// launch before its window opens.
    #[serde(default)]
    pub force: bool,
}

/// `POST /api/admin/prebookings/{id}/paid`: the reason, required with billing on (a payment
/// recorded by hand beside Checkout is audited with it).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PrebookingPaid {
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /api/admin/prebookings/{id}/refund`: refund its Checkout payment in full.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PrebookingRefund {
    /// Why: audited.
    pub reason: String,
}

/// `POST /api/admin/prebookings/{id}/reassign`: pin the booking to another host (E3.2).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PrebookingReassign {
    pub host_id: String,
}

impl crate::limits::Bounded for PrebookingRequest {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::text("gpu_type", &self.gpu_type, crate::limits::SHORT)
    }
}

impl crate::limits::Bounded for PrebookingLaunch {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        Ok(())
    }
}

impl crate::limits::Bounded for PrebookingPaid {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        match &self.reason {
            Some(r) => crate::limits::text("reason", r, crate::limits::MESSAGE),
            None => Ok(()),
        }
    }
}

impl crate::limits::Bounded for PrebookingRefund {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::text("reason", &self.reason, crate::limits::MESSAGE)
    }
}

impl crate::limits::Bounded for PrebookingReassign {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::text("host_id", &self.host_id, crate::limits::SHORT)
    }
}
