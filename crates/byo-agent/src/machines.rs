//! The machines a host spans as preparation hands them to serving (a floor): each machine's
//! cables with the plan's addresses, a satellite's management address, pinned host key and
//! LXD socket, and where serving keeps what it reaches them with.

use serde::{Deserialize, Serialize};

/// One of a rail's ends on one machine: the port, the plan's address on it, its MTU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RailAddr {
    pub port: String,
    /// `a.b.c.d/len`: the subnet's tenth host plus the node's index.
    pub address: String,
    pub mtu: u32,
}

/// One machine of a pair or a ring as serving knows it (handed over by preparation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairNode {
    pub index: u32,
    /// A satellite's management address (node0 has none here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mgmt_addr: Option<String>,
    /// A satellite's SSH host key, pinned from the cable at 125.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_key: Option<String>,
    /// Where a satellite's LXD answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lxd_socket: Option<String>,
    /// The cables this machine's containers hold, in rail order.
    pub rails: Vec<RailAddr>,
}

/// serving's state directory (its unit may write there).
pub const SERVING_STATE: &str = "/var/lib/enverge-agent";
/// serving's copy of node0's peer key, in its state directory.
pub const SERVING_PEER_KEY: &str = "peer.key";

pub fn known_hosts_file(node: u32) -> String {
    format!("peer-{node}.known_hosts")
}

/// The comment preparation gives node0's peer key in a satellite's authorized_keys.
pub const PEER_KEY_COMMENT: &str = "enverge-node0-peer";
