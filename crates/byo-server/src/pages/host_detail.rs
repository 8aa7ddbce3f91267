//! `/admin/hosts/{host_id}`: one host on one page (issue #12, 8) — its heartbeat and what it
//! last reported, its agent build, preparation, operator-key list, instances and stuck
//! deletes, revoke/retire progress, its audit trail, and the actions with what each does.
//! Everything an agent wrote is cut to a bound before it is rendered.

use axum::Form;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect};
use byo_wire::states::RevokeStep;
use chrono::{DateTime, Utc};
use maud::{Markup, html};
use serde::Deserialize;

use super::{PageError, PageResult, ops_layout, require_operator};
use crate::app::host_lifecycle::{self, REASON_MAX_CHARS};
use crate::auth::{CurrentUser, Operator};
use crate::error::AppError;
use crate::state::AppState;

/// How much of any agent-written value the page shows.
const SHOWN_CHARS: usize = 200;
const SHOWN_DETAILS_BYTES: usize = 2048;
const SHOWN_INSTANCES: i64 = 20;
const SHOWN_AUDIT: i64 = 50;
/// Attributable logins shown (#16, 5), newest first.
pub(crate) const SHOWN_LOGINS: i64 = 20;
/// The customer-path walks the host page lists, newest first.
const SHOWN_WALKS: i64 = 5;

/// `s` cut to `n` characters, with an ellipsis when cut.
pub(crate) fn cut(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().count() > n {
        out.push('…');
    }
    out
}

/// An audit entry's details as "name: value" lines, never raw JSON on the page (issue #42,
/// 2); a long value is cut and wraps where it must.
fn fields(details: &serde_json::Value) -> maud::Markup {
    let shown = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => cut(s, SHOWN_CHARS),
        serde_json::Value::Null => "—".to_owned(),
        other => cut(&other.to_string(), SHOWN_CHARS),
    };
    maud::html! {
        @if let Some(map) = details.as_object().filter(|m| !m.is_empty()) {
            ul.fields {
                @for (name, v) in map { li { span.k { (name.replace('_', " ")) } ": " span.v { (shown(v)) } } }
            }
        } @else if details.is_null() || details.is_object() {
            "—"
        } @else {
            span.v { (shown(details)) }
        }
    }
}

