//! Preparation (C): new_spark.md §4 and §6 as the 19 named steps, run by the pure engine in
//! `byo_core::prepare` over the host adapter. `docs/prepare.md` lists every step with its
//! check, its apply and why it sits where it does.

pub mod again;
pub mod peers;
pub mod steps;
pub mod unit;

use std::cell::RefCell;

use byo_core::prepare::{DoneList, Mode, Outcome, Progress, Step};
use byo_wire::enroll::{ConnectorBuild, WireGuardConfig};
use byo_wire::prepare::StepState;
use byo_wire::profile::ProfilePlan;
use chrono::{DateTime, Utc};

use crate::host::{Fallible, Host, LxdBody, LxdReply, Output};

pub use crate::machines::{HANDED_OVER, HandOver};
pub use crate::names::OWNER_FILE;
pub use steps::{
    BASE_ALIAS, BUILD_INSTANCE, BUILDER_SCRIPT, LOGIN_BANNER, PROFILE_NAME, SPARK, STEP_NAMES,
    UDHCPC_SCRIPT, recipe_digest, refresh_tenant_firewall, render_base_profile, render_wireguard,
};

/// The done list, scoped to the build that wrote it.
pub const DONE_LIST: &str = "/var/lib/enverge-agent/prepare-done.json";

/// Everything the steps read besides the host itself: the profile, and what enrolment
/// returned. Built by the caller from the kept credentials.
#[derive(Clone)]
pub struct Plan {
    pub profile: ProfilePlan,
    /// spark's authorized_keys, rendered from the kept signed list (already verified).
    pub authorized_keys: Option<String>,
    pub wireguard: Option<WireGuardConfig>,
    pub tunnel_token: Option<String>,
    /// The pinned cloudflared build enrolment named, installed when the host has none.
    pub cloudflared: Option<ConnectorBuild>,
    /// hosts.lockout_owner: owner-lockout runs only when the host says so.
    pub lockout_owner: bool,
    /// The owner's login on this node (node0: recorded by the installer).
    pub owner: Option<String>,
    /// Which machine this plan prepares: 0 is node0; k a satellite in the node1 block.
    pub node: u32,
    /// The satellites as peer.json pins them (none on a single Spark).
    pub peers: Vec<peers::Peer>,
    /// How node0 reaches them.
    pub satellites: Option<std::rc::Rc<dyn peers::Satellites>>,
    /// node0's peer key (public half), which satellites admit besides the operators.
    pub peer_public_key: Option<String>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The WireGuard key and the connector token stay out of every log.
        f.debug_struct("Plan")
            .field("profile", &self.profile)
            .field("lockout_owner", &self.lockout_owner)
            .field("owner", &self.owner)
            .field("node", &self.node)
            .field("peers", &self.peers)
            .finish_non_exhaustive()
    }
}

