//! The machines a host spans as preparation hands them to serving (a floor): each machine's
//! cables with the plan's addresses, a satellite's management address, pinned host key and
//! LXD socket, and where serving keeps what it reaches them with.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::host::{Fallible, Host, SshHost};

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

/// How serving reaches a satellite's LXD.
pub trait SatelliteHosts: Send + Sync + std::fmt::Debug {
    fn host(&self, node: &PairNode) -> Fallible<Box<dyn Host>>;
}

/// The machines a host spans, node0 first: one Spark (no satellites), or a pair's or a
/// ring's. Serving treats both alike — what it does to the satellites it does to none on one
/// Spark — so a single host and a pair are one code path, not a pair that may be missing.
#[derive(Clone, Debug)]
pub struct Machines {
    /// Every machine with its rails, node0 first; empty on one Spark (node0 holds no rails).
    pub nodes: Vec<PairNode>,
    pub hosts: Arc<dyn SatelliteHosts>,
    /// Where serving asks root's `enverge-agent-rails.path` to address node0's rails again
    /// (`byo_core::render::units::RAILS_FLAG`); `None`: nobody to ask.
    pub rails_flag: Option<PathBuf>,
}

impl Machines {
    /// One Spark: node0 alone.
    pub fn single() -> Self {
        Machines {
            nodes: Vec::new(),
            hosts: Arc::new(NoSatellites),
            rails_flag: None,
        }
    }

    /// What preparation handed over: one Spark when it names no machines.
    pub fn handed(nodes: &[PairNode], hosts: Arc<dyn SatelliteHosts>, rails_flag: PathBuf) -> Self {
        if nodes.is_empty() {
            return Machines::single();
        }
        Machines {
            nodes: nodes.to_vec(),
            hosts,
            rails_flag: Some(rails_flag),
        }
    }

    pub fn node0_rails(&self) -> &[RailAddr] {
        self.nodes
            .iter()
            .find(|n| n.index == 0)
            .map(|n| &n.rails[..])
            .unwrap_or_default()
    }

    pub fn satellites(&self) -> impl Iterator<Item = &PairNode> {
        self.nodes.iter().filter(|n| n.index > 0)
    }

    /// One Spark: an instance is its head alone.
    pub fn is_single(&self) -> bool {
        self.satellites().next().is_none()
    }

    /// How many machines an instance spans (1 on one Spark).
    pub fn count(&self) -> u32 {
        u32::try_from(self.nodes.len().max(1)).unwrap_or(u32::MAX)
    }
}

/// One Spark's way to its satellites: there are none to reach.
#[derive(Debug)]
struct NoSatellites;

impl SatelliteHosts for NoSatellites {
    fn host(&self, node: &PairNode) -> Fallible<Box<dyn Host>> {
        Err(format!("node{} is not a machine of this host", node.index))
    }
}

/// serving's way to the satellites: SSH as spark with its copy of node0's peer key (handed
/// over by preparation, spark's own, in the agent's state directory), the host key pinned.
#[derive(Debug)]
pub struct SshSatelliteHosts {
    /// `/var/lib/enverge-agent`: the key, the pinned host keys, the connection sockets.
    pub dir: PathBuf,
}

impl SatelliteHosts for SshSatelliteHosts {
    fn host(&self, node: &PairNode) -> Fallible<Box<dyn Host>> {
        let addr = node
            .mgmt_addr
            .clone()
            .ok_or_else(|| format!("node{} has no management address", node.index))?;
        Ok(Box::new(SshHost {
            node: node.index,
            user: crate::names::SPARK.to_owned(),
            addr,
            key: self.dir.join(SERVING_PEER_KEY),
            known_hosts: self.dir.join(known_hosts_file(node.index)),
            port: 22,
            lxd_socket: node
                .lxd_socket
                .clone()
                .ok_or_else(|| format!("node{} has no LXD socket in the hand-over", node.index))?,
            password_file: None,
            host_key_alias: None,
            control_path: Some(self.dir.join(format!("peer-{}.ctl", node.index))),
            proxy: None,
        }))
    }
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

/// The last act of a completed preparation hands the credentials to the serving user, and
/// that hand-over is the record (L, rule 1): a later start that finds it exits at once.
pub const HANDED_OVER: &str = byo_core::render::units::HANDED_OVER;

/// What serving needs, handed to the serving user: the record of a completed preparation.
#[derive(Clone, Serialize, Deserialize)]
pub struct HandOver {
    pub host_id: String,
    pub slug: String,
    pub server: String,
    pub host_token: String,
    pub ssh_map_endpoint: String,
    pub ssh_map_token: String,
    /// The host's tunnel address, where instances' :22 are published.
    pub ssh_listen: String,
    /// The profile has a GPU: run the GPU check at create.
    pub gpu: bool,
    pub build: String,
    /// Preparation installed the operator tunnel (cloudflared), which the heartbeat checks;
    /// absent in a hand-over written before this was recorded.
    #[serde(default)]
    pub tunnel: Option<bool>,
    /// A pair's or a ring's rail ports on node0, and which machine each link-local address
    /// node0 saw on its satellites belongs to (peer.json, root-only, which serving cannot
    /// read): what the heartbeat counts each port's neighbours with (133). Empty on a single
    /// Spark, whose heartbeat counts nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rail_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub rail_neighbours: std::collections::BTreeMap<String, u32>,
    /// A pair's or a ring's machines, node0 first: each one's cables with the plan's
    /// addresses, and a satellite's management address and pinned host key — what serving
    /// creates, deletes and keeps the workers with (K1 note 11, `crate::workers`). Empty on a
    /// single Spark.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pair: Vec<PairNode>,
}

impl std::fmt::Debug for HandOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandOver")
            .field("slug", &self.slug)
            .finish_non_exhaustive()
    }
}

/// node0's peer key (K: peer.key), Ed25519, root-only; its public half beside it.
pub const PEER_KEY: &str = "peer.key";

/// A pinned host key as `known_hosts` files it: the address without a link-local scope.
pub fn known_hosts_line(addr: &str, host_key: &str) -> String {
    let host = addr.split('%').next().unwrap_or(addr);
    format!("{host} {}\n", host_key.trim())
}

/// `peer` over SSH from node0 as `user`, with node0's peer key in `dir` (/etc/enverge) and
/// only its pinned host key accepted; through the lent login when `lent`. `shared`: one
/// connection for every command (a satellite's subset is hundreds of short ones).
pub fn satellite_host(
    dir: &std::path::Path,
    peer: &byo_wire::peers::Peer,
    user: &str,
    lxd_socket: &str,
    lent: bool,
    shared: bool,
) -> Fallible<SshHost> {
    let addr = peer
        .mgmt_addr
        .clone()
        .or_else(|| peer.addr.clone())
        .ok_or_else(|| {
            format!(
                "node{} has no address in {}",
                peer.index,
                byo_wire::peers::PEER_FILE
            )
        })?;
    let known = dir.join(format!("peer-{}.known_hosts", peer.index));
    std::fs::write(&known, known_hosts_line(&addr, &peer.host_key))
        .map_err(|e| format!("pinning node{}'s host key: {e}", peer.index))?;
    Ok(SshHost {
        node: peer.index,
        user: user.to_owned(),
        addr,
        key: dir.join(PEER_KEY),
        known_hosts: known,
        port: 22,
        lxd_socket: lxd_socket.to_owned(),
        password_file: lent.then(|| dir.join("peer-login")),
        host_key_alias: None,
        control_path: shared.then(|| dir.join(format!("peer-{}-{user}.ctl", peer.index))),
        proxy: None,
    })
}
