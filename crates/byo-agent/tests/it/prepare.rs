//! C, the prepare run, against the simulated Spark: the engine's paths (re-run, dry run,
//! killed part way, the done list's scope) and every landmine under "The 19 steps" —
//! the correct order completes; the wrong order or the missing step fails at the step
//! where the design says the failure surfaces, with an error that names the cause.

#[path = "prepare_sim_spark/mod.rs"]
mod sim_spark;

use std::rc::Rc;
use std::sync::{Arc, Mutex};

use byo_agent::host::{Host, LxdBody};
use byo_agent::prepare::peers::{Peer, Satellites};
use byo_agent::prepare::{self, Plan, STEP_NAMES};
use byo_core::prepare::{Mode, Outcome, Progress, Step};
use byo_wire::enroll::WireGuardConfig;
use byo_wire::prepare::StepState;
use byo_wire::profile::ProfilePlan;
use sim_spark::{SimSpark, State, dgx_os};

const BUILD: &str = "byo-agent 1.0 (test)";
const KEYS: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOperatorKeyForTestsOnly expiry-time=\"20270101\" byo-operator:op1:laptop\n";

fn gb10_spark_1() -> ProfilePlan {
    serde_json::from_value(serde_json::json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "cuda_repo_arch": "sbsa", "node_count": 1, "rails": []
    }))
    .unwrap()
}

fn plan() -> Plan {
    Plan {
        profile: gb10_spark_1(),
        authorized_keys: Some(KEYS.into()),
        wireguard: Some(WireGuardConfig {
            private_key: "cHJpdmF0ZS1rZXktZm9yLXRlc3RzLW9ubHktMDAwMDA=".into(),
            address: "10.8.0.2/24".into(),
            peer_public_key: "cmVsYXktcHVibGljLWtleS1mb3ItdGVzdHMtMDAwMDA=".into(),
            endpoint: Some("203.0.113.7:51820".into()),
            allowed_ips: "10.8.0.1/32".into(),
        }),
        tunnel_token: None,
        cloudflared: None,
        lockout_owner: true,
        owner: None,
        node: 0,
        peers: Vec::new(),
        satellites: None,
        peer_public_key: None,
    }
}

fn at() -> chrono::DateTime<chrono::Utc> {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn run(sim: &mut SimSpark, plan: &Plan, mode: Mode) -> (Outcome, Vec<Progress>) {
    run_build(sim, plan, mode, BUILD)
}

fn run_build(sim: &mut SimSpark, plan: &Plan, mode: Mode, build: &str) -> (Outcome, Vec<Progress>) {
    let mut events = Vec::new();
    let out = prepare::run(sim, plan, 0, build, mode, at, |p| events.push(p));
    (out, events)
}

/// Run a chosen list of the real steps (a wrong order, or one left out).
fn run_steps(sim: &mut SimSpark, plan: &Plan, names: &[&str]) -> Outcome {
    let all = prepare::steps::<SimSpark>(plan);
    let chosen: Vec<&dyn Step<SimSpark>> = names
        .iter()
        .map(|n| all.iter().find(|s| s.name() == *n).unwrap().as_ref())
        .collect();
    byo_core::prepare::run(&chosen, sim, 0, BUILD, None, Mode::Run, at, |_| {})
}

fn without(step: &str) -> Vec<&'static str> {
    STEP_NAMES.iter().copied().filter(|s| *s != step).collect()
}

fn moved_after(step: &str, after: &str) -> Vec<&'static str> {
    let mut names = without(step);
    let i = names.iter().position(|s| *s == after).unwrap();
    let moved = STEP_NAMES.iter().copied().find(|s| *s == step).unwrap();
    names.insert(i + 1, moved);
    names
}

fn prepared() -> SimSpark {
    let mut sim = SimSpark::new(dgx_os());
    let (out, _) = run(&mut sim, &plan(), Mode::Run);
    assert!(out.completed, "{:?}", out.failed);
    sim
}

fn failed_at(out: &Outcome, step: &str, cause: &str) {
    let (name, error) = out
        .failed
        .clone()
        .unwrap_or_else(|| panic!("expected {step} to fail"));
    assert_eq!(name, step, "failed at {name}: {error}");
    assert!(
        error.contains(cause),
        "{step}'s error does not name {cause:?}: {error}"
    );
    assert!(!out.completed);
}

fn owner_untouched(sim: &SimSpark) {
    let owner = &sim.state.users["owner"];
    assert!(
        !owner.locked && owner.groups.contains("sudo"),
        "owner-lockout ran after a failure"
    );
    assert!(
        !sim.state
            .files
            .contains_key("/etc/ssh/sshd_config.d/00-enverge-lockout.conf")
    );
}

// --- the run --------------------------------------------------------------------------------

#[test]
fn c_the_correct_order_prepares_a_dgx_os_spark() {
    let mut sim = SimSpark::new(dgx_os());
    let (out, events) = run(&mut sim, &plan(), Mode::Run);
    assert!(out.completed, "{:?}", out.failed);
    let s = &sim.state;
    // operator-access: spark, NOPASSWD sudo, the operator keys.
    // lxd-install: serving reaches LXD through root's gate, never as a member of lxd (#36).
    assert!(!s.users["spark"].groups.contains("lxd"));
    assert_eq!(
        s.files["/etc/sudoers.d/enverge-spark"],
        b"spark ALL=(ALL) NOPASSWD:ALL\n"
    );
    assert_eq!(s.files["/home/spark/.ssh/authorized_keys"], KEYS.as_bytes());
    // docker-purge, swap-off, earlyoom, zfs-arc-cap (binding, since it ran before LXD).
    assert!(!s.packages.contains("docker.io") && !s.links.contains("docker0"));
    assert_eq!(s.forward_policy, "ACCEPT");
    assert!(s.swap.is_empty());
    assert!(String::from_utf8_lossy(&s.files["/etc/fstab"]).contains("# disabled by enverge"));
    assert!(s.active.contains("earlyoom.service"));
    assert_eq!(s.zfs_loaded, Some(8 << 30));
    // LXD as the lifecycle needs it, with no lxd init.
    let lxd = s.lxd.as_ref().unwrap();
    assert_eq!(lxd.pools["default"], "zfs");
    assert_eq!(lxd.networks["lxdbr0"]["config"]["ipv4.nat"], "true");
    assert!(lxd.profiles.contains_key("lofispark-base"));
    assert!(lxd.aliases.contains_key("lofispark-base"));
    assert!(
        lxd.instances.is_empty(),
        "the build instance is left behind"
    );
    // firewall in the file, relay-peer up, the owner locked out last.
    assert!(
        String::from_utf8_lossy(&s.files["/etc/default/ufw"])
            .contains("DEFAULT_FORWARD_POLICY=\"ACCEPT\"")
    );
    assert!(s.active.contains("wg-quick@wg0.service"));
    assert_eq!(
        s.wg_peer.as_deref(),
        Some("cmVsYXktcHVibGljLWtleS1mb3ItdGVzdHMtMDAwMDA=")
    );
    assert!(s.users["owner"].locked && !s.users["owner"].groups.contains("sudo"));
    assert!(!s.unreachable);
    // Progress after every step, in prepare_state's shape, the last one final.
    let finished: Vec<&str> = events
        .iter()
        .filter(|e| {
            matches!(
                e.state.state,
                StepState::Applied | StepState::Satisfied | StepState::Skipped
            )
        })
        .map(|e| e.state.step.as_str())
        .collect();
    assert_eq!(finished, STEP_NAMES);
    assert!(events.last().unwrap().state.is_final);
    assert!(events.iter().all(|e| e.node == 0 && e.state.at == at()));
    let skipped: Vec<&str> = events
        .iter()
        .filter(|e| e.state.state == StepState::Skipped)
        .map(|e| e.state.step.as_str())
        .collect();
    assert_eq!(
        skipped,
        ["peer-access", "satellites", "rail-network", "rail-verify"]
    );
}

