//! Notices to people (issue #38, 3). One outbox (`notices`, migration 0022), written two
//! ways: the code that saw an event raises it there (a queued create placed or expired, a
//! booking launched, a host retired), and the `notices` job's sweep raises and clears the
//! conditions it judges (the fleet's problems by the one judge the pages use, a halted
//! fleet upgrade, a job failing run after run, the key list expiring). The same job then
//! delivers what is due over the configured channels (`providers::notify`), each channel
//! once, retrying with backoff (`byo_core::notices`). What each kind says, and to whom,
//! lives here.

use std::collections::BTreeMap;
use std::time::Duration;

use byo_core::notices::{AfterFailure, after_failure, cleared};
use byo_db::notices::{Channel, NewNotice, NoticeRow};
use byo_db::vms::VmRow;
use byo_wire::Role;
use byo_wire::notices::{NoticePreference, NoticeView};
use byo_wire::states::{FleetRunState, NoticeKind};
use chrono::{DateTime, Utc};

use crate::app::fleet_overview::judged;
use crate::error::AppResult;
use crate::providers::notify::SendError;
use crate::state::AppState;

/// The job that sweeps conditions and delivers: its name and period.
pub const NOTICES: &str = "notices";
pub const NOTICES_EVERY: Duration = Duration::from_secs(30);
/// Rows delivered per run; the rest wait for the next.
pub const DELIVER_BATCH: i64 = 200;
/// How many notices the outbox shows, newest first.
pub const OUTBOX_LIMIT: i64 = 200;
/// A job is "failing repeatedly" when this many of its newest runs all failed.
pub const JOB_FAILING_RUNS: usize = 3;

/// Who a kind of notice is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    /// Everyone who rents: their queue, their bookings.
    Customers,
    /// Who owns a host (community hosts, and staff who enrol their own).
    Owners,
    /// Operators and superadmins.
    Operators,
}

/// A kind's audiences and how a person's settings name it.
pub fn describe(kind: NoticeKind) -> (&'static [Audience], &'static str) {
    use Audience::*;
    match kind {
        NoticeKind::QueuePlaced => (&[Customers], "A queued instance of mine started"),
        NoticeKind::QueueExpired => (&[Customers], "A queued instance of mine expired unplaced"),
        NoticeKind::BookingLaunched => (&[Customers], "A booking of mine launched"),
        NoticeKind::BillingPaymentFailed => (&[Customers], "A payment of mine was declined"),
        NoticeKind::BillingInstancesStopped => (
            &[Customers],
            "My instances were stopped for an unpaid invoice",
        ),
        NoticeKind::InstanceEnded => (
            &[Customers],
            "An instance of mine ended because its host left the platform",
        ),
        NoticeKind::HostUnreachable => (&[Owners, Operators], "A host stopped answering"),
        NoticeKind::HostPrepareStopped => (
            &[Owners],
            "Preparing my host stopped at a step only I can fix",
        ),
        NoticeKind::HostRetired => (&[Owners], "My host was retired"),
        NoticeKind::HostRollback => (&[Operators], "A host's upgrade was rolled back"),
        NoticeKind::DeleteStuck => (&[Operators], "A delete was never confirmed"),
        NoticeKind::FleetUpgradeHalted => (&[Operators], "A fleet upgrade halted"),
        NoticeKind::JobFailing => (&[Operators], "A background job keeps failing"),
        NoticeKind::KeyListExpiring => (
            &[Operators],
            "The operator-key list expires in 30, 14, 7 or 1 days",
        ),
    }
}

/// The kinds a person with `roles` receives, in the order the settings list them.
pub fn kinds_for(roles: &[Role]) -> Vec<NoticeKind> {
    let staff = roles.contains(&Role::Operator) || roles.contains(&Role::Superadmin);
    let owner = staff || roles.contains(&Role::CommunityHost);
    NoticeKind::ALL
        .iter()
        .copied()
        .filter(|k| {
            describe(*k).0.iter().any(|a| match a {
                Audience::Customers => true,
                Audience::Owners => owner,
                Audience::Operators => staff,
            })
        })
        .collect()
}

