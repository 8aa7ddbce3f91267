//! K's node1 block, what its steps share: the satellites as peer.json pins them, how node0
//! reaches them ([`Satellites`], over SSH in production), the plan a satellite is prepared
//! with, and the rail plan's addresses. The steps themselves (peer-access, satellites,
//! rail-network, rail-verify) live in `steps/`. Satellites have no agent: everything is done
//! by node0's agent through a [`Host`] that reaches them.

use std::rc::Rc;

use byo_core::prepare::Progress;
use byo_wire::prepare::NodeRails;

use super::Plan;
use crate::host::{Fallible, Host, read_string};

/// The steps a satellite runs, in the same order as node0's (so every landmine ordering holds
/// there too): the registry's steps that are not node0's alone.
pub fn satellite_steps() -> impl Iterator<Item = &'static str> {
    super::steps::STEPS
        .iter()
        .filter(|s| s.scope == super::steps::Scope::EveryNode)
        .map(|s| s.name)
}

pub use crate::machines::{PEER_KEY, known_hosts_line, satellite_host};
pub use crate::names::PEER_LOGIN;
/// peer.json's shape is byo-wire's: the pure cable probe (`byo_core::probe`) writes it.
pub use byo_wire::peers::{Link, PEER_FILE, Peer, parse_peer_file};

/// node0's peer key in `dir` (`/etc/enverge`), made the first time a pair prepares: what the
/// satellites admit `spark` with from peer-access (129) on, so node0 needs the lent login only
/// once. A key already there is kept, so a run again changes nothing. Returns the public line.
pub fn ensure_peer_key(dir: &std::path::Path) -> Fallible<String> {
    use ssh_key::{Algorithm, LineEnding, PrivateKey, rand_core::OsRng};
    let private = dir.join(PEER_KEY);
    let public = dir.join(format!("{PEER_KEY}.pub"));
    let key = match std::fs::read_to_string(&private) {
        Ok(text) => PrivateKey::from_openssh(&text)
            .map_err(|e| format!("{} does not parse: {e}", private.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut key = PrivateKey::random(&mut OsRng, Algorithm::Ed25519)
                .map_err(|e| format!("making node0's peer key: {e}"))?;
            key.set_comment("enverge-node0-peer");
            let text = key
                .to_openssh(LineEnding::LF)
                .map_err(|e| format!("encoding node0's peer key: {e}"))?;
            crate::host::write_atomic(&private, text.as_bytes(), 0o600)
                .map_err(|e| format!("writing {}: {e}", private.display()))?;
            key
        }
        Err(e) => return Err(format!("reading {}: {e}", private.display())),
    };
    let mut line = key.public_key().clone();
    line.set_comment("");
    let line = line
        .to_openssh()
        .map_err(|e| format!("encoding node0's peer key: {e}"))?;
    if std::fs::read_to_string(&public)
        .ok()
        .as_deref()
        .map(str::trim)
        != Some(line.as_str())
    {
        crate::host::write_atomic(&public, format!("{line}\n").as_bytes(), 0o644)
            .map_err(|e| format!("writing {}: {e}", public.display()))?;
    }
    Ok(line)
}

/// How node0 reaches its satellites, and where their progress goes.
pub trait Satellites {
    /// The satellite as `spark`, with node0's peer key and its pinned host key.
    fn spark(&self, peer: &Peer) -> Fallible<Box<dyn Host + '_>>;
    /// The satellite through the owner's login from peer-login, while that file exists.
    fn owner_login(&self, peer: &Peer) -> Fallible<Option<Box<dyn Host + '_>>>;
    /// A satellite step's progress, tagged with its index.
    fn report(&self, progress: Progress);
    /// A machine's rails (node0's or a satellite's) as a rail step left them (130–132).
    fn rails(&self, rails: NodeRails);
}

/// One machine's rail ports as they are now: what detect reads there (device, MTUs), each
/// cabled port with the rail it carries, its one neighbour and the plan's address on it
/// (what rail-network set; rail-verify has proved it when `verified`).
pub fn node_rails<H: Host + ?Sized>(
    h: &mut H,
    plan: &Plan,
    node: u32,
    cabled: &[(String, u32)],
    verified: bool,
) -> Fallible<NodeRails> {
    let mut ports = crate::detect::rails(&crate::detect::HostProbe(std::cell::RefCell::new(h)));
    for (iface, rail) in cabled {
        if !ports.iter().any(|p| &p.iface == iface) {
            ports.push(byo_wire::enroll::RailPort {
                iface: iface.clone(),
                ..Default::default()
            });
        }
        let (address, _) = planned_address(plan, *rail, node)?;
        if let Some(p) = ports.iter_mut().find(|p| &p.iface == iface) {
            p.index = Some(*rail);
            p.neighbours_discovered = 1;
            p.address = Some(address);
        }
    }
    Ok(NodeRails {
        node,
        ports,
        verified,
    })
}

pub(super) fn satellites(plan: &Plan) -> Fallible<&Rc<dyn Satellites>> {
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
        keys.push_str(&format!(
            "{} {}\n",
            k.trim(),
            crate::machines::PEER_KEY_COMMENT
        ));
    }
    Plan {
        profile: plan.profile.clone(),
        authorized_keys: Some(keys),
        wireguard: None,
        tunnel_token: None,
        cloudflared: None,
        lockout_owner: plan.lockout_owner,
        owner,
        node: peer.index,
        peers: Vec::new(),
        satellites: None,
        peer_public_key: None,
    }
}

