//! The enrolment request (step 126): what the agent sends to host-enroll. A wire shape,
//! not a stored one: host-enroll splits it into the enrolment's fingerprint and one
//! host_nodes row per machine.

use serde::{Deserialize, Serialize};

use crate::limits::{Bounded, OutOfBounds};

/// One machine as detect saw it. node0 carries every field; a peer may carry fewer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeReport {
    pub gpu_model: Option<String>,
    pub gpu_count: Option<u32>,
    pub gpu_mem_mib: Option<u64>,
    pub arch: Option<String>,
    pub os_id: Option<String>,
    pub os_version: Option<String>,
    pub driver_version: Option<String>,
    /// /etc/machine-id: hardware detail, not identity.
    pub machine_id: Option<String>,
    /// sha256 over the sorted GPU UUIDs: what tells identical boxes apart. An agent older
    /// than the field sends none, and its machine_id stands in.
    pub hardware_id: Option<String>,
    pub node_index: u32,
    #[serde(default)]
    pub rails: Vec<RailPort>,
}

/// One RDMA port as detect saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RailPort {
    pub iface: String,
    pub device: Option<String>,
    pub mtu: Option<u32>,
    pub active_mtu: Option<u32>,
    pub neighbours_discovered: u32,
    /// The rail this port's cable carries, numbered once at step 125.
    pub index: Option<u32>,
    /// The address it holds on that rail, once rail-network set it (130–131); never sent
    /// at enrolment, where the plan's address is stamped instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// Step 126.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollRequest {
    #[serde(flatten)]
    pub node: NodeReport,
    #[serde(default)]
    pub peers: Vec<NodeReport>,
}

/// host-provision: add a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ProvisionRequest {
    /// gb10-spark-1, gb10-spark-2, gb10-spark-4 (or the staff-only linux-test).
    pub profile_id: String,
}

/// What the owner gets back: the one-liner, shown once.
#[derive(Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProvisionResponse {
    pub host_id: String,
    pub slug: String,
    pub enrollment_id: String,
    /// The single-use enrolment token; only its hash is kept.
    pub token: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
    /// The one-liner to run on the Spark.
    pub command: String,
}

/// `GET /api/hosts`: one GPU its owner added, as *Your GPUs* words it (issue #43, 3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OwnerHostView {
    /// `None` once the host is released or was rejected.
    pub host_id: Option<String>,
    pub slug: Option<String>,
    pub enrollment_id: String,
    pub profile_id: String,
    pub enrollment_state: crate::states::EnrollmentState,
    /// The state in the owner's words: waiting for the command, preparing (with its latest
    /// step), waiting for approval, idle, renting, unreachable since…, stopping, stopped,
    /// retired (with what to do next).
    pub state: String,
    /// While it is being prepared: node 0's latest step (`base-image done`, or the failure).
    pub last_step: Option<String>,
    /// Under a failed step: what it means and who fixes it.
    pub advice: Option<String>,
    pub prepared_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Its machines not retired (2 for a pair, 0 before it enrolled).
    pub nodes: i64,
    /// Stop hosting is open to you (`POST /api/hosts/{host_id}/stop`).
    pub may_stop: bool,
    /// Not enrolled yet: cancelling hands back what was set aside
    /// (`POST /api/hosts/{host_id}/cancel`).
    pub may_cancel: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl std::fmt::Debug for ProvisionResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvisionResponse")
            .field("slug", &self.slug)
            .finish_non_exhaustive()
    }
}

/// The agent's end of the tunnel.
#[derive(Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WireGuardConfig {
    pub private_key: String,
    /// 10.8.0.2/24
    pub address: String,
    pub peer_public_key: String,
    /// The relay's public address and port.
    pub endpoint: Option<String>,
    /// 10.8.0.1/32
    pub allowed_ips: String,
}

/// `GET /api/host/relay` (host token): where the host's relay is now. A host that redeemed
/// before relay-provision gave its relay an address got a WireGuard config with no
/// endpoint; preparation asks here at every attempt and brings the tunnel up once there is
/// one (docs/relay.md, "A host enrolled before its relay had an address").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostRelay {
    /// The relay's public WireGuard endpoint (`address:51820`); `None` while it has no
    /// address yet.
    pub endpoint: Option<String>,
}

