//! A pair's instance beyond node0 (K1 note 11, K2 note 7; L rules 3–4, L3): the worker
//! `<head>-w<k>` on each satellite, which node0's agent creates, deletes, starts and stops
//! with the head, over the management network (as spark with node0's peer key, the
//! satellite's host key pinned: never the rail, which the containers hold while they run).
//!
//! - Each container of a pair carries lofispark-dual, its node's cables as physical NICs
//!   (rail-network renders it per node), and sets the rails' addresses inside itself at
//!   every boot from [`RAILS_SCRIPT`], written at create: a restarted head or worker comes
//!   back addressed (L3.2).
//! - The head mints a launcher key per instance; its root holds the private half, and each
//!   worker's `user` trusts the public half alone. The customer's key is the head's only.
//! - What is in step and what is not is `byo_core::lockstep`'s decision; this module gathers
//!   what each satellite holds and makes the moves.

use std::time::Duration;

use byo_core::lockstep::{self, Half, Head, Move, Satellite, Worker};
use serde_json::json;

use crate::host::{Fallible, Host};
use crate::lxd;
pub use crate::machines::{
    Machines, PEER_KEY_COMMENT, PairNode, RailAddr, SERVING_PEER_KEY, SERVING_STATE,
    SatelliteHosts, SshSatelliteHosts, known_hosts_file,
};
use crate::names::{BASE_ALIAS, DUAL_PROFILE, PROFILE_NAME};

pub use crate::names::HEAD_KEY;
/// Inside each container of a pair: the rails it holds, addressed at every boot.
pub const RAILS_SCRIPT: &str = "/etc/enverge/rails.sh";
/// Inside a worker: the launcher key's public half, which its `user` trusts alone.
const LAUNCHER_PUB: &str = "/etc/enverge/launcher.pub";
/// Inside the head: every node of the instance and its rail addresses, for the customer.
pub const CLUSTER_MD: &str = "/etc/enverge/cluster.md";
/// The account a worker is reached as, from the head, with the launcher key.
pub const WORKER_USER: &str = "user";

