//! The 19 steps. Each is a check (reads only), an apply, and sometimes a skip with its
//! reason; all of them act through [`Host`], so the same code prepares node0, a satellite
//! over SSH and the simulated Spark. Where a landmine's failure would surface somewhere
//! that does not name it, the step that fails says what caused it.

use byo_core::prepare::{Check, Step};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{OWNER_FILE, Plan, image, peers};
use crate::host::{
    self, Fallible, Host, apt_install, apt_purge, exists, must, package_installed, read_string,
    unit_active, unit_enabled, user_exists, user_groups,
};
use crate::lxd;

/// The one administrator of a BYO host: every operator logs in as spark (I).
pub const SPARK: &str = "spark";
pub const PROFILE_NAME: &str = "lofispark-base";
const POOL: &str = "default";
const BRIDGE: &str = "lxdbr0";
const SUDOERS: &str = "/etc/sudoers.d/enverge-spark";
const SUDOERS_LINE: &str = "spark ALL=(ALL) NOPASSWD:ALL\n";
const TUNNEL_TOKEN: &str = "/etc/enverge/tunnel-token";
const TUNNEL_UNIT: &str = "enverge-tunnel.service";
const EARLYOOM_DEFAULTS: &str = "/etc/default/earlyoom";
const EARLYOOM_ARGS: &str =
    "EARLYOOM_ARGS=\"-m 5 -r 3600 --avoid '(^|/)(sshd|systemd|lxd|byo-agent)$'\"\n";
const WATCHDOG_CONF: &str = "/etc/systemd/system.conf.d/enverge-watchdog.conf";
const WATCHDOG: &str = "[Manager]\nRuntimeWatchdogSec=30s\nRebootWatchdogSec=10min\n";
const ZFS_CONF: &str = "/etc/modprobe.d/enverge-zfs.conf";
const ZFS_ARC_MAX: &str = "/sys/module/zfs/parameters/zfs_arc_max";
const UFW_DEFAULTS: &str = "/etc/default/ufw";
const WG_CONF: &str = "/etc/wireguard/wg0.conf";
const WG_UNIT: &str = "wg-quick@wg0.service";
/// The tunnel's range (10.8.0.1 the relay, 10.8.0.2 the host).
const TUNNEL_NET: (u32, u32) = (0x0A08_0000, 24);
const LOCKOUT_CONF: &str = "/etc/ssh/sshd_config.d/00-enverge-lockout.conf";
const LOCKOUT: &str =
    "# Written by enverge preparation (owner-lockout): one administrator, us.\nAllowUsers spark\n";
const ADMIN_GROUPS: &[&str] = &["sudo", "admin", "wheel", "lxd", "docker"];
const DOCKER_PACKAGES: &[&str] = &[
    "docker.io",
    "docker-ce",
    "docker-ce-cli",
    "docker-ce-rootless-extras",
    "docker-buildx-plugin",
    "docker-compose-plugin",
    "containerd.io",
];
/// Candidate bridge ranges; the first that collides with nothing on the host is used
/// (LXD's own auto-selection fails when nested, and a home LAN may hold any of them).
const BRIDGE_CANDIDATES: &[&str] = &[
    "10.117.0.1/24",
    "10.118.0.1/24",
    "10.119.0.1/24",
    "172.31.250.1/24",
];
/// The rules a default-deny ufw needs so the bridge's DHCP and DNS, forwarded container
/// traffic, and the relay's packets through wg0 get through.
const UFW_RULES: &[&[&str]] = &[
    &["allow", "in", "on", "lxdbr0"],
    &["route", "allow", "in", "on", "lxdbr0"],
    &["route", "allow", "out", "on", "lxdbr0"],
    &["allow", "in", "on", "wg0"],
    &["route", "allow", "in", "on", "wg0"],
];

/// The names, in order. Named rather than numbered: a step inserted in the middle
/// renumbers nothing a reader trusts.
pub const STEP_NAMES: &[&str] = &[
    "operator-access",
    "docker-purge",
    "swap-off",
    "earlyoom",
    "watchdog",
    "zfs-arc-cap",
    "lxd-install",
    "storage-pool",
    "lxd-network",
    "firewall",
    "profiles",
    "base-image",
    "relay-peer",
    "peer-access",
    "satellites",
    "rail-network",
    "rail-verify",
    "owner-lockout",
    "self-check",
];

