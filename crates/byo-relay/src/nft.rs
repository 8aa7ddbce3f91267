//! The relay's kernel adapter for the customer's SSH path (F): hands the ruleset and the
//! batches `byo_core::render::nft` builds to `nft -f` (one transaction each) and reads the
//! kernel's map back.

use std::io::Write as _;
use std::process::{Command, Stdio};

use byo_core::render::nft::{Layout, MAP, Mapping, TABLE, clear_batch, set_batch, skeleton};

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
