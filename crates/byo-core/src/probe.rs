//! Step 125, the cable probe, as a pure decision (K1 note 3, K2 notes 3–5).
//!
//! The agent gathers the facts — which link-local addresses answered the all-nodes multicast on
//! each of node0's rail ports, node0's own addresses, and what logging in at each address showed
//! (a machine, or a refusal) — and this module decides, per port: a link to one machine, the
//! owner's LAN (several machines), a login failure, a cable looped back to node0, a self-pair,
//! silence. It groups addresses into machines by hardware_id (never by address: a ConnectX-7 QSFP
//! shows two of node1's addresses on one wire), numbers the links as the plan's rails once
//! (keeping the numbering an earlier run recorded in peer.json), and produces both what node0
//! records (peer.json) and the evidence step 126 sends (rails and peers), which redeem judges.
//!
//! General over the number of machines: a pair is one satellite, a ring more; the walk beyond
//! node0's own cables (the ring's diagonal) feeds more machines in through [`Observation::beyond`].

use std::collections::BTreeMap;
use std::fmt;

use byo_wire::enroll::{NodeReport, RailPort};
use byo_wire::peers::{Link, Peer, PeerFile};

/// One of node0's rail ports, as the agent saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortSeen {
    pub iface: String,
    pub device: Option<String>,
    pub mtu: Option<u32>,
    pub active_mtu: Option<u32>,
    /// The kernel sees a link partner (`/sys/class/net/<iface>/carrier`).
    pub carrier: bool,
    /// The link-local addresses (unscoped, `fe80::…`) that answered `ff02::1%<iface>`.
    pub answered: Vec<String>,
}

/// A machine as logging in showed it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Machine {
    /// What detect reads on it (hardware_id inside); its `rails` are its own rail ports.
    pub report: NodeReport,
    /// Its SSH host key (`ssh-ed25519 …`), read over the cable: later access is held to it.
    pub host_key: String,
    /// Its address on the management network, where preparation reaches it.
    pub mgmt_addr: Option<String>,
    /// Its ports and the link-local addresses each holds (`ip -j addr`): which of its ports
    /// holds each address node0 saw.
    pub ports: Vec<(String, Vec<String>)>,
    /// What answered the all-nodes multicast on each of its own rail ports, when the walk
    /// looked from it (a ring, K2 note 3); empty on a pair, which is judged from node0 alone.
    pub heard: Vec<PortSeen>,
}

impl Machine {
    fn hardware_id(&self) -> Option<&str> {
        self.report
            .hardware_id
            .as_deref()
            .filter(|h| !h.trim().is_empty())
    }
    fn port_of(&self, addr: &str) -> Option<&str> {
        self.ports
            .iter()
            .find(|(_, addrs)| addrs.iter().any(|a| same_addr(a, addr)))
            .map(|(iface, _)| iface.as_str())
    }
}

/// What logging in at one address gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Login {
    Machine(Box<Machine>),
    /// Every credential was refused (the peer user's keys, then the lent password).
    Refused,
    /// No SSH answer (nothing listening, a timeout).
    Unreachable(String),
}

/// Everything the agent gathered, keyed by scoped address (`fe80::…%<node0's iface>`, see
/// [`scoped`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// node0's own hardware_id.
    pub hardware_id: String,
    pub ports: Vec<PortSeen>,
    /// node0's own link-local addresses on every interface (unscoped): ignored wherever they
    /// answer, so a cable looped between node0's two ports finds nothing.
    pub own: Vec<(String, String)>,
    pub logins: BTreeMap<String, Login>,
    /// Machines no cable of node0's reaches, logged into one hop through a neighbour: the
    /// ring's diagonal (K2 note 3). A machine here is a satellite only if a cable joins it to
    /// one; sharing the management LAN is never enough.
    pub beyond: Vec<Machine>,
}

impl Observation {
    /// The ring's walk ran: the cables are numbered from the cable map (K2 note 8), not from
    /// node0's ports alone.
    fn walked(&self) -> bool {
        !self.beyond.is_empty()
            || self.logins.values().any(|l| match l {
                Login::Machine(m) => !m.heard.is_empty(),
                _ => false,
            })
    }
}

