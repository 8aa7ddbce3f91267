//! The owner's GPUs ("Add a GPU", the one-liner, enrolment state) and the operator's hosts
//! and enrolments (what turned up, activation, revocation).

use axum::Form;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect};
use byo_db::hosts::HostNodeRow;
use byo_db::provisioning::EnrollmentView;
use byo_wire::Role;
use byo_wire::api::Placement;
use byo_wire::enroll::{ProvisionRequest, ProvisionResponse};
use byo_wire::prepare::PrepareState;
use byo_wire::states::RelayState;
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{Markup, html};
use serde::Deserialize;

use super::{PageError, PageResult, layout, ops_layout, require_operator};
use crate::app::host_report::{Fixer, failure_advice};
use crate::app::owner_hosts::{Onboarding, after_go_live, step_failed, step_line};
use crate::app::{admin_host_action, host_lifecycle, host_provision};
use crate::auth::CurrentUser;
use crate::error::AppError;
use crate::state::AppState;

fn may_provision(v: &CurrentUser) -> bool {
    v.has(Role::CommunityHost) || v.has(Role::Superadmin)
}

/// Under a failed step, for the owner: what is wrong and who fixes it in plain words, and
/// that preparation tries again on its own (the unit's `RestartSec=`), with roughly when
/// the next try is while that is still ahead. On a machine already prepared the failure is
/// an operator's deliberate run (L), which does not retry: that is said instead.
fn failure_advice_line(p: &PrepareState, now: DateTime<Utc>, prepared: bool) -> Markup {
    let advice = failure_advice(&p.step);
    let every = byo_core::render::units::PREPARE_RETRY_SECS;
    let next = Some(p.at + chrono::Duration::seconds(every as i64)).filter(|next| *next > now);
    html! {
        br;
        small.advice {
            (advice.wrong)
            @if let Some(cause) = advice.cause { " " (cause) }
            @match advice.fixer {
                Fixer::Owner(what) => { " What you can do: " (what) }
                Fixer::Us => { " Nothing for you to do: we fix this on our side." }
                Fixer::ItsOwnLine => { " Its own line below says why." }
            }
            @if prepared {
                " This was byo's operators preparing your machine again after it was ready: it does not try again on its own, and they decide what happens next."
            } @else {
                " Preparation tries again on its own about every " (every) " seconds"
                @if let Some(next) = next { " (next try about " (next.format("%H:%M:%S")) " UTC)" }
                ", and carries on by itself once the cause is fixed."
            }
        }
    }
}

fn enrollment_state(e: &EnrollmentView) -> String {
    Onboarding::of(e).summary()
}

/// The live part of a host's row: the state, the latest step of node 0 with its attempt and
/// time, and each satellite's own latest step; under a failed one, what it means for the
/// owner. `GET /hosts/{host_id}/progress` serves it
/// alone; the page polls that and puts it in place.
fn progress_fragment(facts: &Onboarding<'_>, nodes: &[HostNodeRow], now: DateTime<Utc>) -> Markup {
    let failed = step_failed;
    html! {
        div.progress data-settled=(facts.settled(now))
            data-enrolled=(facts.enrollment == Some(byo_wire::states::EnrollmentState::Enrolled)) {
            span.state { (facts.summary()) }
            @if facts.active == Some(false) {
                @if let Some(p) = facts.prepare_state {
                    br;
                    small.step.error[failed(p)] {
                        (if nodes.len() > 1 { "node 0: " } else { "last step: " }) (step_line(p))
                        (step_when(p))
                    }
                    @if failed(p) { (failure_advice_line(p, now, facts.prepared_at.is_some())) }
                }
                @for n in nodes.iter().filter(|n| n.index > 0 && n.retired_at.is_none()) {
                    br;
                    small.step.error[n.prepare_state.as_ref().is_some_and(|p| failed(&p.0))] {
                        "node " (n.index) ": "
                        @match &n.prepare_state {
                            Some(p) => {
                                (step_line(&p.0))
                                (step_when(&p.0))
                            }
                            None => "not started",
                        }
                    }
                    @if let Some(p) = n.prepare_state.as_ref().filter(|p| failed(&p.0)) {
                        (failure_advice_line(&p.0, now, facts.prepared_at.is_some()))
                    }
                }
                @if let Some(at) = facts.prepared_at {
                    br;
                    small.step { "prepared at " (at.format("%Y-%m-%d %H:%M:%S UTC")) }
                }
            }
        }
    }
}

