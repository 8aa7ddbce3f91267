//! Life after go-live (issue #12): the operator's de-pool, revoke of an enrolled host (H),
//! retire (N) and replacing a dead relay (A.3), and the owner's "stop hosting". Order is the
//! whole design: de-pool first, drain second (G, through [`instances::delete`] with both
//! facts), and only then remove access; outside first, the stamp last. Every step is
//! recorded before the next starts, so a run that stops leaves a state /admin shows and
//! running the action again resumes it. `docs/lifecycle.md` has each order, what a failure
//! at each point leaves, and every refusal with its test.

use byo_db::lifecycle::HostLifecycleRow;
use byo_db::{DbError, GuardedWrite};
use byo_wire::lifecycle::{Drain, HostProgress, RelayReplaced};
use byo_wire::states::{RelayState, RevokeStep, VmStatus};
use byo_wire::vm::DeletionState;
use chrono::{DateTime, Utc};
use serde_json::json;

use crate::app::host_provision::{self, wireguard_endpoint};
use crate::app::instances::{self, Deleter};
use crate::app::power_wait;
use crate::app::reap::release_outside;
use crate::auth::{CurrentUser, Operator};
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// A de-pool reason: required, and bounded (the schema holds it to the same bound,
/// `hosts_depool_reason_bounded`).
pub const REASON_MAX_CHARS: usize = 500;

/// The reason a revoke and a stop-hosting record when they de-pool.
const REVOKE_REASON: &str = "revoked by an operator";
pub const STOP_REASON: &str = "the owner stopped hosting";

async fn lifecycle_row(state: &AppState, host_id: &str) -> AppResult<HostLifecycleRow> {
    state
        .store
        .host_lifecycle(host_id)
        .await?
        .ok_or(AppError::NotFound)
}

fn refuse_retired(h: &HostLifecycleRow) -> AppResult<()> {
    if h.retired_at.is_some() {
        return Err(AppError::conflict(
            "retired",
            "this host is retired; nothing can be done to it any more",
        ));
    }
    Ok(())
}

/// An outside system (GCP, Cloudflare) failed part way: nothing more was recorded, and the
/// same action run again carries on.
fn provider_failed(what: &str, e: impl std::fmt::Display) -> AppError {
    AppError::provider_failed(format!(
        "{what}: {e}; run it again to carry on from where it stopped"
    ))
}

/// De-pool (issue #12, 1): take a host out of placement with a reason. Its instance stays
/// until drained; activation (D) is how it comes back.
pub async fn depool(state: &AppState, by: &Operator, host_id: &str, reason: &str) -> AppResult<()> {
    let reason = reason.trim();
    if reason.is_empty()
        || reason.chars().count() > REASON_MAX_CHARS
        || reason.chars().any(char::is_control)
    {
        return Err(AppError::bad_request(
            "invalid_reason",
            format!("a reason is 1 to {REASON_MAX_CHARS} printable characters"),
        ));
    }
    let h = lifecycle_row(state, host_id).await?;
    refuse_retired(&h)?;
    let now = state.clock.now();
    state
        .store
        .depool_host(host_id, reason, &by.0.user.sub, now)
        .await?;
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "host.depool",
            Some(host_id),
            json!({"reason": reason, "was_active": h.active}),
            now,
        )
        .await?;
    Ok(())
}

