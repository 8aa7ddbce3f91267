//! Uninstall (design H.3–H.4): hand the machine back to its owner. "Restore the owner before
//! removing ourselves" — the mirror of preparation's operator-access before owner-lockout —
//! so the first step gives the owner their login back and *proves* it, and nothing of ours
//! is removed unless that proof holds. Then every piece preparation and the installer put
//! on the host goes, each in its own step.
//!
//! The steps have preparation's shape and run on its engine (`byo_core::prepare::run`): a
//! check that only reads ("is anything of this left?"), an apply that removes it, and the
//! check again after (a removal that says it worked while something is still there is a
//! failure); the run stops at the first step that will not complete. So an uninstall cut
//! short finishes when run again, and one on a machine holding nothing of ours changes
//! nothing. Everything acts through the host adapter ([`Host`]), as preparation does.
//! `docs/uninstall.md` lists the steps, what each removes, what stays and the exit codes.

use std::io::IsTerminal;

use byo_core::prepare::{Check, Mode, Outcome, Progress, Step};
use byo_core::render::nft::tenants;
use byo_core::render::units::{
    FIREWALL_PATH, FIREWALL_REFRESH, PREPARE, RAILS, RAILS_PATH, REBOOT, REBOOT_PATH, ROLLBACK,
    SERVING, TENANT_FIREWALL,
};
use byo_wire::prepare::StepState;
use byo_wire::profile::LxdSource;
use serde_json::Value;

use crate::host::{
    Fallible, Host, LocalHost, SshHost, apt_purge, exists, home_of, must, package_installed,
    read_string, shell_quote, unit_active, unit_enabled, user_exists, user_groups,
};
use crate::lxd;
use crate::machines::satellite_host;
use crate::names::{BUILD_INSTANCE, CREDENTIALS, OWNER_FILE, PROFILE_NAME, SERVER_FILE, SPARK};
use crate::prepare::steps::written::*;
use byo_wire::peers::{PEER_FILE, Peer, parse_peer_file};

/// The agent's binary, as install.sh installs it, and what an upgrade keeps beside it.
pub const AGENT_BINS: &[&str] = &[
    "/usr/local/bin/byo-agent",
    "/usr/local/bin/byo-agent.previous",
    "/usr/local/bin/byo-agent.new",
    byo_core::render::units::ROLLBACK_SCRIPT,
];
/// The agent's own directories: the credentials and records, and serving's state.
pub const AGENT_DIRS: &[&str] = &["/var/lib/enverge-agent", "/etc/enverge"];
const UNIT_DIR: &str = "/etc/systemd/system";

/// What this uninstall is asked to do.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Keep LXD and its images (our instances and profile still go).
    pub keep_lxd: bool,
    /// The owner's login: `--owner`, else what install.sh recorded, else who ran sudo.
    pub owner: Option<String>,
    /// Reinstall the Docker packages docker-purge removed (offered, not done unasked: the
    /// owner may not want Docker back).
    pub restore_docker: bool,
    /// Where node0 keeps its peer key and the satellites' pinned host keys (`/etc/enverge`):
    /// how a pair's or a ring's satellites are reached. `None` in a run that cannot reach
    /// them (a satellite's own subset).
    pub satellites: Option<std::path::PathBuf>,
    /// Hand node0 back alone and leave its satellites prepared (one switched off for good).
    pub leave_satellites: bool,
    /// Where a satellite's step lines go (its steps run inside node0's `satellites`).
    pub progress: Option<fn(String)>,
}

/// Why an uninstall stopped, with the exit status `byo-agent uninstall` ends with.
#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    /// The owner's access could not be restored or proved: nothing of ours was removed.
    #[error(
        "the owner's access could not be restored and verified, so nothing of byo's was removed: {0}"
    )]
    OwnerNotRestored(String),
    /// A removal step failed part way; what came before it is gone, and a re-run finishes.
    #[error(
        "uninstall stopped at {step}: {error}. What was removed before it stays removed; run `byo-agent uninstall` again to finish"
    )]
    Stopped { step: String, error: String },
    /// Not root, or not confirmed.
    #[error("{0}")]
    Refused(String),
}

impl UninstallError {
    pub fn exit_code(&self) -> u8 {
        match self {
            UninstallError::Stopped { .. } => 1,
            UninstallError::OwnerNotRestored(_) => 3,
            UninstallError::Refused(_) => 4,
        }
    }
}

// --- the steps -------------------------------------------------------------------------

type CheckFn = fn(&mut dyn Host, &Plan) -> Fallible<Check>;
type ApplyFn = fn(&mut dyn Host, &Plan) -> Fallible<()>;
type SkipFn = fn(&mut dyn Host, &Plan) -> Option<String>;

/// One uninstall step: its check reads what of ours is left, its apply removes it.
pub struct UninstallStep<'p> {
    name: &'static str,
    plan: &'p Plan,
    check: CheckFn,
    apply: ApplyFn,
    skip: SkipFn,
}

impl<H: Host> Step<H> for UninstallStep<'_> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn check(&self, host: &mut H) -> Result<Check, String> {
        (self.check)(host, self.plan)
    }
    fn apply(&self, host: &mut H) -> Result<(), String> {
        (self.apply)(host, self.plan)
    }
    fn skip(&self, host: &mut H) -> Option<String> {
        (self.skip)(host, self.plan)
    }
}

fn never(_: &mut dyn Host, _: &Plan) -> Option<String> {
    None
}

/// The first step; the rest run only once it holds.
pub const OWNER_RESTORE: &str = "owner-restore";

/// Every step, in order (`docs/uninstall.md`'s table is checked against it).
pub const STEP_NAMES: &[&str] = &[
    OWNER_RESTORE,
    "agent-units",
    "satellites",
    "instances",
    "lxd-profile",
    "lxd",
    "tenant-firewall",
    "relay-peer",
    "tunnel",
    "spark-access",
    "host-settings",
    "docker",
    "agent-files",
];

