//! What preparation writes onto a host passes its real validator: the image builder and the
//! tenant image's DHCP hook (`shellcheck`, as POSIX sh: busybox runs them), and the WireGuard
//! configuration relay-peer renders (`wg-quick strip` parses it as wg-quick@wg0 will).

use std::process::Command;

use byo_agent::prepare::{BUILDER_SCRIPT, UDHCPC_SCRIPT, render_wireguard};
use byo_wire::enroll::WireGuardConfig;

fn have(tool: &str) -> bool {
    byo_core::testing::have_tools(&[tool])
}

#[test]
fn the_image_builder_and_the_dhcp_hook_are_shellcheck_clean() {
    if !have("shellcheck") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("build-base-image.sh", BUILDER_SCRIPT),
        ("udhcpc.script", UDHCPC_SCRIPT),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let out = Command::new("shellcheck")
            .args(["-s", "sh"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

#[test]
fn the_relay_peer_configuration_parses_as_wg_quick_reads_it() {
    if !have("wg-quick") || !have("wg") {
        return;
    }
    let key = |_: u8| {
        let out = Command::new("wg").arg("genkey").output().unwrap();
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    };
    let wg = WireGuardConfig {
        private_key: key(0),
        address: "10.8.0.2/24".into(),
        peer_public_key: "cmVsYXktcHVibGljLWtleS1mb3ItdGVzdHMtMDAwMDA=".into(),
        endpoint: Some("203.0.113.7:51820".into()),
        allowed_ips: "10.8.0.1/32".into(),
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wg0.conf");
    std::fs::write(&path, render_wireguard(&wg)).unwrap();
    let out = Command::new("wg-quick")
        .arg("strip")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stripped = String::from_utf8_lossy(&out.stdout);
    assert!(stripped.contains("PersistentKeepalive = 25") && !stripped.contains("Address"));
}