/// The login the owner lent for the satellites (peer-login: user, then password).
pub(super) fn lent_user<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    Ok(read_string(h, PEER_LOGIN)?
        .and_then(|t| t.lines().next().map(|u| u.trim().to_owned()))
        .filter(|u| !u.is_empty()))
}

/// A node's address on a rail: the subnet's tenth host plus the node's index (K).
pub fn rail_address(subnet: &str, node: u32) -> Option<(String, u32)> {
    let (net, len) = subnet.split_once('/')?;
    let ip: std::net::Ipv4Addr = net.parse().ok()?;
    let host = std::net::Ipv4Addr::from(u32::from(ip) + 10 + node);
    Some((host.to_string(), len.parse().ok()?))
}

/// Where LXD answers on a machine this plan prepares (Debian's package, or the snap).
pub fn lxd_socket(plan: &Plan) -> &'static str {
    if plan.profile.prepare.lxd == byo_wire::profile::LxdSource::Apt {
        "/var/lib/lxd/unix.socket"
    } else {
        "/var/snap/lxd/common/lxd/unix.socket"
    }
}

/// What serving knows of a pair's machines (`HandOver::pair`): each one's cables with the
/// plan's address and MTU, a satellite's management address and pinned host key. Empty on a
/// single Spark.
pub fn pair_nodes(plan: &Plan) -> Fallible<Vec<crate::machines::PairNode>> {
    if plan.peers.is_empty() {
        return Ok(Vec::new());
    }
    let rails = |node: u32, mut cabled: Vec<(String, u32)>| {
        cabled.sort_by_key(|(_, rail)| *rail);
        cabled
            .into_iter()
            .map(|(port, rail)| {
                let (address, mtu) = planned_address(plan, rail, node)?;
                Ok(crate::machines::RailAddr { port, address, mtu })
            })
            .collect::<Fallible<Vec<_>>>()
    };
    let mut nodes = vec![crate::machines::PairNode {
        index: 0,
        mgmt_addr: None,
        host_key: None,
        lxd_socket: None,
        rails: rails(0, node0_ports(plan))?,
    }];
    for peer in &plan.peers {
        nodes.push(crate::machines::PairNode {
            index: peer.index,
            mgmt_addr: peer.mgmt_addr.clone().or_else(|| peer.addr.clone()),
            host_key: Some(peer.host_key.clone()),
            lxd_socket: Some(lxd_socket(plan).to_owned()),
            rails: rails(peer.index, peer_ports(peer))?,
        });
    }
    Ok(nodes)
}

/// node0's cabled ports, each with the rail it carries (peer.json's links).
pub fn node0_ports(plan: &Plan) -> Vec<(String, u32)> {
    plan.peers
        .iter()
        .flat_map(|p| p.links.iter())
        .filter_map(|l| l.local.clone().map(|i| (i, l.index)))
        .collect()
}

/// A satellite's cabled ports, each with the rail it carries.
pub fn peer_ports(peer: &Peer) -> Vec<(String, u32)> {
    peer.links
        .iter()
        .map(|l| (l.remote.clone(), l.index))
        .collect()
}

/// The plan's address of `node` on `rail` (`a.b.c.d/len`: the subnet's tenth host plus the
/// node's index) and the rail's MTU.
pub fn planned_address(plan: &Plan, rail: u32, node: u32) -> Fallible<(String, u32)> {
    let (subnet, mtu) = rail_plan(plan, rail)?;
    let (addr, len) = rail_address(&subnet, node).ok_or("a rail subnet does not parse")?;
    Ok((format!("{addr}/{len}"), mtu))
}

pub(super) fn rail_plan(plan: &Plan, index: u32) -> Fallible<(String, u32)> {
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
        let (address, mtu) = planned_address(plan, *rail, node)?;
        s.push_str(&format!(
            "    {iface}:\n      mtu: {mtu}\n      addresses: [\"{address}\"]\n      link-local: [ipv6]\n      ipv6-address-generation: eui64\n"
        ));
    }
    Ok(s)
}

/// The satellites over SSH from node0: as spark with node0's peer key (Ed25519, root-only at
/// /etc/enverge/peer.key), or through the lent login while it exists. The pinned host key is
/// the only one ssh accepts.
pub struct SshSatellites {
    pub dir: std::path::PathBuf,
    pub lxd_socket: String,
    pub report: Box<dyn Fn(Progress)>,
    pub report_rails: Box<dyn Fn(NodeRails)>,
}

impl SshSatellites {
    fn host(&self, peer: &Peer, user: &str, lent: bool) -> Fallible<crate::host::SshHost> {
        satellite_host(&self.dir, peer, user, &self.lxd_socket, lent, true)
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
    fn rails(&self, rails: NodeRails) {
        (self.report_rails)(rails)
    }
}
