//! The prepare engine's shape (C, notes 1–3), driven against a small simulated host that
//! carries three of the design's landmines: zfs-arc-cap after zfs loaded has no effect,
//! Docker's FORWARD DROP kills the image build's egress, and profiles need the bridge.

use byo_core::prepare::{Check, DoneList, Mode, Progress, Step, run};
use byo_wire::prepare::StepState;
use chrono::{DateTime, Utc};

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Host {
    docker: bool,
    zfs_loaded: bool,
    arc_file: bool,
    arc_effective: bool,
    lxd: bool,
    lxd_group: bool,
    bridge: bool,
    profile: bool,
    image: bool,
    operator_access: bool,
    owner_locked: bool,
    has_watchdog: bool,
    /// Crash inside the next apply, after its first change (a kill mid-apply).
    crash_mid_apply: bool,
}

fn spark() -> Host {
    Host {
        docker: true,
        ..Default::default()
    }
}

struct S {
    name: &'static str,
    check: fn(&Host) -> Check,
    apply: fn(&mut Host) -> Result<(), String>,
    skip: fn(&Host) -> Option<String>,
}

impl Step<Host> for S {
    fn name(&self) -> &'static str {
        self.name
    }
    fn check(&self, h: &mut Host) -> Result<Check, String> {
        Ok((self.check)(h))
    }
    fn apply(&self, h: &mut Host) -> Result<(), String> {
        (self.apply)(h)
    }
    fn skip(&self, h: &mut Host) -> Option<String> {
        (self.skip)(h)
    }
}

fn never(_: &Host) -> Option<String> {
    None
}

fn needs(ok: bool, what: &str) -> Check {
    if ok {
        Check::Satisfied
    } else {
        Check::Needs(what.into())
    }
}

const OPERATOR_ACCESS: S = S {
    name: "operator-access",
    check: |h| needs(h.operator_access, "add spark with the operator keys"),
    apply: |h| {
        h.operator_access = true;
        Ok(())
    },
    skip: never,
};
const DOCKER_PURGE: S = S {
    name: "docker-purge",
    check: |h| {
        needs(
            !h.docker,
            "purge Docker (its FORWARD DROP breaks lxdbr0 NAT)",
        )
    },
    apply: |h| {
        h.docker = false;
        Ok(())
    },
    skip: never,
};
const WATCHDOG: S = S {
    name: "watchdog",
    check: |_| Check::Satisfied,
    apply: |_| Ok(()),
    skip: |h| (!h.has_watchdog).then(|| "this board has no hardware watchdog".to_owned()),
};
const ZFS_ARC_CAP: S = S {
    name: "zfs-arc-cap",
    check: |h| needs(h.arc_effective, "cap the ZFS ARC in modprobe.d"),
    apply: |h| {
        h.arc_file = true;
        // modprobe.d binds at module load: a file written after zfs loaded does nothing.
        if !h.zfs_loaded {
            h.arc_effective = true;
        }
        Ok(())
    },
    skip: never,
};
const LXD_INSTALL: S = S {
    name: "lxd-install",
    check: |h| {
        needs(
            h.lxd && h.lxd_group,
            "install LXD and add spark to the lxd group",
        )
    },
    apply: |h| {
        h.lxd = true;
        h.zfs_loaded = true; // installing LXD loads zfs even for a non-zfs pool
        if h.crash_mid_apply {
            h.crash_mid_apply = false;
            return Err("killed".into());
        }
        if h.arc_file {
            h.arc_effective = true;
        }
        h.lxd_group = true;
        Ok(())
    },
    skip: never,
};
const LXD_NETWORK: S = S {
    name: "lxd-network",
    check: |h| needs(h.bridge, "create lxdbr0"),
    apply: |h| {
        h.bridge = true;
        Ok(())
    },
    skip: never,
};
const PROFILES: S = S {
    name: "profiles",
    check: |h| needs(h.profile, "create lofispark-base"),
    apply: |h| {
        if !h.bridge {
            return Err("lofispark-base attaches eth0 to lxdbr0, and there is no lxdbr0".into());
        }
        h.profile = true;
        Ok(())
    },
    skip: never,
};
const BASE_IMAGE: S = S {
    name: "base-image",
    check: |h| needs(h.image, "build the base image and alias it"),
    apply: |h| {
        if h.docker {
            return Err(
                "the build could not resolve archive.ubuntu.com (FORWARD policy DROP, from Docker)"
                    .into(),
            );
        }
        h.image = true;
        Ok(())
    },
    skip: never,
};
const OWNER_LOCKOUT: S = S {
    name: "owner-lockout",
    check: |h| needs(h.owner_locked, "remove the owner's login"),
    apply: |h| {
        h.owner_locked = true;
        Ok(())
    },
    skip: never,
};

