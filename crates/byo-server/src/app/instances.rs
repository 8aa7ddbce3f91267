//! Instances: the customer's create from the dashboard (E1) and the one delete every
//! caller uses (G). Pages and the API call these; nothing else writes the two edges.
//!
//! Create: the host is picked and the row written (host, name, SSH name) in one statement
//! with `created_at` stamped *before* the host is contacted (step 44), so the row is a
//! precondition for dispatch. A host that refuses or never answers gets
//! `creation_failed_at`: the row stops being live, its host is free again, nothing bills.
//!
//! Delete: two facts (G.1). `delete_requested_at` when accepted; `deleted_at` only when
//! the host confirms — a 2xx, or its own 404 (G.5). A delete that is not confirmed within
//! [`DELETE_WAIT`](crate::agents::DELETE_WAIT) keeps billing and keeps its host occupied
//! (G.2) and is what notify-stuck-deletes reports (G.3). Both writes are guarded (G.8). The
//! queue drain (step 84) runs only after the row is closed (step 83).
//!
//! The agent is called from a spawned task the handler awaits: a caller who hangs up
//! does not cut a create or a delete off between its two writes.

use std::sync::Arc;
use std::time::Duration;

use byo_db::DbError;
use byo_db::GuardedWrite;
use byo_db::hosts::AgentTargetRow;
use byo_db::vms::{HostPick, NewVm, VmRow};
use byo_wire::Role;
use byo_wire::states::VmStatus;
use byo_wire::vm::{
    CreateVm, DeletionState, InstanceCreated, InstanceDeletion, InstanceQueued, InstanceRequest,
    InstanceView, VmCreated,
};
use rand::Rng;
use serde_json::json;

use crate::agents::{AgentError, Gone};
use crate::app::queued::over_limit;
use crate::auth::CurrentUser;
use crate::billing::Charge;
use crate::error::{AppError, AppResult};
use crate::queue::QueueDrain;
use crate::state::AppState;

/// How far back a customer's listing shows instances that ended.
pub const RECENT_DAYS: i64 = 7;

/// An instance as its customer sees it, with the way to reach it: the relay's address and
/// the ssh command that works where the customer is — the instance's DNS name where the
/// installation publishes DNS, the relay's address where it does not (`byo up`).
pub async fn view(state: &AppState, row: &VmRow) -> AppResult<InstanceView> {
    let relay_address = match &row.host_id {
        Some(id) => state.store.host(id).await?.and_then(|h| h.relay_ip),
        None => None,
    };
    Ok(view_on(state, row, relay_address))
}

/// [`view`] for many rows, reading each host once.
pub async fn views(state: &AppState, rows: &[VmRow]) -> AppResult<Vec<InstanceView>> {
    let mut hosts: Vec<&str> = rows.iter().filter_map(|r| r.host_id.as_deref()).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let relays = state.store.relay_ips(&hosts).await?;
    Ok(rows
        .iter()
        .map(|row| {
            let relay_address = row.host_id.as_deref().and_then(|h| relays.get(h)).cloned();
            view_on(state, row, relay_address)
        })
        .collect())
}

/// The line a customer logs in with: the instance's name where DNS is published, else its
/// host's relay address under the instance's own `HostKeyAlias`. Every instance on a host
/// shares that address and each has its own host key, so without the alias ssh would take
/// the second instance (or the next one after a delete) for an impostor of the first and
/// refuse it (issue #42, 4); with it, each instance's key is known under its own name.
pub fn ssh_command(state: &AppState, row: &VmRow, relay_address: Option<&str>) -> Option<String> {
    if state.tunnels.publishes_dns() {
        row.ssh_hostname.as_deref().map(|h| format!("ssh root@{h}"))
    } else {
        relay_address.map(|a| format!("ssh -o HostKeyAlias=byo-{} root@{a}", row.id))
    }
}