/// `addr%iface`: the address as reached through one of node0's ports.
pub fn scoped(addr: &str, iface: &str) -> String {
    format!("{}%{iface}", unscoped(addr))
}

fn unscoped(addr: &str) -> &str {
    addr.split('%').next().unwrap_or(addr)
}

fn same_addr(a: &str, b: &str) -> bool {
    unscoped(a).eq_ignore_ascii_case(unscoped(b))
}

/// What one of node0's ports is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortVerdict {
    /// Every neighbour is one other machine: a cable.
    Link {
        hardware_id: String,
        /// Which of that machine's ports hold the addresses seen here (the crossed cable as a
        /// recorded fact), in order of preference for addressing.
        remote: Vec<String>,
        /// The address node0 reaches it at through this port (scoped).
        addr: String,
    },
    /// Several machines answered: the owner's LAN in a QSFP port, left alone.
    Lan { machines: u32 },
    /// Every address that answered refused the login.
    LoginFailed,
    /// Addresses answered, but none could be logged into or ruled out.
    Unreachable,
    /// Only node0's own addresses on its other ports answered: a cable looped between them.
    Looped { to: Vec<String> },
    /// The machine behind it is node0 itself (the same hardware_id).
    SelfPair,
    /// Carrier, and nothing answered: a machine with no link-local yet (the LAN fallback's
    /// case).
    Silent,
    /// No carrier: no cable.
    NoCable,
}

impl PortVerdict {
    /// How many machines this port counts (host_nodes.rails' neighbours_discovered).
    pub fn machines(&self) -> u32 {
        match self {
            PortVerdict::Link { .. } => 1,
            PortVerdict::Lan { machines } => *machines,
            _ => 0,
        }
    }
}

impl fmt::Display for PortVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortVerdict::Link { remote, .. } => {
                write!(f, "a cable to one machine (its {})", remote.join(", "))
            }
            PortVerdict::Lan { machines } => {
                write!(f, "a LAN ({machines} machines answered), left alone")
            }
            PortVerdict::LoginFailed => f.write_str("every address refused the login"),
            PortVerdict::Unreachable => f.write_str("addresses answered but SSH did not"),
            PortVerdict::Looped { to } => {
                write!(f, "looped back to this machine's own {}", to.join(", "))
            }
            PortVerdict::SelfPair => f.write_str("the machine behind it is this machine itself"),
            PortVerdict::Silent => f.write_str("carrier, but nothing answered"),
            PortVerdict::NoCable => f.write_str("no cable"),
        }
    }
}

/// Why the agent does not enrol yet: it retries every minute while the token lives, so the
/// token stays unspent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Ports where every address refused the login (node1's login is wrong).
    LoginFailed { ports: Vec<String> },
    /// Ports where addresses answered and SSH did not.
    Unreachable { ports: Vec<String> },
    /// A port whose machine is node0 itself: a single Spark presented as a pair.
    SelfPair { ports: Vec<String> },
    /// No link, and ports with carrier where nothing answered (node1 without link-local).
    Silent { ports: Vec<String> },
}

impl fmt::Display for Retry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retry::LoginFailed { ports } => write!(
                f,
                "the login was refused by every address on {}: check node1's user and password \
                 (/etc/enverge/peer-login)",
                ports.join(", ")
            ),
            Retry::Unreachable { ports } => write!(
                f,
                "machines answered on {} but their SSH did not: is sshd running on node1?",
                ports.join(", ")
            ),
            Retry::SelfPair { ports } => write!(
                f,
                "the machine on {} is this machine itself (the same GPUs): a pair is two machines",
                ports.join(", ")
            ),
            Retry::Silent { ports } => write!(
                f,
                "{} {} carrier but nothing answered: node1 is not reachable yet",
                ports.join(", "),
                if ports.len() == 1 { "has" } else { "have" }
            ),
        }
    }
}

