//! E2, the queue: a create no host could take is queued (step 58: the row with no host,
//! the customer's intent and nothing else), and the drain places it once a host frees up
//! — on its period and whenever a confirmed delete freed a host (step 84, the
//! [`QueueDrain`](crate::queue::QueueDrain) hook nudging this job). Operators place a
//! queued create by hand on a host they name, and close one (E0's caller 4).
//!
//! Per queued row the drain re-checks what may have changed since it was queued, live and
//! never from the row: the staff-only rule against the account's roles now, billing
//! (`state.billing.may_charge`), the key. Then, per candidate: mint the name for that host
//! (step 59), write the attempt's `vms` row with that host and name in the transaction
//! that checks the claim (E0: the row precedes dispatch), call the agent. Three outcomes:
//! refused (or unreachable) — the attempt's row fails at once, freeing the host, which is
//! benched, and the next candidate is tried; skipped — the row could not be written (the
//! host was taken meanwhile), not benched; accepted — including a 2xx whose body does not
//! parse — the queue row closes `placed` naming the instance (step 62). A host that stays
//! silent to the deadline leaves the attempt `creating` for its heartbeat to settle; the
//! queue row waits for that and is never tried elsewhere meanwhile.
//!
//! `docs/queue.md` has the choices and every refusal's test.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use byo_db::GuardedWrite;
use byo_db::hosts::AgentTargetRow;
use byo_db::queue::{QueueAttempt, QueueClose, QueuePlaced, QueueRow};
use byo_db::vms::NewVm;
use byo_db::vms::PickedHost;
use byo_db::vms::VmRow;
use byo_wire::states::VmStatus;
use byo_wire::vm::{CreateVm, InstanceView};
use chrono::TimeDelta;
use serde_json::json;

use crate::app::instances::{self, Answer, check_may_rent, mint_name, ssh_hostname};
use crate::app::queued::{not_queued, placing_now};
use crate::auth::CurrentUser;
use crate::billing::Charge;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// The drain's name in the job registry.
pub const QUEUE_DRAIN: &str = "queue-drain";
/// The drain runs this often even when nothing nudges it.
pub const DRAIN_EVERY: Duration = Duration::from_secs(30);
/// How long a drainer's claim on a row lasts; an attempt extends it. A claim that ran out
/// is anyone's again (a drainer that died holds nothing for long).
pub const LEASE_SECS: i64 = 60;
/// Rows claimed per statement.
pub const CLAIM_BATCH: i64 = 32;
/// Candidates a pick returns at least (more when a batch holds many rows of one kind).
pub const CANDIDATES_PER_ROW: i64 = 8;
/// Picks per row per run.
pub const PICKS_PER_ROW: usize = 4;
/// Candidates tried per row per run.
pub const MAX_TRIES_PER_ROW: usize = 32;
/// The expire-queue job's name and period: a lapsed row is closed within a minute.
pub const EXPIRE_QUEUE: &str = "expire-queue";
pub const EXPIRE_EVERY: Duration = Duration::from_secs(60);
/// Rows closed per statement.
pub const EXPIRE_BATCH: i64 = 500;

/// One expire-queue run (issue #39, 2): close every open row past its `expires_at` that no
/// drainer holds and no attempt of which is live, `expired`, each audited `queue.expired`
/// with what its customer is to be told (the notice's record). How many it closed.
pub async fn expire_once(state: &AppState) -> AppResult<u64> {
    let mut closed = 0;
    loop {
        let now = state.clock.now();
        let rows = state.store.expire_queued(now, EXPIRE_BATCH).await?;
        for row in &rows {
            state
                .store
                .audit(
                    None,
                    "queue.expired",
                    Some(&row.id),
                    json!({
                        "user_sub": row.user_sub,
                        "gpu_type": row.gpu_type,
                        "queued_at": row.created_at,
                        "expires_at": row.expires_at,
                        "attempts": row.attempts,
                        "last_error": row.last_error,
                    }),
                    now,
                )
                .await?;
            tracing::info!(queue = %row.id, gpu_type = %row.gpu_type, attempts = row.attempts,
                "queued create expired: no host took it in time");
            super::notices::queue_expired(state, &row.id, &row.user_sub, &row.gpu_type).await;
        }
        closed += rows.len() as u64;
        if (rows.len() as i64) < EXPIRE_BATCH {
            return Ok(closed);
        }
    }
}