/// Raise one notice per recipient, unless that person already has it open or turned the
/// kind off. How many were written.
pub async fn raise(
    state: &AppState,
    kind: NoticeKind,
    condition: &str,
    to: &[String],
    subject: &str,
    body: &str,
) -> AppResult<usize> {
    let now = state.clock.now();
    let deliver_at = state.notifier.delivers().then_some(now);
    let mut written = 0;
    for sub in to {
        let n = NewNotice {
            kind: kind.as_str(),
            condition,
            recipient_sub: sub,
            subject,
            body,
            deliver_at,
        };
        if state.store.raise_notice(&n, now).await? {
            written += 1;
        }
    }
    Ok(written)
}

/// [`raise`] for an event seen on the way to something else: a notice that could not be
/// written is logged, never the reason the placement, launch or retire it tells of fails.
pub async fn raise_event(
    state: &AppState,
    kind: NoticeKind,
    condition: &str,
    to: &str,
    subject: &str,
    body: &str,
) {
    if let Err(e) = raise(state, kind, condition, &[to.to_owned()], subject, body).await {
        tracing::warn!(kind = %kind, condition, error = %e, "a notice could not be written");
    }
}

/// The address a person's links point at (a notice's, sign-up's mail).
pub(crate) fn url(state: &AppState, path: &str) -> String {
    format!("{}{path}", state.config.public_url.trim_end_matches('/'))
}

fn at(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M UTC").to_string()
}

/// The customers' notices that the drain placed their queued creates, each placement as
/// (queue row, customer, instance, its host's relay address — for the ssh line where DNS
/// is local), raised in one write. A notice that could not be written is logged, never
/// the reason a placement fails.
pub async fn queue_placed(state: &AppState, placed: &[(&str, &str, &VmRow, Option<&str>)]) {
    let told: Vec<(String, String, String)> = placed
        .iter()
        .map(|(queue_id, _, vm, relay_address)| {
            let ssh = crate::app::instances::ssh_command(state, vm, *relay_address);
            let name = &vm.name;
            let body = format!(
                "A host took your queued create: instance {name} is being created now and runs \
                 within minutes.\n\n{}\nYour instances: {}\n",
                ssh.map(|s| format!("Log in with: {s}\n"))
                    .unwrap_or_default(),
                url(state, "/instances")
            );
            (
                format!("queue.placed:{queue_id}"),
                format!("Your queued instance {name} is starting"),
                body,
            )
        })
        .collect();
    let now = state.clock.now();
    let deliver_at = state.notifier.delivers().then_some(now);
    let notices: Vec<NewNotice<'_>> = placed
        .iter()
        .zip(&told)
        .map(
            |((_, user_sub, _, _), (condition, subject, body))| NewNotice {
                kind: NoticeKind::QueuePlaced.as_str(),
                condition,
                recipient_sub: user_sub,
                subject,
                body,
                deliver_at,
            },
        )
        .collect();
    if let Err(e) = state.store.raise_notices(&notices, now).await {
        tracing::warn!(kind = %NoticeKind::QueuePlaced, placed = placed.len(), error = %e,
            "notices could not be written");
    }
}

/// The customer's notice that an invoice's payment was declined, and when their running
/// instances stop if it stays unpaid (issue #40, 2). Once per invoice.
pub async fn payment_failed(
    state: &AppState,
    invoice: &byo_db::invoices::InvoiceRow,
    amount: &str,
    stop_at: DateTime<Utc>,
) {
    let pay = invoice
        .hosted_invoice_url
        .clone()
        .unwrap_or_else(|| url(state, "/billing"));
    let body = format!(
        "The payment of your invoice of {amount} was declined. Until it is paid you cannot \
         create, queue or book instances.\n\nPay it at {pay}, or replace your payment method \
         at {}. If it is still unpaid at {}, your running instances are stopped (never \
         deleted: their disks are kept) and they start again by themselves once it is paid.\n",
        url(state, "/billing"),
        at(stop_at)
    );
    raise_event(
        state,
        NoticeKind::BillingPaymentFailed,
        &format!("billing.payment_failed:{}", invoice.id),
        &invoice.user_sub,
        &format!("Your payment of {amount} was declined"),
        &body,
    )
    .await;
}

