//! Step 127, the one place a lone Spark is turned away: every piece of evidence that can
//! exist before enrolment is judged here, once, against the profile's plan. Pure: the
//! caller writes the rows this returns, or parks the enrolment as rejected and releases
//! its allocation.

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv4Addr;

use byo_wire::enroll::{EnrollRequest, NodeReport, RailPort};
use serde_json::{Map, Value, json};

use byo_wire::profile::{ProfilePlan, RailPlan};

/// A host_nodes row to write.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRow {
    pub index: u32,
    pub machine_id: Option<String>,
    pub hardware_id: String,
    /// Hardware identity: gpu, memory, arch, os, driver.
    pub fingerprint: Value,
    /// The ports as they are, keyed by interface, with the plan's address stamped onto
    /// the ports that carry a cable.
    pub rails: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    NotTheProfilesHardware {
        node: u32,
        field: &'static str,
        expected: String,
        found: String,
    },
    NoHardwareId {
        node: u32,
    },
    WrongNodeIndex {
        found: u32,
    },
    NoCable,
    MoreCablesThanRails {
        cables: usize,
        rails: usize,
    },
    SeveralMachinesOnACable {
        iface: String,
        neighbours: u32,
    },
    UnplannedRail {
        iface: String,
        index: u32,
    },
    WrongPeerCount {
        expected: u32,
        found: usize,
    },
    PeerIndex {
        index: u32,
    },
    PeerIsNode0,
    SamePeerTwice,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::NotTheProfilesHardware {
                node,
                field,
                expected,
                found,
            } => {
                write!(
                    f,
                    "node {node} is not this profile's hardware: {field} is {found}, expected {expected}"
                )
            }
            Rejection::NoHardwareId { node } => {
                write!(f, "node {node} reported no hardware id or machine id")
            }
            Rejection::WrongNodeIndex { found } => {
                write!(f, "the enrolling machine must be node 0, not {found}")
            }
            Rejection::NoCable => f.write_str("no cable to another machine was found"),
            Rejection::MoreCablesThanRails { cables, rails } => {
                write!(f, "{cables} cables found, but the plan has {rails} rails")
            }
            Rejection::SeveralMachinesOnACable { iface, neighbours } => {
                write!(
                    f,
                    "{neighbours} machines answered on {iface}: a rail is one machine at each end"
                )
            }
            Rejection::UnplannedRail { iface, index } => write!(
                f,
                "{iface} carries rail {index}, which the plan does not have"
            ),
            Rejection::WrongPeerCount { expected, found } => {
                write!(
                    f,
                    "{found} other machines found, the profile is {expected} more"
                )
            }
            Rejection::PeerIndex { index } => {
                write!(f, "node index {index} is missing, repeated or out of range")
            }
            Rejection::PeerIsNode0 => f.write_str("the peer is the enrolling machine itself"),
            Rejection::SamePeerTwice => f.write_str("one machine was offered as two peers"),
        }
    }
}

impl std::error::Error for Rejection {}

fn matches<T: PartialEq + fmt::Display>(
    node: u32,
    field: &'static str,
    expected: &Option<T>,
    found: &Option<T>,
) -> Result<(), Rejection> {
    match expected {
        Some(want) if found.as_ref() != Some(want) => Err(Rejection::NotTheProfilesHardware {
            node,
            field,
            expected: want.to_string(),
            found: found
                .as_ref()
                .map_or_else(|| "missing".to_owned(), ToString::to_string),
        }),
        _ => Ok(()),
    }
}

fn check_hardware(plan: &ProfilePlan, n: &NodeReport, index: u32) -> Result<String, Rejection> {
    matches(index, "gpu_model", &plan.gpu_model, &n.gpu_model)?;
    matches(index, "gpu_count", &plan.gpu_count, &n.gpu_count)?;
    matches(index, "arch", &plan.arch, &n.arch)?;
    if index == 0 {
        matches(index, "gpu_mem_mib", &plan.gpu_mem_mib, &n.gpu_mem_mib)?;
    }
    n.hardware_id
        .clone()
        .or_else(|| n.machine_id.clone())
        .filter(|h| !h.trim().is_empty())
        .ok_or(Rejection::NoHardwareId { node: index })
}

/// The plan's address for `node` on `rail`: the subnet's tenth host plus the node index.
pub fn rail_address(rail: &RailPlan, node: u32) -> Option<String> {
    let (net, prefix) = rail.subnet.split_once('/')?;
    let base: Ipv4Addr = net.parse().ok()?;
    let addr = Ipv4Addr::from(u32::from(base).checked_add(10 + node)?);
    Some(format!("{addr}/{prefix}"))
}

fn rails_value(plan: &ProfilePlan, ports: &[RailPort], node: u32) -> Value {
    node_rails(
        ports,
        |p| {
            let i = p.index?;
            plan.rails
                .iter()
                .find(|r| r.index == i)
                .and_then(|r| rail_address(r, node))
        },
        None,
    )
}

