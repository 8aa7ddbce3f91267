//! Instances (E1, F, G): the agent's VM API as the backend calls it through the relay
//! (authenticated by the host's agent token), the customer's API, and the heartbeat.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// `POST /v1/vms` on the agent: create the customer's container from lofispark-base.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVm {
    /// The container's name, minted by the backend (lowercase letters, digits, `-`).
    pub name: String,
    /// The customer's OpenSSH public key, from ssh_keys.
    pub ssh_public_key: String,
    /// The name the customer's ssh resolves (`<label>.<slug>.ssh…`), for the banner.
    #[serde(default)]
    pub ssh_hostname: Option<String>,
}

impl std::fmt::Debug for CreateVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreateVm")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A check that is reported and does not fail a create (steps 47–48).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Advisory {
    pub ok: bool,
    #[serde(default)]
    pub detail: Option<String>,
}

/// The agent's answer to a create: the container runs, customer key and banner are in,
/// and the relay forwards its public :22 to `ssh_port` on the host (step 49, fatal).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmCreated {
    pub name: String,
    /// The port on the host (10.8.0.2) the relay's :22 is mapped to.
    pub ssh_port: u16,
    pub gpu_check: Advisory,
    pub startup_script: Advisory,
}

/// `POST /v1/vms/{name}/state` on the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum VmAction {
    Start,
    Stop,
    Reboot,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VmStateChange {
    pub action: VmAction,
}

/// The agent's answer to a reboot of its host (`POST /v1/host/reboot`, 202; L4): each
/// satellite told first (or why it could not be), node0 going down a moment later.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRebooting {
    /// Seconds until node0 goes down.
    pub node0_in_secs: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub satellites: Vec<SatelliteRebooting>,
}

/// One satellite's part of a reboot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SatelliteRebooting {
    pub node: u32,
    /// Its deferred reboot was accepted; otherwise `error` says why not (it reboots when it
    /// next can, and the heartbeat reports half a pair until it answers: L4.3).
    pub rebooting: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The state of one subsystem in the heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Ok,
    Degraded,
    Down,
    Unknown,
    /// Nothing of the kind is configured on this host (no operator tunnel, no GPU): not a
    /// fault, and not unknown either.
    NotConfigured,
}

impl Health {
    /// The spelling on the wire, which is also what host_status stores.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Degraded => "degraded",
            Health::Down => "down",
            Health::Unknown => "unknown",
            Health::NotConfigured => "not_configured",
        }
    }
}

/// `POST /api/host/heartbeat` (host token): node0's host_status row (133).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Heartbeat {
    pub agent_version: String,
    pub lxd: Health,
    /// The relay's SSH map matches what the host runs (rewritten when it did not).
    pub relay: Health,
    pub tunnel: Health,
    pub gpu: Health,
    pub storage: Health,
    pub instances: u32,
    #[serde(default)]
    pub details: BeatDetails,
    /// The instances the host holds, as LXD sees them (at most [`MAX_HELD_VMS`]): what the
    /// backend settles rows still being created from and finds orphans in.
    #[serde(default)]
    pub vms: Vec<HeldVm>,
}

/// How the agent found the relay's SSH map this beat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RelayMapCheck {
    /// LXD did not answer, so what the host runs was not known.
    Unchecked,
    InSync,
    /// The relay's map differed from what the host runs, and the agent rewrote it.
    DriftRewritten,
    /// The relay's map could not be read.
    Unreachable,
}

/// What the relay's map held and what the host runs, when they differed (at most four
/// entries each, `port->target:port`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RelayDrift {
    pub relay_had: String,
    pub host_runs: String,
}

/// What `enverge-agent-rollback` recorded when it restored the previous build
/// (`ROLLED_BACK`, written by its shell script): when, by the host's clock, and the two
/// builds' digests. Reported on every beat until the next install.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RollbackRecord {
    #[serde(default)]
    pub at: Option<String>,
    #[serde(default)]
    pub from_sha256: Option<String>,
    #[serde(default)]
    pub to_sha256: Option<String>,
}

/// The operator-key list a host holds: its version and expiry (#16: the backend sees a list
/// about to lapse, or lapsed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeysHeld {
    pub version: u64,
    pub expires: DateTime<Utc>,
}

