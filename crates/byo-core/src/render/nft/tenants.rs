//! The host's side of "tenants see the internet and nothing of the owner's" (issue #11): one
//! nftables table of our own on every host, loaded by preparation's `firewall` step and at
//! every boot by [`crate::render::units::TENANT_FIREWALL`].
//!
//! ```text
//! table inet enverge_tenants
//!   set owner_nets4       RFC 1918, link-local 169.254/16, CGNAT 100.64/10: the owner's side
//!   set host_nets4        the host's own networks (its LAN, wg0, the rails), found at apply time
//!   set owner_wan4        the owner's public address (the backend saw the beat come from)
//!   set owner_nets6       ULA, link-local, NAT64 and the prefixes that embed an IPv4 address
//!   set host_nets6        the host's own IPv6 networks, found at apply time
//!   chain input           hook input:   what arrives on the bridge jumps to tenant_to_host
//!   chain tenant_to_host  replies, DHCP and DNS to the bridge's dnsmasq; everything else dropped
//!   chain forward         hook forward: what the bridge routes out jumps to tenant_out
//!   chain tenant_out      replies; the tunnel and every set above dropped; any other IPv6
//!                         dropped (tenants have IPv4 only); mail to port 25 dropped; new
//!                         connections past a rate and live ones past a count dropped; the
//!                         rest (the internet) goes on to LXD's NAT
//! ```
//!
//! **The owner's public address** (issue #36): a tenant's packet to it leaves through the
//! owner's router, which answers on its own WAN address (its admin page, its port forwards
//! into the LAN) as if the packet came from inside. No range covers it, so the agent drops
//! the address the backend last saw the host's heartbeat come from ([`WAN_FILE`]), refreshed
//! when it changes.
//!
//! **Egress from the owner's home address** is what blocklists judge: mail sent straight to
//! port 25 and scans are what get a home address listed, so a tenant sends no mail to port 25
//! (submission on 587 and 465 is untouched, as on every cloud), opens at most
//! [`NEW_PER_SECOND`] connections a second (a burst of [`NEW_BURST`]) and holds at most
//! [`LIVE_CONNECTIONS`]. A host carries one live instance, so a limit on the chain is a limit
//! per tenant; no per-address meter is needed, whose elements would show in the listing.
//!
//! A separate table, because `ufw reload` and LXD rewrite only their own; a drop here is final
//! whatever another table's chain accepts, so the priority (before `filter`) only orders the
//! counters. Tenants on one bridge share a layer-2 segment that no `inet` hook sees; a host
//! carries one live instance (`vms_one_live_per_host`), so there is no other tenant to reach.
//!
//! The file starts by creating and deleting the table, so loading it replaces the whole table
//! in one transaction on a host that has it or not. Pure: the agent supplies what it read.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};

pub const TABLE: &str = "enverge_tenants";
/// Where the agent keeps the rendered ruleset; the unit loads it at boot.
pub const PATH: &str = "/etc/enverge/tenant-firewall.nft";
/// The tunnel to the relay: ssh_mapd (10.8.0.1), the agent's API (10.8.0.2).
pub const TUNNEL: &str = "10.8.0.0/24";
/// The owner's side, whatever the owner's LAN looks like: RFC 1918, link-local (cloud
/// metadata's 169.254.169.254 among it), CGNAT (Tailscale and carriers).
pub const OWNER_NETS4: &[&str] = &[
    "10.0.0.0/8",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
];
/// The owner's side in IPv6: ULA and link-local, and every prefix that carries an IPv4
/// address inside it and could be translated back into the owner's LAN: NAT64's well-known
/// and local-use prefixes (a home router doing DNS64/NAT64 maps `64:ff9b::192.168.1.1` to its
/// LAN), IPv4-mapped addresses, and 6to4. Tenants have no IPv6 at all (the bridge has none,
/// and the table drops any), so these are named for the counters and for a bridge an owner
/// gives IPv6 later.
pub const OWNER_NETS6: &[&str] = &[
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
];
/// Where serving keeps the address the backend last saw this host's heartbeat come from
/// (`Byo-Seen-From`): one address on one line. Serving's own state directory, so it can write
/// it unprivileged; the firewall reads it as nothing but an address, and an address it cannot
/// parse is no address.
pub const WAN_FILE: &str = "/var/lib/enverge-agent/wan-address";
/// New connections a tenant may open a second, and the burst above it.
pub const NEW_PER_SECOND: u32 = 50;
pub const NEW_BURST: u32 = 250;
/// Connections a tenant may hold open through the host at once.
pub const LIVE_CONNECTIONS: u32 = 1024;

