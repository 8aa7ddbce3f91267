//! The customer's instances and SSH keys (E1, G): plain forms that POST and redirect; every
//! rule is the API's own: keys through [`crate::app::ssh_keys`], creates and deletes through
//! [`crate::app::instances`]. The operator's view is [`super::admin_instances`], which
//! shares the words and the confirmation page defined here.

use std::collections::BTreeMap;

use axum::Form;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect};
use byo_wire::states::{InstancePhase, VmStatus};
use byo_wire::vm::{
    DeletionState, EndedQueuedView, InstanceRequest, InstanceView, NewSshKey, QueueEnding,
    QueuedView, SshKeyView,
};
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{Markup, html};
use serde::Deserialize;

use super::{PageError, PageResult, layout, signed_in};
use crate::app::instance_power;
use crate::app::instances::{self, CreateOutcome, Deleter};
use crate::app::queued;
use crate::app::ssh_keys;
use crate::auth::CurrentUser;
use crate::error::AppError;
use crate::error::deletion_status;
use crate::state::AppState;

/// What a deleting instance shows until its host confirms (G: requested, not gone).
pub const DELETING: &str = "deleting: waiting for the host to confirm";

/// One instance's state in words, from its phase.
pub(super) fn status_line(i: &InstanceView) -> &'static str {
    match i.phase() {
        InstancePhase::Deleted => "deleted",
        InstancePhase::NeverCreated => "failed: never created, not billed",
        InstancePhase::Deleting => DELETING,
        InstancePhase::Creating => "creating",
        InstancePhase::Running => "running",
        InstancePhase::Stopped => "stopped",
    }
}

/// Live (billed, holding its host): neither closed nor failed.
fn live(i: &InstanceView) -> bool {
    i.phase().is_live()
}

/// Whether a delete may be asked for: live and past its create.
pub(super) fn deletable(i: &InstanceView) -> bool {
    live(i) && i.status != VmStatus::Creating
}

pub(super) fn at(t: DateTime<Utc>) -> Markup {
    html! {
        time datetime=(t.to_rfc3339_opts(SecondsFormat::Millis, true)) {
            (t.format("%Y-%m-%d %H:%M:%S UTC"))
        }
    }
}

/// How long a stuck delete has waited, from notify-stuck-deletes' minutes.
pub(super) fn waited(minutes: i64) -> String {
    match minutes {
        m if m < 60 => format!("{m} min"),
        m if m < 24 * 60 => format!("{} h {} min", m / 60, m % 60),
        m => format!("{} d {} h", m / (24 * 60), (m % (24 * 60)) / 60),
    }
}

/// The refusals a page shows in place; the rest (a fault, a lapsed session) go to
/// [`PageError`].
pub(super) fn shown(e: AppError) -> Result<AppError, PageError> {
    match e {
        AppError::Internal(_) | AppError::Unauthenticated => Err(e.into()),
        refused => Ok(refused),
    }
}

// ---------------------------------------------------------------- the customer's page

#[derive(Default, Deserialize)]
pub struct KeyForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    public_key: String,
}

#[derive(Default, Deserialize)]
pub struct CreateForm {
    #[serde(default)]
    gpu_type: String,
    #[serde(default)]
    ssh_key_id: String,
}

/// What a render of the customer's page carries beside the rows.
#[derive(Default)]
struct Shown<'a> {
    error: Option<&'a str>,
    notice: Option<&'a str>,
    /// The key form as it was sent, when it was refused.
    key: Option<&'a KeyForm>,
    /// The create form as it was sent, when it was refused.
    create: Option<&'a CreateForm>,
    /// The refusal was billing's: the page links to /billing.
    pay: bool,
    /// What the action before this page did ([`Done`]): said at the top, its row marked.
    done: Option<&'a Done>,
}

/// What an action on this page did, carried by its redirect (`/instances?done=…&id=…`) so
/// the page says so at the top and marks the row, instead of the browser jumping down to
/// the row and scrolling the heading and navigation away (issue #42, 5).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Done {
    done: Option<DoneKind>,
    id: Option<String>,
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum DoneKind {
    Created,
    Queued,
    KeptWaiting,
    Deleted,
    Started,
    Stopped,
    Rebooting,
}

