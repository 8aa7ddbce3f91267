//! `firewall`: step 10 of the list in `docs/prepare.md`.
//!
//! **Check:** the tenant firewall (`docs/prepare.md`, "The tenant firewall"):
//! `/etc/enverge/tenant-firewall.nft` is what this host renders now (the bridge's address, the
//! host's own networks, the plan's rails), `enverge-tenant-firewall.service` as rendered and
//! enabled, and the kernel's `inet enverge_tenants` is that file (`nft list table` against the
//! same file loaded in a throwaway network namespace, counters aside); ufw inactive, or
//! `DEFAULT_FORWARD_POLICY="ACCEPT"` in `/etc/default/ufw` and the rules `allow in on lxdbr0`,
//! `route allow in/out on lxdbr0`, `allow in on wg0`, `route allow in on wg0` (`ufw show added`).
//! **Apply:** nftables if missing; the file (`nft -c -f` first, a refused file is taken back),
//! the unit, `enable`, `restart` (which loads the table); edit the ufw file, add the rules, `ufw
//! reload`.
//! **Recorded:** the file's policy before the first change, in [`UFW_POLICY_WAS`]: uninstall
//! puts it back.
//! **Why here:** After `lxd-network` (the bridge's address), before `base-image` and
//! `relay-peer`. The file, not `iptables -P`: that lasts only until the next reload. A table of
//! our own loaded by our own unit: `ufw reload` rewrites only ufw's tables, a reboot loads ours
//! before LXD starts an instance.

use std::net::{Ipv4Addr, Ipv6Addr};

use byo_core::prepare::Check;
use byo_core::render::nft::tenants::{self, Tenants};
use byo_core::render::units::{TENANT_FIREWALL, tenant_firewall};

use super::StepDef;
use super::shared::{
    BRIDGE, UFW_DEFAULTS, file_is, forward_policy_in_file, lxd_answers, ufw_active, verdict,
};
use crate::host::{self, Fallible, Host, apt_install, must, read_string, unit_enabled};
use crate::lxd;
use crate::prepare::Plan;

/// The rules a default-deny ufw needs so the bridge's DHCP and DNS, forwarded container
/// traffic, and the relay's packets through wg0 get through. What tenants may reach of all
/// that is the tenant firewall's to say (`byo_core::render::nft::tenants`).
pub(crate) const UFW_RULES: &[&[&str]] = &[
    &["allow", "in", "on", "lxdbr0"],
    &["route", "allow", "in", "on", "lxdbr0"],
    &["route", "allow", "out", "on", "lxdbr0"],
    &["allow", "in", "on", "wg0"],
    &["route", "allow", "in", "on", "wg0"],
];

/// ufw's `DEFAULT_FORWARD_POLICY` as it was before the firewall step first set it to
/// ACCEPT (uninstall's `tenant-firewall` puts it back).
pub(crate) const UFW_POLICY_WAS: &str = "/etc/enverge/ufw-forward-policy";
/// What [`UFW_POLICY_WAS`] holds when the file had no such line.
pub(crate) const UFW_POLICY_UNSET: &str = "unset";
const NFT: &str = "/usr/sbin/nft";
pub(crate) const UNIT_PATH: &str = "/etc/systemd/system/enverge-tenant-firewall.service";

pub(crate) struct Firewall;

impl StepDef for Firewall {
    const NAME: &str = "firewall";

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        let mut needs = tenant_needs(h, plan)?;
        needs.extend(ufw_needs(h)?);
        Ok(verdict(needs))
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        if !tenant_needs(h, plan)?.is_empty() {
            apply_tenants(h, plan)?;
        }
        if !ufw_needs(h)?.is_empty() {
            apply_ufw(h)?;
        }
        Ok(())
    }
}