/// G for every live instance of a de-pooled host, through the one delete path (both facts,
/// `deleted_at` only on the host's confirmation). An instance still being created cannot be
/// deleted yet and is waited for like an unconfirmed delete.
async fn drain(state: &AppState, by: Deleter<'_>, host_id: &str) -> AppResult<Drain> {
    let mut out = Drain {
        confirmed: Vec::new(),
        waiting: Vec::new(),
    };
    for vm in state.store.live_vms_of_host(host_id).await? {
        if vm.status == VmStatus::Creating {
            out.waiting.push(vm.id);
            continue;
        }
        match instances::delete(state, by, &vm.id).await {
            Ok(d) if d.state == DeletionState::Deleted => out.confirmed.push(vm.id),
            Ok(_) => out.waiting.push(vm.id),
            Err(AppError::Conflict { .. }) => out.waiting.push(vm.id),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

fn waiting_message(d: &Drain) -> String {
    format!(
        "the host has not confirmed the end of {} instance(s) ({}); nothing further was done — \
         run it again to resume once the host answers",
        d.waiting.len(),
        d.waiting.join(", ")
    )
}

/// Revoke an enrolled host (H.1, H.2): de-pool, drain, and only once the host confirmed
/// the drain remove its access (relay, tunnel, DNS, `*.<slug>.ssh`) and clear what it was
/// issued. Each step is recorded on the host before the next (`revoke_step`); a run that
/// stops leaves the revoke in progress at that step, and running it again resumes it.
/// Revoke leaves the machine configured and the host not retired; retire may follow.
pub async fn revoke(state: &AppState, by: &Operator, host_id: &str) -> AppResult<HostProgress> {
    let h = lifecycle_row(state, host_id).await?;
    refuse_retired(&h)?;
    if h.pubkey.is_none() {
        return Err(AppError::conflict(
            "not_enrolled",
            "this host never redeemed its enrolment: revoke the enrolment instead (H), which \
             hands its allocation back",
        ));
    }
    let finished = |drain: Drain| HostProgress {
        host_id: host_id.to_owned(),
        step: Some(RevokeStep::Revoked),
        done: true,
        drain,
        message: "revoked: drained, its relay, tunnel and DNS removed, its tokens cleared".into(),
    };
    let none = || Drain {
        confirmed: Vec::new(),
        waiting: Vec::new(),
    };
    if h.revoke_step.0 == Some(RevokeStep::Revoked) {
        return Ok(finished(none()));
    }
    let now = state.clock.now();
    let sub = &by.0.user.sub;
    // 1. De-pool, recorded with the revoke.
    state
        .store
        .begin_revoke(host_id, REVOKE_REASON, sub, now)
        .await?;
    if h.revoke_requested_at.is_none() {
        state
            .store
            .audit(
                Some(sub),
                "host.revoke_requested",
                Some(host_id),
                json!({"slug": h.slug}),
                now,
            )
            .await?;
    }
    // 2. Drain; the host must confirm before anything of ours goes (H.2).
    let mut drained = none();
    if matches!(h.revoke_step.0, None | Some(RevokeStep::Draining)) {
        drained = drain(state, Deleter::Operator(&by.0), host_id).await?;
        if !drained.drained() {
            let message = waiting_message(&drained);
            state
                .store
                .audit(
                    Some(sub),
                    "host.revoke_stopped",
                    Some(host_id),
                    json!({"step": RevokeStep::Draining, "waiting": drained.waiting}),
                    state.clock.now(),
                )
                .await?;
            return Ok(HostProgress {
                host_id: host_id.to_owned(),
                step: Some(RevokeStep::Draining),
                done: false,
                drain: drained,
                message,
            });
        }
        state
            .store
            .set_revoke_step(host_id, RevokeStep::RemovingAccess)
            .await?;
    }
    // 3. Remove access: the same teardown reap makes, then the stamp.
    if let Err(e) = release_outside(state, &h.slug).await {
        state
            .store
            .audit(
                Some(sub),
                "host.revoke_stopped",
                Some(host_id),
                json!({"step": RevokeStep::RemovingAccess, "error": e.to_string()}),
                state.clock.now(),
            )
            .await?;
        return Err(provider_failed(
            "the revoke is drained but removing its access failed",
            e,
        ));
    }
    let now = state.clock.now();
    state.store.finish_revoke(host_id, now).await?;
    state
        .store
        .audit(
            Some(sub),
            "host.revoked",
            Some(host_id),
            json!({"slug": h.slug}),
            now,
        )
        .await?;
    Ok(finished(drained))
}

/// The owner stops hosting (issue #12, 9): de-pool and drain their own host — revoke's
/// first two steps, the same code — after which the uninstall instructions are theirs.
/// Anyone else's host is as absent as none.
pub async fn stop_hosting(
    state: &AppState,
    by: &CurrentUser,
    host_id: &str,
) -> AppResult<HostProgress> {
    let h = match state.store.host_lifecycle(host_id).await? {
        Some(h) if h.owner_sub == by.user.sub => h,
        _ => return Err(AppError::NotFound),
    };
    refuse_retired(&h)?;
    if h.pubkey.is_none() {
        return Err(AppError::conflict(
            "not_enrolled",
            "this GPU never enrolled, so it is not hosting anything",
        ));
    }
    let now = state.clock.now();
    if h.active || h.depooled_by.as_deref() != Some(by.user.sub.as_str()) {
        state
            .store
            .depool_host(host_id, STOP_REASON, &by.user.sub, now)
            .await?;
        state
            .store
            .audit(
                Some(&by.user.sub),
                "host.stop_hosting",
                Some(host_id),
                json!({"was_active": h.active}),
                now,
            )
            .await?;
    }
    let drained = drain(state, Deleter::HostOwner(by), host_id).await?;
    let done = drained.drained();
    let message = if done {
        "stopped: nobody is renting this GPU any more; uninstall when you are ready".to_owned()
    } else {
        waiting_message(&drained)
    };
    Ok(HostProgress {
        host_id: host_id.to_owned(),
        step: None,
        done,
        drain: drained,
        message,
    })
}

/// The host's agent finished `byo-agent uninstall` (issue #39, 3) and says so with the host
/// token it still held. The machine is its owner's again and holds nothing of ours, so the
/// host is stopped as its owner's stop-hosting stops it (if it was not already), the
/// instances still live on it end now — the uninstall deleted their containers, and this
/// is the host's confirmation, billing stops here — and `uninstalled_at` is stamped, so
/// `retire-stopped` retires it at its next run (N's order) rather than after a silent day.
/// Said again (an uninstall run twice), it changes nothing.
pub async fn host_uninstalled(
    state: &AppState,
    token: &byo_core::tokens::SecretToken,
) -> AppResult<crate::app::host_report::HostCall> {
    use crate::app::host_report::HostCall;
    let Some(host_id) = state.store.host_id_by_token(&token.hash()).await? else {
        return Ok(HostCall::InvalidToken);
    };
    let Some(h) = state.store.host_lifecycle(&host_id).await? else {
        return Ok(HostCall::InvalidToken);
    };
    let now = state.clock.now();
    if h.active
        || h.depool_reason.as_deref() != Some(STOP_REASON)
        || h.depooled_by.as_deref() != Some(h.owner_sub.as_str())
    {
        state
            .store
            .depool_host(&host_id, STOP_REASON, &h.owner_sub, now)
            .await?;
    }
    let mut ended = Vec::new();
    for vm in state.store.live_vms_of_host(&host_id).await? {
        state.store.request_vm_delete(&vm.id, now).await?;
        if state.store.confirm_vm_deleted(&vm.id, now).await? == GuardedWrite::Written {
            crate::app::notices::instance_ended(state, &vm.id, &vm.name, &vm.user_sub, now).await;
            ended.push(vm.name);
        }
    }
    if state.store.mark_uninstalled(&host_id, now).await? || !ended.is_empty() {
        state
            .store
            .audit(
                None,
                "host.uninstalled",
                Some(&host_id),
                json!({"slug": h.slug, "was_active": h.active, "instances_ended": ended}),
                now,
            )
            .await?;
    }
    Ok(HostCall::Recorded)
}

/// The owner cancels their own pending allocation (issue #39, A.4: "an owner who clicks and
/// never runs the command leaves a relay, an IPv4, a tunnel and an inactive hosts row
/// allocated"): the enrolment is revoked and reap hands everything back at once, as an
/// operator's revoke does, rather than when the token lapses. Only before the host redeemed;
/// after, the owner stops hosting instead. Someone else's host is 404, as one that does not
/// exist. Returns whether everything outside is already handed back (a provider failing
/// leaves the rest to reap's next sweep; the enrolment stays revoked either way).
pub async fn cancel_allocation(
    state: &AppState,
    by: &CurrentUser,
    host_id: &str,
) -> AppResult<bool> {
    let h = match state.store.host_lifecycle(host_id).await? {
        Some(h) if h.owner_sub == by.user.sub => h,
        _ => return Err(AppError::NotFound),
    };
    refuse_retired(&h)?;
    if h.pubkey.is_some() {
        return Err(AppError::conflict(
            "enrolled",
            "this GPU has enrolled, so there is no allocation to cancel; stop hosting it instead",
        ));
    }
    let open = state
        .store
        .enrollment_views(Some(&by.user.sub))
        .await?
        .into_iter()
        .find(|e| e.host_id.as_deref() == Some(host_id) && e.state.is_open());
    // Revoking is the guarded write: a redeem that wins the race leaves it refused.
    let revoked = match &open {
        Some(e) => state.store.revoke_enrollment(&e.id).await?,
        None => false,
    };
    if !revoked {
        if open.is_some()
            && let Some(refusal) = booked_refusal(state, Some(host_id)).await?
        {
            return Err(refusal);
        }
        return Err(AppError::conflict(
            "not_cancellable",
            "this GPU's command was already run, revoked or has lapsed; there is nothing to cancel",
        ));
    }
    let enrollment_id = open.map(|e| e.id).unwrap_or_default();
    let now = state.clock.now();
    state
        .store
        .audit(
            Some(&by.user.sub),
            "enrollment.cancel",
            Some(&enrollment_id),
            json!({"host_id": host_id, "slug": h.slug}),
            now,
        )
        .await?;
    let report = crate::app::reap::reap_once(state).await?;
    Ok(report.failed == 0)
}

/// Issue #39 (6): the refusal when an open pre-booking is pinned to the host whose
/// enrolment is being revoked (its host row cannot go while the booking names it), in
/// words an operator or owner can act on. `None` when no booking holds it.
pub async fn booked_refusal(
    state: &AppState,
    host_id: Option<&str>,
) -> AppResult<Option<AppError>> {
    let Some(host_id) = host_id else {
        return Ok(None);
    };
    Ok(state
        .store
        .open_booking_on_host(host_id)
        .await?
        .map(|booking| {
            AppError::conflict(
                "booked",
                format!(
                    "pre-booking {booking} is pinned to this host, so its allocation cannot be \
                     handed back until an operator reassigns or cancels that booking \
                     (/admin/prebookings); nothing was changed"
                ),
            )
        }))
}

/// Retire (N): only a host already out of service whose enrolment completed; outside first
/// (relay and address, `*.<slug>.ssh`, tunnel and DNS — each idempotent), the stamp last.
/// A provider failing part way stamps nothing; retire run again carries on.
pub async fn retire(state: &AppState, by: &Operator, host_id: &str) -> AppResult<()> {
    let h = lifecycle_row(state, host_id).await?;
    retire_refusal(state, &h, state.clock.now()).await?;
    let details = json!({"slug": h.slug, "revoked": h.revoked_at.is_some()});
    retire_refusals_passed(state, Some(&by.0.user.sub), &h, details).await
}

/// N.1's and N.5's refusals, read before anything outside is touched: the operator's
/// retire and retire-stopped's (issue #39, 3) answer the same ones.
pub async fn retire_refusal(
    state: &AppState,
    h: &HostLifecycleRow,
    now: DateTime<Utc>,
) -> AppResult<()> {
    refuse_retired(h)?;
    if h.active {
        return Err(AppError::conflict(
            "active",
            "this host is in placement: de-pool it first",
        ));
    }
    if h.dedicated {
        return Err(AppError::conflict(
            "dedicated",
            "this host is dedicated to a tenant: end the dedication first",
        ));
    }
    let blockers = state.store.retire_blockers(&h.id, now).await?;
    if blockers.live > 0 {
        return Err(AppError::conflict(
            "live_instance",
            "this host still has a live instance: drain it first (G)",
        ));
    }
    if blockers.booked > 0 {
        return Err(AppError::conflict(
            "prebooked",
            "this host is owed to a pre-booking whose window has not ended",
        ));
    }
    if h.pubkey.is_none() || blockers.enrollments.iter().any(|e| e.is_open()) {
        return Err(AppError::conflict(
            "revoke_instead",
            "this host's enrolment never completed: revoke the enrolment instead (H)",
        ));
    }
    if matches!(
        h.revoke_step.0,
        Some(RevokeStep::Draining | RevokeStep::RemovingAccess)
    ) {
        return Err(AppError::conflict(
            "revoke_in_progress",
            "a revoke of this host is in progress: finish it (run revoke again) before retiring",
        ));
    }
    Ok(())
}

/// Retire past its refusals: outside first, then the stamp (whose transaction checks live
/// instances and pre-bookings again), audited `host.retire` by `actor` (`None`: a job,
/// named in `details`).
pub(crate) async fn retire_refusals_passed(
    state: &AppState,
    actor: Option<&str>,
    h: &HostLifecycleRow,
    details: serde_json::Value,
) -> AppResult<()> {
    release_outside(state, &h.slug)
        .await
        .map_err(|e| provider_failed("retire stopped before the stamp", e))?;
    let now = state.clock.now();
    state
        .store
        .retire_host(&h.id, now)
        .await
        .map_err(|e| match e {
            DbError::Refused(r) if r == "host_has_live_instance" => {
                AppError::conflict("live_instance", "this host has a live instance again")
            }
            DbError::Refused(r) if r == "host_has_prebooking" => {
                AppError::conflict("prebooked", "this host is owed to a pre-booking")
            }
            e if e.breaks(byo_db::Rule::RetiredHostInactive) => {
                AppError::conflict("active", "this host was activated meanwhile")
            }
            other => other.into(),
        })?;
    state
        .store
        .audit(actor, "host.retire", Some(&h.id), details, now)
        .await?;
    super::notices::host_retired(state, &h.id, &h.slug, &h.owner_sub).await;
    Ok(())
}

/// Replace a dead relay (A.3) through relay-provision, not onboarding: the old relay is
/// released, a relay of the same name (relays are named by their host's slug) is booted
/// with the WireGuard key the host already trusts, the customer SSH wildcard is pointed at
/// it, and `GET /api/host/relay` answers its endpoint from then on.
pub async fn replace_relay(
    state: &AppState,
    by: &Operator,
    host_id: &str,
) -> AppResult<RelayReplaced> {
    let h = lifecycle_row(state, host_id).await?;
    refuse_retired(&h)?;
    if h.revoke_step.0.is_some() {
        return Err(AppError::conflict(
            "revoked",
            "this host is revoked (or being revoked); it gets no relay",
        ));
    }
    if h.pubkey.is_none() {
        return Err(AppError::conflict(
            "not_enrolled",
            "this host has not redeemed; its relay is onboarding's (revoke the enrolment to start again)",
        ));
    }
    let (key, host_pubkey, ssh_map_hash) = state
        .store
        .relay_rebuild(host_id)
        .await?
        .ok_or(AppError::NotFound)?;
    let (Some(key), Some(host_pubkey), Some(ssh_map_hash)) = (key, host_pubkey, ssh_map_hash)
    else {
        return Err(AppError::conflict(
            "relay_key_unknown",
            "this host was provisioned before relay keys were kept, so a new relay could not \
             be one its tunnel trusts; it needs enrolling again",
        ));
    };
    // The replacement fetches the kept key at its first boot: it must open, or nothing is
    // touched.
    host_provision::sealer(state)?
        .open(&crate::seal::SealedAt::relay_wg_key(host_id), &key)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("opening the relay key: {e}")))?;
    let bootstrap = match &state.config.relay_release {
        Some(release) => Some(
            host_provision::relay_bootstrap(
                state,
                host_id,
                &h.slug,
                &host_pubkey,
                &ssh_map_hash,
                release,
            )
            .await
            .map_err(AppError::Internal)?,
        ),
        None => None,
    };
    let now = state.clock.now();
    state.store.forget_relay_address(host_id).await?;
    // The instance goes, its reserved address stays: the replacement answers where the
    // host's WireGuard peer already points, so the host needs nothing (its next handshake
    // reaches the new relay, and its next heartbeat rewrites the relay's empty SSH map).
    state
        .relays
        .release_instance(&h.slug)
        .await
        .map_err(|e| provider_failed("releasing the old relay failed", e))?;
    host_provision::relay_provision(state, host_id, &h.slug, bootstrap.as_deref()).await;
    let row = state.store.host(host_id).await?.ok_or(AppError::NotFound)?;
    let relay = state.store.relay_record(host_id).await?;
    let Some(new_address) = relay
        .relay_ip
        .filter(|_| relay.relay_state.0 == Some(RelayState::Ready))
    else {
        return Err(provider_failed(
            "the old relay is released but the new one was not provisioned",
            relay
                .relay_error
                .unwrap_or_else(|| "no reason recorded".into()),
        ));
    };
    let same_address = h.relay_ip.as_deref() == Some(new_address.as_str());
    let name = row
        .relay_name
        .clone()
        .unwrap_or_else(|| format!("{}-relay", h.slug));
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "host.relay_replaced",
            Some(host_id),
            json!({"name": name, "old_address": h.relay_ip, "new_address": new_address}),
            now,
        )
        .await?;
    let message = if same_address {
        format!(
            "{name} was replaced at its address {new_address}: the host's tunnel reaches the new \
             relay on its own and its next heartbeat rewrites the relay's SSH map"
        )
    } else {
        format!(
            "{name} was released and provisioned again at {new_address}; the host learns it from \
             GET /api/host/relay"
        )
    };
    Ok(RelayReplaced {
        host_id: host_id.to_owned(),
        name,
        old_address: h.relay_ip,
        endpoint: wireguard_endpoint(&new_address),
        new_address,
        same_address,
        message,
    })
}

