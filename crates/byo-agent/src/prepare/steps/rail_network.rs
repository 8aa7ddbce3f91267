//! `rail-network` (130): step 16 of the list in `docs/prepare.md`.
//!
//! **Check:** `/etc/netplan/60-enverge-rails.yaml` on every machine holds the plan's address per
//! cable (subnet's tenth host + node index), the rail MTU, eui64 link-local.
//! **Apply:** write, `netplan generate` (the validator; a refused file is taken back), `netplan
//! apply`.
//! **Why here:** Addresses on the ports the cables were recorded on at 125.

use byo_core::prepare::Check;

use super::shared::{single, verdict};
use super::{Scope, StepDef};
use crate::host::{Fallible, Host, read_string};
use crate::prepare::peers::{Peer, satellites, render_rails};
use crate::prepare::Plan;

const NETPLAN_RAILS: &str = "/etc/netplan/60-enverge-rails.yaml";

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
        if !rails_on(h, &render_rails(plan, 0, &node0_ports(plan))?)? {
            needs.push("address node0's rails".to_owned());
        }
        for peer in &plan.peers {
            let want = render_rails(plan, peer.index, &peer_ports(peer))?;
            if !rails_on(&mut sats.spark(peer)?, &want)? {
                needs.push(format!("address node{}'s rails", peer.index));
            }
        }
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
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