#[test]
fn c_a_rerun_on_a_prepared_host_applies_nothing() {
    let mut sim = prepared();
    let before = sim.state.clone();
    let changes = sim.changes;
    // A newer build trusts no done list, so every check runs again: and none applies.
    let (out, events) = run_build(&mut sim, &plan(), Mode::Run, "byo-agent 1.1");
    assert!(out.completed, "{:?}", out.failed);
    assert!(
        out.changes.is_empty(),
        "a prepared host was changed: {:?}",
        out.changes
    );
    assert!(events.iter().all(|e| e.state.state != StepState::Applying));
    assert!(
        sim.state.settled() == before.settled(),
        "{}",
        sim.state.diff(&before)
    );
    // The only write is the done list itself.
    assert_eq!(
        sim.changes - changes,
        events
            .iter()
            .filter(|e| e.state.state != StepState::Applying)
            .count()
    );
}

#[test]
fn c_a_dry_run_changes_nothing_and_says_what_it_would() {
    let mut sim = SimSpark::new(dgx_os());
    let before = sim.state.clone();
    let (out, events) = run(&mut sim, &plan(), Mode::DryRun);
    assert!(sim.state == before, "{}", sim.state.diff(&before));
    assert_eq!(sim.changes, 0);
    assert!(!out.completed);
    let would: Vec<&str> = out.changes.iter().map(|(s, _)| s.as_str()).collect();
    for step in [
        "operator-access",
        "docker-purge",
        "swap-off",
        "zfs-arc-cap",
        "lxd-install",
        "firewall",
        "owner-lockout",
    ] {
        assert!(would.contains(&step), "{step} missing from {would:?}");
    }
    assert!(events.iter().any(|e| {
        e.state
            .error
            .as_deref()
            .is_some_and(|m| m.starts_with("would change: purge docker.io"))
    }));
}

#[test]
fn c_the_done_list_is_scoped_to_the_build_that_wrote_it() {
    let mut sim = prepared();
    let spawned = sim.spawned;
    let (out, events) = run(&mut sim, &plan(), Mode::Run);
    assert!(out.completed);
    assert_eq!(
        sim.spawned, spawned,
        "the same build re-checked steps it had recorded"
    );
    assert!(events.iter().all(|e| e.state.attempt == 0));
    let (_, events) = run_build(&mut sim, &plan(), Mode::Run, "byo-agent 2.0");
    assert!(sim.spawned > spawned);
    let checked: Vec<&str> = events
        .iter()
        .filter(|e| e.state.attempt == 1)
        .map(|e| e.state.step.as_str())
        .collect();
    assert_eq!(
        checked.len(),
        STEP_NAMES.len() - 4,
        "a newer binary re-checks every step: {checked:?}"
    );
}

/// Host configuration after go-live, 4: the deliberate run re-checks every step even on the
/// build that wrote the done list (a name says nothing about what a step now does), and on
/// a prepared host it changes nothing.
#[test]
fn l_the_deliberate_run_checks_every_step_whatever_the_done_list_says() {
    let mut sim = prepared();
    let (spawned, changes) = (sim.spawned, sim.changes);
    let mut events = Vec::new();
    let out = prepare::run_trusting(&mut sim, &plan(), 0, BUILD, Mode::Run, false, at, |p| {
        events.push(p)
    });
    assert!(out.completed && out.changes.is_empty(), "{out:?}");
    assert!(sim.spawned > spawned, "nothing was checked");
    // Nothing applied: the only writes are the done list's, one after each step.
    assert_eq!(
        sim.changes - changes,
        STEP_NAMES.len(),
        "a prepared host was changed"
    );
    let checked: Vec<&str> = events
        .iter()
        .filter(|e| e.state.attempt == 1)
        .map(|e| e.state.step.as_str())
        .collect();
    let skipped = events
        .iter()
        .filter(|e| e.state.state == StepState::Skipped)
        .count();
    assert_eq!(
        checked.len() + skipped,
        STEP_NAMES.len(),
        "every step checked or skipped: {checked:?}"
    );
    assert!(
        events
            .iter()
            .all(|e| e.state.attempt == 1 || e.state.state == StepState::Skipped),
        "a step was taken from the done list"
    );
}

/// The deliberate run on a host that never completed preparation is refused (exit 4), with
/// the reason, before anything is read or written: no lock file, no report, no done list.
#[test]
fn l_prepare_again_is_refused_on_a_host_that_has_not_completed_preparation() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("etc/enverge")).unwrap();
    std::fs::create_dir_all(root.path().join("var/lib/enverge-agent")).unwrap();
    // A backend nobody listens on: a report attempt would be said in the output.
    std::fs::write(
        root.path().join("etc/enverge/server"),
        "http://127.0.0.1:9\n",
    )
    .unwrap();
    let listing = || {
        let mut all: Vec<String> = walk(root.path());
        all.sort();
        all
    };
    let before = listing();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_byo-agent"))
        .args(["prepare", "--again", "--root"])
        .arg(root.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{said}");
    assert!(
        said.contains("this host has not completed preparation")
            && said.contains("Nothing was changed"),
        "{said}"
    );
    assert_eq!(listing(), before, "a refused run changed the host");
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.push(format!("{}/", p.display()));
            out.extend(walk(&p));
        } else {
            out.push(format!("{} {:?}", p.display(), std::fs::read(&p).unwrap()));
        }
    }
    out
}

#[test]
fn c_killed_after_any_change_then_run_again_converges_to_the_same_prepared_host() {
    let reference = prepared();
    let total = reference.changes;
    assert!(total > 40, "{total}");
    for k in 0..total {
        let mut sim = SimSpark::new(dgx_os());
        sim.kill_after = Some(k);
        let (killed, events) = run(&mut sim, &plan(), Mode::Run);
        assert!(!killed.completed, "kill at {k}");
        let failed = events
            .iter()
            .position(|e| e.state.state == StepState::Failed)
            .unwrap();
        // owner-lockout is reached only if nothing before it failed.
        let order = |step: &str| STEP_NAMES.iter().position(|s| *s == step).unwrap();
        let reached = events.iter().any(|e| e.state.step == "owner-lockout");
        assert!(
            !reached || order(&events[failed].state.step) >= order("owner-lockout"),
            "owner-lockout was reached after a failure (kill at {k})"
        );
        sim.kill_after = None;
        let (again, _) = run(&mut sim, &plan(), Mode::Run);
        assert!(again.completed, "kill at {k}: {:?}", again.failed);
        assert!(
            sim.state.settled() == reference.state.settled(),
            "kill at {k} converged elsewhere:\n{}",
            sim.state.diff(&reference.state)
        );
    }
}

