//! `rail-network` (130): step 16 of the list in `docs/prepare.md`.
//!
//! **Check:** `/etc/netplan/60-enverge-rails.yaml` on every machine holds the plan's address per
//! cable (subnet's tenth host + node index), the rail MTU, eui64 link-local; and
//! `/etc/sysctl.d/60-enverge-rails.conf` has every RDMA port answer ARP only for its own address.
//! On node0, spark's group may open ICMP datagram sockets (`ping_group_range`), for the
//! heartbeat's unprivileged count of the machines on each rail (133).
//! **Apply:** write, `netplan generate` (the validator; a refused file is taken back), `netplan
//! apply`; the sysctl files written and loaded.
//! lofispark-dual on every machine: the node's cabled ports as physical NICs, which move into a
//! pair's head (node0) or worker (a satellite) when it starts (K1 note 11, K2 note 7); its
//! description carries a digest of its content, like lofispark-base's.
//! **Why here:** Addresses on the ports the cables were recorded on at 125. A QSFP is two
//! functions on one wire, and only one of them is addressed: with Linux's default ARP the bare
//! twin answers for its sibling's address, the far end sends there, and a reply to a socket
//! bound to the addressed port never arrives (rail-verify's ping, and any rail traffic bound
//! to its device).

use byo_core::prepare::Check;

use super::shared::{SPARK, single, verdict};
use super::{Scope, StepDef};
use crate::host::{Fallible, Host, read_string};
use crate::prepare::Plan;
use crate::prepare::peers::{node_rails, node0_ports, peer_ports, render_rails, satellites};

use byo_core::render::units::NETPLAN_RAILS;
pub(crate) const SYSCTL_RAILS: &str = "/etc/sysctl.d/60-enverge-rails.conf";
/// node0's serving counts the machines on each rail every beat (133) with an unprivileged
/// multicast ping: an ICMP datagram socket, which the kernel allows only to the groups in
/// `net.ipv4.ping_group_range` (IPv6's too). DGX OS admits every group; a host that does not
/// admit spark's gets it, and only it.
pub(crate) const SYSCTL_PING: &str = "/etc/sysctl.d/60-enverge-ping.conf";
const PING_GROUP_RANGE: &str = "/proc/sys/net/ipv4/ping_group_range";

/// What one machine's rails should be: its netplan file and its ARP settings.
struct Rails {
    netplan: String,
    sysctl: String,
    /// lofispark-dual as this node renders it.
    dual: serde_json::Value,
}

pub use crate::names::DUAL_PROFILE;

pub(crate) struct RailNetwork;

impl StepDef for RailNetwork {
    const NAME: &str = "rail-network";
    const SCOPE: Scope = Scope::Node0;

    fn skip<H: Host>(h: &mut H, plan: &Plan) -> Option<String> {
        single(h, plan)
    }

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        let sats = satellites(plan)?;
        let mut needs = Vec::new();
        let mine = wanted(h, plan, 0, &node0_ports(plan))?;
        if !rails_on(h, &mine)? {
            needs.push("address node0's rails".to_owned());
        }
        if let Some(gid) = ping_not_granted(h)? {
            needs.push(format!(
                "let spark's group ({gid}) ping without privilege, for the heartbeat's count"
            ));
        }
        for peer in &plan.peers {
            let mut node = sats.spark(peer)?;
            let want = wanted(&mut node, plan, peer.index, &peer_ports(peer))?;
            if !rails_on(&mut node, &want)? {
                needs.push(format!("address node{}'s rails", peer.index));
            }
        }
        Ok(verdict(needs))
    }

    /// Each machine whose rails changed says so at once (130–131): host_nodes.rails is the
    /// fact beside the plan.
    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        let sats = satellites(plan)?;
        let mine = wanted(h, plan, 0, &node0_ports(plan))?;
        if !rails_on(h, &mine)? {
            apply_rails(h, &mine)?;
            sats.rails(node_rails(h, plan, 0, &node0_ports(plan), false)?);
        }
        if let Some(gid) = ping_not_granted(h)? {
            let line = format!(
                "# Written by enverge preparation (rail-network): serving counts the machines on each\n\
                 # rail with an unprivileged ping (133).\nnet.ipv4.ping_group_range = {gid} {gid}\n"
            );
            h.write(SYSCTL_PING, line.as_bytes(), 0o644, "root:root")?;
            crate::host::must(h, &["sysctl", "-q", "-p", SYSCTL_PING])?;
        }
        for peer in &plan.peers {
            let mut node = sats.spark(peer)?;
            let want = wanted(&mut node, plan, peer.index, &peer_ports(peer))?;
            if !rails_on(&mut node, &want)? {
                apply_rails(&mut node, &want)?;
                sats.rails(node_rails(
                    &mut node,
                    plan,
                    peer.index,
                    &peer_ports(peer),
                    false,
                )?);
            }
        }
        Ok(())
    }
}

