//! The fleet upgrade in waves (issue #14, 5; J note 9), as the server keeps it: a run to one
//! published build, planned by `byo_core::fleet`, with each host's state recorded as
//! `byo fleet upgrade` goes. The one-liner runs over the operators' access path (I) from
//! the operator's machine — a server never holds an operator's private key — and each host
//! is judged here by its own heartbeat. A run halts on its first failure with the reason,
//! and is resumed by starting it again with `resume`. /admin/releases shows runs; a
//! superadmin may halt or close one there.

use byo_core::fleet::{self, Beat, Candidate, Next, Tracked, Verdict, Waves};
use byo_core::release;
use byo_db::releases::{FleetCandidateRow, FleetRunRow, NewFleetHost};
use byo_wire::fleet::{FleetAdvance, FleetHostView, FleetNext, FleetRunView, FleetStart};
use byo_wire::states::{FleetHostState, FleetRunState};
use chrono::Duration;
use serde_json::json;

use crate::auth::Superadmin;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// How long a host has to report the build healthy, unless the run says otherwise.
pub const DEFAULT_WAIT_SECS: u32 = 300;

fn candidate(c: &FleetCandidateRow) -> Candidate {
    Candidate {
        host_id: c.host_id.clone(),
        name: c.slug.clone(),
        arch: c.arch.clone(),
        depooled: c.depooled,
        mid_create: c.mid_create,
        build: c
            .agent_version
            .as_deref()
            .and_then(release::build_of_version)
            .map(str::to_owned),
    }
}

/// The published build `named` names (a sha256 or its first 12 hex or more), and the arches
/// the installer serves it for now.
async fn resolve(state: &AppState, named: &str) -> AppResult<(String, Vec<String>)> {
    let named = named.trim().to_ascii_lowercase();
    if !(release::BUILD_ID_HEX..=64).contains(&named.len())
        || !named.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(AppError::bad_request(
            "bad_build",
            "name the build by its sha256, or its first 12 hex digits or more (byo release publish prints it)",
        ));
    }
    let build = release::build_id(&named);
    let releases: Vec<_> = state
        .store
        .releases_of_build(&build)
        .await?
        .into_iter()
        .filter(|r| r.sha256.starts_with(&named))
        .collect();
    if releases.is_empty() {
        return Err(AppError::conflict(
            "unknown_build",
            format!(
                "no published build is named {named}: publish it first (byo release publish); nothing was started"
            ),
        ));
    }
    let mut served = Vec::new();
    for r in &releases {
        if state
            .store
            .newest_release(&r.arch)
            .await?
            .is_some_and(|n| n.build == build)
        {
            served.push(r.arch.clone());
        }
    }
    Ok((build, served))
}