/// What a beat says beyond host_status' columns, each field the agent fills and the backend
/// judges. Every field may be absent; a key this build does not know is ignored (a newer
/// agent's addition does not cost an older backend its beats). The logins and the rail
/// counts are taken out before the rest is kept as host_status.details.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct BeatDetails {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_map: Option<RelayMapCheck>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_drift: Option<RelayDrift>,
    /// Why the tunnel reads as it does, in words (`systemctl is-active`'s answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<String>,
    /// Why the GPU reads as it does, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_keys: Option<KeysHeld>,
    /// sshd's accepted logins to spark since the last delivered beat (#16, 5), at most
    /// [`MAX_LOGINS_PER_BEAT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_logins: Option<Vec<OperatorLogin>>,
    /// Why the logins could not be read this beat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_logins_error: Option<String>,
    /// A pair or a ring (L3.3): why it is half a pair (absent: whole, or a single Spark).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub half_a_pair: Option<Vec<String>>,
    /// The lockstep moves that brought a worker back in step this beat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lockstep: Option<Vec<String>>,
    /// node0 of a pair or a ring (133): per rail port, how many machines answered on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rail_neighbours: Option<std::collections::BTreeMap<String, u64>>,
}

/// The header on the heartbeat's answer naming the address the backend saw the beat come
/// from: the owner's public address, which the host's tenant firewall drops (issue #36).
/// Behind a reverse proxy it is the proxy's, and then tenants are kept from the proxy instead.
pub const SEEN_FROM_HEADER: &str = "byo-seen-from";

/// More machines than this on one port is a LAN, whatever the number.
pub const MAX_RAIL_NEIGHBOURS: u64 = 1024;
/// How many logins one beat carries at most; the rest wait in the journal for the next beat.
pub const MAX_LOGINS_PER_BEAT: usize = 12;

/// One login to `spark` that the host's sshd accepted, attributed on the host against the
/// operator-key list it applied: `user_sub` is the list's entry for the key, or absent when the key is on no list the host holds ("not an operator key").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct OperatorLogin {
    /// When sshd accepted it (the journal's timestamp).
    pub at: chrono::DateTime<chrono::Utc>,
    /// The address the connection came from, and its port.
    pub source: String,
    pub source_port: u16,
    /// `SHA256:…`, as sshd logged it.
    pub fingerprint: String,
    /// The operator's user sub from the list's entry (the list's `label` is left out: the
    /// backend knows it by the fingerprint, and the beat's details are bounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_sub: Option<String>,
    /// The certificate the key was presented with, as sshd names it (`<ID> (serial N)`):
    /// break glass past the list's expiry. Absent for a plain key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
}

/// The longest certificate name a login carries.
pub const MAX_LOGIN_CERTIFICATE: usize = 200;

/// How many instances a heartbeat may list. One per host is the rule; the slack is for a
/// host that drifted, so it can still be seen and put right.
pub const MAX_HELD_VMS: usize = 64;

/// One instance a host holds: in the heartbeat, and as the agent lists it (`GET /v1/vms`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HeldVm {
    /// The container's name (an instance name, [`is_instance_name`]).
    pub name: String,
    /// LXD's status word: Running, Stopped, … (at most 32 letters).
    pub status: String,
    /// The port on the host its :22 is published at, when it has one.
    #[serde(default)]
    pub ssh_port: Option<u16>,
}

impl HeldVm {
    /// LXD's word for a container that runs.
    pub fn is_running(&self) -> bool {
        self.status.eq_ignore_ascii_case("running")
    }
}

// The customer's API (`/api/ssh-keys`, `/api/vms`) and the operator's view of deletes.

/// `POST /api/ssh-keys`: an OpenSSH public key line (`<type> <base64> [comment]`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewSshKey {
    pub name: String,
    pub public_key: String,
}

/// One of the customer's keys; instances are created with one of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SshKeyView {
    pub id: String,
    pub name: String,
    pub public_key: String,
    /// `SHA256:…`, as `ssh-keygen -l` prints it.
    pub fingerprint: String,
    pub created_at: DateTime<Utc>,
}

/// `POST /api/vms`: an instance of `gpu_type`, reachable with the key `ssh_key_id`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InstanceRequest {
    pub gpu_type: String,
    pub ssh_key_id: String,
}

/// An instance as its customer sees it. Billing runs from `created_at` until `deleted_at`;
/// a create that failed (`creation_failed_at`) bills nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceView {
    pub id: String,
    pub name: String,
    pub gpu_type: String,
    pub status: crate::states::VmStatus,
    /// `<name>.<slug>.ssh.<domain>`: resolves to the host's relay where the installation
    /// publishes DNS for instance names.
    pub ssh_hostname: Option<String>,
    /// The relay's public address: its :22 forwards to this instance (one relay per host).
    #[serde(default)]
    pub relay_address: Option<String>,
    /// The command that reaches the instance from anywhere: `ssh root@<ssh_hostname>` where
    /// DNS publishes instance names, `ssh root@<relay_address>` where it does not (`byo up`).
    #[serde(default)]
    pub ssh_command: Option<String>,
    pub created_at: DateTime<Utc>,
    pub creation_failed_at: Option<DateTime<Utc>>,
    /// When the delete was accepted: the instance was given up here (G.3).
    pub delete_requested_at: Option<DateTime<Utc>>,
    /// When the container was confirmed gone: billing stops here.
    pub deleted_at: Option<DateTime<Utc>>,
}