/// What the probe found, ready to record and to send.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub verdicts: Vec<(String, PortVerdict)>,
    /// peer.json as it is to be recorded on the spot.
    pub peer_file: PeerFile,
    /// node0's rail ports for step 126, each with the machines that answered and its rail.
    pub rails: Vec<RailPort>,
    /// The machines on the cables for step 126, each at its own node_index.
    pub peers: Vec<NodeReport>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Enroll(Found),
    Retry {
        retry: Retry,
        verdicts: Vec<(String, PortVerdict)>,
    },
}

/// Judge one port.
pub fn judge_port(obs: &Observation, port: &PortSeen) -> PortVerdict {
    let own_here: Vec<&(String, String)> = obs
        .own
        .iter()
        .filter(|(_, a)| port.answered.iter().any(|b| same_addr(a, b)))
        .collect();
    let others: Vec<&String> = port
        .answered
        .iter()
        .filter(|a| !obs.own.iter().any(|(_, o)| same_addr(o, a)))
        .collect();
    if others.is_empty() {
        let mut to: Vec<String> = own_here
            .iter()
            .filter(|(iface, _)| *iface != port.iface)
            .map(|(iface, _)| iface.clone())
            .collect();
        to.sort();
        to.dedup();
        return if !to.is_empty() {
            PortVerdict::Looped { to }
        } else if port.carrier {
            PortVerdict::Silent
        } else {
            PortVerdict::NoCable
        };
    }
    // Group the addresses into machines: an address belongs to a machine logged into here
    // when that machine holds it, whichever address the login went through.
    let known: Vec<&Machine> = others
        .iter()
        .filter_map(|a| match obs.logins.get(&scoped(a, &port.iface)) {
            Some(Login::Machine(m)) => Some(m.as_ref()),
            _ => None,
        })
        .collect();
    let mut machines: BTreeMap<String, &Machine> = BTreeMap::new();
    let mut unidentified = 0u32;
    for m in &known {
        match m.hardware_id() {
            Some(hw) => {
                machines.insert(hw.to_owned(), *m);
            }
            None => unidentified += 1,
        }
    }
    let mut refused = 0usize;
    let mut strangers = 0usize;
    for a in &others {
        if known.iter().any(|m| m.port_of(a).is_some()) {
            continue;
        }
        strangers += 1;
        if obs.logins.get(&scoped(a, &port.iface)) == Some(&Login::Refused) {
            refused += 1;
        }
    }
    if machines.is_empty() && unidentified == 0 {
        return if refused == strangers {
            PortVerdict::LoginFailed
        } else {
            PortVerdict::Unreachable
        };
    }
    // Strangers (addresses no machine logged into here holds) are at least one more machine.
    let count = machines.len() as u32 + unidentified + u32::from(strangers > 0);
    if count > 1 {
        return PortVerdict::Lan { machines: count };
    }
    let Some((hw, m)) = machines.into_iter().next() else {
        // One machine that reports no identity: nothing to tell it from node0 by.
        return PortVerdict::Unreachable;
    };
    if hw == obs.hardware_id {
        return PortVerdict::SelfPair;
    }
    let mut remote: Vec<(String, String)> = others
        .iter()
        .filter_map(|a| m.port_of(a).map(|p| (p.to_owned(), (*a).clone())))
        .collect();
    // The PCI-domain-0 function first (enp…), its enP2 twin after (K2 note 8).
    remote.sort_by(|(a, _), (b, _)| port_order(a, b));
    remote.dedup_by(|x, y| x.0 == y.0);
    let Some((_, first)) = remote.first() else {
        // It answered a login but owns none of the addresses seen: nothing to number by.
        return PortVerdict::Unreachable;
    };
    let addr = scoped(first, &port.iface);
    PortVerdict::Link {
        hardware_id: hw,
        remote: remote.into_iter().map(|(p, _)| p).collect(),
        addr,
    }
}

