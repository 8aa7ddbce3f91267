//! Detection against command output in the formats the tools print.

use std::collections::HashMap;

use byo_agent::detect::{Probe, detect, hardware_id, parse_nvidia_smi, parse_os_release};

struct Fixture {
    commands: HashMap<&'static str, String>,
    files: HashMap<&'static str, String>,
}

impl Probe for Fixture {
    fn run(&self, program: &str, _args: &[&str]) -> Option<String> {
        self.commands.get(program).cloned()
    }
    fn read(&self, path: &str) -> Option<String> {
        self.files.get(path).cloned()
    }
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn a_gb10_spark_reports_as_the_profile_expects() {
    let probe = Fixture {
        commands: HashMap::from([
            ("nvidia-smi", fixture("nvidia-smi-gb10.csv")),
            ("uname", "aarch64\n".into()),
        ]),
        files: HashMap::from([
            ("/etc/os-release", fixture("os-release-dgx")),
            (
                "/etc/machine-id",
                "3f2a9c0d1e2f4a5b6c7d8e9f0a1b2c3d\n".into(),
            ),
            (
                "/proc/meminfo",
                "MemTotal:       125829120 kB\nMemFree: 1 kB\n".into(),
            ),
        ]),
    };
    let r = detect(&probe);
    assert_eq!(r.gpu_model.as_deref(), Some("GB10"));
    assert_eq!(r.gpu_count, Some(1));
    assert_eq!(
        r.gpu_mem_mib,
        Some(122880),
        "unified memory, from /proc/meminfo"
    );
    assert_eq!(r.arch.as_deref(), Some("aarch64"));
    assert_eq!(
        (r.os_id.as_deref(), r.os_version.as_deref()),
        (Some("ubuntu"), Some("24.04"))
    );
    assert_eq!(r.driver_version.as_deref(), Some("580.65.06"));
    assert_eq!(
        r.machine_id.as_deref(),
        Some("3f2a9c0d1e2f4a5b6c7d8e9f0a1b2c3d")
    );
    assert_eq!(r.hardware_id.as_deref().map(str::len), Some(64));
    assert_eq!(r.node_index, 0);
}

#[test]
fn hardware_id_is_the_gpus_not_the_order_they_list_in() {
    let gpus = parse_nvidia_smi(&fixture("nvidia-smi-2x4090.csv"));
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].memory_mib, Some(24564));
    let a = hardware_id(&[gpus[0].uuid.clone(), gpus[1].uuid.clone()]);
    let b = hardware_id(&[gpus[1].uuid.clone(), gpus[0].uuid.clone()]);
    assert_eq!(a, b);
    assert_ne!(a, hardware_id(&[gpus[0].uuid.clone()]));
    assert_eq!(hardware_id(&[]), None);
}

#[test]
fn a_machine_without_nvidia_reports_no_gpu_and_no_hardware_id() {
    let probe = Fixture {
        commands: HashMap::from([("uname", "x86_64\n".into())]),
        files: HashMap::from([
            ("/etc/os-release", "ID=debian\nVERSION_ID=\"12\"\n".into()),
            ("/etc/machine-id", "abc\n".into()),
        ]),
    };
    let r = detect(&probe);
    assert_eq!(
        (r.gpu_model, r.gpu_count, r.hardware_id),
        (None, Some(0), None)
    );
    assert_eq!(
        r.machine_id.as_deref(),
        Some("abc"),
        "redeem keys it by machine_id instead"
    );
    assert_eq!(
        parse_os_release("ID=debian\nVERSION_ID=\"12\"\n"),
        (Some("debian".into()), Some("12".into()))
    );
}

/// K1: the rails appear in every machine's report — a Spark's from /sys/class/infiniband
/// (device and netdev, the netdev's MTU, the RDMA device's active MTU), else from iproute2's
/// `rdma -j link show` (a test container's stand-in) — with no neighbours and no rail until
/// the cable probe.
#[test]
fn the_rails_come_from_the_rdma_devices_or_rdma_link() {
    let spark = Fixture {
        commands: HashMap::from([
            (
                "sh",
                "roceP2p1s0f0/device/net/enP2p1s0f0np0\nrocep1s0f0/device/net/enp1s0f0np0\n".into(),
            ),
            // Never asked while sysfs names RDMA ports.
            (
                "rdma",
                r#"[{"ifindex":0,"ifname":"sim0","port":1,"netdev":"rail0","netdev_index":2}]"#
                    .into(),
            ),
        ]),
        files: HashMap::from([
            ("/sys/class/net/enp1s0f0np0/mtu", "9000\n".into()),
            (
                "/sys/class/infiniband/rocep1s0f0/ports/1/active_mtu",
                "4096 (5)\n".into(),
            ),
        ]),
    };
    let rails = detect(&spark).rails;
    type Seen<'a> = (&'a str, Option<&'a str>, Option<u32>, Option<u32>);
    let seen: Vec<Seen> = rails
        .iter()
        .map(|r| (r.iface.as_str(), r.device.as_deref(), r.mtu, r.active_mtu))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("enP2p1s0f0np0", Some("roceP2p1s0f0"), None, None),
            ("enp1s0f0np0", Some("rocep1s0f0"), Some(9000), Some(4096)),
        ]
    );
    assert!(
        rails
            .iter()
            .all(|r| r.neighbours_discovered == 0 && r.index.is_none())
    );

    // sysfs names nothing: the links `rdma` lists with a netdev, sorted, each once.
    let container = Fixture {
        commands: HashMap::from([
            ("sh", String::new()),
            (
                "rdma",
                concat!(
                    r#"[{"ifindex":1,"ifname":"rocerail1","port":1,"state":"ACTIVE","#,
                    r#""physical_state":"LINK_UP","netdev":"rail1","netdev_index":7},"#,
                    r#"{"ifindex":0,"ifname":"rocerail0","port":1,"state":"ACTIVE","#,
                    r#""physical_state":"LINK_UP","netdev":"rail0","netdev_index":6},"#,
                    r#"{"ifindex":2,"ifname":"mlx5_2","port":1,"state":"DOWN","#,
                    r#""physical_state":"DISABLED"},"#,
                    r#"{"ifindex":0,"ifname":"rocerail0","port":1,"netdev":"rail0"}]"#,
                    "\n"
                )
                .into(),
            ),
        ]),
        files: HashMap::from([("/sys/class/net/rail0/mtu", "1500\n".into())]),
    };
    type Found = (String, Option<String>, Option<u32>);
    let seen: Vec<Found> = detect(&container)
        .rails
        .into_iter()
        .map(|r| (r.iface, r.device, r.mtu))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("rail0".to_owned(), Some("rocerail0".to_owned()), Some(1500)),
            ("rail1".to_owned(), Some("rocerail1".to_owned()), None)
        ]
    );
}
