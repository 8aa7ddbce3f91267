//! `/admin`: the fleet at a glance (issue #38, 1) — the counts by state (each a link that
//! filters by it), a filter by state, problem, GPU type and owner, and one page of hosts
//! with their problems by name, each linking to the host's page. The rules and the read are
//! [`crate::app::fleet_overview`]'s, as the API's.

use axum::extract::{Query, State};
use axum::response::IntoResponse;
use byo_wire::overview::{FleetOverview, FleetState};
use maud::{Markup, html};

use super::instances::at;
use super::{PageResult, ops_layout, require_operator};
use crate::app::fleet_overview::{self, FleetQuery};
use crate::auth::CurrentUser;
use crate::state::AppState;

/// The query string for `q` with `page` (the filter kept across pages).
fn link(q: &FleetQuery, page: u32) -> String {
    let mut parts: Vec<(&str, String)> = Vec::new();
    for (name, v) in [
        ("state", &q.state),
        ("problem", &q.problem),
        ("gpu_type", &q.gpu_type),
        ("owner", &q.owner),
        ("sort", &q.sort),
    ] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            parts.push((name, v.to_owned()));
        }
    }
    parts.push(("page", page.to_string()));
    format!(
        "/admin?{}",
        serde_urlencoded::to_string(&parts).unwrap_or_default()
    )
}

fn counts(o: &FleetOverview) -> Markup {
    let c = &o.counts;
    let tiles = [
        ("renting", c.renting),
        ("idle", c.idle),
        ("preparing", c.preparing),
        ("enrolling", c.enrolling),
        ("depooled", c.depooled),
        ("unreachable", c.unreachable),
    ];
    html! {
        ul #fleet-counts {
            li { a href="/admin" { strong { (c.total) } " hosts" } }
            @for (name, n) in tiles {
                li.{ "count-" (name) } { a href={ "/admin?state=" (name) } { strong { (n) } " " (name) } }
            }
            li.count-problem { strong { (c.with_problem) } " with a problem" }
        }
    }
}

pub async fn page(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Query(q): Query<FleetQuery>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let filter = q.filter()?;
    let o = fleet_overview::fleet_overview(&state, &filter).await?;
    // The operator-key list's expiry is every host's at once (issue #39, 5): said here, in
    // red, from 14 days out, not only on the keys' own page.
    let keys_expire = crate::app::operator_keys::published_expiry(&state)
        .await?
        .and_then(|e| {
            crate::app::host_problems::expiry_warning(e, state.clock.now()).map(|d| (e, d))
        });
    let picked = |v: &Option<String>, want: &str| v.as_deref() == Some(want);
    Ok(ops_layout(
        "Fleet",
        Some(&op.0),
        html! {
            h1 { "The fleet" }
            @if let Some((expires, days)) = keys_expire {
                p.error #fleet-keys role="alert" {
                    @if days == 0 {
                        "The operator-key list expired " (at(expires)) ": every host refuses every operator's login. "
                    } @else {
                        "The operator-key list expires " (at(expires)) " — within " (days) " day(s) — and with it every operator's login to every host. "
                    }
                    a href="/admin/operator-keys" { "Sign the renewal" }
                    " (" code { "byo keys sign" } ")."
                }
            }
            (counts(&o))
            form #fleet-filter method="get" action="/admin" {
                label { "State "
                    select name="state" {
                        option value="" { "any" }
                        @for s in FleetState::ALL {
                            option value=(s.as_str()) selected[picked(&q.state, s.as_str())] { (s.as_str()) }
                        }
                    }
                }
                label { " Problem "
                    select name="problem" {
                        option value="" { "any" }
                        @for p in &o.problems {
                            option value=(p.name) selected[picked(&q.problem, &p.name)] { (p.name) " (" (p.hosts) ")" }
                        }
                    }
                }
                label { " GPU "
                    select name="gpu_type" {
                        option value="" { "any" }
                        @for g in &o.gpu_types {
                            option value=(g) selected[picked(&q.gpu_type, g)] { (g) }
                        }
                    }
                }
                label { " Owner "
                    input type="search" name="owner" maxlength="128" placeholder="email"
                        value=(q.owner.as_deref().unwrap_or(""));
                }
                label { " Sort "
                    select name="sort" {
                        option value="problems" selected[picked(&q.sort, "problems")] { "oldest problem first" }
                        option value="heartbeat" selected[picked(&q.sort, "heartbeat")] { "oldest heartbeat first" }
                        option value="slug" selected[picked(&q.sort, "slug")] { "by name" }
                    }
                }
                " "
                button type="submit" { "Show" }
            }
            @if o.hosts.is_empty() {
                p #no-hosts { "No host matches." }
            } @else {
                p.matching { (o.matching) " matching; page " (o.page) " of " (o.pages) "." }
                div.scroll { table #fleet {
                    thead { tr { th { "Host" } th { "State" } th { "Problems" } th { "Heartbeat" } th { "Agent" } th { "Key list" } th { "Instances" } th { "GPU" } th { "Owner" } } }
                    tbody { @for h in &o.hosts { tr #{ "fleet-" (h.host_id) } {
                        td.host { a href={ "/admin/hosts/" (h.host_id) } { (h.slug) } }
                        td.state { (h.state.as_str()) }
                        td.problems {
                            @for p in &h.problems {
                                a.problem href={ "/admin/hosts/" (h.host_id) "#problems" } title=(p.detail) {
                                    (p.name)
                                    @if let Some(since) = p.since { " since " (at(since)) }
                                }
                                br;
                            }
                            @if h.problems.is_empty() { "—" }
                        }
                        td.heartbeat { @if let Some(t) = h.heartbeat_at { (at(t)) } @else { "never" } }
                        td { (h.agent_version.as_deref().unwrap_or("—")) }
                        td { @if let Some(v) = h.key_list_version { (v) } @else { "—" } }
                        td { (h.instances) }
                        td.gpu { (h.gpu_type) }
                        td.owner { (h.owner_email) }
                    } } }
                } }
                nav.pager {
                    @if o.page > 1 { a rel="prev" href=(link(&q, o.page - 1)) { "← previous" } " " }
                    @if o.page < o.pages { a rel="next" href=(link(&q, o.page + 1)) { "next →" } }
                }
            }
        },
    )
    .into_response())
}