/// Decide step 125: per port, then the links numbered as `rails` (the plan's rail indexes)
/// — keeping the numbering of `kept` (peer.json from an earlier run) for a machine it pins
/// (by host key) on the same port — and the machines at node indexes 1.. (kept ones keep
/// theirs; new ones by hardware_id, K2 note 4).
pub fn decide(obs: &Observation, rails: &[u32], kept: Option<&PeerFile>) -> Decision {
    let mut ports: Vec<&PortSeen> = obs.ports.iter().collect();
    ports.sort_by(|a, b| a.iface.cmp(&b.iface));
    let verdicts: Vec<(String, PortVerdict)> = ports
        .iter()
        .map(|p| (p.iface.clone(), judge_port(obs, p)))
        .collect();
    let named = |want: fn(&PortVerdict) -> bool| -> Vec<String> {
        verdicts
            .iter()
            .filter(|(_, v)| want(v))
            .map(|(i, _)| i.clone())
            .collect()
    };
    let retry = {
        let login = named(|v| matches!(v, PortVerdict::LoginFailed));
        let selfp = named(|v| matches!(v, PortVerdict::SelfPair));
        let unreachable = named(|v| matches!(v, PortVerdict::Unreachable));
        let silent = named(|v| matches!(v, PortVerdict::Silent));
        let linked = verdicts
            .iter()
            .any(|(_, v)| matches!(v, PortVerdict::Link { .. }));
        if !selfp.is_empty() {
            Some(Retry::SelfPair { ports: selfp })
        } else if !login.is_empty() {
            Some(Retry::LoginFailed { ports: login })
        } else if !unreachable.is_empty() {
            Some(Retry::Unreachable { ports: unreachable })
        } else if !linked && !silent.is_empty() {
            Some(Retry::Silent { ports: silent })
        } else {
            None
        }
    };
    if let Some(retry) = retry {
        return Decision::Retry { retry, verdicts };
    }
    Decision::Enroll(number(obs, rails, kept, verdicts))
}

/// One cable between two machines: each end's hardware_id and port, the rail it carries (none
/// past the plan's rails), and the neighbour's address as node0 reaches it when one end is
/// node0's.
#[derive(Clone, Debug)]
struct Cable {
    ends: [(String, String); 2],
    rail: Option<u32>,
    neighbour_addr: Option<String>,
}

impl Cable {
    /// This machine's port on the cable, and the other end.
    fn end_of(&self, hw: &str) -> Option<(&str, &(String, String))> {
        match &self.ends {
            [(a, p), other] | [other, (a, p)] if a == hw => Some((p.as_str(), other)),
            _ => None,
        }
    }
}

/// The PCI-domain-0 function first (enp…), its enP2 twin after (K2 note 8), then by name.
fn port_order(a: &str, b: &str) -> std::cmp::Ordering {
    (a.starts_with("enP"), a).cmp(&(b.starts_with("enP"), b))
}

