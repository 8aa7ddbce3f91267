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
use byo_db::audit::NewAudit;
use byo_db::hosts::AgentTargetRow;
use byo_db::queue::{NewAttempt, QueueAttempt, QueueClose, QueuePlaced, QueueRow};
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
/// A pick asks for this many hosts per row of its group in the batch: concurrent drainers
/// pick from the head of one order, and a wider window, shuffled, is what keeps them from
/// writing attempts for the same hosts (each collision a skipped candidate and a wave).
pub const PICK_PER_WANTED: usize = 8;
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

/// The record that a drain placed queued creates, for their customers' notices (operators'
/// placements are audited `queue.placed_by_operator` by who placed them): each placement
/// (row, instance, its host's relay address) audited, and told, in one write each.
async fn record_placements(
    state: &AppState,
    placed: &[(&QueueRow, &VmRow, Option<&str>)],
) -> AppResult<()> {
    if placed.is_empty() {
        return Ok(());
    }
    let entries: Vec<NewAudit<'_>> = placed
        .iter()
        .map(|(row, vm, _)| NewAudit {
            actor_sub: None,
            action: "queue.placed",
            target: Some(&row.id),
            details: json!({"user_sub": row.user_sub, "gpu_type": row.gpu_type, "vm_id": vm.id,
                            "queued_at": row.created_at}),
        })
        .collect();
    state.store.audit_all(&entries, state.clock.now()).await?;
    let told: Vec<_> = placed
        .iter()
        .map(|(row, vm, relay)| (row.id.as_str(), row.user_sub.as_str(), *vm, *relay))
        .collect();
    super::notices::queue_placed(state, &told).await;
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

/// The spread: past this many free hosts a pick's shared hosts are shuffled, so concurrent
/// drainers do not all ask for the same first host (each collision is a skipped attempt).
/// Below it the pick's order holds (a small fleet is where the order matters).
pub const SPREAD_ABOVE: usize = CLAIM_BATCH as usize;

/// A (gpu_type, user): the rows that share a pick.
type Group = (String, String);

fn group_of(row: &QueueRow) -> Group {
    (row.gpu_type.clone(), row.user_sub.clone())
}

async fn drain_claimed(state: &AppState, token: &str) -> AppResult<DrainReport> {
    let mut report = DrainReport::default();
    // Per (gpu_type, user) a pick that came back empty this run: nothing to try again.
    let mut no_capacity: HashSet<Group> = HashSet::new();
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
        let mut wanted: HashMap<Group, usize> = HashMap::new();
        for row in &rows {
            *wanted.entry(group_of(row)).or_default() += 1;
        }
        // Each row checked live first; those that may rent seek hosts together.
        let mut live = LiveChecks {
            staff_only: &mut staff_only,
            roles: HashMap::new(),
            billing: HashMap::new(),
        };
        let mut outcomes = Vec::new();
        let mut seekers = Vec::new();
        for row in rows {
            if no_capacity.contains(&group_of(&row)) {
                outcomes.push((row, RowOutcome::Waiting));
                continue;
            }
            let key = keys
                .get(&row.ssh_key_id)
                .filter(|(owner, _)| *owner == row.user_sub)
                .map(|(_, public_key)| public_key.clone());
            match check_row(state, &row, key, &mut live).await? {
                Ok(key) => seekers.push(Seeker {
                    row,
                    key,
                    tries: 0,
                    picks: 0,
                }),
                Err(outcome) => outcomes.push((row, outcome)),
            }
        }
        let mut placing = Placing {
            wanted: &wanted,
            no_capacity: &mut no_capacity,
            report: &mut report,
            groups: HashMap::new(),
            used: HashSet::new(),
            wave: 0,
        };
        outcomes.extend(place(state, token, seekers, &mut placing).await?);
        // Per gpu_type in this batch: (placed one, found no host).
        let mut kinds: HashMap<String, (bool, bool)> = HashMap::new();
        for (row, outcome) in outcomes {
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
                    no_capacity.insert(group_of(&row));
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

/// What a batch's live checks read once per account (the staff-only flag once per run):
/// still live, since a batch is claimed, checked and tried within moments.
struct LiveChecks<'a> {
    staff_only: &'a mut HashMap<String, bool>,
    roles: HashMap<String, Vec<byo_wire::Role>>,
    /// Per account, billing's refusal (`None`: it may be charged).
    billing: HashMap<String, Option<String>>,
}

/// A row's turn before any host: an earlier attempt placed (closed now) or still being
/// created, then the rules, live — the account's roles now, not when it queued; billing
/// (E2: an intent may be days old); the key. `Ok(key)`: it may seek a host.
async fn check_row(
    state: &AppState,
    row: &QueueRow,
    key: Option<String>,
    live: &mut LiveChecks<'_>,
) -> AppResult<Result<String, RowOutcome>> {
    // An earlier attempt: placed (its host's heartbeat settled it running), still being
    // created, or failed (try again).
    if let Some(vm_id) = &row.vm_id
        && let Some(vm) = state.store.vm(vm_id).await?
        && vm.phase().is_live()
    {
        if vm.status == VmStatus::Creating {
            return Ok(Err(RowOutcome::Pending));
        }
        let closed = state
            .store
            .close_queue_placed(&row.id, vm_id, QueueClose::Placed, state.clock.now())
            .await?;
        if closed != GuardedWrite::Written {
            return Ok(Err(RowOutcome::Lost));
        }
        // A placement the heartbeat settled (not the drain's own pick): its host read once.
        let relay = match &vm.host_id {
            Some(h) => state.store.host(h).await?.and_then(|h| h.relay_ip),
            None => None,
        };
        record_placements(state, &[(row, &vm, relay.as_deref())]).await?;
        return Ok(Err(RowOutcome::Placed));
    }
    let is_staff_only = match live.staff_only.get(&row.gpu_type) {
        Some(s) => *s,
        None => {
            let s = state.store.gpu_type_staff_only(&row.gpu_type).await?;
            live.staff_only.insert(row.gpu_type.clone(), s);
            s
        }
    };
    if is_staff_only {
        if !live.roles.contains_key(&row.user_sub) {
            let roles = state.store.roles_of(&row.user_sub).await?;
            live.roles.insert(row.user_sub.clone(), roles);
        }
        let roles = &live.roles[&row.user_sub];
        if let Err(e) = check_may_rent(state, roles, &row.gpu_type).await {
            return Ok(Err(RowOutcome::Held(e.to_string())));
        }
    }
    if !live.billing.contains_key(&row.user_sub) {
        let refused = match state.billing.may_charge(&row.user_sub).await? {
            Charge::Allowed => None,
            Charge::Refused { reason } => Some(reason),
        };
        live.billing.insert(row.user_sub.clone(), refused);
    }
    if let Some(reason) = &live.billing[&row.user_sub] {
        return Ok(Err(RowOutcome::Held(format!("billing refused: {reason}"))));
    }
    let Some(key) = key else {
        return Ok(Err(RowOutcome::Held(
            "the SSH key this create was queued with was removed; cancel it and create again"
                .into(),
        )));
    };
    Ok(Ok(key))
}

/// A claimed row the live checks passed, seeking a host this run.
struct Seeker {
    row: QueueRow,
    /// The public key to install.
    key: String,
    /// Candidates written for it (started, or found taken).
    tries: usize,
    /// Picks it made.
    picks: usize,
}

/// A group's candidates within one claimed batch: the pick's hosts, handed out one by one.
#[derive(Default)]
struct Candidates {
    hosts: Vec<AgentTargetRow>,
    next: usize,
    /// The wave that last picked for the group.
    picked_in: Option<usize>,
}

/// One claimed batch's placing: its picks per group, the hosts it has written attempts
/// for (never two of its rows on one host), and the wave it is in.
struct Placing<'a> {
    wanted: &'a HashMap<Group, usize>,
    no_capacity: &'a mut HashSet<Group>,
    report: &'a mut DrainReport,
    groups: HashMap<Group, Candidates>,
    used: HashSet<String>,
    wave: usize,
}

/// What a seeker gets next.
enum Next {
    Host(AgentTargetRow),
    /// Its group picked already in this wave, and every host of that pick is handed out:
    /// once this wave's attempts are written, a pick sees them taken.
    Later,
    Done(RowOutcome),
}

/// Place a batch's seekers (E2's steps 59–62, a batch at a time): in waves, give each a
/// distinct candidate and write every wave's attempts in one statement (a candidate
/// another writer took is skipped, never benched, and the row gets the next); then ask
/// every started attempt's host at once and settle what they answered together. A
/// refusal benches its host and its row seeks again; a silent host leaves its row for the
/// heartbeat and no other host is tried for it.
async fn place(
    state: &AppState,
    token: &str,
    mut seekers: Vec<Seeker>,
    p: &mut Placing<'_>,
) -> AppResult<Vec<(QueueRow, RowOutcome)>> {
    let mut done = Vec::new();
    while !seekers.is_empty() {
        let mut launches = Vec::new();
        let mut waiting = seekers;
        while !waiting.is_empty() {
            p.wave += 1;
            let mut assigned = Vec::new();
            let mut later = Vec::new();
            for mut s in waiting {
                match next_candidate(state, &mut s, p).await? {
                    Next::Host(host) => {
                        p.used.insert(host.id.clone());
                        s.tries += 1;
                        assigned.push((s, host));
                    }
                    Next::Later => later.push(s),
                    Next::Done(outcome) => done.push((s.row, outcome)),
                }
            }
            if assigned.is_empty() {
                // Nothing written this wave: the rest have no candidate this run.
                done.extend(later.into_iter().map(|s| (s.row, RowOutcome::Unplaced)));
                break;
            }
            waiting = later;
            let started = start_attempts(state, token, &assigned).await?;
            for ((s, host), start) in assigned.into_iter().zip(started) {
                match start {
                    QueueAttempt::Started(vm) => launches.push(Launch {
                        seeker: s,
                        host,
                        vm: *vm,
                    }),
                    QueueAttempt::HostTaken => {
                        p.report.skipped += 1;
                        waiting.push(s);
                    }
                    QueueAttempt::Lost => done.push((s.row, RowOutcome::Lost)),
                }
            }
        }
        seekers = Vec::new();
        for (s, tried) in launch(state, launches, 1, QueueClose::Placed).await? {
            match tried {
                Tried::Placed(_) => done.push((s.row, RowOutcome::Placed)),
                Tried::Refused(_) => {
                    p.report.refused += 1;
                    seekers.push(s);
                }
                Tried::Silent(_) => done.push((s.row, RowOutcome::Pending)),
            }
        }
    }
    Ok(done)
}

/// The next candidate for a seeker: its group's pick handed out in order, hosts the batch
/// already wrote an attempt for passed over; when they run out, picked again (once per
/// wave per group, at most [`PICKS_PER_ROW`] times per row) — enough for the batch's rows
/// of that group and a few over, the shared ones shuffled past [`SPREAD_ABOVE`].
async fn next_candidate(state: &AppState, s: &mut Seeker, p: &mut Placing<'_>) -> AppResult<Next> {
    let group = group_of(&s.row);
    if p.no_capacity.contains(&group) {
        return Ok(Next::Done(RowOutcome::Waiting));
    }
    if s.tries >= MAX_TRIES_PER_ROW {
        return Ok(Next::Done(RowOutcome::Unplaced));
    }
    let want = p.wanted.get(&group).copied().unwrap_or(1);
    let c = p.groups.entry(group.clone()).or_default();
    loop {
        if let Some(host) = c.hosts.get(c.next) {
            c.next += 1;
            if !p.used.contains(&host.id) {
                return Ok(Next::Host(host.clone()));
            }
            continue;
        }
        if c.picked_in == Some(p.wave) {
            return Ok(Next::Later);
        }
        if s.picks >= PICKS_PER_ROW {
            return Ok(Next::Done(RowOutcome::Unplaced));
        }
        s.picks += 1;
        c.picked_in = Some(p.wave);
        let n = i64::try_from(want * PICK_PER_WANTED)
            .unwrap_or(i64::MAX)
            .max(CANDIDATES_PER_ROW);
        let picked = state
            .store
            .pick_first_hosts_for_gpu(
                instances::host_pick(state, &s.row.gpu_type, &s.row.user_sub, None),
                n,
            )
            .await?;
        c.hosts = spread(picked);
        c.next = 0;
        if c.hosts.is_empty() {
            p.no_capacity.insert(group);
            return Ok(Next::Done(RowOutcome::Waiting));
        }
    }
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

/// Step 59 for a wave: per (row, host) mint the name for that host and write the
/// attempt's row with it and its audit entry, the claim checked in the same statement.
async fn start_attempts(
    state: &AppState,
    token: &str,
    assigned: &[(Seeker, AgentTargetRow)],
) -> AppResult<Vec<QueueAttempt>> {
    let names: Vec<(String, String)> = assigned
        .iter()
        .map(|(_, host)| {
            let name = mint_name();
            let hostname = ssh_hostname(state, &name, &host.slug);
            (name, hostname)
        })
        .collect();
    let attempts: Vec<NewAttempt<'_>> = assigned
        .iter()
        .zip(&names)
        .map(|((s, host), (name, hostname))| NewAttempt {
            queue_id: &s.row.id,
            vm: NewVm {
                user_sub: &s.row.user_sub,
                host_id: Some(&host.id),
                name,
                gpu_type: &s.row.gpu_type,
                ssh_hostname: Some(hostname),
            },
            audit: json!({"host_id": host.id, "name": name, "gpu_type": s.row.gpu_type,
                          "queue_id": s.row.id}),
        })
        .collect();
    let created_at = state.clock.now();
    let lease = created_at
        + TimeDelta::seconds(LEASE_SECS)
        + TimeDelta::from_std(state.waits.create).unwrap_or(TimeDelta::zero());
    Ok(state
        .store
        .start_queue_attempts(token, &attempts, created_at, lease)
        .await?)
}

/// An attempt written and about to be asked of its host.
struct Launch {
    seeker: Seeker,
    host: AgentTargetRow,
    vm: VmRow,
}

/// How a host answered an attempt, settled.
enum Tried {
    /// The host took it: the instance's id.
    Placed(String),
    Refused(AppError),
    Silent(AppError),
}

/// The rest of steps 59–62 for started attempts (dispatch, and what the hosts said): every
/// host asked at once (each within the create's wait), and the answers settled as they come — the accepted (a 2xx, read or not) in one
/// write that runs each instance and closes its queue row, then audited and told to their
/// customers together; a refusal or a silence settled on its own. One spawned task, as the
/// dashboard's create: nothing cuts it between its writes.
async fn launch(
    state: &AppState,
    launches: Vec<Launch>,
    bench_after: u32,
    how: QueueClose,
) -> AppResult<Vec<(Seeker, Tried)>> {
    if launches.is_empty() {
        return Ok(Vec::new());
    }
    let task_state = state.clone();
    tokio::spawn(async move { ask_and_settle(&task_state, launches, bench_after, how).await })
        .await
        .map_err(|e| AppError::Internal(anyhow::anyhow!("the drain's create task failed: {e}")))?
}

async fn ask_and_settle(
    state: &AppState,
    launches: Vec<Launch>,
    bench_after: u32,
    how: QueueClose,
) -> AppResult<Vec<(Seeker, Tried)>> {
    use futures::{FutureExt, StreamExt, stream::FuturesUnordered};
    let wait = state.waits.create;
    let mut asks: FuturesUnordered<_> = launches
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let state = state.clone();
            let host = l.host.clone();
            let request = CreateVm {
                name: l.vm.name.clone(),
                ssh_public_key: l.seeker.key.clone(),
                ssh_hostname: l.vm.ssh_hostname.clone(),
            };
            tokio::spawn(async move {
                (
                    i,
                    instances::ask_create(&state, &host, &request, wait).await,
                )
            })
        })
        .collect();
    let mut tried: Vec<Option<Tried>> = launches.iter().map(|_| None).collect();
    while let Some(first) = asks.next().await {
        // Whatever else has answered meanwhile is settled with it.
        let mut answers = vec![first];
        while let Some(Some(more)) = asks.next().now_or_never() {
            answers.push(more);
        }
        let mut accepted = Vec::new();
        for answer in answers {
            let (i, answer) = answer.map_err(|e| {
                AppError::Internal(anyhow::anyhow!("a create's request task failed: {e}"))
            })?;
            let l = &launches[i];
            match answer {
                Answer::Accepted(created) => accepted.push((i, created)),
                // The row stays this run's: the next candidate is tried under the same claim.
                Answer::Refused(e) => {
                    tried[i] = Some(Tried::Refused(
                        instances::settle_refused(state, &l.host, &l.vm, e, bench_after).await?,
                    ));
                }
                Answer::Silent => {
                    tried[i] = Some(Tried::Silent(
                        instances::settle_silent(state, &l.host, &l.vm, wait, bench_after).await?,
                    ));
                }
            }
        }
        if accepted.is_empty() {
            continue;
        }
        let placed: Vec<QueuePlaced<'_>> = accepted
            .iter()
            .map(|(i, created)| {
                let l = &launches[*i];
                QueuePlaced {
                    queue_id: &l.seeker.row.id,
                    vm_id: &l.vm.id,
                    host_id: &l.host.id,
                    ssh_port: created.as_ref().map(|c| i32::from(c.ssh_port)),
                    how,
                }
            })
            .collect();
        let closed = state
            .store
            .settle_queue_placements(&placed, state.clock.now())
            .await?;
        let mut records = Vec::new();
        for ((i, _), closed) in accepted.iter().zip(closed) {
            let l = &launches[*i];
            tracing::info!(vm = %l.vm.id, host = %l.host.slug, name = %l.vm.name, queue = %l.seeker.row.id, "instance created");
            if closed == GuardedWrite::Written && how == QueueClose::Placed {
                records.push((&l.seeker.row, &l.vm, l.host.relay_ip.as_deref()));
            }
            tried[*i] = Some(Tried::Placed(l.vm.id.clone()));
        }
        record_placements(state, &records).await?;
    }
    Ok(launches
        .into_iter()
        .zip(tried)
        .map(|(l, t)| {
            // Every task answered once, or the error above returned first.
            let t = t.unwrap_or_else(|| {
                Tried::Silent(AppError::Internal(anyhow::anyhow!(
                    "a create went unanswered"
                )))
            });
            (l.seeker, t)
        })
        .collect())
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
    let seeker = Seeker {
        row,
        key: key.public_key,
        tries: 0,
        picks: 0,
    };
    let tried = place_on(state, &token, seeker, target, bench_after).await;
    state.store.release_queue_claims(&token).await?;
    let view = match tried? {
        Placed::On(Tried::Placed(vm_id)) => {
            let vm = state.store.vm(&vm_id).await?.ok_or(AppError::NotFound)?;
            instances::view(state, &vm).await?
        }
        Placed::Taken(slug) => {
            return Err(AppError::conflict(
                "host_occupied",
                format!("{slug} holds a live instance; nothing was placed"),
            ));
        }
        Placed::Lost => return Err(placing_now()),
        Placed::On(Tried::Refused(e) | Tried::Silent(e)) => return Err(e),
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

/// How an operator's placement on their host came out.
enum Placed {
    On(Tried),
    /// The host holds a live instance: its slug.
    Taken(String),
    Lost,
}

/// The drain's steps for one row on one host the operator chose.
async fn place_on(
    state: &AppState,
    token: &str,
    seeker: Seeker,
    host: AgentTargetRow,
    bench_after: u32,
) -> AppResult<Placed> {
    let assigned = [(seeker, host)];
    let started = start_attempts(state, token, &assigned).await?;
    let [(seeker, host)] = assigned;
    Ok(match started.into_iter().next() {
        Some(QueueAttempt::Started(vm)) => {
            let launched = launch(
                state,
                vec![Launch {
                    seeker,
                    host,
                    vm: *vm,
                }],
                bench_after,
                QueueClose::PlacedByOperator,
            )
            .await?;
            match launched.into_iter().next() {
                Some((_, tried)) => Placed::On(tried),
                None => Placed::Lost,
            }
        }
        Some(QueueAttempt::HostTaken) => Placed::Taken(host.slug),
        Some(QueueAttempt::Lost) | None => Placed::Lost,
    })
}
