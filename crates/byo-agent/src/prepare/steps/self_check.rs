//! `self-check`: step 19 of the list in `docs/prepare.md`.
//!
//! **Check:** LXD, pool, bridge, profile, alias, earlyoom, no swap, wg0, spark's sudo, and
//! `nvidia-smi` showing the profile's GPU; on a pair or a ring, the same on every satellite.
//! **Apply:** nothing to apply.
//! **Why here:** The host as a whole.

use byo_core::prepare::Check;

use super::StepDef;
use super::base_image::BASE_ALIAS;
use super::shared::{BRIDGE, POOL, PROFILE_NAME, SPARK, WG_UNIT, lxd_answers, swaps};
use crate::host::{Fallible, Host, unit_active};
use crate::lxd;
use crate::prepare::Plan;
use crate::prepare::peers::{satellite_plan, satellites};

pub(crate) struct SelfCheck;

impl StepDef for SelfCheck {
    const NAME: &str = "self-check";

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        let mut wrong = Vec::new();
        if !lxd_answers(h) {
            wrong.push("LXD does not answer".to_owned());
        } else {
            for (what, path) in [
                ("storage pool", format!("/1.0/storage-pools/{POOL}")),
                ("bridge", format!("/1.0/networks/{BRIDGE}")),
                ("profile", format!("/1.0/profiles/{PROFILE_NAME}")),
                ("image alias", format!("/1.0/images/aliases/{}", BASE_ALIAS)),
            ] {
                if lxd::get(h, &path)?.is_none() {
                    wrong.push(format!("the {what} at {path} is missing"));
                }
            }
        }
        if !unit_active(h, "earlyoom.service")? {
            wrong.push("earlyoom is not running".to_owned());
        }
        if !swaps(h)?.is_empty() {
            wrong.push("swap is on".to_owned());
        }
        // Satellites have no relay of their own.
        if plan.wireguard.is_some() && !unit_active(h, WG_UNIT)? {
            wrong.push("wg0 is down".to_owned());
        }
        if !h
            .run(&["runuser", "-u", SPARK, "--", "sudo", "-n", "true"], None)?
            .ok()
        {
            wrong.push("spark cannot sudo".to_owned());
        }
        if let Some(model) = &plan.profile.gpu_model {
            let out = h.run(
                &["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                None,
            )?;
            if !out.ok() || !out.stdout.contains(model.as_str()) {
                wrong.push(format!("nvidia-smi does not show the {model}"));
            }
        }
        // On a pair or a ring, node0's self-check asserts its satellites (K1 note 7): each
        // one's own self-check, run there as spark. A satellite's plan pins no peers.
        if !plan.peers.is_empty() {
            let sats = satellites(plan)?;
            for peer in &plan.peers {
                let sub = satellite_plan(plan, peer, None);
                if let Err(e) = sats.spark(peer).and_then(|mut n| Self::check(&mut n, &sub)) {
                    wrong.push(format!("node{}: {e}", peer.index));
                }
            }
        }
        if wrong.is_empty() {
            Ok(Check::Satisfied)
        } else {
            Err(wrong.join("; "))
        }
    }
}