fn number(
    obs: &Observation,
    rails: &[u32],
    kept: Option<&PeerFile>,
    verdicts: Vec<(String, PortVerdict)>,
) -> Found {
    let ring = obs.walked();
    // The machines on the cables, each once: node0's neighbours, and on a ring what the walk
    // reached beyond them.
    let mut machines: BTreeMap<String, Machine> = BTreeMap::new();
    for login in obs.logins.values() {
        if let Login::Machine(m) = login
            && let Some(hw) = m.hardware_id()
            && verdicts.iter().any(
                |(_, v)| matches!(v, PortVerdict::Link { hardware_id, .. } if hardware_id == hw),
            )
        {
            machines
                .entry(hw.to_owned())
                .or_insert_with(|| m.as_ref().clone());
        }
    }
    let cables_found = if ring {
        for m in &obs.beyond {
            if let Some(hw) = m.hardware_id()
                && hw != obs.hardware_id
            {
                machines.entry(hw.to_owned()).or_insert_with(|| m.clone());
            }
        }
        let mut cables = cable_map(obs, &machines);
        // Only what the cables join to node0 is a satellite: a machine that shares the LAN,
        // or sits on a cable of some other pair in the rack, is none of this host's.
        // Each pass reaches at least one more machine or none will ever be: as many passes
        // as there are cables is enough.
        let mut reached = vec![obs.hardware_id.clone()];
        for _ in 0..cables.len() {
            for c in &cables {
                let [(a, _), (b, _)] = &c.ends;
                match (reached.contains(a), reached.contains(b)) {
                    (true, false) => reached.push(b.clone()),
                    (false, true) => reached.push(a.clone()),
                    _ => {}
                }
            }
        }
        cables.retain(|c| reached.contains(&c.ends[0].0));
        machines.retain(|hw, _| reached.contains(hw));
        cables
    } else {
        Vec::new()
    };
    let kept_peers: &[Peer] = kept.map_or(&[], |k| &k.peers);
    let kept_for = |m: &Machine| kept_peers.iter().find(|p| p.host_key == m.host_key);
    // Node indexes: kept ones first, the rest by hardware_id.
    let mut node_of: BTreeMap<String, u32> = BTreeMap::new();
    for (hw, m) in &machines {
        if let Some(p) = kept_for(m) {
            node_of.insert(hw.clone(), p.index);
        }
    }
    // Bounded on purpose: there are never more indexes to hand out than machines.
    let taken: Vec<u32> = node_of.values().copied().collect();
    let mut free_nodes = (1..=machines.len() as u32 + taken.len() as u32)
        .filter(|i| !taken.contains(i))
        .collect::<Vec<_>>()
        .into_iter();
    for hw in machines.keys() {
        if !node_of.contains_key(hw)
            && let Some(i) = free_nodes.next()
        {
            node_of.insert(hw.clone(), i);
        }
    }
    node_of.insert(obs.hardware_id.clone(), 0);
    let mut plan: Vec<u32> = rails.to_vec();
    plan.sort_unstable();

    let cables = if ring {
        // A ring's cables are numbered from the cable map by (lower node, higher node) — the
        // node indexes are pinned, so the numbering follows them run after run.
        let mut cables = cables_found;
        let key = |c: &Cable| {
            let (a, b) = (node_of[&c.ends[0].0], node_of[&c.ends[1].0]);
            let low_port = if a <= b { &c.ends[0].1 } else { &c.ends[1].1 };
            (a.min(b), a.max(b), low_port.clone())
        };
        cables.sort_by_key(key);
        for (c, rail) in cables.iter_mut().zip(plan.iter()) {
            c.rail = Some(*rail);
        }
        cables
    } else {
        pair_cables(obs, &plan, kept_peers, &machines, &verdicts)
    };

    let node0_port_rail = |iface: &str| {
        cables.iter().find_map(|c| {
            c.end_of(&obs.hardware_id)
                .filter(|(p, _)| *p == iface)
                .and(c.rail)
        })
    };
    let port = |iface: &str| obs.ports.iter().find(|p| p.iface == iface);
    let rails_out: Vec<RailPort> = verdicts
        .iter()
        .map(|(iface, v)| {
            let p = port(iface);
            RailPort {
                iface: iface.clone(),
                device: p.and_then(|p| p.device.clone()),
                mtu: p.and_then(|p| p.mtu),
                active_mtu: p.and_then(|p| p.active_mtu),
                neighbours_discovered: v.machines(),
                index: node0_port_rail(iface),
                address: None,
            }
        })
        .collect();

    let mut peers_file = Vec::new();
    let mut peers_out = Vec::new();
    for (hw, m) in &machines {
        let index = node_of[hw];
        let mut links = Vec::new();
        for c in &cables {
            let (Some((mine, (other_hw, other_port))), Some(rail)) = (c.end_of(hw), c.rail) else {
                continue;
            };
            let to_node0 = *other_hw == obs.hardware_id;
            links.push(Link {
                index: rail,
                local: to_node0.then(|| other_port.clone()),
                remote: mine.to_owned(),
                neighbour_addr: c.neighbour_addr.clone().filter(|_| to_node0),
                peer: ring.then(|| node_of[other_hw]),
            });
        }
        links.sort_by_key(|l| l.index);
        let remote_index: BTreeMap<String, u32> =
            links.iter().map(|l| (l.remote.clone(), l.index)).collect();
        let mut report = m.report.clone();
        report.node_index = index;
        for r in &mut report.rails {
            r.index = remote_index.get(&r.iface).copied();
            r.neighbours_discovered = u32::from(r.index.is_some());
        }
        for (remote, i) in &remote_index {
            if !report.rails.iter().any(|r| &r.iface == remote) {
                report.rails.push(RailPort {
                    iface: remote.clone(),
                    neighbours_discovered: 1,
                    index: Some(*i),
                    ..RailPort::default()
                });
            }
        }
        let mut link_local: Vec<String> = m
            .ports
            .iter()
            .flat_map(|(_, addrs)| addrs.iter().map(|a| unscoped(a).to_ascii_lowercase()))
            .collect();
        link_local.sort();
        link_local.dedup();
        peers_file.push(Peer {
            index,
            addr: links.iter().find_map(|l| l.neighbour_addr.clone()),
            mgmt_addr: m.mgmt_addr.clone(),
            host_key: m.host_key.clone(),
            links,
            link_local,
        });
        peers_out.push(report);
    }
    peers_file.sort_by_key(|p| p.index);
    peers_out.sort_by_key(|p| p.node_index);
    Found {
        verdicts,
        peer_file: PeerFile { peers: peers_file },
        rails: rails_out,
        peers: peers_out,
    }
}

