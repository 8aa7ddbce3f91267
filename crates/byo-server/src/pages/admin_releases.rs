//! `/admin/releases`: the published agent builds (which one the installer serves for each
//! arch) and the fleet upgrades (each host's wave, state and reason), for operators; a
//! superadmin may halt a running upgrade or close an open one here. Starting and resuming
//! are `byo fleet upgrade`'s, on the operator's machine: the one-liner runs over SSH with
//! the operator's own key, which no server holds. The rules are
//! [`crate::app::releases`]' and [`crate::app::fleet_upgrade`]'s.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect};
use byo_wire::Role;
use byo_wire::states::FleetRunState;
use maud::{Markup, html};

use super::instances::{at, shown};
use super::{PageError, PageResult, ops_layout, require_operator, require_superadmin};
use crate::app::{fleet_upgrade, releases};
use crate::auth::{CurrentUser, Operator, Superadmin};
use crate::error::AppError;
use crate::state::AppState;

/// How many runs the page lists.
const RUNS_SHOWN: i64 = 10;

async fn render(state: &AppState, op: &Operator, error: Option<&str>) -> Result<Markup, PageError> {
    let builds = releases::list(state).await?;
    let runs = state.store.fleet_runs(RUNS_SHOWN).await?;
    let superadmin = op.0.has(Role::Superadmin);
    let mut shown_runs = Vec::with_capacity(runs.len());
    for r in &runs {
        shown_runs.push(fleet_upgrade::view(state, &r.id).await?);
    }
    Ok(ops_layout(
        "Releases",
        Some(&op.0),
        html! {
            h1 { "Releases" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            p { "Agent builds published with " code { "byo release publish" } ", each verified against this server's release key. The installer serves the newest of each arch; publishing changes nothing on any host until the one-liner runs there (" code { "byo fleet upgrade" } ")." }
            @if builds.is_empty() {
                p #releases-empty { "No build is published: the installer serves the release directory's own files." }
            } @else {
                div.scroll { table #releases {
                    thead { tr { th { "Arch" } th { "Version" } th { "Build" } th { "Size" } th { "Published" } th { "Served" } } }
                    tbody { @for b in &builds {
                        tr #{ "release-" (b.arch) "-" (b.build) } {
                            td.arch { (b.arch) }
                            td.version { (b.version) }
                            td.build { code { (b.build) } }
                            td.size { (b.size_bytes / 1024 / 1024) " MiB" }
                            td.published { (at(b.published_at)) }
                            td.served { @if b.served { "served" } @else { "—" } }
                        }
                    } }
                } }
            }
            h2 { "Fleet upgrades" }
            @if shown_runs.is_empty() {
                p #fleet-empty { "No fleet upgrade has run." }
            }
            @for run in &shown_runs {
                section.fleet-run #{ "run-" (run.id) } {
                    h3 { "To build " code { (run.build) } " — " span.state { (run.state) } }
                    p { "Started " (at(run.started_at)) "; waves of " (run.canary) ", growing ×" (run.growth) "; each host has " (run.wait_secs) " s to report the build healthy." }
                    @if let Some(r) = &run.halt_reason { p.halt-reason { "Halted: " (r) } }
                    @if superadmin && run.state != FleetRunState::Closed {
                        @if run.state == FleetRunState::Running {
                            form.inline method="post" action={ "/admin/fleet-upgrades/" (run.id) "/halt" } {
                                button type="submit" { "Halt" }
                            }
                        }
                        form.inline method="post" action={ "/admin/fleet-upgrades/" (run.id) "/close" } {
                            button type="submit" { "Close" }
                        }
                    }
                    div.scroll { table.fleet-hosts {
                        thead { tr { th { "Host" } th { "Wave" } th { "State" } th { "Reason" } th { "Heartbeat reports" } } }
                        tbody { @for h in &run.hosts {
                            tr #{ "fleet-" (run.id) "-" (h.slug) } {
                                td.host { a href={ "/admin/hosts/" (h.host_id) } { (h.slug) } }
                                td.wave { @if h.wave >= 0 { (h.wave) } @else { "—" } }
                                td.state { (h.state) }
                                td.reason { (h.reason.as_deref().unwrap_or("")) }
                                td.version { (h.agent_version.as_deref().unwrap_or("—")) }
                            }
                        } }
                    } }
                }
            }
        },
    ))
}

pub async fn page(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = require_operator(viewer)?;
    Ok(render(&state, &op, None).await?.into_response())
}

async fn after(state: &AppState, admin: Superadmin, done: Result<(), AppError>) -> PageResult {
    match done {
        Ok(()) => Ok(Redirect::to("/admin/releases").into_response()),
        Err(e) => {
            let e = shown(e)?;
            let message = match e {
                AppError::NotFound => "no such fleet upgrade".to_owned(),
                ref other => other.to_string(),
            };
            let page = render(state, &Operator(admin.0), Some(&message)).await?;
            Ok((e.status(), page).into_response())
        }
    }
}

/// `POST /admin/fleet-upgrades/{id}/halt`: the CLI driving the run stops at its next step.
pub async fn halt(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(run_id): Path<String>,
) -> PageResult {
    let admin = require_superadmin(viewer)?;
    let done = fleet_upgrade::halt(&state, &admin, &run_id).await;
    after(&state, admin, done).await
}

/// `POST /admin/fleet-upgrades/{id}/close`: nothing more is done in the run; a new one may
/// start.
pub async fn close(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(run_id): Path<String>,
) -> PageResult {
    let admin = require_superadmin(viewer)?;
    let done = fleet_upgrade::close(&state, &admin, &run_id).await;
    after(&state, admin, done).await
}