/// The owner's words for their host after go-live (issue #12, 9).
pub fn owner_state(
    h: &HostLifecycleRow,
    last_seen: Option<DateTime<Utc>>,
    live: usize,
    // The oldest heartbeat a host in service may have: placement's age, so the owner is
    // told "unreachable" exactly when creates stop landing there.
    heard_since: DateTime<Utc>,
) -> Option<String> {
    if h.retired_at.is_some() {
        // Issue #42, 7: the owner's next step, not a bare word.
        return Some(
            "retired: it is no longer rented and what was set aside for it is handed back; \
             run `sudo byo-agent uninstall` on the machine to give it back to yourself, or add it \
             again from this page"
                .into(),
        );
    }
    match h.revoke_step.0 {
        Some(RevokeStep::Revoked) => return Some("revoked by an operator".into()),
        Some(_) => return Some("being revoked by an operator".into()),
        None => {}
    }
    if h.activated_at.is_none() && h.depooled_at.is_none() {
        return None; // still onboarding: the enrolment's own words apply
    }
    let unreachable = match last_seen {
        Some(at) if at < heard_since => Some(at),
        _ => None,
    };
    let when = |t: DateTime<Utc>| t.format("%Y-%m-%d %H:%M UTC").to_string();
    Some(match (h.active, live > 0, unreachable) {
        (false, true, _) => format!("stopping: waiting for {live} instance(s) to end"),
        (false, false, _) => match h.depool_reason.as_deref() {
            Some(STOP_REASON) => "stopped: you can uninstall now".into(),
            Some(r) => format!("de-pooled: {r}"),
            None => "de-pooled".into(),
        },
        (true, _, Some(at)) => format!("unreachable since {}", when(at)),
        (true, true, None) => "renting: a customer is using it".into(),
        (true, false, None) => "idle: waiting for a customer".into(),
    })
}

