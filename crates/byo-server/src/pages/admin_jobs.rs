//! `/admin/jobs`: each background job, its period, its last run (outcome, duration, error)
//! and its recent runs, read through [`crate::app::jobs::overview`] as the API's.

use axum::extract::State;
use axum::response::IntoResponse;
use maud::html;

use super::instances::at;
use super::{PageResult, ops_layout, require_operator};
use crate::auth::CurrentUser;
use crate::state::AppState;

fn every(secs: u64) -> String {
    if secs.is_multiple_of(60) {
        format!("every {} min", secs / 60)
    } else {
        format!("every {secs} s")
    }
}

pub async fn page(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = require_operator(viewer)?;
    let jobs = crate::app::jobs::overview(&state).await?;
    Ok(ops_layout(
        "Jobs",
        Some(&op.0),
        html! {
            h1 { "Background jobs" }
            p { "Each job runs on its period and when nudged, on one server at a time. A server that finds another running a job skips that tick and records nothing." }
            div.scroll { table #jobs {
                thead { tr { th { "Job" } th { "Period" } th { "Last run" } th { "Outcome" } th { "Duration" } th { "Error" } } }
                tbody { @for j in &jobs {
                    tr #{ "job-" (j.name) } {
                        td.name { code { (j.name) } }
                        td.period { (every(j.every_secs)) }
                        @if let Some(r) = j.runs.first() {
                            td.last { (at(r.started_at)) }
                            td.outcome { (r.outcome) }
                            td.duration { (r.duration_ms) " ms" }
                            td.error { (r.error.as_deref().unwrap_or("")) }
                        } @else {
                            td.last { "never" } td.outcome {} td.duration {} td.error {}
                        }
                    }
                } }
            } }
            @for j in &jobs {
                h2 { "Recent runs of " code { (j.name) } }
                @if j.runs.is_empty() {
                    p.no-runs { "None yet." }
                } @else {
                    div.scroll { table.runs #{ "runs-" (j.name) } {
                        thead { tr { th { "Started" } th { "Outcome" } th { "Duration" } th { "Summary or error" } } }
                        tbody { @for r in &j.runs {
                            tr.run {
                                td { (at(r.started_at)) }
                                td.outcome { (r.outcome) }
                                td.duration { (r.duration_ms) " ms" }
                                td.detail { (r.error.as_deref().or(r.summary.as_deref()).unwrap_or("")) }
                            }
                        } }
                    } }
                }
            }
        },
    )
    .into_response())
}
