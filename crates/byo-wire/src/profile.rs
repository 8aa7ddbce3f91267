//! A host profile's plan (`host_profiles.constants`): the hardware redeem judges an
//! enrolment against (step 127), the rail plan (K), and how preparation treats the
//! profile's machines. One definition for every reader: redeem (`byo-core`), preparation
//! (`byo-agent`) and host-provision.
//!
//! Every field has a default, so a profile written before a field existed still reads:
//! a missing `node_count` is a single Spark, a missing `prepare` block is a GB10 Spark's.

use std::fmt;

use serde::{Deserialize, Serialize};

/// host_profiles.constants.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProfilePlan {
    #[serde(default = "one")]
    pub node_count: u32,
    /// None accepts any (the staff-only test profile).
    #[serde(default)]
    pub gpu_model: Option<String>,
    #[serde(default)]
    pub gpu_count: Option<u32>,
    /// Judged on node0 only.
    #[serde(default)]
    pub gpu_mem_mib: Option<u64>,
    #[serde(default)]
    pub arch: Option<String>,
    /// The NVIDIA repository's architecture the image builder uses (sbsa on arm64).
    #[serde(default)]
    pub cuda_repo_arch: Option<String>,
    /// The rail plan: a subnet and an MTU per rail, named by index (K).
    #[serde(default)]
    pub rails: Vec<RailPlan>,
    #[serde(default)]
    pub prepare: PrepareConstants,
}

fn one() -> u32 {
    1
}

/// One rail of the plan: every node's address on it is the subnet's tenth host plus the
/// node's index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RailPlan {
    pub index: u32,
    pub subnet: String,
    pub mtu: u32,
}

/// How this profile's machines are prepared (`constants.prepare`, migration 0004). A GB10
/// Spark takes the defaults; the staff-only test profile names the alternatives a Debian
/// container can do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(default)]
pub struct PrepareConstants {
    pub lxd: LxdSource,
    /// `zfs`; `dir` only where zfs cannot exist (a container), and said so in the report.
    pub storage_driver: StorageDriver,
    pub pool_size: String,
    pub zfs_arc_max: u64,
    pub base_image: BaseImage,
    /// Run the operator tunnel (cloudflared). Off only for the staff-only test profile,
    /// whose machines cannot reach Cloudflare's package repository.
    pub tunnel: bool,
}

impl Default for PrepareConstants {
    fn default() -> Self {
        PrepareConstants {
            lxd: LxdSource::Snap,
            storage_driver: StorageDriver::Zfs,
            pool_size: "200GiB".into(),
            zfs_arc_max: 8 << 30,
            base_image: BaseImage::Ubuntu,
            tunnel: true,
        }
    }
}

/// Where LXD comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum LxdSource {
    /// The snap (Ubuntu, DGX OS), channel 5.21/stable.
    Snap,
    /// Debian's package.
    Apt,
}

/// The storage pool's driver, as LXD names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum StorageDriver {
    Zfs,
    /// ~69 s per create against zfs's 0.6 s: only where zfs cannot exist.
    Dir,
}

/// What the base image is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum BaseImage {
    /// Ubuntu 24.04 pulled from the image server, with the NVIDIA CUDA repository.
    Ubuntu,
    /// busybox, built on the host from its busybox-static (the test profile).
    Minimal,
}

impl LxdSource {
    /// The name the profile spells it with.
    pub fn as_str(self) -> &'static str {
        match self {
            LxdSource::Snap => "snap",
            LxdSource::Apt => "apt",
        }
    }
}

impl StorageDriver {
    /// LXD's name for the driver (also the profile's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            StorageDriver::Zfs => "zfs",
            StorageDriver::Dir => "dir",
        }
    }
}

impl BaseImage {
    /// The name the profile spells it with; also the image builder's argument.
    pub fn as_str(self) -> &'static str {
        match self {
            BaseImage::Ubuntu => "ubuntu",
            BaseImage::Minimal => "minimal",
        }
    }
}

impl fmt::Display for LxdSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for StorageDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for BaseImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_migrated_profiles_read_as_written() {
        let gb10: ProfilePlan = serde_json::from_value(json!({
            "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
            "cuda_repo_arch": "sbsa", "node_count": 2,
            "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000}],
            "prepare": {"lxd": "snap", "storage_driver": "zfs", "pool_size": "200GiB",
                        "zfs_arc_max": 8589934592u64, "base_image": "ubuntu"}
        }))
        .unwrap();
        assert_eq!(gb10.node_count, 2);
        assert_eq!(gb10.rails[0].subnet, "192.168.100.0/24");
        assert_eq!(gb10.prepare, PrepareConstants::default());
        let test: PrepareConstants = serde_json::from_value(json!({
            "lxd": "apt", "storage_driver": "dir", "pool_size": "20GiB",
            "zfs_arc_max": 1073741824, "base_image": "minimal", "tunnel": false
        }))
        .unwrap();
        assert_eq!(
            (test.lxd, test.storage_driver, test.base_image, test.tunnel),
            (
                LxdSource::Apt,
                StorageDriver::Dir,
                BaseImage::Minimal,
                false
            )
        );
        assert_eq!(
            serde_json::to_value(&test).unwrap()["lxd"],
            json!(test.lxd.as_str())
        );
    }

    #[test]
    fn missing_fields_take_the_defaults() {
        let bare: ProfilePlan = serde_json::from_value(json!({})).unwrap();
        assert_eq!(bare.node_count, 1);
        assert!(bare.rails.is_empty() && bare.gpu_model.is_none());
        let partial: PrepareConstants =
            serde_json::from_value(json!({"storage_driver": "dir"})).unwrap();
        assert_eq!(partial.lxd, LxdSource::Snap);
        assert_eq!(partial.zfs_arc_max, 8 << 30);
        assert!(partial.tunnel);
    }

    #[test]
    fn an_unknown_source_is_refused_not_read_as_the_snap() {
        assert!(serde_json::from_value::<PrepareConstants>(json!({"lxd": "flatpak"})).is_err());
    }
}
