//! The operator's view of every live instance and of the deletes no host confirmed
//! (`/admin/instances`); the operator's delete and the stuck list go through
//! [`crate::app::admin_vm_action`], the same path as the API's.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect};
use byo_wire::vm::{DeletionState, InstanceView};
use maud::{Markup, html};

use super::instances::{at, confirm_page, deletable, shown, status_line, waited};
use super::{PageError, PageResult, ops_layout, require_operator};
use crate::app::admin_vm_action;
use crate::app::instances;
use crate::app::notify_stuck_deletes::STUCK_AFTER_MINUTES;
use crate::auth::{CurrentUser, Operator};
use crate::error::AppError;
use crate::error::deletion_status;
use crate::state::AppState;

/// One live instance as operators see it.
struct Live {
    instance: InstanceView,
    host: String,
    owner: String,
}

/// Every live instance, oldest first, with its host's slug and its owner's email.
async fn every_live(state: &AppState) -> Result<Vec<Live>, PageError> {
    let rows = state.store.live_vms().await?;
    let vms: Vec<_> = rows.iter().map(|r| r.vm.clone()).collect();
    let views = instances::views(state, &vms).await?;
    Ok(rows
        .into_iter()
        .zip(views)
        .map(|(r, instance)| Live {
            instance,
            host: r.host_slug.unwrap_or_else(|| "—".to_owned()),
            owner: r.owner_email,
        })
        .collect())
}

async fn operator_page(
    state: &AppState,
    op: &Operator,
    error: Option<&str>,
    notice: Option<&str>,
) -> Result<Markup, PageError> {
    let emails: HashMap<String, String> = state
        .store
        .users_overview()
        .await?
        .into_iter()
        .map(|u| (u.user.sub, u.user.email))
        .collect();
    let live = every_live(state).await?;
    let stuck = admin_vm_action::stuck_deletes(state, None).await?;
    let email = |sub: &str| emails.get(sub).cloned().unwrap_or_else(|| sub.to_owned());
    Ok(ops_layout(
        "Instances",
        Some(&op.0),
        html! {
            h1 { "Instances" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            @if let Some(n) = notice { p.notice role="status" { (n) } }
            h2 { "Stuck deletes" }
            p { "Deletes requested more than " (STUCK_AFTER_MINUTES) " minutes ago that no host has confirmed: still billed, their hosts still held. Deleting again asks the host again." }
            @if stuck.is_empty() {
                p #no-stuck { "None." }
            } @else {
                div.scroll { table #stuck {
                    thead { tr { th { "Instance" } th { "Host" } th { "Owner" } th { "Requested" } th { "Waiting" } th { "" } } }
                    tbody { @for s in &stuck {
                        tr #{ "stuck-" (s.vm_id) } data-name=(s.name) {
                            td.name { code { (s.name) } }
                            td.host { (s.host_slug.as_deref().or(s.host_id.as_deref()).unwrap_or("—")) }
                            td.owner { (email(&s.user_sub)) }
                            td.requested { (at(s.delete_requested_at)) }
                            td.waiting { (waited(s.waiting_minutes)) }
                            td { a.button href={ "/admin/instances/" (s.vm_id) "/delete" } { "Delete again" } }
                        }
                    } }
                } }
            }
            h2 { "Live instances" }
            @if live.is_empty() {
                p #no-instances { "None." }
            } @else {
                div.scroll { table #instances {
                    thead { tr { th { "Instance" } th { "Host" } th { "Owner" } th { "GPU" } th { "Status" } th { "Created" } th { "" } } }
                    tbody { @for l in &live {
                        tr #{ "instance-" (l.instance.id) } data-name=(l.instance.name) {
                            td.name { code { (l.instance.name) } }
                            td.host { (l.host) }
                            td.owner { (l.owner) }
                            td.gpu { (l.instance.gpu_type) }
                            td.status { (status_line(&l.instance)) }
                            td.created { (at(l.instance.created_at)) }
                            td.actions { @if deletable(&l.instance) {
                                a.button href={ "/admin/instances/" (l.instance.id) "/delete" } {
                                    (if l.instance.delete_requested_at.is_some() { "Delete again" } else { "Delete" })
                                }
                            } }
                        }
                    } }
                } }
            }
        },
    ))
}

async fn operator_refusal(state: &AppState, op: &Operator, e: AppError) -> PageResult {
    let e = shown(e)?;
    let message = match e {
        AppError::NotFound => "there is no instance with that id".to_owned(),
        ref other => other.to_string(),
    };
    let page = operator_page(state, op, Some(&message), None).await?;
    Ok((e.status(), page).into_response())
}

pub async fn page(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = require_operator(viewer)?;
    Ok(operator_page(&state, &op, None, None)
        .await?
        .into_response())
}

/// `GET /admin/instances/{vm_id}/delete`: the operator's confirmation step.
pub async fn confirm_delete(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(vm_id): Path<String>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let row = state.store.vm(&vm_id).await?.ok_or(AppError::NotFound)?;
    let owner = state
        .store
        .user(&row.user_sub)
        .await?
        .map_or_else(|| row.user_sub.clone(), |u| u.email);
    let action = format!("/admin/instances/{vm_id}/delete");
    Ok(confirm_page(
        &op.0,
        &instances::view(&state, &row).await?,
        &action,
        "/admin/instances",
        Some(&owner),
    )
    .into_response())
}

/// `POST /admin/instances/{vm_id}/delete`: admin-vm-action's delete
/// (`POST /api/admin/vms/{vm_id}/delete`), the same path as the customer's.
pub async fn delete(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(vm_id): Path<String>,
) -> PageResult {
    let op = require_operator(viewer)?;
    match admin_vm_action::delete(&state, &op, &vm_id).await {
        Ok(d) if d.state == DeletionState::Deleted => {
            Ok(Redirect::to("/admin/instances").into_response())
        }
        Ok(d) => {
            let notice = format!("{}: {}", d.instance.name, d.message);
            let page = operator_page(&state, &op, None, Some(&notice)).await?;
            Ok((deletion_status(&d), page).into_response())
        }
        Err(e) => operator_refusal(&state, &op, e).await,
    }
}