/// `host_nodes.rails` from a machine's ports, keyed by its own interface: the rail each
/// cable carries and the address on it (`address_of`: the plan's at 127, the port's own once
/// rail-network set it), device, MTUs and neighbours as seen; `verified_at` on every port
/// that carries a rail once rail-verify proved them (132).
pub fn node_rails(
    ports: &[RailPort],
    address_of: impl Fn(&RailPort) -> Option<String>,
    verified_at: Option<chrono::DateTime<chrono::Utc>>,
) -> Value {
    let mut out = Map::new();
    for p in ports {
        let mut v = Map::new();
        if let Some(i) = p.index {
            v.insert("index".into(), json!(i));
            if let Some(addr) = address_of(p) {
                v.insert("address".into(), json!(addr));
            }
            if let Some(at) = verified_at {
                v.insert(
                    "verified_at".into(),
                    json!(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)),
                );
            }
        }
        if let Some(d) = &p.device {
            v.insert("device".into(), json!(d));
        }
        if let Some(m) = p.mtu {
            v.insert("mtu".into(), json!(m));
        }
        if let Some(m) = p.active_mtu {
            v.insert("active_mtu".into(), json!(m));
        }
        v.insert(
            "neighbours_discovered".into(),
            json!(p.neighbours_discovered),
        );
        out.insert(p.iface.clone(), Value::Object(v));
    }
    Value::Object(out)
}

/// node0's identity without rails or peers: what host_enrollments.fingerprint and
/// host_nodes.fingerprint hold.
pub fn identity(n: &NodeReport) -> Value {
    json!({
        "gpu_model": n.gpu_model, "gpu_count": n.gpu_count, "gpu_mem_mib": n.gpu_mem_mib,
        "arch": n.arch, "os_id": n.os_id, "os_version": n.os_version,
        "driver_version": n.driver_version, "machine_id": n.machine_id, "hardware_id": n.hardware_id,
    })
}

/// Judge an enrolment request against the plan. `Ok` carries the rows to write, node0
/// first; rows are at the index each machine carries, never its place in the list.
pub fn judge(plan: &ProfilePlan, req: &EnrollRequest) -> Result<Vec<NodeRow>, Rejection> {
    let node0 = &req.node;
    if node0.node_index != 0 {
        return Err(Rejection::WrongNodeIndex {
            found: node0.node_index,
        });
    }
    let hw0 = check_hardware(plan, node0, 0)?;
    let mut rows = vec![NodeRow {
        index: 0,
        machine_id: node0.machine_id.clone(),
        hardware_id: hw0.clone(),
        fingerprint: identity(node0),
        rails: rails_value(plan, &node0.rails, 0),
    }];
    if plan.node_count <= 1 {
        // A single Spark: nothing here fires; its rails are a few more fields.
        return Ok(rows);
    }
    // A port several machines answer on that the probe left unnumbered is the owner's LAN in
    // a QSFP port (125), left alone: not a cable. With no cable at all, though, such a port is
    // why — a lone Spark on a switch fails the one-neighbour rule (K1 note 10).
    let (lans, cabled): (Vec<&RailPort>, Vec<&RailPort>) = node0
        .rails
        .iter()
        .filter(|p| p.neighbours_discovered > 0)
        .partition(|p| p.index.is_none() && p.neighbours_discovered > 1);
    if cabled.is_empty() {
        return Err(match lans.first() {
            Some(lan) => Rejection::SeveralMachinesOnACable {
                iface: lan.iface.clone(),
                neighbours: lan.neighbours_discovered,
            },
            None => Rejection::NoCable,
        });
    }
    if cabled.len() > plan.rails.len() {
        return Err(Rejection::MoreCablesThanRails {
            cables: cabled.len(),
            rails: plan.rails.len(),
        });
    }
    for p in &cabled {
        if p.neighbours_discovered > 1 {
            return Err(Rejection::SeveralMachinesOnACable {
                iface: p.iface.clone(),
                neighbours: p.neighbours_discovered,
            });
        }
    }
    for p in node0
        .rails
        .iter()
        .chain(req.peers.iter().flat_map(|n| n.rails.iter()))
    {
        if let Some(i) = p.index
            && !plan.rails.iter().any(|r| r.index == i)
        {
            return Err(Rejection::UnplannedRail {
                iface: p.iface.clone(),
                index: i,
            });
        }
    }
    let expected = plan.node_count - 1;
    if req.peers.len() != expected as usize {
        return Err(Rejection::WrongPeerCount {
            expected,
            found: req.peers.len(),
        });
    }
    let mut indexes = BTreeSet::new();
    let mut seen = BTreeSet::from([hw0]);
    for peer in &req.peers {
        let i = peer.node_index;
        if i == 0 || i >= plan.node_count || !indexes.insert(i) {
            return Err(Rejection::PeerIndex { index: i });
        }
        let hw = check_hardware(plan, peer, i)?;
        if hw == rows[0].hardware_id {
            return Err(Rejection::PeerIsNode0);
        }
        if !seen.insert(hw.clone()) {
            return Err(Rejection::SamePeerTwice);
        }
        rows.push(NodeRow {
            index: i,
            machine_id: peer.machine_id.clone(),
            hardware_id: hw,
            fingerprint: identity(peer),
            rails: rails_value(plan, &peer.rails, i),
        });
    }
    rows.sort_by_key(|r| r.index);
    Ok(rows)
}
