//! Releases and fleet upgrades over the API (issue #14, items 1 and 5): what
//! `byo release publish` records, and what `byo fleet upgrade` and /admin/releases read and
//! write about a run.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::states::{FleetHostState, FleetRunState};

/// The header carrying a published build's signature (the armored SSHSIG, base64 in one
/// line) beside the build's bytes in the body.
pub const SIGNATURE_HEADER: &str = "byo-release-signature";

/// One published agent build.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReleaseView {
    pub arch: String,
    pub version: String,
    pub sha256: String,
    /// The first 12 hex of `sha256`: what a heartbeat's `agent_version` names.
    pub build: String,
    pub size_bytes: i64,
    pub published_by: String,
    pub published_at: DateTime<Utc>,
    /// Whether the installer's path serves it now (the newest of its arch).
    pub served: bool,
}

/// Start a fleet upgrade to `build` (a sha256 or its first 12 hex or more), or resume the
/// open one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetStart {
    pub build: String,
    #[serde(default)]
    pub resume: bool,
    /// Hosts in the first wave (default 1).
    #[serde(default)]
    pub canary: Option<u32>,
    /// How much each wave grows over the one before (default 2).
    #[serde(default)]
    pub growth: Option<u32>,
    /// How long a host has to report the build healthy (default 300 s).
    #[serde(default)]
    pub wait_secs: Option<u32>,
}

/// What the operator's machine saw on one host: it started the one-liner (`upgrading`), or
/// the one-liner failed there (`failed`, with what it printed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetReport {
    pub host_id: String,
    pub state: FleetHostState,
    #[serde(default)]
    pub reason: Option<String>,
}

/// One step of a run: record `report` if there is one, judge the upgrading hosts by their
/// heartbeats, and answer with the run and what comes next.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetAdvance {
    #[serde(default)]
    pub report: Option<FleetReport>,
}

/// What a run does next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FleetNext {
    /// Start the one-liner on these hosts (ids).
    Upgrade { hosts: Vec<String> },
    /// Wait for these hosts' heartbeats.
    Wait { hosts: Vec<String> },
    /// Halted: the first failure's reason, or who halted it.
    Halted { reason: String },
    /// Every host judged; the run is closed.
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetHostView {
    pub host_id: String,
    pub slug: String,
    /// Where the operator tunnel reaches its sshd (`--via tunnel`).
    pub tunnel_hostname: Option<String>,
    pub wave: i32,
    pub state: FleetHostState,
    pub reason: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub judged_at: Option<DateTime<Utc>>,
    /// What its last heartbeat reported.
    pub agent_version: Option<String>,
    pub seen_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetRunView {
    pub id: String,
    pub build: String,
    pub state: FleetRunState,
    pub halt_reason: Option<String>,
    pub canary: i32,
    pub growth: i32,
    pub wait_secs: i32,
    pub started_by: String,
    pub started_at: DateTime<Utc>,
    pub hosts: Vec<FleetHostView>,
    pub next: FleetNext,
}

impl crate::limits::Bounded for FleetStart {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::text("build", &self.build, crate::limits::SHORT)
    }
}

impl crate::limits::Bounded for FleetAdvance {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{MESSAGE, SHORT, text};
        if let Some(r) = &self.report {
            text("report.host_id", &r.host_id, SHORT)?;
            text("report.reason", r.reason.as_deref().unwrap_or(""), MESSAGE)?;
        }
        Ok(())
    }
}
