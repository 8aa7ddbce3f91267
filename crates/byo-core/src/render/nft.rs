//! The kernel side of the customer's SSH path (F): one nftables table of our own holding
//! the `LOFISPARK_VMSSH` chain and a port map. The host's own table, which keeps tenants
//! away from everything of the owner's, is [`tenants`].
//!
//! ```text
//! table ip lofispark
//!   map vmssh_ports           public port -> port on the host (10.8.0.2)
//!   chain LOFISPARK_VMSSH     IAP exemption; DNAT through the map; :22 blackholed otherwise
//!   chain prerouting          nat hook, PREROUTING: jumps to LOFISPARK_VMSSH for packets
//!                             not from the tunnel, so connections the relay itself opens
//!                             (ssh spark@10.8.0.2) are never caught
//!   chain postrouting         masquerade what was DNATed into wg0, so replies come back
//! ```
//!
//! A mapping is one element of the map, so a change is one element added or deleted in one
//! nftables transaction — atomic, touching only our table and no other mapping — and a
//! full reconcile is a flush and a refill in one transaction. The text is built here, pure,
//! because the server renders the skeleton into a relay's first-boot script; the relay's
//! `byo_relay::nft::NftCli` hands it to `nft` and reads the kernel back.

use std::fmt::Write as _;
use std::net::Ipv4Addr;

pub mod tenants;

pub const TABLE: &str = "lofispark";
pub const CHAIN: &str = "LOFISPARK_VMSSH";
pub const MAP: &str = "vmssh_ports";
/// Google's IAP TCP-forwarding range: it reaches the relay's own sshd on :22.
pub const IAP_RANGE: &str = "35.235.240.0/20";

/// One public port forwarded to one port on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mapping {
    pub port: u16,
    pub target_port: u16,
}

/// What the relay forwards to, and where the tunnel is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The one host behind this relay (10.8.0.2).
    pub host: Ipv4Addr,
    /// The WireGuard interface to the host (wg0).
    pub tunnel: String,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            host: Ipv4Addr::new(10, 8, 0, 2),
            tunnel: "wg0".into(),
        }
    }
}

/// The whole table, empty map: what a relay holds after bootstrap, and after a restart.
pub fn skeleton(layout: &Layout) -> String {
    format!(
        r#"table ip {TABLE} {{
	map {MAP} {{
		type inet_service : inet_service
	}}

	chain {CHAIN} {{
		ip saddr {IAP_RANGE} tcp dport 22 return comment "IAP reaches the relay's own sshd"
		meta l4proto tcp dnat to {host} : tcp dport map @{MAP}
		tcp dport 22 drop comment "blackhole: :22 goes nowhere until it is mapped"
	}}

	chain prerouting {{
		type nat hook prerouting priority dstnat; policy accept;
		iifname != "{tunnel}" jump {CHAIN}
	}}

	chain postrouting {{
		type nat hook postrouting priority srcnat; policy accept;
		oifname "{tunnel}" ct status dnat masquerade
	}}

	chain forward {{
		type filter hook forward priority filter; policy accept;
		oifname "{tunnel}" ct status dnat accept comment "into the tunnel: only what the chain DNATs"
		oifname "{tunnel}" drop
		iifname "{tunnel}" ct state established,related accept comment "out of the tunnel: replies only"
		iifname "{tunnel}" drop
	}}
}}
"#,
        host = layout.host,
        tunnel = layout.tunnel,
    )
}

/// Set one mapping: replace the element if the port is mapped already, in one transaction.
pub fn set_batch(current: Option<Mapping>, m: Mapping) -> String {
    let mut out = String::new();
    if let Some(c) = current {
        let _ = writeln!(out, "delete element ip {TABLE} {MAP} {{ {} }}", c.port);
    }
    let _ = writeln!(
        out,
        "add element ip {TABLE} {MAP} {{ {} : {} }}",
        m.port, m.target_port
    );
    out
}

pub fn clear_batch(port: u16) -> String {
    format!("delete element ip {TABLE} {MAP} {{ {port} }}\n")
}

/// Make the map exactly `mappings`, in one transaction.
pub fn reconcile_batch(mappings: &[Mapping]) -> String {
    let mut out = format!("flush map ip {TABLE} {MAP}\n");
    for chunk in mappings.chunks(1000) {
        let elems: Vec<String> = chunk
            .iter()
            .map(|m| format!("{} : {}", m.port, m.target_port))
            .collect();
        let _ = writeln!(
            out,
            "add element ip {TABLE} {MAP} {{ {} }}",
            elems.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_touch_only_our_map() {
        let m = Mapping {
            port: 22,
            target_port: 2201,
        };
        assert_eq!(
            set_batch(None, m),
            "add element ip lofispark vmssh_ports { 22 : 2201 }\n"
        );
        assert_eq!(
            set_batch(
                Some(Mapping {
                    port: 22,
                    target_port: 2200
                }),
                m
            ),
            "delete element ip lofispark vmssh_ports { 22 }\nadd element ip lofispark vmssh_ports { 22 : 2201 }\n"
        );
        let r = reconcile_batch(&[
            m,
            Mapping {
                port: 2222,
                target_port: 2202,
            },
        ]);
        assert!(r.starts_with("flush map ip lofispark vmssh_ports\n"));
        assert!(r.contains("{ 22 : 2201, 2222 : 2202 }"));
        assert_eq!(reconcile_batch(&[]), "flush map ip lofispark vmssh_ports\n");
        assert_eq!(
            clear_batch(22),
            "delete element ip lofispark vmssh_ports { 22 }\n"
        );
    }

    /// The skeleton's every line is compared with what the kernel lists in
    /// `byo-relay/tests/it/ssh_path.rs`; here, that it is our one table with the host and
    /// tunnel filled in.
    #[test]
    fn the_skeleton_is_our_table_for_this_host_and_tunnel() {
        let text = skeleton(&Layout {
            host: Ipv4Addr::new(10, 8, 0, 9),
            tunnel: "wg7".into(),
        });
        assert!(text.starts_with("table ip lofispark {\n"));
        assert!(text.contains("meta l4proto tcp dnat to 10.8.0.9 : tcp dport map @vmssh_ports"));
        assert!(text.contains("iifname != \"wg7\" jump LOFISPARK_VMSSH"));
        assert!(text.contains("tcp dport 22 drop"));
        assert_eq!(text.matches("table ip").count(), 1);
    }
}
