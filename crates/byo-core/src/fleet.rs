//! The fleet upgrade in waves (issue #14, 5; J note 9): which hosts an upgrade to one build
//! covers, in which wave, what each host's heartbeat says about it, and what happens next.
//! Pure: the facts are read by the server, time is passed in, the one-liner is run over the
//! operators' access path by `byo fleet upgrade` on the operator's machine.
//!
//! The rules:
//! - A host mid-create (an instance row `creating`, or a delete requested and not confirmed)
//!   or de-pooled is skipped, with that reason; so is one already on the build (`healthy`).
//! - The rest go in waves in the order given: a canary first, then cohorts growing by a
//!   factor (1, 2, 4, … by default). A wave starts only when every host of the waves before
//!   it is judged.
//! - A host is judged by its heartbeat alone: healthy once a beat seen after its upgrade
//!   started reports the build and a healthy host; failed when a beat reports a rollback, or
//!   when no such beat came within the wait.
//! - The first failure halts the run, with that host's reason. Resuming puts failed hosts
//!   back to waiting (the operator fixed the cause); judged hosts are not touched again.

use byo_wire::states::FleetHostState as State;
use chrono::{DateTime, Duration, Utc};

/// How hosts are grouped: `canary` hosts in the first wave, then each wave `growth` times
/// the one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Waves {
    pub canary: u32,
    pub growth: u32,
}

impl Default for Waves {
    fn default() -> Self {
        Waves {
            canary: 1,
            growth: 2,
        }
    }
}

impl Waves {
    /// The wave (from 0) of the `position`th host to upgrade. A canary of 0 counts as 1, a
    /// growth below 1 as 1: every wave holds at least one host.
    pub fn wave_of(self, position: usize) -> i32 {
        let mut size = u64::from(self.canary.max(1));
        let growth = u64::from(self.growth.max(1));
        let mut offset = position as u64;
        let mut wave = 0;
        while offset >= size {
            offset -= size;
            size = size.saturating_mul(growth);
            wave += 1;
        }
        wave
    }
}

/// What the server read about a host when a run is planned (or a wave is about to start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub host_id: String,
    /// What the operator reads (the slug).
    pub name: String,
    /// `uname -m` of node0, as it enrolled.
    pub arch: Option<String>,
    pub depooled: bool,
    pub mid_create: bool,
    /// The build (12 hex) its last heartbeat reported.
    pub build: Option<String>,
}

/// Why a host is left out of the wave it would be in, if it is.
pub fn skip_reason(c: &Candidate) -> Option<&'static str> {
    if c.depooled {
        Some("de-pooled: an operator took it out of placement; upgrade it by hand when it is back")
    } else if c.mid_create {
        Some("an instance is being created or deleted on it; run again (--resume) once it settled")
    } else {
        None
    }
}

/// One host's place in a planned run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub host_id: String,
    pub wave: i32,
    pub state: State,
    pub reason: Option<String>,
}

/// The run's hosts: skipped ones with their reason, those already on `build` healthy, the
/// rest waiting in their waves. Refused when a host to upgrade has an architecture the
/// installer does not serve `build` for (`served_arches`: the one-liner fetches the newest
/// build of the host's arch, so that is the build a host gets).
pub fn plan(
    candidates: &[Candidate],
    build: &str,
    served_arches: &[String],
    waves: Waves,
) -> Result<Vec<Planned>, String> {
    let mut out = Vec::with_capacity(candidates.len());
    let mut position = 0;
    for c in candidates {
        let (wave, state, reason) = if let Some(why) = skip_reason(c) {
            (-1, State::Skipped, Some(why.to_owned()))
        } else if c.build.as_deref() == Some(build) {
            (
                -1,
                State::Healthy,
                Some(format!("already on build {build}")),
            )
        } else {
            let arch = c.arch.as_deref().unwrap_or("an unknown architecture");
            if !served_arches.iter().any(|a| a == arch) {
                return Err(format!(
                    "the installer does not serve build {build} for {arch}, which {} runs on (it serves it for: {}); publish it for {arch}",
                    c.name,
                    if served_arches.is_empty() {
                        "none".to_owned()
                    } else {
                        served_arches.join(", ")
                    }
                ));
            }
            let wave = waves.wave_of(position);
            position += 1;
            (wave, State::Waiting, None)
        };
        out.push(Planned {
            host_id: c.host_id.clone(),
            wave,
            state,
            reason,
        });
    }
    Ok(out)
}

