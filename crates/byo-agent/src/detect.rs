//! What the agent reports about a machine at enrolment (step 126): read through a small
//! probe, so the parsing is pure and tested against real command output, and the same
//! code reads node1 over SSH later.

use byo_wire::enroll::NodeReport;
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

/// node0's report. RDMA ports (the rails) arrive with the pair work; a single Spark and
/// the test profile judge none.
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
        rails: Vec::new(),
    }
}
