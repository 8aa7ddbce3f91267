//! `peer-access` (129): step 14 of the list in `docs/prepare.md`.
//!
//! **Check:** each satellite admits `spark` with node0's peer key and the operator keys
//! (operator-access's own check, run there); `/etc/enverge/peer-login` is gone.
//! **Apply:** through the lent login (ssh asks the agent itself for the password via `SSH_ASKPASS`;
//! `sudo -S` reads it first on stdin): operator-access's apply on the satellite, the lent user
//! recorded there as its owner, then peer-login deleted on node0.
//! **Why here:** Decides nothing; skipped on a single Spark.

use byo_core::prepare::Check;

use super::operator_access::{OperatorAccess, problems};
use super::shared::{single, verdict};
use super::{Scope, StepDef};
use crate::host::{Fallible, Host};
use crate::prepare::peers::{PEER_LOGIN, lent_user, satellite_plan, satellites};
use crate::prepare::{OWNER_FILE, Plan};

pub(crate) struct PeerAccess;

impl StepDef for PeerAccess {
    const NAME: &str = "peer-access";
    const SCOPE: Scope = Scope::Node0;

    fn skip<H: Host>(h: &mut H, plan: &Plan) -> Option<String> {
        single(h, plan)
    }

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
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
                    let problems = problems(node, &sub)?;
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
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
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
            OperatorAccess::apply(&mut node, &sub)?;
            // Who owner-lockout removes on that machine, once node0 no longer keeps the login.
            if let Some(user) = &owner {
                node.write(
                    OWNER_FILE,
                    format!("{user}\n").as_bytes(),
                    0o644,
                    "root:root",
                )?;
            }
        }
        // Decides nothing else: the password never leaves node0, and now not even node0 keeps it.
        h.remove(PEER_LOGIN)
    }
}