/// The customer's notice that their instances were stopped for an unpaid invoice.
pub async fn instances_stopped(
    state: &AppState,
    invoice: &byo_db::invoices::InvoiceRow,
    amount: &str,
    names: &[String],
) {
    let body = format!(
        "Your invoice of {amount} is still unpaid, so these instances were stopped: {}. \
         Nothing was deleted. Pay the invoice at {} and they start again by themselves.\n",
        names.join(", "),
        invoice
            .hosted_invoice_url
            .clone()
            .unwrap_or_else(|| url(state, "/billing"))
    );
    raise_event(
        state,
        NoticeKind::BillingInstancesStopped,
        &format!("billing.instances_stopped:{}", invoice.id),
        &invoice.user_sub,
        "Your instances were stopped: an invoice is unpaid",
        &body,
    )
    .await;
}

/// The customer's notice that their queued create lapsed.
pub async fn queue_expired(state: &AppState, queue_id: &str, user_sub: &str, gpu_type: &str) {
    let body = format!(
        "No {gpu_type} host became free before your queued create's time ran out, so it was \
         closed. Nothing was created and nothing is billed.\n\nQueue again from {} (and use \
         \"Keep waiting\" on a queued create to give it longer).\n",
        url(state, "/instances")
    );
    raise_event(
        state,
        NoticeKind::QueueExpired,
        &format!("queue.expired:{queue_id}"),
        user_sub,
        &format!("Your queued {gpu_type} instance expired"),
        &body,
    )
    .await;
}

/// The customer's notice that their instance ended with its host (issue #39, 3): the
/// machine's owner uninstalled byo, which deleted the container.
pub async fn instance_ended(
    state: &AppState,
    vm_id: &str,
    name: &str,
    user_sub: &str,
    at: DateTime<Utc>,
) {
    let body = format!(
        "Your instance {name} has ended: the owner of the machine it ran on took that machine \
         off the platform, which deleted the instance with everything on it. Billing stopped at \
         {}.\n\nCreate another from {}.\n",
        self::at(at),
        url(state, "/instances")
    );
    raise_event(
        state,
        NoticeKind::InstanceEnded,
        &format!("instance.ended:{vm_id}"),
        user_sub,
        &format!("Your instance {name} has ended"),
        &body,
    )
    .await;
}

/// The customer's notice that their booking launched.
pub async fn booking_launched(state: &AppState, booking_id: &str, user_sub: &str, vm_id: &str) {
    let body = format!(
        "Your booking started: instance {vm_id} is being created on the host held for you.\n\n\
         Your instances: {}\n",
        url(state, "/instances")
    );
    raise_event(
        state,
        NoticeKind::BookingLaunched,
        &format!("booking.launched:{booking_id}"),
        user_sub,
        "Your booking launched",
        &body,
    )
    .await;
}

/// The owner's notice that their host was retired.
pub async fn host_retired(state: &AppState, host_id: &str, slug: &str, owner_sub: &str) {
    let body = format!(
        "Your host {slug} was retired: it takes no more instances, and its relay, address, \
         tunnel and DNS names were given back. Your hosts: {}\n",
        url(state, "/hosts")
    );
    raise_event(
        state,
        NoticeKind::HostRetired,
        &format!("host.retired:{host_id}"),
        owner_sub,
        &format!("Your host {slug} was retired"),
        &body,
    )
    .await;
}

/// One condition present now, and what its notice says to whom.
struct Present {
    kind: NoticeKind,
    condition: String,
    to: Vec<String>,
    subject: String,
    body: String,
}