impl DoneKind {
    fn as_str(self) -> &'static str {
        match self {
            DoneKind::Created => "created",
            DoneKind::Queued => "queued",
            DoneKind::KeptWaiting => "kept_waiting",
            DoneKind::Deleted => "deleted",
            DoneKind::Started => "started",
            DoneKind::Stopped => "stopped",
            DoneKind::Rebooting => "rebooting",
        }
    }

    /// Where an action that did this sends the browser.
    fn to(self, id: &str) -> Redirect {
        Redirect::to(&format!("/instances?done={}&id={id}", self.as_str()))
    }
}

/// What to say of `done`, read against the lists as they are now (`None`: nothing of
/// theirs by that id, say nothing).
fn done_notice(done: &Done, list: &[InstanceView], queued: &[QueuedView]) -> Option<Markup> {
    let (kind, id) = (done.done?, done.id.as_deref()?);
    let instance = || list.iter().find(|i| i.id == id);
    let waiting = || queued.iter().find(|q| q.id == id);
    Some(match kind {
        DoneKind::Created => html! {
            (instance()?.name) " is created. Connect with the ssh line in its row; it is billed until you delete it."
        },
        DoneKind::Queued => {
            let q = waiting()?;
            html! {
                "No " (q.gpu_type) " host is free, so your create is queued (place " (q.position)
                " in line). It is placed on the next host that frees up, and nothing is billed until then; you are told when it starts."
            }
        }
        DoneKind::KeptWaiting => {
            html! { "Your queued create keeps waiting until " (at(waiting()?.expires_at)) "." }
        }
        DoneKind::Deleted => html! {
            (instance()?.name) " is deleted: its host confirmed, and billing stopped then."
        },
        DoneKind::Started => html! { (instance()?.name) " is started." },
        DoneKind::Stopped => html! {
            (instance()?.name) " is stopped. Start it again from its row, or delete it."
        },
        DoneKind::Rebooting => html! {
            (instance()?.name) " is rebooting: connect again in a minute."
        },
    })
}

/// The GPU kinds a user may ask for: those of every profile that is not staff-only, and
/// the staff-only ones (linux-test) for staff, and for everyone under `byo up`
/// (`Config::test_hosts_for_everyone`). (gpu_type, description), in profile order.
pub(super) async fn gpu_types(
    state: &AppState,
    v: &CurrentUser,
) -> Result<Vec<(String, String)>, PageError> {
    let mut seen = BTreeMap::new();
    let mut out = Vec::new();
    let may_test = v.is_operator() || state.config.test_hosts_for_everyone;
    for p in state.store.profiles().await? {
        if (!p.staff_only || may_test) && seen.insert(p.gpu_type.clone(), ()).is_none() {
            out.push((p.gpu_type, p.description));
        }
    }
    Ok(out)
}