/// An interface name as the kernel allows it, and nothing a shell would read.
fn is_port_name(name: &str) -> bool {
    (1..=15).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

/// The routes node `index`'s container carries on a ring (none on a pair): to each rail it is
/// not on, through the neighbour that is (`byo_core::ring`).
pub fn ring_routes(pair: &Machines, index: u32) -> Vec<byo_core::ring::Route> {
    let nodes: Vec<byo_core::ring::NodeAddrs> = pair
        .nodes
        .iter()
        .map(|n| byo_core::ring::NodeAddrs {
            index: n.index,
            addresses: n.rails.iter().map(|r| r.address.clone()).collect(),
        })
        .collect();
    byo_core::ring::routes(&nodes, index)
}

/// The script a container of a pair or a ring runs at every boot: its cables' addresses and
/// MTU; on a ring, forwarding on its cables and a route to each rail it is not on (K2 note 7).
pub fn rails_script(rails: &[RailAddr], routes: &[byo_core::ring::Route]) -> Fallible<String> {
    // Never a moment without the address: node0's agent runs this at create while a container
    // still booting may run it too (its init's sysinit, its unit), so a flush-then-add would
    // let one run take away what the other just set. Only other addresses are deleted; an
    // add refused because the address is there is success; anything else fails loudly.
    let mut s = String::from(
        "#!/bin/sh\n# This container's rails (lofispark-dual), written by node0's agent at create;\n# run at every boot, so a restarted container comes back addressed.\nset -e\n",
    );
    for r in rails {
        let addr_ok = r.address.split_once('/').is_some_and(|(a, len)| {
            a.parse::<std::net::Ipv4Addr>().is_ok() && len.parse::<u8>().is_ok_and(|l| l <= 32)
        });
        if !is_port_name(&r.port) || !addr_ok {
            return Err(format!("a rail does not read: {} {}", r.port, r.address));
        }
        s.push_str(&format!(
            "ip link set dev {p} mtu {m}\n\
             for old in $(ip -o -4 addr show dev {p} | awk '{{print $4}}'); do\n\
             \x20 [ \"$old\" = {a} ] || ip addr del \"$old\" dev {p}\n\
             done\n\
             ip addr add {a} dev {p} 2>/dev/null || ip -o -4 addr show dev {p} | grep -qF ' {a} '\n\
             ip link set dev {p} up\n",
            p = r.port,
            m = r.mtu,
            a = r.address
        ));
    }
    let ip = |a: &str| {
        a.split('/')
            .next()
            .is_some_and(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
    };
    for route in routes {
        if !ip(&route.to) || !ip(&route.via) {
            return Err(format!(
                "a route does not read: {} via {}",
                route.to, route.via
            ));
        }
    }
    if !routes.is_empty() {
        // Forwarding on the cables only: what arrives on a rail may go on to the next rail.
        for r in rails {
            s.push_str(&format!(
                "echo 1 > /proc/sys/net/ipv4/conf/{p}/forwarding\n",
                p = r.port
            ));
        }
        for route in routes {
            s.push_str(&format!(
                "ip route replace {} via {}\n",
                route.to, route.via
            ));
        }
    }
    Ok(s)
}

/// The unit a systemd image runs the rails script from (the minimal image's inittab does it).
const RAILS_UNIT: &str = "[Unit]\nDescription=enverge: this container's rails\nBefore=network-online.target\n\n[Service]\nType=oneshot\nExecStart=/bin/sh /etc/enverge/rails.sh\n\n[Install]\nWantedBy=multi-user.target\n";

/// Put a pair's rails into a container that runs: the script, its boot hook where the image
/// runs systemd, and the addresses now.
fn address_rails<H: Host + ?Sized>(
    h: &mut H,
    instance: &str,
    pair: &Machines,
    index: u32,
) -> Fallible<()> {
    let rails = pair
        .nodes
        .iter()
        .find(|n| n.index == index)
        .map(|n| n.rails.as_slice())
        .unwrap_or_default();
    let script = rails_script(rails, &ring_routes(pair, index))?;
    mkdir(h, instance, "/etc/enverge", 0o755)?;
    lxd::push(h, instance, RAILS_SCRIPT, script.as_bytes(), 0o755)?;
    let systemd = lxd::exec(h, instance, &["test", "-d", "/run/systemd/system"])?.code == 0;
    if systemd {
        lxd::push(
            h,
            instance,
            "/etc/systemd/system/enverge-rails.service",
            RAILS_UNIT.as_bytes(),
            0o644,
        )?;
        let out = lxd::exec(
            h,
            instance,
            &["systemctl", "enable", "enverge-rails.service"],
        )?;
        if out.code != 0 {
            return Err(format!("enabling the rails' unit: {}", out.stderr.trim()));
        }
    }
    let run = |h: &mut H| -> Fallible<()> {
        let out = lxd::exec(h, instance, &["/bin/sh", RAILS_SCRIPT])?;
        if out.code != 0 {
            return Err(format!(
                "addressing the rails in {instance}: {}",
                out.stderr.trim()
            ));
        }
        Ok(())
    };
    run(h)?;
    // Handed over addressed, and still addressed a moment later: the ports arrived with the
    // container's start, which may still be running its own boot (its init runs this script
    // too). A port seen bare is addressed again, within a bound, and named when it will not
    // stay: caught here rather than by the customer's first job across the cables.
    let check: String = rails
        .iter()
        .map(|r| {
            format!(
                "ip -o -4 addr show dev {p} | grep -qF ' {a} ' || echo {p}\n",
                p = r.port,
                a = r.address
            )
        })
        .collect();
    let deadline = std::time::Instant::now() + RAILS_SETTLE;
    let mut steady = 0;
    while steady < 3 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let out = lxd::exec(h, instance, &["/bin/sh", "-c", &check])?;
        let bare = out.stdout.split_whitespace().collect::<Vec<_>>().join(", ");
        if out.code == 0 && bare.is_empty() {
            steady += 1;
            continue;
        }
        steady = 0;
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "{instance}'s {bare} would not keep its rail address for a second within {}s",
                RAILS_SETTLE.as_secs()
            ));
        }
        tracing::warn!(%instance, ports = %bare, "a rail lost its address right after it was set; addressing it again");
        run(h)?;
    }
    Ok(())
}

/// How long a container's rails may take to stay addressed after create.
const RAILS_SETTLE: std::time::Duration = std::time::Duration::from_secs(15);