fn view_on(state: &AppState, row: &VmRow, relay_address: Option<String>) -> InstanceView {
    let ssh_command = ssh_command(state, row, relay_address.as_deref());
    InstanceView {
        id: row.id.clone(),
        name: row.name.clone(),
        gpu_type: row.gpu_type.clone(),
        status: row.status,
        ssh_hostname: row.ssh_hostname.clone(),
        relay_address,
        ssh_command,
        created_at: row.created_at,
        creation_failed_at: row.creation_failed_at,
        delete_requested_at: row.delete_requested_at,
        deleted_at: row.deleted_at,
    }
}

/// A fresh instance name: `vm-` and eight of `[a-z0-9]` (what the agent and LXD accept,
/// and a DNS label). Minted per attempt, under the zone of the host it is written with.
pub fn mint_name() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let label: String = (0..8)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect();
    format!("vm-{label}")
}

/// `<name>.<slug>.ssh.<ssh_domain>`: it resolves to the host's own relay, whose :22 the
/// agent maps to the instance (F).
pub fn ssh_hostname(state: &AppState, name: &str, slug: &str) -> String {
    format!("{name}.{slug}.ssh.{}", state.config.ssh_domain())
}

/// The DNS record every instance name of a host resolves through: `*.<slug>.ssh.<domain>`,
/// pointed at the host's relay by relay-provision, removed when the allocation goes.
pub fn ssh_wildcard(state: &AppState, slug: &str) -> String {
    format!("*.{slug}.ssh.{}", state.config.ssh_domain())
}

pub(crate) fn valid_gpu_type(gpu_type: &str) -> bool {
    !gpu_type.is_empty()
        && gpu_type.len() <= 64
        && gpu_type
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The pick every create makes (E1, E2, E3's launch of `booking`): hosts heard from
/// recently enough, and no host a paid booking holds for a window that has begun or opens
/// before the launcher's next tick (E3.2), unless it is `booking`'s own.
pub fn host_pick<'a>(
    state: &AppState,
    gpu_type: &'a str,
    user_sub: &'a str,
    booking: Option<&'a str>,
) -> HostPick<'a> {
    let now = state.clock.now();
    HostPick {
        gpu_type,
        user_sub,
        seen_since: state.config.placement.seen_since(now),
        now,
        pins_from: now
            + chrono::TimeDelta::from_std(crate::app::placement::LAUNCH_EVERY)
                .unwrap_or(chrono::TimeDelta::zero()),
        booking,
    }
}

/// What a create came to: a host took it (201), or none could and it is queued (202).
#[derive(Clone, Debug)]
pub enum CreateOutcome {
    Created(Box<InstanceCreated>),
    Queued(InstanceQueued),
}

/// Refuse a staff-only GPU type to anyone who is not staff (issue #13, 5): at rent time,
/// in every create path (the dashboard's, the queue's drain) and at booking time (E3), not
/// only in the page's menu.
/// Under `byo up` everyone may (`Config::test_hosts_for_everyone`).
pub async fn check_may_rent(state: &AppState, roles: &[Role], gpu_type: &str) -> AppResult<()> {
    let staff = roles
        .iter()
        .any(|r| matches!(r, Role::Operator | Role::Superadmin))
        || state.config.test_hosts_for_everyone;
    if !staff && state.store.gpu_type_staff_only(gpu_type).await? {
        return Err(AppError::refused(
            "staff_only",
            format!("{gpu_type} is for Enverge staff only; nothing was created, queued or booked"),
        ));
    }
    Ok(())
}