async fn gpus_page(
    state: &AppState,
    v: &CurrentUser,
    created: Option<&ProvisionResponse>,
    error: Option<&str>,
) -> Result<Markup, PageError> {
    let enrollments = state.store.enrollment_views(Some(&v.user.sub)).await?;
    let profiles = state.store.profiles().await?;
    let now = state.clock.now();
    let uninstall = host_lifecycle::uninstall_commands(state);
    let mut rows = Vec::with_capacity(enrollments.len());
    let mut stopped = Vec::new();
    for e in &enrollments {
        // Only a host that still exists has progress to show (and to poll).
        let live = match (&e.host_id, e.active) {
            (Some(id), Some(_)) => Some((id.as_str(), state.store.host_nodes(id).await?)),
            _ => None,
        };
        // After go-live the owner reads their host's state in their words (issue #12, 9).
        let after = match &e.host_id {
            Some(id) => after_go_live(state, id, now).await?,
            None => None,
        };
        if let Some(a) = &after
            && a.stopped
        {
            stopped.push(e.slug.clone().unwrap_or_default());
        }
        rows.push((e, live, after));
    }
    // Who of the operators logged in to each of the owner's hosts, and when (#16, 5).
    let mut logins = Vec::new();
    for e in &enrollments {
        if let (Some(id), Some(slug)) = (&e.host_id, &e.slug) {
            let seen = state
                .store
                .operator_logins(id, super::host_detail::SHOWN_LOGINS)
                .await?;
            if !seen.is_empty() {
                logins.push((slug.clone(), id.clone(), seen));
            }
        }
    }
    // With billing on, for anyone with a GPU or with something it earned.
    let earnings = match state.billing.enabled() {
        true => Some(crate::app::earnings::mine(state, &v.user.sub).await?)
            .filter(|e| !rows.is_empty() || !e.months.is_empty()),
        false => None,
    };
    let payouts = match &earnings {
        Some(_) => Some(crate::app::payouts::mine(state, &v.user.sub).await?),
        None => None,
    };
    Ok(layout(
        "Your GPUs",
        Some(v),
        html! {
            h1 { "Your GPUs" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            @if let Some(p) = created {
                section.created data-expires-scope {
                    h2 { "Run this on your Spark" }
                    p { "Everything for " strong { (p.slug) } " is ready. Run this once, as a user who can sudo, on the machine itself. "
                        "It works until "
                        time #one-liner-expiry datetime=(p.expires_at.to_rfc3339_opts(SecondsFormat::Millis, true))
                            data-now=(now.to_rfc3339_opts(SecondsFormat::Millis, true)) data-countdown="one-liner-countdown"
                            data-used-when={ "#progress-" (p.host_id) " [data-enrolled=\"true\"]" } {
                            (p.expires_at.format("%Y-%m-%d %H:%M:%S UTC"))
                        }
                        " (one hour) and only once. "
                        strong #one-liner-countdown.countdown aria-live="off" {}
                    }
                    pre { code #one-liner { (p.command) } }
                    button #copy-one-liner type="button" data-copy="one-liner" hidden { "Copy" }
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
            @if !stopped.is_empty() {
                section.uninstall #uninstall {
                    h2 { "Uninstall" }
                    p { "You stopped hosting " (stopped.join(", ")) ". To hand the machine back, run on it:" }
                    pre { code #uninstall-agent { (uninstall[0]) } }
                    p { "(add " code { "--keep-lxd" } " to keep LXD and its images, " code { "--restore-docker" } " to have Docker back if preparation removed it), or:" }
                    pre { code #uninstall-curl { (uninstall[1]) } }
                }
            }
            h2 { "Enrolments" }
            @if rows.is_empty() { p { "None yet." } } @else {
                div.scroll { table {
                    thead { tr { th { "Host" } th { "Profile" } th { "State" } th { "Added" } } }
                    tbody { @for (e, live, after) in &rows { tr {
                        td { (e.slug.as_deref().unwrap_or("—")) }
                        td { (e.profile_id) }
                        td {
                            @match (live, after) {
                                (Some((host_id, _)), Some(a)) => {
                                    span.state.after-go-live #{ "state-" (host_id) } { (a.words) }
                                    @if a.may_stop {
                                        form.inline method="post" action={ "/hosts/" (host_id) "/stop" } {
                                            button type="submit" { "Stop hosting" }
                                        }
                                        br;
                                        small { "Stop hosting takes your GPU out of rental and ends what runs on it; then you uninstall." }
                                    }
                                }
                                (Some((host_id, nodes)), None) => {
                                    div #{ "progress-" (host_id) } data-progress={ "/hosts/" (host_id) "/progress" } {
                                        (progress_fragment(&Onboarding::of(e), nodes, now))
                                    }
                                    @if e.state.is_open() {
                                        form.inline method="post" action={ "/hosts/" (host_id) "/cancel" } {
                                            button type="submit" { "Cancel" }
                                        }
                                        br;
                                        small { "Not going to run the command? Cancel hands back what was set aside for this GPU." }
                                    }
                                }
                                (None, _) => (enrollment_state(e)),
                            }
                        }
                        td { (e.created_at.format("%Y-%m-%d %H:%M")) }
                    } } }
                } }
            }
            @if let Some(e) = &earnings { (earnings_section(e)) }
            @if let Some(p) = &payouts { (payouts_section(p, !rows.is_empty())) }
            @if !logins.is_empty() {
                h2 { "Operator logins" }
                p { "Our operators administer your GPU as " code { "spark" } ", each with their own key. Every login sshd accepted, newest first:" }
                @for (slug, host_id, seen) in &logins {
                    h3 { (slug) }
                    div.scroll { table.logins #{ "logins-" (host_id) } {
                        thead { tr { th { "When" } th { "Who" } th { "From" } } }
                        tbody { @for l in seen { tr {
                            td { (l.logged_in_at.format("%Y-%m-%d %H:%M:%S UTC")) }
                            td {
                                @match (&l.user_sub, &l.operator_name) {
                                    (Some(_), Some(name)) => { (super::host_detail::cut(name, 64)) }
                                    (Some(_), None) => { "an operator" }
                                    (None, _) => { strong { "not an operator key" } " (" code { (super::host_detail::cut(&l.fingerprint, 80)) } ")" }
                                }
                                @if let Some(cert) = &l.certificate {
                                    ", " strong.break-glass { "break glass" } ": " code { (super::host_detail::cut(cert, 200)) }
                                }
                            }
                            td { (super::host_detail::cut(&l.source, 45)) }
                        } } }
                    } }
                }
            }
        },
    ))
}

/// What the owner's hosts earned, by month and host, with the CSV of every line.
fn earnings_section(e: &byo_wire::billing::EarningsView) -> Markup {
    let money = |c: i64| crate::billing::money(c, &e.currency);
    html! {
        section #earnings {
            h2 { "Earnings" }
            p { "Your share is " (e.owner_share_bps / 100) "." (format!("{:02}", e.owner_share_bps % 100)) " % of every cent invoiced for instances on your GPUs, credits taken off. "
                a href="/hosts/earnings.csv" download { "Every instance-day as CSV" } }
            @if e.months.is_empty() {
                p #no-earnings { "Nothing invoiced yet: usage is invoiced when a month ends, or earlier once a customer's total reaches the threshold." }
            } @else {
                div.scroll { table #earnings-months {
                    thead { tr { th { "Month" } th { "GPU" } th { "Hours sold" } th { "Invoiced" } th { "Your share" } th { "Of which paid" } th { "Platform" } } }
                    tbody { @for m in &e.months { tr {
                        td { (m.month) }
                        td { (m.host_slug) }
                        td { (format!("{:.1}", m.seconds as f64 / 3600.0)) }
                        td { (money(m.amount_cents)) }
                        td.owner { (money(m.owner_cents)) }
                        td { (money(m.owner_paid_cents)) }
                        td { (money(m.platform_cents)) }
                    } } }
                } }
            }
        }
    }
}

/// Where the owner's share is paid: their Stripe account (connect it, or finish its
/// onboarding) and each month's payout, a refused transfer's reason and next try on it.
fn payouts_section(p: &byo_wire::billing::PayoutsView, has_hosts: bool) -> Markup {
    use byo_wire::states::PayoutStatus;
    let when = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M UTC").to_string();
    html! {
        section #payouts {
            h2 { "Payouts" }
            @match &p.account {
                None => {
                    p #payout-account { "Your share is paid to a Stripe account of yours once each month has ended. Connect one to be paid; until then what you earn waits here." }
                    @if has_hosts {
                        form #connect-payouts method="post" action="/hosts/payouts/connect" {
                            button type="submit" { "Connect a Stripe account" }
                        }
                    }
                }
                Some(a) if a.transfers_active => {
                    p #payout-account { "Paid to your Stripe account " code { (a.stripe_account_id) } " after each month ends, for what customers paid by then." }
                }
                Some(a) => {
                    p #payout-account role="alert" { "Your Stripe account " code { (a.stripe_account_id) } " cannot take transfers yet: finish its onboarding on Stripe. What you earn waits until it can." }
                    form #connect-payouts method="post" action="/hosts/payouts/connect" {
                        button type="submit" { "Continue on Stripe" }
                    }
                }
            }
            @if !p.payouts.is_empty() {
                div.scroll { table #payouts-list {
                    thead { tr { th { "Month" } th { "Amount" } th { "Status" } th { "Transfer" } } }
                    tbody { @for o in &p.payouts { tr data-payout=(o.id) {
                        td { (o.month) }
                        td { (crate::billing::money(o.amount_cents, &o.currency)) }
                        td.status {
                            @match o.status {
                                PayoutStatus::Paid => { "paid" @if let Some(t) = o.paid_at { " " (when(t)) } }
                                PayoutStatus::Pending => @match &o.last_error {
                                    Some(e) => { strong role="alert" { "not sent yet" } ": Stripe refused the transfer (" (e) "); tried again " (when(o.next_attempt_at)) }
                                    None => { "being sent" }
                                },
                            }
                        }
                        td { @if let Some(t) = &o.stripe_transfer_id { code { (t) } } }
                    } } }
                } }
            }
        }
    }
}

