//! Notices over the API (issue #38, 3): the outbox as operators read it, a person's own
//! notices, and the kinds each person may turn off.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::states::NoticeKind;

/// One notice to one person, and how far its delivery got.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NoticeView {
    pub id: String,
    /// A [`NoticeKind`]'s spelling.
    pub kind: String,
    /// The address it is (or was) sent to.
    pub to: String,
    pub subject: String,
    pub body: String,
    pub created_at: DateTime<Utc>,
    /// When what it is about went away (a condition's notice; events never clear).
    pub cleared_at: Option<DateTime<Utc>>,
    /// `sent`, `sending` (due or retrying), `given up`, or `kept here` (no channel is
    /// configured: the outbox is its delivery).
    pub delivery: String,
    pub attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub email_sent_at: Option<DateTime<Utc>>,
    pub webhook_sent_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// A kind of notice a person receives, in words, and whether it is on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NoticePreference {
    pub kind: NoticeKind,
    pub label: String,
    pub on: bool,
}

/// `GET /api/me/notices`: what I receive, and what I was sent lately.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MyNotices {
    pub preferences: Vec<NoticePreference>,
    pub recent: Vec<NoticeView>,
}

/// `PUT /api/me/notices`: turn one kind on or off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NoticeSwitch {
    pub kind: NoticeKind,
    pub on: bool,
}

impl crate::limits::Bounded for NoticeSwitch {
    /// A kind and a flag: serde has already refused anything else.
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        Ok(())
    }
}