/// Uninstall's steps named, run on the simulated Spark: (step, state, what it said).
fn uninstall_steps(
    sim: &mut SimSpark,
    plan: &byo_agent::uninstall::Plan,
    names: &[&str],
) -> Vec<(String, StepState, String)> {
    let all = byo_agent::uninstall::steps(plan);
    let chosen: Vec<&dyn Step<SimSpark>> = names
        .iter()
        .map(|n| {
            all.iter()
                .find(|s| Step::<SimSpark>::name(*s) == *n)
                .unwrap() as &dyn Step<SimSpark>
        })
        .collect();
    let mut said = Vec::new();
    let out = byo_core::prepare::run(&chosen, sim, 0, "uninstall", None, Mode::Run, at, |p| {
        said.push(p)
    });
    assert!(out.completed, "{:?}", out.failed);
    said.into_iter()
        .filter(|p| p.state.state != StepState::Applying)
        .map(|p| {
            (
                p.state.step.clone(),
                p.state.state,
                p.state.error.unwrap_or_default(),
            )
        })
        .collect()
}

/// H.4 and issue #39 (4): what preparation changed that was the owner's is recorded when it is
/// changed, and uninstall gives it back — ufw's forward policy in the file and, reloaded, in
/// the kernel; the swap swap-off turned off, on again; Docker offered with the command that
/// brings it back, and brought back when asked.
#[test]
fn h4_uninstall_gives_back_the_forward_policy_swap_and_docker_preparation_took() {
    use byo_agent::uninstall::Plan as Leave;
    let mut sim = prepared();
    let text = |sim: &SimSpark, p: &str| {
        String::from_utf8_lossy(
            sim.state
                .files
                .get(p)
                .map(Vec::as_slice)
                .unwrap_or_default(),
        )
        .into_owned()
    };
    // Recorded when it was changed, before the change.
    assert_eq!(text(&sim, "/etc/enverge/ufw-forward-policy"), "DROP\n");
    assert_eq!(text(&sim, "/etc/enverge/swap-was-on"), "/swap.img\n");
    assert_eq!(text(&sim, "/etc/enverge/docker-removed"), "docker.io\n");
    assert!(text(&sim, "/etc/default/ufw").contains("DEFAULT_FORWARD_POLICY=\"ACCEPT\""));
    assert!(sim.state.swap.is_empty() && !sim.state.packages.contains("docker.io"));
    // A run again records nothing new: the first run's word on the owner's state stays.
    let (out, _) = run(&mut sim, &plan(), Mode::Run);
    assert!(out.completed);
    assert_eq!(text(&sim, "/etc/enverge/ufw-forward-policy"), "DROP\n");

    // A pair's node0 also holds rail-network's files and addresses: they go with it. The
    // netplan file is the one rail-network renders for a pair's node0.
    let mut pair = plan();
    pair.profile = serde_json::from_value(serde_json::json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "cuda_repo_arch": "sbsa", "node_count": 2,
        "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000}]
    }))
    .unwrap();
    let netplan = prepare::peers::render_rails(&pair, 0, &[("enP2p1s0f0np0".into(), 0)]).unwrap();
    for (path, text) in [
        ("/etc/netplan/60-enverge-rails.yaml", netplan.as_str()),
        (
            "/etc/sysctl.d/60-enverge-rails.conf",
            "net.ipv4.conf.all.arp_ignore = 1\n",
        ),
        (
            "/etc/sysctl.d/60-enverge-ping.conf",
            "net.ipv4.ping_group_range = 0 2147483647\n",
        ),
    ] {
        sim.state
            .files
            .insert(path.into(), text.as_bytes().to_vec());
    }
    sim.state
        .addresses
        .push(("enP2p1s0f0np0".into(), "192.168.100.10/24".into()));
    sim.state.lxd.as_mut().unwrap().profiles.insert(
        "lofispark-dual".into(),
        serde_json::json!({"name": "lofispark-dual"}),
    );
    let steps = ["lxd-profile", "tenant-firewall", "host-settings", "docker"];
    let said = uninstall_steps(&mut sim, &Leave::default(), &steps);
    let profiles = &sim.state.lxd.as_ref().unwrap().profiles;
    assert!(
        !profiles.contains_key("lofispark-dual") && !profiles.contains_key("lofispark-base"),
        "{:?}",
        profiles.keys()
    );
    for gone in [
        "/etc/netplan/60-enverge-rails.yaml",
        "/etc/sysctl.d/60-enverge-rails.conf",
        "/etc/sysctl.d/60-enverge-ping.conf",
    ] {
        assert!(!sim.state.files.contains_key(gone), "{gone} stays");
    }
    assert!(
        !sim.state
            .addresses
            .iter()
            .any(|(i, _)| i == "enP2p1s0f0np0"),
        "the rail keeps its address: {:?}",
        sim.state.addresses
    );
    // The owner's file as DGX OS shipped it, every line.
    let shipped = String::from_utf8(dgx_os().files["/etc/default/ufw"].clone()).unwrap();
    assert_eq!(text(&sim, "/etc/default/ufw"), shipped);
    assert_eq!(
        sim.state.forward_policy, "DROP",
        "ufw reloaded the owner's policy"
    );
    assert_eq!(sim.state.swap, vec!["/swap.img".to_owned()]);
    assert!(text(&sim, "/etc/fstab").contains("\n/swap.img none swap sw 0 0\n"));
    let docker = said.iter().find(|(s, ..)| s == "docker").unwrap();
    assert_eq!(docker.1, StepState::Skipped, "{said:?}");
    assert!(
        docker.2.contains("preparation removed Docker (docker.io)")
            && docker.2.contains("--restore-docker")
            && docker.2.contains("sudo apt-get install docker.io"),
        "{}",
        docker.2
    );
    assert!(
        !sim.state.packages.contains("docker.io"),
        "not put back unasked"
    );

    // Asked, Docker comes back; then every step has nothing to do.
    let asked = Leave {
        restore_docker: true,
        ..Leave::default()
    };
    uninstall_steps(&mut sim, &asked, &["docker"]);
    assert!(sim.state.packages.contains("docker.io"));
    let again = uninstall_steps(&mut sim, &asked, &steps);
    assert!(
        again.iter().all(|(_, st, _)| *st == StepState::Satisfied),
        "{again:?}"
    );

    // A policy the owner changed after preparation is theirs: it stays.
    let mut sim = prepared();
    let ufw = text(&sim, "/etc/default/ufw")
        .replace("FORWARD_POLICY=\"ACCEPT\"", "FORWARD_POLICY=\"REJECT\"");
    sim.state
        .files
        .insert("/etc/default/ufw".into(), ufw.into_bytes());
    uninstall_steps(&mut sim, &Leave::default(), &["tenant-firewall"]);
    assert!(text(&sim, "/etc/default/ufw").contains("DEFAULT_FORWARD_POLICY=\"REJECT\""));
}

#[test]
fn c_a_prepared_host_survives_a_reboot_and_stays_prepared() {
    let mut sim = prepared();
    sim.reboot();
    let (out, _) = run_build(&mut sim, &plan(), Mode::DryRun, "byo-agent 2.0");
    assert!(out.changes.is_empty(), "a reboot undid {:?}", out.changes);
    assert!(sim.state.swap.is_empty());
    assert_eq!(sim.state.forward_policy, "ACCEPT");
}

// --- skips -----------------------------------------------------------------------------------