impl InstanceView {
    /// Where it is in its life ([`crate::states::InstancePhase`]).
    pub fn phase(&self) -> crate::states::InstancePhase {
        crate::states::InstancePhase::of(
            self.status,
            self.creation_failed_at.is_some(),
            self.delete_requested_at.is_some(),
            self.deleted_at.is_some(),
        )
    }
}

/// The answer to a create that the host accepted. The two checks are reported, never fatal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceCreated {
    pub instance: InstanceView,
    /// `None` when the host's answer was a success that could not be read.
    pub gpu_check: Option<Advisory>,
    pub startup_script: Option<Advisory>,
}

/// The answer to a create no host could take now (202): the create is queued (E2, step
/// 58) with its place in line, and the drain places it once a host frees up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceQueued {
    pub queued: QueuedView,
}

/// A queued create as its customer (and an operator) sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QueuedView {
    pub id: String,
    pub gpu_type: String,
    /// Its place among the open queued creates of its gpu_type: 1 is next.
    pub position: i64,
    pub created_at: DateTime<Utc>,
    /// Placements tried so far.
    pub attempts: i32,
    /// Why the last try did not place it (billing refused, the key removed, …).
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    /// When it lapses if no host took it by then (closed `expired`); "keep waiting"
    /// (`POST /api/queue/{id}/extend`) moves it.
    pub expires_at: DateTime<Utc>,
}

/// How a queued create ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum QueueEnding {
    /// A host took it: `vm_id` names the instance.
    Placed,
    /// An operator placed it on a host they chose: `vm_id` names the instance.
    PlacedByOperator,
    /// Its customer cancelled it.
    Cancelled,
    /// An operator closed it.
    ClosedByOperator,
    /// No host took it before `expires_at`.
    Expired,
}

/// A queued create that ended, as its customer is told: placed (and which instance),
/// cancelled, closed by an operator, or expired.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EndedQueuedView {
    pub id: String,
    pub gpu_type: String,
    pub created_at: DateTime<Utc>,
    pub closed_at: DateTime<Utc>,
    pub ending: QueueEnding,
    /// The instance it became (placed) or its last attempt.
    pub vm_id: Option<String>,
    /// Placements tried.
    pub attempts: i32,
    /// Why the last try did not place it, when one did not.
    pub last_error: Option<String>,
}

/// A queued create on /admin/queue: the row, whose it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AdminQueuedView {
    pub queued: QueuedView,
    pub user_sub: String,
    pub email: String,
}

/// An operator places a queued create on a host they name (E0's caller 4).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QueuePlaceRequest {
    pub host_id: String,
}

/// An operator closes a queued create, saying why (kept in the audit log).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct QueueCloseRequest {
    pub reason: String,
}

/// Where a delete stands when its caller stops waiting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeletionState {
    /// The host confirmed the container is gone (or never had it): the row is closed.
    Deleted,
    /// Accepted, not confirmed: the row stays live and billing continues until it is.
    Requested,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InstanceDeletion {
    pub state: DeletionState,
    pub message: String,
    pub instance: InstanceView,
}

/// What placement holds against a host (`GET /api/admin/hosts/{host_id}/placement`):
/// its creates failed in a row, its bench, and how old its last heartbeat is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostPlacementView {
    pub host_id: String,
    /// Benched now: the picker skips the host until a heartbeat later than `benched_at`
    /// arrives or an operator clears it.
    pub benched: bool,
    pub benched_at: Option<DateTime<Utc>>,
    /// Creates this host refused or never took since the last it took.
    pub consecutive_failures: i32,
    pub last_failure: Option<String>,
    pub last_failure_at: Option<DateTime<Utc>>,
    /// The host's last heartbeat (host_status.seen_at) and its age; `None` if it never beat.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    pub heartbeat_age_seconds: Option<i64>,
    /// Whether the heartbeat is recent enough for placement (`placement.max_heartbeat_age_secs`).
    pub heartbeat_fresh: bool,
}

