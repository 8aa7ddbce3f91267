//! ssh_mapd's API on a relay (10.8.0.1:8754), called by the host's agent.

use serde::{Deserialize, Serialize};

/// One forwarded port: the relay's public `port` (22: ssh_mapd refuses any other, #16) to
/// `target_port` on `target`, the one host behind the relay.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapEntry {
    pub port: u16,
    pub target: String,
    pub target_port: u16,
}

/// The map as the kernel holds it (`GET /map`), or as it should be (`PUT /map`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshMap {
    pub mappings: Vec<MapEntry>,
}

/// `PUT /map/{port}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MapTarget {
    pub target: String,
    pub target_port: u16,
}