/// The record that a drain placed a queued create, for its customer's notice (operators'
/// placements are audited `queue.placed_by_operator` by who placed them).
async fn record_placed(
    state: &AppState,
    row: &QueueRow,
    vm: &VmRow,
    relay_address: Option<&str>,
) -> AppResult<()> {
    state
        .store
        .audit(
            None,
            "queue.placed",
            Some(&row.id),
            json!({"user_sub": row.user_sub, "gpu_type": row.gpu_type, "vm_id": vm.id,
                   "queued_at": row.created_at}),
            state.clock.now(),
        )
        .await?;
    super::notices::queue_placed(state, &row.id, &row.user_sub, vm, relay_address).await;
    Ok(())
}

/// What one drain run did, for its summary line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainReport {
    /// Rows placed (closed `placed`).
    pub placed: u32,
    /// Attempts a host refused (or could not be reached for): those hosts were benched.
    pub refused: u32,
    /// Candidates skipped: the attempt's row could not be written.
    pub skipped: u32,
    /// Rows left queued because the live checks refused them (billing, staff-only, key).
    pub held: u32,
    /// Rows left queued with no free host this run.
    pub waiting: u32,
    /// Rows whose attempt is still being created (a silent host): left for its heartbeat.
    pub pending: u32,
    /// Rows this run claimed (each at most once per run).
    pub claimed: u32,
}

impl std::fmt::Display for DrainReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "placed {}, refused {}, skipped {}, held {}, waiting {}, pending {} (claimed {})",
            self.placed,
            self.refused,
            self.skipped,
            self.held,
            self.waiting,
            self.pending,
            self.claimed
        )
    }
}

/// How one row's turn in a run ended.
enum RowOutcome {
    Placed,
    /// A live check refused it: recorded on the row, left queued.
    Held(String),
    /// No host is free for it (the pick came back empty).
    Waiting,
    /// Candidates were tried and none took it this time.
    Unplaced,
    /// Its attempt is in flight elsewhere or awaiting its host's heartbeat.
    Pending,
    /// Another drainer or an operator took it meanwhile.
    Lost,
}

/// One drain run: claim open rows oldest first in batches, try each, and let go of every
/// row not placed when no more can be claimed. Rows this run holds stay claimed until its
/// end, so the run never takes the same row twice.
pub async fn drain_once(state: &AppState) -> AppResult<DrainReport> {
    let token = uuid::Uuid::new_v4().to_string();
    let result = drain_claimed(state, &token).await;
    // Whatever happened, nothing this run holds stays held.
    state.store.release_queue_claims(&token).await?;
    result
}

/// A run's candidates for one (gpu_type, user) within one claimed batch: picked once for
/// the batch's rows, handed out one by one.
type Candidates = HashMap<(String, String), (Vec<AgentTargetRow>, usize)>;

/// The spread: past this many free hosts a pick's shared hosts are shuffled, so concurrent
/// drainers do not all ask for the same first host (each collision is a skipped attempt).
/// Below it the pick's order holds (a small fleet is where the order matters).
pub const SPREAD_ABOVE: usize = CLAIM_BATCH as usize;

async fn drain_claimed(state: &AppState, token: &str) -> AppResult<DrainReport> {
    let mut report = DrainReport::default();
    // Per (gpu_type, user) a pick that came back empty this run: nothing to try again.
    let mut no_capacity: HashSet<(String, String)> = HashSet::new();
    // gpu_types with no free host: a batch of them placed nothing and found no host. The
    // run claims none of them again, so an empty pick does not cost O(queue).
    let mut exhausted: Vec<String> = Vec::new();
    let mut staff_only: HashMap<String, bool> = HashMap::new();
    loop {
        let now = state.clock.now();
        let lease = now + TimeDelta::seconds(LEASE_SECS);
        let rows = state
            .store
            .claim_queue_rows(now, lease, token, CLAIM_BATCH, &exhausted)
            .await?;
        if rows.is_empty() {
            return Ok(report);
        }
        report.claimed += u32::try_from(rows.len()).unwrap_or(u32::MAX);
        // The batch's keys in one read (the key is still checked live, per batch).
        let ids: Vec<&str> = rows.iter().map(|r| r.ssh_key_id.as_str()).collect();
        let keys: HashMap<String, (String, String)> = state
            .store
            .ssh_keys_by_id(&ids)
            .await?
            .into_iter()
            .map(|(id, owner, public_key)| (id, (owner, public_key)))
            .collect();
        let mut wanted: HashMap<(String, String), usize> = HashMap::new();
        for row in &rows {
            *wanted
                .entry((row.gpu_type.clone(), row.user_sub.clone()))
                .or_default() += 1;
        }
        let mut candidates: Candidates = HashMap::new();
        // Per gpu_type in this batch: (placed one, found no host).
        let mut kinds: HashMap<String, (bool, bool)> = HashMap::new();
        for row in rows {
            let group = (row.gpu_type.clone(), row.user_sub.clone());
            let key = keys
                .get(&row.ssh_key_id)
                .filter(|(owner, _)| *owner == row.user_sub)
                .map(|(_, public_key)| public_key.as_str());
            let outcome = if no_capacity.contains(&group) {
                RowOutcome::Waiting
            } else {
                let want = wanted.get(&group).copied().unwrap_or(1);
                drain_row(
                    state,
                    token,
                    &row,
                    key,
                    want,
                    &mut candidates,
                    &mut report,
                    &mut staff_only,
                )
                .await?
            };
            let kind = kinds.entry(row.gpu_type.clone()).or_default();
            match outcome {
                RowOutcome::Placed => {
                    report.placed += 1;
                    kind.0 = true;
                }
                RowOutcome::Held(why) => {
                    report.held += 1;
                    state
                        .store
                        .note_queue_refusal(&row.id, token, &why, state.clock.now())
                        .await?;
                }
                RowOutcome::Waiting => {
                    report.waiting += 1;
                    kind.1 = true;
                    no_capacity.insert(group);
                }
                RowOutcome::Unplaced => report.waiting += 1,
                RowOutcome::Pending => report.pending += 1,
                RowOutcome::Lost => {}
            }
        }
        for (gpu_type, (placed, no_host)) in kinds {
            if !placed && no_host {
                exhausted.push(gpu_type);
            }
        }
    }
}

