//! Issue #36, "serving is root in all but name": on the prepared host, with the customer's
//! instance `c1` running, what serving's account (spark) can reach. It is not in LXD's group,
//! so LXD's own socket refuses it; root's gate (the unit install.sh writes) forwards what
//! serving does and refuses the calls that would make a member of `lxd` root — each refused
//! before LXD sees it, with nothing changed; the owner's own container is neither listed nor
//! touched. The serving process itself cannot gain privileges (sudo is spark's, for
//! operators' logins, and useless to a process with no new privileges), cannot read root's
//! secrets, and cannot write spark's `authorized_keys` (root's helper writes it; the pushes
//! in `m_serving_takes_lists_…` go through it).

use serde_json::{Value, json};

use super::World;
use byo_core::render::units::LXD_GATE_SOCKET;

/// `curl` as spark against `socket`: (HTTP status, body), or the status 0 when curl could
/// not connect.
fn as_spark(
    w: &World,
    socket: &str,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value) {
    let data = body.map_or(String::new(), |b| {
        format!("-H 'Content-Type: application/json' --data-binary '{b}'")
    });
    let out = w.host.sh(&format!(
        "runuser -u spark -- curl -sS --max-time 30 --unix-socket {socket} -X {method} {data} -w '\\n%{{http_code}}' 'http://lxd{path}'"
    ));
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = said.rsplit_once('\n').unwrap_or(("", "0"));
    (
        status.trim().parse().unwrap_or(0),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

fn names(w: &World) -> String {
    w.host.sh_ok("lxc list --format csv -c n")
}

pub(super) fn serving_cannot_make_itself_root(w: &World) {
    let groups = w.host.sh_ok("id -nG spark");
    assert!(
        !groups.split_whitespace().any(|g| g == "lxd"),
        "spark is in the lxd group: {groups}"
    );
    // LXD's own socket: spark may not even connect.
    let lxd_socket = w
        .host
        .sh_ok("for s in /var/lib/lxd/unix.socket /var/snap/lxd/common/lxd/unix.socket; do [ -S $s ] && echo $s; done; true");
    let lxd_socket = lxd_socket.lines().next().expect("LXD's socket");
    let (status, _) = as_spark(w, lxd_socket, "GET", "/1.0", None);
    assert_eq!(status, 0, "spark reached LXD's own socket");

    // The owner's own container, made as root without our marker.
    w.host
        .sh_ok("lxc init lofispark-base owners-box --profile lofispark-base");
    let before = names(w);
    assert!(
        before.contains("c1") && before.contains("owners-box"),
        "{before}"
    );

    // Through the gate: what serving does passes, and the list is ours alone.
    let (status, list) = as_spark(
        w,
        LXD_GATE_SOCKET,
        "GET",
        "/1.0/instances?recursion=1",
        None,
    );
    assert_eq!(status, 200, "{list}");
    let listed: Vec<&str> = list["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(listed, ["c1"], "the gate's list");
    let (status, _) = as_spark(w, LXD_GATE_SOCKET, "GET", "/1.0/instances/c1", None);
    assert_eq!(status, 200);

    // What a member of lxd would do to become root, each refused before LXD sees it.
    let create = |extra: Value| {
        let mut body = json!({
            "name": "escape", "type": "container",
            "source": {"type": "image", "alias": "lofispark-base"},
            "profiles": ["lofispark-base"],
            "config": {"user.enverge.ssh_port": "22001"},
        });
        for (k, v) in extra.as_object().unwrap() {
            if k == "config" {
                for (ck, cv) in v.as_object().unwrap() {
                    body["config"][ck] = cv.clone();
                }
            } else {
                body[k] = v.clone();
            }
        }
        body
    };
    let refused: Vec<(&str, &str, String, Option<Value>)> = vec![
        (
            "a privileged container",
            "POST",
            "/1.0/instances".into(),
            Some(create(json!({"config": {"security.privileged": "true"}}))),
        ),
        (
            "the host's / as a disk",
            "POST",
            "/1.0/instances".into(),
            Some(create(
                json!({"devices": {"root-of-host": {"type": "disk", "source": "/", "path": "/mnt/host"}}}),
            )),
        ),
        (
            "a proxy to LXD's socket",
            "POST",
            "/1.0/instances".into(),
            Some(create(
                json!({"devices": {"ssh": {"type": "proxy", "bind": "instance", "listen": "unix:/lxd.sock", "connect": format!("unix:{lxd_socket}")}}}),
            )),
        ),
        (
            "raw.lxc",
            "POST",
            "/1.0/instances".into(),
            Some(create(
                json!({"config": {"raw.lxc": "lxc.apparmor.profile=unconfined"}}),
            )),
        ),
        (
            "c1 made privileged",
            "PATCH",
            "/1.0/instances/c1".into(),
            Some(json!({"config": {"security.privileged": "true"}})),
        ),
        (
            "a device added to c1",
            "PUT",
            "/1.0/instances/c1".into(),
            Some(
                json!({"devices": {"root-of-host": {"type": "disk", "source": "/", "path": "/mnt/host"}}}),
            ),
        ),
        (
            "the base profile widened",
            "PUT",
            "/1.0/profiles/lofispark-base".into(),
            Some(json!({"config": {"security.privileged": "true"}})),
        ),
        (
            "LXD opened to the network",
            "PATCH",
            "/1.0".into(),
            Some(json!({"config": {"core.https_address": "[::]:8443"}})),
        ),
        (
            "a client certificate trusted",
            "POST",
            "/1.0/certificates".into(),
            Some(json!({"type": "client", "certificate": "x"})),
        ),
        (
            "the owner's container run",
            "PUT",
            "/1.0/instances/owners-box/state".into(),
            Some(json!({"action": "start"})),
        ),
        (
            "the owner's container deleted",
            "DELETE",
            "/1.0/instances/owners-box".into(),
            None,
        ),
        (
            "a command in the owner's container",
            "POST",
            "/1.0/instances/owners-box/exec".into(),
            Some(json!({"command": ["id"], "record-output": true})),
        ),
    ];
    for (what, method, path, body) in &refused {
        let (status, said) = as_spark(w, LXD_GATE_SOCKET, method, path, body.as_ref());
        assert_eq!(status, 403, "{what}: {said}");
        assert!(
            said["error"]
                .as_str()
                .unwrap_or_default()
                .starts_with("refused by the LXD gate"),
            "{what}: {said}"
        );
    }
    assert_eq!(names(w), before, "a refused call changed LXD's instances");
    let c1 = w.host.sh_ok("lxc config show c1");
    assert!(
        !c1.contains("security.privileged") && !c1.contains("root-of-host"),
        "{c1}"
    );
    assert!(
        !w.host
            .sh_ok("lxc profile show lofispark-base")
            .contains("security.privileged")
    );
    assert!(
        !w.host
            .sh_ok("lxc config get core.https_address")
            .contains("8443")
    );
    w.host.sh_ok("lxc delete owners-box");

    // The serving process: no new privileges (so spark's sudo is nothing to it), and root's
    // secrets out of its reach.
    let pid = w
        .host
        .sh_ok("systemctl show -p MainPID --value enverge-agent.service");
    let status = w.host.sh_ok(&format!("cat /proc/{}/status", pid.trim()));
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    let sudo = w
        .host
        .sh("setpriv --reuid=spark --regid=spark --init-groups --nnp -- sudo -n true");
    assert!(
        !sudo.status.success(),
        "sudo worked for spark with no new privileges"
    );
    assert!(
        w.host
            .sh("runuser -u spark -- sudo -n true")
            .status
            .success(),
        "an operator's spark keeps sudo"
    );
    let read = w
        .host
        .sh("runuser -u spark -- cat /etc/enverge/credentials.json");
    assert!(!read.status.success(), "spark read the host's credentials");

    // spark's .ssh is root's to write: in serving's own sandbox (its mount namespace) it is
    // read-only, so serving cannot add a key of its own to log in as spark and sudo. The file
    // root writes is spark's, as sshd reads it.
    let keys_before = w.host.sh_ok("cat /home/spark/.ssh/authorized_keys");
    let write = w.host.sh(&format!(
        "nsenter -t {} -m -- setpriv --reuid=spark --regid=spark --init-groups -- \
           sh -c 'echo ssh-ed25519 AAAAintruder intruder >> /home/spark/.ssh/authorized_keys'",
        pid.trim()
    ));
    assert!(
        !write.status.success(),
        "serving's sandbox let it write spark's keys"
    );
    assert!(
        String::from_utf8_lossy(&write.stderr).contains("Read-only file system"),
        "{}",
        String::from_utf8_lossy(&write.stderr)
    );
    assert_eq!(
        w.host.sh_ok("cat /home/spark/.ssh/authorized_keys"),
        keys_before
    );
    assert_eq!(
        w.host
            .sh_ok("stat -c '%U %a' /home/spark/.ssh/authorized_keys")
            .trim(),
        "spark 600"
    );
}