type CheckFn<H> = fn(&mut H, &Plan) -> Fallible<Check>;
type ApplyFn<H> = fn(&mut H, &Plan) -> Fallible<()>;
type SkipFn<H> = fn(&mut H, &Plan) -> Option<String>;

struct Def<'p, H> {
    name: &'static str,
    check: CheckFn<H>,
    apply: ApplyFn<H>,
    skip: SkipFn<H>,
    plan: &'p Plan,
}

impl<H> Step<H> for Def<'_, H> {
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

fn never<H>(_: &mut H, _: &Plan) -> Option<String> {
    None
}

fn single<H>(_: &mut H, plan: &Plan) -> Option<String> {
    (plan.profile.node_count <= 1).then(|| "a single Spark: no satellites, no rails".to_owned())
}

fn nothing_to_apply<H>(_: &mut H, _: &Plan) -> Fallible<()> {
    Err("this step has nothing to apply".into())
}

pub(super) fn all<'p, H: Host + 'p>(plan: &'p Plan) -> Vec<Box<dyn Step<H> + 'p>> {
    let d =
        |name, check: CheckFn<H>, apply: ApplyFn<H>, skip: SkipFn<H>| -> Box<dyn Step<H> + 'p> {
            Box::new(Def {
                name,
                check,
                apply,
                skip,
                plan,
            })
        };
    let list = vec![
        d(
            "operator-access",
            operator_access_check,
            operator_access_apply,
            never,
        ),
        d(
            "docker-purge",
            docker_purge_check,
            docker_purge_apply,
            never,
        ),
        d("swap-off", swap_off_check, swap_off_apply, never),
        d("earlyoom", earlyoom_check, earlyoom_apply, never),
        d("watchdog", watchdog_check, watchdog_apply, watchdog_skip),
        d("zfs-arc-cap", zfs_arc_cap_check, zfs_arc_cap_apply, never),
        d("lxd-install", lxd_install_check, lxd_install_apply, never),
        d(
            "storage-pool",
            storage_pool_check,
            storage_pool_apply,
            never,
        ),
        d("lxd-network", lxd_network_check, lxd_network_apply, never),
        d("firewall", firewall_check, firewall_apply, never),
        d("profiles", profiles_check, profiles_apply, never),
        d("base-image", image::check, image::apply, never),
        d("relay-peer", relay_peer_check, relay_peer_apply, never),
        d(
            "peer-access",
            peers::peer_access_check,
            peers::peer_access_apply,
            single,
        ),
        d(
            "satellites",
            peers::satellites_check,
            peers::satellites_apply,
            single,
        ),
        d(
            "rail-network",
            peers::rail_network_check,
            peers::rail_network_apply,
            single,
        ),
        d(
            "rail-verify",
            peers::rail_verify_check,
            nothing_to_apply,
            single,
        ),
        d(
            "owner-lockout",
            owner_lockout_check,
            owner_lockout_apply,
            owner_lockout_skip,
        ),
        d("self-check", self_check, nothing_to_apply, never),
    ];
    debug_assert!(list.iter().map(|s| s.name()).eq(STEP_NAMES.iter().copied()));
    list
}

pub(super) fn verdict(needs: Vec<String>) -> Check {
    if needs.is_empty() {
        Check::Satisfied
    } else {
        Check::Needs(needs.join("; "))
    }
}

fn file_is<H: Host>(h: &mut H, path: &str, want: &str) -> Fallible<bool> {
    Ok(read_string(h, path)?.as_deref() == Some(want))
}

// --- operator-access -----------------------------------------------------------------------

fn authorized_keys_path<H: Host>(h: &mut H) -> Fallible<String> {
    let home = host::home_of(h, SPARK)?.unwrap_or_else(|| format!("/home/{SPARK}"));
    Ok(format!("{home}/.ssh/authorized_keys"))
}