fn at(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// "42 s", "7 min", "3 h", "2 d".
fn age(now: DateTime<Utc>, t: DateTime<Utc>) -> String {
    let s = (now - t).num_seconds().max(0);
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

async fn page(
    state: &AppState,
    op: &Operator,
    host_id: &str,
    notice: Option<&str>,
    error: Option<&str>,
) -> Result<Markup, PageError> {
    let store = &state.store;
    let host = store.host(host_id).await?.ok_or(AppError::NotFound)?;
    let life = store
        .host_lifecycle(host_id)
        .await?
        .ok_or(AppError::NotFound)?;
    let owner = store.user(&host.owner_sub).await?;
    let status = store.host_status(host_id).await?;
    let nodes = store.host_nodes(host_id).await?;
    let push = store
        .key_push_status()
        .await?
        .into_iter()
        .find(|k| k.host_id == host_id);
    let published_list = store.published_key_list().await?;
    let published = published_list.as_ref().map(|l| l.version);
    let vms = store.vms_of_host(host_id, SHOWN_INSTANCES).await?;
    let audit = store.audit_of_host(host_id, SHOWN_AUDIT).await?;
    let relay = store.relay_record(host_id).await?;
    let logins = store.operator_logins(host_id, SHOWN_LOGINS).await?;
    let now = state.clock.now();
    let bench = store.host_bench(host_id).await?;
    let walks = store.path_walks_of(host_id, SHOWN_WALKS).await?;
    let walk = walks.first();
    // The walk activation reads: one since the preparation finished (issue #38, 4).
    let walk_failed = host
        .prepared_at
        .is_some_and(|p| crate::app::path_walk::failed_since(walk, p));
    let problems = crate::app::host_problems::problems(
        &crate::app::host_problems::Seen {
            host: &host,
            status: status.as_ref(),
            heard_since: state.config.placement.seen_since(now),
            push: push.as_ref(),
            published: published_list.as_ref(),
            published_expires: crate::app::host_problems::list_expiry(published_list.as_ref()),
            vms: &vms,
            bench: bench.as_ref(),
        },
        now,
    );
    let live = vms.iter().filter(|v| v.phase().is_live()).count();
    let stuck: Vec<_> = vms
        .iter()
        .filter(|v| v.phase() == byo_wire::states::InstancePhase::Deleting)
        .collect();
    let revoke = life.revoke_step.0;
    let revoking = matches!(
        revoke,
        Some(RevokeStep::Draining | RevokeStep::RemovingAccess)
    );
    let retired = life.retired_at.is_some();
    let enrolled = life.pubkey.is_some();
    let state_line = if retired {
        "retired".to_owned()
    } else if let Some(step) = revoke {
        match step {
            RevokeStep::Revoked => "revoked".to_owned(),
            s => format!("revoke in progress, stopped at {s}: run revoke again to resume"),
        }
    } else if host.active {
        format!(
            "active ({})",
            cut(host.placement.as_deref().unwrap_or("—"), 64)
        )
    } else if life.depooled_at.is_some() {
        "de-pooled".to_owned()
    } else if host.prepared_at.is_some() {
        "prepared, not activated".to_owned()
    } else if enrolled {
        "enrolled, preparing".to_owned()
    } else {
        "not enrolled".to_owned()
    };
    let action = |path: &str| format!("/admin/hosts/{host_id}/{path}");
    Ok(ops_layout(
        &format!("Host {}", host.slug),
        Some(&op.0),
        html! {
            p { a href="/admin/hosts" { "← Hosts" } }
            h1 { "Host " (host.slug) }
            @if let Some(n) = notice { p.notice role="status" { (n) } }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            h2 { "Problems" }
            @if problems.is_empty() { p #problems { "None seen." } } @else {
                ul #problems { @for p in &problems {
                    li.problem { strong { (p.name) } ": " (cut(&p.detail, SHOWN_CHARS)) }
                } }
            }
            dl.facts #host-state {
                dt { "State" } dd.state { (state_line) }
                @if let (Some(when), false) = (life.depooled_at, host.active) {
                    dt { "De-pooled" } dd.depool {
                        (at(when)) ": " (cut(life.depool_reason.as_deref().unwrap_or("—"), SHOWN_CHARS))
                    }
                }
                @if let Some(when) = life.revoke_requested_at {
                    dt { "Revoke" } dd.revoke {
                        "requested " (at(when)) ", step " (revoke.map_or("—", RevokeStep::as_str))
                        @if let Some(done) = life.revoked_at { ", finished " (at(done)) }
                    }
                }
                @if let Some(when) = life.retired_at { dt { "Retired" } dd { (at(when)) } }
                dt { "Owner" } dd { (owner.as_ref().map_or(host.owner_sub.as_str(), |u| u.email.as_str())) }
                dt { "Profile" } dd { (host.profile_id) " (" (host.gpu_type) ")" }
                dt { "Relay" } dd.relay {
                    @if let Some(retired) = life.retired_at {
                        // Retire released it (N): its last state no longer describes anything.
                        "released when the host was retired, " (at(retired))
                    } @else {
                        (cut(host.relay_name.as_deref().unwrap_or("—"), 64)) " at "
                        (relay.relay_ip.as_deref().unwrap_or("no address"))
                        ", " (relay.relay_state.0.map_or("—", |s| s.as_str()))
                        @if let Some(e) = &relay.relay_error { " (" (cut(e, SHOWN_CHARS)) ")" }
                    }
                }
            }
            h2 { "Heartbeat" }
            @match &status {
                None => p #heartbeat { "No heartbeat yet." }
                Some(s) => {
                    dl.facts #heartbeat {
                        dt { "Last seen" } dd.seen { (at(s.seen_at)) " (" (age(now, s.seen_at)) " ago)" }
                        dt { "Agent build" } dd.agent { (cut(s.agent_version.as_deref().unwrap_or("—"), 64)) }
                        @for (name, v) in [("LXD", &s.lxd), ("Relay", &s.relay), ("Tunnel", &s.tunnel), ("GPU", &s.gpu), ("Storage", &s.storage)] {
                            dt { (name) } dd { (cut(v.as_deref().unwrap_or("—"), SHOWN_CHARS)) }
                        }
                        dt { "Instances" } dd { (s.instances.map_or("—".to_owned(), |n| n.to_string())) }
                    }
                    @let details = serde_json::to_string(&s.details.0).unwrap_or_default();
                    details.reported {
                        summary { "As reported" }
                        pre { code { (cut_bytes(&details, SHOWN_DETAILS_BYTES)) } }
                    }
                }
            }
            h2 { "Preparation" }
            p #prepare {
                @match (&host.prepared_at, &host.prepare_state) {
                    (Some(t), Some(p)) if p.0.failed() => {
                        "finished " (at(*t)) "; prepared again since, which stopped at: "
                        (cut(&crate::app::owner_hosts::step_line(&p.0), SHOWN_CHARS))
                    }
                    (Some(t), _) => { "finished " (at(*t)) }
                    (None, Some(p)) => { "stopped at: " (cut(&crate::app::owner_hosts::step_line(&p.0), SHOWN_CHARS)) }
                    (None, None) => { "not started" }
                }
                @if nodes.len() > 1 { " — " (nodes.len()) " nodes" }
            }
            h2 { "Customer path" }
            @if walks.is_empty() {
                p #walks { "Not walked yet. Activation walks it first: a scratch instance is made, logged in to over ssh through the relay as a customer would, and deleted." }
            } @else {
                ul #walks { @for w in &walks { li { (cut(&crate::app::path_walk::sentence(w), SHOWN_CHARS)) } } }
            }
            h2 { "Operator keys" }
            p #keys {
                @match &push {
                    Some(k) => {
                        "holds version " (k.version.map_or("none".to_owned(), |v| v.to_string()))
                        @if let Some(p) = published { " of published " (p) }
                        @if let Some(t) = k.attempted_at { ", last push " (at(t)) }
                        @if let Some(e) = &k.error { ", failed: " (cut(e, SHOWN_CHARS)) }
                    }
                    None => "—",
                }
            }
            h2 { "Operator logins" }
            @if logins.is_empty() { p #logins { "None reported." } } @else {
                div.scroll { table #logins {
                    thead { tr { th { "When" } th { "Operator" } th { "Key" } th { "From" } } }
                    tbody { @for l in &logins { tr {
                        td { (at(l.logged_in_at)) }
                        td {
                            @match &l.user_sub {
                                Some(sub) => { (cut(l.operator_name.as_deref().unwrap_or("—"), 64)) " (" (cut(sub, 64)) ")" }
                                None => { strong { "not an operator key" } }
                            }
                        }
                        td {
                            (cut(l.key_label.as_deref().unwrap_or(""), 64)) " " code { (cut(&l.fingerprint, 80)) }
                            @if let Some(cert) = &l.certificate {
                                " " strong.break-glass { "break glass" } ": " code { (cut(cert, 200)) }
                            }
                        }
                        td { (cut(&l.source, 45)) " port " (l.source_port) }
                    } } }
                } }
            }
            h2 { "Instances" }
            @if vms.is_empty() { p #instances { "None." } } @else {
                div.scroll { table #instances {
                    thead { tr { th { "Name" } th { "Status" } th { "Created" } th { "Delete requested" } th { "Ended" } } }
                    tbody { @for v in &vms { tr {
                        td { (cut(&v.name, 64)) }
                        td { (v.status.as_str()) }
                        td { (at(v.created_at)) }
                        td { (v.delete_requested_at.map(at).unwrap_or_default()) }
                        td {
                            @if let Some(t) = v.deleted_at { "deleted " (at(t)) }
                            @else if let Some(t) = v.creation_failed_at { "create failed " (at(t)) }
                            @else { "live" }
                        }
                    } } }
                } }
            }
            h2 { "Stuck deletes" }
            @if stuck.is_empty() { p #stuck { "None." } } @else {
                ul #stuck { @for v in &stuck {
                    li { (cut(&v.name, 64)) ": requested " (v.delete_requested_at.map(at).unwrap_or_default()) ", not confirmed by the host" }
                } }
            }
            h2 { "Actions" }
            @if retired {
                p { "Retired: nothing more can be done to this host." }
            } @else {
                div.actions #actions {
                    @if host.prepared_at.is_some() && !host.active && !revoking && revoke.is_none() {
                        @if let Some(prepared_at) = host.prepared_at {
                            (super::hosts::activate_form(&host.id, prepared_at, walk))
                        }
                        p.what {
                            "Puts it in placement (shared): customers may land on it. "
                            @if walk_failed { "Its customer path failed its walk (above): walk it again once mended, or give your reason to activate anyway (audited)." }
                            @else { "Walks its customer path first unless that has passed since its preparation." }
                        }
                    }
                    @if host.prepared_at.is_some() && !host.active && live == 0 && revoke.is_none() {
                        form.inline method="post" action=(action("walk")) {
                            button type="submit" { "Walk the customer path" }
                        }
                        p.what { "Makes a scratch instance, logs in to it over ssh through the relay exactly as a customer would, runs hostname and deletes it, timing each leg. Takes up to a few minutes." }
                    }
                    form.inline method="post" action=(action("depool")) {
                        input type="text" name="reason" required maxlength=(REASON_MAX_CHARS) placeholder="why";
                        button type="submit" { "De-pool" }
                    }
                    p.what { "Takes it out of placement (no new customers), with the reason, audited. Its instance stays until it ends or is deleted; activation brings it back." }
                    @if enrolled && revoke != Some(RevokeStep::Revoked) {
                        form.inline method="post" action=(action("revoke")) {
                            @if !revoking { (type_to_confirm(&host.slug)) }
                            button type="submit" { @if revoking { "Resume revoke" } @else { "Revoke" } }
                        }
                        p.what { "De-pools, deletes its instances and waits for the host to confirm each (" (live) " live), then releases its relay, tunnel and DNS and clears its tokens. The machine stays configured; it is not retired. A host that does not answer leaves the revoke stopped at its step; revoke again resumes it." }
                    }
                    form.inline method="post" action=(action("retire")) {
                        (type_to_confirm(&host.slug))
                        button type="submit" { "Retire" }
                    }
                    p.what { "Releases its relay and address, tunnel and every DNS record (with *." (host.slug) ".ssh), then stamps it retired for good; its machines may enrol again. Refused while active, dedicated, holding a live instance or an unended pre-booking, or never enrolled." }
                    form.inline method="post" action=(action("reboot")) {
                        button type="submit" { "Reboot" }
                    }
                    p.what { "Reboots the host's machines (a pair's node1 first, then node0), as the customer's reboot of a pair's instance does. The instance comes back as it was; a node1 that does not answer does not block it." }
                    @if enrolled && revoke.is_none() {
                        form.inline method="post" action=(action("replace-relay")) {
                            button type="submit" { "Replace relay" }
                        }
                        p.what { "Releases " (cut(host.relay_name.as_deref().unwrap_or("its relay"), 64)) " and provisions it again with the key the host trusts; the host learns the new endpoint from GET /api/host/relay." }
                    }
                }
            }
            h2 { "Audit trail" }
            @if audit.is_empty() { p #audit { "Nothing yet." } } @else {
                div.scroll { table #audit {
                    thead { tr { th { "When" } th { "What" } th { "Details" } } }
                    tbody { @for a in &audit { tr {
                        td { (at(a.at)) }
                        td { (cut(&a.action, 64)) }
                        td { (fields(&a.details.0)) }
                    } } }
                } }
            }
        },
    ))
}