/// Start a run to `req.build`, or resume the open one (`req.resume`).
pub async fn start(state: &AppState, by: &Superadmin, req: FleetStart) -> AppResult<FleetRunView> {
    let (build, served) = resolve(state, &req.build).await?;
    let now = state.clock.now();
    let open = state.store.open_fleet_run_row().await?;
    if req.resume {
        let Some(run) = open else {
            return Err(AppError::conflict(
                "no_open_run",
                "there is no fleet upgrade to resume; start one without --resume",
            ));
        };
        if run.build != build {
            return Err(AppError::conflict(
                "other_build",
                format!(
                    "the open fleet upgrade is to build {}, not {build}: resume it with --build {}, or close it on /admin/releases",
                    run.build, run.build
                ),
            ));
        }
        for h in state.store.fleet_run_hosts(&run.id).await? {
            let to = fleet::resumed(h.state);
            if to != h.state {
                state
                    .store
                    .move_fleet_host(&run.id, &h.host_id, h.state, to, None, now)
                    .await?;
            }
        }
        state
            .store
            .move_fleet_run(
                &run.id,
                FleetRunState::Halted,
                FleetRunState::Running,
                None,
                now,
            )
            .await?;
        audit(
            state,
            by,
            "fleet.upgrade_resumed",
            &run.id,
            json!({"build": build}),
        )
        .await?;
        return advance(state, by, &run.id, FleetAdvance::default()).await;
    }
    if let Some(run) = open {
        return Err(in_progress(&run));
    }
    let waves = Waves {
        canary: req.canary.unwrap_or(1),
        growth: req.growth.unwrap_or(2),
    };
    let wait_secs = req.wait_secs.unwrap_or(DEFAULT_WAIT_SECS).clamp(1, 86_400);
    let candidates: Vec<Candidate> = state
        .store
        .fleet_candidates()
        .await?
        .iter()
        .map(candidate)
        .collect();
    let planned = fleet::plan(&candidates, &build, &served, waves)
        .map_err(|why| AppError::conflict("not_served", format!("{why}; nothing was started")))?;
    let hosts: Vec<NewFleetHost> = planned
        .into_iter()
        .map(|p| NewFleetHost {
            host_id: p.host_id,
            wave: p.wave,
            state: p.state,
            reason: p.reason,
        })
        .collect();
    let small = |v: u32| i32::try_from(v.max(1)).unwrap_or(i32::MAX);
    let run = state
        .store
        .open_fleet_run(
            &build,
            (small(waves.canary), small(waves.growth), small(wait_secs)),
            &hosts,
            &by.0.user.sub,
            now,
        )
        .await;
    let run = match run {
        Ok(run) => run,
        Err(e) if e.breaks(byo_db::Rule::OneFleetUpgradeOpen) => {
            // Another start won the race.
            return match state.store.open_fleet_run_row().await? {
                Some(run) => Err(in_progress(&run)),
                None => Err(e.into()),
            };
        }
        Err(e) => return Err(e.into()),
    };
    audit(
        state,
        by,
        "fleet.upgrade_started",
        &run.id,
        json!({"build": build, "hosts": hosts.len()}),
    )
    .await?;
    advance(state, by, &run.id, FleetAdvance::default()).await
}

fn in_progress(run: &FleetRunRow) -> AppError {
    AppError::conflict(
        "run_in_progress",
        format!(
            "fleet upgrade {} to build {} is {}: resume it (byo fleet upgrade --build {} --resume) or close it on /admin/releases; nothing was started",
            run.id, run.build, run.state, run.build
        ),
    )
}

async fn audit(
    state: &AppState,
    by: &Superadmin,
    action: &str,
    run_id: &str,
    details: serde_json::Value,
) -> AppResult<()> {
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            action,
            Some(run_id),
            details,
            state.clock.now(),
        )
        .await?;
    Ok(())
}

/// Record what the operator's machine reports, judge the upgrading hosts by their
/// heartbeats, halt on the first failure or close when every host is judged, and answer
/// with the run and its next step.
pub async fn advance(
    state: &AppState,
    by: &Superadmin,
    run_id: &str,
    req: FleetAdvance,
) -> AppResult<FleetRunView> {
    let run = state
        .store
        .fleet_run(run_id)
        .await?
        .ok_or(AppError::NotFound)?;
    let now = state.clock.now();
    if let Some(report) = &req.report {
        if run.state != FleetRunState::Running {
            return Err(AppError::conflict(
                "run_not_running",
                format!(
                    "fleet upgrade {run_id} is {}: nothing was recorded",
                    run.state
                ),
            ));
        }
        let from = match report.state {
            FleetHostState::Upgrading => FleetHostState::Waiting,
            FleetHostState::Failed => FleetHostState::Upgrading,
            other => {
                return Err(AppError::bad_request(
                    "bad_report",
                    format!(
                        "a host is reported upgrading or failed, not {other}; its heartbeat says the rest"
                    ),
                ));
            }
        };
        let reason = report
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty());
        if report.state == FleetHostState::Failed && reason.is_none() {
            return Err(AppError::bad_request(
                "bad_report",
                "a failure needs its reason (what the one-liner printed)",
            ));
        }
        if !state
            .store
            .move_fleet_host(run_id, &report.host_id, from, report.state, reason, now)
            .await?
        {
            return Err(AppError::conflict(
                "host_not_in_that_state",
                format!(
                    "host {} is not {from} in fleet upgrade {run_id}: nothing was recorded",
                    report.host_id
                ),
            ));
        }
    }
    if run.state == FleetRunState::Running {
        step(state, by, &run).await?;
    }
    view(state, run_id).await
}