/// The next candidate for `row`'s (gpu_type, user), picking (at most [`PICKS_PER_ROW`]
/// times per row) when the batch's candidates ran out: enough for the batch's `want`
/// rows of that group and a few over, the shared ones shuffled past [`SPREAD_ABOVE`].
/// `None`: the pick came back empty.
async fn next_candidate(
    state: &AppState,
    row: &QueueRow,
    want: usize,
    candidates: &mut Candidates,
    picks: &mut usize,
) -> AppResult<Option<AgentTargetRow>> {
    let group = (row.gpu_type.clone(), row.user_sub.clone());
    let (hosts, next) = candidates.entry(group).or_default();
    if *next >= hosts.len() {
        if *picks >= PICKS_PER_ROW {
            return Ok(None);
        }
        *picks += 1;
        let n = i64::try_from(want * 2)
            .unwrap_or(i64::MAX)
            .max(CANDIDATES_PER_ROW);
        let picked = state
            .store
            .pick_first_hosts_for_gpu(
                instances::host_pick(state, &row.gpu_type, &row.user_sub, None),
                n,
            )
            .await?;
        *hosts = spread(picked);
        *next = 0;
    }
    let host = hosts.get(*next).cloned();
    *next += 1;
    Ok(host)
}

/// The pick's order, the user's dedicated boxes first; past [`SPREAD_ABOVE`] hosts the
/// shared ones shuffled.
fn spread(picked: Vec<PickedHost>) -> Vec<AgentTargetRow> {
    use rand::seq::SliceRandom;
    let many = picked.len() > SPREAD_ABOVE;
    let (dedicated, mut shared): (Vec<PickedHost>, Vec<PickedHost>) =
        picked.into_iter().partition(|h| h.dedicated);
    if many {
        shared.shuffle(&mut rand::thread_rng());
    }
    dedicated
        .into_iter()
        .chain(shared)
        .map(|h| h.target)
        .collect()
}

