//! K's node1 block on node0's track: peer-access (129), the satellites' own preparation
//! (130–131: node{k}'s subset of the list, run from node0 over SSH and reported with index k),
//! rail-network and rail-verify (132). Satellites have no agent: everything here is done by
//! node0's agent through a [`Host`] that reaches them.

use std::rc::Rc;

use byo_core::prepare::{Check, Mode, Progress, Step};
use serde::{Deserialize, Serialize};

use super::Plan;
use crate::host::{Fallible, Host, read_string};

/// What only node0 has: the relay peer, and the pair steps that reach the satellites.
const NODE0_ONLY: &[&str] = &[
    "relay-peer",
    "peer-access",
    "satellites",
    "rail-network",
    "rail-verify",
];

/// The steps a satellite runs, in the same order as node0's (so every landmine ordering holds
/// there too): node0's list without what only node0 has.
pub fn satellite_steps() -> impl Iterator<Item = &'static str> {
    super::STEP_NAMES
        .iter()
        .copied()
        .filter(|s| !NODE0_ONLY.contains(s))
}

pub const PEER_LOGIN: &str = "/etc/enverge/peer-login";
pub const PEER_FILE: &str = "/etc/enverge/peer.json";
const NETPLAN_RAILS: &str = "/etc/netplan/60-enverge-rails.yaml";

/// One cable, numbered as a rail of the plan the first time node0 looked (125).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    /// node0's interface on it, when the cable ends on node0.
    #[serde(default)]
    pub local: Option<String>,
    /// The satellite's interface on it.
    pub remote: String,
    #[serde(default)]
    pub neighbour_addr: Option<String>,
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
}

/// peer.json: `{peers: [...]}`, or the pair-shaped file (flat fields, one peer).
pub fn parse_peer_file(text: &str) -> Result<Vec<Peer>, String> {
    #[derive(Deserialize)]
    struct Ring {
        peers: Vec<Peer>,
    }
    if let Ok(r) = serde_json::from_str::<Ring>(text) {
        return Ok(r.peers);
    }
    serde_json::from_str::<Peer>(text)
        .map(|p| vec![p])
        .map_err(|e| format!("{PEER_FILE} does not parse: {e}"))
}

/// How node0 reaches its satellites, and where their progress goes.
pub trait Satellites {
    /// The satellite as `spark`, with node0's peer key and its pinned host key.
    fn spark(&self, peer: &Peer) -> Fallible<Box<dyn Host + '_>>;
    /// The satellite through the owner's login from peer-login, while that file exists.
    fn owner_login(&self, peer: &Peer) -> Fallible<Option<Box<dyn Host + '_>>>;
    /// A satellite step's progress, tagged with its index.
    fn report(&self, progress: Progress);
}

fn satellites(plan: &Plan) -> Fallible<&Rc<dyn Satellites>> {
    if plan.peers.is_empty() {
        return Err(format!(
            "the profile has {} nodes but no satellite is pinned in {PEER_FILE}",
            plan.profile.node_count
        ));
    }
    plan.satellites
        .as_ref()
        .ok_or_else(|| "this run cannot reach satellites".to_owned())
}

/// The plan a satellite is prepared with: node0's, minus the relay, with node0's peer key
/// admitted besides the operators', and the owner being the login that was lent for it.
pub fn satellite_plan(plan: &Plan, peer: &Peer, owner: Option<String>) -> Plan {
    let mut keys = plan.authorized_keys.clone().unwrap_or_default();
    if let Some(k) = &plan.peer_public_key {
        keys.push_str(&format!("{} enverge-node0-peer\n", k.trim()));
    }
    Plan {
        profile: plan.profile.clone(),
        authorized_keys: Some(keys),
        wireguard: None,
        tunnel_token: None,
        lockout_owner: plan.lockout_owner,
        owner,
        node: peer.index,
        peers: Vec::new(),
        satellites: None,
        peer_public_key: None,
    }
}

/// The login the owner lent for the satellites (peer-login: user, then password).
fn lent_user<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    Ok(read_string(h, PEER_LOGIN)?
        .and_then(|t| t.lines().next().map(|u| u.trim().to_owned()))
        .filter(|u| !u.is_empty()))
}

