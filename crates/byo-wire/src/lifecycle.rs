//! Life after go-live (issue #12): what the operator's host actions (de-pool, revoke,
//! retire, replace a relay) and the owner's "stop hosting" answer.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::states::RevokeStep;

/// How far a drain (G, for every live instance of a host) got.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Drain {
    /// Instances whose delete the host confirmed now (its 2xx or its own 404).
    pub confirmed: Vec<String>,
    /// Instances still live: their delete was requested and the host has not confirmed it
    /// (or a create is still running). The host is not drained while this is not empty.
    pub waiting: Vec<String>,
}

impl Drain {
    pub fn drained(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// The answer to a revoke (H) or a stop-hosting: where it stands after this run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostProgress {
    pub host_id: String,
    /// The revoke's step (`None` for a stop-hosting, which is not a revoke).
    pub step: Option<RevokeStep>,
    /// Whether the operation finished; when false, running it again resumes it.
    pub done: bool,
    pub drain: Drain,
    pub message: String,
}

/// The answer to replacing a host's relay (A.3), saying what was actually done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RelayReplaced {
    pub host_id: String,
    /// The relay's instance name (`<slug>-relay`): relays are named by their host's slug, so
    /// the new relay has the old one's name.
    pub name: String,
    pub old_address: Option<String>,
    pub new_address: String,
    /// The host's WireGuard endpoint now, as `GET /api/host/relay` answers it.
    pub endpoint: String,
    /// Whether the address is the one the old relay had (a `local` relay is always at
    /// the same address; a GCP one gets a new reservation).
    pub same_address: bool,
    pub message: String,
}

/// A host on the operators' worklist (issue #39, 3): its owner stopped hosting, it has been
/// silent past the bound, and retire-stopped would retire it but one of retire's refusals
/// (N.1, N.5) applies — what an operator must settle before it can go.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorklistEntry {
    pub host_id: String,
    pub slug: String,
    pub owner_sub: String,
    /// When the owner stopped hosting.
    pub stopped_at: Option<DateTime<Utc>>,
    /// When its agent last beat (`None`: never, or not since its status was cleared).
    pub last_seen_at: Option<DateTime<Utc>>,
    /// Retire's refusal, as its API answers it (`prebooked`, `live_instance`, `dedicated`, …).
    pub refusal: String,
    /// The refusal in words.
    pub message: String,
}