async fn customer_page(
    state: &AppState,
    v: &CurrentUser,
    s: Shown<'_>,
) -> Result<Markup, PageError> {
    let keys = ssh_keys::list(state, v).await?;
    let list = instances::recent(state, v).await?;
    let queued = queued::mine(state, v).await?;
    let ended = queued::ended(state, v).await?;
    let kinds = gpu_types(state, v).await?;
    let mut capacity = Vec::with_capacity(kinds.len());
    for (kind, _) in &kinds {
        capacity.push(instances::capacity(state, kind, &v.user.sub).await?);
    }
    // What was sent again after a refusal; else the first kind a create would land on now.
    let picked_gpu = s.create.map(|c| c.gpu_type.as_str()).or_else(|| {
        kinds
            .iter()
            .zip(&capacity)
            .find(|(_, c)| matches!(c, instances::KindCapacity::Free(_)))
            .map(|((k, _), _)| k.as_str())
    });
    let picked_key = s.create.map(|c| c.ssh_key_id.as_str());
    let marked = s.done.and_then(|d| d.id.as_deref());
    Ok(layout(
        "Instances",
        Some(v),
        html! {
            h1 { "Your instances" }
            @if !state.billing.enabled() { p #billing-off role="status" { (crate::app::billing::BILLING_OFF) } }
            @if let Some(e) = s.error { p.error role="alert" { (e) } }
            @if s.pay { p #pay { a.button href="/billing" { "Add a payment method" } } }
            @if let Some(n) = s.notice { p.notice role="status" { (n) } }
            @if let Some(n) = s.done.and_then(|d| done_notice(d, &list, &queued)) { p.notice #done role="status" { (n) } }
            @if list.is_empty() {
                p #no-instances { "No instances yet." }
            } @else {
                div.scroll { table #instances {
                    thead { tr { th { "Name" } th { "GPU" } th { "Status" } th { "Connect" } th { "Created" } th { "Deleted" } th { "" } } }
                    tbody { @for i in &list { (instance_row(i, marked == Some(i.id.as_str()))) } }
                } }
                p { small { "Billing runs from an instance's creation until its host confirms the delete. An instance that was never created is not billed." } }
            }
            @if !queued.is_empty() {
                h2 { "Queued" }
                p { small { "No host of that kind was free. Each is placed on the next host that frees up, in order; nothing is billed until a host takes it. One no host took by its expiry is closed; keep waiting moves its expiry " (state.config.instances.queue_expires_after_hours) " hours from now." } }
                div.scroll { table #queued {
                    thead { tr { th { "GPU" } th { "Place in line" } th { "Queued" } th { "Expires" } th { "Last try" } th { "" } } }
                    tbody { @for q in &queued { (queued_row(q, marked == Some(q.id.as_str()))) } }
                } }
            }
            @if !ended.is_empty() {
                h3 { "Queued creates that ended this week" }
                div.scroll { table #queue-ended {
                    thead { tr { th { "GPU" } th { "Queued" } th { "Ended" } th { "How" } } }
                    tbody { @for e in &ended { (ended_row(e)) } }
                } }
            }
            h2 { "Create an instance" }
            @if keys.is_empty() {
                p #needs-key { "Add an SSH key first: an instance is reached with one of your keys." }
            }
            form #create method="post" action="/instances" {
                label { "GPU"
                    select name="gpu_type" required {
                        @for ((kind, description), c) in kinds.iter().zip(&capacity) {
                            option value=(kind) selected[picked_gpu == Some(kind.as_str())] {
                                (description) " (" (kind) ") — "
                                @match c {
                                    instances::KindCapacity::Free(n) => { (n) " free now" }
                                    instances::KindCapacity::NoneFree => { "none free now: a create waits in the queue" }
                                    instances::KindCapacity::NoneExist => { "no host of this kind yet: a create waits in the queue until one is added" }
                                }
                            }
                        }
                    }
                }
                label { "SSH key"
                    select name="ssh_key_id" required {
                        @for k in &keys {
                            option value=(k.id) selected[picked_key == Some(k.id.as_str())] { (k.name) " (" (k.fingerprint) ")" }
                        }
                    }
                }
                button type="submit" { "Create an instance" }
                small { "It goes on a free host of that kind. If none is free it is queued, and placed when one frees up; if the host does not answer, nothing is created and nothing is billed." }
            }
            h2 { "Your SSH keys" }
            @if keys.is_empty() {
                p #no-keys { "None yet." }
            } @else {
                div.scroll { table #ssh-keys {
                    thead { tr { th { "Name" } th { "Fingerprint" } th { "Added" } th { "" } } }
                    tbody { @for k in &keys { (key_row(k)) } }
                } }
                p { small { "Removing a key does not take it out of instances already created with it." } }
            }
            h3 { "Add a key" }
            form #add-key method="post" action="/instances/ssh-keys" {
                label { "Name"
                    input type="text" name="name" required maxlength="64" placeholder="laptop"
                        value=(s.key.map_or("", |k| k.name.as_str()));
                }
                label { "Public key (the contents of a .pub file)"
                    textarea name="public_key" required rows="3" spellcheck="false"
                        placeholder="ssh-ed25519 AAAA… you@laptop" {
                        (s.key.map_or("", |k| k.public_key.as_str()))
                    }
                }
                button type="submit" { "Add the key" }
            }
        },
    ))
}