/// What the host's last heartbeat says, as the judge needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Beat {
    pub seen_at: DateTime<Utc>,
    pub build: Option<String>,
    /// What placement needs: LXD and the relay's map `ok`.
    pub healthy: bool,
    /// What `enverge-agent-rollback` recorded (`details.rollback`), which the host reports on
    /// every beat until its next install.
    pub rollback: Option<Rollback>,
}

/// A rollback as the heartbeat reports it: the build it went back from, and when (the
/// host's clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rollback {
    pub from_build: Option<String>,
    pub at: Option<DateTime<Utc>>,
}

impl Rollback {
    /// Read what the beat carried (`details.rollback`): the build by its digest, the time
    /// when it reads as RFC 3339 (the rollback script's `date`).
    pub fn from_record(r: &byo_wire::vm::RollbackRecord) -> Rollback {
        Rollback {
            from_build: r.from_sha256.as_deref().map(crate::release::build_id),
            at: r
                .at
                .as_deref()
                .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                .map(|t| t.with_timezone(&Utc)),
        }
    }

    /// Whether this rollback undid the upgrade to `build` started at `started_at`: it went
    /// back from that build (or does not say from which), no earlier than the start. A record
    /// left from before (the host reports it until its next install) is not this upgrade's.
    fn undid(&self, build: &str, started_at: DateTime<Utc>) -> bool {
        self.from_build.as_deref().is_none_or(|b| b == build)
            && self.at.is_none_or(|at| at >= started_at)
    }
}

/// An upgrading host's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Healthy,
    Pending,
    Failed(String),
}

/// Judge a host whose upgrade to `build` started at `started_at`, by its last heartbeat.
pub fn judge(
    build: &str,
    started_at: DateTime<Utc>,
    beat: Option<&Beat>,
    now: DateTime<Utc>,
    wait: Duration,
) -> Verdict {
    let fresh = beat.filter(|b| b.seen_at >= started_at);
    if let Some(b) = fresh {
        if b.rollback
            .as_ref()
            .is_some_and(|r| r.undid(build, started_at))
        {
            return Verdict::Failed(format!(
                "it rolled back (enverge-agent-rollback fired at {}): serving did not stay up on build {build}",
                b.seen_at.format("%H:%M:%S UTC")
            ));
        }
        if b.healthy && b.build.as_deref() == Some(build) {
            return Verdict::Healthy;
        }
    }
    if now < started_at + wait {
        return Verdict::Pending;
    }
    let last = match (fresh, beat) {
        (Some(b), _) => format!(
            "its last heartbeat ({}) reports build {}{}",
            b.seen_at.format("%H:%M:%S UTC"),
            b.build.as_deref().unwrap_or("unknown"),
            if b.healthy { "" } else { ", not healthy" }
        ),
        (None, Some(b)) => format!(
            "no heartbeat since the upgrade started (the last was at {})",
            b.seen_at.format("%H:%M:%S UTC")
        ),
        (None, None) => "it never sent a heartbeat".to_owned(),
    };
    Verdict::Failed(format!(
        "no heartbeat reporting build {build} healthy within {} s: {last}",
        wait.num_seconds()
    ))
}

/// One host of a run as recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracked {
    /// What the operator reads (the slug).
    pub name: String,
    pub host_id: String,
    pub wave: i32,
    pub state: State,
    pub reason: Option<String>,
}

/// What the run does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Start the one-liner on these hosts (the lowest wave not yet judged).
    Upgrade(Vec<String>),
    /// Wait for these hosts' heartbeats.
    Wait(Vec<String>),
    /// Stop: the first failure, with its reason.
    Halt(String),
    /// Every host is judged, none failed.
    Done,
}

