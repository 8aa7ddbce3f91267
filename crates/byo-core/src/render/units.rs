//! The agent's three systemd units (place 1): preparation as root, serving unprivileged,
//! and the rollback. Their ordering is J's notes 5–6: serving `Requires=`/`After=`
//! preparation, so starting serving pulls preparation in; preparation `Wants=` serving, so
//! a first install that starts only preparation starts serving once it succeeds; a failed
//! serving start fires the rollback. The rollback runs [`rollback_script`], a shell script
//! beside the binary, never the binary it judges: a build that cannot start cannot be
//! trusted to put itself back either (L1). Besides them, the unit preparation's `firewall` step
//! installs to load the tenant firewall at boot ([`TENANT_FIREWALL`]).
//!
//! A failed preparation tries again on its own every [`PREPARE_RETRY_SECS`], without end:
//! what stops it (an expired operator-key list, apt held by another program, no internet)
//! is fixed elsewhere, and the host should pick that up without anyone at its terminal.
//! A retry is the unit's restart job, which pulls in `Wants=` again, so serving starts once
//! one succeeds. It fetches no binary: it runs the one already installed (I, "no timers").

pub const PREPARE: &str = "enverge-agent-prepare.service";
pub const SERVING: &str = "enverge-agent.service";
pub const ROLLBACK: &str = "enverge-agent-rollback.service";
/// Root's LXD gate (`byo-agent lxd-gate`): serving's only way to LXD (#36). Pulled in by
/// serving's `Wants=` and restarted with it; its socket lives under [`LXD_GATE_DIR`].
pub const LXD_GATE: &str = "enverge-lxd-gate.service";
/// The gate's runtime directory under /run (root:spark, 0750).
pub const LXD_GATE_DIR: &str = "enverge-lxd-gate";
/// Where serving reaches the gate.
pub const LXD_GATE_SOCKET: &str = "/run/enverge-lxd-gate/lxd.sock";
/// L4: serving (unprivileged) asks for this machine's reboot by creating [`REBOOT_FLAG`] in
/// its own state directory; this path unit, root's, sees it and starts [`REBOOT`], which
/// removes the flag and reboots, a moment later (deferred, so the caller hears its 202 first).
/// No polkit rule and no setuid program: serving's `NoNewPrivileges` stays whole.
pub const REBOOT_PATH: &str = "enverge-agent-reboot.path";
pub const REBOOT: &str = "enverge-agent-reboot.service";
pub const REBOOT_FLAG: &str = "/var/lib/enverge-agent/reboot-requested";
/// A pair's rail ports come back from a deleted head down and bare (LXD returns a physical
/// NIC down; networkd does not raise it again): serving asks root's [`RAILS_PATH`] to apply
/// the host's network configuration (`netplan apply`, as rail-network does) by creating
/// [`RAILS_FLAG`]. A single Spark has no rails file, and the service does nothing there.
pub const RAILS_PATH: &str = "enverge-agent-rails.path";
pub const RAILS: &str = "enverge-agent-rails.service";
pub const RAILS_FLAG: &str = "/var/lib/enverge-agent/rails-requested";
/// The tenant firewall follows the host (issue #36): a heartbeat that finds the host's
/// networks or the owner's public address changed has serving ask root to bring the table to
/// what the host is now, by creating [`FIREWALL_FLAG`]; this path unit, root's, starts
/// [`FIREWALL_REFRESH`], which removes the flag and runs `byo-agent firewall-refresh` (the
/// firewall step's own render, check and load). The request carries no data: the address
/// is read from `tenants::WAN_FILE` as an address and nothing else.
pub const FIREWALL_PATH: &str = "enverge-tenant-firewall-refresh.path";
pub const FIREWALL_REFRESH: &str = "enverge-tenant-firewall-refresh.service";
pub const FIREWALL_FLAG: &str = "/var/lib/enverge-agent/firewall-requested";
/// Operator keys are root's to write (issue #36): spark's `authorized_keys` admits a login
/// whose sudo is not under serving's `NoNewPrivileges`, so serving, whose sandbox keeps
/// `/home` read-only, leaves a pushed list (or nothing, to bring the file to the clock at a
/// list's expiry) at [`OPERATOR_KEYS_FLAG`]; this path unit, root's, starts [`OPERATOR_KEYS`],
/// which takes the request and runs `byo-agent operator-keys apply-requested`: the list
/// verified against root's own trust and kept list, then `authorized_keys` written.
pub const OPERATOR_KEYS_PATH: &str = "enverge-operator-keys.path";
pub const OPERATOR_KEYS: &str = "enverge-operator-keys.service";
pub const OPERATOR_KEYS_FLAG: &str = "/var/lib/enverge-agent/operator-keys-requested";
/// Where root keeps the signed list as received (0644: serving reads it to answer pushes;
/// preparation reads it, M.5). Before #36 serving kept it at
/// `/var/lib/enverge-agent/operator-keys.signed`, which [`finish_script`] moves here once.
pub const OPERATOR_KEYS_HELD: &str = "/etc/enverge/operator-keys.signed";
const OPERATOR_KEYS_HELD_BEFORE: &str = "/var/lib/enverge-agent/operator-keys.signed";
/// The path units by which serving asks root for something, enabled and started by every
/// install and upgrade.
pub const SERVING_ASKS: &[&str] = &[REBOOT_PATH, RAILS_PATH, FIREWALL_PATH, OPERATOR_KEYS_PATH];
/// The rails' netplan file rail-network writes (130).
pub const NETPLAN_RAILS: &str = "/etc/netplan/60-enverge-rails.yaml";
/// The operator tunnel's connector (cloudflared) as a unit: preparation's operator-access
/// writes and starts it, serving's heartbeat judges the tunnel by it, uninstall removes it.
/// The same name in all three, or the tunnel reads as down whatever its state (issue #38).
pub const TUNNEL: &str = "enverge-tunnel.service";