/// `done`: the row the last action was about, marked.
fn instance_row(i: &InstanceView, done: bool) -> Markup {
    let command = i
        .ssh_command
        .as_deref()
        .filter(|_| live(i) && i.status == VmStatus::Running);
    html! {
        tr id={ "instance-" (i.id) } class=[done.then_some("done")] data-name=(i.name) {
            td.name { code { (i.name) } }
            td.gpu { (i.gpu_type) }
            td.status { (status_line(i)) }
            td.connect {
                @if let Some(c) = &command {
                    code #{ "ssh-" (i.id) } { (c) }
                    " "
                    button type="button" data-copy={ "ssh-" (i.id) } hidden { "Copy" }
                } @else { "—" }
                @if let Some(relay) = i.relay_address.as_deref().filter(|_| live(i)) {
                    br;
                    small.relay { "relay " (relay) }
                }
            }
            td.created { (at(i.created_at)) }
            td.deleted { @if let Some(d) = i.deleted_at { (at(d)) } @else { "—" } }
            td.actions {
                @if live(i) && i.delete_requested_at.is_none() && i.status.is_powered_state() {
                    form method="post" action={ "/instances/" (i.id) "/state" } {
                        @if i.status == VmStatus::Running {
                            button name="action" value="stop" { "Stop" }
                            " "
                            button name="action" value="reboot" { "Reboot" }
                        } @else {
                            button name="action" value="start" { "Start" }
                        }
                    }
                    " "
                }
                @if deletable(i) {
                    a.button href={ "/instances/" (i.id) "/delete" } {
                        (if i.delete_requested_at.is_some() { "Delete again" } else { "Delete" })
                    }
                }
            }
        }
    }
}

fn queued_row(q: &QueuedView, done: bool) -> Markup {
    html! {
        tr id={ "queued-" (q.id) } class=[done.then_some("done")] {
            td.gpu { (q.gpu_type) }
            td.position { (q.position) }
            td.created { (at(q.created_at)) }
            td.expires { (at(q.expires_at)) }
            td.last-error { (q.last_error.as_deref().unwrap_or("—")) }
            td.actions {
                form.inline method="post" action={ "/instances/queue/" (q.id) "/extend" } {
                    button type="submit" { "Keep waiting" }
                }
                " "
                form.inline method="post" action={ "/instances/queue/" (q.id) "/cancel" } {
                    button type="submit" { "Cancel" }
                }
            }
        }
    }
}

fn ended_row(e: &EndedQueuedView) -> Markup {
    let how = match e.ending {
        QueueEnding::Placed => "Placed on a host",
        QueueEnding::PlacedByOperator => "Placed on a host by an operator",
        QueueEnding::Cancelled => "Cancelled by you",
        QueueEnding::ClosedByOperator => "Closed by an operator",
        QueueEnding::Expired => {
            "Expired: no host of that kind was free in time; nothing was created or billed"
        }
    };
    html! {
        tr #{ "queue-ended-" (e.id) } {
            td.gpu { (e.gpu_type) }
            td.created { (at(e.created_at)) }
            td.closed { (at(e.closed_at)) }
            td.how { (how) }
        }
    }
}

/// `POST /instances/queue/{id}/extend`: as `POST /api/queue/{id}/extend`.
pub async fn extend_queued(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(queue_id): Path<String>,
) -> PageResult {
    let v = signed_in(viewer)?;
    match queued::extend(&state, &v, &queue_id).await {
        Ok(q) => Ok(DoneKind::KeptWaiting.to(&q.id).into_response()),
        Err(e) => customer_refusal(&state, &v, e, "no such queued create", Shown::default()).await,
    }
}

