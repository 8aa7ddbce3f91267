//! The fleet at a glance (issue #38, 1): what `/admin` and `GET /api/admin/fleet` show — the
//! hosts by state, each with its problems by name, filtered, sorted and paged on the server.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Where a host stands, one word per host (the counts add up to the fleet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FleetState {
    /// Allocated, its command not run yet (no enrolment redeemed).
    Enrolling,
    /// Enrolled, preparation not finished.
    Preparing,
    /// Prepared and its agent not heard from within the placement bound.
    Unreachable,
    /// Prepared and out of placement (de-pooled, stopped by its owner, being revoked).
    Depooled,
    /// In placement with a live instance.
    Renting,
    /// In placement, nobody on it.
    Idle,
}

impl FleetState {
    pub const ALL: [FleetState; 6] = [
        FleetState::Renting,
        FleetState::Idle,
        FleetState::Preparing,
        FleetState::Enrolling,
        FleetState::Depooled,
        FleetState::Unreachable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FleetState::Enrolling => "enrolling",
            FleetState::Preparing => "preparing",
            FleetState::Unreachable => "unreachable",
            FleetState::Depooled => "depooled",
            FleetState::Renting => "renting",
            FleetState::Idle => "idle",
        }
    }
}

impl std::str::FromStr for FleetState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FleetState::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| format!("unknown host state {s:?}"))
    }
}

/// One problem of a host, by the name the host's page gives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetProblem {
    pub name: String,
    pub detail: String,
    /// Since when, where that is known (the last heartbeat of an unreachable agent, the
    /// oldest unconfirmed delete, a key list's expiry).
    pub since: Option<DateTime<Utc>>,
}

/// One row of the overview.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetRow {
    pub host_id: String,
    pub slug: String,
    pub gpu_type: String,
    pub owner_email: String,
    pub state: FleetState,
    pub problems: Vec<FleetProblem>,
    /// Its agent's last heartbeat.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// The agent build it last reported.
    pub agent_version: Option<String>,
    /// The operator-key list version it holds.
    pub key_list_version: Option<i32>,
    /// Live instances on it.
    pub instances: i64,
}

/// How many hosts stand where (each host in exactly one state), and how many have a problem.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetCounts {
    pub total: i64,
    pub renting: i64,
    pub idle: i64,
    pub preparing: i64,
    pub enrolling: i64,
    pub depooled: i64,
    pub unreachable: i64,
    pub with_problem: i64,
}

/// How the overview is sorted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FleetSort {
    /// Hosts with a problem first, the oldest known problem first (then the most problems).
    #[default]
    Problems,
    /// The oldest heartbeat first (never heard from first of all).
    Heartbeat,
    /// By name.
    Slug,
}

/// The overview: the fleet's counts, and one page of the hosts the filter matched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FleetOverview {
    pub counts: FleetCounts,
    /// Hosts the filter matched (all pages).
    pub matching: i64,
    /// This page (1 is the first) and how many there are.
    pub page: u32,
    pub pages: u32,
    pub hosts: Vec<FleetRow>,
    /// Every problem name present in the fleet now, with how many hosts have it (the
    /// filter's choices).
    pub problems: Vec<ProblemCount>,
    /// Every GPU type present, for the filter.
    pub gpu_types: Vec<String>,
}

/// A problem name and how many hosts have it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProblemCount {
    pub name: String,
    pub hosts: i64,
}
