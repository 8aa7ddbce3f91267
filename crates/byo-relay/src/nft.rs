//! The kernel side of the customer's SSH path (F): one nftables table of our own holding
//! the `LOFISPARK_VMSSH` chain and a port map.
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
//! full reconcile is a flush and a refill in one transaction. The text built here is pure;
//! [`NftCli`] hands it to `nft`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

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

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nft failed: {0}")]
    Failed(String),
    #[error("running nft: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("nft printed something unexpected: {0}")]
    Parse(String),
}

/// Read the map's elements out of `nft -j list map …`.
pub fn parse_map(json: &str) -> Result<Vec<Mapping>, NftError> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| NftError::Parse(e.to_string()))?;
    let items = v["nftables"]
        .as_array()
        .ok_or_else(|| NftError::Parse("no nftables array".into()))?;
    let map = items
        .iter()
        .find_map(|i| i.get("map"))
        .ok_or_else(|| NftError::Parse("no map in the listing".into()))?;
    let mut out = Vec::new();
    if let Some(elems) = map.get("elem").and_then(|e| e.as_array()) {
        for e in elems {
            let pair = e
                .as_array()
                .ok_or_else(|| NftError::Parse(format!("element {e}")))?;
            let port = |x: &serde_json::Value| {
                x.as_u64()
                    .and_then(|n| u16::try_from(n).ok())
                    .ok_or_else(|| NftError::Parse(format!("port {x}")))
            };
            match pair.as_slice() {
                [k, v] => out.push(Mapping {
                    port: port(k)?,
                    target_port: port(v)?,
                }),
                _ => return Err(NftError::Parse(format!("element {e}"))),
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Read `elements = { 22 : 2201, … }` out of nft's text output (`get element` prints text
/// even with `-j` in nft 1.0.6).
pub fn parse_elements_text(text: &str) -> Result<Vec<Mapping>, NftError> {
    let Some(start) = text.find("elements = {") else {
        return Ok(Vec::new());
    };
    let rest = &text[start + "elements = {".len()..];
    let end = rest
        .find('}')
        .ok_or_else(|| NftError::Parse("unterminated elements".into()))?;
    let mut out = Vec::new();
    for pair in rest[..end]
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair
            .split_once(':')
            .ok_or_else(|| NftError::Parse(format!("element {pair:?}")))?;
        let port = |x: &str| {
            x.trim()
                .parse::<u16>()
                .map_err(|_| NftError::Parse(format!("port {x:?}")))
        };
        out.push(Mapping {
            port: port(k)?,
            target_port: port(v)?,
        });
    }
    out.sort();
    Ok(out)
}

/// nftables through the `nft` command, in the caller's network namespace.
#[derive(Clone, Debug, Default)]
pub struct NftCli;

impl NftCli {
    /// Feed `batch` to `nft <flags> -f -`.
    fn feed(&self, flags: &[&str], batch: &str) -> Result<(), NftError> {
        let mut child = Command::new("nft")
            .args(flags)
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(batch.as_bytes())?;
        let out = child.wait_with_output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(NftError::Failed(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ))
        }
    }

    /// Apply a batch atomically (`nft -f -`: one transaction).
    pub fn apply(&self, batch: &str) -> Result<(), NftError> {
        self.feed(&[], batch)
    }

    /// Check a batch without committing it (`nft -c`).
    pub fn check(&self, batch: &str) -> Result<(), NftError> {
        self.feed(&["-c"], batch)
    }

    pub fn table_exists(&self) -> Result<bool, NftError> {
        let out = Command::new("nft")
            .args(["list", "table", "ip", TABLE])
            .output()?;
        Ok(out.status.success())
    }

    /// Create the table if it is missing; an existing one (a daemon restart) is left as it
    /// is, mappings and all.
    pub fn ensure(&self, layout: &Layout) -> Result<bool, NftError> {
        if self.table_exists()? {
            return Ok(false);
        }
        self.apply(&skeleton(layout))?;
        Ok(true)
    }

    /// What the kernel holds now.
    pub fn mappings(&self) -> Result<Vec<Mapping>, NftError> {
        let out = Command::new("nft")
            .args(["-j", "list", "map", "ip", TABLE, MAP])
            .output()?;
        if !out.status.success() {
            return Err(NftError::Failed(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        parse_map(&String::from_utf8_lossy(&out.stdout))
    }

    /// Set one mapping in one transaction: add it (which also succeeds when the port already
    /// maps to the same target), or, when the port maps elsewhere, replace its element. No
    /// listing, so a change costs the same at 10 mappings as at 10,000 (nft's `get element`
    /// loads the whole map; this does not). Adding first because it is the common case — a
    /// create, or a heartbeat putting back what a restarted relay lost — and because on
    /// this kernel any transaction that removes an element, or fails, waits ~15 ms.
    pub fn set(&self, m: Mapping) -> Result<(), NftError> {
        match self.apply(&set_batch(None, m)) {
            Err(NftError::Failed(e)) if e.contains("File exists") => {
                self.apply(&format!("{}{}", clear_batch(m.port), set_batch(None, m)))
            }
            other => other,
        }
    }

    /// Clear one port's mapping; clearing what is not mapped succeeds.
    pub fn clear(&self, port: u16) -> Result<(), NftError> {
        match self.apply(&clear_batch(port)) {
            Err(NftError::Failed(e))
                if e.contains("No such file or directory") && self.table_exists()? =>
            {
                Ok(())
            }
            other => other,
        }
    }

    /// One port's mapping, as the kernel holds it: a lookup, not a listing, so a change
    /// costs the same at 10 mappings as at 10,000.
    pub fn get(&self, port: u16) -> Result<Option<Mapping>, NftError> {
        let out = Command::new("nft")
            .args(["get", "element", "ip", TABLE, MAP, &format!("{{ {port} }}")])
            .output()?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("No such file or directory") && self.table_exists()? {
                return Ok(None);
            }
            return Err(NftError::Failed(err.trim().to_owned()));
        }
        Ok(parse_elements_text(&String::from_utf8_lossy(&out.stdout))?
            .into_iter()
            .find(|m| m.port == port))
    }

    /// The whole table as `nft` prints it.
    pub fn listing(&self) -> Result<String, NftError> {
        let out = Command::new("nft")
            .args(["list", "table", "ip", TABLE])
            .output()?;
        if !out.status.success() {
            return Err(NftError::Failed(
                String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
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
    }

    #[test]
    fn the_map_is_read_from_nft_json() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"map": {"family": "ip", "name": "vmssh_ports", "table": "lofispark", "type": "inet_service", "handle": 4, "map": "inet_service", "elem": [[2222, 2202], [22, 2201]]}}]}"#;
        assert_eq!(
            parse_map(json).unwrap(),
            vec![
                Mapping {
                    port: 22,
                    target_port: 2201
                },
                Mapping {
                    port: 2222,
                    target_port: 2202
                }
            ]
        );
        let text = "table ip lofispark {\n\tmap vmssh_ports {\n\t\ttype inet_service : inet_service\n\t\telements = { 22 : 2201, 2222 : 2202 }\n\t}\n}\n";
        assert_eq!(parse_elements_text(text).unwrap().len(), 2);
        assert!(
            parse_elements_text("table ip lofispark {}")
                .unwrap()
                .is_empty()
        );
        let empty = r#"{"nftables": [{"map": {"name": "vmssh_ports"}}]}"#;
        assert!(parse_map(empty).unwrap().is_empty());
        assert!(parse_map("{}").is_err());
    }
}
