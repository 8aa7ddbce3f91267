//! Instances (E1, F, G): the agent's VM API as the backend calls it through the relay
//! (authenticated by the host's agent token), the customer's API, and the heartbeat.

use serde::{Deserialize, Serialize};

/// `POST /v1/vms` on the agent: create the customer's container from lofispark-base.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVm {
    /// The container's name, minted by the backend (lowercase letters, digits, `-`).
    pub name: String,
    /// The customer's OpenSSH public key, from ssh_keys.
    pub ssh_public_key: String,
    /// The name the customer's ssh resolves (`<label>.<slug>.ssh…`), for the banner.
    #[serde(default)]
    pub ssh_hostname: Option<String>,
}

impl std::fmt::Debug for CreateVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateVm")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A check that is reported and does not fail a create (steps 47–48).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advisory {
    pub ok: bool,
    #[serde(default)]
    pub detail: Option<String>,
}

/// The agent's answer to a create: the container runs, customer key and banner are in,
/// and the relay forwards its public :22 to `ssh_port` on the host (step 49, fatal).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmCreated {
    pub name: String,
    /// The port on the host (10.8.0.2) the relay's :22 is mapped to.
    pub ssh_port: u16,
    pub gpu_check: Advisory,
    pub startup_script: Advisory,
}

/// `POST /v1/vms/{name}/state` on the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmAction {
    Start,
    Stop,
    Reboot,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStateChange {
    pub action: VmAction,
}

/// One instance as the agent sees it (`GET /v1/vms`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmStatus {
    pub name: String,
    /// LXD's status: Running, Stopped, …
    pub status: String,
    #[serde(default)]
    pub ssh_port: Option<u16>,
}

/// The state of one subsystem in the heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Ok,
    Degraded,
    Down,
    Unknown,
}

/// `POST /api/host/heartbeat` (host token): node0's host_status row (133).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub agent_version: String,
    pub lxd: Health,
    /// The relay's SSH map matches what the host runs (rewritten when it did not).
    pub relay: Health,
    pub tunnel: Health,
    pub gpu: Health,
    pub storage: Health,
    pub instances: u32,
    #[serde(default)]
    pub details: serde_json::Value,
}