// --- peer-access (129) -------------------------------------------------------------------------

pub(super) fn peer_access_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    let sats = satellites(plan)?;
    let owner = lent_user(h)?;
    let mut needs = Vec::new();
    for peer in &plan.peers {
        let sub = satellite_plan(plan, peer, owner.clone());
        let mut node = sats.spark(peer).ok();
        let answers = node
            .as_mut()
            .is_some_and(|n| n.run(&["true"], None).is_ok_and(|o| o.ok()));
        match node.as_mut() {
            Some(node) if answers => {
                let problems = super::steps::operator_access_problems(node, &sub)?;
                if !problems.is_empty() {
                    needs.push(format!("node{}: {}", peer.index, problems.join("; ")));
                }
            }
            _ => needs.push(format!(
                "node{}: admit spark with node0's peer key and the operator keys",
                peer.index
            )),
        }
    }
    if needs.is_empty() && h.read(PEER_LOGIN)?.is_some() {
        needs.push(format!(
            "delete {PEER_LOGIN}: the lent login is not needed again"
        ));
    }
    Ok(super::steps::verdict(needs))
}

pub(super) fn peer_access_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    let sats = satellites(plan)?;
    let owner = lent_user(h)?;
    for peer in &plan.peers {
        let sub = satellite_plan(plan, peer, owner.clone());
        let spark_ok = sats
            .spark(peer)
            .ok()
            .is_some_and(|mut n| n.run(&["true"], None).is_ok_and(|o| o.ok()));
        let mut node = if spark_ok {
            sats.spark(peer)?
        } else {
            sats.owner_login(peer)?.ok_or_else(|| {
                format!(
                    "node{} does not admit spark yet and {PEER_LOGIN} is gone: run the one-liner again with node{}'s login",
                    peer.index, peer.index
                )
            })?
        };
        super::steps::operator_access_apply(&mut node, &sub)?;
        // Who owner-lockout removes on that machine, once node0 no longer keeps the login.
        if let Some(user) = &owner {
            node.write(
                super::OWNER_FILE,
                format!("{user}\n").as_bytes(),
                0o644,
                "root:root",
            )?;
        }
    }
    // Decides nothing else: the password never leaves node0, and now not even node0 keeps it.
    h.remove(PEER_LOGIN)
}

// --- the satellites' own preparation (130–131) --------------------------------------------------

pub(super) fn satellites_check<H: Host>(_: &mut H, plan: &Plan) -> Fallible<Check> {
    let sats = satellites(plan)?;
    let mut needs = Vec::new();
    for peer in &plan.peers {
        let mut node = sats.spark(peer)?;
        if !node.run(&["true"], None).is_ok_and(|o| o.ok()) {
            needs.push(format!(
                "prepare node{} (once peer-access admits spark)",
                peer.index
            ));
            continue;
        }
        let sub = satellite_plan(plan, peer, None);
        let out = run_satellite(&mut node, &sub, Mode::DryRun, &|_| {});
        // A check that fails only because an earlier step has not applied yet is the
        // apply's to find; with nothing to change, it is the satellite's fault.
        if let (Some((step, e)), true) = (&out.failed, out.changes.is_empty()) {
            return Err(format!("node{} {step}: {e}", peer.index));
        }
        if !out.changes.is_empty() {
            let steps: Vec<&str> = out.changes.iter().map(|(s, _)| s.as_str()).collect();
            needs.push(format!("prepare node{}: {}", peer.index, steps.join(", ")));
        }
    }
    Ok(super::steps::verdict(needs))
}

pub(super) fn satellites_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    let sats = satellites(plan)?;
    let owner = lent_user(h)?;
    for peer in &plan.peers {
        let mut node = sats.spark(peer)?;
        let sub = satellite_plan(plan, peer, owner.clone());
        let out = run_satellite(&mut node, &sub, Mode::Run, &|p| sats.report(p));
        if let Some((step, e)) = out.failed {
            return Err(format!("node{} stopped at {step}: {e}", peer.index));
        }
    }
    Ok(())
}