/// `POST /hosts/payouts/connect`: to Stripe's onboarding of the account the owner's share is
/// paid to.
pub async fn connect_payouts(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
) -> PageResult {
    let v = super::signed_in(viewer)?;
    let link = crate::app::payouts::connect(&state, &v).await?;
    Ok(Redirect::to(&link.url).into_response())
}

/// `GET /hosts/earnings.csv`: the signed-in owner's earnings line by line.
pub async fn earnings_csv(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
) -> PageResult {
    let v = super::signed_in(viewer)?;
    let body = crate::app::earnings::csv(&state, &v.user.sub).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8"),
            (
                header::CONTENT_DISPOSITION,
                "attachment; filename=\"earnings.csv\"",
            ),
        ],
        body,
    )
        .into_response())
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

/// `GET /hosts/{host_id}/progress`: the live part of one host's row, as an HTML fragment
/// the owner's page polls. Only the host's owner and operators may read it; anyone else is
/// told there is no such host, as they would be for one that does not exist.
pub async fn progress(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
) -> PageResult {
    let Some(v) = viewer else {
        return Err(AppError::Unauthenticated.into());
    };
    let host = match state.store.host(&host_id).await? {
        Some(h) if h.owner_sub == v.user.sub || v.is_operator() => h,
        _ => return Err(AppError::NotFound.into()),
    };
    let enrollments = state.store.enrollment_views(Some(&host.owner_sub)).await?;
    let enrollment = enrollments
        .iter()
        .find(|e| e.host_id.as_deref() == Some(host.id.as_str()));
    let facts = Onboarding {
        enrollment: enrollment.map(|e| e.state),
        token_expires_at: enrollment.map(|e| e.token_expires_at),
        reject_reason: enrollment.and_then(|e| e.reject_reason.as_deref()),
        prepared_at: host.prepared_at,
        prepare_state: host.prepare_state.as_ref().map(|s| &s.0),
        active: Some(host.active),
    };
    let nodes = state.store.host_nodes(&host.id).await?;
    Ok((
        [(header::CACHE_CONTROL, "no-store")],
        progress_fragment(&facts, &nodes, state.clock.now()),
    )
        .into_response())
}

