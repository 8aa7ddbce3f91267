//! The agent's side of an instance (E1, G, L2): create, delete, start, stop and reboot
//! through LXD's REST API, and the relay's SSH map through ssh_mapd.
//!
//! - Create: the container from the lofispark-base alias with the lofispark-base profile,
//!   its :22 published on the host's tunnel address at a port the agent picks, the
//!   customer's key and the login banner pushed in, the GPU check and the startup script
//!   advisory (reported; the instance is created anyway), then the relay's map — fatal: a
//!   create refused after the container started reverts it. A host holds one instance: a
//!   create while any of ours exists (running or not) is refused before anything is made.
//! - Delete and stop clear the map; a delete of a container that is not there answers 404,
//!   which the backend takes as confirmation.
//! - At start, serving waits for LXD, restores each instance to its last state, and only
//!   then points the relay (head, then relay: forwarding before the head runs sends :22
//!   nowhere).
//! - On a pair (or a ring) the instance is the head here and a worker on each satellite
//!   (`crate::workers`): created, deleted, started and stopped together, the workers first
//!   cleared at a create, a worker that will not start failing the create, and at serving's
//!   start LXD, the head, the workers, then the relay (L2.3).

use std::time::Duration;

use byo_wire::relay::{MapEntry, MapTarget, SshMap};
use byo_wire::vm::{Advisory, CreateVm, HeldVm, VmAction, VmCreated};
use serde_json::json;

use crate::host::{Fallible, Host, LocalHost, LxdBody};
use crate::lxd;
use crate::names::{BASE_ALIAS, DUAL_PROFILE, LOGIN_BANNER, PROFILE_NAME};

/// The relay's public port a host's instance is reached on: plain ssh, no client software.
pub const PUBLIC_SSH_PORT: u16 = 22;
pub use crate::names::FIRST_SSH_PORT;
use crate::names::PORT_KEY;

/// Why an operation was refused, with the status the API answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmError {
    Invalid(String),
    NotFound,
    Conflict(String),
    /// A create on a host that already holds an instance (one per host), named here.
    Occupied(String),
    /// Refused after it started: reverted.
    Reverted(String),
    /// A deliberate re-prepare holds the host (`prepare::again`): nothing was done.
    Preparing,
    Failed(String),
}

impl std::fmt::Display for VmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmError::Invalid(m) | VmError::Conflict(m) | VmError::Failed(m) => f.write_str(m),
            VmError::NotFound => f.write_str("no such instance on this host"),
            VmError::Occupied(held) => write!(
                f,
                "this host already holds instance {held} (one instance per host); nothing was created"
            ),
            VmError::Reverted(m) => write!(f, "{m}; the instance was reverted"),
            VmError::Preparing => f.write_str(
                "an operator is preparing this host again (make byo-prepare); nothing was done: try another host, or this one when the run has finished",
            ),
        }
    }
}

/// ssh_mapd, as the agent reaches it inside the tunnel.
pub trait RelayMap {
    fn get(&self) -> Fallible<SshMap>;
    fn put_port(&self, port: u16, target: &MapTarget) -> Fallible<()>;
    fn delete_port(&self, port: u16) -> Fallible<()>;
    fn put(&self, map: &SshMap) -> Fallible<()>;
}

/// The real client.
pub struct HttpRelayMap {
    pub endpoint: String,
    pub token: String,
    client: reqwest::blocking::Client,
}

impl std::fmt::Debug for HttpRelayMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpRelayMap")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl HttpRelayMap {
    pub fn new(endpoint: &str, token: &str) -> Self {
        HttpRelayMap {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            token: token.to_owned(),
            client: reqwest::blocking::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(15))
                .build()
                .expect("an HTTP client with timeouts builds"),
        }
    }

    fn url(&self, path: &str) -> String {
        if self.endpoint.starts_with("http") {
            format!("{}{path}", self.endpoint)
        } else {
            format!("http://{}{path}", self.endpoint)
        }
    }

    fn check(
        resp: reqwest::Result<reqwest::blocking::Response>,
    ) -> Fallible<reqwest::blocking::Response> {
        let resp =
            resp.map_err(|e| format!("ssh_mapd could not be reached: {}", e.without_url()))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = resp.text().unwrap_or_default();
        Err(format!(
            "ssh_mapd answered {status}: {}",
            body.chars().take(200).collect::<String>()
        ))
    }
}

