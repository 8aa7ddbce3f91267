//! The cable bed (issue #15): Debian host containers like the single-host tests, joined by
//! cables. A cable is its own Linux bridge with no addresses, no DHCP and IPv6 off on this
//! machine's side, so it is a point-to-point link between exactly the containers attached to
//! it, each end with its kernel's eui64 link-local address (`/work/shared/notes/test-hosts.md`,
//! "A cable between two hosts"). Every container also sits on `byotestbr0`, the management LAN
//! they share with other machines — among them `extra`, cabled to nothing, which accepts the
//! same login: the rack of eleven Sparks.
//!
//! The simulated GB10 parts, and only those: which interfaces are RDMA ports (an iproute2
//! `rdma` stand-in listing them as RoCE links) and the GPU's identity (an `nvidia-smi` stand-in
//! printing a GB10 with a UUID of the bed's choosing), both in /usr/local/bin, ahead of the
//! real ones on every PATH the agent runs with (sudo's `secure_path` too). Ping, ip, sysctl,
//! sshd, sudo and the agent binary are the real ones.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::host_container::{HostContainer, bridge_gateway};

/// The login every machine of the bed accepts (node1's, and the rack neighbour's too).
pub const USER: &str = "owner";
pub const PASSWORD: &str = "cable-bed-Pa55word-7f3e";

/// node0's rail ports and node1's: two QSFPs, each two PCIe functions on one wire (rail0 and
/// its twin rail0b on one cable).
pub const NODE0_PORTS: &[&str] = &["rail0", "rail1"];
pub const NODE1_PORTS: &[&str] = &["rail0", "rail0b", "rail1", "rail1b"];
/// A ring's node2 and node3 GPUs (node1's is the pair's).
pub const RING_UUIDS: [&str; 2] = [
    "2222dddd-2222-4222-8222-222222222222",
    "3333eeee-3333-4333-8333-333333333333",
];

pub struct Bed {
    pub node0: HostContainer,
    pub node1: HostContainer,
    /// The rack neighbour, on the LAN only (not on a pair's preparation bed).
    extra: Option<HostContainer>,
    /// A ring's node2 and node3 (K2); none on a pair's bed.
    pub more: Vec<HostContainer>,
    /// `p15<pid>` + a cable number: LXD network names are interface names (15 bytes).
    tag: String,
    cables: std::cell::RefCell<Vec<String>>,
    plugged: std::cell::RefCell<Vec<(String, String)>>,
}

/// A GB10 `nvidia-smi` as `detect` asks it, with `uuid` as the GPU: the simulated identity.
fn nvidia_smi(uuid: &str) -> String {
    format!(
        "#!/bin/sh\n# The simulated GB10 part of the cable bed: a Debian container has no GPU.\n\
         echo 'NVIDIA GB10, GPU-{uuid}, [N/A], 580.65.06'\n"
    )
}

/// iproute2's `rdma -j link show` with `ports` as RoCE ports, in the shape iproute2 6.1 prints
/// them: the simulated RDMA part. Anything else it is asked fails, so nothing leans on it
/// unseen.
fn rdma(ports: &[&str]) -> String {
    let links: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                r#"{{"ifindex":{i},"ifname":"roce{p}","port":1,"state":"ACTIVE","physical_state":"LINK_UP","netdev":"{p}"}}"#
            )
        })
        .collect();
    format!(
        "#!/bin/sh\n# The simulated GB10 part of the cable bed: a Debian container has no ConnectX-7.\n\
         [ \"$*\" = '-j link show' ] || {{ echo 'rdma stand-in: only -j link show' >&2; exit 1; }}\n\
         echo '[{}]'\n",
        links.join(",")
    )
}

impl Bed {
    /// Three machines: node0 (with the agent binary), node1, and `extra` on the LAN only.
    pub fn launch(prefix: &str) -> Option<Bed> {
        Self::machines(prefix, true, 0)
    }

    /// Four machines for a ring (K2): node0 (with the agent binary) and three satellites, each
    /// with two QSFPs of two functions, and the rack neighbour on the LAN. Not cabled yet.
    pub fn ring(prefix: &str) -> Option<Bed> {
        Self::machines(prefix, true, 2)
    }