/// A pair's cables, from node0's ports alone: a kept link on the same local port to the same
/// machine keeps its rail; the rest take the plan's free rails in order, ports in name order. A
/// link past the plan's rails gets none (redeem refuses more cables than rails).
fn pair_cables(
    obs: &Observation,
    plan: &[u32],
    kept_peers: &[Peer],
    machines: &BTreeMap<String, Machine>,
    verdicts: &[(String, PortVerdict)],
) -> Vec<Cable> {
    let kept_for = |m: &Machine| kept_peers.iter().find(|p| p.host_key == m.host_key);
    let mut rail_of: BTreeMap<String, u32> = BTreeMap::new();
    for (iface, v) in verdicts {
        if let PortVerdict::Link { hardware_id, .. } = v
            && let Some(p) = kept_for(&machines[hardware_id])
            && let Some(l) = p
                .links
                .iter()
                .find(|l| l.local.as_deref() == Some(iface.as_str()))
            && plan.contains(&l.index)
        {
            rail_of.insert(iface.clone(), l.index);
        }
    }
    let mut free = plan
        .iter()
        .filter(|i| !rail_of.values().any(|u| u == *i))
        .copied()
        .collect::<Vec<_>>()
        .into_iter();
    for (iface, v) in verdicts {
        if matches!(v, PortVerdict::Link { .. })
            && !rail_of.contains_key(iface)
            && let Some(i) = free.next()
        {
            rail_of.insert(iface.clone(), i);
        }
    }
    verdicts
        .iter()
        .filter_map(|(iface, v)| match v {
            PortVerdict::Link {
                hardware_id,
                remote,
                addr,
            } => Some(Cable {
                ends: [
                    (obs.hardware_id.clone(), iface.clone()),
                    (hardware_id.clone(), remote[0].clone()),
                ],
                rail: rail_of.get(iface).copied(),
                neighbour_addr: Some(addr.clone()),
            }),
            _ => None,
        })
        .collect()
}