/// What the agent read from the host to render the table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenants {
    /// The instance bridge (lxdbr0).
    pub bridge: String,
    /// The bridge's own address: LXD's dnsmasq answers DHCP and DNS there.
    pub bridge_address: Ipv4Addr,
    /// The host's own IPv4 networks and its rails (address/prefix; host bits are cleared).
    pub host_nets4: Vec<(Ipv4Addr, u8)>,
    /// The host's own IPv6 networks.
    pub host_nets6: Vec<(Ipv6Addr, u8)>,
    /// The owner's public IPv4 address(es), as the backend saw them ([`WAN_FILE`]).
    pub wan4: Vec<Ipv4Addr>,
}

fn net4((a, len): (Ipv4Addr, u8)) -> String {
    let len = len.min(32);
    let mask = if len == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(len))
    };
    format!("{}/{len}", Ipv4Addr::from(u32::from(a) & mask))
}

fn net6((a, len): (Ipv6Addr, u8)) -> String {
    let len = len.min(128);
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(len))
    };
    format!("{}/{len}", Ipv6Addr::from(u128::from(a) & mask))
}

fn set(out: &mut String, name: &str, kind: &str, merge: bool, elements: &[String]) {
    let _ = writeln!(out, "\tset {name} {{\n\t\ttype {kind}\n\t\tflags interval");
    if merge {
        out.push_str("\t\tauto-merge\n");
    }
    if !elements.is_empty() {
        let _ = writeln!(out, "\t\telements = {{ {} }}", elements.join(", "));
    }
    out.push_str("\t}\n\n");
}

/// The whole file `nft -f` loads.
pub fn ruleset(t: &Tenants) -> String {
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v.dedup();
        v
    };
    let host4 = sorted(t.host_nets4.iter().copied().map(net4).collect());
    let host6 = sorted(t.host_nets6.iter().copied().map(net6).collect());
    let wan4 = sorted(t.wan4.iter().map(Ipv4Addr::to_string).collect());
    let owner4: Vec<String> = OWNER_NETS4.iter().map(|s| s.to_string()).collect();
    let owner6: Vec<String> = OWNER_NETS6.iter().map(|s| s.to_string()).collect();
    let (bridge, addr) = (&t.bridge, t.bridge_address);

    let mut out = format!(
        "# Rendered by byo-agent's firewall step (docs/prepare.md); loaded at boot by\n\
         # enverge-tenant-firewall.service. Tenants on {bridge} see the internet and nothing of the owner's.\n\
         table inet {TABLE} {{}}\n\
         delete table inet {TABLE}\n\
         table inet {TABLE} {{\n"
    );
    set(&mut out, "owner_nets4", "ipv4_addr", false, &owner4);
    set(&mut out, "host_nets4", "ipv4_addr", true, &host4);
    set(&mut out, "owner_wan4", "ipv4_addr", true, &wan4);
    set(&mut out, "owner_nets6", "ipv6_addr", false, &owner6);
    set(&mut out, "host_nets6", "ipv6_addr", true, &host6);
    let _ = write!(
        out,
        r#"	chain input {{
		type filter hook input priority filter - 10; policy accept;
		iifname "{bridge}" jump tenant_to_host
	}}

	chain tenant_to_host {{
		ct direction reply accept comment "replies to what the host opened"
		ip daddr {{ {addr}, 255.255.255.255 }} udp sport 68 udp dport 67 accept comment "DHCP from the bridge's dnsmasq"
		ip daddr {addr} udp dport 53 accept comment "DNS from the bridge's dnsmasq"
		ip daddr {addr} tcp dport 53 accept comment "DNS over TCP from the bridge's dnsmasq"
		counter drop comment "nothing else of the host, on any of its addresses"
	}}

	chain forward {{
		type filter hook forward priority filter - 10; policy accept;
		iifname "{bridge}" jump tenant_out
	}}

	chain tenant_out {{
		ct direction reply accept comment "replies to connections opened towards the instance"
		ip daddr {TUNNEL} counter drop comment "the tunnel: ssh_mapd, the agent"
		ip daddr @owner_nets4 counter drop comment "the owner's networks"
		ip daddr @host_nets4 counter drop comment "the host's own networks and rails"
		ip daddr @owner_wan4 counter drop comment "the owner's public address: the router's own services and port forwards"
		ip6 daddr @owner_nets6 counter drop comment "the owner's IPv6 networks"
		ip6 daddr @host_nets6 counter drop comment "the host's own IPv6 networks"
		meta nfproto ipv6 counter drop comment "tenants have IPv4 only"
		tcp dport 25 counter drop comment "mail to port 25"
		ct state new limit rate over {NEW_PER_SECOND}/second burst {NEW_BURST} packets counter drop comment "new connections past the rate"
		ct state new ct count over {LIVE_CONNECTIONS} counter drop comment "connections past the count"
	}}
}}
"#
    );
    out
}