fn mkdir<H: Host + ?Sized>(h: &mut H, instance: &str, path: &str, mode: u32) -> Fallible<()> {
    let out = lxd::exec(
        h,
        instance,
        &[
            "/bin/sh",
            "-c",
            &format!("mkdir -p {path} && chmod {mode:o} {path}"),
        ],
    )?;
    if out.code != 0 {
        return Err(format!(
            "making {path} in {instance}: {}",
            out.stderr.trim()
        ));
    }
    Ok(())
}

/// A launcher key for one instance.
pub struct Launcher {
    /// The private half in OpenSSH's format (`/root/.ssh/id_ed25519`, for OpenSSH's client).
    pub openssh: String,
    /// The private half in dropbear's format (`/root/.ssh/id_dropbear`: the minimal image's
    /// client, dbclient, reads no OpenSSH private key).
    pub dropbear: Vec<u8>,
    /// The public line each worker's `user` trusts alone.
    pub public: String,
}

pub fn mint_launcher(head: &str) -> Fallible<Launcher> {
    use ssh_key::{Algorithm, LineEnding, PrivateKey, rand_core::OsRng};
    let mut key = PrivateKey::random(&mut OsRng, Algorithm::Ed25519)
        .map_err(|e| format!("making the launcher key: {e}"))?;
    key.set_comment(format!("enverge-launcher-{head}"));
    let openssh = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| format!("encoding the launcher key: {e}"))?
        .to_string();
    let public = key
        .public_key()
        .to_openssh()
        .map_err(|e| format!("encoding the launcher key: {e}"))?;
    Ok(Launcher {
        openssh,
        dropbear: dropbear_private(&key)?,
        public,
    })
}

/// An Ed25519 private key as dropbear keeps it: the key type, then the 32-byte seed and the
/// 32-byte public key as one 64-byte string (dropbear's `buf_put_ed25519_priv_key`).
pub fn dropbear_private(key: &ssh_key::PrivateKey) -> Fallible<Vec<u8>> {
    let pair = key
        .key_data()
        .ed25519()
        .ok_or("dropbear's format is written for Ed25519 keys only")?;
    let mut out = Vec::with_capacity(4 + 11 + 4 + 64);
    out.extend_from_slice(&11u32.to_be_bytes());
    out.extend_from_slice(b"ssh-ed25519");
    out.extend_from_slice(&64u32.to_be_bytes());
    out.extend_from_slice(&pair.private.to_bytes());
    out.extend_from_slice(pair.public.as_ref());
    Ok(out)
}

/// Once the head runs, the rest of the instance: on a pair or a ring the launcher key minted,
/// the head's rails and key, and a worker on every satellite, which must start (one GPU sold
/// as two is not an instance); on one Spark the head is the whole instance. A refusal is the
/// caller's to revert ([`remove`], with the head).
pub fn complete_instance<H: Host + ?Sized>(h: &mut H, pair: &Machines, head: &str) -> Fallible<()> {
    if pair.is_single() {
        return Ok(());
    }
    let launcher = mint_launcher(head)?;
    prepare_head(h, pair, head, &launcher)
        .map_err(|e| format!("the head's rails could not be set: {e}"))?;
    launch(pair, head, &launcher.public)
}

/// The head's side of a pair: the launcher key's private half for root, its rails, and
/// cluster.md naming every node.
pub fn prepare_head<H: Host + ?Sized>(
    h: &mut H,
    pair: &Machines,
    head: &str,
    launcher: &Launcher,
) -> Fallible<()> {
    mkdir(h, head, "/root/.ssh", 0o700)?;
    lxd::push(
        h,
        head,
        "/root/.ssh/id_ed25519",
        launcher.openssh.as_bytes(),
        0o600,
    )?;
    lxd::push(h, head, "/root/.ssh/id_dropbear", &launcher.dropbear, 0o600)?;
    address_rails(h, head, pair, 0)?;
    lxd::push(
        h,
        head,
        CLUSTER_MD,
        cluster_md(pair, head).as_bytes(),
        0o644,
    )
}

