use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One step's progress, the design's `prepare_state` shape
/// (`{step, state, attempt, error, final, at}`), as written to `hosts.prepare_state`
/// for node0 and `host_nodes.prepare_state` for each satellite.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PrepareState {
    pub step: String,
    pub state: StepState,
    pub attempt: u32,
    pub error: Option<String>,
    #[serde(rename = "final")]
    pub is_final: bool,
    pub at: DateTime<Utc>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    Checking,
    Satisfied,
    Applying,
    Applied,
    Skipped,
    Failed,
}

impl StepState {
    /// The state as the wire and the pages name it.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Checking => "checking",
            StepState::Satisfied => "satisfied",
            StepState::Applying => "applying",
            StepState::Applied => "applied",
            StepState::Skipped => "skipped",
            StepState::Failed => "failed",
        }
    }
}

impl PrepareState {
    /// A step that stopped preparation.
    pub fn failed(&self) -> bool {
        self.state == StepState::Failed
    }
}

/// host-report: the agent's progress after each prepare step (C), with the node it is
/// about: node 0 lands on `hosts.prepare_state`, a satellite on its `host_nodes` row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HostReport {
    pub node: u32,
    pub state: PrepareState,
    /// The last step of a whole run completed: the record activation is gated on.
    #[serde(default)]
    pub completed: bool,
}

impl crate::limits::Bounded for HostReport {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{MESSAGE, SHORT, opt_text, text};
        text("state.step", &self.state.step, SHORT)?;
        opt_text("state.error", &self.state.error, MESSAGE)
    }
}

/// host-report's rails: one machine's ports as they are now, sent when a rail step changed
/// or proved them — after rail-network configured that machine (130–131), and once
/// rail-verify passed across every cable (132, `verified`: the backend stamps `verified_at`
/// on each port that carries a rail). Written to that machine's `host_nodes.rails`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NodeRails {
    pub node: u32,
    pub ports: Vec<crate::enroll::RailPort>,
    #[serde(default)]
    pub verified: bool,
}

impl crate::limits::Bounded for NodeRails {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::enroll::rail_ports_in_bounds("ports", &self.ports)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_state_keeps_the_designs_field_names() {
        let s = PrepareState {
            step: "base-image".into(),
            state: StepState::Applied,
            attempt: 1,
            error: None,
            is_final: false,
            at: "2026-09-08T14:02:11Z".parse().unwrap(),
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"step": "base-image", "state": "applied", "attempt": 1,
                               "error": null, "final": false, "at": "2026-09-08T14:02:11Z"})
        );
    }
}
