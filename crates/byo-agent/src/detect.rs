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

/// Every RDMA netdev the kernel knows: `<device>/device/net/<iface>` per line.
const LIST_RDMA: &str = "for n in /sys/class/infiniband/*/device/net/*; do [ -e \"$n\" ] && echo \"${n#/sys/class/infiniband/}\"; done; true";

/// iproute2's `rdma`, asked where sysfs names no port: it has the kernel's RDMA links over
/// netlink, a device without a PCI parent (soft-RoCE) among them. A test container's RDMA
/// ports come from a stand-in of this tool, as its GPU comes from an `nvidia-smi` one.
pub const RDMA_LINK_ARGS: &[&str] = &["-j", "link", "show"];

/// `rdma -j link show`'s links as (netdev, device); a link with no netdev is no port, and
/// anything but a JSON array is no links.
pub fn parse_rdma_links(json: &str) -> Vec<(String, Option<String>)> {
    let Ok(serde_json::Value::Array(links)) = serde_json::from_str(json) else {
        return Vec::new();
    };
    links
        .iter()
        .filter_map(|l| {
            let netdev = l.get("netdev")?.as_str().filter(|n| !n.is_empty())?;
            // iproute2 before 5.5 printed the device with its port (`mlx5_0/1`).
            let device = l.get("ifname")?.as_str()?.split('/').next()?;
            Some((netdev.to_owned(), Some(device.to_owned())))
        })
        .collect()
}

/// The machine's RDMA ports (the rails), as (iface, device): from /sys/class/infiniband,
/// else from `rdma link`.
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
        ports = parse_rdma_links(&probe.run("rdma", RDMA_LINK_ARGS).unwrap_or_default());
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A Spark's ConnectX-7 (four functions, RoCE: no subnet prefix or LID) as iproute2 6.1,
    /// Ubuntu 24.04's, prints it (`rdma/link.c`: fields in this order, one array).
    const SPARK: &str = r#"[{"ifindex":0,"ifname":"rocep1s0f0","port":1,"state":"ACTIVE","physical_state":"LINK_UP","netdev":"enp1s0f0np0","netdev_index":3},{"ifindex":1,"ifname":"rocep1s0f1","port":1,"state":"DOWN","physical_state":"DISABLED","netdev":"enp1s0f1np1","netdev_index":4},{"ifindex":2,"ifname":"roceP2p1s0f0","port":1,"state":"ACTIVE","physical_state":"LINK_UP","netdev":"enP2p1s0f0np0","netdev_index":5},{"ifindex":3,"ifname":"roceP2p1s0f1","port":1,"state":"DOWN","physical_state":"DISABLED","netdev":"enP2p1s0f1np1","netdev_index":6}]
"#;

    fn ports(v: &[(&str, &str)]) -> Vec<(String, Option<String>)> {
        v.iter()
            .map(|(i, d)| ((*i).to_owned(), Some((*d).to_owned())))
            .collect()
    }

    #[test]
    fn rdma_links_name_each_netdev_and_its_device() {
        assert_eq!(
            parse_rdma_links(SPARK),
            ports(&[
                ("enp1s0f0np0", "rocep1s0f0"),
                ("enp1s0f1np1", "rocep1s0f1"),
                ("enP2p1s0f0np0", "roceP2p1s0f0"),
                ("enP2p1s0f1np1", "roceP2p1s0f1"),
            ])
        );
        // Before iproute2 5.5 the device came with its port.
        assert_eq!(
            parse_rdma_links(
                r#"[{"ifindex":1,"port":1,"ifname":"mlx5_0/1","state":"ACTIVE","physical_state":"LINK_UP","netdev":"ens1f0","netdev_index":4}]"#
            ),
            ports(&[("ens1f0", "mlx5_0")])
        );
    }

    #[test]
    fn a_link_without_a_netdev_is_no_port() {
        // An InfiniBand port with no netdev (a LID instead), and an empty netdev.
        let ib = r#"[{"ifindex":0,"ifname":"mlx5_0","port":1,"subnet_prefix":"fe80:0000:0000:0000","lid":3,"sm_lid":1,"lmc":0,"state":"ACTIVE","physical_state":"LINK_UP"},{"ifindex":1,"ifname":"rxe0","port":1,"state":"ACTIVE","physical_state":"LINK_UP","netdev":"eth0","netdev_index":2},{"ifindex":2,"ifname":"rxe1","port":1,"netdev":""}]"#;
        assert_eq!(parse_rdma_links(ib), ports(&[("eth0", "rxe0")]));
    }

    #[test]
    fn anything_but_a_list_of_links_is_no_port() {
        for garbage in [
            "",
            "[]\n",
            "Failed to open NETLINK_RDMA socket\n",
            "0/1: rocep1s0f0/1: state ACTIVE physical_state LINK_UP netdev enp1s0f0np0\n",
            r#"{"ifname":"rocep1s0f0","netdev":"enp1s0f0np0"}"#,
            r#"[1, "enp1s0f0np0", null, {"netdev": 7, "ifname": "x"}, {"netdev": "eth0"}]"#,
            r#"[{"ifname":"rocep1s0f0","netdev":"enp1s0f0np0""#,
        ] {
            assert_eq!(parse_rdma_links(garbage), [], "{garbage:?}");
        }
    }

    /// Commands only: sysfs's listing runs as `sh`, iproute2 as `rdma`.
    struct Runs(&'static [(&'static str, &'static str)]);

    impl Probe for Runs {
        fn run(&self, program: &str, _: &[&str]) -> Option<String> {
            self.0
                .iter()
                .find(|(p, _)| *p == program)
                .map(|(_, out)| (*out).to_owned())
        }
        fn read(&self, _: &str) -> Option<String> {
            None
        }
    }

    #[test]
    fn sysfs_comes_first_and_rdma_link_fills_in_sorted_without_duplicates() {
        let both = Runs(&[
            ("sh", "rocep1s0f0/device/net/enp1s0f0np0\n"),
            ("rdma", SPARK),
        ]);
        assert_eq!(rdma_ports(&both), ports(&[("enp1s0f0np0", "rocep1s0f0")]));

        let twice = Runs(&[
            ("sh", ""),
            (
                "rdma",
                r#"[{"ifname":"sim1","port":1,"netdev":"rail1"},{"ifname":"sim0","port":1,"netdev":"rail0"},{"ifname":"sim1","port":1,"netdev":"rail1"}]"#,
            ),
        ]);
        assert_eq!(
            rdma_ports(&twice),
            ports(&[("rail0", "sim0"), ("rail1", "sim1")])
        );

        assert_eq!(rdma_ports(&Runs(&[])), [], "neither tool: no ports");
    }
}