/// One queued row's turn.
#[allow(clippy::too_many_arguments)]
async fn drain_row(
    state: &AppState,
    token: &str,
    row: &QueueRow,
    key: Option<&str>,
    want: usize,
    candidates: &mut Candidates,
    report: &mut DrainReport,
    staff_only: &mut HashMap<String, bool>,
) -> AppResult<RowOutcome> {
    // An earlier attempt: placed (its host's heartbeat settled it running), still being
    // created, or failed (try again).
    if let Some(vm_id) = &row.vm_id
        && let Some(vm) = state.store.vm(vm_id).await?
        && vm.phase().is_live()
    {
        if vm.status == VmStatus::Creating {
            return Ok(RowOutcome::Pending);
        }
        let closed = state
            .store
            .close_queue_placed(&row.id, vm_id, QueueClose::Placed, state.clock.now())
            .await?;
        if closed != GuardedWrite::Written {
            return Ok(RowOutcome::Lost);
        }
        // A placement the heartbeat settled (not the drain's own pick): its host read once.
        let relay = match &vm.host_id {
            Some(h) => state.store.host(h).await?.and_then(|h| h.relay_ip),
            None => None,
        };
        record_placed(state, row, &vm, relay.as_deref()).await?;
        return Ok(RowOutcome::Placed);
    }
    // The rules, live: the account's roles now, not when it queued.
    let is_staff_only = match staff_only.get(&row.gpu_type) {
        Some(s) => *s,
        None => {
            let s = state.store.gpu_type_staff_only(&row.gpu_type).await?;
            staff_only.insert(row.gpu_type.clone(), s);
            s
        }
    };
    if is_staff_only {
        let roles = state.store.roles_of(&row.user_sub).await?;
        if let Err(e) = check_may_rent(state, &roles, &row.gpu_type).await {
            return Ok(RowOutcome::Held(e.to_string()));
        }
    }
    // Billing, live (E2: an intent may be days old).
    if let Charge::Refused { reason } = state.billing.may_charge(&row.user_sub).await? {
        return Ok(RowOutcome::Held(format!("billing refused: {reason}")));
    }
    let Some(key) = key else {
        return Ok(RowOutcome::Held(
            "the SSH key this create was queued with was removed; cancel it and create again"
                .into(),
        ));
    };
    // Candidates from the batch's pick: every one tried is afterwards occupied or benched,
    // so each moves on; concurrent drainers may take some first (skipped).
    let mut picks = 0;
    for _ in 0..MAX_TRIES_PER_ROW {
        // `None` comes only after a pick this row made (or its picks ran out).
        let Some(host) = next_candidate(state, row, want, candidates, &mut picks).await? else {
            return Ok(if report_no_host(candidates, row) {
                RowOutcome::Waiting
            } else {
                RowOutcome::Unplaced
            });
        };
        match try_host(state, token, row, &host, key, 1, QueueClose::Placed).await? {
            Tried::Placed(_) => return Ok(RowOutcome::Placed),
            Tried::Refused(_) => report.refused += 1,
            Tried::Skipped => report.skipped += 1,
            Tried::Silent(_) => return Ok(RowOutcome::Pending),
            Tried::Lost => return Ok(RowOutcome::Lost),
        }
    }
    Ok(RowOutcome::Unplaced)
}

/// Whether the group's last pick came back empty (no host free for it at all).
fn report_no_host(candidates: &Candidates, row: &QueueRow) -> bool {
    candidates
        .get(&(row.gpu_type.clone(), row.user_sub.clone()))
        .is_none_or(|(hosts, _)| hosts.is_empty())
}

/// How one candidate came out.
enum Tried {
    /// The host took it: the instance's id.
    Placed(String),
    Refused(AppError),
    Skipped,
    Silent(AppError),
    Lost,
}

/// Steps 59–62 on one host: mint the name for it, write the attempt's row with it and its
/// audit entry (the claim checked in the same statement), call the agent, and once the
/// host took the instance mark it running and close the queue row, in one write.
async fn try_host(
    state: &AppState,
    token: &str,
    row: &QueueRow,
    host: &AgentTargetRow,
    public_key: &str,
    bench_after: u32,
    how: QueueClose,
) -> AppResult<Tried> {
    let name = mint_name();
    let hostname = ssh_hostname(state, &name, &host.slug);
    let created_at = state.clock.now();
    let lease = created_at
        + TimeDelta::seconds(LEASE_SECS)
        + TimeDelta::from_std(state.waits.create).unwrap_or(TimeDelta::zero());
    let new = NewVm {
        user_sub: &row.user_sub,
        host_id: Some(&host.id),
        name: &name,
        gpu_type: &row.gpu_type,
        ssh_hostname: Some(&hostname),
    };
    let audit =
        json!({"host_id": host.id, "name": name, "gpu_type": row.gpu_type, "queue_id": row.id});
    let vm = match state
        .store
        .start_queue_attempt(&row.id, token, new, created_at, lease, &audit)
        .await?
    {
        QueueAttempt::Started(vm) => *vm,
        QueueAttempt::HostTaken => return Ok(Tried::Skipped),
        QueueAttempt::Lost => return Ok(Tried::Lost),
    };
    let request = CreateVm {
        name: vm.name.clone(),
        ssh_public_key: public_key.to_owned(),
        ssh_hostname: vm.ssh_hostname.clone(),
    };
    let task_state = state.clone();
    let target = host.clone();
    let queued = row.clone();
    let wait = state.waits.create;
    // A spawned task, as the dashboard's create: nothing cuts it between its writes.
    tokio::spawn(async move {
        let state = &task_state;
        Ok(match instances::ask_create(state, &target, &request, wait).await {
            Answer::Accepted(created) => {
                let placed = QueuePlaced {
                    queue_id: &queued.id,
                    vm_id: &vm.id,
                    host_id: &target.id,
                    ssh_port: created.as_ref().map(|c| i32::from(c.ssh_port)),
                    how,
                };
                let closed = state
                    .store
                    .settle_queue_placed(placed, state.clock.now())
                    .await?;
                if closed == GuardedWrite::Written && how == QueueClose::Placed {
                    record_placed(state, &queued, &vm, target.relay_ip.as_deref()).await?;
                }
                tracing::info!(vm = %vm.id, host = %target.slug, name = %vm.name, queue = %queued.id, "instance created");
                Tried::Placed(vm.id)
            }
            // The row stays this run's: the next candidate is tried under the same claim.
            Answer::Refused(e) => Tried::Refused(
                instances::settle_refused(state, &target, &vm, e, bench_after).await?,
            ),
            Answer::Silent => Tried::Silent(
                instances::settle_silent(state, &target, &vm, wait, bench_after).await?,
            ),
        })
    })
    .await
    .map_err(|e| AppError::Internal(anyhow::anyhow!("the drain's create task failed: {e}")))?
}