/// The tenant firewall brought to what the host is now (its networks, the owner's public
/// address serving last heard): rendered, checked and loaded exactly as the step's apply
/// does, and only when the kernel's table is not already that. What root's
/// `enverge-tenant-firewall-refresh.service` runs when serving asks (issue #36). `Ok(true)`
/// when it reloaded.
pub fn refresh<H: Host>(h: &mut H, plan: &Plan) -> Fallible<bool> {
    if tenant_needs(h, plan)?.is_empty() {
        return Ok(false);
    }
    apply_tenants(h, plan).map(|()| true)
}

/// What the tenant firewall lacks on this host.
fn tenant_needs<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Vec<String>> {
    let Some(want) = render(h, plan)? else {
        return Ok(vec![format!(
            "load the tenant firewall once {BRIDGE} exists (lxd-network)"
        )]);
    };
    let mut needs = Vec::new();
    let have_nft = h.run(&["nft", "--version"], None)?.ok();
    if !have_nft {
        needs.push("install nftables".to_owned());
    }
    if !file_is(h, tenants::PATH, &want)? {
        needs.push(format!("write {}", tenants::PATH));
    }
    if !file_is(h, UNIT_PATH, &tenant_firewall(NFT))? {
        needs.push(format!("write {TENANT_FIREWALL}"));
    }
    if !unit_enabled(h, TENANT_FIREWALL)? {
        needs.push(format!("enable {TENANT_FIREWALL}"));
    }
    if have_nft && !kernel_holds(h, &want)? {
        needs.push(format!(
            "load inet {} into the kernel (tenants on {BRIDGE} reach the owner's networks)",
            tenants::TABLE
        ));
    }
    Ok(needs)
}

fn apply_tenants<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    let want = render(h, plan)?.ok_or_else(|| {
        format!(
            "{BRIDGE} has no IPv4 address, and the tenant firewall lets DHCP and DNS through to it only: lxd-network must run before firewall"
        )
    })?;
    if !h.run(&["nft", "--version"], None)?.ok() {
        apt_install(h, &["nftables"])?;
    }
    h.write(tenants::PATH, want.as_bytes(), 0o644, "root:root")?;
    let checked = h.run(&["nft", "-c", "-f", tenants::PATH], None)?;
    if !checked.ok() {
        h.remove(tenants::PATH)?;
        return Err(format!(
            "nft refused the rendered tenant firewall (taken back): {}",
            host::last_lines(&checked.stderr, &checked.stdout)
        ));
    }
    h.write(
        UNIT_PATH,
        tenant_firewall(NFT).as_bytes(),
        0o644,
        "root:root",
    )?;
    must(h, &["systemctl", "daemon-reload"])?;
    must(h, &["systemctl", "enable", TENANT_FIREWALL])?;
    // Loads the file: the unit is how the table comes back at every boot, so load it the same way.
    must(h, &["systemctl", "restart", TENANT_FIREWALL]).map(drop)
}

/// The ruleset this host needs now, or None while the bridge has no address.
fn render<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Option<String>> {
    if !lxd_answers(h) {
        return Ok(None);
    }
    let Some(net) = lxd::get(h, &format!("/1.0/networks/{BRIDGE}"))? else {
        return Ok(None);
    };
    let Some(bridge_address) = net["config"]["ipv4.address"]
        .as_str()
        .and_then(|a| a.split('/').next())
        .and_then(|a| a.parse::<Ipv4Addr>().ok())
    else {
        return Ok(None);
    };
    // Not the bridge (its own subnet is the tenants' side), not wg0 (the tunnel has its own
    // rule, and wg0 comes up only at relay-peer: counting it would change the file after the
    // first run).
    let ours = |i: &str| !["lo", BRIDGE, "wg0"].contains(&i);
    let mut host_nets4: Vec<(Ipv4Addr, u8)> = host::ipv4_networks(h)?
        .iter()
        .filter(|(i, _)| ours(i))
        .filter_map(|(_, n)| prefix(n))
        .collect();
    host_nets4.extend(plan.profile.rails.iter().filter_map(|r| prefix(&r.subnet)));
    let host_nets6: Vec<(Ipv6Addr, u8)> = host::ipv6_networks(h)?
        .iter()
        .filter(|(i, _)| ours(i))
        .filter_map(|(_, n)| prefix(n))
        .collect();
    Ok(Some(tenants::ruleset(&Tenants {
        bridge: BRIDGE.to_owned(),
        bridge_address,
        host_nets4,
        host_nets6,
        wan4: wan4(h)?,
    })))
}