/// What one sweep found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sweep {
    pub present: usize,
    pub raised: usize,
    pub cleared: u64,
}

/// Judge every condition now: raise the ones present (an open one is not raised again) and
/// clear the open ones that went away.
pub async fn sweep_once(state: &AppState) -> AppResult<Sweep> {
    let now = state.clock.now();
    let operators = state.store.operator_subs().await?;
    let (read, published) =
        tokio::try_join!(state.store.fleet_read(), state.store.published_key_list())?;
    let mut present: Vec<Present> = Vec::new();
    let mut add = |kind, condition: String, to: Vec<String>, subject: String, body: String| {
        present.push(Present {
            kind,
            condition,
            to,
            subject,
            body,
        });
    };

    for j in judged(
        &read,
        published.as_ref(),
        state.config.placement.seen_since(now),
        now,
    ) {
        let h = &j.host.host;
        let page = url(state, &format!("/admin/hosts/{}", h.id));
        for (p, since) in &j.problems {
            let since = since.map(at).unwrap_or_else(|| "now".to_owned());
            match p.name {
                "agent unreachable" => {
                    // The owner is told only while the host is in service: a host they
                    // stopped hosting on is expected to go quiet.
                    let mut to = operators.clone();
                    if h.active && !to.contains(&h.owner_sub) {
                        to.push(h.owner_sub.clone());
                    }
                    add(
                        NoticeKind::HostUnreachable,
                        format!("host.unreachable:{}", h.id),
                        to,
                        format!("{} has been unreachable since {since}", h.slug),
                        format!(
                            "The host {slug} has not answered since {since} ({detail}). While it \
                             is unreachable nobody can create on it, and its instances may be \
                             down.\n\nIf it is your machine: check that it is on and online, and \
                             that the byo agent runs (`systemctl status enverge-agent`).\n\n\
                             Host page: {page}\n",
                            slug = h.slug,
                            detail = p.detail,
                        ),
                    );
                }
                "rollback fired" => add(
                    NoticeKind::HostRollback,
                    format!("host.rollback:{}", h.id),
                    operators.clone(),
                    format!("{}: an upgrade was rolled back", h.slug),
                    format!("{}: {}.\n\nHost page: {page}\n", h.slug, p.detail),
                ),
                "stuck delete" => add(
                    NoticeKind::DeleteStuck,
                    format!("delete.stuck:{}", h.id),
                    operators.clone(),
                    format!("{}: a delete was never confirmed", h.slug),
                    format!(
                        "{}: {} — waiting since {since}. The instance is still billed and its \
                         host held until the host confirms or an operator settles it.\n\nHost \
                         page: {page}\n",
                        h.slug, p.detail
                    ),
                ),
                "prepare stopped" => add(
                    NoticeKind::HostPrepareStopped,
                    format!("host.prepare_stopped:{}", h.id),
                    vec![h.owner_sub.clone()],
                    format!("Preparing {} stopped {}", h.slug, p.detail),
                    format!(
                        "Preparing your host {slug} stopped {detail}, at a step only you can fix \
                         on the machine. Your host's page names the step, what it found and what \
                         to do; once it is fixed, preparation tries again on its own (about every \
                         30 s) and carries on from that step.\n\nYour host: {own}\n",
                        slug = h.slug,
                        detail = p.detail,
                        own = url(state, &format!("/hosts/{}", h.id)),
                    ),
                ),
                _ => {}
            }
        }
    }

    if let Some(run) = state.store.open_fleet_run_row().await?
        && run.state == FleetRunState::Halted
    {
        add(
            NoticeKind::FleetUpgradeHalted,
            format!("fleet_upgrade.halted:{}", run.id),
            operators.clone(),
            format!("The fleet upgrade to {} halted", run.build),
            format!(
                "The fleet upgrade to build {} halted: {}.\n\nResume it with `byo fleet upgrade \
                 --resume` once the cause is fixed, or close it. Releases: {}\n",
                run.build,
                run.halt_reason.as_deref().unwrap_or("no reason recorded"),
                url(state, "/admin/releases")
            ),
        );
    }

    for job in state.store.job_health().await? {
        if !job.last_failed {
            continue;
        }
        let runs = state
            .store
            .job_runs(&job.job, JOB_FAILING_RUNS as i64)
            .await?;
        if runs.len() == JOB_FAILING_RUNS && runs.iter().all(|r| r.outcome == "failed") {
            let error = runs[0].error.as_deref().unwrap_or("no error recorded");
            add(
                NoticeKind::JobFailing,
                format!("job.failing:{}", job.job),
                operators.clone(),
                format!("The {} job keeps failing", job.job),
                format!(
                    "The background job {} failed its last {JOB_FAILING_RUNS} runs. The newest \
                     said: {error}\n\nJobs: {}\n",
                    job.job,
                    url(state, "/admin/jobs")
                ),
            );
        }
    }

    if let Some(list) = &published
        && let Some(expires) = crate::app::host_problems::list_expiry(Some(list))
        && let Some(days) = byo_core::notices::key_list_notice(expires, now)
    {
        let when = if days == 0 {
            "has expired".to_owned()
        } else {
            format!(
                "expires within {days} day{}",
                if days == 1 { "" } else { "s" }
            )
        };
        add(
            NoticeKind::KeyListExpiring,
            format!("key_list.expiring:{}:{days}", list.version),
            operators.clone(),
            format!("The operator-key list {when}"),
            format!(
                "The published operator-key list (version {}) {when}, at {}. Sign the drafted \
                 renewal before then, or every operator loses access to every host.\n\nOperator \
                 keys: {}\n",
                list.version,
                at(expires),
                url(state, "/admin/operator-keys")
            ),
        );
    }

    let mut sweep = Sweep {
        present: present.len(),
        ..Sweep::default()
    };
    let mut by_kind: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for p in &present {
        sweep.raised += raise(state, p.kind, &p.condition, &p.to, &p.subject, &p.body).await?;
        by_kind
            .entry(p.kind.as_str())
            .or_default()
            .push(p.condition.clone());
    }
    for kind in SWEPT {
        let open = state.store.open_notice_conditions(kind.as_str()).await?;
        let now_present = by_kind.remove(kind.as_str()).unwrap_or_default();
        for c in cleared(&open, &now_present) {
            sweep.cleared += state.store.clear_notice_condition(c, now).await?;
        }
    }
    Ok(sweep)
}