fn cut_bytes(s: &str, n: usize) -> String {
    let mut end = s.len().min(n);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    if end < s.len() {
        format!("{}… (cut: {end} of {} bytes)", &s[..end], s.len())
    } else {
        s.to_owned()
    }
}

pub async fn show(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
) -> PageResult {
    let op = require_operator(viewer)?;
    Ok(page(&state, &op, &host_id, None, None)
        .await?
        .into_response())
}

/// An action's outcome: back to the page (303), or the page with the refusal.
async fn answer(
    state: &AppState,
    op: &Operator,
    host_id: &str,
    outcome: Result<Option<String>, AppError>,
) -> PageResult {
    match outcome {
        Ok(None) => Ok(Redirect::to(&format!("/admin/hosts/{host_id}")).into_response()),
        Ok(Some(notice)) => Ok(page(state, op, host_id, Some(&notice), None)
            .await?
            .into_response()),
        Err(
            e @ (AppError::Conflict { .. } | AppError::BadRequest { .. } | AppError::Host { .. }),
        ) => Ok((
            e.status(),
            page(state, op, host_id, None, Some(&e.to_string())).await?,
        )
            .into_response()),
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
pub struct DepoolForm {
    reason: String,
}

pub async fn depool(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
    Form(form): Form<DepoolForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let out = host_lifecycle::depool(&state, &op, &host_id, &form.reason)
        .await
        .map(|()| None);
    answer(&state, &op, &host_id, out).await
}

/// What an operator typed to confirm an action that cannot be undone.
#[derive(Deserialize)]
pub struct ConfirmForm {
    #[serde(default)]
    confirm: String,
}

/// The field asking for the host's name before an action that cannot be undone (issue #42, 7).
fn type_to_confirm(slug: &str) -> Markup {
    html! {
        label.confirm { "Type " code { (slug) } " to confirm "
            input type="text" name="confirm" required autocomplete="off" spellcheck="false" placeholder=(slug);
        }
    }
}

/// None when `typed` is the host's name; otherwise the refusal, nothing done.
async fn unconfirmed(
    state: &AppState,
    host_id: &str,
    typed: &str,
    what: &str,
) -> Result<Option<AppError>, PageError> {
    let host = state.store.host(host_id).await?.ok_or(AppError::NotFound)?;
    Ok((typed.trim() != host.slug).then(|| {
        AppError::bad_request(
            "not_confirmed",
            format!(
                "to {what} this host, type its name ({}) in the box beside the button; nothing was done",
                host.slug
            ),
        )
    }))
}

pub async fn revoke(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
    Form(form): Form<ConfirmForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    // Resuming a revoke under way needs no second confirmation: it was confirmed when it began.
    let under_way = state
        .store
        .host_lifecycle(&host_id)
        .await?
        .is_some_and(|l| l.revoke_step.0.is_some());
    if !under_way
        && let Some(refused) = unconfirmed(&state, &host_id, &form.confirm, "revoke").await?
    {
        return answer(&state, &op, &host_id, Err(refused)).await;
    }
    let out = host_lifecycle::revoke(&state, &op, &host_id)
        .await
        .map(|p| Some(p.message));
    answer(&state, &op, &host_id, out).await
}

pub async fn retire(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
    Form(form): Form<ConfirmForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    if let Some(refused) = unconfirmed(&state, &host_id, &form.confirm, "retire").await? {
        return answer(&state, &op, &host_id, Err(refused)).await;
    }
    let out = host_lifecycle::retire(&state, &op, &host_id)
        .await
        .map(|()| None);
    answer(&state, &op, &host_id, out).await
}

/// Issue #38, 4: the host's customer path walked now; the page says how it went.
pub async fn walk(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let out = crate::app::path_walk::walk(&state, &host_id, Some(&op.0.user.sub))
        .await
        .map(|w| Some(crate::app::path_walk::sentence(&w)));
    answer(&state, &op, &host_id, out).await
}

/// L4: the host's machines rebooted (a pair's node1 first), the same call as the customer's.
pub async fn reboot(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let out =
        host_lifecycle::reboot_host(&state, host_lifecycle::Rebooter::Operator(&op), &host_id)
            .await
            .map(|r| Some(host_lifecycle::rebooting_message(&r)));
    answer(&state, &op, &host_id, out).await
}

pub async fn replace_relay(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let out = host_lifecycle::replace_relay(&state, &op, &host_id)
        .await
        .map(|r| Some(r.message));
    answer(&state, &op, &host_id, out).await
}