/// Judge the upgrading hosts, skip the next wave's hosts that became busy, then halt or
/// close the run when that is what comes next.
async fn step(state: &AppState, by: &Superadmin, run: &FleetRunRow) -> AppResult<()> {
    let now = state.clock.now();
    let wait = Duration::seconds(i64::from(run.wait_secs));
    for h in state.store.fleet_run_hosts(&run.id).await? {
        if h.state != FleetHostState::Upgrading {
            continue;
        }
        let Some(started_at) = h.started_at else {
            continue;
        };
        let beat = state.store.host_status(&h.host_id).await?.map(|s| Beat {
            seen_at: s.seen_at,
            build: s
                .agent_version
                .as_deref()
                .and_then(release::build_of_version)
                .map(str::to_owned),
            healthy: s.lxd.as_deref() == Some("ok") && s.relay.as_deref() == Some("ok"),
            rollback: s
                .details
                .0
                .rollback
                .as_ref()
                .map(fleet::Rollback::from_record),
        });
        let (to, reason) = match fleet::judge(&run.build, started_at, beat.as_ref(), now, wait) {
            Verdict::Pending => continue,
            Verdict::Healthy => (FleetHostState::Healthy, None),
            Verdict::Failed(why) => (FleetHostState::Failed, Some(why)),
        };
        state
            .store
            .move_fleet_host(
                &run.id,
                &h.host_id,
                FleetHostState::Upgrading,
                to,
                reason.as_deref(),
                now,
            )
            .await?;
    }
    loop {
        let hosts = tracked(state, &run.id).await?;
        match fleet::next(&hosts) {
            Next::Halt(reason) => {
                state
                    .store
                    .move_fleet_run(
                        &run.id,
                        FleetRunState::Running,
                        FleetRunState::Halted,
                        Some(&reason),
                        now,
                    )
                    .await?;
                audit(
                    state,
                    by,
                    "fleet.upgrade_halted",
                    &run.id,
                    json!({"reason": reason}),
                )
                .await?;
                return Ok(());
            }
            Next::Done => {
                state
                    .store
                    .move_fleet_run(
                        &run.id,
                        FleetRunState::Running,
                        FleetRunState::Closed,
                        None,
                        now,
                    )
                    .await?;
                audit(state, by, "fleet.upgrade_done", &run.id, json!({})).await?;
                return Ok(());
            }
            Next::Wait(_) => return Ok(()),
            Next::Upgrade(ids) => {
                // A host's facts are read again just before its wave: one that became busy
                // or was de-pooled since the plan is skipped, with the reason.
                let facts = state.store.fleet_candidates().await?;
                let mut skipped = false;
                for id in &ids {
                    let why = facts
                        .iter()
                        .find(|c| &c.host_id == id)
                        .map(candidate)
                        .as_ref()
                        .map_or(Some("no longer a prepared host"), fleet::skip_reason);
                    if let Some(why) = why {
                        skipped |= state
                            .store
                            .move_fleet_host(
                                &run.id,
                                id,
                                FleetHostState::Waiting,
                                FleetHostState::Skipped,
                                Some(why),
                                now,
                            )
                            .await?;
                    }
                }
                if !skipped {
                    return Ok(());
                }
            }
        }
    }
}