    /// A pair to prepare: node0 (with the agent binary) and node1, each with netplan, as DGX
    /// OS has it (rail-network writes netplan; Debian's image has none).
    pub fn pair(prefix: &str) -> Option<Bed> {
        let bed = Self::machines(prefix, false, 0)?;
        bed.netplan();
        Some(bed)
    }

    /// netplan on every machine of the host (node0 and its satellites), as DGX OS has it:
    /// rail-network writes netplan, and Debian's image has none.
    pub fn netplan(&self) {
        let began = Instant::now();
        std::thread::scope(|s| {
            for h in [&self.node0, &self.node1].into_iter().chain(&self.more) {
                s.spawn(move || {
                    h.sh_ok(
                        "command -v netplan >/dev/null ||
                         DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends netplan.io >/tmp/netplan-install.log 2>&1 ||
                         { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends netplan.io; }",
                    );
                });
            }
        });
        eprintln!(
            "cable bed: netplan on every machine in {:.1} s",
            began.elapsed().as_secs_f64()
        );
    }

    /// The rack neighbour.
    pub fn extra(&self) -> &HostContainer {
        self.extra
            .as_ref()
            .expect("a bed launched with its rack neighbour")
    }

    fn machines(prefix: &str, with_extra: bool, more: usize) -> Option<Bed> {
        // The cables are bridges on this machine: root's to make.
        let uid = Command::new("id").arg("-u").output().expect("run id");
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            byo_core::testing::skip(
                "cable bed",
                "the cables are Linux bridges on this machine: run as root (scripts/test does)",
            );
            return None;
        }
        let began = Instant::now();
        let node0 = HostContainer::launch(&format!("{prefix}-n0"))?;
        let node1 = HostContainer::launch(&format!("{prefix}-n1"))?;
        let extra = match with_extra {
            true => Some(HostContainer::launch(&format!("{prefix}-x"))?),
            false => None,
        };
        let more = (2..2 + more)
            .map(|i| HostContainer::launch(&format!("{prefix}-n{i}")))
            .collect::<Option<Vec<_>>>()?;
        let id = std::process::id() % 100_000;
        let bed = Bed {
            node0,
            node1,
            extra,
            more,
            tag: format!("p15{id}"),
            cables: Default::default(),
            plugged: Default::default(),
        };
        for (host, uuid, ports) in [
            (
                &bed.node0,
                "0000aaaa-0000-4000-8000-000000000000",
                NODE0_PORTS,
            ),
            (
                &bed.node1,
                "1111bbbb-1111-4111-8111-111111111111",
                NODE1_PORTS,
            ),
        ]
        .into_iter()
        .chain(
            bed.more
                .iter()
                .zip(RING_UUIDS)
                .map(|(h, u)| (h, u, NODE1_PORTS)),
        )
        .chain(
            bed.extra
                .iter()
                .map(|x| (x, "7777cccc-7777-4777-8777-777777777777", &[][..])),
        ) {
            host.sh_ok(&format!(
                "id {USER} >/dev/null 2>&1 || useradd -m -s /bin/bash -G sudo {USER}
                 echo '{USER}:{PASSWORD}' | chpasswd"
            ));
            host.write(
                "/usr/local/bin/nvidia-smi",
                nvidia_smi(uuid).as_bytes(),
                0o755,
            );
            host.write("/usr/local/bin/rdma", rdma(ports).as_bytes(), 0o755);
        }
        // The agent binary where this crate's tests built it; a platform test (crates/byo)
        // has node0 fetch it by the one-liner instead.
        if let Some(agent) = option_env!("CARGO_BIN_EXE_byo-agent") {
            bed.node0
                .push(Path::new(agent), "/usr/local/bin/byo-agent", 0o755);
        }
        eprintln!(
            "cable bed: {} machines ready in {:.1} s",
            2 + bed.more.len() + usize::from(with_extra),
            began.elapsed().as_secs_f64()
        );
        Some(bed)
    }

    /// A cable between the given ends (a container and the interface name it gets there).
    /// Each end comes up as a Spark's port does once NetworkManager holds it: up, eui64.
    pub fn cable(&self, ends: &[(&HostContainer, &str)]) {
        self.cable_with_mtu(ends, None)
    }

    /// A cable whose every end (and the wire between) takes frames of `mtu`, as a QSFP does
    /// 9000; without one, Linux's 1500.
    pub fn cable_with_mtu(&self, ends: &[(&HostContainer, &str)], mtu: Option<u32>) {
        let net = format!("{}c{}", self.tag, self.cables.borrow().len());
        // A plain Linux bridge, not an LXD network: LXD's managed networks refuse a second
        // NIC of one container (a QSFP's twin function on the same wire).
        run("ip", &["link", "add", &net, "type", "bridge"]);
        if let Some(mtu) = mtu {
            run("ip", &["link", "set", &net, "mtu", &mtu.to_string()]);
        }
        // This machine's side of the cable stays silent: only the machines on it answer.
        run(
            "sysctl",
            &["-q", "-w", &format!("net.ipv6.conf.{net}.disable_ipv6=1")],
        );
        run("ip", &["link", "set", &net, "up"]);
        self.cables.borrow_mut().push(net.clone());
        for (host, iface) in ends {
            let (parent, name) = (format!("parent={net}"), format!("name={iface}"));
            let mtu = mtu.map(|m| format!("mtu={m}"));
            let mut args = vec![
                "config",
                "device",
                "add",
                host.name(),
                iface,
                "nic",
                "nictype=bridged",
                &parent,
                &name,
            ];
            args.extend(mtu.as_deref());
            lxc(&args);
            self.plugged
                .borrow_mut()
                .push((host.name().to_owned(), (*iface).to_owned()));
            host.sh_ok(&format!(
                "sysctl -q -w net.ipv6.conf.{iface}.addr_gen_mode=0; ip link set {iface} up"
            ));
        }
        // Plugged in is not answering yet: each end's address leaves duplicate detection
        // first (a condition, polled inside the container, with a 10 s deadline).
        for (host, iface) in ends {
            host.sh_ok(&format!(
                "for _ in $(seq 100); do
                   ip -6 -o addr show dev {iface} scope link -tentative | grep -q fe80 && exit 0
                   sleep 0.1
                 done
                 echo '{iface} has no link-local address after 10 s' >&2; exit 1"
            ));
        }
    }

    /// Every cable unplugged and thrown away, for the next variant.
    pub fn uncable(&self) {
        for (host, iface) in self.plugged.borrow_mut().drain(..) {
            lxc(&["config", "device", "remove", &host, &iface]);
        }
        for net in self.cables.borrow_mut().drain(..) {
            run("ip", &["link", "del", &net]);
        }
        for h in [&self.node0, &self.node1].into_iter().chain(&self.more) {
            h.sh("rm -f /etc/enverge/peer.json");
        }
    }

    /// `byo-agent probe-cables` on node0, with node1's login in peer-login: its exit status
    /// and its JSON.
    pub fn probe(&self, env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value, String) {
        let began = Instant::now();
        let vars: String = env.iter().map(|(k, v)| format!("{k}='{v}' ")).collect();
        let out = self
            .node0
            .sh(&format!("{vars}/usr/local/bin/byo-agent probe-cables"));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!(
            "probe-cables exited {:?} in {:.1} s:\n{stdout}{stderr}",
            out.status.code(),
            began.elapsed().as_secs_f64()
        );
        let json_start = stdout.find("{\n").unwrap_or(0);
        let json = serde_json::from_str(&stdout[json_start..]).unwrap_or(serde_json::Value::Null);
        (out.status.code(), json, format!("{stdout}{stderr}"))
    }

    /// node1's login as step 123 keeps it: root-only on node0.
    pub fn lend_login(&self, password: &str) {
        self.lend_login_for(password, 2)
    }

    /// The satellites' one shared login (K2 note 2), with the installer's peer-nodes.
    pub fn lend_login_for(&self, password: &str, nodes: u32) {
        self.node0.sh_ok("install -d -m 700 /etc/enverge");
        self.node0.write(
            "/etc/enverge/peer-login",
            format!("{USER}\n{password}\n").as_bytes(),
            0o600,
        );
        self.node0.write(
            "/etc/enverge/peer-nodes",
            format!("{nodes}\n").as_bytes(),
            0o644,
        );
    }

    /// node1's link-local address on `iface`.
    pub fn link_local(host: &HostContainer, iface: &str) -> String {
        let out = host.sh_ok(&format!(
            "ip -6 -o addr show dev {iface} scope link | awk '{{print $4}}' | cut -d/ -f1"
        ));
        out.trim().to_owned()
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // The containers go with their own Drop; the cables are ours.
        for (host, iface) in self.plugged.borrow_mut().drain(..) {
            let _ = Command::new("lxc")
                .args(["config", "device", "remove", &host, &iface])
                .stdin(Stdio::null())
                .output();
        }
        for net in self.cables.borrow_mut().drain(..) {
            let _ = Command::new("ip")
                .args(["link", "del", &net])
                .stdin(Stdio::null())
                .output();
        }
    }
}