/// `/etc/enverge/cluster.md` in the head: which container is where, and how to reach it.
pub fn cluster_md(pair: &Machines, head: &str) -> String {
    let mut s = format!(
        "# This instance: {} machines\n\nThe head (this container) and its workers, joined by the rails. From here, reach a worker as `{WORKER_USER}` over a rail address (the launcher key in /root/.ssh is the only key a worker trusts):\n\n    ssh {WORKER_USER}@<a worker's rail address>\n\n| node | container | rail addresses |\n|---|---|---|\n",
        pair.nodes.len()
    );
    for n in &pair.nodes {
        let name = if n.index == 0 {
            format!("{head} (head)")
        } else {
            lockstep::worker_name(head, n.index)
        };
        let addrs: Vec<&str> = n.rails.iter().map(|r| r.address.as_str()).collect();
        s.push_str(&format!(
            "| node{} | {name} | {} |\n",
            n.index,
            addrs.join(", ")
        ));
    }
    // A ring: the node no cable of the head's reaches, and how traffic gets there.
    let routes = ring_routes(pair, 0);
    if !routes.is_empty() {
        let head_nets: Vec<String> = routes.iter().map(|r| r.to.clone()).collect();
        for n in pair.nodes.iter().filter(|n| n.index != 0) {
            let beyond = n.rails.iter().all(|r| {
                byo_core::ring::subnet(&r.address).is_some_and(|net| head_nets.contains(&net))
            });
            if beyond {
                s.push_str(&format!(
                    "\n{} (node{}) has no cable to the head: it is reached one hop through a neighbour, every node forwarding between its rails.\n",
                    lockstep::worker_name(head, n.index),
                    n.index
                ));
            }
        }
        s.push_str("\nRoutes in the head:\n\n");
        for r in &routes {
            s.push_str(&format!("    {} via {}\n", r.to, r.via));
        }
    }
    s
}

/// Our containers on one satellite (those recording a head).
fn workers_on(h: &mut dyn Host) -> Fallible<Vec<Worker>> {
    Ok(lxd::instances(h)?
        .iter()
        .filter_map(|i| {
            Some(Worker {
                name: i["name"].as_str()?.to_owned(),
                head: i["config"][HEAD_KEY].as_str()?.to_owned(),
                running: i["status"] == "Running",
            })
        })
        .collect())
}

/// What each satellite answers now.
pub fn observe(pair: &Machines) -> Vec<(u32, Satellite)> {
    pair.satellites()
        .map(|n| {
            let seen = pair.hosts.host(n).and_then(|mut h| workers_on(&mut *h));
            (
                n.index,
                match seen {
                    Ok(w) => Satellite::Holds(w),
                    Err(e) => Satellite::Unreachable(e),
                },
            )
        })
        .collect()
}

/// Make the moves lockstep decided; the ones that failed, named.
pub fn make(pair: &Machines, moves: &[Move]) -> Vec<String> {
    let mut failed = Vec::new();
    for m in moves {
        let Some(node) = pair.satellites().find(|n| n.index == m.node()) else {
            continue;
        };
        let done = pair.hosts.host(node).and_then(|mut h| match m {
            Move::Start { worker, .. } => lxd::state(&mut *h, worker, "start"),
            Move::Stop { worker, .. } => lxd::state(&mut *h, worker, "stop"),
            Move::Delete { worker, .. } => lxd::delete_instance(&mut *h, worker),
        });
        match done {
            Ok(()) => tracing::info!(%m, "lockstep"),
            Err(e) => {
                tracing::warn!(%m, error = %e, "lockstep: the move failed");
                failed.push(format!("{m}: {e}"));
            }
        }
    }
    failed
}

/// Keep the satellites in step with `head` (L rule 4): the moves made, and why the host is
/// half a pair (unreachable satellites, missing workers, moves that failed).
pub fn keep(pair: &Machines, head: Option<&Head>) -> (Vec<Move>, Vec<String>) {
    let decided = lockstep::keep(head, &observe(pair));
    let failed = make(pair, &decided.moves);
    let mut half: Vec<String> = decided.half.iter().map(Half::to_string).collect();
    half.extend(failed);
    (decided.moves, half)
}