/// The steps, in the order whose landmines `docs/prepare.md` explains.
pub fn steps<'p, H: Host + 'p>(plan: &'p Plan) -> Vec<Box<dyn Step<H> + 'p>> {
    steps::all(plan)
}

/// Run preparation on `host` as node `node`: the done list is kept on the host after every
/// completed step (so a run killed part way resumes there, and only by this very build),
/// and progress goes to `report`.
pub fn run<H: Host>(
    host: &mut H,
    plan: &Plan,
    node: u32,
    build: &str,
    mode: Mode,
    now: impl FnMut() -> DateTime<Utc>,
    report: impl FnMut(Progress),
) -> Outcome {
    run_trusting(host, plan, node, build, mode, true, now, report)
}

/// [`run`], choosing whether the kept done list is read at all: the deliberate run (L)
/// re-checks every step whichever build wrote it (`trust_done_list` false).
#[allow(clippy::too_many_arguments)] // run's inputs, and the one choice the deliberate run makes
pub fn run_trusting<H: Host>(
    host: &mut H,
    plan: &Plan,
    node: u32,
    build: &str,
    mode: Mode,
    trust_done_list: bool,
    now: impl FnMut() -> DateTime<Utc>,
    mut report: impl FnMut(Progress),
) -> Outcome {
    let previous = if trust_done_list {
        crate::host::read_string(host, DONE_LIST)
            .ok()
            .flatten()
            .and_then(|s| serde_json::from_str::<DoneList>(&s).ok())
    } else {
        None
    };
    let cell = RefCell::new(host);
    let mut shared = Shared(&cell);
    let steps = steps::<Shared<'_, '_, H>>(plan);
    let refs: Vec<&dyn Step<Shared<'_, '_, H>>> = steps.iter().map(|s| s.as_ref()).collect();
    let mut kept = DoneList {
        build: build.to_owned(),
        steps: Vec::new(),
    };
    byo_core::prepare::run(
        &refs,
        &mut shared,
        node,
        build,
        previous.as_ref(),
        mode,
        now,
        |p| {
            let completed = matches!(
                p.state.state,
                StepState::Satisfied | StepState::Applied | StepState::Skipped
            );
            if mode == Mode::Run && completed {
                kept.steps.push(p.state.step.clone());
                let bytes = serde_json::to_vec(&kept).unwrap_or_default();
                if let Err(e) = cell
                    .borrow_mut()
                    .write(DONE_LIST, &bytes, 0o600, "root:root")
                {
                    tracing::warn!(error = %e, "the done list could not be kept");
                }
            }
            report(p);
        },
    )
}

/// The host shared between the engine (which drives the steps) and the progress callback
/// (which keeps the done list between steps); the two never hold it at once.
pub struct Shared<'c, 'h, H>(&'c RefCell<&'h mut H>);

impl<H: Host> Host for Shared<'_, '_, H> {
    fn run(&mut self, argv: &[&str], stdin: Option<&[u8]>) -> Fallible<Output> {
        self.0.borrow_mut().run(argv, stdin)
    }
    fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>> {
        self.0.borrow_mut().read(path)
    }
    fn write(&mut self, path: &str, bytes: &[u8], mode: u32, owner: &str) -> Fallible<()> {
        self.0.borrow_mut().write(path, bytes, mode, owner)
    }
    fn remove(&mut self, path: &str) -> Fallible<()> {
        self.0.borrow_mut().remove(path)
    }
    fn lxd(&mut self, method: &str, path: &str, body: LxdBody<'_>) -> Fallible<LxdReply> {
        self.0.borrow_mut().lxd(method, path, body)
    }
    fn describe(&self) -> String {
        self.0.borrow().describe()
    }
}

/// The plan from what enrolment kept: the profile's constants, the WireGuard peer, the
/// tunnel's connector token, lockout_owner, and spark's authorized_keys rendered from the
/// kept signed list.
pub fn plan_from(
    creds: &byo_wire::enroll::EnrollResponse,
    authorized_keys: Option<String>,
) -> Result<Plan, String> {
    let profile: ProfilePlan = serde_json::from_value(creds.constants.clone()).map_err(|e| {
        format!(
            "the profile's constants ({}) do not parse: {e}",
            creds.profile_id
        )
    })?;
    let tunnel_token = creds
        .tunnel_connector_token
        .clone()
        .filter(|_| profile.prepare.tunnel);
    Ok(Plan {
        profile,
        authorized_keys,
        wireguard: Some(creds.wireguard.clone()),
        tunnel_token,
        cloudflared: creds.cloudflared.clone(),
        lockout_owner: creds.lockout_owner,
        owner: None,
        node: 0,
        peers: Vec::new(),
        satellites: None,
        peer_public_key: None,
    })
}

/// Which build this is: the done list is trusted only by the binary that wrote it, and a
/// version number says nothing about what a step now does, so the binary's own digest.
pub fn build_id() -> String {
    format!("byo-agent {}", crate::report::build_version())
}

/// The last act of a completed preparation (L, rule 1): the credentials serving needs,
/// owned by spark, written whole. Later starts find it and exit at once.
pub fn hand_over<H: Host>(host: &mut H, serving: &HandOver) -> Fallible<()> {
    let bytes = serde_json::to_vec_pretty(serving).map_err(|e| e.to_string())?;
    // spark may open the files meant for it in /etc/enverge (each keeps its own mode; the
    // directory is not listable), and owns the agent's state, where pushes land (M.5).
    crate::host::must(host, &["chmod", "0711", "/etc/enverge"])?;
    crate::host::must(
        host,
        &[
            "install",
            "-d",
            "-m",
            "0755",
            "-o",
            "spark",
            "-g",
            "spark",
            "/var/lib/enverge-agent",
        ],
    )?;
    // A pair's serving reaches its satellites as spark (the workers, L3): its own copy of
    // node0's peer key, and each satellite's host key pinned, in its state directory.
    if !serving.pair.is_empty() {
        let key = host
            .read(&format!("/etc/enverge/{}", crate::machines::PEER_KEY))?
            .ok_or("a pair's preparation made no peer key")?;
        let state = std::path::Path::new(crate::machines::SERVING_STATE);
        host.write(
            &state
                .join(crate::machines::SERVING_PEER_KEY)
                .to_string_lossy(),
            &key,
            0o600,
            "spark:spark",
        )?;
        for n in serving.pair.iter().filter(|n| n.index > 0) {
            let (Some(addr), Some(key)) = (&n.mgmt_addr, &n.host_key) else {
                continue;
            };
            host.write(
                &state
                    .join(crate::machines::known_hosts_file(n.index))
                    .to_string_lossy(),
                crate::machines::known_hosts_line(addr, key).as_bytes(),
                0o644,
                "spark:spark",
            )?;
        }
    }
    host.write(HANDED_OVER, &bytes, 0o600, "spark:spark")
}

/// Has preparation completed here before?
pub fn handed_over<H: Host>(host: &mut H) -> Fallible<bool> {
    Ok(host.read(HANDED_OVER)?.is_some())
}