/// The steps bound to `plan`, in [`STEP_NAMES`]' order.
pub fn steps(plan: &Plan) -> Vec<UninstallStep<'_>> {
    let step = |name, check: CheckFn, apply: ApplyFn, skip: SkipFn| UninstallStep {
        name,
        plan,
        check,
        apply,
        skip,
    };
    let steps = vec![
        step(OWNER_RESTORE, owner_check, owner_apply, never),
        step("agent-units", units_check, units_apply, never),
        step(
            "satellites",
            satellites_check,
            satellites_apply,
            satellites_skip,
        ),
        step("instances", instances_check, instances_apply, no_lxd),
        step("lxd-profile", profile_check, profile_apply, no_lxd),
        step("lxd", lxd_check, lxd_apply, lxd_skip),
        step("tenant-firewall", firewall_check, firewall_apply, never),
        step("relay-peer", wg_check, wg_apply, never),
        step("tunnel", tunnel_check, tunnel_apply, never),
        step("spark-access", spark_check, spark_apply, never),
        step("host-settings", settings_check, settings_apply, never),
        step("docker", docker_check, docker_apply, docker_skip),
        step("agent-files", files_check, files_apply, never),
    ];
    debug_assert!(steps.iter().map(|s| s.name).eq(STEP_NAMES.iter().copied()));
    steps
}

fn verdict(needs: Vec<String>) -> Check {
    if needs.is_empty() {
        Check::Satisfied
    } else {
        Check::Needs(needs.join("; "))
    }
}

/// Run, ignoring the answer: stopping a unit that is not there is not a failure.
fn try_run(h: &mut dyn Host, argv: &[&str]) -> Fallible<()> {
    h.run(argv, None).map(drop)
}

// owner-restore -------------------------------------------------------------------------

const NO_OWNER: &str = "this machine's owner is not recorded (install.sh keeps who ran it with sudo in /etc/enverge/owner) and uninstall was not run through sudo: run it again with --owner LOGIN, the login that should administer this machine afterwards";

/// Fields of the owner's passwd line.
fn passwd_fields(h: &mut dyn Host, user: &str) -> Fallible<Vec<String>> {
    let out = must(h, &["getent", "passwd", user])?;
    Ok(out.trim().split(':').map(str::to_owned).collect())
}

/// The owner's password as /etc/shadow holds it: `Ok(true)` usable, `Ok(false)` locked (a
/// `!` before a real hash, which `usermod --unlock` takes away), and an error when there is
/// no password to unlock.
fn password_usable(h: &mut dyn Host, owner: &str) -> Fallible<bool> {
    let out = must(h, &["getent", "shadow", owner])?;
    let hash = out.trim().split(':').nth(1).unwrap_or_default().to_owned();
    let real = hash.trim_start_matches('!');
    if real.is_empty() || real.starts_with('*') || real.starts_with('!') {
        return Err(format!(
            "{owner} has no password in /etc/shadow, so there is no password login to give back: set one (`passwd {owner}`) and run uninstall again"
        ));
    }
    Ok(!hash.starts_with('!'))
}

/// The groups owner-lockout recorded taking the owner out of, that still exist and the
/// owner is not back in.
fn groups_to_give_back(h: &mut dyn Host, owner: &str) -> Fallible<Vec<String>> {
    let recorded = read_string(h, OWNER_GROUPS)?.unwrap_or_default();
    let have = user_groups(h, owner)?;
    let mut back = Vec::new();
    for g in recorded.lines().map(str::trim).filter(|g| !g.is_empty()) {
        if !have.iter().any(|x| x == g) && h.run(&["getent", "group", g], None)?.ok() {
            back.push(g.to_owned());
        }
    }
    Ok(back)
}

/// Whether sudo lets the owner administer the machine (`None`: no sudo here at all).
fn owner_may_sudo(h: &mut dyn Host, owner: &str) -> Fallible<Option<bool>> {
    let out = h.run(&["sudo", "-l", "-U", owner], None)?;
    if out.code == 127 {
        return Ok(None);
    }
    Ok(Some(
        out.ok() && !out.stdout.contains("is not allowed to run sudo"),
    ))
}

/// What sshd's effective configuration (`sshd -T`, Match blocks applied for this login)
/// says about the owner logging in with their password; `Err` for what only the owner may
/// change.
fn sshd_admits(h: &mut dyn Host, owner: &str) -> Fallible<()> {
    let spec = format!("user={owner},host=localhost,addr=127.0.0.1");
    let out = h.run(&["sshd", "-T", "-C", &spec], None)?;
    if !out.ok() {
        return Err(format!(
            "sshd's effective configuration could not be read (`sshd -T`: {}), so the owner's login cannot be proved",
            crate::host::last_lines(&out.stderr, &out.stdout)
        ));
    }
    let conf = out.stdout.to_ascii_lowercase();
    let value = |key: &str| -> Option<Vec<String>> {
        conf.lines()
            .filter_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .reduce(|mut a, b| {
                a.extend(b);
                a
            })
    };
    let yes = |key: &str| value(key).is_some_and(|v| v.first().is_some_and(|x| x == "yes"));
    if !(yes("passwordauthentication") || (yes("kbdinteractiveauthentication") && yes("usepam"))) {
        return Err(format!(
            "sshd does not accept passwords for {owner} (PasswordAuthentication no in its effective configuration): with spark gone the owner would have no way in. Allow it, then run uninstall again"
        ));
    }
    let owner_lc = owner.to_ascii_lowercase();
    if let Some(allowed) = value("allowusers")
        && !allowed
            .iter()
            .any(|u| u == "*" || u == &owner_lc || u.starts_with(&format!("{owner_lc}@")))
    {
        return Err(format!(
            "sshd admits only {} (AllowUsers), not {owner}",
            allowed.join(" ")
        ));
    }
    if value("denyusers").is_some_and(|d| d.iter().any(|u| u == &owner_lc || u == "*")) {
        return Err(format!("sshd refuses {owner} (DenyUsers)"));
    }
    let groups = user_groups(h, owner)?;
    if let Some(allowed) = value("allowgroups")
        && !allowed.iter().any(|g| g == "*" || groups.contains(g))
    {
        return Err(format!(
            "sshd admits only the groups {} (AllowGroups), none of them {owner}'s",
            allowed.join(" ")
        ));
    }
    if let Some(denied) = value("denygroups")
        && let Some(g) = denied.iter().find(|g| groups.contains(g))
    {
        return Err(format!(
            "sshd refuses the group {g} (DenyGroups), {owner}'s"
        ));
    }
    Ok(())
}

fn owner_of(plan: &Plan) -> Fallible<String> {
    let owner = plan.owner.clone().ok_or(NO_OWNER)?;
    if owner == SPARK || owner == "root" || owner.is_empty() {
        return Err(format!(
            "{owner:?} is not an owner's login (spark is ours, root is nobody's): run again with --owner LOGIN"
        ));
    }
    Ok(owner)
}

