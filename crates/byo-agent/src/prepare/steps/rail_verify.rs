//! `rail-verify` (132): step 17 of the list in `docs/prepare.md`.
//!
//! **Check:** `ping -I` across every cable from both of its ends.
//! **Apply:** nothing (a silent cable is named).
//! **Why here:** Proves, with the rails configured, the claim redeem accepted.

use byo_core::prepare::Check;

use super::shared::single;
use super::{Scope, StepDef};
use crate::host::{Fallible, Host};
use crate::prepare::peers::{rail_address, rail_plan, satellites};
use crate::prepare::Plan;

pub(crate) struct RailVerify;

impl StepDef for RailVerify {
    const NAME: &str = "rail-verify";
    const SCOPE: Scope = Scope::Node0;

    fn skip<H: Host>(h: &mut H, plan: &Plan) -> Option<String> {
        single(h, plan)
    }

    /// Traffic across every cable, from both of its ends.
    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
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
}