/// A ring's cable map (K2 notes 3 and 8): every port that heard the all-nodes multicast —
/// node0's and each satellite's — joined to the ports holding the addresses it
/// heard. A wire is what those joins connect (a QSFP's two functions fall on one); a wire with
/// exactly two machines on it and no stranger is a cable, addressed at each end on the
/// PCI-domain-0 function. A wire with a stranger or more machines is a LAN, left alone.
fn cable_map(obs: &Observation, machines: &BTreeMap<String, Machine>) -> Vec<Cable> {
    type End = (String, String);
    let node0 = obs.hardware_id.clone();
    let holder = |addr: &str| -> Option<End> {
        if let Some((iface, _)) = obs.own.iter().find(|(_, a)| same_addr(a, addr)) {
            return Some((node0.clone(), iface.clone()));
        }
        machines
            .iter()
            .find_map(|(hw, m)| m.port_of(addr).map(|p| (hw.clone(), p.to_owned())))
    };
    // node0's ports too, whatever their verdict: a LAN port's strangers, a looped port's
    // lone machine or a silent port's nothing make no cable of them below.
    let mut hearing: Vec<(End, &[String])> = obs
        .ports
        .iter()
        .map(|p| ((node0.clone(), p.iface.clone()), p.answered.as_slice()))
        .collect();
    for (hw, m) in machines {
        for p in &m.heard {
            hearing.push(((hw.clone(), p.iface.clone()), p.answered.as_slice()));
        }
    }
    // Each port starts as a wire of its own, labelled by itself; a port holding an address
    // one heard joins that one's wire, and wires that meet become one (relabelled).
    let mut wire: BTreeMap<End, End> = hearing
        .iter()
        .map(|(end, _)| (end.clone(), end.clone()))
        .collect();
    let mut strangers: Vec<End> = Vec::new();
    for (end, answered) in &hearing {
        for a in *answered {
            let Some(e) = holder(a) else {
                strangers.push(end.clone());
                continue;
            };
            let theirs = wire.entry(e.clone()).or_insert(e).clone();
            let mine = wire[end].clone();
            for w in wire.values_mut() {
                if *w == theirs {
                    *w = mine.clone();
                }
            }
        }
    }
    let mut wires: BTreeMap<End, Vec<End>> = BTreeMap::new();
    for (e, w) in &wire {
        wires.entry(w.clone()).or_default().push(e.clone());
    }
    let stranger_wires: Vec<End> = strangers.iter().map(|e| wire[e].clone()).collect();
    let mut cables = Vec::new();
    for (w, ends) in wires {
        // A stranger on the wire answers every port on it: the owner's LAN, left alone.
        if stranger_wires.contains(&w) {
            continue;
        }
        let mut on: BTreeMap<&str, &str> = BTreeMap::new();
        for (hw, p) in &ends {
            let best = on.entry(hw.as_str()).or_insert(p.as_str());
            if port_order(p, best).is_lt() {
                *best = p.as_str();
            }
        }
        if on.len() != 2 {
            continue;
        }
        let pairs: Vec<(String, String)> = on
            .into_iter()
            .map(|(hw, p)| (hw.to_owned(), p.to_owned()))
            .collect();
        let ends = [pairs[0].clone(), pairs[1].clone()];
        // How node0 reaches the neighbour through this cable: an address the neighbour holds
        // on its addressed port, as node0's port heard it.
        let neighbour_addr = ends.iter().position(|(hw, _)| *hw == node0).and_then(|i| {
            let (mine, (hw, theirs)) = (&ends[i].1, &ends[1 - i]);
            let heard = obs.ports.iter().find(|p| &p.iface == mine)?;
            let m = machines.get(hw)?;
            let a = heard
                .answered
                .iter()
                .find(|a| m.port_of(a) == Some(theirs.as_str()))
                .or_else(|| heard.answered.iter().find(|a| m.port_of(a).is_some()))?;
            Some(scoped(a, mine))
        });
        cables.push(Cable {
            ends,
            rail: None,
            neighbour_addr,
        });
    }
    cables
}

/// Step 133's count on one of node0's rail ports: how many machines answered the all-nodes
/// multicast, not how many addresses — node0's own addresses left out (a looped cable), the
/// addresses a satellite showed when node0 logged in (`known`: address → node index, from
/// peer.json) counted as that one machine, and any other address as a machine of its own.
/// Zero on a port whose netdev an instance holds (the host sees no answer there).
pub fn machines_answering(
    answered: &[String],
    own: &[String],
    known: &std::collections::BTreeMap<String, u32>,
) -> u32 {
    let mut machines = std::collections::BTreeSet::new();
    for a in answered {
        if own.iter().any(|o| same_addr(o, a)) {
            continue;
        }
        let addr = unscoped(a).to_ascii_lowercase();
        machines.insert(match known.get(&addr) {
            Some(node) => format!("node{node}"),
            None => addr,
        });
    }
    machines.len() as u32
}

/// What the agent checks before it enrols: a peer whose identity is node0's own is a retry,
/// not a spent token (K1 note 10).
pub fn self_pair(node0: &NodeReport, peers: &[NodeReport]) -> bool {
    let id = |n: &NodeReport| {
        n.hardware_id
            .clone()
            .or_else(|| n.machine_id.clone())
            .filter(|h| !h.trim().is_empty())
    };
    let mine = id(node0);
    mine.is_some() && peers.iter().any(|p| id(p) == mine)
}