/// Whether the owner's stop-hosting has finished (de-pooled by them, nothing live).
pub fn owner_stopped(h: &HostLifecycleRow, live: usize) -> bool {
    !h.active && live == 0 && h.depool_reason.as_deref() == Some(STOP_REASON)
}

/// The two uninstall commands the owner is shown once they stopped hosting (the
/// "uninstall" helper's spellings).
pub fn uninstall_commands(state: &AppState) -> [String; 2] {
    [
        "sudo byo-agent uninstall".to_owned(),
        format!(
            "curl -fsSL {}/install.sh | sudo bash -s -- --uninstall",
            state.config.public_url.trim_end_matches('/')
        ),
    ]
}

/// Who pressed reboot (L4.4: the customer's button and /admin's are this one call).
pub enum Rebooter<'a> {
    Customer(&'a CurrentUser),
    Operator(&'a Operator),
}

/// L4, a reboot of a host's machines through its agent: on a pair node1 first, both
/// deferred, so the answer (202) comes before anything goes down; a node1 that does not
/// answer does not block, and is named. Audited as `host.reboot`. What comes back after is
/// L2 then L3: nothing about the instance is rebuilt.
pub async fn reboot_host(
    state: &AppState,
    by: Rebooter<'_>,
    host_id: &str,
) -> AppResult<byo_wire::vm::HostRebooting> {
    let target = state.store.agent_target(host_id).await?.ok_or_else(|| {
        AppError::conflict(
            "host_gone",
            "this host is not in service: nothing to reboot",
        )
    })?;
    let rebooting = power_wait::within_power_wait(state.agents.reboot_host(&target)).await?;
    let (sub, role) = match by {
        Rebooter::Customer(u) => (&u.user.sub, "customer"),
        Rebooter::Operator(o) => (&o.0.user.sub, "operator"),
    };
    state
        .store
        .audit(
            Some(sub),
            "host.reboot",
            Some(host_id),
            json!({"by": role, "node0_in_secs": rebooting.node0_in_secs, "satellites": rebooting.satellites}),
            state.clock.now(),
        )
        .await?;
    Ok(rebooting)
}

/// What a reboot's answer says, for a page.
pub fn rebooting_message(r: &byo_wire::vm::HostRebooting) -> String {
    let mut parts: Vec<String> = r
        .satellites
        .iter()
        .map(|s| match (&s.error, s.rebooting) {
            (_, true) => format!("node{} is rebooting", s.node),
            (Some(e), false) => format!(
                "node{} could not be told ({e}); it reboots when it next can",
                s.node
            ),
            (None, false) => format!("node{} could not be told", s.node),
        })
        .collect();
    parts.push(format!(
        "node0 goes down in {} s; the instance comes back as it was",
        r.node0_in_secs
    ));
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use byo_wire::vm::{HostRebooting, SatelliteRebooting};

    use super::rebooting_message;

    #[test]
    fn a_reboots_message_names_each_satellite_and_node0() {
        let sat = |rebooting, error: Option<&str>| SatelliteRebooting {
            node: 1,
            rebooting,
            error: error.map(str::to_owned),
        };
        let said = |satellites| {
            rebooting_message(&HostRebooting {
                node0_in_secs: 3,
                satellites,
            })
        };
        assert_eq!(
            said(vec![]),
            "node0 goes down in 3 s; the instance comes back as it was"
        );
        assert!(
            said(vec![sat(true, None)]).starts_with("node1 is rebooting; node0 goes down in 3 s")
        );
        assert!(said(vec![sat(false, Some("timed out"))]).starts_with(
            "node1 could not be told (timed out); it reboots when it next can; node0"
        ));
        assert!(said(vec![sat(false, None)]).starts_with("node1 could not be told; node0"));
    }
}
