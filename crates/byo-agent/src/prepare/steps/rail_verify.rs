//! `rail-verify` (132): step 17 of the list in `docs/prepare.md`.
//!
//! **Check:** `ping -I` across every cable from both of its ends, and a packet of the rail's MTU
//! with don't-fragment set.
//! **Apply:** nothing (a silent cable is named).
//! **Why here:** Proves, with the rails configured, the claim redeem accepted.

use byo_core::prepare::Check;

use super::shared::single;
use super::{Scope, StepDef};
use crate::host::{Fallible, Host};
use crate::prepare::Plan;
use crate::prepare::peers::{
    node_rails, node0_ports, peer_ports, rail_address, rail_plan, satellites,
};

pub(crate) struct RailVerify;

impl StepDef for RailVerify {
    const NAME: &str = "rail-verify";
    const SCOPE: Scope = Scope::Node0;

    fn skip<H: Host>(h: &mut H, plan: &Plan) -> Option<String> {
        single(h, plan)
    }

    /// Traffic across every cable, from both of its ends: reachable, and a packet of the
    /// rail's whole MTU passes unfragmented (a port left at 1500 on one end is named).
    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        let sats = satellites(plan)?;
        let mut wrong = Vec::new();
        for peer in &plan.peers {
            let mut node = sats.spark(peer)?;
            for link in &peer.links {
                let (subnet, mtu) = rail_plan(plan, link.index)?;
                let (theirs, _) = rail_address(&subnet, peer.index).ok_or("rail subnet")?;
                let (ours, _) = rail_address(&subnet, 0).ok_or("rail subnet")?;
                if let Some(local) = &link.local {
                    let there = format!("node{} {theirs}", peer.index);
                    wrong.extend(across(h, link.index, "node0", local, &there, &theirs, mtu)?);
                    let from = format!("node{}", peer.index);
                    let back = format!("node0 {ours}");
                    wrong.extend(across(
                        &mut node,
                        link.index,
                        &from,
                        &link.remote,
                        &back,
                        &ours,
                        mtu,
                    )?);
                } else if link.peer_node() > peer.index {
                    // A ring's cable between two satellites (the diagonal's two among them),
                    // once, from both ends.
                    let other = link.peer_node();
                    let Some(far) = plan.peers.iter().find(|p| p.index == other) else {
                        return Err(format!("node{other} is not pinned in peer.json"));
                    };
                    let far_port = far
                        .links
                        .iter()
                        .find(|l| l.index == link.index)
                        .map(|l| l.remote.clone())
                        .ok_or_else(|| {
                            format!("node{other} records no end of rail {}", link.index)
                        })?;
                    let (far_addr, _) = rail_address(&subnet, other).ok_or("rail subnet")?;
                    let (from, to) = (
                        format!("node{}", peer.index),
                        format!("node{other} {far_addr}"),
                    );
                    wrong.extend(across(
                        &mut node,
                        link.index,
                        &from,
                        &link.remote,
                        &to,
                        &far_addr,
                        mtu,
                    )?);
                    let mut far_node = sats.spark(far)?;
                    let (from, to) = (
                        format!("node{other}"),
                        format!("node{} {theirs}", peer.index),
                    );
                    wrong.extend(across(
                        &mut far_node,
                        link.index,
                        &from,
                        &far_port,
                        &to,
                        &theirs,
                        mtu,
                    )?);
                }
            }
        }
        if !wrong.is_empty() {
            return Err(wrong.join("; "));
        }
        // 132: every machine's rails, proved; the backend stamps verified_at.
        sats.rails(node_rails(h, plan, 0, &node0_ports(plan), true)?);
        for peer in &plan.peers {
            let mut node = sats.spark(peer)?;
            sats.rails(node_rails(
                &mut node,
                plan,
                peer.index,
                &peer_ports(peer),
                true,
            )?);
        }
        Ok(Check::Satisfied)
    }
}

/// One direction of one cable: what is wrong with it, if anything.
fn across<H: Host + ?Sized>(
    h: &mut H,
    rail: u32,
    from: &str,
    iface: &str,
    to: &str,
    addr: &str,
    mtu: u32,
) -> Fallible<Option<String>> {
    let ping = h.run(
        &[
            "ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "2", "-I", iface, addr,
        ],
        None,
    )?;
    if !ping.ok() {
        return Ok(Some(format!(
            "no traffic across rail {rail}: {from} {iface} → {to}"
        )));
    }
    // The ICMP and IPv4 headers are 28 bytes of the MTU.
    let size = mtu.saturating_sub(28).to_string();
    let whole = h.run(
        &[
            "ping", "-n", "-q", "-c", "1", "-W", "2", "-M", "do", "-s", &size, "-I", iface, addr,
        ],
        None,
    )?;
    Ok((!whole.ok()).then(|| {
        format!(
            "rail {rail}: {from} {iface} → {to} does not carry the rail's MTU {mtu} unfragmented"
        )
    }))
}
