//! What more than one step reads: the names every step agrees on (spark, the pool, the bridge,
//! the profile), the verdict a check returns, and the small readers several checks share.

use byo_core::prepare::Check;

use crate::host::{Fallible, Host, read_string};
use crate::lxd;
use crate::prepare::Plan;

pub use crate::names::{PROFILE_NAME, SPARK};
pub(crate) const POOL: &str = "default";
pub(crate) const BRIDGE: &str = "lxdbr0";
pub(crate) const UFW_DEFAULTS: &str = "/etc/default/ufw";
pub(crate) const WG_UNIT: &str = "wg-quick@wg0.service";
/// The tunnel's range (10.8.0.1 the relay, 10.8.0.2 the host).
pub(super) const TUNNEL_NET: (u32, u32) = (0x0A08_0000, 24);

pub(super) fn verdict(needs: Vec<String>) -> Check {
    if needs.is_empty() {
        Check::Satisfied
    } else {
        Check::Needs(needs.join("; "))
    }
}

/// Add `lines` to the record at `path`, each once, before the change they record is made:
/// what was the owner's before preparation first changed it, which uninstall gives back. A
/// later run adds only what is new, so the first run's word on the owner's state stays.
pub(super) fn record<H: Host>(h: &mut H, path: &str, lines: &[&str]) -> Fallible<()> {
    let mut kept: Vec<String> = read_string(h, path)?
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    let before = kept.len();
    for l in lines {
        if !kept.iter().any(|k| k == l) {
            kept.push((*l).to_owned());
        }
    }
    if kept.len() == before {
        return Ok(());
    }
    let text: String = kept.iter().map(|l| format!("{l}\n")).collect();
    h.write(path, text.as_bytes(), 0o644, "root:root")
}

pub(super) fn file_is<H: Host>(h: &mut H, path: &str, want: &str) -> Fallible<bool> {
    Ok(read_string(h, path)?.as_deref() == Some(want))
}

/// What an LXD step would do on a host where LXD is not installed yet (a dry run).
pub(super) const NEEDS_LXD: &str = "everything: LXD is not installed yet";

pub(super) fn lxd_answers<H: Host>(h: &mut H) -> bool {
    matches!(lxd::get(h, "/1.0"), Ok(Some(_)))
}

/// Active swap devices, from /proc/swaps.
pub(crate) fn swaps<H: Host + ?Sized>(h: &mut H) -> Fallible<Vec<String>> {
    Ok(read_string(h, "/proc/swaps")?
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

pub(super) fn single<H>(_: &mut H, plan: &Plan) -> Option<String> {
    (plan.profile.node_count <= 1).then(|| "a single Spark: no satellites, no rails".to_owned())
}

pub(super) fn parse_net(s: &str) -> Option<(u32, u32)> {
    let (addr, len) = s.split_once('/')?;
    let ip: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    (len <= 32).then_some((u32::from(ip), len))
}

pub(super) fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    let len = a.1.min(b.1);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a.0 & mask == b.0 & mask
}

pub(crate) fn ufw_active<H: Host + ?Sized>(h: &mut H) -> Fallible<bool> {
    let out = h.run(&["ufw", "status"], None)?;
    Ok(out.ok() && out.stdout.contains("Status: active"))
}

/// `/etc/default/ufw`'s text with its `DEFAULT_FORWARD_POLICY` line set to `policy` (added
/// when there is none), or taken out when `policy` is `None`; every other line as it was.
pub(crate) fn with_forward_policy(text: &str, policy: Option<&str>) -> String {
    let line = policy.map(|p| format!("DEFAULT_FORWARD_POLICY=\"{p}\"\n"));
    let mut seen = false;
    let mut out = String::new();
    for l in text.lines() {
        if l.trim_start().starts_with("DEFAULT_FORWARD_POLICY=") {
            if !seen {
                out.push_str(line.as_deref().unwrap_or_default());
            }
            seen = true;
        } else {
            out.push_str(l);
            out.push('\n');
        }
    }
    if !seen {
        out.push_str(line.as_deref().unwrap_or_default());
    }
    out
}

pub(crate) fn forward_policy_in_file<H: Host + ?Sized>(h: &mut H) -> Fallible<Option<String>> {
    Ok(read_string(h, UFW_DEFAULTS)?.and_then(|t| {
        t.lines().find_map(|l| {
            l.trim()
                .strip_prefix("DEFAULT_FORWARD_POLICY=")
                .map(|v| v.trim_matches('"').to_owned())
        })
    }))
}