fn run_satellite(
    node: &mut Box<dyn Host + '_>,
    sub: &Plan,
    mode: Mode,
    report: &dyn Fn(Progress),
) -> byo_core::prepare::Outcome {
    let all = super::steps::all::<Box<dyn Host + '_>>(sub);
    let chosen: Vec<&dyn Step<Box<dyn Host + '_>>> = all
        .iter()
        .filter(|s| satellite_steps().any(|n| n == s.name()))
        .map(|s| s.as_ref())
        .collect();
    // The satellite's track is re-checked whole each time: its done list would live on a
    // machine with no agent to trust it.
    byo_core::prepare::run(
        &chosen,
        node,
        sub.node,
        "satellite",
        None,
        mode,
        chrono::Utc::now,
        report,
    )
}

// --- rail-network (130) and rail-verify (132) ----------------------------------------------------

/// A node's address on a rail: the subnet's tenth host plus the node's index (K).
pub fn rail_address(subnet: &str, node: u32) -> Option<(String, u32)> {
    let (net, len) = subnet.split_once('/')?;
    let ip: std::net::Ipv4Addr = net.parse().ok()?;
    let host = std::net::Ipv4Addr::from(u32::from(ip) + 10 + node);
    Some((host.to_string(), len.parse().ok()?))
}

fn rail_plan(plan: &Plan, index: u32) -> Fallible<(String, u32)> {
    plan.profile
        .rails
        .iter()
        .find(|r| r.index == index)
        .map(|r| (r.subnet.clone(), r.mtu))
        .ok_or_else(|| format!("rail {index} is not in the profile's plan"))
}

/// The netplan file for one node's rails: the planned address, the MTU, eui64 link-local
/// kept (the cable probe depends on it).
pub fn render_rails(plan: &Plan, node: u32, ports: &[(String, u32)]) -> Fallible<String> {
    let mut s = String::from(
        "# Written by enverge preparation (rail-network).\nnetwork:\n  version: 2\n  ethernets:\n",
    );
    for (iface, rail) in ports {
        let (subnet, mtu) = rail_plan(plan, *rail)?;
        let (addr, len) = rail_address(&subnet, node).ok_or("a rail subnet does not parse")?;
        s.push_str(&format!(
            "    {iface}:\n      mtu: {mtu}\n      addresses: [\"{addr}/{len}\"]\n      link-local: [ipv6]\n      ipv6-address-generation: eui64\n"
        ));
    }
    Ok(s)
}

fn node0_ports(plan: &Plan) -> Vec<(String, u32)> {
    plan.peers
        .iter()
        .flat_map(|p| p.links.iter())
        .filter_map(|l| l.local.clone().map(|i| (i, l.index)))
        .collect()
}

fn peer_ports(peer: &Peer) -> Vec<(String, u32)> {
    peer.links
        .iter()
        .map(|l| (l.remote.clone(), l.index))
        .collect()
}

fn rails_on<H: Host + ?Sized>(h: &mut H, want: &str) -> Fallible<bool> {
    Ok(read_string(h, NETPLAN_RAILS)?.as_deref() == Some(want))
}

fn apply_rails<H: Host + ?Sized>(h: &mut H, want: &str) -> Fallible<()> {
    h.write(NETPLAN_RAILS, want.as_bytes(), 0o600, "root:root")?;
    // netplan generate is the validator; a file it refuses is taken back.
    if let Err(e) = crate::host::must(h, &["netplan", "generate"]) {
        h.remove(NETPLAN_RAILS)?;
        return Err(format!("netplan refused the rail configuration: {e}"));
    }
    crate::host::must(h, &["netplan", "apply"]).map(drop)
}

pub(super) fn rail_network_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    let sats = satellites(plan)?;
    let mut needs = Vec::new();
    if !rails_on(h, &render_rails(plan, 0, &node0_ports(plan))?)? {
        needs.push("address node0's rails".to_owned());
    }
    for peer in &plan.peers {
        let want = render_rails(plan, peer.index, &peer_ports(peer))?;
        if !rails_on(&mut sats.spark(peer)?, &want)? {
            needs.push(format!("address node{}'s rails", peer.index));
        }
    }
    Ok(super::steps::verdict(needs))
}

