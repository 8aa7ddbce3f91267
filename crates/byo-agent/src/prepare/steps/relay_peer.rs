//! `relay-peer`: step 13 of the list in `docs/prepare.md`.
//!
//! **Check:** **first** no interface holds an address in 10.8.0.0/24; then the relay's endpoint
//! is known (a host that redeemed before its relay had an address fails here until
//! preparation, asking the backend at every attempt, learns it); `/etc/wireguard/wg0.conf` as
//! rendered; `wg-quick@wg0` enabled and up with the relay as peer.
//! **Apply:** wireguard-tools (+ wireguard-go where the kernel has no WireGuard), config 0600,
//! enable, (re)start.
//! **Why here:** A colliding LAN would take the host off the network the moment wg0 came up.

use byo_core::prepare::Check;

use super::shared::{TUNNEL_NET, WG_UNIT, file_is, overlaps, parse_net, verdict};
use super::{Scope, StepDef};
use crate::host::{self, Fallible, Host, apt_install, must, unit_active, unit_enabled};
use crate::prepare::Plan;

pub(crate) const WG_CONF: &str = "/etc/wireguard/wg0.conf";

/// A host that redeemed before its relay had an address: wg0 would have nowhere to go.
const NO_ENDPOINT: &str = "the relay has no public address yet, so the tunnel would have nowhere to go; preparation asks the backend again at its next attempt and brings wg0 up once the relay has one";

pub(crate) struct RelayPeer;

impl StepDef for RelayPeer {
    const NAME: &str = "relay-peer";
    const SCOPE: Scope = Scope::Node0;

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        // The collision comes first: bringing wg0 up into a colliding range makes the host
        // unreachable the instant it succeeds.
        for (iface, net) in host::ipv4_networks(h)? {
            if iface == "wg0" {
                continue;
            }
            if parse_net(&net).is_some_and(|n| overlaps(n, TUNNEL_NET)) {
                return Err(format!(
                    "10.8.0.0/24, the relay tunnel's range, is already in use on {iface} ({net}) — a common home-router default. Bringing wg0 up into it would take this host off the network the moment it succeeded; renumber that network and run preparation again"
                ));
            }
        }
        let wg = plan
            .wireguard
            .as_ref()
            .ok_or("no WireGuard configuration was kept from enrolment")?;
        if wg.endpoint.is_none() {
            return Err(NO_ENDPOINT.into());
        }
        let mut needs = Vec::new();
        if !file_is(h, WG_CONF, &render_wireguard(wg))? {
            needs.push(format!("write {WG_CONF}"));
        }
        if !unit_enabled(h, WG_UNIT)? || !unit_active(h, WG_UNIT)? {
            needs.push("bring wg0 up (and at every boot)".to_owned());
        } else {
            let peers = h.run(&["wg", "show", "wg0", "peers"], None)?;
            if !peers.stdout.lines().any(|l| l.trim() == wg.peer_public_key) {
                needs.push("wg0 is up without the relay as its peer".to_owned());
            }
        }
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        let wg = plan
            .wireguard
            .as_ref()
            .ok_or("no WireGuard configuration")?;
        if wg.endpoint.is_none() {
            return Err(NO_ENDPOINT.into());
        }
        if !h.run(&["wg", "--version"], None)?.ok() {
            apt_install(h, &["wireguard-tools"])?;
        }
        // No kernel module (a container, an old kernel): wg-quick falls back to wireguard-go.
        let probe = h.run(
            &["ip", "link", "add", "enverge-wgprobe", "type", "wireguard"],
            None,
        )?;
        if probe.ok() {
            let _ = h.run(&["ip", "link", "delete", "enverge-wgprobe"], None)?;
        } else if !h.run(&["wireguard-go", "--version"], None)?.ok() {
            apt_install(h, &["wireguard-go"])?;
        }
        let changed = !file_is(h, WG_CONF, &render_wireguard(wg))?;
        h.write(WG_CONF, render_wireguard(wg).as_bytes(), 0o600, "root:root")?;
        must(h, &["systemctl", "enable", WG_UNIT])?;
        let verb = if changed { "restart" } else { "start" };
        must(h, &["systemctl", verb, WG_UNIT]).map(drop)
    }
}

pub fn render_wireguard(wg: &byo_wire::enroll::WireGuardConfig) -> String {
    let mut s = format!(
        "# Written by enverge preparation (relay-peer).\n[Interface]\nPrivateKey = {}\nAddress = {}\n\n[Peer]\nPublicKey = {}\nAllowedIPs = {}\nPersistentKeepalive = 25\n",
        wg.private_key, wg.address, wg.peer_public_key, wg.allowed_ips
    );
    if let Some(e) = &wg.endpoint {
        s.push_str(&format!("Endpoint = {e}\n"));
    }
    s
}