/// K1 11.1: any worker already on a satellite goes before a create. A satellite that
/// cannot be reached fails the create before anything is made.
pub fn clear(pair: &Machines) -> Fallible<()> {
    for n in pair.satellites() {
        let mut h = pair
            .hosts
            .host(n)
            .map_err(|e| format!("node{} cannot be reached: {e}", n.index))?;
        let old =
            workers_on(&mut *h).map_err(|e| format!("node{} cannot be reached: {e}", n.index))?;
        for w in old {
            tracing::info!(worker = %w.name, node = n.index, "a worker left from before goes first");
            lxd::delete_instance(&mut *h, &w.name)
                .map_err(|e| format!("removing {} from node{}: {e}", w.name, n.index))?;
        }
    }
    Ok(())
}

/// Launch `head`'s worker on every satellite, each trusting `launcher_public` alone. A worker
/// that will not start fails it (one GPU sold as two is not an instance); the caller's revert
/// ([`remove`], with the head) takes back every worker launched.
pub fn launch(pair: &Machines, head: &str, launcher_public: &str) -> Fallible<()> {
    for n in pair.satellites() {
        let mut h = pair.hosts.host(n)?;
        launch_one(&mut *h, pair, n, head, launcher_public)?;
    }
    Ok(())
}

fn launch_one(
    h: &mut dyn Host,
    pair: &Machines,
    n: &PairNode,
    head: &str,
    launcher_public: &str,
) -> Fallible<()> {
    let name = lockstep::worker_name(head, n.index);
    let body = json!({
        "name": name,
        "type": "container",
        "source": {"type": "image", "alias": BASE_ALIAS},
        "profiles": [PROFILE_NAME, DUAL_PROFILE],
        "config": {HEAD_KEY: head},
    });
    lxd::json_call(h, "POST", "/1.0/instances", &body).map_err(|e| {
        format!(
            "the worker {name} could not be created on node{}: {e}",
            n.index
        )
    })?;
    lxd::state(h, &name, "start")
        .map_err(|e| format!("the worker {name} would not start on node{}: {e}", n.index))?;
    let inside = |h: &mut dyn Host| -> Fallible<()> {
        address_rails(h, &name, pair, n.index)?;
        lxd::push(
            h,
            &name,
            LAUNCHER_PUB,
            format!("{}\n", launcher_public.trim()).as_bytes(),
            0o644,
        )?;
        let script = format!(
            "set -e\n\
             if ! grep -q '^{u}:' /etc/passwd; then\n\
               if command -v useradd >/dev/null 2>&1; then useradd -m -s /bin/bash -p '*' {u}\n\
               else echo '{u}:x:1000:1000:enverge worker:/home/{u}:/bin/sh' >>/etc/passwd; echo '{u}:x:1000:' >>/etc/group; fi\n\
             fi\n\
             home=$(awk -F: '$1 == \"{u}\" {{print $6}}' /etc/passwd)\n\
             mkdir -p \"$home/.ssh\"\n\
             cp {LAUNCHER_PUB} \"$home/.ssh/authorized_keys\"\n\
             chmod 700 \"$home/.ssh\"; chmod 600 \"$home/.ssh/authorized_keys\"\n\
             chown -R {u}:{u} \"$home\"\n\
             rm -f /root/.ssh/authorized_keys\n",
            u = WORKER_USER
        );
        let out = lxd::exec(h, &name, &["/bin/sh", "-c", &script])?;
        if out.code != 0 {
            return Err(format!(
                "the launcher key could not be put in: {}",
                out.stderr.trim()
            ));
        }
        Ok(())
    };
    inside(h).map_err(|e| format!("the worker {name} on node{}: {e}", n.index))
}

/// `op` on `head`'s worker on every satellite: the ones it failed on, with why.
fn each_worker(
    pair: &Machines,
    head: &str,
    op: impl Fn(&mut dyn Host, &str) -> Fallible<()>,
) -> Vec<(String, u32, String)> {
    pair.satellites()
        .filter_map(|n| {
            let name = lockstep::worker_name(head, n.index);
            let done = pair.hosts.host(n).and_then(|mut h| op(&mut *h, &name));
            done.err().map(|e| (name, n.index, e))
        })
        .collect()
}