/// `nft list table` output reduced to what the rules are: words, without the counters'
/// running totals. The kernel's table is the rendered file when the two reductions agree.
pub fn listing_words(listing: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut it = listing.split_whitespace().peekable();
    while let Some(w) = it.next() {
        if w == "packets" || w == "bytes" {
            // "counter packets N bytes M": the totals are not the rules.
            if it.peek().is_some_and(|n| n.parse::<u64>().is_ok()) {
                it.next();
                continue;
            }
        }
        words.push(w.to_owned());
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Tenants {
        Tenants {
            bridge: "lxdbr0".into(),
            bridge_address: Ipv4Addr::new(10, 117, 0, 1),
            host_nets4: vec![
                (Ipv4Addr::new(192, 168, 1, 23), 24),
                (Ipv4Addr::new(10, 8, 0, 2), 24),
                (Ipv4Addr::new(192, 168, 1, 99), 24),
            ],
            host_nets6: vec![("2001:db8:1::23".parse().unwrap(), 64)],
            wan4: vec![Ipv4Addr::new(198, 51, 100, 7)],
        }
    }

    #[test]
    fn every_forbidden_range_is_in_the_table() {
        let text = ruleset(&sample());
        // Named here, not read from the constants, so a range dropped there fails here.
        for range in [
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "169.254.0.0/16",
            "100.64.0.0/10",
            "10.8.0.0/24",
            "fc00::/7",
            "fe80::/10",
            "64:ff9b::/96",
            "64:ff9b:1::/48",
            "::ffff:0:0/96",
            "2002::/16",
        ] {
            assert!(text.contains(range), "{range} is missing:\n{text}");
        }
        // The owner's public address, and what leaves the home address bounded.
        assert!(text.contains("elements = { 198.51.100.7 }"), "{text}");
        assert!(text.contains("ip daddr @owner_wan4 counter drop"), "{text}");
        assert!(text.contains("meta nfproto ipv6 counter drop"), "{text}");
        assert!(text.contains("tcp dport 25 counter drop"), "{text}");
        assert!(
            text.contains("ct state new limit rate over 50/second burst 250 packets counter drop"),
            "{text}"
        );
        assert!(
            text.contains("ct state new ct count over 1024 counter drop"),
            "{text}"
        );
        // The host's own networks, host bits cleared and once each.
        assert!(text.contains("elements = { 10.8.0.0/24, 192.168.1.0/24 }"));
        assert!(text.contains("elements = { 2001:db8:1::/64 }"));
        assert!(text.contains("ip daddr 10.117.0.1 udp dport 53 accept"));
        assert!(text.contains("iifname \"lxdbr0\" jump tenant_to_host"));
    }

    #[test]
    fn an_empty_set_has_no_elements_line() {
        let mut t = sample();
        t.host_nets6.clear();
        let text = ruleset(&t);
        assert!(!text.contains("elements = {  }"), "{text}");
    }

    #[test]
    fn the_listing_compares_without_counter_totals() {
        assert_eq!(
            listing_words("x counter packets 12 bytes 3400 drop"),
            listing_words("x\n\tcounter drop")
        );
    }
}