/// Proof that operators can administer this host: spark exists, sudo works for it without
/// a password, sshd accepts its keys, and its authorized_keys holds the operator list.
pub(super) fn operator_access_problems<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Vec<String>> {
    let keys = plan.authorized_keys.as_deref().ok_or(
        "no operator-key list is kept on this host (enrolment delivers it): nobody could administer it",
    )?;
    let mut needs = Vec::new();
    if !user_exists(h, SPARK)? {
        needs.push("create the spark user".to_owned());
        return Ok(needs);
    }
    if !file_is(h, SUDOERS, SUDOERS_LINE)? {
        needs.push(format!("write {SUDOERS}"));
    } else if !h
        .run(&["runuser", "-u", SPARK, "--", "sudo", "-n", "true"], None)?
        .ok()
    {
        needs.push("spark cannot sudo without a password".to_owned());
    }
    let ak = authorized_keys_path(h)?;
    if read_string(h, &ak)?.as_deref() != Some(keys) {
        needs.push(format!("write the operator keys to {ak}"));
    }
    let sshd = h.run(
        &[
            "sshd",
            "-T",
            "-C",
            "user=spark,host=localhost,addr=127.0.0.1",
        ],
        None,
    )?;
    if !sshd.ok() {
        needs.push("install and configure openssh-server".to_owned());
    } else {
        let conf = sshd.stdout.to_ascii_lowercase();
        if !conf.lines().any(|l| l.trim() == "pubkeyauthentication yes") {
            needs.push("sshd does not accept public keys".to_owned());
        }
        if let Some(allowed) = conf.lines().find(|l| l.starts_with("allowusers "))
            && !allowed.split_whitespace().skip(1).any(|u| u == SPARK)
        {
            needs.push(format!("sshd admits only {allowed}"));
        }
        if !(unit_active(h, "ssh.service")? || unit_active(h, "sshd.service")?) {
            needs.push("start sshd".to_owned());
        }
    }
    if let Some(token) = &plan.tunnel_token {
        if read_string(h, TUNNEL_TOKEN)?.as_deref() != Some(token.as_str()) {
            needs.push("keep the tunnel connector token".to_owned());
        }
        if !unit_active(h, TUNNEL_UNIT)? {
            needs.push("run cloudflared (the operator tunnel)".to_owned());
        }
    }
    Ok(needs)
}

fn operator_access_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    operator_access_problems(h, plan).map(verdict)
}

pub(super) fn operator_access_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    let keys = plan.authorized_keys.clone().unwrap_or_default();
    if !user_exists(h, SPARK)? {
        must(
            h,
            &[
                "useradd",
                "--create-home",
                "--user-group",
                "--shell",
                "/bin/bash",
                SPARK,
            ],
        )?;
    }
    // A sudoers file that does not parse breaks sudo for everyone: validate before it lands.
    let staging = format!("/etc/enverge/{}.check", "sudoers-spark");
    h.write(&staging, SUDOERS_LINE.as_bytes(), 0o440, "root:root")?;
    let valid = must(h, &["visudo", "-cf", &staging]);
    h.remove(&staging)?;
    valid?;
    h.write(SUDOERS, SUDOERS_LINE.as_bytes(), 0o440, "root:root")?;
    if !h
        .run(
            &[
                "sshd",
                "-T",
                "-C",
                "user=spark,host=localhost,addr=127.0.0.1",
            ],
            None,
        )?
        .ok()
    {
        apt_install(h, &["openssh-server"])?;
    }
    let ak = authorized_keys_path(h)?;
    let dir = ak.trim_end_matches("/authorized_keys").to_owned();
    must(
        h,
        &[
            "install", "-d", "-m", "0700", "-o", SPARK, "-g", SPARK, &dir,
        ],
    )?;
    h.write(&ak, keys.as_bytes(), 0o600, "spark:spark")?;
    for unit in ["ssh.service", "sshd.service"] {
        if h.run(&["systemctl", "enable", "--now", unit], None)?.ok() {
            break;
        }
    }
    if let Some(token) = &plan.tunnel_token {
        h.write(TUNNEL_TOKEN, token.as_bytes(), 0o600, "root:root")?;
        if !h.run(&["cloudflared", "--version"], None)?.ok() {
            apt_install(h, &["cloudflared"]).map_err(|e| {
                format!("cloudflared (the operator tunnel) could not be installed: {e}")
            })?;
        }
        let unit = "[Unit]\nDescription=Enverge operator tunnel (cloudflared)\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nExecStart=/usr/bin/cloudflared tunnel --no-autoupdate run --token-file /etc/enverge/tunnel-token\nRestart=always\nRestartSec=5\n\n[Install]\nWantedBy=multi-user.target\n";
        h.write(
            &format!("/etc/systemd/system/{TUNNEL_UNIT}"),
            unit.as_bytes(),
            0o644,
            "root:root",
        )?;
        must(h, &["systemctl", "daemon-reload"])?;
        must(h, &["systemctl", "enable", "--now", TUNNEL_UNIT])?;
    }
    Ok(())
}