/// Step 29: everything the agent needs, in one answer.
#[derive(Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EnrollResponse {
    pub host_id: String,
    pub slug: String,
    pub environment: String,
    /// What the host presents to the backend (host-report, heartbeats).
    pub host_token: String,
    /// What the backend presents to the agent; the agent keeps its hash.
    pub agent_token: String,
    pub wireguard: WireGuardConfig,
    pub relay_name: String,
    /// The relay's ssh_mapd, inside the tunnel.
    pub ssh_map_endpoint: String,
    pub ssh_map_token: String,
    pub tunnel_hostname: Option<String>,
    pub tunnel_connector_token: Option<String>,
    /// The current signed operator-key list, exactly as published (none before the first).
    pub operator_keys: Option<String>,
    /// The public key(s) every list is checked against.
    pub signing_keys: Vec<String>,
    pub profile_id: String,
    pub constants: serde_json::Value,
    /// hosts.lockout_owner: owner-lockout runs only when true (it ships false, so the
    /// owner's own login stays a recovery path).
    #[serde(default)]
    pub lockout_owner: bool,
    /// The cloudflared build this host installs when it has none (neither DGX OS nor Debian
    /// ships one): where the control plane serves it and the SHA-256 it must have. The digest
    /// travels here, with the credentials, never beside the file it pins.
    #[serde(default)]
    pub cloudflared: Option<ConnectorBuild>,
}

/// A pinned build of the operator tunnel's connector (cloudflared) for one architecture.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConnectorBuild {
    /// `<public_url>/cloudflared/cloudflared-<arch>`, as `uname -m` names the arch.
    pub url: String,
    /// The build's SHA-256, lowercase hex.
    pub sha256: String,
}

impl std::fmt::Debug for EnrollResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollResponse")
            .field("slug", &self.slug)
            .finish_non_exhaustive()
    }
}

impl NodeReport {
    fn check_bounds_at(&self, at: &str) -> Result<(), OutOfBounds> {
        use crate::limits::{SHORT, opt_text};
        let f = |name: &str| format!("{at}{name}");
        opt_text(&f("gpu_model"), &self.gpu_model, SHORT)?;
        opt_text(&f("arch"), &self.arch, SHORT)?;
        opt_text(&f("os_id"), &self.os_id, SHORT)?;
        opt_text(&f("os_version"), &self.os_version, SHORT)?;
        opt_text(&f("driver_version"), &self.driver_version, SHORT)?;
        opt_text(&f("machine_id"), &self.machine_id, SHORT)?;
        opt_text(&f("hardware_id"), &self.hardware_id, SHORT)?;
        rail_ports_in_bounds(&f("rails"), &self.rails)
    }
}

/// A machine's rail ports, wherever they are sent: how many, and each one's words.
pub(crate) fn rail_ports_in_bounds(at: &str, ports: &[RailPort]) -> Result<(), OutOfBounds> {
    use crate::limits::{RAILS, SHORT, count, opt_text};
    count(at, ports.len(), RAILS)?;
    for (i, rail) in ports.iter().enumerate() {
        crate::limits::text(&format!("{at}[{i}].iface"), &rail.iface, SHORT)?;
        opt_text(&format!("{at}[{i}].device"), &rail.device, SHORT)?;
        opt_text(&format!("{at}[{i}].address"), &rail.address, SHORT)?;
    }
    Ok(())
}

impl Bounded for EnrollRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        self.node.check_bounds_at("")?;
        crate::limits::count("peers", self.peers.len(), crate::limits::PEERS)?;
        for (i, peer) in self.peers.iter().enumerate() {
            peer.check_bounds_at(&format!("peers[{i}]."))?;
        }
        Ok(())
    }
}

impl Bounded for ProvisionRequest {
    fn check_bounds(&self) -> Result<(), OutOfBounds> {
        crate::limits::text("profile_id", &self.profile_id, crate::limits::SHORT)
    }
}