/// The one billing gate for every create a customer asks for (issue #40, 3): a dashboard
/// create (placed or queued) and a booking. With billing on, the account must be chargeable
/// now (a payment method on file, not delinquent, not expired: `state.billing.may_charge`,
/// the check the drain repeats per attempt); the refusal says why and where to fix it.
/// Billing off (`byo up`) gates nothing. A Stripe outage is an error (503), not a refusal.
pub async fn check_may_charge(state: &AppState, user_sub: &str) -> AppResult<()> {
    if !state.billing.enabled() {
        return Ok(());
    }
    match state.billing.may_charge(user_sub).await? {
        Charge::Allowed => Ok(()),
        Charge::Refused { reason } => Err(AppError::payment_required(
            PAYMENT_REQUIRED,
            format!(
                "{reason}. Nothing was created, queued or booked: add a payment method on the \
                 Billing page (/billing), then try again"
            ),
        )),
    }
}

/// The code of [`check_may_charge`]'s refusal (the pages link to /billing on it).
pub const PAYMENT_REQUIRED: &str = "payment_required";

/// E1, steps 41–52: a customer's create from the dashboard. With no host free (none
/// picked, or every one taken by another create first) it queues instead (E2, step 58).
pub async fn create(
    state: &AppState,
    by: &CurrentUser,
    req: &InstanceRequest,
) -> AppResult<CreateOutcome> {
    let sub = by.user.sub.as_str();
    let gpu_type = req.gpu_type.trim();
    if !valid_gpu_type(gpu_type) {
        return Err(AppError::bad_request(
            "invalid_gpu_type",
            "a gpu_type is 1 to 64 of lowercase letters, digits and -, like spark-1",
        ));
    }
    check_may_rent(state, &by.roles, gpu_type).await?;
    check_may_charge(state, sub).await?;
    let key = state
        .store
        .ssh_key_of(sub, &req.ssh_key_id)
        .await?
        .ok_or_else(|| {
            AppError::bad_request("unknown_ssh_key", "you have no SSH key with that id")
        })?;
    let candidates = state
        .store
        .pick_hosts_for_gpu(host_pick(state, gpu_type, sub, None))
        .await?;
    if !candidates.is_empty() {
        let request = Placing {
            user_sub: sub.to_owned(),
            gpu_type: gpu_type.to_owned(),
            ssh_public_key: key.public_key,
            prebooking_id: None,
        };
        let task_state = state.clone();
        let placed = tokio::spawn(async move { place(&task_state, request, candidates).await })
            .await
            .map_err(|e| AppError::Internal(anyhow::anyhow!("the create task failed: {e}")))?;
        match placed? {
            Placement::Created(created) => return Ok(CreateOutcome::Created(created)),
            // No host could take it: it waits in the queue instead.
            Placement::NoCapacity(_) => {}
        }
    }
    let queued = crate::app::queued::enqueue(state, sub, gpu_type, &req.ssh_key_id).await?;
    Ok(CreateOutcome::Queued(queued))
}

/// What a create of a GPU kind would meet now (issue #42, 1), told before it is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindCapacity {
    /// This many hosts would take it now.
    Free(usize),
    /// Hosts of the kind exist but none is free: it would queue.
    NoneFree,
    /// No host of the kind is in service: it would queue until one is added.
    NoneExist,
}

/// What a create of `gpu_type` by `user_sub` would meet now: the hosts the create's own pick
/// would offer, else whether any exist.
pub async fn capacity(state: &AppState, gpu_type: &str, user_sub: &str) -> AppResult<KindCapacity> {
    let free = state
        .store
        .pick_hosts_for_gpu(host_pick(state, gpu_type, user_sub, None))
        .await?
        .len();
    Ok(if free > 0 {
        KindCapacity::Free(free)
    } else if state.store.hosts_in_service(gpu_type).await? > 0 {
        KindCapacity::NoneFree
    } else {
        KindCapacity::NoneExist
    })
}

/// What one create places, whichever host takes it.
pub(crate) struct Placing {
    pub(crate) user_sub: String,
    pub(crate) gpu_type: String,
    pub(crate) ssh_public_key: String,
    /// A booking's launch (E3): the row carries the booking and the booking is stamped
    /// with the row, in one transaction (`Store::create_prebooking_vm`).
    pub(crate) prebooking_id: Option<String>,
}

