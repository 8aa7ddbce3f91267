//! `lxd-network`: step 9 of the list in `docs/prepare.md`.
//!
//! **Check:** managed bridge `lxdbr0` with NAT.
//! **Apply:** `POST /1.0/networks` with an explicit `ipv4.address` chosen to collide with nothing
//! on the host (and never 10.8.0.0/24).
//! **Why here:** Before `profiles`: lofispark-base attaches eth0 to it.

use byo_core::prepare::Check;
use serde_json::json;

use super::StepDef;
use super::shared::{BRIDGE, TUNNEL_NET, verdict, NEEDS_LXD, lxd_answers, parse_net, overlaps};
use crate::host::{self, Fallible, Host};
use crate::lxd;
use crate::prepare::Plan;

/// Candidate bridge ranges; the first that collides with nothing on the host is used
/// (LXD's own auto-selection fails when nested, and a home LAN may hold any of them).
const BRIDGE_CANDIDATES: &[&str] = &[
    "10.117.0.1/24",
    "10.118.0.1/24",
    "10.119.0.1/24",
    "172.31.250.1/24",
];

pub(crate) struct LxdNetwork;

impl StepDef for LxdNetwork {
    const NAME: &str = "lxd-network";

    fn check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
        if !lxd_answers(h) {
            return Ok(Check::Needs(NEEDS_LXD.into()));
        }
        match lxd::get(h, &format!("/1.0/networks/{BRIDGE}"))? {
            None => Ok(Check::Needs(format!("create the bridge {BRIDGE}"))),
            Some(n) if n["managed"] != json!(true) || n["type"] != json!("bridge") => Err(format!(
                "{BRIDGE} exists but is not a bridge LXD manages; remove it and run again"
            )),
            Some(n) => Ok(verdict(if n["config"]["ipv4.nat"] == json!("true") {
                vec![]
            } else {
                vec![format!("turn on NAT for {BRIDGE}")]
            })),
        }
    }

    fn apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
        let path = format!("/1.0/networks/{BRIDGE}");
        if lxd::get(h, &path)?.is_some() {
            return lxd::json_call(h, "PATCH", &path, &json!({"config": {"ipv4.nat": "true"}}))
                .map(drop);
        }
        let used: Vec<(u32, u32)> = host::ipv4_networks(h)?
            .iter()
            .filter_map(|(_, n)| parse_net(n))
            .chain([TUNNEL_NET])
            .collect();
        let address = BRIDGE_CANDIDATES
            .iter()
            .find(|c| parse_net(c).is_some_and(|c| !used.iter().any(|u| overlaps(c, *u))))
            .ok_or("every candidate range for lxdbr0 is already in use on this host")?;
        lxd::json_call(
            h,
            "POST",
            "/1.0/networks",
            &json!({"name": BRIDGE, "type": "bridge",
                    "config": {"ipv4.address": address, "ipv4.nat": "true", "ipv6.address": "none"}}),
        )
        .map(drop)
    }
}
