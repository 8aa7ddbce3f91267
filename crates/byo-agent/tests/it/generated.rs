//! What preparation writes onto a host passes its real validator: the image builder and the
//! tenant image's DHCP hook (`shellcheck`, as POSIX sh: busybox runs them), the WireGuard
//! configuration relay-peer renders (`wg-quick strip` parses it as wg-quick@wg0 will), and the
//! tenant firewall the firewall step renders (`nft -c`, then loaded in a network namespace).

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
        shellcheck_clean(&dir.path().join(name), text);
    }
}

/// Run `cmd`, which must succeed; what it printed.
fn succeeds(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Write `text` at `path` and have shellcheck read it as POSIX sh (busybox runs these).
fn shellcheck_clean(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).unwrap();
    let out = Command::new("shellcheck")
        .args(["-s", "sh"])
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}:\n{}\n{text}",
        path.display(),
        String::from_utf8_lossy(&out.stdout)
    );
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
    let out = succeeds(Command::new("wg-quick").arg("strip").arg(&path));
    let stripped = String::from_utf8_lossy(&out.stdout);
    assert!(stripped.contains("PersistentKeepalive = 25") && !stripped.contains("Address"));
}

/// The tenant firewall as the firewall step renders it for a host on a home LAN: `nft -c`
/// accepts it, and loaded for real in a throwaway network namespace it holds every range of
/// the owner's, twice over (nft -f of the same file replaces the table: the unit's reload).
#[test]
fn the_tenant_firewall_passes_nft_and_refuses_every_owner_range() {
    use byo_core::render::nft::tenants::{Tenants, ruleset};
    if !have("nft") || !have("unshare") {
        return;
    }
    let text = ruleset(&Tenants {
        bridge: "lxdbr0".into(),
        bridge_address: "10.117.0.1".parse().unwrap(),
        host_nets4: vec![
            ("192.168.1.23".parse().unwrap(), 24),
            ("10.8.0.2".parse().unwrap(), 24),
            ("198.51.100.7".parse().unwrap(), 28),
        ],
        host_nets6: vec![("2001:db8:1::23".parse().unwrap(), 64)],
        wan4: vec!["203.0.113.9".parse().unwrap()],
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tenant-firewall.nft");
    std::fs::write(&path, &text).unwrap();
    let path = path.to_str().unwrap();
    let out = Command::new("unshare")
        .args(["--net", "--", "sh", "-c"])
        .arg(format!(
            "nft -c -f {path} && nft -f {path} && nft -f {path} && nft list table inet enverge_tenants"
        ))
        .output()
        .unwrap();
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unshare failed") {
        byo_core::testing::skip("a network namespace", "unshare --net needs root");
        return;
    }
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Named here, not read from the renderer's constants, so a range dropped there fails here.
    for range in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "10.8.0.0/24",
        "fc00::/7",
        "fe80::/10",
        "192.168.1.0/24",
        "198.51.100.0/28",
        "2001:db8:1::/64",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2002::/16",
        "203.0.113.9",
    ] {
        assert!(listed.contains(range), "{range} missing from:\n{listed}");
    }
    for rule in [
        "iifname \"lxdbr0\" jump tenant_to_host",
        "iifname \"lxdbr0\" jump tenant_out",
        "ip daddr 10.117.0.1 udp dport 53 accept",
        "ip daddr 10.117.0.1 tcp dport 53 accept",
        "ip daddr @owner_nets4 counter packets 0 bytes 0 drop",
        "ip daddr @owner_wan4 counter packets 0 bytes 0 drop",
        "meta nfproto ipv6 counter packets 0 bytes 0 drop",
        "tcp dport 25 counter packets 0 bytes 0 drop",
        "ct state new limit rate over 50/second burst 250 packets counter packets 0 bytes 0 drop",
        "ct state new ct count over 1024 counter packets 0 bytes 0 drop",
    ] {
        assert!(listed.contains(rule), "{rule:?} missing from:\n{listed}");
    }
}

/// The rails script node0's agent writes into a pair's containers: shellcheck-clean as POSIX
/// sh, and, run for real by busybox's sh (the minimal image's) on a port in a network
/// namespace, it leaves the plan's address, MTU and link up, drops a stale address, and
/// never leaves the port bare while runs overlap — the agent's run at create beside the
/// booting container's own (once seen as a worker's rail without its address after create).
#[test]
fn the_rails_script_passes_shellcheck_and_runs_twice_at_once_without_a_bare_moment() {
    use byo_agent::workers::{RailAddr, rails_script};
    if !have("shellcheck") || !have("busybox") || !have("unshare") || !have("ip") {
        return;
    }
    let script = rails_script(
        &[RailAddr {
            port: "rail0".into(),
            address: "192.168.100.11/24".into(),
            mtu: 9000,
        }],
        &[],
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rails.sh");
    shellcheck_clean(&path, &script);
    // Busybox's applets first on the PATH, as inside the minimal image.
    let applets = dir.path().join("bin");
    std::fs::create_dir(&applets).unwrap();
    succeeds(
        Command::new("busybox")
            .args(["--install", "-s"])
            .arg(&applets),
    );
    let path = path.to_str().unwrap();
    // Addressed once; then a stale address beside it, and eight runs at once while the port
    // is read in a loop: every read must show the address.
    let scenario = format!(
        r#"set -u
# The port made by iproute2 (busybox's ip makes no links); the rest is busybox's.
"$(command -v ip)" link add rail0 type veth peer name rail0b
export PATH={bin}:$PATH
busybox sh {path} || {{ echo "first run failed"; exit 1; }}
ip addr add 192.168.100.99/24 dev rail0
i=0; while [ $i -lt 8 ]; do busybox sh {path} >/dev/null 2>&1 & i=$((i + 1)); done
bare=0; n=0
while [ $n -lt 300 ]; do
  ip -o -4 addr show dev rail0 | grep -qF ' 192.168.100.11/24 ' || bare=$((bare + 1))
  n=$((n + 1))
done
wait
busybox sh {path} || {{ echo "a later run failed"; exit 1; }}
echo "bare=$bare"
ip -o -4 addr show dev rail0
ip -o link show dev rail0
"#,
        bin = applets.display()
    );
    let out = Command::new("unshare")
        .args(["--net", "--", "sh", "-c", &scenario])
        .output()
        .unwrap();
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unshare failed") {
        byo_core::testing::skip("a network namespace", "unshare --net needs root");
        return;
    }
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}\n{script}");
    assert!(said.contains("bare=0\n"), "the port was seen bare: {said}");
    assert!(said.contains(" 192.168.100.11/24 "), "{said}");
    assert!(
        !said.contains("192.168.100.99"),
        "the stale address stays: {said}"
    );
    assert!(said.contains("mtu 9000") && said.contains(",UP"), "{said}");
}