#[test]
fn c_watchdog_is_skipped_with_its_reason_on_a_board_without_one() {
    let mut state = dgx_os();
    state.watchdog = false;
    let mut sim = SimSpark::new(state);
    let (out, events) = run(&mut sim, &plan(), Mode::Run);
    assert!(out.completed);
    let w = events.iter().find(|e| e.state.step == "watchdog").unwrap();
    assert_eq!(w.state.state, StepState::Skipped);
    assert!(
        w.state
            .error
            .as_deref()
            .unwrap()
            .contains("/dev/watchdog is absent")
    );
    assert!(
        !sim.state
            .files
            .contains_key("/etc/systemd/system.conf.d/enverge-watchdog.conf")
    );
}

#[test]
fn c_owner_lockout_is_skipped_while_lockout_owner_is_false() {
    let mut sim = SimSpark::new(dgx_os());
    let (out, events) = run(
        &mut sim,
        &Plan {
            lockout_owner: false,
            ..plan()
        },
        Mode::Run,
    );
    assert!(out.completed);
    let e = events
        .iter()
        .find(|e| e.state.step == "owner-lockout")
        .unwrap();
    assert_eq!(e.state.state, StepState::Skipped);
    owner_untouched(&sim);
}

// --- refusals --------------------------------------------------------------------------------

#[test]
fn c_operator_access_refuses_a_host_with_no_operator_keys_and_nothing_after_it_runs() {
    let mut sim = SimSpark::new(dgx_os());
    let before = sim.state.clone();
    let (out, events) = run(
        &mut sim,
        &Plan {
            authorized_keys: None,
            ..plan()
        },
        Mode::Run,
    );
    failed_at(&out, "operator-access", "no operator-key list");
    assert_eq!(events.len(), 1);
    assert_eq!(sim.state, before);
}

#[test]
fn c_owner_lockout_refuses_while_operator_access_is_not_verified() {
    let mut sim = prepared();
    // spark's sudo taken away after operator-access completed.
    sim.state.files.remove("/etc/sudoers.d/enverge-spark");
    sim.state.users.get_mut("owner").unwrap().locked = false;
    sim.state
        .users
        .get_mut("owner")
        .unwrap()
        .groups
        .insert("sudo".into());
    sim.state
        .files
        .remove("/etc/ssh/sshd_config.d/00-enverge-lockout.conf");
    let out = run_steps(&mut sim, &plan(), &["owner-lockout"]);
    failed_at(&out, "owner-lockout", "operator access is not verified");
    owner_untouched(&sim);
}

// --- the landmines ---------------------------------------------------------------------------

#[test]
fn landmine_docker_purge_before_base_image() {
    // A host without ufw, so nothing else resets Docker's FORWARD DROP.
    let no_ufw = || State {
        ufw_active: false,
        ..dgx_os()
    };
    let mut sim = SimSpark::new(no_ufw());
    let out = run_steps(&mut sim, &plan(), &without("docker-purge"));
    failed_at(
        &out,
        "base-image",
        "docker-purge must run before base-image",
    );
    owner_untouched(&sim);
    let mut sim = SimSpark::new(no_ufw());
    let out = run_steps(
        &mut sim,
        &plan(),
        &moved_after("docker-purge", "base-image"),
    );
    failed_at(&out, "base-image", "FORWARD policy is DROP");
    let mut sim = SimSpark::new(no_ufw());
    assert!(run_steps(&mut sim, &plan(), STEP_NAMES).completed);
}

#[test]
fn landmine_zfs_arc_cap_before_lxd_install() {
    let mut sim = SimSpark::new(dgx_os());
    let out = run_steps(
        &mut sim,
        &plan(),
        &moved_after("zfs-arc-cap", "lxd-install"),
    );
    failed_at(&out, "zfs-arc-cap", "modprobe.d binds at module load");
    assert_eq!(sim.state.zfs_loaded, Some(sim_spark::ZFS_DEFAULT_ARC));
    owner_untouched(&sim);
}

#[test]
fn landmine_swap_off_arms_earlyoom() {
    let mut sim = SimSpark::new(dgx_os());
    let out = run_steps(&mut sim, &plan(), &without("swap-off"));
    failed_at(&out, "earlyoom", "swap is on (/swap.img)");
    assert!(!sim.state.packages.contains("earlyoom"));
    owner_untouched(&sim);
}

#[test]
fn landmine_lxd_network_before_profiles() {
    let without_both = |a: &str, b: &str| -> Vec<&'static str> {
        without(a).into_iter().filter(|s| *s != b).collect()
    };
    for (names, at, cause) in [
        // The tenant firewall lets DHCP and DNS through to the bridge's address only: the
        // first step that needs the bridge names it.
        (
            without("lxd-network"),
            "firewall",
            "lxd-network must run before firewall",
        ),
        (
            moved_after("lxd-network", "profiles"),
            "firewall",
            "lxd-network must run before firewall",
        ),
        (
            without_both("lxd-network", "firewall"),
            "profiles",
            "lxd-network must run before profiles",
        ),
    ] {
        let mut sim = SimSpark::new(dgx_os());
        let out = run_steps(&mut sim, &plan(), &names);
        // LXD is up with a healthy pool; the omission surfaces where the bridge is needed.
        failed_at(&out, at, cause);
        let lxd = sim.state.lxd.as_ref().unwrap();
        assert_eq!(lxd.pools["default"], "zfs");
        assert!(lxd.profiles.is_empty());
        owner_untouched(&sim);
    }
}

#[test]
fn landmine_firewall_before_base_image() {
    // DGX OS's default-deny ufw: the build dies resolving the archive, which names nothing.
    let mut sim = SimSpark::new(dgx_os());
    let out = run_steps(&mut sim, &plan(), &without("firewall"));
    failed_at(&out, "base-image", "firewall must run before base-image");
    let mut sim = SimSpark::new(dgx_os());
    let out = run_steps(&mut sim, &plan(), &moved_after("firewall", "base-image"));
    failed_at(
        &out,
        "base-image",
        "ufw is active with a default-deny policy",
    );
    owner_untouched(&sim);
}

#[test]
fn landmine_firewall_changes_the_file_because_iptables_p_lasts_until_the_next_reload() {
    let mut sim = prepared();
    // Any later reload (a package, an operator) reapplies the file: still ACCEPT.
    let _ = byo_agent::host::must(&mut sim, &["ufw", "reload"]).unwrap();
    assert_eq!(sim.state.forward_policy, "ACCEPT");
    assert!(sim.egress().is_ok());
    // Whereas docker-purge's iptables -P alone is undone by the next reload.
    let mut sim = SimSpark::new(dgx_os());
    run_steps(&mut sim, &plan(), &["docker-purge"]);
    assert_eq!(sim.state.forward_policy, "ACCEPT");
    let _ = byo_agent::host::must(&mut sim, &["ufw", "reload"]).unwrap();
    assert_eq!(sim.state.forward_policy, "DROP");
}