/// `POST /instances/queue/{id}/cancel`: as `DELETE /api/queue/{id}`.
pub async fn cancel_queued(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(queue_id): Path<String>,
) -> PageResult {
    let v = signed_in(viewer)?;
    match queued::cancel(&state, &v, &queue_id).await {
        Ok(()) => Ok(Redirect::to("/instances").into_response()),
        Err(e) => customer_refusal(&state, &v, e, "no such queued create", Shown::default()).await,
    }
}

fn key_row(k: &SshKeyView) -> Markup {
    html! {
        tr #{ "key-" (k.id) } {
            td.name { (k.name) }
            td.fingerprint { code { (k.fingerprint) } }
            td { (at(k.created_at)) }
            td {
                form.inline method="post" action={ "/instances/ssh-keys/" (k.id) "/remove" } {
                    button type="submit" { "Remove" }
                }
            }
        }
    }
}

/// Show a refusal on the customer's page, with the status the API would have answered.
async fn customer_refusal(
    state: &AppState,
    v: &CurrentUser,
    e: AppError,
    not_found: &str,
    s: Shown<'_>,
) -> PageResult {
    let e = shown(e)?;
    let message = match e {
        AppError::NotFound => not_found.to_owned(),
        ref other => other.to_string(),
    };
    let pay = e.code() == crate::app::instances::PAYMENT_REQUIRED;
    let page = customer_page(
        state,
        v,
        Shown {
            error: Some(&message),
            pay,
            ..s
        },
    )
    .await?;
    Ok((e.status(), page).into_response())
}

pub async fn page(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Query(done): Query<Done>,
) -> PageResult {
    let v = signed_in(viewer)?;
    let s = Shown {
        done: Some(&done),
        ..Shown::default()
    };
    Ok(customer_page(&state, &v, s).await?.into_response())
}

/// `POST /instances`: E1, as `POST /api/vms`.
pub async fn create(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Form(form): Form<CreateForm>,
) -> PageResult {
    let v = signed_in(viewer)?;
    let req = InstanceRequest {
        gpu_type: form.gpu_type.clone(),
        ssh_key_id: form.ssh_key_id.clone(),
    };
    match instances::create(&state, &v, &req).await {
        Ok(CreateOutcome::Created(created)) => {
            Ok(DoneKind::Created.to(&created.instance.id).into_response())
        }
        Ok(CreateOutcome::Queued(q)) => Ok(DoneKind::Queued.to(&q.queued.id).into_response()),
        Err(e) => {
            let s = Shown {
                create: Some(&form),
                ..Shown::default()
            };
            customer_refusal(&state, &v, e, "not found", s).await
        }
    }
}

/// `POST /instances/ssh-keys`: as `POST /api/ssh-keys`.
pub async fn add_key(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Form(form): Form<KeyForm>,
) -> PageResult {
    let v = signed_in(viewer)?;
    let req = NewSshKey {
        name: form.name.clone(),
        public_key: form.public_key.clone(),
    };
    match ssh_keys::add(&state, &v, &req).await {
        Ok(_) => Ok(Redirect::to("/instances").into_response()),
        Err(e) => {
            let s = Shown {
                key: Some(&form),
                ..Shown::default()
            };
            customer_refusal(&state, &v, e, "not found", s).await
        }
    }
}

/// `POST /instances/ssh-keys/{key_id}/remove`: as `DELETE /api/ssh-keys/{key_id}`.
pub async fn remove_key(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(key_id): Path<String>,
) -> PageResult {
    let v = signed_in(viewer)?;
    match ssh_keys::remove(&state, &v, &key_id).await {
        Ok(_) => Ok(Redirect::to("/instances").into_response()),
        Err(e) => {
            customer_refusal(
                &state,
                &v,
                e,
                "you have no SSH key with that id",
                Shown::default(),
            )
            .await
        }
    }
}