fn owner_check(h: &mut dyn Host, plan: &Plan) -> Fallible<Check> {
    let owner = owner_of(plan)?;
    if !user_exists(h, &owner)? {
        return Err(format!(
            "the owner's login {owner} does not exist on this machine: run again with --owner LOGIN"
        ));
    }
    let shell = passwd_fields(h, &owner)?
        .get(6)
        .cloned()
        .unwrap_or_default();
    let shells = read_string(h, "/etc/shells")?;
    let listed = shells.is_none_or(|s| s.lines().any(|l| l.trim() == shell));
    if shell.is_empty()
        || shell.ends_with("/nologin")
        || shell.ends_with("/false")
        || !listed
        || !exists(h, &shell)?
    {
        return Err(format!(
            "{owner}'s shell {shell:?} is not a login shell (see /etc/shells): set one (`chsh -s /bin/bash {owner}`) and run uninstall again"
        ));
    }
    let mut needs = Vec::new();
    let locked_out = exists(h, LOCKOUT_CONF)?;
    if locked_out {
        needs.push(format!("remove {LOCKOUT_CONF} (sshd admits only spark)"));
    }
    if !password_usable(h, &owner)? {
        needs.push(format!("unlock {owner}'s password"));
    }
    let back = groups_to_give_back(h, &owner)?;
    if !back.is_empty() {
        needs.push(format!("give {owner} back {}", back.join(", ")));
    } else if owner_may_sudo(h, &owner)? == Some(false) {
        needs.push(format!("let {owner} administer this machine (sudo)"));
    }
    // With the lockout drop-in still there sshd admits spark alone; that is said above.
    if !locked_out {
        sshd_admits(h, &owner)?;
    }
    if !(unit_active(h, "ssh.service")? || unit_active(h, "sshd.service")?) {
        needs.push("start sshd".to_owned());
    }
    Ok(verdict(needs))
}

fn owner_apply(h: &mut dyn Host, plan: &Plan) -> Fallible<()> {
    let owner = owner_of(plan)?;
    // Preparation is what locks the owner out; a retrying run must not do it again.
    try_run(h, &["systemctl", "stop", PREPARE])?;
    if exists(h, LOCKOUT_CONF)? {
        let kept = h.read(LOCKOUT_CONF)?;
        h.remove(LOCKOUT_CONF)?;
        if let Err(e) = must(h, &["sshd", "-t"]) {
            if let Some(bytes) = kept {
                h.write(LOCKOUT_CONF, &bytes, 0o644, "root:root")?;
            }
            return Err(format!(
                "sshd's configuration does not load without {LOCKOUT_CONF}, so it was put back: {e}"
            ));
        }
        for unit in ["ssh.service", "sshd.service"] {
            if h.run(&["systemctl", "reload", unit], None)?.ok() {
                break;
            }
        }
    }
    if !password_usable(h, &owner)? {
        must(h, &["usermod", "--unlock", &owner])?;
    }
    let back = groups_to_give_back(h, &owner)?;
    for g in &back {
        must(h, &["usermod", "-aG", g, &owner])?;
    }
    if back.is_empty() && owner_may_sudo(h, &owner)? == Some(false) {
        // Nothing recorded (an older preparation): the owner ran install.sh with sudo, so
        // the distribution's admin group is what they had.
        let mut added = false;
        for g in ADMIN_GROUPS.iter().take(3) {
            if h.run(&["getent", "group", g], None)?.ok() {
                must(h, &["usermod", "-aG", g, &owner])?;
                added = true;
                break;
            }
        }
        if !added {
            return Err(format!(
                "{owner} cannot use sudo and this machine has no admin group (sudo, admin, wheel) to give back"
            ));
        }
    }
    if !(unit_active(h, "ssh.service")? || unit_active(h, "sshd.service")?) {
        for unit in ["ssh.service", "sshd.service"] {
            if h.run(&["systemctl", "enable", "--now", unit], None)?.ok() {
                break;
            }
        }
    }
    Ok(())
}

// agent-units ---------------------------------------------------------------------------

const AGENT_UNITS: &[&str] = &[
    SERVING,
    byo_core::render::units::LXD_GATE,
    PREPARE,
    ROLLBACK,
    REBOOT_PATH,
    REBOOT,
    RAILS_PATH,
    RAILS,
    FIREWALL_PATH,
    FIREWALL_REFRESH,
    byo_core::render::units::OPERATOR_KEYS_PATH,
    byo_core::render::units::OPERATOR_KEYS,
];

fn unit_leftovers(h: &mut dyn Host, units: &[&str]) -> Fallible<Vec<String>> {
    let mut left = Vec::new();
    for unit in units {
        let file = format!("{UNIT_DIR}/{unit}");
        let dropins = format!("{file}.d");
        if exists(h, &file)? || exists(h, &dropins)? {
            left.push(format!("remove {unit}"));
        } else if unit_active(h, unit)? || unit_enabled(h, unit)? {
            left.push(format!("stop {unit}"));
        }
    }
    Ok(left)
}

fn remove_units(h: &mut dyn Host, units: &[&str]) -> Fallible<()> {
    for unit in units {
        try_run(h, &["systemctl", "disable", "--now", unit])?;
        try_run(h, &["systemctl", "stop", unit])?;
        let file = format!("{UNIT_DIR}/{unit}");
        must(h, &["rm", "-rf", &file, &format!("{file}.d")])?;
    }
    must(h, &["systemctl", "daemon-reload"])?;
    for unit in units {
        try_run(h, &["systemctl", "reset-failed", unit])?;
    }
    Ok(())
}

fn units_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let mut left = unit_leftovers(h, AGENT_UNITS)?;
    if exists(h, APT_LXD_DROP_IN)? {
        left.push(format!("remove {APT_LXD_DROP_IN}"));
    }
    Ok(verdict(left))
}

fn units_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    // lxd-install's drop-in for Debian's lxd.service goes with the units, whoever's LXD it is.
    must(h, &["rm", "-f", APT_LXD_DROP_IN])?;
    remove_units(h, AGENT_UNITS)
}

// instances, lxd-profile, lxd -----------------------------------------------------------