/// A stand-in for one backend route that keeps every body it is sent and answers each the
/// same, so a test reads exactly what the agent on the bed sends (step 126's evidence, 133's
/// beats). Listening on every address of this machine; the bed reaches it through its LAN's
/// gateway (`url`).
pub struct Capture {
    pub url: String,
    pub bodies: Arc<Mutex<Vec<String>>>,
    _rt: tokio::runtime::Runtime,
}

impl Capture {
    pub fn on(path: &'static str, status: u16, answer: &'static str) -> Capture {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("0.0.0.0:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let status = axum::http::StatusCode::from_u16(status).unwrap();
        let app = axum::Router::new().route(
            path,
            axum::routing::post(move |body: String| {
                let kept = kept.clone();
                async move {
                    kept.lock().unwrap().push(body);
                    (
                        status,
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        answer,
                    )
                }
            }),
        );
        rt.spawn(async move { axum::serve(listener, app).await });
        Capture {
            url: format!("http://{}:{port}", bridge_gateway()),
            bodies,
            _rt: rt,
        }
    }
}

/// `ip -j -4 addr` of one interface: its IPv4 addresses with their prefix, and its MTU.
pub fn ipv4(host: &HostContainer, iface: &str) -> (Vec<String>, u64) {
    let out = host.sh_ok(&format!("ip -j -4 addr show dev {iface}"));
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let link = &j[0];
    let addrs = link["addr_info"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| format!("{}/{}", i["local"].as_str().unwrap(), i["prefixlen"]))
                .collect()
        })
        .unwrap_or_default();
    let mtu = host
        .sh_ok(&format!("cat /sys/class/net/{iface}/mtu"))
        .trim()
        .parse()
        .unwrap();
    (addrs, mtu)
}