#[test]
fn the_tenant_firewall_is_a_table_of_our_own_that_ufw_reloads_and_reboots_keep() {
    use byo_core::render::nft::tenants::{OWNER_NETS4, OWNER_NETS6, TUNNEL};
    let mut sim = prepared();
    let table = sim
        .state
        .nft
        .get("inet enverge_tenants")
        .cloned()
        .expect("preparation loaded the tenant firewall");
    // Every range of the owner's, the tunnel, and the host's own LAN as found at apply time.
    for range in OWNER_NETS4.iter().chain(OWNER_NETS6).chain([&TUNNEL]) {
        assert!(table.contains(range), "{range} is not refused:\n{table}");
    }
    assert!(table.contains("192.168.1.0/24"), "{table}");
    assert!(sim.state.packages.contains("nftables"));
    // ufw rewrites its own tables only; a reboot loads ours again from the unit.
    let _ = byo_agent::host::must(&mut sim, &["ufw", "reload"]).unwrap();
    assert_eq!(sim.state.nft.get("inet enverge_tenants"), Some(&table));
    sim.reboot();
    assert_eq!(sim.state.nft.get("inet enverge_tenants"), Some(&table));
    // A table gone (a `flush ruleset`): the check names it and a run puts it back.
    sim.state.nft.clear();
    let (out, _) = run_build(&mut sim, &plan(), Mode::DryRun, "byo-agent 2.0");
    assert!(
        out.changes
            .iter()
            .any(|(step, what)| step == "firewall" && what.contains("load inet enverge_tenants")),
        "{:?}",
        out.changes
    );
    let (out, _) = run_build(&mut sim, &plan(), Mode::Run, "byo-agent 2.0");
    assert!(out.completed, "{:?}", out.failed);
    assert_eq!(sim.state.nft.get("inet enverge_tenants"), Some(&table));
    // The host moved to another LAN: the next run refuses that one too.
    sim.state.addresses[0].1 = "198.51.100.23/24".into();
    let (out, _) = run_build(&mut sim, &plan(), Mode::Run, "byo-agent 3.0");
    assert!(out.completed, "{:?}", out.failed);
    assert!(sim.state.nft["inet enverge_tenants"].contains("198.51.100.0/24"));
}

/// Issue #36: a bridge that was there before preparation (an owner's `lxd init`) with IPv6
/// on and dnsmasq forwarding to the host's resolver is named by the check and put right by a
/// run: no IPv6, public resolvers only. The step's own bridge is made that way.
#[test]
fn a36_the_bridge_has_no_ipv6_and_asks_public_resolvers_only() {
    let config =
        |sim: &SimSpark| sim.state.lxd.as_ref().unwrap().networks["lxdbr0"]["config"].clone();
    let want_dns = "no-resolv\nserver=1.1.1.1\nserver=9.9.9.9\n";
    let made = config(&prepared());
    assert_eq!(made["ipv6.address"], "none", "{made}");
    assert_eq!(made["raw.dnsmasq"], want_dns, "{made}");
    // As `lxd init` leaves it.
    let mut sim = prepared();
    {
        let n = &mut sim
            .state
            .lxd
            .as_mut()
            .unwrap()
            .networks
            .get_mut("lxdbr0")
            .unwrap()["config"];
        n["ipv6.address"] = serde_json::json!("fd42:4242:4242:1010::1/64");
        n["ipv6.nat"] = serde_json::json!("true");
        n.as_object_mut().unwrap().remove("raw.dnsmasq");
    }
    let before = config(&sim);
    let (out, _) = run_build(&mut sim, &plan(), Mode::DryRun, "byo-agent 2.0");
    let said: Vec<&String> = out
        .changes
        .iter()
        .filter(|(step, _)| step == "lxd-network")
        .map(|(_, what)| what)
        .collect();
    assert!(
        said.iter().any(|w| w.contains("turn off IPv6 on lxdbr0"))
            && said.iter().any(|w| w.contains("public resolvers")),
        "{:?}",
        out.changes
    );
    assert_eq!(config(&sim), before, "a dry run changed the bridge");
    let (out, _) = run_build(&mut sim, &plan(), Mode::Run, "byo-agent 2.0");
    assert!(out.completed, "{:?}", out.failed);
    let after = config(&sim);
    assert_eq!(after["ipv6.address"], "none", "{after}");
    assert_eq!(after["raw.dnsmasq"], want_dns, "{after}");
    assert_eq!(
        after["ipv4.address"], before["ipv4.address"],
        "the bridge kept its address"
    );
}

#[test]
fn landmine_storage_pool_is_created_explicitly_never_a_dir_pool() {
    let mut state = dgx_os();
    // Someone ran `lxd init` with the defaults before the agent arrived.
    state.packages.insert("lxd".into());
    let mut lxd = sim_spark::Lxd::default();
    lxd.pools.insert("default".into(), "dir".into());
    state.lxd = Some(lxd);
    state.zfs_loaded = None;
    let mut sim = SimSpark::new(state);
    let (out, _) = run(&mut sim, &plan(), Mode::Run);
    failed_at(&out, "storage-pool", "~69 s");
    assert_eq!(sim.state.lxd.as_ref().unwrap().pools["default"], "dir");
    owner_untouched(&sim);
}

#[test]
fn landmine_base_image_ends_with_the_alias() {
    let mut sim = prepared();
    // An image without its alias fails every create...
    sim.state.lxd.as_mut().unwrap().aliases.clear();
    let reply = byo_agent::lxd::json_call(
        &mut sim,
        "POST",
        "/1.0/instances",
        &serde_json::json!({"name": "c1", "source": {"type": "image", "alias": "lofispark-base"}, "profiles": ["lofispark-base"]}),
    );
    assert!(
        reply
            .unwrap_err()
            .contains("Image \"lofispark-base\" not found")
    );
    // ...the host's self-check names it, and base-image's check finds the image to alias.
    let out = run_steps(&mut sim, &plan(), &["self-check"]);
    failed_at(&out, "self-check", "image alias");
    let out = run_steps(&mut sim, &plan(), &["base-image"]);
    assert!(out.completed);
    assert_eq!(out.changes[0].1.split(' ').next(), Some("give"));
    assert!(
        sim.state
            .lxd
            .as_ref()
            .unwrap()
            .aliases
            .contains_key("lofispark-base")
    );
}

#[test]
fn landmine_relay_peer_checks_for_a_subnet_collision_first() {
    let mut state = dgx_os();
    state.addresses = vec![("enP7s7".into(), "10.8.0.57/24".into())];
    let mut sim = SimSpark::new(state);
    let (out, _) = run(&mut sim, &plan(), Mode::Run);
    failed_at(
        &out,
        "relay-peer",
        "10.8.0.0/24, the relay tunnel's range, is already in use on enP7s7",
    );
    assert!(!sim.state.unreachable, "wg0 came up over the LAN");
    assert!(!sim.state.files.contains_key("/etc/wireguard/wg0.conf"));
    owner_untouched(&sim);
}

/// A host that redeemed before its relay had an address holds a WireGuard config with no
/// endpoint: relay-peer fails (so the unit runs preparation again) rather than bring up a
/// tunnel that can never reach the relay, and nothing after it runs. Once preparation has
/// learnt the endpoint (kept in the credentials, so in the plan), the next attempt writes
/// it into wg0.conf — kept there across reboots — brings wg0 up and goes on to the end.
#[test]
fn relay_peer_waits_for_the_relays_endpoint_then_brings_the_tunnel_up() {
    let mut early = plan();
    early.wireguard.as_mut().unwrap().endpoint = None;
    let mut sim = SimSpark::new(dgx_os());
    let (out, _) = run(&mut sim, &early, Mode::Run);
    failed_at(&out, "relay-peer", "the relay has no public address yet");
    assert!(!sim.state.files.contains_key("/etc/wireguard/wg0.conf"));
    assert!(
        sim.state.wg_peer.is_none(),
        "wg0 came up with nowhere to go"
    );
    owner_untouched(&sim);

    // The next attempt, with the endpoint learnt.
    let (out, _) = run(&mut sim, &plan(), Mode::Run);
    assert!(out.completed, "{:?}", out.failed);
    let conf = String::from_utf8_lossy(&sim.state.files["/etc/wireguard/wg0.conf"]).into_owned();
    assert!(conf.contains("Endpoint = 203.0.113.7:51820"), "{conf}");
    assert!(
        sim.state.wg_peer.is_some(),
        "wg0 is up with the relay as its peer"
    );
}

