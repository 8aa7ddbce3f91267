//! What the agent reports about a machine at enrolment (step 126): read through a small
//! probe, so the parsing is pure and tested against real command output, and the same
//! code reads node1 over SSH later.

use byo_wire::enroll::{NodeReport, RailPort};
use sha2::{Digest, Sha256};

/// Where facts come from: a command's output, or a file. `None` when the command or file
/// is absent (no NVIDIA driver on the test profile's machines, say).
pub trait Probe {
    fn run(&self, program: &str, args: &[&str]) -> Option<String>;
    fn read(&self, path: &str) -> Option<String>;
}

/// The local machine.
#[derive(Debug, Default)]
pub struct LocalProbe;

impl Probe for LocalProbe {
    fn run(&self, program: &str, args: &[&str]) -> Option<String> {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn read(&self, path: &str) -> Option<String> {
        std::fs::read_to_string(path).ok()
    }
}

/// One GPU as `nvidia-smi --query-gpu=name,uuid,memory.total,driver_version
/// --format=csv,noheader,nounits` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpu {
    pub name: String,
    pub uuid: String,
    pub memory_mib: Option<u64>,
    pub driver: String,
}

pub const NVIDIA_SMI_ARGS: &[&str] = &[
    "--query-gpu=name,uuid,memory.total,driver_version",
    "--format=csv,noheader,nounits",
];

pub fn parse_nvidia_smi(csv: &str) -> Vec<Gpu> {
    csv.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            let [name, uuid, mem, driver] = f.as_slice() else {
                return None;
            };
            Some(Gpu {
                name: (*name).to_owned(),
                uuid: (*uuid).to_owned(),
                // GB10's unified memory reports "[N/A]".
                memory_mib: mem.parse().ok(),
                driver: (*driver).to_owned(),
            })
        })
        .collect()
}

/// The design's GPU model names: "NVIDIA GB10" reports as "GB10".
fn model(name: &str) -> String {
    name.strip_prefix("NVIDIA ").unwrap_or(name).to_owned()
}

/// sha256 over the sorted GPU UUIDs: what tells identical boxes apart (K, step 127).
pub fn hardware_id(uuids: &[String]) -> Option<String> {
    if uuids.is_empty() {
        return None;
    }
    let mut sorted = uuids.to_vec();
    sorted.sort();
    Some(hex::encode(Sha256::digest(sorted.join("\n").as_bytes())))
}

/// `ID` and `VERSION_ID` from /etc/os-release.
pub fn parse_os_release(text: &str) -> (Option<String>, Option<String>) {
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_owned())
    };
    (field("ID"), field("VERSION_ID"))
}

/// Total memory from /proc/meminfo, for a machine whose GPU shares it (GB10 is unified).
fn meminfo_mib(text: &str) -> Option<u64> {
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024)
}

/// The simulated GB10 part: a Debian test container has no ConnectX-7, so the test bed lists
/// which of its interfaces stand for RDMA ports here, one `iface [device]` per line. Read
/// only where `/sys/class/infiniband` names none (a real Spark always names its own).
pub const SIMULATED_RDMA_PORTS: &str = "/etc/enverge-sim/rdma-ports";

/// Every RDMA netdev the kernel knows: `<device>/device/net/<iface>` per line.
const LIST_RDMA: &str = "for n in /sys/class/infiniband/*/device/net/*; do [ -e \"$n\" ] && echo \"${n#/sys/class/infiniband/}\"; done; true";

/// The machine's RDMA ports (the rails), as (iface, device): from /sys/class/infiniband,
/// else the simulated list.
pub fn rdma_ports(probe: &dyn Probe) -> Vec<(String, Option<String>)> {
    let mut ports: Vec<(String, Option<String>)> = probe
        .run("sh", &["-c", LIST_RDMA])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (device, rest) = l.trim().split_once("/device/net/")?;
            Some((rest.to_owned(), Some(device.to_owned())))
        })
        .collect();
    if ports.is_empty() {
        ports = probe
            .read(SIMULATED_RDMA_PORTS)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let iface = w.next().filter(|i| !i.starts_with('#'))?;
                Some((iface.to_owned(), w.next().map(str::to_owned)))
            })
            .collect();
    }
    ports.sort();
    ports.dedup();
    ports
}

/// `4096 (5)` from `/sys/class/infiniband/<dev>/ports/1/active_mtu`.
fn first_number(text: &str) -> Option<u32> {
    text.split_whitespace().next()?.parse().ok()
}

/// Each rail port as detect sees it: no neighbours and no rail until the cable probe (125)
/// says otherwise.
pub fn rails(probe: &dyn Probe) -> Vec<RailPort> {
    rdma_ports(probe)
        .into_iter()
        .map(|(iface, device)| RailPort {
            mtu: probe
                .read(&format!("/sys/class/net/{iface}/mtu"))
                .and_then(|t| first_number(&t)),
            active_mtu: device.as_ref().and_then(|d| {
                probe
                    .read(&format!("/sys/class/infiniband/{d}/ports/1/active_mtu"))
                    .and_then(|t| first_number(&t))
            }),
            iface,
            device,
            neighbours_discovered: 0,
            index: None,
            address: None,
        })
        .collect()
}

/// A machine's report: node0's own through [`LocalProbe`], a satellite's through a probe
/// over SSH. Its rails carry no neighbours until the cable probe fills them in.
pub fn detect(probe: &dyn Probe) -> NodeReport {
    let gpus = probe
        .run("nvidia-smi", NVIDIA_SMI_ARGS)
        .map(|o| parse_nvidia_smi(&o))
        .unwrap_or_default();
    let (os_id, os_version) = probe
        .read("/etc/os-release")
        .map(|t| parse_os_release(&t))
        .unwrap_or((None, None));
    let machine_id = probe
        .read("/etc/machine-id")
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty());
    let arch = probe.run("uname", &["-m"]).map(|a| a.trim().to_owned());
    let gpu_mem_mib = match gpus.first() {
        Some(g) => g
            .memory_mib
            .or_else(|| probe.read("/proc/meminfo").and_then(|t| meminfo_mib(&t))),
        None => None,
    };
    NodeReport {
        gpu_model: gpus.first().map(|g| model(&g.name)),
        gpu_count: Some(gpus.len() as u32),
        gpu_mem_mib,
        arch,
        os_id,
        os_version,
        driver_version: gpus.first().map(|g| g.driver.clone()),
        machine_id,
        hardware_id: hardware_id(&gpus.iter().map(|g| g.uuid.clone()).collect::<Vec<_>>()),
        node_index: 0,
        rails: rails(probe),
    }
}

/// A machine behind the host adapter (node1 over SSH) as a probe.
pub struct HostProbe<'a, H: crate::host::Host + ?Sized>(pub std::cell::RefCell<&'a mut H>);

impl<H: crate::host::Host + ?Sized> Probe for HostProbe<'_, H> {
    fn run(&self, program: &str, args: &[&str]) -> Option<String> {
        let mut argv = vec![program];
        argv.extend_from_slice(args);
        let out = self.0.borrow_mut().run(&argv, None).ok()?;
        out.ok().then_some(out.stdout)
    }
    fn read(&self, path: &str) -> Option<String> {
        crate::host::read_string(&mut **self.0.borrow_mut(), path)
            .ok()
            .flatten()
    }
}
