//! The enrolment request (step 126): what the agent sends to host-enroll. A wire shape,
//! not a stored one: host-enroll splits it into the enrolment's fingerprint and one
//! host_nodes row per machine.

use serde::{Deserialize, Serialize};

/// One machine as detect saw it. node0 carries every field; a peer may carry fewer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeReport {
    pub gpu_model: Option<String>,
    pub gpu_count: Option<u32>,
    pub gpu_mem_mib: Option<u64>,
    pub arch: Option<String>,
    pub os_id: Option<String>,
    pub os_version: Option<String>,
    pub driver_version: Option<String>,
    /// /etc/machine-id: hardware detail, not identity.
    pub machine_id: Option<String>,
    /// sha256 over the sorted GPU UUIDs: what tells identical boxes apart. An agent older
    /// than the field sends none, and its machine_id stands in.
    pub hardware_id: Option<String>,
    pub node_index: u32,
    #[serde(default)]
    pub rails: Vec<RailPort>,
}

/// One RDMA port as detect saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RailPort {
    pub iface: String,
    pub device: Option<String>,
    pub mtu: Option<u32>,
    pub active_mtu: Option<u32>,
    pub neighbours_discovered: u32,
    /// The rail this port's cable carries, numbered once at step 125.
    pub index: Option<u32>,
}

/// Step 126.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollRequest {
    #[serde(flatten)]
    pub node: NodeReport,
    #[serde(default)]
    pub peers: Vec<NodeReport>,
}