/// A delete that was accepted and never confirmed (notify-stuck-deletes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StuckDelete {
    pub vm_id: String,
    pub name: String,
    pub user_sub: String,
    pub host_id: Option<String>,
    pub host_slug: Option<String>,
    /// Also what sizes the refund: the customer gave the instance up here.
    pub delete_requested_at: DateTime<Utc>,
    pub waiting_minutes: i64,
}

/// Whether `name` is an instance name: what LXD takes as a container name and DNS as a
/// label (1–63 of `[a-z0-9-]`, no `-` at either end, not all digits). The backend mints
/// names that pass it; the agent refuses a create with any other; a name goes into the
/// agent's URL paths only when it passes.
pub fn is_instance_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.bytes().all(|b| b.is_ascii_digit())
}

/// What the agent's API answers when it refuses (every non-2xx it sends itself): a code
/// the backend acts on and a message it shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRefusal {
    pub error: AgentErrorCode,
    pub message: String,
}

/// The backend's code for a create no host of its kind could take now (every candidate
/// tried, or the one tried still holding another instance): nothing was made and nothing is
/// billed. A customer's create queues instead of answering it; a booking's launch waits.
pub const NO_CAPACITY: &str = "no_capacity";

/// The agent's refusal codes. The backend acts on `not_found` (a delete's confirmation,
/// G.5) and `host_occupied` (a create on a host already holding an instance: no capacity);
/// the rest it reports with the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentErrorCode {
    /// No valid agent token.
    Unauthorized,
    /// Preparation has not handed over yet: the VM API is closed.
    NotPrepared,
    /// The request does not parse or breaks a rule (a bad name, a bad key).
    Invalid,
    /// No such instance on this host.
    NotFound,
    /// The instance exists already, or is not in a state the action needs.
    Conflict,
    /// A create on a host that already holds an instance (one per host): the message
    /// names it, and nothing was changed.
    HostOccupied,
    /// A create, start or reboot while an operator prepares the host again (L): nothing
    /// was done, and the backend answers it as `host_occupied`, no capacity.
    HostPreparing,
    /// A create failed at a fatal step and was taken back.
    Reverted,
    /// A signed operator-key list refused (M).
    Refused,
    /// The host failed to carry the request out.
    Failed,
    /// A code from a newer agent this build does not know.
    #[serde(other)]
    Other,
}

impl crate::limits::Bounded for Heartbeat {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{DETAILS, SHORT, json, text};
        text("agent_version", &self.agent_version, SHORT)?;
        let details = serde_json::to_value(&self.details).unwrap_or_default();
        json("details", &details, DETAILS)
    }
}

impl crate::limits::Bounded for NewSshKey {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{KEY_NAME_CHARS, PUBLIC_KEY, chars, text};
        chars("name", &self.name, KEY_NAME_CHARS)?;
        text("public_key", &self.public_key, PUBLIC_KEY)
    }
}

impl crate::limits::Bounded for InstanceRequest {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{SHORT, text};
        text("gpu_type", &self.gpu_type, SHORT)?;
        text("ssh_key_id", &self.ssh_key_id, SHORT)
    }
}

impl crate::limits::Bounded for QueuePlaceRequest {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::text("host_id", &self.host_id, crate::limits::SHORT)
    }
}

impl crate::limits::Bounded for QueueCloseRequest {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::text("reason", &self.reason, crate::limits::MESSAGE)
    }
}

impl crate::limits::Bounded for VmStateChange {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        Ok(())
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    #[test]
    fn instance_names_are_lxd_names_and_dns_labels() {
        for good in ["vm-2vg7asc4", "a", "x1-y2"] {
            assert!(is_instance_name(good), "{good}");
        }
        let long = "a".repeat(64);
        for bad in [
            "", "-vm", "vm-", "VM-1", "vm_1", "vm.1", "123", "vm 1", &long,
        ] {
            assert!(!is_instance_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_refusal_reads_back_and_an_unknown_code_is_other() {
        let r: AgentRefusal =
            serde_json::from_str(r#"{"error":"not_found","message":"no such instance"}"#).unwrap();
        assert_eq!(r.error, AgentErrorCode::NotFound);
        let r: AgentRefusal =
            serde_json::from_str(r#"{"error":"brand_new","message":"m"}"#).unwrap();
        assert_eq!(r.error, AgentErrorCode::Other);
        assert_eq!(
            serde_json::to_value(AgentErrorCode::NotPrepared).unwrap(),
            "not_prepared"
        );
        assert_eq!(
            serde_json::to_value(AgentErrorCode::HostOccupied).unwrap(),
            "host_occupied"
        );
        assert_eq!(
            serde_json::to_value(AgentErrorCode::HostPreparing).unwrap(),
            "host_preparing"
        );
    }
}