fn lxd_answers(h: &mut dyn Host) -> bool {
    matches!(lxd::get(h, "/1.0"), Ok(Some(_)))
}

fn no_lxd(h: &mut dyn Host, _: &Plan) -> Option<String> {
    (!lxd_answers(h)).then(|| "LXD does not answer here: no instance or profile of ours".into())
}

/// Ours: on lofispark-base (every instance serving created, and the image build).
fn our_instances(h: &mut dyn Host) -> Fallible<Vec<String>> {
    let list = lxd::get(h, "/1.0/instances?recursion=1")?.unwrap_or(Value::Null);
    Ok(list
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| {
            i["name"] == BUILD_INSTANCE
                || i["profiles"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p == PROFILE_NAME))
        })
        .filter_map(|i| i["name"].as_str().map(str::to_owned))
        .collect())
}

fn instances_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let ours = our_instances(h)?;
    Ok(verdict(if ours.is_empty() {
        vec![]
    } else {
        vec![format!("delete the instances {}", ours.join(", "))]
    }))
}

fn instances_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    for name in our_instances(h)? {
        lxd::delete_instance(h, &name)?;
    }
    Ok(())
}

/// Our profiles: lofispark-base, and a pair's lofispark-dual (the node's cables).
const PROFILES: &[&str] = &[PROFILE_NAME, crate::names::DUAL_PROFILE];

fn profile_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let mut needs = Vec::new();
    for p in PROFILES {
        if lxd::get(h, &format!("/1.0/profiles/{p}"))?.is_some() {
            needs.push(format!("delete the profile {p}"));
        }
    }
    Ok(verdict(needs))
}

fn profile_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    for p in PROFILES {
        if lxd::get(h, &format!("/1.0/profiles/{p}"))?.is_some() {
            lxd::call(
                h,
                "DELETE",
                &format!("/1.0/profiles/{p}"),
                crate::host::LxdBody::None,
            )?;
        }
    }
    Ok(())
}

fn lxd_skip(h: &mut dyn Host, plan: &Plan) -> Option<String> {
    if plan.keep_lxd {
        return Some("--keep-lxd: LXD, its images, pool and bridge stay".into());
    }
    match read_string(h, LXD_INSTALLED) {
        Ok(Some(_)) => None,
        Ok(None) => Some(format!(
            "LXD was not installed by preparation (no {LXD_INSTALLED}): it is the owner's, and stays"
        )),
        Err(e) => Some(format!("could not read {LXD_INSTALLED} ({e}): LXD stays")),
    }
}

/// Where preparation installed LXD from, as lxd-install recorded it (`LxdSource`'s name);
/// a record that names neither reads as Debian's package, the one other source.
fn lxd_source(h: &mut dyn Host) -> Fallible<LxdSource> {
    let recorded = read_string(h, LXD_INSTALLED)?.unwrap_or_default();
    Ok(if recorded.trim() == LxdSource::Snap.as_str() {
        LxdSource::Snap
    } else {
        LxdSource::Apt
    })
}

fn lxd_installed(h: &mut dyn Host) -> Fallible<bool> {
    Ok(if lxd_source(h)? == LxdSource::Snap {
        h.run(&["snap", "list", "lxd"], None)?.ok()
    } else {
        package_installed(h, "lxd")?
    })
}

fn lxd_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    Ok(verdict(if lxd_installed(h)? || lxd_answers(h) {
        vec!["remove LXD (preparation installed it) with its images, pool and bridge".into()]
    } else {
        vec![]
    }))
}

fn names(v: Option<Value>) -> Vec<String> {
    v.and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter_map(|u| u.as_str()?.rsplit('/').next().map(str::to_owned))
        .collect()
}

fn lxd_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    use crate::host::LxdBody;
    if lxd_answers(h) {
        let others = names(lxd::get(h, "/1.0/instances")?);
        if !others.is_empty() {
            return Err(format!(
                "LXD holds instances that are not ours ({}): removing it would destroy them. Run uninstall again with --keep-lxd",
                others.join(", ")
            ));
        }
        for image in names(lxd::get(h, "/1.0/images")?) {
            lxd::call(h, "DELETE", &format!("/1.0/images/{image}"), LxdBody::None)?;
        }
        if lxd::get(h, &format!("/1.0/networks/{BRIDGE}"))?.is_some() {
            lxd::call(
                h,
                "DELETE",
                &format!("/1.0/networks/{BRIDGE}"),
                LxdBody::None,
            )?;
        }
        if lxd::get(h, &format!("/1.0/storage-pools/{POOL}"))?.is_some() {
            lxd::call(
                h,
                "DELETE",
                &format!("/1.0/storage-pools/{POOL}"),
                LxdBody::None,
            )?;
        }
    }
    if lxd_source(h)? == LxdSource::Snap {
        must(h, &["snap", "remove", "--purge", "lxd"])?;
    } else {
        try_run(
            h,
            &["systemctl", "disable", "--now", "lxd.socket", "lxd.service"],
        )?;
        let mut installed = Vec::new();
        for p in ["lxd", "lxd-client", "lxd-agent"] {
            if package_installed(h, p)? {
                installed.push(p);
            }
        }
        if !installed.is_empty() {
            apt_purge(h, &installed)?;
        }
        must(h, &["rm", "-rf", "/var/lib/lxd"])?;
    }
    // The bridge's firewall table LXD leaves in the kernel once it is gone.
    if h.run(&["nft", "list", "table", "inet", "lxd"], None)?.ok() {
        must(h, &["nft", "delete", "table", "inet", "lxd"])?;
    }
    Ok(())
}

// tenant-firewall -----------------------------------------------------------------------

/// The ufw rules the firewall step added that ufw still holds, as `ufw` arguments.
fn our_ufw_rules(h: &mut dyn Host) -> Fallible<Vec<&'static [&'static str]>> {
    let added = h.run(&["ufw", "show", "added"], None)?;
    if !added.ok() {
        return Ok(Vec::new());
    }
    let have: Vec<&str> = added.stdout.lines().map(str::trim).collect();
    Ok(UFW_RULES
        .iter()
        .copied()
        .filter(|r| have.contains(&format!("ufw {}", r.join(" ")).as_str()))
        .collect())
}