pub(super) fn confirm_page(
    v: &CurrentUser,
    i: &InstanceView,
    action: &str,
    back: &str,
    whose: Option<&str>,
) -> Markup {
    layout(
        "Delete an instance",
        Some(v),
        html! {
            h1 { "Delete " (i.name) "?" }
            @if let Some(owner) = whose { p { "It belongs to " strong { (owner) } "." } }
            p { "The container and its disk go for good. Billing stops when the host confirms it is gone; "
                "until then it shows as “" (DELETING) "”." }
            @if let Some(r) = i.delete_requested_at {
                p { "A delete was asked for at " (at(r)) " and the host has not confirmed it yet; this asks it again." }
            }
            form #confirm-delete method="post" action=(action) {
                button type="submit" { "Yes, delete " (i.name) }
            }
            p { a href=(back) { "No, keep it" } }
        },
    )
}

/// `GET /instances/{vm_id}/delete`: the confirmation step, readable without JavaScript.
pub async fn confirm_delete(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(vm_id): Path<String>,
) -> PageResult {
    let v = signed_in(viewer)?;
    let i = instances::get(&state, &v, &vm_id).await?;
    let action = format!("/instances/{vm_id}/delete");
    Ok(confirm_page(&v, &i, &action, "/instances", None).into_response())
}

/// `POST /instances/{vm_id}/delete`: G, as `DELETE /api/vms/{vm_id}`. Confirmed: back to
/// the list. Not confirmed in time: the list, with the reason, answering 202 as the API does.
pub async fn delete(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(vm_id): Path<String>,
) -> PageResult {
    let v = signed_in(viewer)?;
    match instances::delete(&state, Deleter::Owner(&v), &vm_id).await {
        Ok(d) if d.state == DeletionState::Deleted => {
            Ok(DoneKind::Deleted.to(&vm_id).into_response())
        }
        Ok(d) => {
            let notice = format!("{}: {}", d.instance.name, d.message);
            let page = customer_page(
                &state,
                &v,
                Shown {
                    notice: Some(&notice),
                    ..Shown::default()
                },
            )
            .await?;
            Ok((deletion_status(&d), page).into_response())
        }
        Err(e) => {
            customer_refusal(
                &state,
                &v,
                e,
                "you have no instance with that id",
                Shown::default(),
            )
            .await
        }
    }
}

#[derive(serde::Deserialize)]
pub struct PowerForm {
    action: byo_wire::vm::VmAction,
}

/// `POST /instances/{vm_id}/state`: start, stop or reboot, as `POST /api/vms/{vm_id}/state`.
pub async fn power(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(vm_id): Path<String>,
    axum::Form(form): axum::Form<PowerForm>,
) -> PageResult {
    let v = signed_in(viewer)?;
    match instance_power::change_power(&state, &v, &vm_id, form.action).await {
        Ok(_) => Ok(match form.action {
            byo_wire::vm::VmAction::Start => DoneKind::Started,
            byo_wire::vm::VmAction::Stop => DoneKind::Stopped,
            byo_wire::vm::VmAction::Reboot => DoneKind::Rebooting,
        }
        .to(&vm_id)
        .into_response()),
        Err(e) => {
            customer_refusal(
                &state,
                &v,
                e,
                "you have no instance with that id",
                Shown::default(),
            )
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_read_as_minutes_hours_and_days() {
        assert_eq!(waited(12), "12 min");
        assert_eq!(waited(61), "1 h 1 min");
        assert_eq!(waited(24 * 60 + 125), "1 d 2 h");
    }

    /// A stopped instance once showed "unknown" on /instances and /admin/instances while
    /// the API said "stopped": every status now has its own words.
    #[test]
    fn every_instance_status_is_shown_in_words() {
        let view = |status| InstanceView {
            id: "vm1".into(),
            name: "vm-abc".into(),
            gpu_type: "gb10".into(),
            status,
            ssh_hostname: None,
            relay_address: None,
            ssh_command: None,
            created_at: Utc::now(),
            creation_failed_at: None,
            delete_requested_at: None,
            deleted_at: None,
        };
        assert_eq!(status_line(&view(VmStatus::Stopped)), "stopped");
        assert_eq!(status_line(&view(VmStatus::Running)), "running");
        assert_eq!(status_line(&view(VmStatus::Creating)), "creating");
        for s in VmStatus::ALL {
            assert_ne!(status_line(&view(*s)), "unknown", "{s}");
        }
    }
}