/// How much of a stored enrolment request the operators' page renders: an agent writes it,
/// so its size is not ours to choose.
const SHOWN_REQUEST_BYTES: usize = 4096;

/// When a step was last reported, as a person reads it, and its attempt once it is a retry
/// (issue #42, 8: no "attempt 1" that never moves, no raw timestamp).
fn step_when(p: &byo_wire::prepare::PrepareState) -> Markup {
    html! {
        @if p.attempt > 1 { ", attempt " (p.attempt) }
        ", " (super::instances::at(p.at))
    }
}

/// The GPUs a machine reported, as a person reads them: a test host with none says so
/// (issue #42, 8: not "? × 0").
fn gpu_line(model: Option<&str>, count: Option<u64>) -> String {
    match (model, count) {
        (_, Some(0)) => "no GPU".into(),
        (Some(m), Some(n)) => format!("{m} × {n}"),
        (Some(m), None) => m.to_owned(),
        (None, Some(n)) => format!("{n} GPU(s), model not reported"),
        (None, None) => "—".into(),
    }
}

/// What turned up, in a few words, from the enrolment's fingerprint (node 0's identity once
/// enrolled, the whole request when rejected), with what was stored behind a toggle.
fn turned_up(e: &EnrollmentView) -> Markup {
    let at = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M").to_string();
    let when = html! {
        dt { "When" }
        dd { "added " time { (at(e.created_at)) }
            @if let Some(r) = e.redeemed_at { br; "reported " time { (at(r)) } } }
    };
    let Some(f) = e.fingerprint.as_ref().map(|f| &f.0) else {
        return html! { dl.facts { dt { "Machine" } dd { "nothing yet" } (when) } };
    };
    let text = |k: &str| f[k].as_str().filter(|s| !s.is_empty());
    let gpu = gpu_line(text("gpu_model"), f["gpu_count"].as_u64());
    let os = [text("os_id"), text("os_version")]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ");
    // A host's live machines once enrolled; a rejected request counts its own.
    let nodes = match e.node_count {
        0 => 1 + f["peers"].as_array().map_or(0, Vec::len),
        n => n as usize,
    };
    let hardware = text("hardware_id").or(text("machine_id"));
    let full = serde_json::to_string_pretty(f).unwrap_or_default();
    let mut shown = full.len().min(SHOWN_REQUEST_BYTES);
    while !full.is_char_boundary(shown) {
        shown -= 1;
    }
    html! {
        dl.facts {
            dt { "GPU" } dd { (gpu) }
            dt { "Arch" } dd { (text("arch").unwrap_or("—")) }
            dt { "OS" } dd { @if os.is_empty() { "—" } @else { (os) } }
            dt { "Machine" } dd {
                @if let Some(h) = hardware {
                    code title=(h) { (h.chars().take(12).collect::<String>()) @if h.chars().count() > 12 { "…" } }
                    ", "
                }
                (nodes) (if nodes == 1 { " node" } else { " nodes" })
            }
            (when)
        }
        details.request {
            summary { "As reported" }
            pre { code { (&full[..shown]) } }
            @if shown < full.len() {
                p.cut { "Cut: the first " (shown) " of " (full.len()) " bytes are shown." }
            }
        }
    }
}