/// E3's create (the launcher and an operator's launch by booking id): the same walk over
/// `candidates` as E1's — the pinned host alone, or a legacy booking's pool pick — from
/// a task the caller awaits.
pub(crate) async fn place_booking(
    state: &AppState,
    request: Placing,
    candidates: Vec<AgentTargetRow>,
) -> AppResult<InstanceCreated> {
    let task_state = state.clone();
    let placed = tokio::spawn(async move { place(&task_state, request, candidates).await })
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("the create task failed: {e}")))?;
    match placed? {
        Placement::Created(created) => Ok(*created),
        Placement::NoCapacity(said) => Err(said),
    }
}

/// What E1's walk came to, when nothing went wrong on our side.
pub(crate) enum Placement {
    /// A host took it.
    Created(Box<InstanceCreated>),
    /// No host could take it — none was left to try, or the one tried still held another
    /// instance — with the words the customer hears (`byo_wire::vm::NO_CAPACITY`). A create queues on it;
    /// a booking's launch waits. A host that refused or could not be reached is not this:
    /// that is the walk's error, told as it is.
    NoCapacity(AppError),
}

/// How one attempt on one host ended.
pub(crate) enum Attempt {
    /// The host took it.
    Placed(Box<InstanceCreated>),
    /// The host refused or could not be reached: nothing exists there, the attempt's row
    /// has `creation_failed_at`, and the next candidate may be tried. The error is what the
    /// customer hears if none is left.
    Failed(AppError),
    /// As `Failed`, but the host still held another instance: to the customer, no capacity.
    Occupied(AppError),
    /// The request's deadline ran out with the host silent: it may still be creating, so
    /// the row stays `creating` (its host stays occupied, G.2's bias) and the heartbeat
    /// settles it. No other host is tried: that could make two instances of one request.
    Silent(AppError),
}

/// Walk the candidates in order within the request's one deadline (`AgentWaits::create`):
/// each attempt writes its own row (a name minted for that host, `created_at` stamped
/// before that host is contacted, step 44) and ends it honestly; a refusal or no
/// connection moves on to the next host, silence until the deadline ends the create.
async fn place(
    state: &AppState,
    req: Placing,
    candidates: Vec<AgentTargetRow>,
) -> AppResult<Placement> {
    let deadline = tokio::time::Instant::now() + state.waits.create;
    // How the last attempt failed: `Ok` a host still holding another instance (no
    // capacity), `Err` a refusal or no connection (told as it is).
    let mut last: Option<Result<AppError, AppError>> = None;
    for host in candidates {
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if remaining.is_zero() {
            break;
        }
        let name = mint_name();
        let hostname = ssh_hostname(state, &name, &host.slug);
        let new = NewVm {
            user_sub: &req.user_sub,
            host_id: Some(&host.id),
            name: &name,
            gpu_type: &req.gpu_type,
            ssh_hostname: Some(&hostname),
        };
        // Step 44: capacity is committed here, before this host is contacted.
        let created_at = state.clock.now();
        // A paid booking's launch (E3) is not held to the per-account limit: the booking
        // already holds its host for its window.
        let limit = state.config.instances.max_per_account;
        let written = match req.prebooking_id.as_deref() {
            None => {
                state
                    .store
                    .create_vm_within_limit(new, created_at, limit)
                    .await
            }
            Some(booking) => {
                state
                    .store
                    .create_prebooking_vm(booking, new, created_at)
                    .await
            }
        };
        let row = match written {
            Ok(row) => row,
            Err(e) if e.breaks(byo_db::Rule::OneLiveInstancePerBooking) => {
                return Err(AppError::conflict(
                    "already_live",
                    "this booking already holds a live instance",
                ));
            }
            Err(e) if e.breaks(byo_db::Rule::BookingClosed) => {
                return Err(AppError::conflict(
                    "booking_closed",
                    "this booking is closed",
                ));
            }
            // Another create took this host between the pick and the insert.
            Err(DbError::Conflict(_)) => continue,
            Err(DbError::Refused(rule)) if rule == "instance_limit" => {
                return Err(over_limit(state));
            }
            Err(e) => return Err(e.into()),
        };
        state
            .store
            .audit(
                Some(&req.user_sub),
                "vm.create",
                Some(&row.id),
                json!({"host_id": host.id, "name": row.name, "gpu_type": row.gpu_type,
                       "prebooking_id": req.prebooking_id}),
                created_at,
            )
            .await?;
        let request = CreateVm {
            name: row.name.clone(),
            ssh_public_key: req.ssh_public_key.clone(),
            ssh_hostname: row.ssh_hostname.clone(),
        };
        let bench_after = state.config.placement.bench_after_failures;
        match attempt(state, &host, row, request, remaining, bench_after).await? {
            Attempt::Placed(created) => return Ok(Placement::Created(created)),
            Attempt::Silent(e) => return Err(e),
            Attempt::Failed(e) => last = Some(Err(e)),
            Attempt::Occupied(e) => last = Some(Ok(e)),
        }
    }
    match last {
        Some(Err(refused)) => Err(refused),
        Some(Ok(occupied)) => Ok(Placement::NoCapacity(occupied)),
        None => Ok(Placement::NoCapacity(AppError::conflict(
            byo_wire::vm::NO_CAPACITY,
            format!(
                "no {} host is free right now; nothing was created and nothing is billed",
                req.gpu_type
            ),
        ))),
    }
}