/// How long after serving asks this machine goes down.
pub const REBOOT_DEFER_SECS: u64 = 3;

/// How long a failed preparation waits before it tries again (`RestartSec=`). The owner's
/// page says so.
pub const PREPARE_RETRY_SECS: u64 = 30;

/// Where install.sh puts the agent's binary: what the units run, what an upgrade replaces
/// (keeping the running build beside it as `<bin>.previous`).
pub const AGENT_BIN: &str = "/usr/local/bin/byo-agent";

/// Where install.sh puts [`rollback_script`], the rollback unit's `ExecStart=`: beside the
/// binary, as `<bin>-rollback`.
pub const ROLLBACK_SCRIPT: &str = "/usr/local/bin/byo-agent-rollback";

/// What a rollback leaves for the heartbeat to report (`details.rollback`): /admin names
/// "rollback fired" from it. The next install (an operator's upgrade) removes it.
pub const ROLLED_BACK: &str = "/etc/enverge/rolled-back.json";

/// The record a completed preparation writes last (the hand-over, L rule 1): without it
/// serving never ran, and there is nothing to roll back.
pub const HANDED_OVER: &str = "/etc/enverge/serving.json";

/// (file name, contents) of each unit, running `bin`.
pub fn units(bin: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            PREPARE,
            format!(
                "[Unit]\nDescription=byo agent: enrol and prepare this host (root)\nWants=network-online.target {SERVING}\nAfter=network-online.target\n# Retry for as long as it takes: no start limit.\nStartLimitIntervalSec=0\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart={bin} prepare\nRestart=on-failure\nRestartSec={PREPARE_RETRY_SECS}\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        (
            SERVING,
            format!(
                "[Unit]\nDescription=byo agent: answer the backend (unprivileged)\nRequires={PREPARE}\nAfter={PREPARE} {LXD_GATE}\n# LXD only through root's gate: serving is not in the lxd group (#36).\nWants={LXD_GATE}\nOnFailure={ROLLBACK}\nStartLimitIntervalSec=300\nStartLimitBurst=5\n\n[Service]\nUser=spark\nExecStart={bin} serve\nRestart=on-failure\nRestartSec=5\nNoNewPrivileges=yes\nProtectSystem=strict\nProtectHome=read-only\n# The agent's own state, nothing else: spark's .ssh is root's to write (#36).\nReadWritePaths=/var/lib/enverge-agent\nPrivateTmp=yes\n# sshd's accepted logins, read from the journal for the owner's page (#16).\nSupplementaryGroups=systemd-journal\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        (
            ROLLBACK,
            format!(
                "[Unit]\nDescription=byo agent: go back to the previous build once, when serving will not stay up\n\n[Service]\nType=oneshot\nExecStart={bin}-rollback\n"
            ),
        ),
        (
            LXD_GATE,
            format!(
                "[Unit]\nDescription=byo agent: what serving may ask of LXD, forwarded as root (#36)\n# Restarted with serving, so an upgrade's new build answers at once.\nPartOf={SERVING}\n\n[Service]\n# Ready once its socket answers; a build that cannot start fails at once, not after a wait.\nType=notify\nExecStart={bin} lxd-gate\n# The socket is made 0660 in spark's group, under a directory only root and spark enter.\nGroup=spark\nRuntimeDirectory={gate_dir}\nRuntimeDirectoryMode=0750\nRestart=on-failure\nRestartSec=2\nNoNewPrivileges=yes\nProtectSystem=strict\nProtectHome=yes\nPrivateTmp=yes\n",
                gate_dir = LXD_GATE_DIR,
            ),
        ),
        (
            REBOOT_PATH,
            format!(
                "[Unit]\nDescription=byo agent: reboot this machine when serving asks (L4)\n\n[Path]\nPathExists={REBOOT_FLAG}\nUnit={REBOOT}\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        (
            REBOOT,
            format!(
                "[Unit]\nDescription=byo agent: the reboot serving asked for (L4)\nSuccessAction=reboot\n\n[Service]\nType=oneshot\n# The flag goes first: a machine never reboots twice for one request.\nExecStart=/bin/rm -f {REBOOT_FLAG}\nExecStart=/bin/sleep {REBOOT_DEFER_SECS}\n"
            ),
        ),
        (
            RAILS_PATH,
            format!(
                "[Unit]\nDescription=byo agent: address a pair's rails again when serving asks (K1 note 11)\n\n[Path]\nPathExists={RAILS_FLAG}\nUnit={RAILS}\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        (
            RAILS,
            format!(
                "[Unit]\nDescription=byo agent: a pair's rails addressed again, once its containers gave them back\n\n[Service]\nType=oneshot\n# The flag goes first; a host with no rails file (a single Spark) has nothing to apply.\nExecStart=/bin/rm -f {RAILS_FLAG}\nExecStart=/bin/sh -c 'test -e {NETPLAN_RAILS} || exit 0; exec netplan apply'\n"
            ),
        ),
        (
            FIREWALL_PATH,
            format!(
                "[Unit]\nDescription=byo agent: the tenant firewall brought to the host's networks when serving asks (#36)\n\n[Path]\nPathExists={FIREWALL_FLAG}\nUnit={FIREWALL_REFRESH}\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        (
            FIREWALL_REFRESH,
            format!(
                "[Unit]\nDescription=byo agent: the tenant firewall brought to what this host is now\n\n[Service]\nType=oneshot\n# The flag goes first: a change that lands while this runs asks again.\nExecStart=/bin/rm -f {FIREWALL_FLAG}\nExecStart={bin} firewall-refresh\n"
            ),
        ),
        (
            OPERATOR_KEYS_PATH,
            format!(
                "[Unit]\nDescription=byo agent: operator keys written when serving passes a list on (#36)\n\n[Path]\nPathExists={OPERATOR_KEYS_FLAG}\nUnit={OPERATOR_KEYS}\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        (
            OPERATOR_KEYS,
            format!(
                "[Unit]\nDescription=byo agent: a pushed operator-key list verified and applied as root\n\n[Service]\nType=oneshot\n# The request is taken first (renamed), so one that lands while this runs asks again.\nExecStart={bin} operator-keys apply-requested\n# A request is serving's file: one that blocks a read is cut off, not waited on.\nTimeoutStartSec=30\n"
            ),
        ),
    ]
}

/// What enverge-agent-rollback runs when serving will not stay up (L1), as POSIX sh so it
/// does not depend on the build it judges. `BYO_AGENT_BIN`, `BYO_HANDED_OVER` and
/// `BYO_ROLLED_BACK` move its files (tests). In order:
/// - preparation has not handed over ([`HANDED_OVER`] absent): serving never ran — its
///   start failed because preparation did (`Requires=`) — so nothing is rolled back, and
///   `.previous` is kept for a real failure (exit 0);
/// - no `<bin>.previous`: this is the second failure, nothing to go back to: the host stays
///   down and is alerted (exit 1);
/// - `.previous` is the build already running: it is removed, not restored (exit 1);
/// - otherwise `.previous` is moved over the binary (consumed: once), [`ROLLED_BACK`]
///   records it, and serving is `reset-failed` — it reached systemd's start limit to get
///   here, and a start is refused until that is cleared — and restarted.
pub fn rollback_script(bin: &str) -> String {
    format!(
        r#"#!/bin/sh
# enverge-agent-rollback: go back to the previous build once, when serving will not stay
# up, and never to the build already running (L1). Installed by install.sh.
set -u
bin="${{BYO_AGENT_BIN:-{bin}}}"
handed_over="${{BYO_HANDED_OVER:-{HANDED_OVER}}}"
record="${{BYO_ROLLED_BACK:-{ROLLED_BACK}}}"
previous="$bin.previous"
if [ ! -e "$handed_over" ]; then
  echo "preparation has not handed over ($handed_over is absent), so serving never ran: nothing to roll back"
  exit 0
fi
if [ ! -e "$previous" ]; then
  echo "no previous build at $previous: not rolling back again (the host stays down and is alerted)" >&2
  exit 1
fi
now=$(sha256sum "$bin" | cut -d' ' -f1)
old=$(sha256sum "$previous" | cut -d' ' -f1)
if [ "$now" = "$old" ]; then
  rm -f "$previous"
  echo "the previous build is the one already running; not restoring it (the host stays down and is alerted)" >&2
  exit 1
fi
# Consumed: a second failure finds nothing to go back to.
mv -f "$previous" "$bin" || exit 1
echo "restored the previous build at $bin ($old, replacing $now)"
# Told, not hidden: serving reports it on every beat until the next install.
printf '{{"at":"%s","from_sha256":"%s","to_sha256":"%s"}}
'   "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$now" "$old" > "$record.new" && mv -f "$record.new" "$record" ||
  echo "could not record the rollback at $record" >&2
# Serving reached its start limit to get here: systemd refuses a start until it is reset.
systemctl reset-failed {SERVING} || true
systemctl --no-block restart {SERVING}
"#
    )
}

/// The transient unit an install's last part runs as, detached from the terminal that
/// started it (J note 4): install.sh's and `byo-agent upgrade`'s alike. One runs at a time
/// (a second finds the unit there and stops).
pub const INSTALL_UNIT: &str = "enverge-agent-install";

/// The last part of every install and upgrade, run detached as [`INSTALL_UNIT`] with the
/// staging directory (holding the verified `byo-agent`) as `$1`: the running build kept as
/// `<bin>.previous` (unless the new one is the same file), the new one moved into place,
/// [`ROLLED_BACK`] removed, the rollback script and the [`units`] written, and then by
/// [`HANDED_OVER`] — an upgrade: serving reset and restarted; a first install: preparation
/// started. install.sh carries it (rendered by the server), and `byo-agent upgrade` runs the
/// one the verified new build prints (`byo-agent finish-script`), so the units installed are
/// always the new build's own.
pub fn finish_script(bin: &str) -> String {
    let mut units_text = String::new();
    for (name, body) in units(bin) {
        units_text.push_str(&format!(
            "cat > /etc/systemd/system/{name} <<'UNIT'\n{body}UNIT\n"
        ));
    }
    format!(
        r#"#!/bin/bash
set -euo pipefail
stage="$1"
if [ -f {bin} ] && cmp -s "$stage/byo-agent" {bin}; then
  echo "This build is already installed; {bin}.previous is left as it was."
  build="the same build"
else
  build="the new build"
  if [ -f {bin} ]; then
    cp -p {bin} {bin}.previous
  fi
  install -m 755 "$stage/byo-agent" {bin}.new
  mv -f {bin}.new {bin}
  # A new build is installed: a rollback recorded before it is history, not news.
  rm -f {ROLLED_BACK}
fi
rm -f "$stage/byo-agent"
cat > {ROLLBACK_SCRIPT}.new <<'ROLLBACK'
{rollback}ROLLBACK
chmod 755 {ROLLBACK_SCRIPT}.new
mv -f {ROLLBACK_SCRIPT}.new {ROLLBACK_SCRIPT}
# The operator-key list is root's to keep (#36): a host whose serving kept it moves it once.
if [ ! -e {OPERATOR_KEYS_HELD} ] && [ -f {OPERATOR_KEYS_HELD_BEFORE} ] && [ ! -L {OPERATOR_KEYS_HELD_BEFORE} ]; then
  install -m 644 -o root -g root {OPERATOR_KEYS_HELD_BEFORE} {OPERATOR_KEYS_HELD}
fi
{units_text}systemctl daemon-reload
systemctl enable {PREPARE} {SERVING}
# What serving may ask root for, watching from now on: the host's reboot (L4), a pair's
# rails addressed again once its containers gave them back, the tenant firewall brought to
# the host's networks.
systemctl enable --now {asks}
if [ -f {HANDED_OVER} ]; then
  # An upgrade: serving may be running (then Wants= would start nothing) or down (failed,
  # at its start limit): either way it is reset and restarted on the new build. The
  # preparation it pulls in finds its record and exits at once; nothing re-prepares.
  systemctl reset-failed {SERVING} || true
  systemctl restart {SERVING}
  echo "Serving restarted on $build."
else
  # A first install (or a preparation that has not completed yet): preparation finds the
  # kept credentials and prepares. Its Wants= starts serving once it succeeds.
  systemctl start --no-block {PREPARE}
fi
"#,
        rollback = rollback_script(bin),
        asks = SERVING_ASKS.join(" "),
    )
}

/// Loads the tenant firewall ([`crate::render::nft::tenants`]) at every boot: before the
/// network and LXD come up (so no instance LXD restores runs a moment without it), after an
/// `nftables.service` whose `flush ruleset` would remove it, and again whenever that service
/// is restarted (`PartOf=`). preparation's `firewall` step writes and enables it.
pub const TENANT_FIREWALL: &str = "enverge-tenant-firewall.service";

pub fn tenant_firewall(nft: &str) -> String {
    let path = crate::render::nft::tenants::PATH;
    format!(
        "[Unit]\nDescription=byo: tenants on lxdbr0 see the internet and nothing of the owner's\nDefaultDependencies=no\nWants=network-pre.target\nBefore=network-pre.target lxd.service lxd.socket snap.lxd.daemon.service shutdown.target\nAfter=local-fs.target nftables.service\nPartOf=nftables.service\nConflicts=shutdown.target\nConditionPathExists={path}\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\nExecStart={nft} -f {path}\nExecReload={nft} -f {path}\n\n[Install]\nWantedBy=multi-user.target\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The finish every install and upgrade runs: the running build kept before the new one
    /// replaces it (never after), the rollback record of an older build dropped, the rollback
    /// script and every unit written before systemd reloads, and then serving restarted on
    /// an upgrade or preparation started on a first install, by the hand-over record.
    #[test]
    fn the_finish_keeps_the_running_build_then_installs_the_new_one_and_its_units() {
        let bin = "/opt/byo-agent";
        let f = finish_script(bin);
        let at = |needle: &str| {
            f.find(needle)
                .unwrap_or_else(|| panic!("{needle:?} not in:\n{f}"))
        };
        let order = [
            format!("cmp -s \"$stage/byo-agent\" {bin}"),
            // The same build again is said to be restarted as such, never as a new one.
            "build=\"the same build\"".to_owned(),
            "build=\"the new build\"".to_owned(),
            format!("cp -p {bin} {bin}.previous"),
            format!("install -m 755 \"$stage/byo-agent\" {bin}.new"),
            format!("mv -f {bin}.new {bin}\n"),
            format!("rm -f {ROLLED_BACK}"),
            format!(
                "cat > {ROLLBACK_SCRIPT}.new <<'ROLLBACK'\n{}ROLLBACK\n",
                rollback_script(bin)
            ),
            format!("mv -f {ROLLBACK_SCRIPT}.new {ROLLBACK_SCRIPT}"),
            format!("cat > /etc/systemd/system/{PREPARE} <<'UNIT'\n"),
            "systemctl daemon-reload".to_owned(),
            format!("systemctl enable {PREPARE} {SERVING}"),
            format!("systemctl enable --now {REBOOT_PATH} {RAILS_PATH} {FIREWALL_PATH}"),
            format!("if [ -f {HANDED_OVER} ]"),
            format!("systemctl reset-failed {SERVING}"),
            format!("systemctl restart {SERVING}"),
            "echo \"Serving restarted on $build.\"".to_owned(),
            format!("systemctl start --no-block {PREPARE}"),
        ];
        // Each found after the one before it (the rollback script, embedded, has lines of
        // its own that look alike).
        let mut places = Vec::new();
        let mut from = 0;
        for needle in &order {
            let found = f[from..]
                .find(needle.as_str())
                .unwrap_or_else(|| panic!("{needle:?} not after byte {from} in:\n{f}"));
            from += found + needle.len();
            places.push(from - needle.len());
        }
        // Every unit, whole, between the rollback script and the reload.
        for (name, body) in units(bin) {
            let unit = at(&format!(
                "cat > /etc/systemd/system/{name} <<'UNIT'\n{body}UNIT\n"
            ));
            assert!(places[8] < unit && unit < places[10], "{name}");
        }
        assert!(f.starts_with("#!/bin/bash\nset -euo pipefail\nstage=\"$1\"\n"));
    }

    /// What install.sh writes, by name and in order: the three units J names (and root's LXD
    /// gate beside serving, #36), then what
    /// serving may ask root for (L4's reboot, a pair's rails, the tenant firewall brought to
    /// the host's networks), each running what it says.
    /// `systemd-analyze verify` and the real hosts run them (byo-agent's tests); this pins
    /// the list itself, which install.sh, the uninstaller and the tests all read.
    #[test]
    fn the_units_install_sh_writes_each_run_what_they_say() {
        let all = units("/opt/byo-agent");
        let names: Vec<&str> = all.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                PREPARE,
                SERVING,
                ROLLBACK,
                LXD_GATE,
                REBOOT_PATH,
                REBOOT,
                RAILS_PATH,
                RAILS,
                FIREWALL_PATH,
                FIREWALL_REFRESH,
                OPERATOR_KEYS_PATH,
                OPERATOR_KEYS
            ]
        );
        let text = |name: &str| &all.iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(text(PREPARE).contains("ExecStart=/opt/byo-agent prepare\n"));
        assert!(text(SERVING).contains("ExecStart=/opt/byo-agent serve\n"));
        assert!(text(ROLLBACK).contains("ExecStart=/opt/byo-agent-rollback\n"));
        // Serving pulls in root's LXD gate and is ordered after it; the gate runs as root in
        // spark's group (its socket 0660) and is restarted with serving.
        assert!(text(SERVING).contains(&format!("Wants={LXD_GATE}\n")));
        assert!(text(SERVING).contains(&format!("After={PREPARE} {LXD_GATE}\n")));
        assert!(text(LXD_GATE).contains("ExecStart=/opt/byo-agent lxd-gate\n"));
        assert!(text(LXD_GATE).contains("\nGroup=spark\n") && !text(LXD_GATE).contains("\nUser="));
        assert!(text(LXD_GATE).contains(&format!("PartOf={SERVING}\n")));
        assert!(text(LXD_GATE).contains("\nType=notify\n"));
        assert!(LXD_GATE_SOCKET.starts_with(&format!("/run/{LXD_GATE_DIR}/")));
        assert!(text(REBOOT_PATH).contains(&format!("Unit={REBOOT}\n")));
        assert!(text(REBOOT).contains("SuccessAction=reboot\n"));
        assert!(text(RAILS_PATH).contains(&format!("Unit={RAILS}\n")));
        assert!(text(RAILS).contains("exec netplan apply"));
        assert!(text(FIREWALL_PATH).contains(&format!("Unit={FIREWALL_REFRESH}\n")));
        assert!(text(FIREWALL_REFRESH).contains("ExecStart=/opt/byo-agent firewall-refresh\n"));
        assert!(text(OPERATOR_KEYS_PATH).contains(&format!(
            "PathExists={OPERATOR_KEYS_FLAG}\nUnit={OPERATOR_KEYS}\n"
        )));
        assert!(
            text(OPERATOR_KEYS)
                .contains("ExecStart=/opt/byo-agent operator-keys apply-requested\n")
        );
        // Serving may write its own state and nothing in /home (#36).
        assert!(text(SERVING).contains("\nProtectHome=read-only\n"));
        assert!(text(SERVING).contains("\nReadWritePaths=/var/lib/enverge-agent\n"));
    }
}
