//! The test-host harness, proven for real: a Debian host container boots systemd, reaches the
//! Debian archive through the bridge, takes an ssh login from this machine, runs Debian's lxd
//! with a nested container, and comes back after a reboot. Each phase prints its time.

use crate::support;

use std::process::Command;
use std::time::Instant;

use support::host_container::HostContainer;

/// What the agent's prepare steps will have to do for a tenant LXD inside the host: a pool
/// and a bridge with an explicit address (auto-selection fails nested), the default profile
/// pointing at both. Then a busybox image, built here, runs as a nested container.
const NESTED_LXD: &str = r#"
set -euo pipefail
lxd waitready --timeout 60
lxc info >/dev/null
{
  lxc storage create default dir
  lxc network create lxdbr0 ipv4.address=10.232.0.1/24 ipv4.nat=true ipv6.address=none
  lxc profile device add default root disk path=/ pool=default
  lxc profile device add default eth0 nic network=lxdbr0 name=eth0
} >/dev/null

d=$(mktemp -d)
mkdir -p "$d/rootfs/bin" "$d/rootfs/sbin" "$d/rootfs/etc" "$d/rootfs/root" \
  "$d/rootfs/dev" "$d/rootfs/proc" "$d/rootfs/sys" "$d/rootfs/run" "$d/rootfs/tmp"
cp /bin/busybox "$d/rootfs/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ -e "$d/rootfs/bin/$applet" ] || ln -s busybox "$d/rootfs/bin/$applet"
done
ln -s ../bin/busybox "$d/rootfs/sbin/init"
cat >"$d/metadata.yaml" <<EOF
architecture: $(uname -m)
creation_date: $(date +%s)
properties:
  description: busybox
EOF
tar -C "$d" -czf "$d/metadata.tar.gz" metadata.yaml
tar -C "$d/rootfs" --numeric-owner -czf "$d/rootfs.tar.gz" .
lxc image import "$d/metadata.tar.gz" "$d/rootfs.tar.gz" --alias busybox >/dev/null
rm -rf "$d"
lxc launch busybox tenant >/dev/null
lxc exec tenant -- /bin/true
lxc list tenant --format csv -c s
"#;

fn phase(name: &str, since: Instant) -> Instant {
    eprintln!(
        "[host_container] {name}: {:.1} s",
        since.elapsed().as_secs_f64()
    );
    Instant::now()
}

#[test]
fn a_debian_host_container_boots_systemd_reaches_the_archive_and_survives_a_restart() {
    let start = Instant::now();
    let Some(host) = HostContainer::launch("byo-smoke") else {
        return;
    };
    let t = phase("launch (create + first boot)", start);
    assert_eq!(
        host.system_state(),
        "running",
        "failed units:\n{}",
        host.failed_units()
    );
    // As an owner's host comes: docker running, ufw enforcing with ssh allowed.
    let services = host.sh_ok("systemctl is-active docker ufw ssh; ufw status verbose");
    assert!(
        services.starts_with("active\nactive\nactive\n")
            && services.contains("Status: active")
            && services.contains("deny (incoming), allow (outgoing), deny (routed)"),
        "{services}"
    );
    let ip = host.ipv4();
    assert_eq!(ip.octets()[..3], [10, 231, 0], "on the test bridge: {ip}");

    // Egress through the bridge's NAT to the Debian archive. The lock timeout covers apt's
    // own timers, as it must for the agent.
    host.sh_ok("apt-get -o DPkg::Lock::Timeout=120 update -q");
    let t = phase("apt-get update", t);

    // dnsmasq-base is only a Recommends of lxd, yet a managed bridge cannot be made without
    // it ("dnsmasq: executable file not found").
    host.sh_ok(
        "DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -q \
         --no-install-recommends lxd dnsmasq-base busybox-static",
    );
    let t = phase("apt-get install lxd dnsmasq-base busybox-static", t);

    let state = host.sh_ok(NESTED_LXD);
    assert_eq!(state.trim(), "RUNNING", "the nested container runs");
    let t = phase("nested LXD: pool, bridge, busybox image, tenant running", t);

    ssh_login(&host);
    let t = phase("ssh login from this machine", t);

    host.restart();
    assert_eq!(
        host.system_state(),
        "running",
        "failed units after the restart:\n{}",
        host.failed_units()
    );
    let t = phase("restart (clean reboot back to running)", t);
    let state = host.sh_ok("lxd waitready --timeout 60 && lxc list tenant --format csv -c s");
    assert_eq!(state.trim(), "RUNNING", "the nested container came back");
    let t = phase("nested LXD back with its tenant", t);

    drop(host);
    phase("delete", t);
    phase("total", start);
}

/// A throwaway key in root's authorized_keys; `ssh root@IP true` from this machine.
fn ssh_login(host: &HostContainer) {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id_ed25519");
    let keygen = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "byo-test", "-f"])
        .arg(&key)
        .output();
    let Ok(keygen) = keygen else {
        byo_core::testing::skip("ssh-keygen", "openssh-client is not installed");
        return;
    };
    assert!(keygen.status.success(), "ssh-keygen: {keygen:?}");
    let public = std::fs::read(dir.path().join("id_ed25519.pub")).unwrap();
    host.sh_ok("install -d -m 700 /root/.ssh");
    host.write("/root/.ssh/authorized_keys", &public, 0o600);

    let out = Command::new("ssh")
        .args([
            "-F",
            "/dev/null",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=20",
            "-o",
            "LogLevel=ERROR",
            "-i",
        ])
        .arg(&key)
        .arg(format!("root@{}", host.ipv4()))
        .args(["cat", "/etc/hostname"])
        .output()
        .expect("run ssh");
    assert!(
        out.status.success(),
        "ssh root@{} failed: {}",
        host.ipv4(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), host.name());
}