/// Remove `head`'s workers (a delete, or a create reverted). A satellite that cannot be
/// reached keeps its worker until lockstep removes it (its head is gone): named, not fatal.
pub fn remove(pair: &Machines, head: &str) -> Vec<String> {
    each_worker(pair, head, |h, name| lxd::delete_instance(h, name))
        .into_iter()
        .map(|(name, node, e)| {
            tracing::warn!(%name, node, error = %e, "the worker stays until its node answers (lockstep removes it)");
            format!("{name} on node{node}: {e}")
        })
        .collect()
}

/// Start or stop `head`'s workers with it (a customer's start, stop or reboot).
pub fn power(pair: &Machines, head: &str, action: &str) -> Vec<String> {
    each_worker(pair, head, |h, name| lxd::state(h, name, action))
        .into_iter()
        .map(|(name, node, e)| format!("{action} {name} on node{node}: {e}"))
        .collect()
}

/// Where a satellite's spark logs in from (M.4: node1's belongs to the spark user node0
/// already reaches it as).
const SATELLITE_AUTHORIZED_KEYS: &str = "/home/spark/.ssh/authorized_keys";

/// M.4 on a pair or a ring: the operators' keys, as node0 just applied them, written to each
/// satellite's spark, which keeps node0's peer key (the line preparation marked) and nothing
/// else of before. Returns what could not be written, by node; a push that misses one fails and
/// says so (M.6), and sending again repairs it.
pub fn push_operator_keys(pair: &Machines, authorized_keys: &str) -> Vec<String> {
    push_operator_keys_within(pair, authorized_keys, SATELLITE_PUSH_DEADLINE)
}

/// How long a push waits for the satellites. The backend gives the whole push 20 s, and a
/// satellite that went away under a live connection takes ssh longer than that to give up on
/// (the keep-alives, then the connect timeout): past this it is named as not answering, and
/// its write, should it land later, is the same list.
const SATELLITE_PUSH_DEADLINE: Duration = Duration::from_secs(12);

fn push_operator_keys_within(
    pair: &Machines,
    authorized_keys: &str,
    deadline: Duration,
) -> Vec<String> {
    // Every satellite at once, each on its own thread, so one that hangs holds no other up
    // and is left behind at the deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    let satellites: Vec<u32> = pair.satellites().map(|n| n.index).collect();
    for n in pair.satellites().cloned() {
        let (tx, pair, keys) = (tx.clone(), pair.clone(), authorized_keys.to_owned());
        std::thread::spawn(move || {
            let _ = tx.send((n.index, write_satellite_keys(&pair, &n, &keys)));
        });
    }
    drop(tx);
    let until = std::time::Instant::now() + deadline;
    let mut done = std::collections::BTreeMap::new();
    while done.len() < satellites.len() {
        match rx.recv_timeout(until.saturating_duration_since(std::time::Instant::now())) {
            Ok((index, outcome)) => {
                done.insert(index, outcome);
            }
            Err(_) => break,
        }
    }
    satellites
        .into_iter()
        .filter_map(|index| {
            let e = match done.remove(&index) {
                Some(Ok(())) => return None,
                Some(Err(e)) => e,
                None => format!("did not answer within {} s", deadline.as_secs_f32()),
            };
            tracing::warn!(node = index, error = %e, "the operator keys could not be written on a satellite");
            Some(format!(
                "node{index}: {}",
                e.chars().take(300).collect::<String>()
            ))
        })
        .collect()
}

/// One satellite's spark login file made `authorized_keys` plus the peer-key line kept.
fn write_satellite_keys(pair: &Machines, n: &PairNode, authorized_keys: &str) -> Fallible<()> {
    let mut h = pair.hosts.host(n)?;
    let now = crate::host::read_string(&mut *h, SATELLITE_AUTHORIZED_KEYS)?.unwrap_or_default();
    let mut want = authorized_keys.trim_end().to_owned();
    want.push('\n');
    for line in now
        .lines()
        .filter(|l| l.trim_end().ends_with(PEER_KEY_COMMENT))
    {
        want.push_str(line.trim_end());
        want.push('\n');
    }
    if want != now {
        h.write(
            SATELLITE_AUTHORIZED_KEYS,
            want.as_bytes(),
            0o600,
            "spark:spark",
        )?;
    }
    Ok(())
}