/// ufw's forward policy as it was before the firewall step set ACCEPT, while the file still
/// holds that ACCEPT (a policy the owner changed since is theirs, and stays).
fn ufw_policy_to_restore(h: &mut dyn Host) -> Fallible<Option<String>> {
    let was = read_string(h, UFW_POLICY_WAS)?
        .and_then(|t| t.lines().next().map(|l| l.trim().to_owned()))
        .filter(|w| !w.is_empty() && w != "ACCEPT");
    if was.is_none() || forward_policy_in_file(h)?.as_deref() != Some("ACCEPT") {
        return Ok(None);
    }
    Ok(was)
}

fn firewall_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let mut needs = unit_leftovers(h, &[TENANT_FIREWALL])?;
    if h.run(&["nft", "list", "table", "inet", tenants::TABLE], None)?
        .ok()
    {
        needs.push(format!("delete the nftables table inet {}", tenants::TABLE));
    }
    if !our_ufw_rules(h)?.is_empty() {
        needs.push("delete the ufw rules for lxdbr0 and wg0".into());
    }
    if let Some(was) = ufw_policy_to_restore(h)? {
        needs.push(format!(
            "give {UFW_DEFAULTS} its DEFAULT_FORWARD_POLICY back ({was}, as before preparation)"
        ));
    }
    Ok(verdict(needs))
}

fn firewall_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    remove_units(h, &[TENANT_FIREWALL])?;
    debug_assert!(TENANT_FIREWALL_UNIT.ends_with(TENANT_FIREWALL));
    if h.run(&["nft", "list", "table", "inet", tenants::TABLE], None)?
        .ok()
    {
        must(h, &["nft", "delete", "table", "inet", tenants::TABLE])?;
    }
    h.remove(tenants::PATH)?;
    for rule in our_ufw_rules(h)? {
        // `ufw route delete allow …` for a route rule, `ufw delete allow …` for the others.
        let mut argv = vec!["ufw", "--force"];
        match rule.split_first() {
            Some((&"route", rest)) => {
                argv.extend(["route", "delete"]);
                argv.extend_from_slice(rest);
            }
            _ => {
                argv.push("delete");
                argv.extend_from_slice(rule);
            }
        }
        must(h, &argv)?;
    }
    if let Some(was) = ufw_policy_to_restore(h)? {
        let text = read_string(h, UFW_DEFAULTS)?.unwrap_or_default();
        let policy = (was != UFW_POLICY_UNSET).then_some(was.as_str());
        h.write(
            UFW_DEFAULTS,
            with_forward_policy(&text, policy).as_bytes(),
            0o644,
            "root:root",
        )?;
        // The file is what ufw applies: reloaded, the kernel's policy is the owner's again.
        if ufw_active(h)? {
            must(h, &["ufw", "reload"])?;
        }
    }
    Ok(())
}

// relay-peer ----------------------------------------------------------------------------

fn wg_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let mut needs = Vec::new();
    if exists(h, WG_CONF)? {
        needs.push(format!("remove {WG_CONF}"));
    }
    if unit_enabled(h, WG_UNIT)? || unit_active(h, WG_UNIT)? {
        needs.push(format!("stop and disable {WG_UNIT}"));
    }
    if h.run(&["ip", "link", "show", "wg0"], None)?.ok() {
        needs.push("take wg0 down".into());
    }
    Ok(verdict(needs))
}

fn wg_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    try_run(h, &["systemctl", "disable", "--now", WG_UNIT])?;
    try_run(h, &["systemctl", "reset-failed", WG_UNIT])?;
    h.remove(WG_CONF)?;
    if h.run(&["ip", "link", "show", "wg0"], None)?.ok() {
        must(h, &["ip", "link", "delete", "wg0"])?;
    }
    Ok(())
}

// tunnel --------------------------------------------------------------------------------

/// Whether /usr/local/bin/cloudflared is still the build operator-access installed.
fn our_cloudflared(h: &mut dyn Host) -> Fallible<bool> {
    use sha2::{Digest, Sha256};
    let Some(want) = read_string(h, CLOUDFLARED_INSTALLED)? else {
        return Ok(false);
    };
    let Some(bytes) = h.read(CLOUDFLARED_BIN)? else {
        return Ok(false);
    };
    Ok(hex::encode(Sha256::digest(&bytes)).eq_ignore_ascii_case(want.trim()))
}

fn tunnel_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let mut needs = unit_leftovers(h, &[TUNNEL_UNIT])?;
    if our_cloudflared(h)? {
        needs.push(format!(
            "remove {CLOUDFLARED_BIN} (operator-access installed it)"
        ));
    }
    Ok(verdict(needs))
}

fn tunnel_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    remove_units(h, &[TUNNEL_UNIT])?;
    if our_cloudflared(h)? {
        h.remove(CLOUDFLARED_BIN)?;
    }
    Ok(())
}

// spark-access --------------------------------------------------------------------------

fn spark_authorized_keys(h: &mut dyn Host) -> Fallible<String> {
    let home = home_of(h, SPARK)?.unwrap_or_else(|| format!("/home/{SPARK}"));
    Ok(format!("{home}/.ssh/authorized_keys"))
}

fn spark_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let mut needs = Vec::new();
    if exists(h, SUDOERS)? {
        needs.push(format!("remove {SUDOERS}"));
    }
    if user_exists(h, SPARK)? {
        let ak = spark_authorized_keys(h)?;
        if exists(h, &ak)? {
            needs.push(format!("remove {ak} (the operators' keys)"));
        }
        if exists(h, SPARK_CREATED)? {
            needs.push("delete the spark user (preparation created it)".into());
        }
    }
    Ok(verdict(needs))
}

fn spark_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    h.remove(SUDOERS)?;
    if user_exists(h, SPARK)? {
        let ak = spark_authorized_keys(h)?;
        h.remove(&ak)?;
        if exists(h, SPARK_CREATED)? {
            // --force: an operator's session may still be open; it ends with the account.
            must(h, &["userdel", "--force", "--remove", SPARK])?;
        }
    }
    Ok(())
}

// satellites ----------------------------------------------------------------------------

/// What a satellite runs of the steps above, in their order: it never had the agent's units,
/// a relay peer or a tunnel. spark's access and our files go after, in one root command.
const SATELLITE_STEPS: &[&str] = &[
    OWNER_RESTORE,
    "instances",
    "lxd-profile",
    "lxd",
    "tenant-firewall",
    "host-settings",
    "docker",
];