fn order() -> Vec<&'static dyn Step<Host>> {
    vec![
        &OPERATOR_ACCESS,
        &DOCKER_PURGE,
        &WATCHDOG,
        &ZFS_ARC_CAP,
        &LXD_INSTALL,
        &LXD_NETWORK,
        &PROFILES,
        &BASE_IMAGE,
        &OWNER_LOCKOUT,
    ]
}

fn at() -> DateTime<Utc> {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn go(
    steps: &[&dyn Step<Host>],
    host: &mut Host,
    build: &str,
    previous: Option<&DoneList>,
    mode: Mode,
) -> (byo_core::prepare::Outcome, Vec<Progress>) {
    let mut events = Vec::new();
    let out = run(steps, host, 0, build, previous, mode, at, |p| {
        events.push(p)
    });
    (out, events)
}

#[test]
fn the_designs_order_prepares_a_spark() {
    let mut h = spark();
    let (out, events) = go(&order(), &mut h, "b1", None, Mode::Run);
    assert!(out.completed && out.failed.is_none(), "{out:?}");
    assert_eq!(out.done.steps.len(), 9);
    assert!(h.arc_effective && h.image && h.owner_locked);
    // Progress after each step, in prepare_state's shape, the last one final.
    let last = events.last().unwrap();
    assert_eq!(
        (last.state.step.as_str(), last.state.is_final),
        ("owner-lockout", true)
    );
    assert!(events.iter().filter(|e| e.state.is_final).count() == 1);
    let watchdog = events.iter().find(|e| e.state.step == "watchdog").unwrap();
    assert_eq!(watchdog.state.state, StepState::Skipped);
    assert_eq!(
        watchdog.state.error.as_deref(),
        Some("this board has no hardware watchdog")
    );
    let json = serde_json::to_value(&last.state).unwrap();
    assert_eq!(json["final"], true);
    assert_eq!(json["at"], "2026-11-29T12:00:00Z");
}

#[test]
fn a_re_run_on_a_prepared_host_applies_nothing_and_a_dry_run_changes_nothing() {
    let mut h = spark();
    go(&order(), &mut h, "b1", None, Mode::Run);
    let prepared = h.clone();
    let (again, _) = go(&order(), &mut h, "b2", None, Mode::Run);
    assert!(again.completed && again.changes.is_empty(), "{again:?}");
    assert_eq!(h, prepared);

    let mut fresh = spark();
    let before = fresh.clone();
    let (dry, events) = go(&order(), &mut fresh, "b1", None, Mode::DryRun);
    assert_eq!(fresh, before, "a dry run calls only check");
    assert!(!dry.completed && dry.done.steps.is_empty());
    let would: Vec<&str> = dry.changes.iter().map(|(s, _)| s.as_str()).collect();
    assert!(would.contains(&"docker-purge") && would.contains(&"owner-lockout"));
    assert!(events.iter().all(|e| e.state.state != StepState::Applied));
}

#[test]
fn zfs_arc_cap_after_lxd_install_fails_where_the_design_says_and_names_the_cause() {
    let wrong: Vec<&dyn Step<Host>> = vec![
        &OPERATOR_ACCESS,
        &DOCKER_PURGE,
        &LXD_INSTALL,
        &ZFS_ARC_CAP,
        &OWNER_LOCKOUT,
    ];
    let mut h = spark();
    let (out, events) = go(&wrong, &mut h, "b1", None, Mode::Run);
    let (step, error) = out.failed.unwrap();
    assert_eq!(step, "zfs-arc-cap");
    assert!(
        error.contains("apply reported success but the check still fails"),
        "{error}"
    );
    assert!(error.contains("ZFS ARC"));
    assert!(!h.owner_locked, "a failed run never reaches owner-lockout");
    assert!(events.iter().all(|e| e.state.step != "owner-lockout"));
}

#[test]
fn a_missing_docker_purge_fails_at_base_image_and_a_missing_bridge_at_profiles() {
    let no_purge: Vec<&dyn Step<Host>> = vec![
        &OPERATOR_ACCESS,
        &ZFS_ARC_CAP,
        &LXD_INSTALL,
        &LXD_NETWORK,
        &PROFILES,
        &BASE_IMAGE,
        &OWNER_LOCKOUT,
    ];
    let mut h = spark();
    let (out, _) = go(&no_purge, &mut h, "b1", None, Mode::Run);
    let (step, error) = out.failed.unwrap();
    assert_eq!(step, "base-image");
    assert!(error.contains("FORWARD policy DROP"), "{error}");
    assert!(!h.owner_locked);

    let no_bridge: Vec<&dyn Step<Host>> = vec![
        &OPERATOR_ACCESS,
        &DOCKER_PURGE,
        &ZFS_ARC_CAP,
        &LXD_INSTALL,
        &PROFILES,
        &LXD_NETWORK,
        &OWNER_LOCKOUT,
    ];
    let mut h = spark();
    let (out, _) = go(&no_bridge, &mut h, "b1", None, Mode::Run);
    let (step, error) = out.failed.unwrap();
    assert_eq!(
        step, "profiles",
        "the failure surfaces at profiles, steps after the omission"
    );
    assert!(error.contains("no lxdbr0"));
}

#[test]
fn killed_after_any_step_or_mid_apply_it_converges_to_the_same_host() {
    let mut clean = spark();
    go(&order(), &mut clean, "b1", None, Mode::Run);
    for k in 0..order().len() {
        let mut h = spark();
        let (partial, _) = go(&order()[..k], &mut h, "b1", None, Mode::Run);
        let (out, _) = go(&order(), &mut h, "b1", Some(&partial.done), Mode::Run);
        assert!(out.completed, "after step {k}: {out:?}");
        assert_eq!(h, clean, "after step {k}");
    }
    let mut h = Host {
        crash_mid_apply: true,
        ..spark()
    };
    let (first, _) = go(&order(), &mut h, "b1", None, Mode::Run);
    assert_eq!(first.failed.as_ref().unwrap().0, "lxd-install");
    let (out, _) = go(&order(), &mut h, "b1", Some(&first.done), Mode::Run);
    assert!(out.completed);
    assert_eq!(
        Host {
            crash_mid_apply: false,
            ..h
        },
        clean
    );
}

#[test]
fn the_done_list_is_trusted_only_by_the_build_that_wrote_it() {
    // lxd-install gained `usermod -aG lxd` under the same name: a host an older build
    // prepared lacks the group.
    let mut h = spark();
    let (old, _) = go(&order(), &mut h, "b1", None, Mode::Run);
    h.lxd_group = false;
    let (same_build, _) = go(&order(), &mut h, "b1", Some(&old.done), Mode::Run);
    assert!(
        same_build.changes.is_empty() && !h.lxd_group,
        "b1 trusts what b1 wrote"
    );
    let (newer, _) = go(&order(), &mut h, "b2", Some(&old.done), Mode::Run);
    assert_eq!(
        newer
            .changes
            .iter()
            .map(|(s, _)| s.as_str())
            .collect::<Vec<_>>(),
        ["lxd-install"]
    );
    assert!(h.lxd_group, "a newer binary re-checks every step");
}

/// A step that says nothing about skipping is never skipped: it is checked and applied.
#[test]
fn a_step_without_a_skip_rule_runs() {
    struct Plain;
    impl Step<Host> for Plain {
        fn name(&self) -> &'static str {
            "plain"
        }
        fn check(&self, h: &mut Host) -> Result<Check, String> {
            Ok(needs(h.profile, "the profile"))
        }
        fn apply(&self, h: &mut Host) -> Result<(), String> {
            h.profile = true;
            Ok(())
        }
    }
    let mut h = spark();
    let (out, events) = go(&[&Plain], &mut h, "b1", None, Mode::Run);
    assert!(out.completed, "{out:?}");
    assert!(h.profile, "applied");
    assert_eq!(out.done.steps, ["plain"]);
    assert!(events.iter().all(|e| e.state.state != StepState::Skipped));
}