async fn tracked(state: &AppState, run_id: &str) -> AppResult<Vec<Tracked>> {
    Ok(state
        .store
        .fleet_run_hosts(run_id)
        .await?
        .into_iter()
        .map(|h| Tracked {
            name: h.slug,
            host_id: h.host_id,
            wave: h.wave,
            state: h.state,
            reason: h.reason,
        })
        .collect())
}

/// A run as the CLI and the page read it.
pub async fn view(state: &AppState, run_id: &str) -> AppResult<FleetRunView> {
    let run = state
        .store
        .fleet_run(run_id)
        .await?
        .ok_or(AppError::NotFound)?;
    let rows = state.store.fleet_run_hosts(run_id).await?;
    let next = match run.state {
        FleetRunState::Halted => FleetNext::Halted {
            reason: run.halt_reason.clone().unwrap_or_else(|| "halted".into()),
        },
        FleetRunState::Closed => FleetNext::Done,
        FleetRunState::Running => match fleet::next(&tracked(state, run_id).await?) {
            Next::Upgrade(hosts) => FleetNext::Upgrade { hosts },
            Next::Wait(hosts) => FleetNext::Wait { hosts },
            Next::Halt(reason) => FleetNext::Halted { reason },
            Next::Done => FleetNext::Done,
        },
    };
    let mut hosts = Vec::with_capacity(rows.len());
    for h in rows {
        let status = state.store.host_status(&h.host_id).await?;
        hosts.push(FleetHostView {
            host_id: h.host_id,
            slug: h.slug,
            tunnel_hostname: h.tunnel_hostname,
            wave: h.wave,
            state: h.state,
            reason: h.reason,
            started_at: h.started_at,
            judged_at: h.judged_at,
            agent_version: status.as_ref().and_then(|s| s.agent_version.clone()),
            seen_at: status.map(|s| s.seen_at),
        });
    }
    Ok(FleetRunView {
        id: run.id,
        build: run.build,
        state: run.state,
        halt_reason: run.halt_reason,
        canary: run.canary,
        growth: run.growth,
        wait_secs: run.wait_secs,
        started_by: run.started_by,
        started_at: run.started_at,
        hosts,
        next,
    })
}

/// A superadmin halts a running run from /admin/releases: the CLI driving it stops at its
/// next step, saying who halted it.
pub async fn halt(state: &AppState, by: &Superadmin, run_id: &str) -> AppResult<()> {
    let reason = format!("halted by {} on /admin/releases", by.0.user.email);
    let now = state.clock.now();
    if !state
        .store
        .move_fleet_run(
            run_id,
            FleetRunState::Running,
            FleetRunState::Halted,
            Some(&reason),
            now,
        )
        .await?
    {
        return Err(not_in(state, run_id, "running").await);
    }
    audit(
        state,
        by,
        "fleet.upgrade_halted",
        run_id,
        json!({"reason": reason}),
    )
    .await
}

/// A superadmin closes an open run (running or halted): nothing more is done in it, and a
/// new one may start. Hosts already upgraded stay upgraded.
pub async fn close(state: &AppState, by: &Superadmin, run_id: &str) -> AppResult<()> {
    let now = state.clock.now();
    let mut closed = false;
    for from in [FleetRunState::Halted, FleetRunState::Running] {
        closed = closed
            || state
                .store
                .move_fleet_run(run_id, from, FleetRunState::Closed, None, now)
                .await?;
    }
    if !closed {
        return Err(not_in(state, run_id, "open").await);
    }
    audit(state, by, "fleet.upgrade_closed", run_id, json!({})).await
}

async fn not_in(state: &AppState, run_id: &str, wanted: &str) -> AppError {
    match state.store.fleet_run(run_id).await {
        Ok(Some(run)) => AppError::conflict(
            "run_not_open",
            format!(
                "fleet upgrade {run_id} is {}, not {wanted}: nothing changed",
                run.state
            ),
        ),
        Ok(None) => AppError::NotFound,
        Err(e) => e.into(),
    }
}