/// The next step of a run. `hosts` in the order they were planned.
pub fn next(hosts: &[Tracked]) -> Next {
    if let Some(f) = hosts.iter().find(|h| h.state == State::Failed) {
        return Next::Halt(format!(
            "{}: {}",
            f.name,
            f.reason.as_deref().unwrap_or("failed")
        ));
    }
    let open = |h: &&Tracked| matches!(h.state, State::Waiting | State::Upgrading);
    let Some(wave) = hosts.iter().filter(open).map(|h| h.wave).min() else {
        return Next::Done;
    };
    let of_wave = |state: State| {
        hosts
            .iter()
            .filter(|h| h.wave == wave && h.state == state)
            .map(|h| h.host_id.clone())
            .collect::<Vec<_>>()
    };
    let waiting = of_wave(State::Waiting);
    if waiting.is_empty() {
        Next::Wait(of_wave(State::Upgrading))
    } else {
        Next::Upgrade(waiting)
    }
}

/// A host's state when its run is resumed: a failure is tried again, the rest stay.
pub fn resumed(state: State) -> State {
    match state {
        State::Failed => State::Waiting,
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(id: &str, arch: &str) -> Candidate {
        Candidate {
            host_id: id.into(),
            name: format!("spark-{id}"),
            arch: Some(arch.into()),
            depooled: false,
            mid_create: false,
            build: Some("000000000000".into()),
        }
    }

    fn tracked(id: &str, wave: i32, state: State) -> Tracked {
        Tracked {
            name: format!("spark-{id}"),
            host_id: id.into(),
            wave,
            state,
            reason: None,
        }
    }

    const B: &str = "aaaaaaaaaaaa";

    #[test]
    fn waves_are_a_canary_then_doubling_cohorts() {
        let w = Waves::default();
        let waves: Vec<i32> = (0..16).map(|i| w.wave_of(i)).collect();
        assert_eq!(waves, [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3, 4]);
        let w = Waves {
            canary: 2,
            growth: 3,
        };
        let waves: Vec<i32> = (0..9).map(|i| w.wave_of(i)).collect();
        assert_eq!(waves, [0, 0, 1, 1, 1, 1, 1, 1, 2]);
        // Degenerate settings still put one host or more in each wave.
        let w = Waves {
            canary: 0,
            growth: 0,
        };
        assert_eq!((0..3).map(|i| w.wave_of(i)).collect::<Vec<_>>(), [0, 1, 2]);
        let huge = Waves {
            canary: u32::MAX,
            growth: u32::MAX,
        };
        assert_eq!(huge.wave_of(usize::MAX), 2, "no overflow");
    }

    #[test]
    fn a_plan_skips_busy_and_depooled_hosts_and_counts_waves_over_the_rest() {
        let mut busy = cand("busy", "x86_64");
        busy.mid_create = true;
        let mut out = cand("out", "x86_64");
        out.depooled = true;
        out.mid_create = true;
        let mut done = cand("done", "aarch64");
        done.build = Some(B.into());
        let hosts = [
            cand("a", "x86_64"),
            busy,
            out,
            done,
            cand("b", "aarch64"),
            cand("c", "x86_64"),
            cand("d", "x86_64"),
        ];
        let arches = ["x86_64".to_owned(), "aarch64".to_owned()];
        let p = plan(&hosts, B, &arches, Waves::default()).unwrap();
        let seen: Vec<(&str, i32, State)> = p
            .iter()
            .map(|p| (p.host_id.as_str(), p.wave, p.state))
            .collect();
        assert_eq!(
            seen,
            [
                ("a", 0, State::Waiting),
                ("busy", -1, State::Skipped),
                ("out", -1, State::Skipped),
                ("done", -1, State::Healthy),
                ("b", 1, State::Waiting),
                ("c", 1, State::Waiting),
                ("d", 2, State::Waiting),
            ]
        );
        assert!(p[1].reason.as_deref().unwrap().contains("being created"));
        assert!(p[2].reason.as_deref().unwrap().starts_with("de-pooled"));
        assert_eq!(
            p[3].reason.as_deref(),
            Some("already on build aaaaaaaaaaaa")
        );
        assert_eq!(p[0].reason, None);
    }

    #[test]
    fn a_plan_is_refused_when_a_host_to_upgrade_has_no_build_for_its_arch() {
        let arches = ["x86_64".to_owned()];
        let err = plan(
            &[cand("a", "x86_64"), cand("arm", "aarch64")],
            B,
            &arches,
            Waves::default(),
        )
        .unwrap_err();
        assert!(
            err.contains(
                "does not serve build aaaaaaaaaaaa for aarch64, which spark-arm runs on (it serves it for: x86_64)"
            ),
            "{err}"
        );
        let mut unknown = cand("u", "x86_64");
        unknown.arch = None;
        let err = plan(&[unknown], B, &[], Waves::default()).unwrap_err();
        assert!(
            err.contains("an unknown architecture") && err.contains("serves it for: none"),
            "{err}"
        );
        // A host that will not be upgraded needs no build for its arch.
        let mut skipped = cand("arm", "aarch64");
        skipped.depooled = true;
        let mut on_it = cand("arm2", "aarch64");
        on_it.build = Some(B.into());
        assert!(plan(&[skipped, on_it], B, &arches, Waves::default()).is_ok());
    }

    #[test]
    fn a_host_is_healthy_only_on_a_fresh_healthy_beat_with_the_build() {
        let t0 = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let wait = Duration::seconds(60);
        let beat = |at: i64, build: &str, healthy: bool, rolled_back: bool| Beat {
            seen_at: t0 + Duration::seconds(at),
            build: Some(build.into()),
            healthy,
            rollback: rolled_back.then(|| Rollback {
                from_build: Some(B.into()),
                at: Some(t0 + Duration::seconds(at)),
            }),
        };
        let now = t0 + Duration::seconds(10);
        assert_eq!(
            judge(B, t0, Some(&beat(5, B, true, false)), now, wait),
            Verdict::Healthy
        );
        assert_eq!(
            judge(B, t0, Some(&beat(0, B, true, false)), now, wait),
            Verdict::Healthy,
            "a beat at the start counts"
        );
        // A beat from before the upgrade, another build, or an unhealthy host: not yet.
        for b in [
            beat(-1, B, true, false),
            beat(5, "bbbbbbbbbbbb", true, false),
            beat(5, B, false, false),
        ] {
            assert_eq!(judge(B, t0, Some(&b), now, wait), Verdict::Pending, "{b:?}");
        }
        assert_eq!(judge(B, t0, None, now, wait), Verdict::Pending);
        // A rollback fails at once; a stale rollback does not.
        let Verdict::Failed(why) = judge(B, t0, Some(&beat(5, "old", true, true)), now, wait)
        else {
            panic!("a rollback fails the host")
        };
        assert!(why.contains("rolled back") && why.contains(B), "{why}");
        assert_eq!(
            judge(B, t0, Some(&beat(-5, "old", true, true)), now, wait),
            Verdict::Pending
        );
        // A record the host still reports from before this upgrade, or a rollback from
        // another build, is not this upgrade's; one that does not say from which or when is.
        let mut stale = beat(5, "old", true, true);
        stale.rollback.as_mut().unwrap().at = Some(t0 - Duration::seconds(1));
        assert_eq!(judge(B, t0, Some(&stale), now, wait), Verdict::Pending);
        let mut other = beat(5, "old", true, true);
        other.rollback.as_mut().unwrap().from_build = Some("bbbbbbbbbbbb".into());
        assert_eq!(judge(B, t0, Some(&other), now, wait), Verdict::Pending);
        let mut vague = beat(5, "old", true, true);
        vague.rollback = Some(Rollback {
            from_build: None,
            at: None,
        });
        assert!(matches!(
            judge(B, t0, Some(&vague), now, wait),
            Verdict::Failed(_)
        ));
        // At the deadline: failed, saying what the last beat said.
        let late = t0 + wait;
        assert_eq!(
            judge(B, t0, Some(&beat(1, B, true, false)), late, wait),
            Verdict::Healthy
        );
        let reason = |beat: Option<&Beat>| match judge(B, t0, beat, late, wait) {
            Verdict::Failed(why) => why,
            other => panic!("{other:?}"),
        };
        let why = reason(Some(&beat(5, B, false, false)));
        assert!(
            why.contains("within 60 s") && why.contains(&format!("reports build {B}, not healthy")),
            "{why}"
        );
        let why = reason(Some(&beat(5, "bbbbbbbbbbbb", true, false)));
        assert!(why.ends_with("reports build bbbbbbbbbbbb"), "{why}");
        let why = reason(Some(&beat(-30, "old", true, false)));
        assert!(
            why.contains("no heartbeat since the upgrade started"),
            "{why}"
        );
        assert!(reason(None).contains("never sent a heartbeat"));
        assert_eq!(
            judge(B, t0, None, late - Duration::seconds(1), wait),
            Verdict::Pending
        );
        let mut nameless = beat(5, B, true, false);
        nameless.build = None;
        assert!(reason(Some(&nameless)).contains("reports build unknown"));
    }

    #[test]
    fn the_next_step_is_the_lowest_wave_and_the_first_failure_halts() {
        use State::*;
        assert_eq!(next(&[]), Next::Done);
        let mut run = vec![
            tracked("a", 0, Waiting),
            tracked("s", -1, Skipped),
            tracked("b", 1, Waiting),
            tracked("c", 1, Waiting),
            tracked("d", 2, Waiting),
        ];
        assert_eq!(next(&run), Next::Upgrade(vec!["a".into()]));
        run[0].state = Upgrading;
        assert_eq!(next(&run), Next::Wait(vec!["a".into()]));
        run[0].state = Healthy;
        assert_eq!(next(&run), Next::Upgrade(vec!["b".into(), "c".into()]));
        // A wave cut short (some started, some not): the rest start before any wait.
        run[2].state = Upgrading;
        assert_eq!(next(&run), Next::Upgrade(vec!["c".into()]));
        run[3].state = Upgrading;
        assert_eq!(next(&run), Next::Wait(vec!["b".into(), "c".into()]));
        run[2].state = Healthy;
        assert_eq!(next(&run), Next::Wait(vec!["c".into()]));
        run[3].state = Failed;
        run[3].reason = Some("the build does not run".into());
        assert_eq!(
            next(&run),
            Next::Halt("spark-c: the build does not run".into())
        );
        run[3].reason = None;
        assert_eq!(next(&run), Next::Halt("spark-c: failed".into()));
        run[3].state = resumed(Failed);
        assert_eq!(run[3].state, Waiting);
        assert_eq!(next(&run), Next::Upgrade(vec!["c".into()]));
        run[3].state = Healthy;
        run[4].state = Skipped;
        assert_eq!(next(&run), Next::Done);
        for s in [Waiting, Upgrading, Healthy, Skipped] {
            assert_eq!(resumed(s), s);
        }
    }

    #[test]
    fn a_rollback_is_read_from_the_heartbeats_details() {
        let read = |v: serde_json::Value| {
            let details: byo_wire::vm::BeatDetails = serde_json::from_value(v).unwrap();
            details.rollback.as_ref().map(Rollback::from_record)
        };
        let details = serde_json::json!({"rollback": {
            "at": "2030-03-17T17:46:40Z",
            "from_sha256": "AAAAAAAAAAAAbbbb",
            "to_sha256": "cccc"
        }});
        assert_eq!(
            read(details),
            Some(Rollback {
                from_build: Some(B.into()),
                at: Some(DateTime::from_timestamp(1_900_000_000, 0).unwrap()),
            })
        );
        assert_eq!(read(serde_json::json!({})), None);
        assert_eq!(read(serde_json::json!({"rollback": null})), None);
        assert_eq!(
            read(serde_json::json!({"rollback": {"at": "yesterday"}})),
            Some(Rollback {
                from_build: None,
                at: None
            })
        );
    }

    #[test]
    fn skipping_names_depooled_before_busy() {
        let mut c = cand("a", "x86_64");
        assert_eq!(skip_reason(&c), None);
        c.mid_create = true;
        assert!(skip_reason(&c).unwrap().contains("being created"));
        c.depooled = true;
        assert!(skip_reason(&c).unwrap().starts_with("de-pooled"));
    }
}
