//! C for real: the agent binary prepares a Debian system container in a real LXD daemon —
//! every step that can run there, with the profile's alternatives where it cannot (no zfs,
//! no snap, no hardware watchdog, no kernel WireGuard) — then a second run changes
//! nothing, and a restart of the machine leaves it prepared.

use crate::support;

use support::prepared::{enrolled, prepare, ssh, text};

#[test]
fn c_the_real_agent_prepares_a_debian_host_and_a_second_run_changes_nothing() {
    let Some(e) = enrolled("byo-prep", None) else {
        return;
    };
    let (host, ip) = (&e.host, e.ip.as_str());
    let (owner_file, operator_file) = (&e.owner_key, &e.operator_key);
    let before = ssh(ip, 22, "owner", owner_file, "true");
    assert!(
        before.status.success(),
        "the owner's login works before: {}",
        text(&before)
    );
    let relay_public = {
        let creds: serde_json::Value =
            serde_json::from_slice(&host.read("/etc/enverge/credentials.json").unwrap()).unwrap();
        creds["wireguard"]["peer_public_key"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let name = host.name().to_owned();

    // The run: every step, in order.
    let (ok, said) = prepare(host, &[]);
    if !ok && std::env::var("BYO_DEBUG_KEEP").is_ok() {
        eprintln!("kept {name} for debugging");
        std::mem::forget(e);
        panic!("preparation failed");
    }
    assert!(ok, "preparation failed:\n{said}");
    for step in byo_agent::prepare::STEP_NAMES {
        assert!(said.contains(step), "{step} was not reported:\n{said}");
    }
    assert!(
        said.contains("this profile's alternative"),
        "the alternatives are said in the report"
    );
    assert!(said.contains("watchdog") && said.contains("/dev/watchdog is absent"));

    // operator-access: an operator logs in as spark from outside, with sudo.
    let op = ssh(ip, 22, "spark", operator_file, "sudo -n id -u");
    assert!(op.status.success(), "{}", text(&op));
    assert_eq!(String::from_utf8_lossy(&op.stdout).trim(), "0");
    // owner-lockout: the owner's login is refused now.
    let owner = ssh(ip, 22, "owner", owner_file, "true");
    assert!(!owner.status.success(), "the owner still gets in");
    // The rest, as the host holds it.
    let facts = host.sh_ok(
        "dpkg-query -W -f='${Status}' docker.io 2>/dev/null | grep -q 'install ok' && echo docker-present || echo docker-gone
         systemctl is-active earlyoom
         cat /etc/modprobe.d/enverge-zfs.conf
         grep '^DEFAULT_FORWARD_POLICY' /etc/default/ufw
         lxc storage show default | grep '^driver:'
         lxc network get lxdbr0 ipv4.nat
         lxc profile show lofispark-base | grep -c 'network: lxdbr0'
         lxc image alias list --format csv | cut -d, -f1
         wg show wg0 peers
         id -nG spark
         stat -c '%U %a' /etc/enverge/serving.json",
    );
    for want in [
        "docker-gone",
        "\nactive\n",
        "options zfs zfs_arc_max=1073741824",
        "DEFAULT_FORWARD_POLICY=\"ACCEPT\"",
        "driver: dir",
        "\ntrue\n",
        "lofispark-base",
        relay_public.as_str(),
        "spark 600",
    ] {
        assert!(
            facts.contains(want),
            "{want:?} missing from what the host holds:\n{facts}"
        );
    }
    // lxd-install: serving reaches LXD through root's gate, so spark is in no LXD group (#36).
    let groups = host.sh_ok("id -nG spark");
    assert!(
        !groups.split_whitespace().any(|g| g == "lxd"),
        "spark is in the lxd group: {groups}"
    );

    // A second start finds the record and exits at once.
    let (ok, said) = prepare(host, &[]);
    assert!(
        ok && said.contains("preparation completed earlier"),
        "{said}"
    );
    // A newer binary re-checks every step: nothing applies (also the check-only benchmark).
    host.sh_ok("rm -f /etc/enverge/serving.json /var/lib/enverge-agent/prepare-done.json");
    let (ok, said) = prepare(host, &[]);
    assert!(ok, "{said}");
    assert!(
        !said.contains("Applying"),
        "a prepared host was changed:\n{said}"
    );

    // A restart: the machine comes back prepared, and preparation does not run again.
    host.restart();
    let (ok, said) = prepare(host, &[]);
    assert!(
        ok && said.contains("preparation completed earlier"),
        "{said}"
    );
    host.sh_ok("rm -f /var/lib/enverge-agent/prepare-done.json");
    let (ok, said) = prepare(host, &["--dry-run"]);
    assert!(
        ok && said.contains("nothing would change"),
        "after a restart:\n{said}"
    );
    let owner = ssh(ip, 22, "owner", owner_file, "true");
    assert!(!owner.status.success(), "the owner gets in after a restart");
    let op = ssh(ip, 22, "spark", operator_file, "sudo -n true");
    assert!(op.status.success(), "{}", text(&op));
}
