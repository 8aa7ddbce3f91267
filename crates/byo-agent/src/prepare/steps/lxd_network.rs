//! `lxd-network`: step 9 of the list in `docs/prepare.md`.
//!
//! **Check:** managed bridge `lxdbr0` with NAT, no IPv6, and its dnsmasq forwarding only to
//! public resolvers ([`BRIDGE_CONFIG`]).
//! **Apply:** `POST /1.0/networks` with an explicit `ipv4.address` chosen to collide with nothing
//! on the host (and never 10.8.0.0/24); a bridge that was already there is `PATCH`ed to the
//! same settings.
//! **Why here:** Before `profiles`: lofispark-base attaches eth0 to it.
//!
//! **Why no IPv6 and public resolvers** (issue #36): tenants have IPv4 only, so the tenant
//! firewall's IPv4 ranges are the whole of the owner's side; a bridge an owner made before
//! preparation (or LXD's `lxd init` default) hands out IPv6 that routes past them. By
//! default LXD's dnsmasq forwards a tenant's queries to the host's own resolver, which on a
//! home LAN is the owner's router: it answers the owner's LAN names (`nas.home`, the
//! printers) and tells a tenant what lives there. `no-resolv` and the public resolvers close
//! that; the bridge's own names (`<instance>.lxd`) are still answered locally.

use byo_core::prepare::Check;
use serde_json::json;

use super::StepDef;
use super::shared::{BRIDGE, NEEDS_LXD, TUNNEL_NET, lxd_answers, overlaps, parse_net, verdict};
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

/// The resolvers the bridge's dnsmasq forwards tenants' queries to: public, and two
/// operators, so one failing leaves names working.
pub(crate) const PUBLIC_RESOLVERS: &[&str] = &["1.1.1.1", "9.9.9.9"];

/// `raw.dnsmasq` for the bridge: the host's resolv.conf is never read.
pub(crate) fn raw_dnsmasq() -> String {
    let mut out = String::from("no-resolv\n");
    for r in PUBLIC_RESOLVERS {
        out.push_str(&format!("server={r}\n"));
    }
    out
}

/// What the bridge's configuration must say, besides its address: (key, value).
fn bridge_config() -> [(&'static str, String); 3] {
    [
        ("ipv4.nat", "true".to_owned()),
        ("ipv6.address", "none".to_owned()),
        ("raw.dnsmasq", raw_dnsmasq()),
    ]
}

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
            Some(n) => Ok(verdict(
                bridge_config()
                    .into_iter()
                    .filter(|(k, v)| n["config"][k].as_str() != Some(v.as_str()))
                    .map(|(k, _)| match k {
                        "ipv4.nat" => format!("turn on NAT for {BRIDGE}"),
                        "ipv6.address" => format!(
                            "turn off IPv6 on {BRIDGE} (tenants have IPv4 only; its IPv6 routes past the tenant firewall)"
                        ),
                        _ => format!(
                            "point {BRIDGE}'s DNS at public resolvers only (it forwards tenants' queries to the host's resolver, the owner's)"
                        ),
                    })
                    .collect(),
            )),
        }
    }

    fn apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
        let path = format!("/1.0/networks/{BRIDGE}");
        let settings: serde_json::Map<String, serde_json::Value> = bridge_config()
            .into_iter()
            .map(|(k, v)| (k.to_owned(), json!(v)))
            .collect();
        if lxd::get(h, &path)?.is_some() {
            return lxd::json_call(h, "PATCH", &path, &json!({ "config": settings })).map(drop);
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
        let mut config = settings;
        config.insert("ipv4.address".into(), json!(address));
        lxd::json_call(
            h,
            "POST",
            "/1.0/networks",
            &json!({"name": BRIDGE, "type": "bridge", "config": config}),
        )
        .map(drop)
    }
}
