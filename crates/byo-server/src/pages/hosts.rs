//! The owner's GPUs ("Add a GPU", the one-liner, enrolment state) and the operator's hosts
//! and enrolments (what turned up, activation, revocation).

use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};
use byo_db::provisioning::EnrollmentView;
use byo_wire::Role;
use byo_wire::enroll::{ProvisionRequest, ProvisionResponse};
use maud::{Markup, html};
use serde::Deserialize;

use super::{PageError, PageResult, layout, require_operator};
use crate::auth::CurrentUser;
use crate::error::AppError;
use crate::routes::{admin_host_action, host_provision};
use crate::state::AppState;

fn may_provision(v: &CurrentUser) -> bool {
    v.has(Role::CommunityHost) || v.has(Role::Superadmin)
}

fn enrolment_state(e: &EnrollmentView) -> String {
    match (e.state.as_str(), e.prepared_at, e.active) {
        ("enrolled", _, Some(true)) => "active: renting to customers".into(),
        ("enrolled", Some(_), _) => "prepared: waiting for an operator's approval".into(),
        ("enrolled", None, _) => match e.prepare_state.as_ref().map(|s| &s.0) {
            Some(p) => format!(
                "preparing: {} {}{}",
                p["step"].as_str().unwrap_or("?"),
                p["state"].as_str().unwrap_or("?"),
                p["error"]
                    .as_str()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ),
            None => "enrolled: preparing".into(),
        },
        ("pending" | "ready", ..) => format!(
            "waiting for the command (expires {} UTC)",
            e.token_expires_at.format("%H:%M")
        ),
        ("rejected", ..) => format!("rejected: {}", e.reject_reason.as_deref().unwrap_or("")),
        (other, ..) => other.to_owned(),
    }
}

async fn gpus_page(
    state: &AppState,
    v: &CurrentUser,
    created: Option<&ProvisionResponse>,
    error: Option<&str>,
) -> Result<Markup, PageError> {
    let enrolments = state.store.enrollment_views(Some(&v.user.sub)).await?;
    let profiles = state.store.profiles().await?;
    Ok(layout(
        "Your GPUs",
        Some(v),
        html! {
            h1 { "Your GPUs" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            @if let Some(p) = created {
                section.created {
                    h2 { "Run this on your Spark" }
                    p { "Everything for " strong { (p.slug) } " is ready. Run this once, as a user who can sudo, on the machine itself. "
                        "It works until " strong { (p.expires_at.format("%H:%M UTC")) } " (one hour) and only once." }
                    pre { code #one-liner { (p.command) } }
                    button type="button" onclick="navigator.clipboard.writeText(document.getElementById('one-liner').textContent)" { "Copy" }
                    p { "This page will not show the command again." }
                }
            }
            @if may_provision(v) {
                h2 { "Add a GPU" }
                form method="post" action="/hosts" {
                    label { "What you are adding"
                        select name="profile_id" {
                            @for p in profiles.iter().filter(|p| !p.staff_only || v.is_operator()) {
                                option value=(p.id) { (p.id) " — " (p.description) }
                            }
                        }
                    }
                    button type="submit" { "Add a GPU" }
                }
            } @else {
                p { "To add a GPU, ask an operator for the community_host grant." }
            }
            h2 { "Enrolments" }
            @if enrolments.is_empty() { p { "None yet." } } @else {
                table {
                    thead { tr { th { "Host" } th { "Profile" } th { "State" } th { "Added" } } }
                    tbody { @for e in &enrolments { tr {
                        td { (e.slug.as_deref().unwrap_or("—")) }
                        td { (e.profile_id) }
                        td { (enrolment_state(e)) }
                        td { (e.created_at.format("%Y-%m-%d %H:%M")) }
                    } } }
                }
            }
        },
    ))
}

pub async fn gpus(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let Some(v) = viewer else {
        return Err(AppError::Unauthenticated.into());
    };
    Ok(gpus_page(&state, &v, None, None).await?.into_response())
}

pub async fn add_gpu(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Form(req): Form<ProvisionRequest>,
) -> PageResult {
    let Some(v) = viewer else {
        return Err(AppError::Unauthenticated.into());
    };
    match host_provision::provision(&state, &v, &req).await {
        Ok(created) => Ok((
            StatusCode::CREATED,
            gpus_page(&state, &v, Some(&created), None).await?,
        )
            .into_response()),
        Err(
            e @ (AppError::Forbidden(_) | AppError::Conflict { .. } | AppError::BadRequest { .. }),
        ) => Ok((
            e.status(),
            gpus_page(&state, &v, None, Some(&e.to_string())).await?,
        )
            .into_response()),
        Err(e) => Err(e.into()),
    }
}

async fn admin_page(
    state: &AppState,
    op: &crate::auth::Operator,
    error: Option<&str>,
) -> Result<Markup, PageError> {
    let enrolments = state.store.enrollment_views(None).await?;
    Ok(layout(
        "Hosts",
        Some(&op.0),
        html! {
            h1 { "Hosts and enrolments" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            p { "Activation is the only thing between an enrolled machine and a paying customer. It is offered once preparation has finished; the backend refuses it otherwise, whatever sends it." }
            table {
                thead { tr { th { "Host" } th { "Owner" } th { "Profile" } th { "State" } th { "Relay" } th { "What turned up" } th { "" } } }
                tbody { @for e in &enrolments { tr {
                    td { (e.slug.as_deref().unwrap_or("—")) }
                    td { (e.owner_email) }
                    td { (e.profile_id) }
                    td { (enrolment_state(e)) }
                    td { (e.relay_state.as_deref().unwrap_or("—")) }
                    td { @if let Some(f) = &e.fingerprint { code { (f.0.to_string()) } } }
                    td {
                        @if let (Some(host_id), Some(_), Some(false)) = (&e.host_id, e.prepared_at, e.active) {
                            form.inline method="post" action={ "/admin/hosts/" (host_id) "/activate" } {
                                input type="hidden" name="placement" value="shared";
                                button type="submit" { "Activate" }
                            }
                        }
                        @if matches!(e.state.as_str(), "pending" | "ready") {
                            form.inline method="post" action={ "/admin/enrollments/" (e.id) "/revoke" } {
                                button type="submit" { "Revoke" }
                            }
                        }
                    }
                } } }
            }
        },
    ))
}

pub async fn admin_hosts(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = require_operator(viewer)?;
    Ok(admin_page(&state, &op, None).await?.into_response())
}

#[derive(Deserialize)]
pub struct ActivateForm {
    placement: String,
}

pub async fn activate(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
    Form(form): Form<ActivateForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    match admin_host_action::activate(&state, &op, &host_id, &form.placement).await {
        Ok(()) => Ok(Redirect::to("/admin/hosts").into_response()),
        Err(e @ (AppError::Conflict { .. } | AppError::BadRequest { .. } | AppError::NotFound)) => {
            Ok((
                e.status(),
                admin_page(&state, &op, Some(&e.to_string())).await?,
            )
                .into_response())
        }
        Err(e) => Err(e.into()),
    }
}

pub async fn revoke(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(enrollment_id): Path<String>,
) -> PageResult {
    let op = require_operator(viewer)?;
    if !state.store.revoke_enrollment(&enrollment_id).await? {
        let e = AppError::conflict(
            "not_revocable",
            "only an enrolment that has not redeemed can be revoked",
        );
        return Ok((
            e.status(),
            admin_page(&state, &op, Some(&e.to_string())).await?,
        )
            .into_response());
    }
    crate::reap::reap_once(&state).await?;
    Ok(Redirect::to("/admin/hosts").into_response())
}