// --- docker-purge ----------------------------------------------------------------------------

fn forward_policy<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    let out = h.run(&["iptables", "-S", "FORWARD"], None)?;
    Ok(out
        .ok()
        .then(|| {
            out.stdout
                .lines()
                .find_map(|l| l.strip_prefix("-P FORWARD ").map(|p| p.trim().to_owned()))
        })
        .flatten())
}

fn docker_installed<H: Host>(h: &mut H) -> Fallible<Vec<&'static str>> {
    let mut found = Vec::new();
    for p in DOCKER_PACKAGES {
        if package_installed(h, p)? {
            found.push(*p);
        }
    }
    Ok(found)
}

fn docker_purge_check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
    let mut needs = Vec::new();
    let installed = docker_installed(h)?;
    if !installed.is_empty() {
        needs.push(format!("purge {}", installed.join(", ")));
    }
    if forward_policy(h)?.as_deref() == Some("DROP") {
        needs.push(
            "set the iptables FORWARD policy back to ACCEPT (Docker's DROP breaks lxdbr0's NAT)"
                .to_owned(),
        );
    }
    if h.run(&["ip", "link", "show", "docker0"], None)?.ok() {
        needs.push("remove the docker0 bridge".to_owned());
    }
    Ok(verdict(needs))
}

fn docker_purge_apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
    let installed = docker_installed(h)?;
    if !installed.is_empty() {
        let _ = h.run(
            &[
                "systemctl",
                "disable",
                "--now",
                "docker.socket",
                "docker.service",
                "containerd.service",
            ],
            None,
        )?;
        apt_purge(h, &installed)?;
    }
    if forward_policy(h)?.as_deref() == Some("DROP") {
        must(h, &["iptables", "-P", "FORWARD", "ACCEPT"])?;
    }
    if h.run(&["ip", "link", "show", "docker0"], None)?.ok() {
        must(h, &["ip", "link", "delete", "docker0"])?;
    }
    Ok(())
}

// --- swap-off, earlyoom, watchdog ------------------------------------------------------------

/// Active swap devices, from /proc/swaps.
fn swaps<H: Host>(h: &mut H) -> Fallible<Vec<String>> {
    Ok(read_string(h, "/proc/swaps")?
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect())
}

fn fstab_swap_lines(fstab: &str) -> Vec<&str> {
    fstab
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            !l.trim_start().starts_with('#') && f.get(2) == Some(&"swap")
        })
        .collect()
}

fn swap_off_check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
    let mut needs = Vec::new();
    let on = swaps(h)?;
    if !on.is_empty() {
        needs.push(format!("turn off swap on {}", on.join(", ")));
    }
    let fstab = read_string(h, "/etc/fstab")?.unwrap_or_default();
    if !fstab_swap_lines(&fstab).is_empty() {
        needs.push(
            "comment out the swap lines in /etc/fstab, so a reboot does not turn it back on"
                .to_owned(),
        );
    }
    Ok(verdict(needs))
}

fn swap_off_apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
    must(h, &["swapoff", "-a"])?;
    if let Some(fstab) = read_string(h, "/etc/fstab")? {
        let swap = fstab_swap_lines(&fstab);
        if !swap.is_empty() {
            let text: String = fstab
                .lines()
                .map(|l| {
                    if swap.contains(&l) {
                        format!("# disabled by enverge (swap disarms earlyoom): {l}\n")
                    } else {
                        format!("{l}\n")
                    }
                })
                .collect();
            h.write("/etc/fstab", text.as_bytes(), 0o644, "root:root")?;
        }
    }
    Ok(())
}