/// What a host answered a create.
pub(crate) enum Answer {
    /// A 2xx, its body read (`Some`) or not (`None`): accepted either way (E2: an
    /// unreadable 2xx is never a refusal).
    Accepted(Option<VmCreated>),
    /// A refusal, or no connection.
    Refused(AgentError),
    /// No answer within the wait.
    Silent,
}

/// Ask `host` to create the instance, waiting at most `wait`.
pub(crate) async fn ask_create(
    state: &AppState,
    host: &AgentTargetRow,
    request: &CreateVm,
    wait: Duration,
) -> Answer {
    match tokio::time::timeout(wait, state.agents.create_vm(host, request)).await {
        Ok(Ok(created)) => Answer::Accepted(created),
        Ok(Err(e)) => Answer::Refused(e),
        Err(_) => Answer::Silent,
    }
}

/// One attempt on one host, its row already written: the agent's answer settles the row.
/// A 2xx is accepted even when its body cannot be read (E2: never a refusal); a refusal or
/// no connection fails the row and scores the host, benched at `bench_after` in a row.
pub(crate) async fn attempt(
    state: &AppState,
    host: &AgentTargetRow,
    row: VmRow,
    request: CreateVm,
    wait: Duration,
    bench_after: u32,
) -> AppResult<Attempt> {
    let e = match ask_create(state, host, &request, wait).await {
        Answer::Accepted(created) => {
            let port = created.as_ref().map(|c| i32::from(c.ssh_port));
            state.store.mark_vm_running(&row.id, port).await?;
            state.store.record_placement_success(&host.id).await?;
            let row = state.store.vm(&row.id).await?.ok_or(AppError::NotFound)?;
            tracing::info!(vm = %row.id, host = %host.slug, name = %row.name, "instance created");
            return Ok(Attempt::Placed(Box::new(InstanceCreated {
                instance: view(state, &row).await?,
                gpu_check: created.as_ref().map(|c| c.gpu_check.clone()),
                startup_script: created.map(|c| c.startup_script),
            })));
        }
        Answer::Refused(e) => e,
        Answer::Silent => {
            return Ok(Attempt::Silent(
                settle_silent(state, host, &row, wait, bench_after).await?,
            ));
        }
    };
    let occupied = matches!(e, AgentError::Occupied(_));
    let said = settle_refused(state, host, &row, e, bench_after).await?;
    Ok(if occupied {
        Attempt::Occupied(said)
    } else {
        Attempt::Failed(said)
    })
}