impl RelayMap for HttpRelayMap {
    fn get(&self) -> Fallible<SshMap> {
        Self::check(
            self.client
                .get(self.url("/map"))
                .bearer_auth(&self.token)
                .send(),
        )?
        .json()
        .map_err(|e| format!("ssh_mapd's map does not parse: {e}"))
    }
    fn put_port(&self, port: u16, target: &MapTarget) -> Fallible<()> {
        Self::check(
            self.client
                .put(self.url(&format!("/map/{port}")))
                .bearer_auth(&self.token)
                .json(target)
                .send(),
        )
        .map(drop)
    }
    fn delete_port(&self, port: u16) -> Fallible<()> {
        Self::check(
            self.client
                .delete(self.url(&format!("/map/{port}")))
                .bearer_auth(&self.token)
                .send(),
        )
        .map(drop)
    }
    fn put(&self, map: &SshMap) -> Fallible<()> {
        Self::check(
            self.client
                .put(self.url("/map"))
                .bearer_auth(&self.token)
                .json(map)
                .send(),
        )
        .map(drop)
    }
}

/// What the VM API needs besides the host.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// The host's tunnel address (10.8.0.2), where instances' :22 are published.
    pub ssh_listen: String,
    /// Run the GPU check (profiles with a GPU).
    pub gpu: bool,
    /// Preparation installed the operator tunnel (cloudflared); `None` when the hand-over
    /// predates the record (then the unit is asked all the same).
    pub tunnel: Option<bool>,
    /// The kept operator-key list, whose version and expiry the heartbeat reports (#16).
    pub operator_keys_held: Option<std::path::PathBuf>,
    /// The lock a deliberate re-prepare holds (`lock::PREPARE_LOCK`): creates,
    /// starts and reboots share it, and are refused while the run holds it.
    pub prepare_lock: Option<std::path::PathBuf>,
    /// The machines an instance spans: node0 alone, or a pair's or a ring's, whose workers
    /// go with the head.
    pub machines: crate::machines::Machines,
    /// Where serving asks root's `enverge-agent-reboot.path` for this machine's reboot (L4);
    /// `None`: this host is not rebooted from here.
    pub reboot_flag: Option<std::path::PathBuf>,
}

/// L4, a reboot of the host (a pair's: the customer's button and /admin's are this one
/// call): each satellite's deferred reboot first, one that does not answer not waited for,
/// then node0's, a moment later, through root's path unit. Refused while a deliberate
/// re-prepare holds the host.
pub fn reboot_host(config: &VmConfig) -> Result<byo_wire::vm::HostRebooting, VmError> {
    let Some(flag) = &config.reboot_flag else {
        return Err(VmError::Failed(
            "this host's reboot is not set up here".into(),
        ));
    };
    let _held = not_while_preparing(config)?;
    let defer = byo_core::render::units::REBOOT_DEFER_SECS;
    let satellites = crate::workers::reboot_satellites(&config.machines, defer);
    std::fs::write(flag, b"requested by the backend\n").map_err(|e| {
        VmError::Failed(format!(
            "asking for node0's reboot ({}): {e}",
            flag.display()
        ))
    })?;
    tracing::info!(in_secs = defer, "rebooting: node0 goes down shortly");
    Ok(byo_wire::vm::HostRebooting {
        node0_in_secs: defer,
        satellites,
    })
}

/// Hold the re-prepare lock shared for one operation that makes an instance run, or refuse
/// (`Preparing`) while a deliberate run holds it. No lock configured: nothing to hold.
fn not_while_preparing(config: &VmConfig) -> Result<Option<std::fs::File>, VmError> {
    let Some(path) = &config.prepare_lock else {
        return Ok(None);
    };
    match crate::lock::lock_shared(path) {
        Ok(Some(held)) => Ok(Some(held)),
        Ok(None) => Err(VmError::Preparing),
        Err(e) => Err(VmError::Failed(format!(
            "the re-prepare lock {} could not be taken: {e}",
            path.display()
        ))),
    }
}

fn instance_path(name: &str) -> String {
    format!("/1.0/instances/{name}")
}