/// The owner's public address as serving last heard it from the backend ([`tenants::WAN_FILE`]),
/// when there is one and it is an IPv4 address. Serving writes the file, so it is read as an
/// address and nothing else: a line that does not parse is no address (and said so).
fn wan4<H: Host>(h: &mut H) -> Fallible<Vec<Ipv4Addr>> {
    let Some(text) = read_string(h, tenants::WAN_FILE)? else {
        return Ok(Vec::new());
    };
    let line = text.trim();
    match line.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) if !a.is_unspecified() && !a.is_loopback() => Ok(vec![a]),
        // An IPv6 source is the host's own address (host_nets6), and tenants have no IPv6.
        Ok(_) => Ok(Vec::new()),
        Err(_) => {
            tracing::warn!(file = tenants::WAN_FILE, "not an address; ignored");
            Ok(Vec::new())
        }
    }
}

fn prefix<A: std::str::FromStr>(s: &str) -> Option<(A, u8)> {
    let (a, len) = s.split_once('/')?;
    Some((a.parse().ok()?, len.parse().ok()?))
}

/// Whether the kernel's table is exactly `want`: the kernel's listing against the listing of
/// `want` loaded into a throwaway network namespace (counters' totals aside). Touches nothing.
fn kernel_holds<H: Host>(h: &mut H, want: &str) -> Fallible<bool> {
    let table = tenants::TABLE;
    let live = h.run(&["nft", "list", "table", "inet", table], None)?;
    if !live.ok() {
        return Ok(false);
    }
    let script = format!("nft -f - && nft list table inet {table}");
    let scratch = h.run(
        &["unshare", "--net", "--", "sh", "-c", &script],
        Some(want.as_bytes()),
    )?;
    if !scratch.ok() {
        return Err(format!(
            "the rendered tenant firewall does not load in a scratch namespace: {}",
            host::last_lines(&scratch.stderr, &scratch.stdout)
        ));
    }
    Ok(tenants::listing_words(&live.stdout) == tenants::listing_words(&scratch.stdout))
}

fn ufw_needs<H: Host>(h: &mut H) -> Fallible<Vec<String>> {
    if !ufw_active(h)? {
        return Ok(Vec::new());
    }
    let mut needs = Vec::new();
    if forward_policy_in_file(h)?.as_deref() != Some("ACCEPT") {
        needs.push(format!(
            "set DEFAULT_FORWARD_POLICY=\"ACCEPT\" in {UFW_DEFAULTS} (iptables -P lasts only until the next ufw reload)"
        ));
    }
    needs.extend(ufw_missing_rules(h)?);
    Ok(needs)
}

fn apply_ufw<H: Host>(h: &mut H) -> Fallible<()> {
    // The owner's policy, recorded once before the first change (uninstall puts it back).
    let was = forward_policy_in_file(h)?;
    if was.as_deref() != Some("ACCEPT") && read_string(h, UFW_POLICY_WAS)?.is_none() {
        let was = was.unwrap_or_else(|| UFW_POLICY_UNSET.to_owned());
        super::shared::record(h, UFW_POLICY_WAS, &[&was])?;
    }
    let text = read_string(h, UFW_DEFAULTS)?.unwrap_or_default();
    let out = super::shared::with_forward_policy(&text, Some("ACCEPT"));
    h.write(UFW_DEFAULTS, out.as_bytes(), 0o644, "root:root")?;
    for rule in UFW_RULES {
        let mut argv = vec!["ufw"];
        argv.extend_from_slice(rule);
        must(h, &argv)?;
    }
    must(h, &["ufw", "reload"]).map(drop)
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