/// A host stayed silent to the deadline: the row stays `creating` for the heartbeat to
/// settle, the host is scored. The error the caller answers with.
pub(crate) async fn settle_silent(
    state: &AppState,
    host: &AgentTargetRow,
    row: &VmRow,
    wait: Duration,
    bench_after: u32,
) -> AppResult<AppError> {
    let why = format!("no answer within {} s", wait.as_secs_f32().ceil());
    score_failure(state, host, &why, bench_after).await?;
    tracing::warn!(vm = %row.id, host = %host.slug, "create unanswered; the row stays creating until the host's heartbeat settles it");
    state
        .store
        .audit(
            None,
            "vm.create_unanswered",
            Some(&row.id),
            json!({"host_id": host.id, "reason": why}),
            state.clock.now(),
        )
        .await?;
    Ok(AppError::host_silent(
        "host_silent",
        format!(
            "the host did not answer in time ({why}); the instance stays \"creating\" until the \
                 host's next heartbeat settles it: running if the host made it, failed and never \
                 billed if not"
        ),
    ))
}

/// A create that will not be: `creation_failed_at` (never billed), audited `vm.creation_failed`
/// with why, and which sweep settled it when it was not the create itself (`by`). Guarded:
/// `false`, and nothing audited, when the row was settled first by someone else.
pub(crate) async fn fail_create(
    state: &AppState,
    vm_id: &str,
    host_id: Option<&str>,
    reason: &str,
    by: Option<&str>,
) -> AppResult<bool> {
    let now = state.clock.now();
    if state.store.mark_vm_creation_failed(vm_id, now).await? != GuardedWrite::Written {
        return Ok(false);
    }
    let mut details = json!({"host_id": host_id, "reason": reason});
    if let Some(by) = by {
        details["by"] = json!(by);
    }
    state
        .store
        .audit(None, "vm.creation_failed", Some(vm_id), details, now)
        .await?;
    Ok(true)
}

/// A host refused the create or could not be reached: the row fails (nothing billed),
/// the host is scored and benched at `bench_after`. The error the customer hears.
pub(crate) async fn settle_refused(
    state: &AppState,
    host: &AgentTargetRow,
    row: &VmRow,
    e: AgentError,
    bench_after: u32,
) -> AppResult<AppError> {
    tracing::warn!(vm = %row.id, host = %host.slug, error = %e, "create failed; nothing billed");
    fail_create(state, &row.id, Some(&host.id), &e.to_string(), None).await?;
    score_failure(state, host, &e.to_string(), bench_after).await?;
    // The customer hears our words; the agent's own reason is in the log, the audit and
    // the host's score above (issue #36, 8).
    Ok(match e {
        AgentError::Unreachable(_) => AppError::host_silent(
            "host_unreachable",
            "the host did not answer; the instance was not created and nothing is billed",
        ),
        AgentError::Refused { .. } => AppError::host_refused(
            "host_refused",
            format!(
                "the host refused the instance: {}; nothing was created and nothing is billed",
                e.in_our_words()
            ),
        ),
        // The host holds an instance the database does not call live (one per host): to
        // the customer that is no capacity. Which instance it holds is another customer's
        // business; it is in the log and the audit.
        AgentError::Occupied(_) => AppError::conflict(
            byo_wire::vm::NO_CAPACITY,
            format!(
                "no {} host is free right now (the host picked still holds another instance); nothing was created and nothing is billed",
                row.gpu_type
            ),
        ),
    })
}

