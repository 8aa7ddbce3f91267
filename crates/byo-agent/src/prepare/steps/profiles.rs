//! `profiles`: step 11 of the list in `docs/prepare.md`.
//!
//! **Check:** `lofispark-base` carries the digest of what this node renders now.
//! **Apply:** create or `PUT`; refuses with the cause when `lxdbr0` or the pool is missing.
//! **Why here:** No `boot.autostart`: LXD restores each instance's last state (L2).

use byo_core::prepare::Check;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::StepDef;
use super::shared::{BRIDGE, NEEDS_LXD, POOL, PROFILE_NAME, lxd_answers};
use crate::host::{Fallible, Host};
use crate::lxd;
use crate::prepare::Plan;

pub(crate) struct Profiles;

impl StepDef for Profiles {
    const NAME: &str = "profiles";

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        if !lxd_answers(h) {
            return Ok(Check::Needs(NEEDS_LXD.into()));
        }
        let want = render_base_profile(plan);
        match lxd::get(h, &format!("/1.0/profiles/{PROFILE_NAME}"))? {
            None => Ok(Check::Needs(format!("create the profile {PROFILE_NAME}"))),
            Some(p) if p["description"] == want["description"] => Ok(Check::Satisfied),
            Some(_) => Ok(Check::Needs(format!(
                "rewrite {PROFILE_NAME}: it is not what this node renders"
            ))),
        }
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        // LXD refuses a profile whose NIC names a network that does not exist, in words that
        // do not say which step was skipped; say it.
        if lxd::get(h, &format!("/1.0/networks/{BRIDGE}"))?.is_none() {
            return Err(format!(
                "the network {BRIDGE} does not exist, and {PROFILE_NAME} attaches eth0 to it: lxd-network must run before profiles (lxd init, which would have made it, is deliberately not run)"
            ));
        }
        if lxd::get(h, &format!("/1.0/storage-pools/{POOL}"))?.is_none() {
            return Err(format!(
                "the storage pool {POOL} does not exist, and {PROFILE_NAME} puts the root disk on it: storage-pool must run before profiles"
            ));
        }
        let want = render_base_profile(plan);
        let path = format!("/1.0/profiles/{PROFILE_NAME}");
        if lxd::get(h, &path)?.is_some() {
            lxd::json_call(h, "PUT", &path, &want).map(drop)
        } else {
            lxd::json_call(h, "POST", "/1.0/profiles", &want).map(drop)
        }
    }
}

/// lofispark-base as this node renders it now. Its description carries a digest of the
/// content, so a profile left by another setup is recognised and rewritten. No
/// boot.autostart: LXD restores each instance's last state, and serving starts the head
/// only when that state was running (L2).
pub fn render_base_profile(plan: &Plan) -> Value {
    let mut devices = json!({
        "root": {"type": "disk", "path": "/", "pool": POOL},
        "eth0": {"type": "nic", "name": "eth0", "network": BRIDGE},
    });
    let mut config = json!({});
    if plan.profile.gpu_count.unwrap_or(0) > 0 {
        devices["gpu"] = json!({"type": "gpu", "gputype": "physical"});
        config["nvidia.runtime"] = json!("true");
        config["nvidia.driver.capabilities"] = json!("all");
    }
    let body = json!({"config": config, "devices": devices});
    let digest = hex::encode(&Sha256::digest(body.to_string().as_bytes())[..8]);
    json!({
        "name": PROFILE_NAME,
        "description": format!("enverge base profile (content {digest})"),
        "config": body["config"],
        "devices": body["devices"],
    })
}
