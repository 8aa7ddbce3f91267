//! `/etc/enverge/peer.json`, node0's record of its satellites (K, "What K writes, and
//! where"): written by the cable probe at step 125 the moment the links are numbered, read
//! by preparation (129–132) and by every later probe, which keeps its numbering. Root-only
//! on node0 and never sent to the backend: the backend never learns node1's link-local
//! address. A file format rather than a wire shape, kept here because the pure probe
//! (`byo_core::probe`) writes it and the agent reads it.

use serde::{Deserialize, Serialize};

pub const PEER_FILE: &str = "/etc/enverge/peer.json";

/// One cable, numbered as a rail of the plan the first time node0 looked (125).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    /// node0's interface on it, when the cable ends on node0.
    #[serde(default)]
    pub local: Option<String>,
    /// The satellite's interface on it.
    pub remote: String,
    /// The satellite's link-local address on it, scoped to node0's port (`fe80::…%iface`).
    #[serde(default)]
    pub neighbour_addr: Option<String>,
    /// The node at the other end (K2 note 5): a ring's satellite lists its own cables, the
    /// diagonal's two between satellites included. A pair-shaped file has none: node0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<u32>,
}

impl Link {
    /// The node at the other end: node0 when the file does not say.
    pub fn peer_node(&self) -> u32 {
        self.peer.unwrap_or(0)
    }
}

/// A satellite as peer.json pins it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Peer {
    #[serde(alias = "peer_index")]
    pub index: u32,
    #[serde(default)]
    pub addr: Option<String>,
    #[serde(default)]
    pub mgmt_addr: Option<String>,
    pub host_key: String,
    #[serde(default)]
    pub links: Vec<Link>,
    /// Every link-local address (unscoped, `fe80::…`) the machine showed on its rail ports
    /// when node0 logged in: how node0's heartbeat counts machines, not addresses, on a rail
    /// (133) — a QSFP's two functions are one machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_local: Vec<String>,
}

/// The whole file, `{peers: [...]}`; the pair-shaped file (flat fields, one peer) reads too.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
pub struct PeerFile {
    pub peers: Vec<Peer>,
}

/// peer.json: `{peers: [...]}`, or the pair-shaped file (flat fields, one peer).
pub fn parse_peer_file(text: &str) -> Result<Vec<Peer>, String> {
    if let Ok(r) = serde_json::from_str::<PeerFile>(text) {
        return Ok(r.peers);
    }
    serde_json::from_str::<Peer>(text)
        .map(|p| vec![p])
        .map_err(|e| format!("{PEER_FILE} does not parse: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pair_shaped_file_and_the_ring_shaped_file_read_alike() {
        let pair = r#"{"addr": "fe80::1%enp1s0f0np0", "host_key": "ssh-ed25519 AAAA", "peer_index": 1,
            "links": [{"index": 0, "local": "enp1s0f0np0", "remote": "enp1s0f0np0", "neighbour_addr": "fe80::1%enp1s0f0np0"}]}"#;
        let ring = r#"{"peers": [{"index": 1, "addr": "fe80::1%enp1s0f0np0", "host_key": "ssh-ed25519 AAAA",
            "links": [{"index": 0, "local": "enp1s0f0np0", "remote": "enp1s0f0np0", "neighbour_addr": "fe80::1%enp1s0f0np0"}]}]}"#;
        assert_eq!(
            parse_peer_file(pair).unwrap(),
            parse_peer_file(ring).unwrap()
        );
        assert!(parse_peer_file("{}").is_err());
    }
}