/// A create this host did not take: count it, and bench the host at the configured count
/// (audited `host.benched`, once per bench).
async fn score_failure(
    state: &AppState,
    host: &AgentTargetRow,
    why: &str,
    bench_after: u32,
) -> AppResult<()> {
    let now = state.clock.now();
    let score = state
        .store
        .record_placement_failure(&host.id, why, bench_after, now)
        .await?;
    if score.benched {
        tracing::warn!(host = %host.slug, failures = score.consecutive_failures, "host benched: not picked until its next heartbeat or an operator clears it");
        state
            .store
            .audit(
                None,
                "host.benched",
                Some(&host.id),
                json!({"consecutive_failures": score.consecutive_failures, "reason": why}),
                now,
            )
            .await?;
    }
    Ok(())
}

/// Who asked for a delete. They differ only in what decided the instance should go.
#[derive(Clone, Copy, Debug)]
pub enum Deleter<'a> {
    /// The customer, for their own instance; anyone else's is as absent as none.
    Owner(&'a CurrentUser),
    /// admin-vm-action: an operator or superadmin, for any instance.
    Operator(&'a CurrentUser),
    /// The host's owner stopping hosting (issue #12): the instances on their own host,
    /// which the caller has checked.
    HostOwner(&'a CurrentUser),
    /// A scheduled job, with nobody present (G's triggers 3–5), by its name:
    /// expire-prebook at a booking's end_date.
    Job(&'static str),
}

impl Deleter<'_> {
    fn sub(&self) -> Option<&str> {
        match self {
            Deleter::Owner(u) | Deleter::Operator(u) | Deleter::HostOwner(u) => Some(&u.user.sub),
            Deleter::Job(_) => None,
        }
    }
    fn kind(&self) -> &'static str {
        match self {
            Deleter::Owner(_) => "owner",
            Deleter::Operator(_) => "operator",
            Deleter::HostOwner(_) => "host_owner",
            Deleter::Job(name) => name,
        }
    }
}

/// `user`'s instances: every live one, and those that ended in the last week.
pub async fn recent(state: &AppState, user: &CurrentUser) -> AppResult<Vec<InstanceView>> {
    let since = state.clock.now() - chrono::Duration::days(RECENT_DAYS);
    let listed = state.store.listed_vms_of(&user.user.sub, since).await?;
    Ok(listed
        .into_iter()
        .map(|l| view_on(state, &l.vm, l.relay_ip))
        .collect())
}

/// One of `user`'s instances; anyone else's is as absent as none.
pub async fn get(state: &AppState, user: &CurrentUser, vm_id: &str) -> AppResult<InstanceView> {
    match state.store.vm(vm_id).await? {
        Some(row) if row.user_sub == user.user.sub => view(state, &row).await,
        _ => Err(AppError::NotFound),
    }
}

/// G: the delete every caller uses.
pub async fn delete(state: &AppState, by: Deleter<'_>, vm_id: &str) -> AppResult<InstanceDeletion> {
    let row = state.store.vm(vm_id).await?.ok_or(AppError::NotFound)?;
    if let Deleter::Owner(u) = by
        && row.user_sub != u.user.sub
    {
        return Err(AppError::NotFound);
    }
    if row.deleted_at.is_some() {
        return Ok(InstanceDeletion {
            state: DeletionState::Deleted,
            message: "this instance is already deleted".to_owned(),
            instance: view(state, &row).await?,
        });
    }
    if row.creation_failed_at.is_some() {
        return Err(AppError::conflict(
            "never_created",
            "this instance was never created, so there is nothing to delete; it was not billed",
        ));
    }
    // A create still inside its deadline may yet be answered; one past it is stuck (the
    // server restarted mid-create, or the host went silent and has not beaten since) and
    // is deleted like any other: the host confirms, or the delete stays requested.
    if row.status == VmStatus::Creating && !create_deadline_passed(state, &row) {
        return Err(AppError::conflict(
            "still_creating",
            "this instance is still being created; delete it once the create has finished",
        ));
    }
    // Step 80: the first fact. A repeat keeps the first time, which sizes the refund.
    let requested_at = state.clock.now();
    if state.store.request_vm_delete(&row.id, requested_at).await? == GuardedWrite::Written {
        state
            .store
            .audit(
                by.sub(),
                "vm.delete_requested",
                Some(&row.id),
                json!({"by": by.kind(), "host_id": row.host_id}),
                requested_at,
            )
            .await?;
    }
    let task_state = state.clone();
    let (outcome, message) = tokio::spawn(async move { dispatch_delete(&task_state, row).await })
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("the delete task failed: {e}")))??;
    let row = state.store.vm(vm_id).await?.ok_or(AppError::NotFound)?;
    Ok(InstanceDeletion {
        state: outcome,
        message,
        instance: view(state, &row).await?,
    })
}

