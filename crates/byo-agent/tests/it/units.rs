//! The units pass `systemd-analyze verify`, and carry J's ordering; so does the unit the
//! firewall step installs to load the tenant firewall at boot.

use byo_core::render::units::{
    FIREWALL_FLAG, FIREWALL_PATH, FIREWALL_REFRESH, NETPLAN_RAILS, OPERATOR_KEYS_PATH, PREPARE,
    PREPARE_RETRY_SECS, RAILS, RAILS_FLAG, RAILS_PATH, REBOOT, REBOOT_FLAG, REBOOT_PATH, ROLLBACK,
    ROLLBACK_SCRIPT, SERVING, TENANT_FIREWALL, tenant_firewall, units,
};

/// The `key=value` lines of `section` in a unit's text.
fn section(text: &str, name: &str) -> Vec<String> {
    let mut inside = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.starts_with('[') {
            inside = line == format!("[{name}]");
        } else if inside && line.contains('=') && !line.starts_with('#') {
            lines.push(line.to_owned());
        }
    }
    lines
}

#[test]
fn the_units_verify_and_are_ordered_as_the_design_says() {
    // The binary and the rollback script beside it, as install.sh lays them out.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("byo-agent");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_byo-agent"), &bin).unwrap();
    let script = dir.path().join("byo-agent-rollback");
    std::fs::write(
        &script,
        byo_core::render::units::rollback_script(bin.to_str().unwrap()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut all = units(bin.to_str().unwrap());
    let nft = if std::path::Path::new("/usr/sbin/nft").exists() {
        "/usr/sbin/nft"
    } else {
        "/bin/true"
    };
    all.push((TENANT_FIREWALL, tenant_firewall(nft)));
    let text = |name: &str| all.iter().find(|(n, _)| *n == name).unwrap().1.clone();
    assert!(
        text(SERVING).contains(&format!("Requires={PREPARE}"))
            && text(SERVING).contains(&format!("After={PREPARE}"))
    );
    assert!(
        text(PREPARE).contains(&format!("Wants=network-online.target {SERVING}")),
        "preparation starts serving"
    );
    assert!(text(SERVING).contains(&format!("OnFailure={ROLLBACK}")));
    // The rollback does not run the build it judges: the script install.sh puts beside it.
    assert!(
        text(ROLLBACK).contains(&format!("ExecStart={}\n", script.display())),
        "{}",
        text(ROLLBACK)
    );
    let installed = units("/usr/local/bin/byo-agent");
    assert!(
        installed[2]
            .1
            .contains(&format!("ExecStart={ROLLBACK_SCRIPT}\n"))
    );
    // A failed preparation tries again on its own, for as long as it takes; a start limit
    // left at systemd's default would be [Unit]'s to set, so it is set there.
    let prepare_unit = section(&text(PREPARE), "Unit");
    let prepare_service = section(&text(PREPARE), "Service");
    assert!(
        prepare_service.contains(&"Restart=on-failure".to_owned())
            && prepare_service.contains(&format!("RestartSec={PREPARE_RETRY_SECS}"))
            && prepare_unit.contains(&"StartLimitIntervalSec=0".to_owned()),
        "preparation retries on its own: {prepare_unit:?} {prepare_service:?}"
    );
    assert!((30..=60).contains(&PREPARE_RETRY_SECS));
    // No timer: nothing on a host runs on a schedule of its own but this retry (I). The path
    // units wait for serving's requests (L4's reboot, the rails, the tenant firewall, a key
    // list for root to apply), which is no schedule.
    assert!(all.iter().all(|(name, _)| name.ends_with(".service")
        || [REBOOT_PATH, RAILS_PATH, FIREWALL_PATH, OPERATOR_KEYS_PATH].contains(name)));
    // L4: root's side of the reboot serving asks for: the flag is in serving's own state
    // directory, removed before the reboot, and the machine goes down a moment later.
    assert!(text(REBOOT_PATH).contains(&format!("PathExists={REBOOT_FLAG}\nUnit={REBOOT}\n")));
    let reboot = text(REBOOT);
    let rm = reboot
        .find(&format!("ExecStart=/bin/rm -f {REBOOT_FLAG}"))
        .expect("the flag removed");
    assert!(
        rm < reboot.find("ExecStart=/bin/sleep").unwrap()
            && reboot.contains("SuccessAction=reboot")
    );
    assert!(
        REBOOT_FLAG.starts_with("/var/lib/enverge-agent/"),
        "serving may write it"
    );
    // A pair's rails addressed again on serving's word: the flag first, then the host's own
    // network configuration, and nothing on a host with no rails file.
    assert!(text(RAILS_PATH).contains(&format!("PathExists={RAILS_FLAG}\nUnit={RAILS}\n")));
    let rails = text(RAILS);
    let rm = rails
        .find(&format!("ExecStart=/bin/rm -f {RAILS_FLAG}"))
        .expect("the flag removed");
    assert!(
        rm < rails.find("netplan apply").unwrap()
            && rails.contains(&format!("test -e {NETPLAN_RAILS} || exit 0"))
    );
    assert!(
        RAILS_FLAG.starts_with("/var/lib/enverge-agent/"),
        "serving may write it"
    );
    // The tenant firewall brought to the host's networks on serving's word (#36): the flag
    // first, then the agent's own refresh, as root.
    assert!(text(FIREWALL_PATH).contains(&format!(
        "PathExists={FIREWALL_FLAG}\nUnit={FIREWALL_REFRESH}\n"
    )));
    let refresh = text(FIREWALL_REFRESH);
    let rm = refresh
        .find(&format!("ExecStart=/bin/rm -f {FIREWALL_FLAG}"))
        .expect("the flag removed");
    assert!(
        rm < refresh.find(" firewall-refresh\n").unwrap(),
        "{refresh}"
    );
    assert!(!refresh.contains("User="), "root's: {refresh}");
    assert!(
        FIREWALL_FLAG.starts_with("/var/lib/enverge-agent/")
            && byo_core::render::nft::tenants::WAN_FILE.starts_with("/var/lib/enverge-agent/"),
        "serving may write them"
    );
    // The tenant firewall is in the kernel before LXD restores an instance, and comes back
    // after an nftables.service whose `flush ruleset` would take it away.
    let tenants = text(TENANT_FIREWALL);
    for want in [
        "Before=network-pre.target lxd.service",
        "After=local-fs.target nftables.service",
        "PartOf=nftables.service",
        "-f /etc/enverge/tenant-firewall.nft",
        "WantedBy=multi-user.target",
    ] {
        assert!(tenants.contains(want), "{want} missing:\n{tenants}");
    }
    // Serving writes its own state and nothing in /home: spark's keys are root's (#36).
    assert!(
        text(SERVING).contains("User=spark")
            && text(SERVING).contains("\nReadWritePaths=/var/lib/enverge-agent\n")
            && text(SERVING).contains("\nProtectHome=read-only\n")
    );
    // Serving reads sshd's accepted logins from the journal (#16, 5).
    assert!(text(SERVING).contains("SupplementaryGroups=systemd-journal"));

    if !byo_core::testing::have_tools(&["systemd-analyze"]) {
        return;
    }
    let mut paths = Vec::new();
    for (name, body) in &all {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        paths.push(p);
    }
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args(&paths)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // verify warns about what it cannot resolve outside a booted system (the spark user,
    // the network target) but not about the units' own syntax or ordering.
    for bad in [
        "Unknown key",
        "Unknown section",
        "Failed to",
        "bad-setting",
        "Invalid",
    ] {
        assert!(!stderr.contains(bad), "{stderr}");
    }
}

/// The rollback script, run as the unit runs it (sh), over files in a directory and a
/// `systemctl` that records what it was asked: the branches of L1. The same script under the
/// real systemd: `crates/byo/tests/it/golden_path.rs`.
#[test]
fn the_rollback_goes_back_once_never_to_the_running_build_nor_before_serving_ran() {
    use byo_core::render::units::rollback_script;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("byo-agent");
    let previous = dir.path().join("byo-agent.previous");
    let handed_over = dir.path().join("serving.json");
    let record = dir.path().join("rolled-back.json");
    let asked = dir.path().join("systemctl.log");
    let fake = dir.path().join("path");
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(
        fake.join("systemctl"),
        format!("#!/bin/sh\necho \"$*\" >> {}\n", asked.display()),
    )
    .unwrap();
    std::fs::set_permissions(
        fake.join("systemctl"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let script = dir.path().join("rollback");
    std::fs::write(&script, rollback_script("/nonexistent/byo-agent")).unwrap();
    let run = || {
        std::process::Command::new("sh")
            .arg(&script)
            .env("BYO_AGENT_BIN", &bin)
            .env("BYO_HANDED_OVER", &handed_over)
            .env("BYO_ROLLED_BACK", &record)
            .env("PATH", format!("{}:/usr/bin:/bin", fake.display()))
            .output()
            .unwrap()
    };
    let said = |out: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let asked_for = || std::fs::read_to_string(&asked).unwrap_or_default();
    std::fs::write(&bin, "new build").unwrap();
    std::fs::write(&previous, "old build").unwrap();
    // Serving's start failing because preparation failed (Requires=) fires OnFailure= too:
    // before preparation handed over, serving never ran, and nothing is rolled back.
    let out = run();
    assert!(
        out.status.success() && said(&out).contains("nothing to roll back"),
        "{}",
        said(&out)
    );
    assert_eq!(std::fs::read_to_string(&bin).unwrap(), "new build");
    assert!(previous.exists(), ".previous is kept for a real failure");
    assert_eq!(asked_for(), "", "serving was not touched");
    std::fs::write(&handed_over, "{}").unwrap();
    let out = run();
    assert!(out.status.success(), "{}", said(&out));
    assert_eq!(std::fs::read_to_string(&bin).unwrap(), "old build");
    assert!(!previous.exists(), ".previous is consumed");
    // Serving reached its start limit to get here: reset first, or the start is refused.
    assert_eq!(
        asked_for(),
        "reset-failed enverge-agent.service\n--no-block restart enverge-agent.service\n"
    );
    // Told, not hidden: the record the heartbeat reports as `details.rollback`.
    let told: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).expect("the rollback is recorded")).unwrap();
    assert!(
        told["at"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{told}"
    );
    assert_ne!(told["from_sha256"], told["to_sha256"]);
    // Once: a second failure has nothing to go back to, and serving is left down.
    std::fs::remove_file(&asked).unwrap();
    let out = run();
    assert!(!out.status.success());
    assert!(said(&out).contains("no previous build"), "{}", said(&out));
    assert_eq!(std::fs::read_to_string(&bin).unwrap(), "old build");
    assert_eq!(asked_for(), "");
    // Never to the build already running.
    std::fs::write(&previous, "old build").unwrap();
    let out = run();
    assert!(!out.status.success());
    assert!(said(&out).contains("already running"), "{}", said(&out));
    assert_eq!(std::fs::read_to_string(&bin).unwrap(), "old build");
    assert!(!previous.exists());
    assert_eq!(asked_for(), "");
}