/// E0's caller 4: an operator places a queued create on the host they name — the drain's
/// steps with the drain's gate (billing) replaced by the operator and its pick by their
/// choice. The staff-only rule does not apply (the operator chose); the host must be
/// active, prepared, not retired, of the row's gpu_type and hold no live instance.
pub async fn place_by_operator(
    state: &AppState,
    by: &CurrentUser,
    id: &str,
    host_id: &str,
) -> AppResult<InstanceView> {
    let Some(row) = state.store.queue_row(id).await? else {
        return Err(AppError::NotFound);
    };
    if row.closed_at.is_some() {
        return Err(not_queued(state, id).await);
    }
    if row.expires_at <= state.clock.now() {
        return Err(AppError::conflict(
            "expired",
            format!(
                "this queued create lapsed at {}; nothing was placed (its customer may queue it again)",
                row.expires_at.format("%Y-%m-%d %H:%M UTC")
            ),
        ));
    }
    let host = state
        .store
        .host(host_id)
        .await?
        .filter(|h| h.retired_at.is_none())
        .ok_or_else(|| AppError::conflict("unknown_host", "no host in service has that id"))?;
    if !host.active || host.prepared_at.is_none() {
        return Err(AppError::conflict(
            "host_not_active",
            format!(
                "{} is not active; activate it before placing on it",
                host.slug
            ),
        ));
    }
    if host.gpu_type != row.gpu_type {
        return Err(AppError::conflict(
            "wrong_gpu_type",
            format!(
                "{} is a {} host and this create asked for {}",
                host.slug, host.gpu_type, row.gpu_type
            ),
        ));
    }
    let target = state
        .store
        .agent_target(host_id)
        .await?
        .filter(|t| t.agent_token.is_some() && t.relay_ip.is_some())
        .ok_or_else(|| {
            AppError::conflict(
                "host_unreachable",
                format!("{} has no agent token or relay yet", host.slug),
            )
        })?;
    let Some(key) = state
        .store
        .ssh_key_of(&row.user_sub, &row.ssh_key_id)
        .await?
    else {
        return Err(AppError::conflict(
            "no_ssh_key",
            "the SSH key this create was queued with was removed; nothing was placed",
        ));
    };
    let token = format!("operator:{}", uuid::Uuid::new_v4());
    let now = state.clock.now();
    if state
        .store
        .claim_queue_row(id, now, now + TimeDelta::seconds(LEASE_SECS), &token)
        .await?
        .is_none()
    {
        return Err(placing_now());
    }
    let bench_after = state.config.placement.bench_after_failures;
    let tried = try_host(
        state,
        &token,
        &row,
        &target,
        &key.public_key,
        bench_after,
        QueueClose::PlacedByOperator,
    )
    .await;
    state.store.release_queue_claims(&token).await?;
    let view = match tried? {
        Tried::Placed(vm_id) => {
            let vm = state.store.vm(&vm_id).await?.ok_or(AppError::NotFound)?;
            instances::view(state, &vm).await?
        }
        Tried::Skipped => {
            return Err(AppError::conflict(
                "host_occupied",
                format!("{} holds a live instance; nothing was placed", target.slug),
            ));
        }
        Tried::Lost => return Err(placing_now()),
        Tried::Refused(e) | Tried::Silent(e) => return Err(e),
    };
    state
        .store
        .audit(
            Some(&by.user.sub),
            "queue.placed_by_operator",
            Some(id),
            json!({"host_id": host_id, "vm_id": view.id}),
            state.clock.now(),
        )
        .await?;
    Ok(view)
}