async fn dispatch_delete(state: &AppState, row: VmRow) -> AppResult<(DeletionState, String)> {
    let Some(host_id) = row.host_id.as_deref() else {
        // No host ever took it, so no container exists anywhere.
        confirm_deleted(state, &row, "no_host").await?;
        return Ok((
            DeletionState::Deleted,
            "deleted; no host had taken it".to_owned(),
        ));
    };
    let Some(target) = state.store.agent_target(host_id).await? else {
        tracing::warn!(vm = %row.id, host = %host_id, "delete requested for an instance whose host is retired");
        return Ok((
            DeletionState::Requested,
            "the delete is recorded, but the instance's host cannot be reached; an operator will finish it"
                .to_owned(),
        ));
    };
    let wait = state.waits.delete;
    let not_confirmed = |why: String| {
        tracing::warn!(vm = %row.id, host = %target.slug, reason = %why, "delete not confirmed; the row stays live");
        Ok((
            DeletionState::Requested,
            format!(
                "the delete is recorded but the host has not confirmed it ({why}); the instance stays \
                 billed and its host occupied until it does, and operators are told if it does not"
            ),
        ))
    };
    match tokio::time::timeout(wait, state.agents.delete_vm(&target, &row.name)).await {
        Ok(Ok(gone)) => {
            let how = match gone {
                Gone::Deleted => "deleted",
                Gone::NotFound => "not_found",
            };
            confirm_deleted(state, &row, how).await?;
            Ok((DeletionState::Deleted, "deleted".to_owned()))
        }
        Ok(Err(e)) => {
            tracing::warn!(vm = %row.id, error = %e, "a delete was not confirmed");
            not_confirmed(e.in_our_words().to_owned())
        }
        Err(_) => not_confirmed(format!("no answer within {} s", wait.as_secs())),
    }
}

/// Step 83, then step 84: close the row (guarded), and only then drain.
async fn confirm_deleted(state: &AppState, row: &VmRow, how: &str) -> AppResult<()> {
    let now = state.clock.now();
    if state.store.confirm_vm_deleted(&row.id, now).await? == GuardedWrite::AlreadySet {
        return Ok(());
    }
    tracing::info!(vm = %row.id, host = %row.host_id.as_deref().unwrap_or("-"), how, "instance deleted");
    state
        .store
        .audit(
            None,
            "vm.deleted",
            Some(&row.id),
            json!({"host_id": row.host_id, "confirmed_by": how}),
            now,
        )
        .await?;
    if let Some(host_id) = row.host_id.as_deref() {
        let drain: Arc<dyn QueueDrain> = state.drain.clone();
        drain.capacity_freed(&row.gpu_type, host_id).await;
    }
    Ok(())
}

/// Whether a row's create deadline (`AgentWaits::create` from its `created_at`) is over:
/// after it, no create call is still waiting on the host for that row.
pub fn create_deadline_passed(state: &AppState, row: &VmRow) -> bool {
    chrono::Duration::from_std(state.waits.create)
        .ok()
        .and_then(|wait| row.created_at.checked_add_signed(wait))
        .is_some_and(|deadline| deadline <= state.clock.now())
}