/// Where LXD answers on a satellite: Debian's package, else the snap.
const LXD_SOCKETS: [&str; 2] = [
    "/var/lib/lxd/unix.socket",
    "/var/snap/lxd/common/lxd/unix.socket",
];

fn peers(h: &mut dyn Host) -> Fallible<Vec<Peer>> {
    match read_string(h, PEER_FILE)? {
        None => Ok(Vec::new()),
        Some(text) => parse_peer_file(&text),
    }
}

fn satellites_skip(h: &mut dyn Host, plan: &Plan) -> Option<String> {
    if !plan.leave_satellites {
        return None;
    }
    let names: Vec<String> = peers(h)
        .ok()?
        .iter()
        .map(|p| format!("node{}", p.index))
        .collect();
    (!names.is_empty()).then(|| format!("--leave-satellites: {} stay prepared", names.join(", ")))
}

/// `peer` as spark with node0's peer key, on a connection of its own.
fn satellite(plan: &Plan, peer: &Peer) -> Fallible<SshHost> {
    let dir = plan.satellites.as_deref().ok_or_else(|| {
        format!(
            "node{} is this machine's satellite: run byo-agent uninstall on node0, which reaches it",
            peer.index
        )
    })?;
    satellite_host(dir, peer, SPARK, LXD_SOCKETS[0], false, false)
}

/// `peer` for its steps: one connection for their many commands, and LXD where it answers.
fn satellite_for_steps(plan: &Plan, peer: &Peer) -> Fallible<SshHost> {
    let mut host = satellite(plan, peer)?;
    host.control_path = plan
        .satellites
        .as_deref()
        .map(|d| d.join(format!("peer-{}-uninstall.ctl", peer.index)));
    if !exists(&mut host, LXD_SOCKETS[0])? && exists(&mut host, LXD_SOCKETS[1])? {
        host.lxd_socket = LXD_SOCKETS[1].to_owned();
    }
    Ok(host)
}

/// Whether `peer` still admits spark with node0's peer key, on a fresh connection: refused
/// means handed back already. A satellite that cannot be reached at all is an error, never
/// read as handed back.
fn admits_spark(plan: &Plan, peer: &Peer) -> Fallible<bool> {
    match satellite(plan, peer).and_then(|mut h| h.run(&["true"], None)) {
        Ok(out) => Ok(out.ok()),
        Err(e) if e.contains("Permission denied") => Ok(false),
        Err(e) => Err(format!(
            "{e}. Switch node{} on and run uninstall again, or hand node0 back alone with --leave-satellites",
            peer.index
        )),
    }
}

/// The plan a satellite's own subset runs with: its owner is the login peer-access recorded
/// there; LXD and Docker as node0 was asked.
fn satellite_plan(node: &mut dyn Host, plan: &Plan) -> Fallible<Plan> {
    let owner = read_string(node, OWNER_FILE)?
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty());
    Ok(Plan {
        keep_lxd: plan.keep_lxd,
        owner,
        restore_docker: plan.restore_docker,
        satellites: None,
        leave_satellites: false,
        progress: None,
    })
}

fn run_satellite(
    node: &mut SshHost,
    sub: &Plan,
    mode: Mode,
    report: impl FnMut(Progress),
) -> Outcome {
    let all = steps(sub);
    let refs: Vec<&dyn Step<SshHost>> = all
        .iter()
        .filter(|s| SATELLITE_STEPS.contains(&s.name))
        .map(|s| s as &dyn Step<SshHost>)
        .collect();
    byo_core::prepare::run(
        &refs,
        node,
        0,
        "uninstall",
        None,
        mode,
        chrono::Utc::now,
        report,
    )
}

fn satellites_check(h: &mut dyn Host, plan: &Plan) -> Fallible<Check> {
    let mut needs = Vec::new();
    for peer in peers(h)? {
        if !admits_spark(plan, &peer)? {
            continue;
        }
        let mut node = satellite_for_steps(plan, &peer)?;
        let sub = satellite_plan(&mut node, plan)?;
        let out = run_satellite(&mut node, &sub, Mode::DryRun, |_| {});
        // The owner's proof is the one failure worth saying now; a later step's check may
        // fail only because an earlier one has not applied yet.
        if let Some((step, e)) = &out.failed
            && step == OWNER_RESTORE
        {
            return Err(format!("node{} {step}: {e}", peer.index));
        }
        let mut what: Vec<String> = out.changes.into_iter().map(|(s, _)| s).collect();
        what.push("spark-access".into());
        what.push("agent-files".into());
        needs.push(format!("hand node{} back: {}", peer.index, what.join(", ")));
    }
    Ok(verdict(needs))
}

fn satellites_apply(h: &mut dyn Host, plan: &Plan) -> Fallible<()> {
    for peer in peers(h)? {
        if !admits_spark(plan, &peer)? {
            continue;
        }
        let mut node = satellite_for_steps(plan, &peer)?;
        let sub = satellite_plan(&mut node, plan)?;
        let index = peer.index;
        let out = run_satellite(&mut node, &sub, Mode::Run, |p| {
            if let (Some(say), Some(line)) = (plan.progress, describe(&p)) {
                say(format!("    node{index} {}", line.trim_start()));
            }
        });
        if let Some((step, e)) = out.failed {
            return Err(format!("node{index} stopped at {step}: {e}"));
        }
        let handed = hand_back_spark(&mut node);
        drop(node);
        if admits_spark(plan, &peer)? {
            return Err(format!(
                "node{index} still admits spark after its access was taken away{}",
                handed.err().map(|e| format!(": {e}")).unwrap_or_default()
            ));
        }
        if let Some(say) = plan.progress {
            say(format!("    node{index} {:<16} removed", "spark-access"));
        }
    }
    Ok(())
}

/// spark's access and our files on a satellite, in one root command, since after it spark
/// runs nothing more there: its key, our directories, its sudoers drop-in, and the account
/// itself when preparation created it — what spark-access and agent-files take on node0.
fn hand_back_spark(node: &mut dyn Host) -> Fallible<()> {
    let created = exists(node, SPARK_CREATED)?;
    let mut script = format!(
        "set -e\nrm -f -- {}\n",
        shell_quote(&spark_authorized_keys(node)?)
    );
    for dir in AGENT_DIRS {
        script.push_str(&format!("rm -rf -- {}\n", shell_quote(dir)));
    }
    script.push_str(&format!("rm -f -- {}\n", shell_quote(SUDOERS)));
    if created {
        // --force: this very session is spark's.
        script.push_str(&format!("userdel --force --remove {SPARK}\n"));
    }
    must(node, &["sh", "-c", &script]).map(drop)
}