/// The kinds the sweep judges (and so clears); the others are events, which never clear.
pub const SWEPT: [NoticeKind; 7] = [
    NoticeKind::HostUnreachable,
    NoticeKind::HostRollback,
    NoticeKind::DeleteStuck,
    NoticeKind::HostPrepareStopped,
    NoticeKind::FleetUpgradeHalted,
    NoticeKind::JobFailing,
    NoticeKind::KeyListExpiring,
];

/// What one delivery run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delivered {
    pub sent: usize,
    pub retrying: usize,
    pub given_up: usize,
}

/// Send every due notice over each configured channel it has not gone over yet.
pub async fn deliver_once(state: &AppState) -> AppResult<Delivered> {
    let mut out = Delivered::default();
    let n = &state.notifier;
    if !n.delivers() {
        return Ok(out);
    }
    for row in state
        .store
        .due_notices(state.clock.now(), DELIVER_BATCH)
        .await?
    {
        // Each channel's failure is kept: the outbox says what each one answered.
        let mut failed: Vec<SendError> = Vec::new();
        if n.sends_email() && row.email_sent_at.is_none() {
            match n.email(&row).await {
                Ok(()) => {
                    state
                        .store
                        .mark_notice_sent(&row.id, Channel::Email, state.clock.now())
                        .await?
                }
                Err(e) => failed.push(e),
            }
        }
        if n.sends_webhook() && row.webhook_sent_at.is_none() {
            match n.webhook(&row, state.clock.now()).await {
                Ok(()) => {
                    state
                        .store
                        .mark_notice_sent(&row.id, Channel::Webhook, state.clock.now())
                        .await?
                }
                Err(e) => failed.push(e),
            }
        }
        let failed = (!failed.is_empty()).then(|| SendError {
            // A permanent refusal on one channel is not undone by trying the other again.
            permanent: failed.iter().any(|e| e.permanent),
            error: failed
                .iter()
                .map(|e| e.error.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        });
        let now = state.clock.now();
        match failed {
            None => {
                state
                    .store
                    .end_notice_attempt(&row.id, None, None, None)
                    .await?;
                out.sent += 1;
            }
            Some(e) => {
                tracing::warn!(notice = %row.id, kind = %row.kind, attempts = row.attempts + 1,
                    error = %e.error, "a notice was not delivered");
                match after_failure(row.attempts + 1, e.permanent) {
                    AfterFailure::RetryIn(wait) => {
                        state
                            .store
                            .end_notice_attempt(&row.id, Some(now + wait), None, Some(&e.error))
                            .await?;
                        out.retrying += 1;
                    }
                    AfterFailure::GiveUp => {
                        state
                            .store
                            .end_notice_attempt(&row.id, None, Some(now), Some(&e.error))
                            .await?;
                        out.given_up += 1;
                    }
                }
            }
        }
    }
    Ok(out)
}

/// A stored notice as the outbox and a person's list show it.
pub fn view(row: NoticeRow) -> NoticeView {
    let delivery = if row.given_up_at.is_some() {
        "given up"
    } else if row.next_attempt_at.is_some() {
        "sending"
    } else if row.email_sent_at.is_some() || row.webhook_sent_at.is_some() {
        "sent"
    } else {
        "kept here"
    };
    NoticeView {
        id: row.id,
        kind: row.kind,
        to: row.email,
        subject: row.subject,
        body: row.body,
        created_at: row.created_at,
        cleared_at: row.cleared_at,
        delivery: delivery.to_owned(),
        attempts: row.attempts,
        next_attempt_at: row.next_attempt_at,
        email_sent_at: row.email_sent_at,
        webhook_sent_at: row.webhook_sent_at,
        last_error: row.last_error,
    }
}

/// The outbox, newest first (`/admin/outbox`).
pub async fn outbox(state: &AppState, limit: i64) -> AppResult<Vec<NoticeView>> {
    Ok(state
        .store
        .notices(None, limit)
        .await?
        .into_iter()
        .map(view)
        .collect())
}

/// What `sub` receives (by their roles) and whether each is on, and their latest notices.
pub async fn mine(
    state: &AppState,
    sub: &str,
    roles: &[Role],
) -> AppResult<byo_wire::notices::MyNotices> {
    let off = state.store.notice_opt_outs(sub).await?;
    let preferences = kinds_for(roles)
        .into_iter()
        .map(|kind| NoticePreference {
            kind,
            label: describe(kind).1.to_owned(),
            on: !off.iter().any(|o| o == kind.as_str()),
        })
        .collect();
    let recent = state
        .store
        .notices(Some(sub), 50)
        .await?
        .into_iter()
        .map(view)
        .collect();
    Ok(byo_wire::notices::MyNotices {
        preferences,
        recent,
    })
}

/// Turn one kind on or off for `sub`; a kind that is not theirs is refused by name.
pub async fn switch(
    state: &AppState,
    sub: &str,
    roles: &[Role],
    kind: NoticeKind,
    on: bool,
) -> AppResult<()> {
    if !kinds_for(roles).contains(&kind) {
        return Err(crate::error::AppError::bad_request(
            "not_yours",
            format!("{kind} notices are not sent to you"),
        ));
    }
    state
        .store
        .set_notice_opt_out(sub, kind.as_str(), !on, state.clock.now())
        .await?;
    Ok(())
}