async fn admin_page(
    state: &AppState,
    op: &crate::auth::Operator,
    error: Option<&str>,
) -> Result<Markup, PageError> {
    let enrollments = state.store.enrollment_views(None).await?;
    let worklist = crate::app::retire_stopped::worklist(state).await?;
    let revoking: std::collections::HashMap<String, (String, DateTime<Utc>)> = state
        .store
        .revokes_in_progress()
        .await?
        .into_iter()
        .map(|(id, step, since)| (id, (step.to_string(), since)))
        .collect();
    // The newest walk of each host waiting for activation, beside its button.
    let waiting: Vec<&str> = enrollments
        .iter()
        .filter(|e| e.prepared_at.is_some() && e.active == Some(false))
        .filter_map(|e| e.host_id.as_deref())
        .collect();
    let walks: std::collections::HashMap<String, byo_db::path_walks::PathWalkRow> = state
        .store
        .latest_path_walks(&waiting)
        .await?
        .into_iter()
        .map(|w| (w.host_id.clone(), w))
        .collect();
    Ok(ops_layout(
        "Hosts",
        Some(&op.0),
        html! {
            h1 { "Hosts and enrolments" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            @if !worklist.is_empty() {
                section #worklist {
                    h2 { "Needs an operator" }
                    p { small { "Their owners stopped hosting and they have been silent for a day, so they would be retired on their own, but retire refuses them for the reason given. Settle it and they are retired within five minutes." } }
                    div.scroll { table {
                        thead { tr { th { "Host" } th { "Stopped" } th { "Last heard from" } th { "Why it is not retired" } } }
                        tbody { @for w in &worklist { tr #{ "worklist-" (w.host_id) } {
                            td { a href={ "/admin/hosts/" (w.host_id) } { (w.slug) } }
                            td { (w.stopped_at.map_or("—".to_owned(), |t| t.format("%Y-%m-%d %H:%M").to_string())) }
                            td { (w.last_seen_at.map_or("never".to_owned(), |t| t.format("%Y-%m-%d %H:%M").to_string())) }
                            td.refusal { (w.message) }
                        } } }
                    } }
                }
            }
            p { "Activation is the only thing between an enrolled machine and a paying customer. It is offered once preparation has finished; the backend refuses it otherwise, whatever sends it." }
            div.scroll { table.hosts {
                thead { tr { th { "Host" } th { "Owner" } th { "Profile" } th { "State" } th { "Relay" } th { "What turned up" } th { "" } } }
                tbody { @for e in &enrollments { tr {
                    td.ours {
                        @match (&e.host_id, &e.slug) {
                            (Some(id), Some(slug)) => { a href={ "/admin/hosts/" (id) } { (slug) } }
                            (_, slug) => (slug.as_deref().unwrap_or("—")),
                        }
                    }
                    td.owner { (e.owner_email) }
                    td.ours { (e.profile_id) }
                    td.state {
                        (enrollment_state(e))
                        @if let Some((step, since)) = e.host_id.as_ref().and_then(|id| revoking.get(id)) {
                            br;
                            strong.stuck { "revoke stopped at " (step) " (since " (since.format("%Y-%m-%d %H:%M")) "): open the host to resume" }
                        }
                    }
                    td { (e.relay_state.0.map_or("—", RelayState::as_str)) }
                    td.turned-up { (turned_up(e)) }
                    td.actions {
                        @if let (Some(host_id), Some(prepared_at), Some(false)) = (&e.host_id, e.prepared_at, e.active) {
                            (activate_form(host_id, prepared_at, walks.get(host_id.as_str())))
                        }
                        @if e.state.is_open() {
                            form.inline method="post" action={ "/admin/enrollments/" (e.id) "/revoke" } {
                                button type="submit" { "Revoke" }
                            }
                        }
                    }
                } } }
            } }
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
    #[serde(default)]
    dedicated_to: Option<String>,
    #[serde(default)]
    change: bool,
    /// The reason to activate despite a failed path walk (issue #38, 4).
    #[serde(default)]
    walk_override: Option<String>,
}

impl ActivateForm {
    /// The closed set, as a form spells it.
    fn placement(&self) -> Result<Placement, AppError> {
        match (self.placement.as_str(), self.dedicated_to.as_deref()) {
            ("shared", _) => Ok(Placement::Shared),
            ("dedicated", Some(to)) if !to.is_empty() && to.len() <= byo_wire::limits::SHORT => {
                Ok(Placement::Dedicated {
                    dedicated_to: to.to_owned(),
                })
            }
            _ => Err(AppError::bad_request(
                "invalid_placement",
                "a placement is shared, or dedicated with the user it is for",
            )),
        }
    }
}

/// The Activate button with the host's customer-path walk beside it (issue #38, 4): the newest
/// walk in a sentence; when the walk since preparation failed, the reason to activate anyway.
pub(crate) fn activate_form(
    host_id: &str,
    prepared_at: DateTime<Utc>,
    walk: Option<&byo_db::path_walks::PathWalkRow>,
) -> Markup {
    let failed = crate::app::path_walk::failed_since(walk, prepared_at);
    html! {
        p.walk {
            @match walk {
                Some(w) => (crate::app::path_walk::sentence(w)),
                None => "Path not walked yet: activation walks it first.",
            }
        }
        form.inline method="post" action={ "/admin/hosts/" (host_id) "/activate" } {
            input type="hidden" name="placement" value="shared";
            @if failed {
                input type="text" name="walk_override" required maxlength=(host_lifecycle::REASON_MAX_CHARS) aria-label="Why activate despite the failed walk" placeholder="why activate despite the failed walk";
                button type="submit" { "Activate anyway" }
            } @else {
                button type="submit" { "Activate" }
            }
        }
    }
}

pub async fn activate(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
    Form(form): Form<ActivateForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let placement = form.placement();
    let done = match placement {
        Ok(placement) => {
            let reason = form.walk_override.as_deref();
            admin_host_action::activate(&state, &op, &host_id, &placement, form.change, reason)
                .await
        }
        Err(e) => Err(e),
    };
    match done {
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
    // The API's path, so the page's revoke is audited and reaped the same way.
    match admin_host_action::revoke(&state, &op, &enrollment_id).await {
        Ok(()) => Ok(Redirect::to("/admin/hosts").into_response()),
        Err(e @ AppError::Conflict { .. }) => Ok((
            e.status(),
            admin_page(&state, &op, Some(&e.to_string())).await?,
        )
            .into_response()),
        Err(e) => Err(e.into()),
    }
}

/// `POST /hosts/{host_id}/cancel`: the owner cancels their own allocation before the GPU
/// enrolled (the API's `POST /api/hosts/{host_id}/cancel`); the page shows what is left.
pub async fn cancel_allocation(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
) -> PageResult {
    let Some(v) = viewer else {
        return Err(AppError::Unauthenticated.into());
    };
    match host_lifecycle::cancel_allocation(&state, &v, &host_id).await {
        Ok(true) => Ok(Redirect::to("/hosts").into_response()),
        Ok(false) => Ok((
            StatusCode::ACCEPTED,
            gpus_page(
                &state,
                &v,
                None,
                Some("cancelled; part of what was set aside is still being handed back, which finishes on its own within minutes"),
            )
            .await?,
        )
            .into_response()),
        Err(e @ AppError::Conflict { .. }) => Ok((
            e.status(),
            gpus_page(&state, &v, None, Some(&e.to_string())).await?,
        )
            .into_response()),
        Err(e) => Err(e.into()),
    }
}

/// `POST /hosts/{host_id}/stop`: the owner stops hosting their own GPU (the API's
/// stop-hosting), then reads their page: the state, and the uninstall commands once drained.
pub async fn stop_hosting(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
) -> PageResult {
    let Some(v) = viewer else {
        return Err(AppError::Unauthenticated.into());
    };
    match host_lifecycle::stop_hosting(&state, &v, &host_id).await {
        Ok(p) if p.done => Ok(Redirect::to("/hosts").into_response()),
        Ok(p) => Ok((
            StatusCode::ACCEPTED,
            gpus_page(&state, &v, None, Some(&p.message)).await?,
        )
            .into_response()),
        Err(e @ AppError::Conflict { .. }) => Ok((
            e.status(),
            gpus_page(&state, &v, None, Some(&e.to_string())).await?,
        )
            .into_response()),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::gpu_line;

    #[test]
    fn gpus_are_named_as_a_person_reads_them() {
        assert_eq!(gpu_line(Some("GB10"), Some(1)), "GB10 × 1");
        assert_eq!(gpu_line(None, Some(0)), "no GPU");
        assert_eq!(gpu_line(Some("none"), Some(0)), "no GPU");
        assert_eq!(gpu_line(None, Some(2)), "2 GPU(s), model not reported");
        assert_eq!(gpu_line(Some("GB10"), None), "GB10");
        assert_eq!(gpu_line(None, None), "—");
    }
}