/// L4.1–2: each satellite's deferred reboot, first (with no agent of its own, nothing is left
/// to tell it once node0 is down). One that does not answer does not block (L4.3).
pub fn reboot_satellites(pair: &Machines, in_secs: u64) -> Vec<byo_wire::vm::SatelliteRebooting> {
    pair.satellites()
        .map(|n| {
            let delay = format!("--on-active={in_secs}");
            let done = pair.hosts.host(n).and_then(|mut h| {
                crate::host::must(
                    &mut *h,
                    &["systemd-run", &delay, "--unit=enverge-pair-reboot", "--collect", "systemctl", "reboot"],
                )
                .map(drop)
            });
            if let Err(e) = &done {
                tracing::warn!(node = n.index, error = %e, "a satellite could not be told to reboot; node0 reboots all the same");
            }
            byo_wire::vm::SatelliteRebooting {
                node: n.index,
                rebooting: done.is_ok(),
                error: done.err().map(|e| e.chars().take(300).collect()),
            }
        })
        .collect()
}

/// Once a pair's containers are gone, each machine's rails are the host's again: LXD moves
/// the ports back, down and bare (networkd does not raise a port someone else took down), and
/// the host's own network configuration addresses them again — `netplan apply`, as
/// rail-network did: on a satellite over sudo, on node0 by root's `enverge-agent-rails.path`,
/// which serving asks through its flag (serving itself holds no privilege). What is still
/// bare after that is named.
pub fn rails_restored<H: Host + ?Sized>(h0: &mut H, pair: &Machines) -> Vec<String> {
    let mut missing = Vec::new();
    let node0 = pair.node0_rails();
    if !bare_rails(h0, node0).is_empty() {
        let asked = pair
            .rails_flag
            .as_ref()
            .map(|flag| std::fs::write(flag, b"requested by serving\n"));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let bare = bare_rails(h0, node0);
            if bare.is_empty() {
                break;
            }
            if std::time::Instant::now() > deadline || !matches!(asked, Some(Ok(()))) {
                missing.push(format!(
                    "node0's {} came back without its rail address{}",
                    bare.join(", "),
                    match &asked {
                        Some(Err(e)) => format!(" (asking root to apply the network configuration failed: {e})"),
                        None => " (nobody to ask to apply the network configuration)".to_owned(),
                        Some(Ok(())) => " within 30 s of asking root to apply the network configuration".to_owned(),
                    }
                ));
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }
    for n in pair.satellites() {
        let fixed = pair.hosts.host(n).and_then(|mut h| {
            if bare_rails(&mut *h, &n.rails).is_empty() {
                return Ok(());
            }
            crate::host::must(&mut *h, &["netplan", "apply"])?;
            // networkd may address the port only after `netplan apply` returns (the pair bed's
            // revert once found node1's rail0 bare right after it): wait, as node0's path does.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let bare = bare_rails(&mut *h, &n.rails);
                if bare.is_empty() {
                    return Ok(());
                }
                if std::time::Instant::now() > deadline {
                    return Err(format!(
                        "{} still without its rail address 30 s after netplan apply",
                        bare.join(", ")
                    ));
                }
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
        });
        if let Err(e) = fixed {
            missing.push(format!("node{}: {e}", n.index));
        }
    }
    for m in &missing {
        tracing::warn!(rails = %m, "a rail's address was not restored");
    }
    missing
}

/// The ports of `rails` that do not hold their address on this machine now.
fn bare_rails<H: Host + ?Sized>(h: &mut H, rails: &[RailAddr]) -> Vec<String> {
    rails
        .iter()
        .filter(|r| {
            let out = h.run(&["ip", "-o", "-4", "addr", "show", "dev", &r.port], None);
            !out.is_ok_and(|o| o.ok() && o.stdout.split_whitespace().any(|w| w == r.address))
        })
        .map(|r| r.port.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn rail(port: &str, address: &str) -> RailAddr {
        RailAddr {
            port: port.into(),
            address: address.into(),
            mtu: 9000,
        }
    }

    /// Satellites that refuse at once, hang until the test lets them go, or are never asked.
    #[derive(Debug)]
    struct Stalled(std::sync::Mutex<std::sync::mpsc::Receiver<()>>);

    impl SatelliteHosts for Stalled {
        fn host(&self, node: &PairNode) -> Fallible<Box<dyn Host>> {
            match node.index {
                1 => Err("Connection refused".into()),
                _ => {
                    let _ = self.0.lock().unwrap().recv_timeout(Duration::from_secs(30));
                    Err("hung, then gave up".into())
                }
            }
        }
    }

    #[test]
    fn m_4_a_satellite_that_hangs_is_named_at_the_deadline_beside_one_that_refused() {
        let (release, hold) = std::sync::mpsc::channel();
        let node = |index: u32| PairNode {
            index,
            mgmt_addr: Some(format!("10.0.0.{index}")),
            host_key: None,
            lxd_socket: None,
            rails: Vec::new(),
        };
        let pair = Machines {
            nodes: vec![node(0), node(1), node(2)],
            hosts: Arc::new(Stalled(std::sync::Mutex::new(hold))),
            rails_flag: None,
        };
        let missed =
            push_operator_keys_within(&pair, "ssh-ed25519 AAAA op", Duration::from_millis(300));
        release.send(()).unwrap();
        assert_eq!(
            missed,
            [
                "node1: Connection refused".to_owned(),
                "node2: did not answer within 0.3 s".to_owned()
            ]
        );
    }

    #[test]
    fn the_rails_script_addresses_each_cable_and_refuses_what_a_shell_would_read() {
        let s = rails_script(&[rail("rail0", "192.168.100.11/24")], &[]).unwrap();
        // A pair: no forwarding, no route.
        assert!(!s.contains("forwarding") && !s.contains("route"), "{s}");
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(
            s.contains("ip addr add 192.168.100.11/24 dev rail0 2>/dev/null || "),
            "{s}"
        );
        // A second run never leaves the port bare, even for a moment.
        assert!(!s.contains("flush"), "{s}");
        assert!(s.contains("\nset -e\n"), "{s}");
        assert!(s.contains("ip link set dev rail0 mtu 9000\n"), "{s}");
        for (port, addr) in [
            ("rail0;reboot", "192.168.100.11/24"),
            ("rail0", "192.168.100.11/24; reboot"),
            ("rail0", "192.168.100.300/24"),
            ("a-name-longer-than-15", "192.168.100.11/24"),
        ] {
            assert!(
                rails_script(&[rail(port, addr)], &[]).is_err(),
                "{port} {addr}"
            );
        }
        let route = |to: &str, via: &str| byo_core::ring::Route {
            to: to.into(),
            via: via.into(),
        };
        let ring = rails_script(
            &[
                rail("rail0", "192.168.100.10/24"),
                rail("rail1", "192.168.101.10/24"),
            ],
            &[route("192.168.102.0/24", "192.168.100.11")],
        )
        .unwrap();
        assert!(
            ring.contains("echo 1 > /proc/sys/net/ipv4/conf/rail0/forwarding\n"),
            "{ring}"
        );
        assert!(
            ring.contains("echo 1 > /proc/sys/net/ipv4/conf/rail1/forwarding\n"),
            "{ring}"
        );
        assert!(
            ring.ends_with("ip route replace 192.168.102.0/24 via 192.168.100.11\n"),
            "{ring}"
        );
        assert!(
            rails_script(
                &[rail("rail0", "192.168.100.10/24")],
                &[route("x; reboot", "1.2.3.4")]
            )
            .is_err()
        );
    }

    #[test]
    fn the_launcher_key_is_fresh_per_instance_and_names_its_head() {
        let a = mint_launcher("vm-a").unwrap();
        let b = mint_launcher("vm-a").unwrap();
        assert_ne!(a.public, b.public);
        assert!(
            a.public.starts_with("ssh-ed25519 ") && a.public.ends_with("enverge-launcher-vm-a")
        );
        let parsed = ssh_key::PrivateKey::from_openssh(&a.openssh).unwrap();
        assert_eq!(parsed.public_key().to_openssh().unwrap(), a.public);
        // dropbear's form: the type, then seed and public key; the public key is the line's.
        let d = &a.dropbear;
        assert_eq!(d.len(), 4 + 11 + 4 + 64);
        assert_eq!(&d[4..15], b"ssh-ed25519");
        assert_eq!(&d[15..19], &64u32.to_be_bytes());
        let public = parsed.public_key().key_data().ed25519().unwrap().0;
        assert_eq!(&d[51..], &public[..]);
    }
}