/// Our instances: name, LXD status, published port, last power state.
fn ours<H: Host + ?Sized>(h: &mut H) -> Fallible<Vec<(String, String, u16, String)>> {
    Ok(lxd::instances(h)?
        .iter()
        .filter_map(|i| {
            let port = i["config"][PORT_KEY].as_str()?.parse().ok()?;
            Some((
                i["name"].as_str()?.to_owned(),
                i["status"].as_str().unwrap_or_default().to_owned(),
                port,
                i["config"]["volatile.last_state.power"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ))
        })
        .collect())
}

/// Our instances that hold the rails (rule 5): every one not stopped.
pub fn live<H: Host + ?Sized>(h: &mut H) -> Fallible<Vec<String>> {
    Ok(ours(h)?
        .into_iter()
        .filter(|(_, status, ..)| status != "Stopped")
        .map(|(name, ..)| name)
        .collect())
}

pub fn list<H: Host + ?Sized>(h: &mut H) -> Fallible<Vec<HeldVm>> {
    Ok(ours(h)?
        .into_iter()
        .map(|(name, status, port, _)| HeldVm {
            name,
            status,
            ssh_port: Some(port),
        })
        .collect())
}

fn target(config: &VmConfig, port: u16) -> MapTarget {
    MapTarget {
        target: config.ssh_listen.clone(),
        target_port: port,
    }
}

/// Create the customer's instance; every refusal after the container exists reverts it.
pub fn create<H: Host + ?Sized>(
    h: &mut H,
    relay: &dyn RelayMap,
    config: &VmConfig,
    req: &CreateVm,
) -> Result<VmCreated, VmError> {
    if !byo_wire::vm::is_instance_name(&req.name) {
        return Err(VmError::Invalid(format!(
            "{:?} is not an instance name (lowercase letters, digits and -)",
            req.name
        )));
    }
    let key = ssh_key::PublicKey::from_openssh(req.ssh_public_key.trim())
        .map_err(|e| VmError::Invalid(format!("the customer's key does not parse: {e}")))?;
    let key_line = format!(
        "{}\n",
        key.to_openssh()
            .map_err(|e| VmError::Invalid(e.to_string()))?
    );
    let machines = &config.machines;
    let longest = byo_core::lockstep::longest_head(machines.count());
    if req.name.len() > longest {
        return Err(VmError::Invalid(format!(
            "{:?} is too long for a host of {} machines: its workers' names must fit LXD's 63 characters (at most {longest} here)",
            req.name,
            machines.count()
        )));
    }
    let _held = not_while_preparing(config)?;
    let fail = VmError::Failed;
    let existing = ours(h).map_err(fail)?;
    if existing.iter().any(|(n, ..)| *n == req.name)
        || lxd::get(h, &instance_path(&req.name))
            .map_err(fail)?
            .is_some()
    {
        return Err(VmError::Conflict(format!(
            "an instance named {} already exists",
            req.name
        )));
    }
    // One instance per host, whatever its state: a stopped one still holds the host (its
    // customer starts it again), and so does one whose delete has not finished. The
    // backend picks only hosts holding no live row; this is the host's own word on it.
    if let Some((held, ..)) = existing.first() {
        return Err(VmError::Occupied(held.clone()));
    }
    let port = (FIRST_SSH_PORT..)
        .find(|p| !existing.iter().any(|(_, _, q, _)| q == p))
        .ok_or_else(|| VmError::Failed("no port left".into()))?;
    // Whatever worker a satellite still holds goes first (K1 11.1); a satellite that cannot
    // be reached fails the create before anything is made.
    crate::workers::clear(machines)
        .map_err(|e| VmError::Failed(format!("{e}; nothing was created")))?;
    let mut profiles = vec![PROFILE_NAME];
    if !machines.is_single() {
        profiles.push(DUAL_PROFILE);
    }
    let body = json!({
        "name": req.name,
        "type": "container",
        "source": {"type": "image", "alias": BASE_ALIAS},
        "profiles": profiles,
        "config": {PORT_KEY: port.to_string()},
        "devices": {"ssh": {"type": "proxy", "listen": format!("tcp:{}:{port}", config.ssh_listen),
                            "connect": "tcp:127.0.0.1:22"}},
    });
    lxd::json_call(h, "POST", "/1.0/instances", &body)
        .map_err(|e| VmError::Failed(format!("the container could not be created: {e}")))?;
    // From here on, a refusal takes the container back with it — with its workers, and
    // every machine's rails are the hosts' again.
    let revert = |h: &mut H, why: String| -> VmError {
        let mut left = crate::workers::remove(machines, &req.name);
        if let Err(e) = lxd::delete_instance(h, &req.name) {
            left.push(e);
        }
        left.extend(crate::workers::rails_restored(h, machines));
        match left.is_empty() {
            true => VmError::Reverted(why),
            false => VmError::Failed(format!(
                "{why}; and reverting failed too: {}",
                left.join("; ")
            )),
        }
    };
    if let Err(e) = lxd::state(h, &req.name, "start") {
        return Err(revert(h, format!("the container would not start: {e}")));
    }
    if let Err(e) = push_dir(h, &req.name, "/root/.ssh", 0o700).and_then(|()| {
        lxd::push(
            h,
            &req.name,
            "/root/.ssh/authorized_keys",
            key_line.as_bytes(),
            0o600,
        )
    }) {
        return Err(revert(
            h,
            format!("the customer's key could not be put in: {e}"),
        ));
    }
    let mut banner = LOGIN_BANNER.to_owned();
    if let Some(name) = &req.ssh_hostname {
        banner.push_str(&format!("  You are on {name}.\n\n"));
    }
    if let Err(e) = lxd::push(h, &req.name, "/etc/motd", banner.as_bytes(), 0o644) {
        return Err(revert(
            h,
            format!("the login banner could not be put in: {e}"),
        ));
    }
    if let Err(e) = crate::workers::complete_instance(h, machines, &req.name) {
        return Err(revert(h, e));
    }
    let gpu_check = advisory(h, &req.name, config.gpu);
    let startup_script = startup(h, &req.name);
    // Fatal: an instance whose :22 goes nowhere is not an instance.
    if let Err(e) = relay.put_port(PUBLIC_SSH_PORT, &target(config, port)) {
        return Err(revert(
            h,
            format!("the relay's SSH map could not be written: {e}"),
        ));
    }
    Ok(VmCreated {
        name: req.name.clone(),
        ssh_port: port,
        gpu_check,
        startup_script,
    })
}

fn push_dir<H: Host + ?Sized>(h: &mut H, instance: &str, path: &str, mode: u32) -> Fallible<()> {
    let headers = [
        ("X-LXD-uid", "0".to_owned()),
        ("X-LXD-gid", "0".to_owned()),
        ("X-LXD-mode", format!("{mode:04o}")),
        ("X-LXD-type", "directory".to_owned()),
    ];
    lxd::call(
        h,
        "POST",
        &format!("/1.0/instances/{instance}/files?path={path}"),
        LxdBody::Raw {
            bytes: &[],
            headers: &headers,
        },
    )
    .map(drop)
}

fn advisory<H: Host + ?Sized>(h: &mut H, instance: &str, gpu: bool) -> Advisory {
    if !gpu {
        return Advisory {
            ok: true,
            detail: Some("this profile has no GPU".into()),
        };
    }
    match lxd::exec(
        h,
        instance,
        &["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
    ) {
        Ok(out) if out.code == 0 => Advisory {
            ok: true,
            detail: Some(out.stdout.trim().to_owned()),
        },
        Ok(out) => Advisory {
            ok: false,
            detail: Some(format!(
                "nvidia-smi exited {}: {}",
                out.code,
                out.stderr.trim()
            )),
        },
        Err(e) => Advisory {
            ok: false,
            detail: Some(e),
        },
    }
}

fn startup<H: Host + ?Sized>(h: &mut H, instance: &str) -> Advisory {
    const SCRIPT: &str = "/etc/enverge/startup.sh";
    match lxd::exec(
        h,
        instance,
        &[
            "/bin/sh",
            "-c",
            &format!("test ! -e {SCRIPT} || exec /bin/sh {SCRIPT}"),
        ],
    ) {
        Ok(out) if out.code == 0 => Advisory {
            ok: true,
            detail: None,
        },
        Ok(out) => Advisory {
            ok: false,
            detail: Some(format!(
                "{SCRIPT} exited {}: {}",
                out.code,
                out.stderr.trim()
            )),
        },
        Err(e) => Advisory {
            ok: false,
            detail: Some(e),
        },
    }
}

/// Delete; a container that is not there is `NotFound` (the backend's confirmation).
pub fn delete<H: Host + ?Sized>(
    h: &mut H,
    relay: &dyn RelayMap,
    config: &VmConfig,
    name: &str,
) -> Result<(), VmError> {
    let fail = VmError::Failed;
    let mine = ours(h).map_err(fail)?;
    let Some((_, _, port, _)) = mine.iter().find(|(n, ..)| n == name).cloned() else {
        return Err(VmError::NotFound);
    };
    lxd::delete_instance(h, name)
        .map_err(|e| VmError::Failed(format!("the container could not be deleted: {e}")))?;
    // The workers go with the head; one a satellite that does not answer still holds is
    // removed by lockstep when it does (its head is gone). Then the rails are the hosts'.
    crate::workers::remove(&config.machines, name);
    crate::workers::rails_restored(h, &config.machines);
    clear_map(relay, config, port).map_err(VmError::Failed)
}

/// Clear the relay's :22 if it still points at this instance's port.
fn clear_map(relay: &dyn RelayMap, config: &VmConfig, port: u16) -> Fallible<()> {
    let map = relay.get()?;
    let points_here = map.mappings.iter().any(|m| {
        m.port == PUBLIC_SSH_PORT && m.target == config.ssh_listen && m.target_port == port
    });
    if points_here {
        relay.delete_port(PUBLIC_SSH_PORT)?;
    }
    Ok(())
}

pub fn change_state<H: Host + ?Sized>(
    h: &mut H,
    relay: &dyn RelayMap,
    config: &VmConfig,
    name: &str,
    action: VmAction,
) -> Result<(), VmError> {
    let fail = VmError::Failed;
    let mine = ours(h).map_err(fail)?;
    let Some((_, _, port, _)) = mine.iter().find(|(n, ..)| n == name).cloned() else {
        return Err(VmError::NotFound);
    };
    // A stop takes nothing the run needs; a start or a reboot makes the instance run.
    let _held = match action {
        VmAction::Stop => None,
        VmAction::Start | VmAction::Reboot => not_while_preparing(config)?,
    };
    // Lockstep (L rule 4): the workers follow the head. A satellite that does not answer
    // does not hold the customer's button; the heartbeat brings its worker in step.
    let workers = |action: &str| {
        for e in crate::workers::power(&config.machines, name, action) {
            tracing::warn!(error = %e, "a worker did not follow its head; the heartbeat tries again");
        }
    };
    match action {
        VmAction::Stop => {
            lxd::state(h, name, "stop").map_err(fail)?;
            workers("stop");
            // A stopped instance does not hold the rails (rule 5): they are the hosts' again,
            // addressed, so a deliberate run on the idle pair finds its cables.
            crate::workers::rails_restored(h, &config.machines);
            clear_map(relay, config, port).map_err(fail)
        }
        VmAction::Start => {
            lxd::state(h, name, "start").map_err(fail)?;
            workers("start");
            relay
                .put_port(PUBLIC_SSH_PORT, &target(config, port))
                .map_err(fail)
        }
        VmAction::Reboot => {
            lxd::state(h, name, "restart").map_err(fail)?;
            workers("restart");
            relay
                .put_port(PUBLIC_SSH_PORT, &target(config, port))
                .map_err(fail)
        }
    }
}

/// node0's instance for lockstep: the one of ours, and whether it runs.
pub fn head<H: Host + ?Sized>(h: &mut H) -> Fallible<Option<byo_core::lockstep::Head>> {
    Ok(ours(h)?
        .into_iter()
        .next()
        .map(|(name, status, ..)| byo_core::lockstep::Head {
            name,
            running: status == "Running",
        }))
}

/// What the relay's map should hold for what this host runs now.
pub fn wanted_map<H: Host + ?Sized>(h: &mut H, config: &VmConfig) -> Fallible<SshMap> {
    let mut mappings: Vec<MapEntry> = ours(h)?
        .into_iter()
        .filter(|(_, status, ..)| status == "Running")
        .map(|(_, _, port, _)| MapEntry {
            port: PUBLIC_SSH_PORT,
            target: config.ssh_listen.clone(),
            target_port: port,
        })
        .take(1)
        .collect();
    mappings.sort();
    Ok(SshMap { mappings })
}

/// The relay as it is this minute: rewrite its map when it differs from what the host
/// runs. Returns whether it had to.
pub fn reassert_map<H: Host + ?Sized>(
    h: &mut H,
    relay: &dyn RelayMap,
    config: &VmConfig,
) -> Fallible<bool> {
    sync_map(relay, &wanted_map(h, config)?)
}

/// Make the relay's map `want`, whole, when it is anything else.
pub fn sync_map(relay: &dyn RelayMap, want: &SshMap) -> Fallible<bool> {
    Ok(sync_map_drift(relay, want)?.is_some())
}

/// [`sync_map`], returning what the relay held when it differed (the drift found).
pub fn sync_map_drift(relay: &dyn RelayMap, want: &SshMap) -> Fallible<Option<SshMap>> {
    let mut have = relay.get()?;
    have.mappings.sort();
    if have == *want {
        return Ok(None);
    }
    relay.put(want)?;
    Ok(Some(have))
}

/// At start (L2): wait for LXD, bring each instance back to its last state (the head
/// only when it was running), then point the relay.
pub fn restore<H: Host + ?Sized>(
    h: &mut H,
    relay: &dyn RelayMap,
    config: &VmConfig,
    wait: Duration,
) -> Fallible<Vec<String>> {
    let started = std::time::Instant::now();
    while lxd::get(h, "/1.0").ok().flatten().is_none() {
        if started.elapsed() > wait {
            return Err(format!("LXD did not answer within {}s", wait.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // The journal is the record of the order (L2.3), which the reboot test reads.
    tracing::info!(
        waited_ms = started.elapsed().as_millis() as u64,
        "LXD answers"
    );
    let mut started_again = Vec::new();
    for (name, status, _, last) in ours(h)? {
        if status != "Running" && last.eq_ignore_ascii_case("running") {
            lxd::state(h, &name, "start")?;
            tracing::info!(%name, "head started: it was running before");
            started_again.push(name);
        } else {
            tracing::info!(%name, %status, last = %last, "left as LXD holds it");
        }
    }
    // L2.3: the workers after the head, before the relay. A satellite that does not answer
    // does not stop node0 serving (L2.4); the heartbeat keeps asking (L3).
    if !config.machines.is_single() {
        // Each move is logged where it is made.
        let (_, half) = crate::workers::keep(&config.machines, head(h)?.as_ref());
        for why in half {
            tracing::warn!(%why, "half a pair at start");
        }
    }
    reassert_map(h, relay, config)?;
    Ok(started_again)
}

/// What the VM API acts through: LXD on this host, and the relay's ssh_mapd.
pub struct VmService {
    pub config: VmConfig,
    pub relay: Box<dyn RelayMap + Send + Sync>,
    pub host: std::sync::Mutex<LocalHost>,
}

impl VmService {
    /// Run one VM operation off the async workers, one at a time (ports and names are
    /// picked from what LXD holds, so two creates must not interleave).
    pub(crate) async fn with<T: Send + 'static>(
        self: &std::sync::Arc<Self>,
        op: impl FnOnce(&mut LocalHost, &dyn RelayMap, &VmConfig) -> T + Send + 'static,
    ) -> Result<T, String> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut host = me.host.lock().unwrap_or_else(|p| p.into_inner());
            op(&mut host, me.relay.as_ref(), &me.config)
        })
        .await
        .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;
    use crate::host::{LxdReply, Output};

    /// LXD holding `instances` (`?recursion=1`'s answer); every call is recorded, and
    /// anything but a read is refused, so a test sees whether create tried to change a thing.
    struct FakeLxd {
        instances: serde_json::Value,
        calls: Vec<(String, String)>,
        /// The JSON bodies sent, in order.
        sent: Vec<serde_json::Value>,
    }

    impl Host for FakeLxd {
        fn run(&mut self, argv: &[&str], _: Option<&[u8]>) -> Fallible<Output> {
            Err(format!("no programs here: {argv:?}"))
        }
        fn read(&mut self, _: &str) -> Fallible<Option<Vec<u8>>> {
            Ok(None)
        }
        fn write(&mut self, path: &str, _: &[u8], _: u32, _: &str) -> Fallible<()> {
            Err(format!("no writes here: {path}"))
        }
        fn remove(&mut self, path: &str) -> Fallible<()> {
            Err(format!("no removes here: {path}"))
        }
        fn lxd(&mut self, method: &str, path: &str, body: LxdBody<'_>) -> Fallible<LxdReply> {
            self.calls.push((method.to_owned(), path.to_owned()));
            if let LxdBody::Json(v) = body {
                self.sent.push(v.clone());
            }
            let (status, body) = match (method, path) {
                ("GET", "/1.0/instances?recursion=1") => (
                    200,
                    json!({"type": "sync", "metadata": self.instances.clone()}),
                ),
                ("GET", p) => {
                    let name = p.trim_start_matches("/1.0/instances/");
                    let held = self.instances.as_array().into_iter().flatten();
                    match held.clone().find(|i| i["name"] == name) {
                        Some(i) => (200, json!({"type": "sync", "metadata": i})),
                        None => (404, json!({"type": "error", "error": "not found"})),
                    }
                }
                _ => (
                    500,
                    json!({"type": "error", "error": "this fake changes nothing"}),
                ),
            };
            Ok(LxdReply {
                status,
                body: body.to_string().into_bytes(),
            })
        }
        fn describe(&self) -> String {
            "fake LXD".into()
        }
    }

    #[derive(Default)]
    struct Relay(RefCell<Vec<String>>);

    impl RelayMap for Relay {
        fn get(&self) -> Fallible<SshMap> {
            self.0.borrow_mut().push("get".into());
            Ok(SshMap::default())
        }
        fn put_port(&self, port: u16, _: &MapTarget) -> Fallible<()> {
            self.0.borrow_mut().push(format!("put {port}"));
            Ok(())
        }
        fn delete_port(&self, port: u16) -> Fallible<()> {
            self.0.borrow_mut().push(format!("delete {port}"));
            Ok(())
        }
        fn put(&self, _: &SshMap) -> Fallible<()> {
            self.0.borrow_mut().push("put".into());
            Ok(())
        }
    }

    fn ours(name: &str, status: &str, port: u16) -> serde_json::Value {
        json!({"name": name, "status": status, "config": {PORT_KEY: port.to_string()}})
    }

    fn request(name: &str) -> CreateVm {
        CreateVm {
            name: name.into(),
            ssh_public_key:
                "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGXbBkKhxRqtwdtBr1JRFsuK7mWzsKEHvLjOT8tNYKd3"
                    .into(),
            ssh_hostname: None,
        }
    }

    fn config() -> VmConfig {
        VmConfig {
            tunnel: Some(false),
            ssh_listen: "10.8.0.2".into(),
            gpu: false,
            operator_keys_held: None,
            prepare_lock: None,
            machines: crate::machines::Machines::single(),
            reboot_flag: None,
        }
    }

    #[test]
    fn a_second_create_is_refused_naming_the_instance_held_and_nothing_changes() {
        // Running or stopped, ours holds the host; the image builder's container (no
        // published port) is not an instance.
        for status in ["Running", "Stopped"] {
            let mut lxd = FakeLxd {
                instances: json!([ours("vm-first", status, 22000), {"name": "lofispark-build", "status": "Stopped", "config": {}}]),
                calls: Vec::new(),
                sent: Vec::new(),
            };
            let relay = Relay::default();
            let err = create(&mut lxd, &relay, &config(), &request("vm-second")).unwrap_err();
            assert_eq!(err, VmError::Occupied("vm-first".into()), "{status}");
            assert!(
                err.to_string().contains("already holds instance vm-first"),
                "{err}"
            );
            assert!(
                lxd.calls.iter().all(|(method, _)| method == "GET"),
                "a refused create changed something: {:?}",
                lxd.calls
            );
            assert!(
                relay.0.borrow().is_empty(),
                "the relay was called: {:?}",
                relay.0.borrow()
            );
        }
    }

    #[test]
    fn a_create_again_under_the_held_name_is_the_name_conflict_it_always_was() {
        let mut lxd = FakeLxd {
            instances: json!([ours("vm-first", "Running", 22000)]),
            calls: Vec::new(),
            sent: Vec::new(),
        };
        let relay = Relay::default();
        let err = create(&mut lxd, &relay, &config(), &request("vm-first")).unwrap_err();
        assert!(matches!(err, VmError::Conflict(_)), "{err:?}");
        assert!(lxd.calls.iter().all(|(method, _)| method == "GET"));
    }

    /// A pair whose satellite answers holding nothing, or never answers.
    fn pair(answers: bool) -> crate::machines::Machines {
        #[derive(Debug)]
        struct Satellite(bool);
        impl crate::machines::SatelliteHosts for Satellite {
            fn host(&self, _: &crate::machines::PairNode) -> Fallible<Box<dyn Host>> {
                match self.0 {
                    true => Ok(Box::new(FakeLxd {
                        instances: json!([]),
                        calls: Vec::new(),
                        sent: Vec::new(),
                    })),
                    false => Err("no route to host".into()),
                }
            }
        }
        let node = |index| crate::machines::PairNode {
            index,
            mgmt_addr: Some("10.0.0.9".into()),
            host_key: None,
            lxd_socket: None,
            rails: Vec::new(),
        };
        crate::machines::Machines::handed(
            &[node(0), node(1)],
            std::sync::Arc::new(Satellite(answers)),
            "/nowhere".into(),
        )
    }

    #[test]
    fn one_spark_and_a_pair_are_one_path_each_asked_of_its_machines() {
        let long = "a".repeat(62);
        let empty = || FakeLxd {
            instances: json!([]),
            calls: Vec::new(),
            sent: Vec::new(),
        };
        let profiles = |lxd: &FakeLxd| lxd.sent.last().map(|b| b["profiles"].clone());
        // One Spark: a 62-character name is an instance name, nothing is asked of satellites
        // it has none of, and the head is one container on the base profile alone.
        let mut lxd = empty();
        let err = create(&mut lxd, &Relay::default(), &config(), &request(&long)).unwrap_err();
        assert!(err.to_string().contains("could not be created"), "{err}");
        assert_eq!(profiles(&lxd), Some(json!([PROFILE_NAME])));
        // A pair: the head also carries the dual profile.
        let answering = VmConfig {
            machines: pair(true),
            ..config()
        };
        let mut lxd = empty();
        let err = create(
            &mut lxd,
            &Relay::default(),
            &answering,
            &request("vm-first"),
        )
        .unwrap_err();
        assert!(err.to_string().contains("could not be created"), "{err}");
        assert_eq!(profiles(&lxd), Some(json!([PROFILE_NAME, DUAL_PROFILE])));
        // Its worker's name would pass LXD's 63, so a long name is refused before anything.
        let paired = VmConfig {
            machines: pair(false),
            ..config()
        };
        let mut lxd = empty();
        let err = create(&mut lxd, &Relay::default(), &paired, &request(&long)).unwrap_err();
        assert!(
            matches!(&err, VmError::Invalid(m) if m.contains("host of 2 machines")),
            "{err:?}"
        );
        assert!(lxd.calls.is_empty(), "{:?}", lxd.calls);
        // A satellite that does not answer fails the create before the head is made.
        let mut lxd = empty();
        let err = create(&mut lxd, &Relay::default(), &paired, &request("vm-first")).unwrap_err();
        assert!(
            matches!(&err, VmError::Failed(m) if m.contains("node1 cannot be reached") && m.contains("nothing was created")),
            "{err:?}"
        );
        assert!(lxd.calls.iter().all(|(method, _)| method == "GET"));
    }

    #[test]
    fn an_empty_host_goes_on_to_create() {
        let mut lxd = FakeLxd {
            instances: json!([{"name": "lofispark-build", "status": "Stopped", "config": {}}]),
            calls: Vec::new(),
            sent: Vec::new(),
        };
        let err = create(&mut lxd, &Relay::default(), &config(), &request("vm-first")).unwrap_err();
        // This fake refuses every change: the create got as far as asking LXD for one.
        assert!(err.to_string().contains("could not be created"), "{err}");
        assert!(
            lxd.calls
                .iter()
                .any(|(m, p)| m == "POST" && p == "/1.0/instances")
        );
    }
}
