//! The agent's three systemd units (place 1): preparation as root, serving unprivileged,
//! and the rollback. Their ordering is J's notes 5–6: serving `Requires=`/`After=`
//! preparation, so starting serving pulls preparation in; preparation `Wants=` serving, so
//! a first install that starts only preparation starts serving once it succeeds; a failed
//! serving start fires the rollback. Besides them, the unit preparation's `firewall` step
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

/// How long a failed preparation waits before it tries again (`RestartSec=`). The owner's
/// page says so.
pub const PREPARE_RETRY_SECS: u64 = 30;

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
                "[Unit]\nDescription=byo agent: answer the backend (unprivileged)\nRequires={PREPARE}\nAfter={PREPARE}\nOnFailure={ROLLBACK}\nStartLimitIntervalSec=300\nStartLimitBurst=5\n\n[Service]\nUser=spark\nExecStart={bin} serve\nRestart=on-failure\nRestartSec=5\nNoNewPrivileges=yes\nProtectSystem=strict\nProtectHome=read-only\n# spark's .ssh (the operator keys, M.4) and the agent's own state, nothing else.\nReadWritePaths=/home/spark/.ssh /var/lib/enverge-agent\nPrivateTmp=yes\n# sshd's accepted logins, read from the journal for the owner's page (#16).\nSupplementaryGroups=systemd-journal\n\n[Install]\nWantedBy=multi-user.target\n"
            ),
        ),
        (
            ROLLBACK,
            format!(
                "[Unit]\nDescription=byo agent: go back to the previous build once, when serving will not stay up\n\n[Service]\nType=oneshot\nExecStart={bin} rollback\n"
            ),
        ),
    ]
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