/// spark's group, when the kernel's `ping_group_range` does not admit it.
fn ping_not_granted<H: Host + ?Sized>(h: &mut H) -> Fallible<Option<u32>> {
    let passwd = crate::host::must(h, &["getent", "passwd", SPARK])?;
    let gid: u32 = passwd
        .split(':')
        .nth(3)
        .and_then(|g| g.trim().parse().ok())
        .ok_or_else(|| format!("{SPARK}'s group does not read in `{}`", passwd.trim()))?;
    let range = read_string(h, PING_GROUP_RANGE)?.unwrap_or_default();
    let mut bounds = range.split_whitespace().map(|n| n.parse::<u64>().ok());
    let admitted = match (bounds.next().flatten(), bounds.next().flatten()) {
        (Some(lo), Some(hi)) => (lo..=hi).contains(&u64::from(gid)),
        _ => false,
    };
    Ok((!admitted).then_some(gid))
}

/// One machine's rails as the plan wants them: the cabled ports addressed, and every RDMA
/// port (the cabled ones, and the twins and spares detect lists) answering ARP for itself only.
fn wanted<H: Host + ?Sized>(
    h: &mut H,
    plan: &Plan,
    node: u32,
    cabled: &[(String, u32)],
) -> Fallible<Rails> {
    let mut ports: Vec<String> =
        crate::detect::rdma_ports(&crate::detect::HostProbe(std::cell::RefCell::new(h)))
            .into_iter()
            .map(|(iface, _)| iface)
            .chain(cabled.iter().map(|(iface, _)| iface.clone()))
            .collect();
    ports.sort();
    ports.dedup();
    // Only ports the kernel has: a function with no netdev (a missing module) has no sysctl
    // to set, and `sysctl -p` would fail on it.
    let mut present = Vec::new();
    for p in ports {
        if read_string(h, &format!("/sys/class/net/{p}/ifindex"))?.is_some() {
            present.push(p);
        }
    }
    let ports = present;
    let mut sysctl = String::from(
        "# Written by enverge preparation (rail-network): a QSFP's two functions share one wire,\n\
         # so each answers ARP only for the address it holds.\n",
    );
    for p in &ports {
        sysctl.push_str(&format!(
            "net.ipv4.conf.{p}.arp_ignore = 1\nnet.ipv4.conf.{p}.arp_announce = 2\n"
        ));
    }
    Ok(Rails {
        netplan: render_rails(plan, node, cabled)?,
        sysctl,
        dual: render_dual_profile(cabled),
    })
}

/// lofispark-dual for a node whose cables land on `cabled` (port, rail): each port a physical
/// NIC under its own name, so the container holds the wire the host held. The rails'
/// addresses are set inside the container at create (`workers::RAILS_SCRIPT`).
pub fn render_dual_profile(cabled: &[(String, u32)]) -> serde_json::Value {
    let mut ports: Vec<&(String, u32)> = cabled.iter().collect();
    ports.sort_by_key(|(_, rail)| *rail);
    let devices: serde_json::Map<String, serde_json::Value> = ports
        .iter()
        .map(|(iface, _)| {
            (
                iface.clone(),
                serde_json::json!({"type": "nic", "nictype": "physical", "parent": iface, "name": iface}),
            )
        })
        .collect();
    let body = serde_json::json!({"config": {}, "devices": devices});
    let digest = {
        use sha2::Digest as _;
        hex::encode(&sha2::Sha256::digest(body.to_string().as_bytes())[..8])
    };
    serde_json::json!({
        "name": DUAL_PROFILE,
        "description": format!("enverge pair profile: this node's cables (content {digest})"),
        "config": body["config"],
        "devices": body["devices"],
    })
}

fn rails_on<H: Host + ?Sized>(h: &mut H, want: &Rails) -> Fallible<bool> {
    let dual = crate::lxd::get(h, &format!("/1.0/profiles/{DUAL_PROFILE}"))?;
    Ok(
        read_string(h, NETPLAN_RAILS)?.as_deref() == Some(want.netplan.as_str())
            && read_string(h, SYSCTL_RAILS)?.as_deref() == Some(want.sysctl.as_str())
            && dual.is_some_and(|p| p["description"] == want.dual["description"]),
    )
}

fn apply_rails<H: Host + ?Sized>(h: &mut H, want: &Rails) -> Fallible<()> {
    let path = format!("/1.0/profiles/{DUAL_PROFILE}");
    if crate::lxd::get(h, &path)?.is_some() {
        crate::lxd::json_call(h, "PUT", &path, &want.dual)?;
    } else {
        crate::lxd::json_call(h, "POST", "/1.0/profiles", &want.dual)?;
    }
    h.write(SYSCTL_RAILS, want.sysctl.as_bytes(), 0o644, "root:root")?;
    crate::host::must(h, &["sysctl", "-q", "-p", SYSCTL_RAILS])?;
    h.write(NETPLAN_RAILS, want.netplan.as_bytes(), 0o600, "root:root")?;
    // netplan generate is the validator; a file it refuses is taken back.
    if let Err(e) = crate::host::must(h, &["netplan", "generate"]) {
        h.remove(NETPLAN_RAILS)?;
        return Err(format!("netplan refused the rail configuration: {e}"));
    }
    crate::host::must(h, &["netplan", "apply"]).map(drop)
}