/// earlyoom acts only when MemAvailable AND free swap are both low: with swap on it never
/// fires on a GPU runaway, which cannot be swapped.
fn earlyoom_disarmed<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    let on = swaps(h)?;
    Ok((!on.is_empty()).then(|| {
        format!(
            "earlyoom would be disarmed: it acts only when MemAvailable AND free swap are both low, and swap is on ({}); a GPU runaway cannot be swapped, so swap-off must run first",
            on.join(", ")
        )
    }))
}

fn earlyoom_check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
    if let Some(why) = earlyoom_disarmed(h)? {
        return Ok(Check::Needs(why));
    }
    let mut needs = Vec::new();
    if !package_installed(h, "earlyoom")? {
        needs.push("install earlyoom".to_owned());
    }
    if !file_is(h, EARLYOOM_DEFAULTS, EARLYOOM_ARGS)? {
        needs.push(format!("write {EARLYOOM_DEFAULTS}"));
    }
    if !unit_active(h, "earlyoom.service")? || !unit_enabled(h, "earlyoom.service")? {
        needs.push("enable and start earlyoom".to_owned());
    }
    Ok(verdict(needs))
}

fn earlyoom_apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
    if let Some(why) = earlyoom_disarmed(h)? {
        return Err(why);
    }
    if !package_installed(h, "earlyoom")? {
        apt_install(h, &["earlyoom"])?;
    }
    h.write(
        EARLYOOM_DEFAULTS,
        EARLYOOM_ARGS.as_bytes(),
        0o644,
        "root:root",
    )?;
    must(h, &["systemctl", "enable", "earlyoom.service"])?;
    must(h, &["systemctl", "restart", "earlyoom.service"]).map(drop)
}

fn watchdog_skip<H: Host>(h: &mut H, _: &Plan) -> Option<String> {
    match exists(h, "/dev/watchdog") {
        Ok(true) => None,
        Ok(false) => Some("no hardware watchdog on this board (/dev/watchdog is absent)".into()),
        Err(e) => Some(format!("could not look for /dev/watchdog: {e}")),
    }
}

fn watchdog_check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
    Ok(verdict(if file_is(h, WATCHDOG_CONF, WATCHDOG)? {
        vec![]
    } else {
        vec![format!("arm systemd's hardware watchdog ({WATCHDOG_CONF})")]
    }))
}

fn watchdog_apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
    h.write(WATCHDOG_CONF, WATCHDOG.as_bytes(), 0o644, "root:root")?;
    must(h, &["systemctl", "daemon-reexec"]).map(drop)
}

// --- zfs-arc-cap, lxd-install ------------------------------------------------------------------

fn zfs_arc_cap_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    let want = plan.profile.prepare.zfs_arc_max;
    if !file_is(h, ZFS_CONF, &format!("options zfs zfs_arc_max={want}\n"))? {
        return Ok(Check::Needs(format!(
            "cap the ZFS ARC at {want} bytes in {ZFS_CONF}"
        )));
    }
    // modprobe.d binds at module load: a zfs already loaded ignores the file.
    if let Some(live) = read_string(h, ZFS_ARC_MAX)? {
        let live = live.trim();
        if live.parse::<u64>().ok() != Some(want) {
            return Err(format!(
                "zfs is already loaded with zfs_arc_max={live}: modprobe.d binds at module load, so the cap takes effect only after a reboot. zfs-arc-cap must run before lxd-install, which loads zfs even for a non-zfs pool"
            ));
        }
    }
    Ok(Check::Satisfied)
}

fn zfs_arc_cap_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    let text = format!(
        "options zfs zfs_arc_max={}\n",
        plan.profile.prepare.zfs_arc_max
    );
    h.write(ZFS_CONF, text.as_bytes(), 0o644, "root:root")
}

/// What an LXD step would do on a host where LXD is not installed yet (a dry run).
pub(super) const NEEDS_LXD: &str = "everything: LXD is not installed yet";

pub(super) fn lxd_answers<H: Host>(h: &mut H) -> bool {
    matches!(lxd::get(h, "/1.0"), Ok(Some(_)))
}

fn lxd_install_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    let mut needs = Vec::new();
    if !lxd_answers(h) {
        needs.push(match plan.profile.prepare.lxd.as_str() {
            "snap" => "install LXD (snap)".to_owned(),
            other => format!("install LXD ({other}: this profile's alternative to the snap)"),
        });
    }
    if !user_groups(h, SPARK)?.iter().any(|g| g == "lxd") {
        needs.push("add spark to the lxd group (serving talks to LXD as spark)".to_owned());
    }
    Ok(verdict(needs))
}

