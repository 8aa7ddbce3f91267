//! The prepare engine (C): every step has the same shape, and the shape is the point.
//!
//! - Check and apply are separate: a re-run changes nothing on a prepared host, and a dry
//!   run calls only check, reporting what it would change while touching nothing.
//! - The re-check after apply is not belt and braces: a step whose apply reports success
//!   while its check still fails is a failure, not a host that arrives "prepared" and broken.
//! - The run stops at the first step that will not complete, because the orderings are
//!   load-bearing: a host that failed lxd-install must never reach owner-lockout.
//! - The done list is scoped to the build that wrote it: a newer binary re-checks every
//!   step, since a step's name says nothing about what the step now does.
//!
//! Pure: the engine does no IO of its own. Steps act on the host through `H`, the adapter
//! (local commands, SSH to a satellite, or a simulated Spark), and time is passed in.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use byo_wire::prepare::{PrepareState, StepState};

/// What a check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    Satisfied,
    /// Not yet: what apply would change, in words.
    Needs(String),
}

/// One step of preparation, acting on the host through `H`.
pub trait Step<H> {
    /// The name, never a number (a step inserted in the middle renumbers nothing).
    fn name(&self) -> &'static str;
    /// Does the host already hold what this step makes true? Reads only.
    fn check(&self, host: &mut H) -> Result<Check, String>;
    /// Make it true.
    fn apply(&self, host: &mut H) -> Result<(), String>;
    /// Skipped on this host, with the reason (a watchdog on a board without one, the pair
    /// steps on a single Spark). Skipped steps are reported, not silently dropped.
    fn skip(&self, _host: &mut H) -> Option<String> {
        None
    }
}

/// The steps a build has completed, recorded by the caller after each step.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DoneList {
    pub build: String,
    pub steps: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Run,
    /// Call only check; change nothing, the done list included.
    DryRun,
}

/// A progress event: the design's prepare_state, tagged with the node it is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub node: u32,
    pub state: PrepareState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Every step satisfied, applied or skipped.
    pub completed: bool,
    pub done: DoneList,
    /// Steps whose apply ran (or, in a dry run, would run), with what they change.
    pub changes: Vec<(String, String)>,
    pub failed: Option<(String, String)>,
}

struct Reporter<N, R> {
    node: u32,
    now: N,
    report: R,
}

impl<N: FnMut() -> DateTime<Utc>, R: FnMut(Progress)> Reporter<N, R> {
    fn emit(
        &mut self,
        step: &str,
        state: StepState,
        attempt: u32,
        error: Option<String>,
        is_final: bool,
    ) {
        let at = (self.now)();
        (self.report)(Progress {
            node: self.node,
            state: PrepareState {
                step: step.to_owned(),
                state,
                attempt,
                error,
                is_final,
                at,
            },
        });
    }
}

/// Drive `steps` in order on `host`, reporting progress after each one.
#[allow(clippy::too_many_arguments)] // each is a separate input the design names
pub fn run<H>(
    steps: &[&dyn Step<H>],
    host: &mut H,
    node: u32,
    build: &str,
    previous: Option<&DoneList>,
    mode: Mode,
    now: impl FnMut() -> DateTime<Utc>,
    report: impl FnMut(Progress),
) -> Outcome {
    // Trusted only if this very build wrote it.
    let trusted: &[String] = match previous {
        Some(d) if d.build == build => &d.steps,
        _ => &[],
    };
    let mut out = Reporter { node, now, report };
    let mut done = DoneList {
        build: build.to_owned(),
        steps: Vec::new(),
    };
    let mut changes = Vec::new();
    let record = mode == Mode::Run;
    for (i, step) in steps.iter().enumerate() {
        let name = step.name();
        let last = i + 1 == steps.len();
        let stop = |done: DoneList,
                    changes: Vec<(String, String)>,
                    error: String,
                    out: &mut Reporter<_, _>| {
            out.emit(name, StepState::Failed, 1, Some(error.clone()), true);
            Outcome {
                completed: false,
                done,
                changes,
                failed: Some((name.to_owned(), error)),
            }
        };
        if trusted.iter().any(|s| s == name) {
            done.steps.push(name.to_owned());
            out.emit(name, StepState::Satisfied, 0, None, last);
            continue;
        }
        if let Some(reason) = step.skip(host) {
            if record {
                done.steps.push(name.to_owned());
            }
            out.emit(name, StepState::Skipped, 0, Some(reason), last);
            continue;
        }
        let what = match step.check(host) {
            Err(e) => return stop(done, changes, format!("check failed: {e}"), &mut out),
            Ok(Check::Satisfied) => {
                if record {
                    done.steps.push(name.to_owned());
                }
                out.emit(name, StepState::Satisfied, 1, None, last);
                continue;
            }
            Ok(Check::Needs(what)) => what,
        };
        changes.push((name.to_owned(), what.clone()));
        if mode == Mode::DryRun {
            out.emit(
                name,
                StepState::Checking,
                1,
                Some(format!("would change: {what}")),
                last,
            );
            continue;
        }
        out.emit(name, StepState::Applying, 1, None, false);
        if let Err(e) = step.apply(host) {
            return stop(done, changes, format!("apply failed: {e}"), &mut out);
        }
        match step.check(host) {
            Ok(Check::Satisfied) => {
                done.steps.push(name.to_owned());
                out.emit(name, StepState::Applied, 1, None, last);
            }
            Ok(Check::Needs(still)) => {
                let e = format!("apply reported success but the check still fails: {still}");
                return stop(done, changes, e, &mut out);
            }
            Err(e) => return stop(done, changes, format!("re-check failed: {e}"), &mut out),
        }
    }
    Outcome {
        completed: record,
        done,
        changes,
        failed: None,
    }
}