/// Whether a packet of `mtu` bytes crosses from `iface` to `addr` unfragmented.
pub fn whole_mtu_passes(host: &HostContainer, iface: &str, addr: &str, mtu: u32) -> bool {
    host.sh(&format!(
        "ping -n -q -c 1 -W 2 -M do -s {} -I {iface} {addr}",
        mtu - 28
    ))
    .status
    .success()
}

/// `seen()`'s first answer, polled every half second until `within` is over.
pub fn wait_for<T>(within: std::time::Duration, mut seen: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(t) = seen() {
            return Some(t);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// `lxc list`'s names and states on one machine, as `name,STATE` lines.
pub fn containers(host: &HostContainer) -> String {
    host.sh_ok("lxc list --format csv -c ns")
}

/// The worker, reached from the head over a rail with the key at `key` inside the head:
/// what `hostname` says there, or the failure.
pub fn head_to_worker(
    n0: &HostContainer,
    head: &str,
    key: &str,
    addr: &str,
) -> Result<String, String> {
    let out = n0.sh(&format!(
        "lxc exec {head} -- dbclient -y -i {key} user@{addr} hostname 2>&1 </dev/null"
    ));
    let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    match out.status.success() {
        true => Ok(said.lines().last().unwrap_or_default().to_owned()),
        false => Err(said),
    }
}

fn lxc(args: &[&str]) {
    run("lxc", args)
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run a command");
    assert!(
        out.status.success(),
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