fn lxd_install_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    if !lxd_answers(h) {
        match plan.profile.prepare.lxd.as_str() {
            "apt" => {
                // Debian's package only recommends what its bridges need (dnsmasq).
                apt_install(h, &["lxd", "nftables", "dnsmasq-base"])?;
                let _ = h.run(
                    &["systemctl", "enable", "--now", "lxd.socket", "lxd.service"],
                    None,
                )?;
            }
            _ => {
                if !h.run(&["snap", "list", "lxd"], None)?.ok() {
                    must(h, &["snap", "install", "lxd", "--channel=5.21/stable"])?;
                }
            }
        }
        // Nothing else runs `lxd init`: the pool and the bridge are their own steps.
        must(h, &["lxd", "waitready", "--timeout=300"])?;
    }
    if !user_groups(h, SPARK)?.iter().any(|g| g == "lxd") {
        must(h, &["usermod", "-aG", "lxd", SPARK])?;
    }
    Ok(())
}

// --- storage-pool, lxd-network ---------------------------------------------------------------

fn storage_pool_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    if !lxd_answers(h) {
        return Ok(Check::Needs(NEEDS_LXD.into()));
    }
    let want = &plan.profile.prepare.storage_driver;
    match lxd::get(h, &format!("/1.0/storage-pools/{POOL}"))? {
        None => Ok(Check::Needs(format!(
            "create the storage pool {POOL} ({want}{})",
            if want == "zfs" {
                ""
            } else {
                ": this profile's alternative, where zfs cannot exist"
            }
        ))),
        Some(pool) => {
            let driver = pool["driver"].as_str().unwrap_or_default();
            if driver == want {
                Ok(Check::Satisfied)
            } else {
                Err(format!(
                    "the storage pool {POOL} uses the {driver} driver, not {want}: on a dir pool every create costs ~69 s against 0.6 s on zfs, on a host that looks healthy. Remove it (nothing uses it before profiles) and run preparation again"
                ))
            }
        }
    }
}

fn storage_pool_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    let c = &plan.profile.prepare;
    let config = if c.storage_driver == "zfs" {
        json!({"size": c.pool_size})
    } else {
        json!({})
    };
    lxd::json_call(
        h,
        "POST",
        "/1.0/storage-pools",
        &json!({"name": POOL, "driver": c.storage_driver, "config": config}),
    )
    .map(drop)
}

fn parse_net(s: &str) -> Option<(u32, u32)> {
    let (addr, len) = s.split_once('/')?;
    let ip: std::net::Ipv4Addr = addr.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    (len <= 32).then_some((u32::from(ip), len))
}

fn overlaps(a: (u32, u32), b: (u32, u32)) -> bool {
    let len = a.1.min(b.1);
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    a.0 & mask == b.0 & mask
}

fn lxd_network_check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
    if !lxd_answers(h) {
        return Ok(Check::Needs(NEEDS_LXD.into()));
    }
    match lxd::get(h, &format!("/1.0/networks/{BRIDGE}"))? {
        None => Ok(Check::Needs(format!("create the bridge {BRIDGE}"))),
        Some(n) if n["managed"] != json!(true) || n["type"] != json!("bridge") => Err(format!(
            "{BRIDGE} exists but is not a bridge LXD manages; remove it and run again"
        )),
        Some(n) => Ok(verdict(if n["config"]["ipv4.nat"] == json!("true") {
            vec![]
        } else {
            vec![format!("turn on NAT for {BRIDGE}")]
        })),
    }
}

fn lxd_network_apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
    let path = format!("/1.0/networks/{BRIDGE}");
    if lxd::get(h, &path)?.is_some() {
        return lxd::json_call(h, "PATCH", &path, &json!({"config": {"ipv4.nat": "true"}}))
            .map(drop);
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
    lxd::json_call(
        h,
        "POST",
        "/1.0/networks",
        &json!({"name": BRIDGE, "type": "bridge",
                "config": {"ipv4.address": address, "ipv4.nat": "true", "ipv6.address": "none"}}),
    )
    .map(drop)
}

// --- firewall --------------------------------------------------------------------------------