pub(super) fn rail_network_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    let sats = satellites(plan)?;
    let mine = render_rails(plan, 0, &node0_ports(plan))?;
    if !rails_on(h, &mine)? {
        apply_rails(h, &mine)?;
    }
    for peer in &plan.peers {
        let want = render_rails(plan, peer.index, &peer_ports(peer))?;
        let mut node = sats.spark(peer)?;
        if !rails_on(&mut node, &want)? {
            apply_rails(&mut node, &want)?;
        }
    }
    Ok(())
}

/// Traffic across every cable, from both of its ends.
pub(super) fn rail_verify_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    let sats = satellites(plan)?;
    let mut silent = Vec::new();
    for peer in &plan.peers {
        let mut node = sats.spark(peer)?;
        for link in &peer.links {
            let (subnet, _) = rail_plan(plan, link.index)?;
            let (theirs, _) = rail_address(&subnet, peer.index).ok_or("rail subnet")?;
            let (ours, _) = rail_address(&subnet, 0).ok_or("rail subnet")?;
            if let Some(local) = &link.local {
                let out = h.run(&["ping", "-c", "3", "-W", "2", "-I", local, &theirs], None)?;
                if !out.ok() {
                    silent.push(format!(
                        "rail {}: node0 {local} → node{} {theirs}",
                        link.index, peer.index
                    ));
                }
                let out = node.run(
                    &["ping", "-c", "3", "-W", "2", "-I", &link.remote, &ours],
                    None,
                )?;
                if !out.ok() {
                    silent.push(format!(
                        "rail {}: node{} {} → node0 {ours}",
                        link.index, peer.index, link.remote
                    ));
                }
            }
        }
    }
    if silent.is_empty() {
        Ok(Check::Satisfied)
    } else {
        Err(format!("no traffic across {}", silent.join("; ")))
    }
}

/// The satellites over SSH from node0: as spark with node0's peer key (Ed25519, root-only at
/// /etc/enverge/peer.key), or through the lent login while it exists. The pinned host key is
/// the only one ssh accepts.
pub struct SshSatellites {
    pub dir: std::path::PathBuf,
    pub lxd_socket: String,
    pub report: Box<dyn Fn(Progress)>,
}

impl SshSatellites {
    fn host(&self, peer: &Peer, user: &str, lent: bool) -> Fallible<crate::host::SshHost> {
        let addr = peer
            .mgmt_addr
            .clone()
            .or_else(|| peer.addr.clone())
            .ok_or_else(|| format!("node{} has no address in {PEER_FILE}", peer.index))?;
        let known = self.dir.join(format!("peer-{}.known_hosts", peer.index));
        let host = addr.split('%').next().unwrap_or(&addr).to_owned();
        std::fs::write(&known, format!("{host} {}\n", peer.host_key.trim()))
            .map_err(|e| format!("pinning node{}'s host key: {e}", peer.index))?;
        Ok(crate::host::SshHost {
            node: peer.index,
            user: user.to_owned(),
            addr,
            key: self.dir.join("peer.key"),
            known_hosts: known,
            port: 22,
            lxd_socket: self.lxd_socket.clone(),
            password_file: lent.then(|| self.dir.join("peer-login")),
        })
    }
}

impl Satellites for SshSatellites {
    fn spark(&self, peer: &Peer) -> Fallible<Box<dyn Host + '_>> {
        Ok(Box::new(self.host(peer, super::SPARK, false)?))
    }
    fn owner_login(&self, peer: &Peer) -> Fallible<Option<Box<dyn Host + '_>>> {
        let file = self.dir.join("peer-login");
        let Ok(text) = std::fs::read_to_string(&file) else {
            return Ok(None);
        };
        let user = text.lines().next().unwrap_or_default().trim().to_owned();
        Ok(Some(Box::new(self.host(peer, &user, true)?)))
    }
    fn report(&self, progress: Progress) {
        (self.report)(progress)
    }
}