#[test]
fn landmine_operator_access_before_owner_lockout() {
    // The reverse order: owner-lockout first refuses, and the owner keeps their login.
    let mut sim = SimSpark::new(dgx_os());
    let out = run_steps(&mut sim, &plan(), &["owner-lockout", "operator-access"]);
    failed_at(&out, "owner-lockout", "operator access is not verified");
    owner_untouched(&sim);
}

// --- K: a pair, node1 prepared from node0 ------------------------------------------------

const PEER_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINode0PeerKeyForTestsOnly";

/// node1 as node0 reaches it: as spark only once it admits node0's peer key, or through
/// the login the owner lent while node0 still has it.
struct SimSatellites {
    node1: Arc<Mutex<SimSpark>>,
    lent: Arc<Mutex<bool>>,
    events: Mutex<Vec<Progress>>,
    rails: Mutex<Vec<byo_wire::prepare::NodeRails>>,
}

struct Handle {
    sim: Arc<Mutex<SimSpark>>,
    as_spark: bool,
}

impl Handle {
    fn admitted(&self) -> Result<(), String> {
        if !self.as_spark {
            return Ok(());
        }
        let sim = self.sim.lock().unwrap();
        let keys = sim.state.files.get("/home/spark/.ssh/authorized_keys");
        if sim.state.users.contains_key("spark")
            && keys.is_some_and(|k| String::from_utf8_lossy(k).contains(PEER_KEY))
        {
            Ok(())
        } else {
            Err("node1 (fe80::1%enp1s0f0np0) could not be reached over SSH: spark@node1: Permission denied (publickey)".into())
        }
    }
}

impl Host for Handle {
    fn run(
        &mut self,
        argv: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<byo_agent::host::Output, String> {
        self.admitted()?;
        self.sim.lock().unwrap().run(argv, stdin)
    }
    fn read(&mut self, path: &str) -> Result<Option<Vec<u8>>, String> {
        self.admitted()?;
        self.sim.lock().unwrap().read(path)
    }
    fn write(&mut self, path: &str, bytes: &[u8], mode: u32, owner: &str) -> Result<(), String> {
        self.admitted()?;
        self.sim.lock().unwrap().write(path, bytes, mode, owner)
    }
    fn remove(&mut self, path: &str) -> Result<(), String> {
        self.admitted()?;
        self.sim.lock().unwrap().remove(path)
    }
    fn lxd(
        &mut self,
        method: &str,
        path: &str,
        body: LxdBody<'_>,
    ) -> Result<byo_agent::host::LxdReply, String> {
        self.admitted()?;
        self.sim.lock().unwrap().lxd(method, path, body)
    }
    fn describe(&self) -> String {
        "node1 (simulated)".into()
    }
}

impl Satellites for SimSatellites {
    fn spark(&self, _: &Peer) -> Result<Box<dyn Host + '_>, String> {
        Ok(Box::new(Handle {
            sim: self.node1.clone(),
            as_spark: true,
        }))
    }
    fn owner_login(&self, _: &Peer) -> Result<Option<Box<dyn Host + '_>>, String> {
        Ok((*self.lent.lock().unwrap()).then(|| {
            Box::new(Handle {
                sim: self.node1.clone(),
                as_spark: false,
            }) as Box<dyn Host>
        }))
    }
    fn report(&self, p: Progress) {
        self.events.lock().unwrap().push(p);
    }
    fn rails(&self, rails: byo_wire::prepare::NodeRails) {
        self.rails.lock().unwrap().push(rails);
    }
}

struct Pair {
    node0: SimSpark,
    node1: Arc<Mutex<SimSpark>>,
    sats: Rc<SimSatellites>,
    plan: Plan,
}

fn pair(node1_state: State) -> Pair {
    let mut node0 = SimSpark::new(dgx_os());
    node0.state.files.insert(
        "/etc/enverge/peer-login".into(),
        b"owner\nhunter2\n".to_vec(),
    );
    let mut n1 = SimSpark::new(node1_state);
    n1.wire = node0.wire.clone();
    let node1 = Arc::new(Mutex::new(n1));
    let sats = Rc::new(SimSatellites {
        node1: node1.clone(),
        lent: Arc::new(Mutex::new(true)),
        events: Mutex::default(),
        rails: Mutex::default(),
    });
    let peer: Peer = serde_json::from_value(serde_json::json!({
        "addr": "fe80::1%enp1s0f0np0", "host_key": "ssh-ed25519 AAAAnode1hostkey", "peer_index": 1,
        "links": [{"index": 0, "local": "enp1s0f0np0", "remote": "enp1s0f0np0", "neighbour_addr": "fe80::1%enp1s0f0np0"},
                  {"index": 1, "local": "enP2p1s0f0np0", "remote": "enP2p1s0f1np1", "neighbour_addr": "fe80::2%enP2p1s0f0np0"}]
    }))
    .unwrap();
    let profile: ProfilePlan = serde_json::from_value(serde_json::json!({
        "gpu_model": "GB10", "gpu_count": 1, "cuda_repo_arch": "sbsa", "node_count": 2,
        "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000}, {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000}]
    }))
    .unwrap();
    let plan = Plan {
        profile,
        peers: vec![peer],
        satellites: Some(sats.clone()),
        peer_public_key: Some(PEER_KEY.into()),
        ..plan()
    };
    Pair {
        node0,
        node1,
        sats,
        plan,
    }
}