// host-settings -------------------------------------------------------------------------

const SETTINGS: &[&str] = &[
    ZFS_CONF,
    WATCHDOG_CONF,
    byo_core::render::units::NETPLAN_RAILS,
    SYSCTL_RAILS,
    SYSCTL_PING,
];

/// The (port, address) pairs rail-network's netplan file gives (`render_rails`' shape).
fn rail_addresses(netplan: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut port = None;
    for line in netplan.lines() {
        let t = line.trim();
        if line.starts_with("    ") && !line.starts_with("      ") && t.ends_with(':') {
            port = Some(t.trim_end_matches(':').to_owned());
        } else if let (Some(p), Some(list)) = (&port, t.strip_prefix("addresses: [")) {
            for a in list.trim_end_matches(']').split(',') {
                let a = a.trim().trim_matches('"');
                if !a.is_empty() {
                    out.push((p.clone(), a.to_owned()));
                }
            }
        }
    }
    out
}

fn fstab_restored(h: &mut dyn Host) -> Fallible<Option<String>> {
    let Some(fstab) = read_string(h, "/etc/fstab")? else {
        return Ok(None);
    };
    if !fstab.lines().any(|l| l.starts_with(SWAP_DISABLED)) {
        return Ok(None);
    }
    Ok(Some(
        fstab
            .lines()
            .map(|l| format!("{}\n", l.strip_prefix(SWAP_DISABLED).unwrap_or(l)))
            .collect(),
    ))
}

/// The swap devices swap-off turned off that are there and still off.
fn swap_to_turn_on(h: &mut dyn Host) -> Fallible<Vec<String>> {
    let recorded = read_string(h, SWAP_WAS_ON)?.unwrap_or_default();
    let on = swaps(h)?;
    let mut off = Vec::new();
    for dev in recorded.lines().map(str::trim).filter(|d| !d.is_empty()) {
        if !on.iter().any(|o| o == dev) && exists(h, dev)? {
            off.push(dev.to_owned());
        }
    }
    Ok(off)
}

fn settings_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let mut needs = Vec::new();
    for f in SETTINGS {
        if exists(h, f)? {
            needs.push(format!("remove {f}"));
        }
    }
    if fstab_restored(h)?.is_some() {
        needs.push("give /etc/fstab its swap lines back".into());
    }
    let off = swap_to_turn_on(h)?;
    if !off.is_empty() {
        needs.push(format!("turn swap back on ({})", off.join(", ")));
    }
    Ok(verdict(needs))
}

fn settings_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    let watchdog = exists(h, WATCHDOG_CONF)?;
    // A pair's rails: the addresses rail-network gave the ports go with its file (networkd
    // leaves a port it no longer configures as it is); its ARP and ping settings hold until
    // the next boot.
    let netplan = read_string(h, byo_core::render::units::NETPLAN_RAILS)?.unwrap_or_default();
    for (port, address) in rail_addresses(&netplan) {
        try_run(h, &["ip", "addr", "del", &address, "dev", &port])?;
    }
    for f in SETTINGS {
        h.remove(f)?;
    }
    if watchdog {
        must(h, &["systemctl", "daemon-reexec"])?;
    }
    if let Some(text) = fstab_restored(h)? {
        h.write("/etc/fstab", text.as_bytes(), 0o644, "root:root")?;
    }
    for dev in swap_to_turn_on(h)? {
        must(h, &["swapon", &dev]).map_err(|e| {
            format!("swap on {dev} would not come back on ({e}); its /etc/fstab line is back, so the next boot turns it on")
        })?;
    }
    Ok(())
}

// docker --------------------------------------------------------------------------------

/// The Docker packages docker-purge removed that are not installed now.
fn docker_removed(h: &mut dyn Host) -> Fallible<Vec<String>> {
    let recorded = read_string(h, DOCKER_REMOVED)?.unwrap_or_default();
    let mut gone = Vec::new();
    for p in recorded.lines().map(str::trim).filter(|p| !p.is_empty()) {
        if !package_installed(h, p)? {
            gone.push(p.to_owned());
        }
    }
    Ok(gone)
}

/// Asked (`--restore-docker`), the packages go back; unasked, the step says how to have them.
fn docker_skip(h: &mut dyn Host, plan: &Plan) -> Option<String> {
    if plan.restore_docker {
        return None;
    }
    let gone = docker_removed(h).ok().filter(|g| !g.is_empty())?;
    Some(format!(
        "preparation removed Docker ({list}); it is put back only when asked (--restore-docker). To have it back now: sudo apt-get install {list_sp}",
        list = gone.join(", "),
        list_sp = gone.join(" ")
    ))
}

fn docker_check(h: &mut dyn Host, plan: &Plan) -> Fallible<Check> {
    if !plan.restore_docker {
        return Ok(Check::Satisfied);
    }
    let gone = docker_removed(h)?;
    Ok(verdict(if gone.is_empty() {
        vec![]
    } else {
        vec![format!(
            "reinstall {} (preparation removed it; --restore-docker)",
            gone.join(", ")
        )]
    }))
}

fn docker_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    let gone = docker_removed(h)?;
    let names: Vec<&str> = gone.iter().map(String::as_str).collect();
    if !names.is_empty() {
        crate::host::apt_install(h, &names)?;
    }
    Ok(())
}

// agent-files ---------------------------------------------------------------------------

fn files_check(h: &mut dyn Host, _: &Plan) -> Fallible<Check> {
    let mut left = Vec::new();
    for p in AGENT_DIRS.iter().chain(AGENT_BINS) {
        if exists(h, p)? {
            left.push(*p);
        }
    }
    Ok(verdict(if left.is_empty() {
        vec![]
    } else {
        vec![format!("remove {}", left.join(", "))]
    }))
}

fn files_apply(h: &mut dyn Host, _: &Plan) -> Fallible<()> {
    // The credentials first, the binary last: a run cut short here still has the agent to
    // finish with.
    for p in AGENT_DIRS.iter().chain(AGENT_BINS) {
        must(h, &["rm", "-rf", p])?;
    }
    Ok(())
}

// --- the run ---------------------------------------------------------------------------