pub(super) fn ufw_active<H: Host>(h: &mut H) -> Fallible<bool> {
    let out = h.run(&["ufw", "status"], None)?;
    Ok(out.ok() && out.stdout.contains("Status: active"))
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

pub(super) fn forward_policy_in_file<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    Ok(read_string(h, UFW_DEFAULTS)?.and_then(|t| {
        t.lines().find_map(|l| {
            l.trim()
                .strip_prefix("DEFAULT_FORWARD_POLICY=")
                .map(|v| v.trim_matches('"').to_owned())
        })
    }))
}

fn firewall_check<H: Host>(h: &mut H, _: &Plan) -> Fallible<Check> {
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

fn firewall_apply<H: Host>(h: &mut H, _: &Plan) -> Fallible<()> {
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

// --- profiles --------------------------------------------------------------------------------

/// lofispark-base as this node renders it now. Its description carries a digest of the
/// content, so a profile left by another setup is recognised and rewritten. No
/// boot.autostart: LXD restores each instance's last state, and serving starts the head
/// only when that state was running (L2).
pub fn render_base_profile(plan: &Plan) -> Value {
    let mut devices = json!({
        "root": {"type": "disk", "path": "/", "pool": POOL},
        "eth0": {"type": "nic", "name": "eth0", "network": BRIDGE},
    });
    let mut config = json!({});
    if plan.profile.gpu_count.unwrap_or(0) > 0 {
        devices["gpu"] = json!({"type": "gpu", "gputype": "physical"});
        config["nvidia.runtime"] = json!("true");
        config["nvidia.driver.capabilities"] = json!("all");
    }
    let body = json!({"config": config, "devices": devices});
    let digest = hex::encode(&Sha256::digest(body.to_string().as_bytes())[..8]);
    json!({
        "name": PROFILE_NAME,
        "description": format!("enverge base profile (content {digest})"),
        "config": body["config"],
        "devices": body["devices"],
    })
}

fn profiles_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    if !lxd_answers(h) {
        return Ok(Check::Needs(NEEDS_LXD.into()));
    }
    let want = render_base_profile(plan);
    match lxd::get(h, &format!("/1.0/profiles/{PROFILE_NAME}"))? {
        None => Ok(Check::Needs(format!("create the profile {PROFILE_NAME}"))),
        Some(p) if p["description"] == want["description"] => Ok(Check::Satisfied),
        Some(_) => Ok(Check::Needs(format!(
            "rewrite {PROFILE_NAME}: it is not what this node renders"
        ))),
    }
}

fn profiles_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    // LXD refuses a profile whose NIC names a network that does not exist, in words that
    // do not say which step was skipped; say it.
    if lxd::get(h, &format!("/1.0/networks/{BRIDGE}"))?.is_none() {
        return Err(format!(
            "the network {BRIDGE} does not exist, and {PROFILE_NAME} attaches eth0 to it: lxd-network must run before profiles (lxd init, which would have made it, is deliberately not run)"
        ));
    }
    if lxd::get(h, &format!("/1.0/storage-pools/{POOL}"))?.is_none() {
        return Err(format!(
            "the storage pool {POOL} does not exist, and {PROFILE_NAME} puts the root disk on it: storage-pool must run before profiles"
        ));
    }
    let want = render_base_profile(plan);
    let path = format!("/1.0/profiles/{PROFILE_NAME}");
    if lxd::get(h, &path)?.is_some() {
        lxd::json_call(h, "PUT", &path, &want).map(drop)
    } else {
        lxd::json_call(h, "POST", "/1.0/profiles", &want).map(drop)
    }
}

// --- relay-peer ------------------------------------------------------------------------------

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

fn relay_peer_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
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

fn relay_peer_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    let wg = plan
        .wireguard
        .as_ref()
        .ok_or("no WireGuard configuration")?;
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

// --- owner-lockout ---------------------------------------------------------------------------

fn owner<H: Host>(h: &mut H, plan: &Plan) -> Fallible<String> {
    if let Some(o) = &plan.owner {
        return Ok(o.clone());
    }
    read_string(h, OWNER_FILE)?
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("the owner's login is not recorded ({OWNER_FILE})"))
}