#[test]
fn k_a_pair_prepares_node1_from_node0_reported_with_index_1() {
    let mut p = pair(dgx_os());
    let (out, events) = run(&mut p.node0, &p.plan, Mode::Run);
    assert!(out.completed, "{:?}", out.failed);
    // peer-access: node1 admits spark with node0's peer key and the operators; the lent
    // login is deleted from node0.
    let n1 = p.node1.lock().unwrap();
    let keys =
        String::from_utf8_lossy(&n1.state.files["/home/spark/.ssh/authorized_keys"]).into_owned();
    assert!(keys.contains(PEER_KEY) && keys.contains("byo-operator:op1:laptop"));
    assert!(!p.node0.state.files.contains_key("/etc/enverge/peer-login"));
    // node1's own subset, in order, with index 1: every landmine ordering holds there too.
    let sat = p.sats.events.lock().unwrap();
    let finished: Vec<&str> = sat
        .iter()
        .filter(|e| {
            matches!(
                e.state.state,
                StepState::Applied | StepState::Satisfied | StepState::Skipped
            )
        })
        .map(|e| e.state.step.as_str())
        .collect();
    let subset: Vec<&str> = byo_agent::prepare::peers::satellite_steps().collect();
    assert_eq!(finished, subset);
    assert!(!subset.contains(&"relay-peer") && subset.contains(&"owner-lockout"));
    assert!(sat.iter().all(|e| e.node == 1));
    assert!(!n1.state.packages.contains("docker.io") && n1.state.swap.is_empty());
    let lxd = n1.state.lxd.as_ref().unwrap();
    assert!(lxd.aliases.contains_key("lofispark-base") && lxd.pools["default"] == "zfs");
    assert!(
        n1.state.users["owner"].locked,
        "node1's lent login is locked out too"
    );
    assert!(n1.state.wg_peer.is_none(), "a satellite has no relay");
    // rail-network: the plan's addresses, .10 on node0 and .11 on node1, per cable.
    assert!(
        p.node0
            .state
            .addresses
            .contains(&("enp1s0f0np0".into(), "192.168.100.10/24".into()))
    );
    assert!(
        n1.state
            .addresses
            .contains(&("enP2p1s0f1np1".into(), "192.168.101.11/24".into()))
    );
    // 130–132: each machine's rails reported once rail-network set them, then again once
    // rail-verify proved every cable — the cabled ports with their rail and address.
    /// A port as reported: its interface, rail and address.
    type Port = (String, Option<u32>, Option<String>);
    let reported: Vec<(u32, bool, Vec<Port>)> = p
        .sats
        .rails
        .lock()
        .unwrap()
        .iter()
        .map(|r| {
            let ports = r
                .ports
                .iter()
                .map(|p| (p.iface.clone(), p.index, p.address.clone()));
            (r.node, r.verified, ports.collect())
        })
        .collect();
    let node0 = vec![
        (
            "enp1s0f0np0".to_owned(),
            Some(0),
            Some("192.168.100.10/24".to_owned()),
        ),
        (
            "enP2p1s0f0np0".to_owned(),
            Some(1),
            Some("192.168.101.10/24".to_owned()),
        ),
    ];
    let node1 = vec![
        (
            "enp1s0f0np0".to_owned(),
            Some(0),
            Some("192.168.100.11/24".to_owned()),
        ),
        (
            "enP2p1s0f1np1".to_owned(),
            Some(1),
            Some("192.168.101.11/24".to_owned()),
        ),
    ];
    assert_eq!(
        reported,
        vec![
            (0, false, node0.clone()),
            (1, false, node1.clone()),
            (0, true, node0),
            (1, true, node1)
        ]
    );
    // 133: node0's serving may ping its rails without privilege; node1 has no serving.
    let ping = "/etc/sysctl.d/60-enverge-ping.conf";
    assert!(
        String::from_utf8_lossy(&p.node0.state.files[ping])
            .contains("net.ipv4.ping_group_range = 1000 1000")
    );
    assert!(!n1.state.files.contains_key(ping));
    // node0's own track keeps its shape: the pair steps completed, self-check last.
    let node0_steps: Vec<&str> = events
        .iter()
        .filter(|e| e.state.state != StepState::Applying)
        .map(|e| e.state.step.as_str())
        .collect();
    assert_eq!(node0_steps, STEP_NAMES);
    assert!(events.iter().all(|e| e.node == 0));
}

#[test]
fn k_a_prepared_pair_run_again_changes_nothing_on_either_machine() {
    let mut p = pair(dgx_os());
    assert!(run(&mut p.node0, &p.plan, Mode::Run).0.completed);
    let before1 = p.node1.lock().unwrap().state.clone();
    let (out, _) = run_build(&mut p.node0, &p.plan, Mode::Run, "byo-agent 9");
    assert!(out.completed, "{:?}", out.failed);
    assert!(out.changes.is_empty(), "{:?}", out.changes);
    let after1 = p.node1.lock().unwrap().state.clone();
    assert!(after1 == before1, "{}", after1.diff(&before1));
}

#[test]
fn k_a_satellite_that_fails_a_step_stops_node0_before_owner_lockout() {
    let mut state = dgx_os();
    state.packages.insert("lxd".into());
    let mut lxd = sim_spark::Lxd::default();
    lxd.pools.insert("default".into(), "dir".into());
    state.lxd = Some(lxd);
    let mut p = pair(state);
    let (out, _) = run(&mut p.node0, &p.plan, Mode::Run);
    failed_at(&out, "satellites", "node1 stopped at storage-pool");
    assert!(out.failed.unwrap().1.contains("~69 s"));
    owner_untouched(&p.node0);
    let sat = p.sats.events.lock().unwrap();
    let last = sat.last().unwrap();
    assert_eq!(
        (last.node, last.state.step.as_str(), last.state.state),
        (1, "storage-pool", StepState::Failed)
    );
}

#[test]
fn k_peer_access_without_the_lent_login_says_what_to_do() {
    let mut p = pair(dgx_os());
    *p.sats.lent.lock().unwrap() = false;
    let (out, _) = run(&mut p.node0, &p.plan, Mode::Run);
    failed_at(
        &out,
        "peer-access",
        "run the one-liner again with node1's login",
    );
    assert!(!p.node1.lock().unwrap().state.users.contains_key("spark"));
}

#[test]
fn k_rail_verify_sends_traffic_across_every_cable_from_both_ends() {
    let mut p = pair(dgx_os());
    p.node0
        .wire
        .lock()
        .unwrap()
        .dead
        .insert("enP2p1s0f0np0".into());
    let (out, _) = run(&mut p.node0, &p.plan, Mode::Run);
    failed_at(
        &out,
        "rail-verify",
        "rail 1: node0 enP2p1s0f0np0 → node1 192.168.101.11",
    );
    owner_untouched(&p.node0);
}

/// L rule 5 on a pair: node1 is asked too. A running instance there holds the rails; a
/// stopped one, or the image build, does not; a node1 that cannot be asked leaves node0's
/// answer to stand.
#[test]
fn l_rule_5_asks_node1_whether_an_instance_holds_the_rails() {
    use byo_agent::prepare::again::satellites_holding;
    let mut p = pair(dgx_os());
    assert!(run(&mut p.node0, &p.plan, Mode::Run).0.completed);
    assert!(satellites_holding(&p.plan).is_empty());
    let instance = |status: &str| (status.to_owned(), String::new(), Default::default());
    {
        let mut n1 = p.node1.lock().unwrap();
        let lxd = n1.state.lxd.as_mut().unwrap();
        lxd.instances.insert("c1-w1".into(), instance("Running"));
        lxd.instances.insert("old-w1".into(), instance("Stopped"));
        lxd.instances.insert(
            byo_agent::prepare::BUILD_INSTANCE.into(),
            instance("Running"),
        );
    }
    assert_eq!(
        satellites_holding(&p.plan),
        vec!["c1-w1 on node1".to_owned()]
    );
    // node1's LXD silent (node1 down): node0's answer is enough.
    p.node1.lock().unwrap().state.lxd = None;
    assert!(satellites_holding(&p.plan).is_empty());
}

#[test]
fn k_node0s_self_check_asserts_node1() {
    let mut p = pair(dgx_os());
    assert!(run(&mut p.node0, &p.plan, Mode::Run).0.completed);
    let self_check = |p: &mut Pair| {
        let steps = byo_agent::prepare::steps::<SimSpark>(&p.plan);
        let step = steps.iter().find(|s| s.name() == "self-check").unwrap();
        step.check(&mut p.node0)
    };
    assert_eq!(self_check(&mut p), Ok(byo_core::prepare::Check::Satisfied));
    // node1's earlyoom dies: node0 is as it was, and its self-check names node1.
    p.node1
        .lock()
        .unwrap()
        .state
        .active
        .remove("earlyoom.service");
    assert_eq!(
        self_check(&mut p),
        Err("node1: earlyoom is not running".to_owned())
    );
}