/// How a step's progress is printed: one line per step, in words for an owner.
pub fn describe(p: &Progress) -> Option<String> {
    let s = &p.state;
    let what = match s.state {
        StepState::Applying => return None,
        StepState::Satisfied => "nothing to do".to_owned(),
        StepState::Applied if s.step == OWNER_RESTORE => "restored and verified".to_owned(),
        StepState::Applied => "removed".to_owned(),
        StepState::Skipped => format!("skipped: {}", s.error.as_deref().unwrap_or_default()),
        StepState::Checking => s.error.clone().unwrap_or_default(),
        StepState::Failed => format!("FAILED: {}", s.error.as_deref().unwrap_or_default()),
    };
    Some(format!("  {:<16} {what}", s.step))
}

/// The removal steps' checks alone: what of ours is on this host (empty: nothing).
pub fn survey<H: Host>(host: &mut H, plan: &Plan) -> Vec<(String, String)> {
    let all = steps(plan);
    let refs: Vec<&dyn Step<H>> = all[1..].iter().map(|s| s as &dyn Step<H>).collect();
    let mut out = byo_core::prepare::run(
        &refs,
        host,
        0,
        "uninstall",
        None,
        Mode::DryRun,
        chrono::Utc::now,
        |_| {},
    );
    if let Ok(true) = exists(host, LOCKOUT_CONF) {
        out.changes
            .insert(0, (OWNER_RESTORE.into(), format!("remove {LOCKOUT_CONF}")));
    }
    out.changes
}

/// Every step in order on `host`: the owner first, then each removal. `report` sees each
/// step's progress.
pub fn uninstall<H: Host>(
    host: &mut H,
    plan: &Plan,
    report: impl FnMut(Progress),
) -> Result<Outcome, UninstallError> {
    let all = steps(plan);
    let refs: Vec<&dyn Step<H>> = all.iter().map(|s| s as &dyn Step<H>).collect();
    let outcome = byo_core::prepare::run(
        &refs,
        host,
        0,
        "uninstall",
        None,
        Mode::Run,
        chrono::Utc::now,
        report,
    );
    match &outcome.failed {
        None => Ok(outcome),
        Some((step, error)) if step == OWNER_RESTORE => {
            Err(UninstallError::OwnerNotRestored(error.clone()))
        }
        Some((step, error)) => Err(UninstallError::Stopped {
            step: step.clone(),
            error: error.clone(),
        }),
    }
}

/// The owner: `--owner`, else install.sh's record, else whoever ran this through sudo.
pub fn resolve_owner<H: Host>(host: &mut H, given: Option<String>) -> Option<String> {
    given
        .or_else(|| {
            read_string(host, OWNER_FILE)
                .ok()
                .flatten()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .or_else(|| {
            std::env::var("SUDO_USER")
                .ok()
                .filter(|u| !u.is_empty() && u != "root")
        })
}

/// `byo-agent uninstall`, as root on node0.
pub fn run(
    keep_lxd: bool,
    restore_docker: bool,
    leave_satellites: bool,
    yes: bool,
    owner: Option<String>,
) -> Result<(), UninstallError> {
    let mut host = LocalHost::default();
    let uid = host
        .run(&["id", "-u"], None)
        .map(|o| o.stdout.trim().to_owned())
        .unwrap_or_default();
    if uid != "0" {
        return Err(UninstallError::Refused(
            "run as root: sudo byo-agent uninstall".into(),
        ));
    }
    let plan = Plan {
        keep_lxd,
        owner: resolve_owner(&mut host, owner),
        restore_docker,
        satellites: Some("/etc/enverge".into()),
        leave_satellites,
        progress: Some(|line| println!("{line}")),
    };
    let found = survey(&mut host, &plan);
    if found.is_empty() {
        println!("nothing of byo's is on this machine: nothing to uninstall");
        return Ok(());
    }
    println!(
        "byo's agent is on this machine. Uninstalling gives {} their login back first, and proves it, then removes:",
        plan.owner.as_deref().unwrap_or("the owner")
    );
    for (step, what) in &found {
        println!("  {step:<16} {what}");
    }
    if plan.keep_lxd {
        println!("LXD and its images stay (--keep-lxd).");
    }
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(UninstallError::Refused(
                "not confirmed: run again with --yes to go ahead".into(),
            ));
        }
        print!("Type yes to go ahead: ");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if answer.trim() != "yes" {
            return Err(UninstallError::Refused(
                "not confirmed: nothing was changed".into(),
            ));
        }
    }
    // Read before the uninstall removes them: the server is told last (issue #39, 3).
    let server = reporter_of(&mut host);
    let started = std::time::Instant::now();
    let outcome = uninstall(&mut host, &plan, |p| {
        if let Some(line) = describe(&p) {
            println!("{line}");
        }
    })?;
    println!(
        "uninstalled in {:.1} s ({} steps changed something). {} administers this machine again; byo's agent, units, tunnel, relay peer, firewall and spark's access are gone.",
        started.elapsed().as_secs_f64(),
        outcome.changes.len(),
        plan.owner.as_deref().unwrap_or("the owner"),
    );
    match server.map(|r| r.uninstalled()) {
        Some(Ok(())) => println!(
            "the server was told: it stops this host, ends its instances and retires it (its relay, address, tunnel and names handed back) within minutes"
        ),
        Some(Err(e)) => println!(
            "the server could not be told ({e}): it retires this host on its own once it has been silent for a day"
        ),
        None => {}
    }
    Ok(())
}

/// The backend this host enrolled with and its host token, while both are still on disk.
fn reporter_of<H: Host>(host: &mut H) -> Option<crate::report::Reporter> {
    let server = read_string(host, SERVER_FILE).ok().flatten()?;
    let kept = read_string(host, CREDENTIALS).ok().flatten()?;
    let creds: byo_wire::enroll::EnrollResponse = serde_json::from_str(&kept).ok()?;
    crate::report::Reporter::new(server.trim(), &creds.host_token).ok()
}

#[cfg(test)]
mod tests {
    /// Every unit an install writes is one uninstall removes: a unit added to
    /// `units()` and forgotten here would stay on the owner's machine.
    #[test]
    fn uninstall_removes_every_unit_an_install_writes() {
        for (name, _) in byo_core::render::units::units("/usr/local/bin/byo-agent") {
            assert!(super::AGENT_UNITS.contains(&name), "{name} is left behind");
        }
    }
}
