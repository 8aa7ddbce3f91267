//! `/admin/queue`: every open queued create (who, which GPU, how long, how many tries, why
//! the last one did not place it), with the operator's two actions (E0's caller 4): place
//! it on a host they name, and close it. The rules are [`crate::app::queue_drain`]'s.

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect};
use maud::{Markup, html};
use serde::Deserialize;

use super::instances::{at, shown};
use super::{PageResult, ops_layout, require_operator};
use crate::app::queue_drain;
use crate::app::queued;
use crate::auth::{CurrentUser, Operator};
use crate::error::AppError;
use crate::state::AppState;

#[derive(Default, Deserialize)]
pub struct PlaceForm {
    #[serde(default)]
    host_id: String,
}

#[derive(Default, Deserialize)]
pub struct CloseForm {
    #[serde(default)]
    reason: String,
}

async fn render(
    state: &AppState,
    op: &Operator,
    error: Option<&str>,
) -> Result<Markup, super::PageError> {
    let rows = queued::open_rows(state).await?;
    let now = state.clock.now();
    Ok(ops_layout(
        "Queue",
        Some(&op.0),
        html! {
            h1 { "The queue" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            p { "Creates no host could take, oldest first. The drain places them when a host frees up and on its period; a row is placed by hand on a host you name (a dedicated owner's box the picker cannot reach), or closed." }
            @if rows.is_empty() {
                p #queue-empty { "Nothing is queued." }
            } @else {
                div.scroll { table #queue {
                    thead { tr { th { "User" } th { "GPU" } th { "Place" } th { "Queued" } th { "Waiting" } th { "Expires" } th { "Tries" } th { "Last reason" } th { "Place on host" } th { "Close" } } }
                    tbody { @for r in &rows {
                        tr #{ "queued-" (r.queued.id) } {
                            td.user { (r.email) }
                            td.gpu { (r.queued.gpu_type) }
                            td.position { (r.queued.position) }
                            td.created { (at(r.queued.created_at)) }
                            td.age { (super::instances::waited(now.signed_duration_since(r.queued.created_at).num_minutes().max(0))) }
                            td.expires { (at(r.queued.expires_at)) }
                            td.attempts { (r.queued.attempts) }
                            td.last-error { (r.queued.last_error.as_deref().unwrap_or("—")) }
                            td {
                                form.inline method="post" action={ "/admin/queue/" (r.queued.id) "/place" } {
                                    input type="text" name="host_id" required placeholder="host id";
                                    button type="submit" { "Place" }
                                }
                            }
                            td {
                                form.inline method="post" action={ "/admin/queue/" (r.queued.id) "/close" } {
                                    input type="text" name="reason" required placeholder="why";
                                    button type="submit" { "Close" }
                                }
                            }
                        }
                    } }
                } }
            }
        },
    ))
}

pub async fn page(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = require_operator(viewer)?;
    Ok(render(&state, &op, None).await?.into_response())
}

async fn refusal(state: &AppState, op: &Operator, e: AppError) -> PageResult {
    let e = shown(e)?;
    let message = match e {
        AppError::NotFound => "no such queued create".to_owned(),
        ref other => other.to_string(),
    };
    let page = render(state, op, Some(&message)).await?;
    Ok((e.status(), page).into_response())
}

/// `POST /admin/queue/{id}/place`: as `POST /api/admin/queue/{id}/place`.
pub async fn place(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(queue_id): Path<String>,
    Form(form): Form<PlaceForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    match queue_drain::place_by_operator(&state, &op.0, &queue_id, form.host_id.trim()).await {
        Ok(_) => Ok(Redirect::to("/admin/queue").into_response()),
        Err(e) => refusal(&state, &op, e).await,
    }
}

/// `POST /admin/queue/{id}/close`: as `POST /api/admin/queue/{id}/close`.
pub async fn close(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(queue_id): Path<String>,
    Form(form): Form<CloseForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    match queued::close_by_operator(&state, &op.0, &queue_id, &form.reason).await {
        Ok(()) => Ok(Redirect::to("/admin/queue").into_response()),
        Err(e) => refusal(&state, &op, e).await,
    }
}