#[test]
fn k_rail_verify_names_a_cable_end_that_does_not_carry_the_rails_mtu() {
    let mut p = pair(dgx_os());
    p.node0
        .wire
        .lock()
        .unwrap()
        .small_mtu
        .insert("enP2p1s0f1np1".into());
    let (out, _) = run(&mut p.node0, &p.plan, Mode::Run);
    failed_at(
        &out,
        "rail-verify",
        "rail 1: node1 enP2p1s0f1np1 → node0 192.168.101.10 does not carry the rail's MTU 9000 unfragmented",
    );
    // The other cable passes: only the one with a short end is named.
    let (_, why) = out.failed.unwrap();
    assert!(!why.contains("rail 0"), "{why}");
    owner_untouched(&p.node0);
}

#[test]
fn the_docs_list_exactly_the_registrys_steps_in_order() {
    let doc = include_str!("../../../../docs/prepare.md");
    let listed: Vec<&str> = doc
        .lines()
        .skip_while(|l| *l != "## The list")
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            cells.get(1)?.parse::<u32>().ok()?;
            cells.get(2)?.split('`').nth(1)
        })
        .collect();
    assert_eq!(
        listed, STEP_NAMES,
        "docs/prepare.md's table against the registry"
    );
}

#[test]
fn a_satellite_runs_every_step_but_node0s_own_in_the_same_order() {
    let subset: Vec<&str> = byo_agent::prepare::peers::satellite_steps().collect();
    let node0_only = [
        "relay-peer",
        "peer-access",
        "satellites",
        "rail-network",
        "rail-verify",
    ];
    let expected: Vec<&str> = STEP_NAMES
        .iter()
        .copied()
        .filter(|s| !node0_only.contains(s))
        .collect();
    assert_eq!(subset, expected);
}

// --- the operator tunnel's connector ------------------------------------------------------------

const CLOUDFLARED_URL: &str = "https://app.example.com/cloudflared/cloudflared-aarch64";

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(bytes))
}

/// A plan with a connector token, pinning `pinned` as the build's digest.
fn tunnel_plan(pinned: &str) -> Plan {
    Plan {
        tunnel_token: Some("connector-token-for-tests".into()),
        cloudflared: Some(byo_wire::enroll::ConnectorBuild {
            url: CLOUDFLARED_URL.into(),
            sha256: pinned.into(),
        }),
        ..plan()
    }
}

/// Neither DGX OS nor Debian ships cloudflared (`apt install cloudflared` finds nothing): the
/// build enrolment pinned is fetched from the control plane, checked and installed 0755 at
/// /usr/local/bin, and the tunnel's unit runs exactly that binary.
#[test]
fn operator_access_installs_the_pinned_cloudflared_build() {
    let build = b"\x7fELF cloudflared 2026.1 for aarch64".to_vec();
    let plan = tunnel_plan(&sha256_hex(&build));
    let mut sim = SimSpark::new(dgx_os());
    sim.served.insert(CLOUDFLARED_URL.into(), build.clone());
    let (out, _) = run(&mut sim, &plan, Mode::Run);
    assert!(out.completed, "{:?}", out.failed);
    let s = &sim.state;
    assert_eq!(s.files["/usr/local/bin/cloudflared"], build);
    assert!(!s.packages.contains("cloudflared"), "installed from apt");
    let unit = String::from_utf8_lossy(&s.files["/etc/systemd/system/enverge-tunnel.service"])
        .into_owned();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/cloudflared tunnel --no-autoupdate run --token-file /etc/enverge/tunnel-token"),
        "{unit}"
    );
    assert!(s.active.contains("enverge-tunnel.service"));
    assert!(s.enabled.contains("enverge-tunnel.service"));
    assert_eq!(
        s.files["/etc/enverge/tunnel-token"],
        b"connector-token-for-tests"
    );
    assert!(
        !s.files
            .contains_key("/var/lib/enverge-agent/cloudflared.download"),
        "the download was left behind"
    );
    // A second run finds it in place and fetches nothing.
    sim.served.clear();
    let before = sim.state.settled();
    let (again, _) = run_build(&mut sim, &plan, Mode::Run, "byo-agent 1.1 (test)");
    assert!(again.completed, "{:?}", again.failed);
    assert_eq!(sim.state.settled(), before, "{}", before.diff(&sim.state));
}

/// A build whose SHA-256 is not the one enrolment pinned is refused, naming both digests,
/// and nothing is installed: no binary, no unit, no tunnel, and nothing after the step ran.
#[test]
fn operator_access_refuses_a_cloudflared_build_with_another_digest() {
    let build = b"\x7fELF cloudflared 2026.1 for aarch64".to_vec();
    let pinned = sha256_hex(b"the build the operators pinned");
    let actual = sha256_hex(&build);
    let mut sim = SimSpark::new(dgx_os());
    sim.served.insert(CLOUDFLARED_URL.into(), build);
    let (out, _) = run(&mut sim, &tunnel_plan(&pinned), Mode::Run);
    failed_at(&out, "operator-access", &pinned);
    failed_at(&out, "operator-access", &actual);
    failed_at(&out, "operator-access", "nothing was installed");
    let s = &sim.state;
    for path in [
        "/usr/local/bin/cloudflared",
        "/var/lib/enverge-agent/cloudflared.download",
        "/etc/systemd/system/enverge-tunnel.service",
    ] {
        assert!(!s.files.contains_key(path), "{path} was left on the host");
    }
    assert!(!s.active.contains("enverge-tunnel.service"));
    owner_untouched(&sim);
}

/// With a connector token but no build pinned (a server whose release directory holds no
/// cloudflared for this arch), the step says so instead of asking apt for it.
#[test]
fn operator_access_without_a_pinned_build_says_where_it_comes_from() {
    let plan = Plan {
        cloudflared: None,
        ..tunnel_plan("")
    };
    let mut sim = SimSpark::new(dgx_os());
    let (out, _) = run(&mut sim, &plan, Mode::Run);
    failed_at(&out, "operator-access", "enrolment named no build");
    assert!(!sim.state.files.contains_key("/usr/local/bin/cloudflared"));
    owner_untouched(&sim);
}

/// A host an earlier build prepared has spark in LXD's group, which is root (#36): the
/// deliberate run of lxd-install takes it out, and says so, and only that.
#[test]
fn a36_lxd_install_takes_spark_out_of_the_lxd_group_an_earlier_build_put_it_in() {
    let mut sim = prepared();
    sim.state
        .users
        .get_mut("spark")
        .unwrap()
        .groups
        .insert("lxd".into());
    let out = run_steps(&mut sim, &plan(), &["lxd-install"]);
    assert!(out.completed, "{:?}", out.failed);
    assert!(
        out.changes.iter().any(|(step, what)| step == "lxd-install"
            && what.contains("take spark out of the lxd group")),
        "{:?}",
        out.changes
    );
    assert!(!sim.state.users["spark"].groups.contains("lxd"));
    let again = run_steps(&mut sim, &plan(), &["lxd-install"]);
    assert!(
        again.completed && again.changes.is_empty(),
        "{:?}",
        again.changes
    );
}
