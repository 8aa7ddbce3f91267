//! `firewall`: step 10 of the list in `docs/prepare.md`.
//!
//! **Check:** ufw inactive, or `DEFAULT_FORWARD_POLICY="ACCEPT"` in `/etc/default/ufw` and the
//! rules `allow in on lxdbr0`, `route allow in/out on lxdbr0`, `allow in on wg0`, `route allow in
//! on wg0` (`ufw show added`).
//! **Apply:** edit the file, add the rules, `ufw reload`.
//! **Why here:** Before `base-image` and `relay-peer`. The file, not `iptables -P`: that lasts only
//! until the next reload.

use byo_core::prepare::Check;

use super::StepDef;
use super::shared::{UFW_DEFAULTS, verdict, ufw_active, forward_policy_in_file};
use crate::host::{Fallible, Host, must, read_string};
use crate::prepare::Plan;

/// The rules a default-deny ufw needs so the bridge's DHCP and DNS, forwarded container
/// traffic, and the relay's packets through wg0 get through.
const UFW_RULES: &[&[&str]] = &[
    &["allow", "in", "on", "lxdbr0"],
    &["route", "allow", "in", "on", "lxdbr0"],
    &["route", "allow", "out", "on", "lxdbr0"],
    &["allow", "in", "on", "wg0"],
    &["route", "allow", "in", "on", "wg0"],
];

pub(crate) struct Firewall;

impl StepDef for Firewall {
    const NAME: &str = "firewall";

    fn check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
        if !ufw_active(h)? {
            return Ok(Check::Satisfied);
        }
        let mut needs = Vec::new();
        if forward_policy_in_file(h)?.as_deref() != Some("ACCEPT") {
            needs.push(format!(
                "set DEFAULT_FORWARD_POLICY=\"ACCEPT\" in {UFW_DEFAULTS} (iptables -P lasts only until the next ufw reload)"
            ));
        }
        needs.extend(ufw_missing_rules(h)?);
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
        let text = read_string(h, UFW_DEFAULTS)?.unwrap_or_default();
        let mut seen = false;
        let mut out: String = text
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("DEFAULT_FORWARD_POLICY=") {
                    seen = true;
                    "DEFAULT_FORWARD_POLICY=\"ACCEPT\"\n".to_owned()
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        if !seen {
            out.push_str("DEFAULT_FORWARD_POLICY=\"ACCEPT\"\n");
        }
        h.write(UFW_DEFAULTS, out.as_bytes(), 0o644, "root:root")?;
        for rule in UFW_RULES {
            let mut argv = vec!["ufw"];
            argv.extend_from_slice(rule);
            must(h, &argv)?;
        }
        must(h, &["ufw", "reload"]).map(drop)
    }
}

fn ufw_missing_rules<H: Host>(h: &mut H) -> Fallible<Vec<String>> {
    let added = must(h, &["ufw", "show", "added"])?;
    let have: Vec<&str> = added.lines().map(str::trim).collect();
    Ok(UFW_RULES
        .iter()
        .map(|r| format!("ufw {}", r.join(" ")))
        .filter(|r| !have.contains(&r.as_str()))
        .collect())
}