fn owner_lockout_skip<H: Host>(_: &mut H, plan: &Plan) -> Option<String> {
    (!plan.lockout_owner).then(|| {
        "hosts.lockout_owner is false: the owner's own login stays as the recovery path".to_owned()
    })
}

fn owner_lockout_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    // Prove our access before removing theirs: the reverse strands a box neither party
    // can administer.
    if let Some(why) = operator_access_unverified(h, plan)? {
        return Ok(Check::Needs(why));
    }
    let owner = owner(h, plan)?;
    if owner == SPARK || owner == "root" {
        return Err(format!(
            "the recorded owner login {owner:?} is not an owner's"
        ));
    }
    let mut needs = Vec::new();
    if !file_is(h, LOCKOUT_CONF, LOCKOUT)? {
        needs.push(format!("admit only spark to sshd ({LOCKOUT_CONF})"));
    }
    if user_exists(h, &owner)? {
        let status = must(h, &["passwd", "-S", &owner])?;
        if status.split_whitespace().nth(1) != Some("L") {
            needs.push(format!("lock {owner}'s password"));
        }
        let groups = user_groups(h, &owner)?;
        for g in ADMIN_GROUPS {
            if groups.iter().any(|x| x == g) {
                needs.push(format!("remove {owner} from {g}"));
            }
        }
    }
    Ok(verdict(needs))
}

fn operator_access_unverified<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Option<String>> {
    let problems = operator_access_problems(h, plan)?;
    Ok((!problems.is_empty()).then(|| {
        format!(
            "operator access is not verified ({}); the owner's login is left alone",
            problems.join("; ")
        )
    }))
}

fn owner_lockout_apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
    if let Some(why) = operator_access_unverified(h, plan)? {
        return Err(why);
    }
    let owner = owner(h, plan)?;
    h.write(LOCKOUT_CONF, LOCKOUT.as_bytes(), 0o644, "root:root")?;
    if let Err(e) = must(h, &["sshd", "-t"]) {
        h.remove(LOCKOUT_CONF)?;
        return Err(format!(
            "sshd refused the lockout configuration, so it was removed: {e}"
        ));
    }
    for unit in ["ssh.service", "sshd.service"] {
        if h.run(&["systemctl", "reload", unit], None)?.ok() {
            break;
        }
    }
    if user_exists(h, &owner)? {
        must(h, &["usermod", "--lock", &owner])?;
        let groups = user_groups(h, &owner)?;
        for g in ADMIN_GROUPS {
            if groups.iter().any(|x| x == g) {
                must(h, &["gpasswd", "--delete", &owner, g])?;
            }
        }
    }
    Ok(())
}

// --- self-check ------------------------------------------------------------------------------

fn self_check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
    let mut wrong = Vec::new();
    if !lxd_answers(h) {
        wrong.push("LXD does not answer".to_owned());
    } else {
        for (what, path) in [
            ("storage pool", format!("/1.0/storage-pools/{POOL}")),
            ("bridge", format!("/1.0/networks/{BRIDGE}")),
            ("profile", format!("/1.0/profiles/{PROFILE_NAME}")),
            (
                "image alias",
                format!("/1.0/images/aliases/{}", image::BASE_ALIAS),
            ),
        ] {
            if lxd::get(h, &path)?.is_none() {
                wrong.push(format!("the {what} at {path} is missing"));
            }
        }
    }
    if !unit_active(h, "earlyoom.service")? {
        wrong.push("earlyoom is not running".to_owned());
    }
    if !swaps(h)?.is_empty() {
        wrong.push("swap is on".to_owned());
    }
    // Satellites have no relay of their own.
    if plan.wireguard.is_some() && !unit_active(h, WG_UNIT)? {
        wrong.push("wg0 is down".to_owned());
    }
    if !h
        .run(&["runuser", "-u", SPARK, "--", "sudo", "-n", "true"], None)?
        .ok()
    {
        wrong.push("spark cannot sudo".to_owned());
    }
    if let Some(model) = &plan.profile.gpu_model {
        let out = h.run(
            &["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            None,
        )?;
        if !out.ok() || !out.stdout.contains(model.as_str()) {
            wrong.push(format!("nvidia-smi does not show the {model}"));
        }
    }
    if wrong.is_empty() {
        Ok(Check::Satisfied)
    } else {
        Err(wrong.join("; "))
    }
}
