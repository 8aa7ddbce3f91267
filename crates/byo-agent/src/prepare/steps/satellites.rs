//! `satellites` (130–131): step 15 of the list in `docs/prepare.md`.
//!
//! **Check:** a dry run of node{k}'s subset over SSH changes nothing.
//! **Apply:** the subset (operator-access … base-image, owner-lockout, self-check — no relay) run
//! by the same engine on node{k}, progress reported with index k.
//! **Why here:** Every landmine ordering holds there too; a satellite's failure stops node0 before
//! owner-lockout.

use byo_core::prepare::{Check, Mode, Progress, Step};

use super::shared::{single, verdict};
use super::{Scope, StepDef};
use crate::host::{Fallible, Host};
use crate::prepare::Plan;
use crate::prepare::peers::{lent_user, satellite_plan, satellite_steps, satellites};

pub(crate) struct Satellites;

impl StepDef for Satellites {
    const NAME: &str = "satellites";
    const SCOPE: Scope = Scope::Node0;

    fn skip<H: Host>(h: &mut H, plan: &Plan) -> Option<String> {
        single(h, plan)
    }

    fn check<H: Host>(_: &mut H, plan: &Plan) -> Fallible<Check> {
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
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
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
}

fn run_satellite(
    node: &mut Box<dyn Host + '_>,
    sub: &Plan,
    mode: Mode,
    report: &dyn Fn(Progress),
) -> byo_core::prepare::Outcome {
    let all = super::all::<Box<dyn Host + '_>>(sub);
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
