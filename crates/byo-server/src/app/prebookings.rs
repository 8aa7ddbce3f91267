//! Pre-bookings (E3, steps 65–74): a booking buys a named box for a date range. The host
//! is pinned when the booking is made; the window opening is the trigger, so nobody is
//! present when it launches.
//!
//! - Booking: a customer books a gpu_type for [start, end) (whole UTC hours, the start in
//!   the future, at most [`MAX_WINDOW_DAYS`] long, at most [`MAX_LEAD_DAYS`] ahead); the
//!   host is picked and pinned then (`Store::book_prebooking`), and no host is pinned by
//!   two open bookings whose windows overlap (`prebookings_host_not_double_booked`, for
//!   every writer). A booker holds at most [`MAX_OPEN_UNPAID`] open unpaid bookings, so
//!   nobody squats every box's calendar without paying. An unpaid booking can be cancelled
//!   by its booker.
//! - Payment (E3.1): with billing off, payment is collected off-band and a superadmin
//!   records it ([`record_payment`], the one route to `mark_prebooking_paid` besides the
//!   billing helper's verified webhook); with billing on, through Checkout, and the
//!   off-band route stays beside it with a reason, audited. A paid booking cancelled before
//!   its window opens is refunded in full; a superadmin refunds any, with a reason.
//! - The launcher ([`launch_once`], job `launch-prebookings`): for open, paid bookings
//!   whose window is open; the gate is `paid_at` alone (no live billing check, the
//!   deliberate difference from E2). The pinned host only (a legacy row without one: the
//!   pool); a pin that is unavailable leaves the booking open with the reason recorded
//!   (`launch_note`) and visible, tried again next tick, never re-placed elsewhere (E3.2).
//!   Step 67 is a self-heal: a `launched_vm_id` naming a row that is not live relaunches
//!   (E3.3). The key is the booker's own, the newest in their ssh_keys (E3.5). The create is
//!   E1's walk (`instances::place_booking`): the row written with `prebooking_id` and the
//!   booking stamped in one transaction before the host is contacted.
//! - expire-prebook ([`expire_once`]): at `end_date` the booking's instance is deleted
//!   through G's one delete (`instances::delete`, trigger 5) and then the booking closes;
//!   a delete the host does not confirm stays requested, visible as a stuck delete.
//! - Caller 5 ([`launch`]): a superadmin launches a booking by id now. Without force it
//!   refuses a closed booking, one outside its window, one already live; force revives a
//!   booking torn down inside its own window (reopens a closed one) and may launch before
//!   the window opens; nothing launches a booking whose window has ended.
//! - Operators reassign an open booking's pin ([`reassign`], E3.2).

use std::time::Duration;

use byo_db::GuardedWrite;
use byo_db::hosts::HostRow;
use byo_db::prebookings::{ClosedReason, NewPrebooking, PrebookingListRow, PrebookingRow};
use byo_db::vms::VmRow;
use byo_wire::prebooking::{PrebookingRequest, PrebookingState, PrebookingView};
use chrono::{DateTime, TimeDelta, Timelike, Utc};
use serde_json::json;

use crate::app::instances::{self, Deleter, Placing};
use crate::auth::{CurrentUser, Operator, Superadmin};
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// The longest window one booking may hold.
pub const MAX_WINDOW_DAYS: i64 = 31;
/// How far ahead a window may start.
pub const MAX_LEAD_DAYS: i64 = 365;
/// Open unpaid bookings one account may hold at once.
pub const MAX_OPEN_UNPAID: i64 = 3;
pub use super::placement::LAUNCH_EVERY;
/// How often expire-prebook runs.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(60);
/// How many bookings operators' list shows.
pub const OVERVIEW_LIMIT: i64 = 500;

/// Whether an instance row is live: not confirmed deleted, not a failed create.
fn live(vm: &VmRow) -> bool {
    vm.phase().is_live()
}

async fn launched_live(state: &AppState, row: &PrebookingRow) -> AppResult<Option<VmRow>> {
    let Some(id) = row.launched_vm_id.as_deref() else {
        return Ok(None);
    };
    Ok(state.store.vm(id).await?.filter(live))
}

/// The booking's state in its booker's words.
pub fn state_of(row: &PrebookingRow, vm_live: bool, now: DateTime<Utc>) -> PrebookingState {
    if row.closed_at.is_some() {
        PrebookingState::Closed
    } else if vm_live {
        PrebookingState::Launched
    } else if row.paid_at.is_none() {
        PrebookingState::Unpaid
    } else if now < row.start_date {
        PrebookingState::PaidWaiting
    } else {
        PrebookingState::Waiting
    }
}

/// How an unpaid booking is paid, where this installation takes payment.
pub fn how_to_pay(state: &AppState) -> String {
    if state.billing.enabled() {
        "pay for it through checkout; it is marked paid when the payment is confirmed, and \
         launches when its window opens"
            .to_owned()
    } else {
        "payment is collected off-band: contact the operators, who record it here; the \
         booking launches when its window opens once it is paid"
            .to_owned()
    }
}

async fn view_of(
    state: &AppState,
    row: &PrebookingRow,
    operator: Option<(&Option<String>, &str)>,
) -> AppResult<PrebookingView> {
    let now = state.clock.now();
    let vm_live = launched_live(state, row).await?.is_some();
    let st = state_of(row, vm_live, now);
    Ok(PrebookingView {
        id: row.id.clone(),
        gpu_type: row.gpu_type.clone(),
        start_date: row.start_date,
        end_date: row.end_date,
        state: st,
        paid_at: row.paid_at,
        launched_vm_id: row.launched_vm_id.clone(),
        launch_note: row.launch_note.clone(),
        launch_note_at: row.launch_note_at,
        closed_at: row.closed_at,
        closed_reason: row.closed_reason.clone(),
        created_at: row.created_at,
        how_to_pay: (st == PrebookingState::Unpaid).then(|| how_to_pay(state)),
        host_slug: operator.and_then(|(slug, _)| slug.clone()),
        host_id: operator.and(row.host_id.clone()),
        booker_email: operator.map(|(_, email)| email.to_owned()),
    })
}

/// A booking as its booker sees it.
pub async fn view(state: &AppState, row: &PrebookingRow) -> AppResult<PrebookingView> {
    view_of(state, row, None).await
}

/// A booking as operators see it (its host and booker).
pub async fn operator_view(state: &AppState, row: &PrebookingListRow) -> AppResult<PrebookingView> {
    view_of(
        state,
        &row.booking,
        Some((&row.host_slug, row.booker_email.as_str())),
    )
    .await
}

fn whole_hour(t: DateTime<Utc>) -> bool {
    t.minute() == 0 && t.second() == 0 && t.nanosecond() == 0
}

/// Book `req.gpu_type` for its window, pinning a host now (E3.2).
pub async fn book(
    state: &AppState,
    by: &CurrentUser,
    req: &PrebookingRequest,
) -> AppResult<PrebookingView> {
    let gpu_type = req.gpu_type.trim();
    if !instances::valid_gpu_type(gpu_type) {
        return Err(AppError::bad_request(
            "invalid_gpu_type",
            "a gpu_type is 1 to 64 of lowercase letters, digits and -, like spark-1",
        ));
    }
    // Staff-only GPU types are refused to customers here as at rent time (one rule).
    instances::check_may_rent(state, &by.roles, gpu_type).await?;
    instances::check_may_charge(state, &by.user.sub).await?;
    let now = state.clock.now();
    let (start, end) = (req.start_date, req.end_date);
    if !whole_hour(start) || !whole_hour(end) {
        return Err(AppError::bad_request(
            "invalid_window",
            "a booking starts and ends on a whole hour (UTC)",
        ));
    }
    if start <= now {
        return Err(AppError::bad_request(
            "invalid_window",
            "a booking starts in the future",
        ));
    }
    if end <= start {
        return Err(AppError::bad_request(
            "invalid_window",
            "a booking ends after it starts",
        ));
    }
    if end - start > TimeDelta::days(MAX_WINDOW_DAYS) {
        return Err(AppError::bad_request(
            "invalid_window",
            format!("a booking is at most {MAX_WINDOW_DAYS} days long"),
        ));
    }
    if start - now > TimeDelta::days(MAX_LEAD_DAYS) {
        return Err(AppError::bad_request(
            "invalid_window",
            format!("a booking starts at most {MAX_LEAD_DAYS} days ahead"),
        ));
    }
    let sub = by.user.sub.as_str();
    // A racing booking that took the same host between our pick and our insert is
    // refused by the trigger; the next try picks the next host.
    let mut tries = 0;
    let row = loop {
        tries += 1;
        let new = NewPrebooking {
            user_sub: sub,
            gpu_type,
            start_date: start,
            end_date: end,
        };
        match state.store.book_prebooking(new, MAX_OPEN_UNPAID, now).await {
            Ok(row) => break row,
            Err(e) if e.breaks(byo_db::Rule::HostDoubleBooked) && tries < 3 => {
                continue;
            }
            Err(e) if e.breaks(byo_db::Rule::UnpaidBookingCap) => {
                return Err(AppError::conflict(
                    "unpaid_cap",
                    format!(
                        "you already hold {MAX_OPEN_UNPAID} unpaid bookings; pay or cancel one first"
                    ),
                ));
            }
            Err(e)
                if e.breaks(byo_db::Rule::NoHostForWindow)
                    || e.breaks(byo_db::Rule::HostDoubleBooked) =>
            {
                return Err(AppError::conflict(
                    "no_host_for_window",
                    format!("no {gpu_type} host is free for that whole window; nothing was booked"),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    };
    state
        .store
        .audit(
            Some(sub),
            "prebooking.booked",
            Some(&row.id),
            json!({"host_id": row.host_id, "gpu_type": row.gpu_type,
                   "start_date": row.start_date, "end_date": row.end_date}),
            now,
        )
        .await?;
    view(state, &row).await
}

/// The caller's bookings, newest window first.
pub async fn mine(state: &AppState, by: &CurrentUser) -> AppResult<Vec<PrebookingView>> {
    let rows = state.store.prebookings_of(&by.user.sub).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        out.push(view(state, row).await?);
    }
    Ok(out)
}

/// Every booking, for operators.
pub async fn overview(state: &AppState) -> AppResult<Vec<PrebookingView>> {
    let rows = state.store.prebookings_overview(OVERVIEW_LIMIT).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        out.push(operator_view(state, row).await?);
    }
    Ok(out)
}

async fn booking(state: &AppState, id: &str) -> AppResult<PrebookingRow> {
    state.store.prebooking(id).await?.ok_or(AppError::NotFound)
}

fn closed(row: &PrebookingRow) -> AppError {
    AppError::conflict(
        "booking_closed",
        format!(
            "this booking is closed ({})",
            row.closed_reason.as_deref().unwrap_or("closed")
        ),
    )
}

/// The booker cancels one of their open, unpaid bookings; anyone else's is as absent as
/// none.
pub async fn cancel(state: &AppState, by: &CurrentUser, id: &str) -> AppResult<PrebookingView> {
    let row = booking(state, id).await?;
    if row.user_sub != by.user.sub {
        return Err(AppError::NotFound);
    }
    if row.closed_at.is_some() {
        return Err(closed(&row));
    }
    let now = state.clock.now();
    if row.paid_at.is_some() {
        return cancel_paid(state, by, &row, now).await;
    }
    if state.store.cancel_prebooking(id, &by.user.sub, now).await? == GuardedWrite::AlreadySet {
        // Paid or closed between the read and the write.
        return Err(AppError::conflict(
            "booking_changed",
            "this booking was paid or closed meanwhile; nothing was cancelled",
        ));
    }
    state
        .store
        .audit(
            Some(&by.user.sub),
            "prebooking.cancelled",
            Some(id),
            json!({}),
            now,
        )
        .await?;
    view(state, &booking(state, id).await?).await
}

/// The rule for a paid booking (issue #40, 5): cancelled before its window opens, its
/// Checkout payment is refunded in full; from the opening on, nothing is refunded and it is
/// not cancelled here (operators may still refund it, with a reason).
async fn cancel_paid(
    state: &AppState,
    by: &CurrentUser,
    row: &PrebookingRow,
    now: DateTime<Utc>,
) -> AppResult<PrebookingView> {
    if !state.billing.enabled() || state.store.booking_payment(&row.id).await?.is_none() {
        return Err(AppError::conflict(
            "booking_paid",
            "this booking was paid off-band: ask the operators to cancel it and return the payment",
        ));
    }
    if row.start_date <= now {
        return Err(AppError::conflict(
            "window_open",
            "a paid booking is refunded only when cancelled before its window opens; this one has opened",
        ));
    }
    super::billing::refund_booking(
        state,
        &row.id,
        "cancelled by the booker before the window opened",
        &by.user.sub,
    )
    .await?;
    if state
        .store
        .cancel_paid_prebooking(&row.id, &by.user.sub, now)
        .await?
        == GuardedWrite::AlreadySet
    {
        tracing::warn!(prebooking = %row.id, "refunded, but the booking closed meanwhile");
    }
    state
        .store
        .audit(
            Some(&by.user.sub),
            "prebooking.cancelled",
            Some(&row.id),
            json!({"refunded": true}),
            now,
        )
        .await?;
    view(state, &booking(state, &row.id).await?).await
}

/// A superadmin refunds a booking's Checkout payment in full, with a reason (issue #40, 5),
/// whatever its window; the booking itself is left as it is.
pub async fn refund(
    state: &AppState,
    by: &Superadmin,
    id: &str,
    reason: &str,
) -> AppResult<PrebookingView> {
    let reason = reason.trim();
    if reason.is_empty() {
        return Err(AppError::bad_request(
            "reason_required",
            "say why the booking is refunded: the reason is audited",
        ));
    }
    let row = booking(state, id).await?;
    super::billing::refund_booking(state, &row.id, reason, &by.0.user.sub).await?;
    overview_of(state, &booking(state, id).await?).await
}

/// A superadmin records a payment collected off-band (E3.1). With billing on too (the
/// design keeps the off-band path beside Checkout), but then only with a reason, audited.
pub async fn record_payment(
    state: &AppState,
    by: &Superadmin,
    id: &str,
    reason: Option<&str>,
) -> AppResult<PrebookingView> {
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    if state.billing.enabled() && reason.is_none() {
        return Err(AppError::bad_request(
            "reason_required",
            "billing is on: a payment recorded by hand, beside Checkout, needs a reason (it is audited)",
        ));
    }
    let row = booking(state, id).await?;
    if row.closed_at.is_some() {
        return Err(closed(&row));
    }
    let now = state.clock.now();
    if state.store.mark_prebooking_paid(id, now).await? == GuardedWrite::AlreadySet {
        return Err(AppError::conflict(
            "already_paid",
            "this booking is already paid; its payment time is kept",
        ));
    }
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "prebooking.paid",
            Some(id),
            json!({"recorded": "off_band", "reason": reason}),
            now,
        )
        .await?;
    let row = booking(state, id).await?;
    overview_of(state, &row).await
}

/// One booking as operators see it.
async fn overview_of(state: &AppState, row: &PrebookingRow) -> AppResult<PrebookingView> {
    let slug = match row.host_id.as_deref() {
        Some(h) => state.store.host(h).await?.map(|h| h.slug),
        None => None,
    };
    let email = state
        .store
        .user(&row.user_sub)
        .await?
        .map_or_else(|| row.user_sub.clone(), |u| u.email);
    view_of(state, row, Some((&slug, &email))).await
}

/// Whether a create for `booker` may land on `host` by placement's standing rules (not
/// counting its heartbeat, its bench or what it holds now).
fn placeable_for(host: &HostRow, booker: &str) -> bool {
    host.active
        && host.retired_at.is_none()
        && ((!host.dedicated && host.placement.as_deref() == Some("shared"))
            || (host.dedicated && host.dedicated_to.as_deref() == Some(booker)))
}

/// An operator pins an open booking to another host (E3.2: "an operator to reassign").
pub async fn reassign(
    state: &AppState,
    by: &Operator,
    id: &str,
    host_id: &str,
) -> AppResult<PrebookingView> {
    let row = booking(state, id).await?;
    if row.closed_at.is_some() {
        return Err(closed(&row));
    }
    let host =
        state.store.host(host_id).await?.ok_or_else(|| {
            AppError::bad_request("unknown_host", "there is no host with that id")
        })?;
    if host.gpu_type != row.gpu_type {
        return Err(AppError::conflict(
            "wrong_gpu_type",
            format!(
                "that host is {}, the booking is for {}",
                host.gpu_type, row.gpu_type
            ),
        ));
    }
    if !placeable_for(&host, &row.user_sub) {
        return Err(AppError::conflict(
            "host_not_placeable",
            "that host is not in service for this booker (inactive, retired, or not in the shared placement)",
        ));
    }
    if launched_live(state, &row).await?.is_some() {
        return Err(AppError::conflict(
            "already_live",
            "this booking's instance is live on its current host; delete it before moving the booking",
        ));
    }
    match state.store.reassign_prebooking(id, host_id).await {
        Ok(GuardedWrite::Written) => {}
        Ok(GuardedWrite::AlreadySet) => return Err(closed(&row)),
        Err(e) if e.breaks(byo_db::Rule::HostDoubleBooked) => {
            return Err(AppError::conflict(
                "host_booked",
                "another open booking holds that host for an overlapping window",
            ));
        }
        Err(e) => return Err(e.into()),
    }
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "prebooking.reassigned",
            Some(id),
            json!({"from": row.host_id, "to": host_id}),
            state.clock.now(),
        )
        .await?;
    overview_of(state, &booking(state, id).await?).await
}

/// What one launch of one booking came to.
#[derive(Debug)]
pub enum Launch {
    /// The host took it: the booking's new instance.
    Launched(String),
    /// Its instance is live already (step 67: nothing to do).
    Live(String),
    /// Not launched; why, as recorded on the booking.
    Waiting(String),
}

/// Why the pinned host cannot take the booking now, in words the booker and operators
/// read.
async fn unavailable(state: &AppState, row: &PrebookingRow, host_id: &str) -> AppResult<String> {
    let tail =
        "the booking stays open, is tried again each minute, and an operator can reassign it";
    let Some(host) = state.store.host(host_id).await? else {
        return Ok(format!("its pinned host no longer exists; {tail}"));
    };
    let why = if host.retired_at.is_some() {
        "its pinned host is retired".to_owned()
    } else if !host.active {
        "its pinned host is out of service".to_owned()
    } else if !placeable_for(&host, &row.user_sub) {
        "its pinned host is no longer in the shared placement".to_owned()
    } else {
        let now = state.clock.now();
        let seen = state.store.host_status(host_id).await?.map(|s| s.seen_at);
        let bench = state.store.host_bench(host_id).await?;
        let held = state.store.live_vms_on_host(host_id).await?;
        if seen.is_none_or(|s| s < state.config.placement.seen_since(now)) {
            match seen {
                Some(s) => format!(
                    "its pinned host has not been heard from since {}",
                    s.format("%Y-%m-%d %H:%M UTC")
                ),
                None => "its pinned host has never been heard from".to_owned(),
            }
        } else if bench.as_ref().is_some_and(|b| b.in_effect()) {
            "its pinned host is benched after creates it did not take".to_owned()
        } else if held.iter().any(|v| v.user_sub == row.user_sub) {
            "its pinned host holds another of your instances".to_owned()
        } else if !held.is_empty() {
            "its pinned host is occupied by another instance".to_owned()
        } else {
            "its pinned host is not reachable".to_owned()
        }
    };
    Ok(format!("{why}; {tail}"))
}

/// Launch one booking now if it is not live: the booker's key, the pinned host (or the
/// pool for a legacy row), E1's create. Neither the window nor the payment is checked
/// here: the launcher's scan and the operator's launch decide those.
async fn launch_one(state: &AppState, row: &PrebookingRow) -> AppResult<Launch> {
    // Step 67: read the row's liveness, never trust launched_vm_id alone (E3.3).
    if let Some(vm) = launched_live(state, row).await? {
        return Ok(Launch::Live(vm.id));
    }
    // E3.5: the booker's own key, by user_sub: the newest they hold.
    let Some(key) = state.store.ssh_keys_of(&row.user_sub).await?.pop() else {
        return Ok(Launch::Waiting(
            "the booker's account has no SSH key; the booking stays open and launches at the next tick once one is added"
                .to_owned(),
        ));
    };
    let mut candidates = state
        .store
        .pick_hosts_for_gpu(instances::host_pick(
            state,
            &row.gpu_type,
            &row.user_sub,
            Some(&row.id),
        ))
        .await?;
    match row.host_id.as_deref() {
        // E3.2: the pinned host, never another.
        Some(pin) => {
            candidates.retain(|h| h.id == pin);
            if candidates.is_empty() {
                return Ok(Launch::Waiting(unavailable(state, row, pin).await?));
            }
        }
        // A legacy row without a pin: the pool pick.
        None => {
            if candidates.is_empty() {
                return Ok(Launch::Waiting(format!(
                    "no {} host is free in the pool; the booking stays open and is tried again each minute",
                    row.gpu_type
                )));
            }
        }
    }
    let request = Placing {
        user_sub: row.user_sub.clone(),
        gpu_type: row.gpu_type.clone(),
        ssh_public_key: key.public_key,
        prebooking_id: Some(row.id.clone()),
    };
    match instances::place_booking(state, request, candidates).await {
        Ok(created) => Ok(Launch::Launched(created.instance.id)),
        Err(AppError::Internal(e)) => Err(AppError::Internal(e)),
        Err(e) => Ok(Launch::Waiting(format!(
            "the launch did not complete: {e}; the booking stays open and is tried again each minute"
        ))),
    }
}

/// Record what a launch came to on the booking (a note only when it waits; audited when
/// the reason changes, so a booking waiting for hours is one entry, not one per tick).
async fn record(
    state: &AppState,
    row: &PrebookingRow,
    outcome: &Launch,
    by: Option<&str>,
) -> AppResult<()> {
    let now = state.clock.now();
    match outcome {
        Launch::Launched(vm_id) => {
            state
                .store
                .audit(
                    by,
                    "prebooking.launched",
                    Some(&row.id),
                    json!({"vm_id": vm_id, "host_id": row.host_id}),
                    now,
                )
                .await?;
            super::notices::booking_launched(state, &row.id, &row.user_sub, vm_id).await;
        }
        Launch::Live(_) => {}
        Launch::Waiting(note) => {
            state
                .store
                .record_prebooking_note(&row.id, Some(note), now)
                .await?;
            if row.launch_note.as_deref() != Some(note.as_str()) {
                tracing::warn!(prebooking = %row.id, reason = %note, "pre-booking not launched");
                state
                    .store
                    .audit(
                        by,
                        "prebooking.waiting",
                        Some(&row.id),
                        json!({"reason": note}),
                        now,
                    )
                    .await?;
            }
        }
    }
    Ok(())
}

/// What one launcher tick did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LaunchSweep {
    pub due: usize,
    pub launched: usize,
    pub live: usize,
    pub waiting: usize,
}

/// The launcher (job `launch-prebookings`): every open, paid booking whose window is
/// open, launched if it is not live.
pub async fn launch_once(state: &AppState) -> AppResult<LaunchSweep> {
    let due = state.store.prebookings_due(state.clock.now()).await?;
    let mut sweep = LaunchSweep {
        due: due.len(),
        ..Default::default()
    };
    for row in &due {
        let outcome = launch_one(state, row).await?;
        record(state, row, &outcome, None).await?;
        match outcome {
            Launch::Launched(_) => sweep.launched += 1,
            Launch::Live(_) => sweep.live += 1,
            Launch::Waiting(_) => sweep.waiting += 1,
        }
    }
    Ok(sweep)
}

/// Caller 5: a superadmin launches booking `id` now, whatever the tick.
pub async fn launch(
    state: &AppState,
    by: &Superadmin,
    id: &str,
    force: bool,
) -> AppResult<PrebookingView> {
    let mut row = booking(state, id).await?;
    let now = state.clock.now();
    let sub = by.0.user.sub.as_str();
    if now >= row.end_date {
        return Err(AppError::conflict(
            "window_ended",
            "this booking's window has ended; expire-prebook closes it, and nothing launches it",
        ));
    }
    if launched_live(state, &row).await?.is_some() {
        return Err(AppError::conflict(
            "already_live",
            "this booking's instance is live; there is nothing to launch",
        ));
    }
    if row.closed_at.is_some() {
        if !force {
            return Err(AppError::conflict(
                "booking_closed",
                "this booking is closed; launching with force revives it inside its own window",
            ));
        }
        match state.store.reopen_prebooking(id).await {
            Ok(_) => {}
            Err(e) if e.breaks(byo_db::Rule::HostDoubleBooked) => {
                return Err(AppError::conflict(
                    "host_booked",
                    "another open booking holds its host for an overlapping window; reassign it first",
                ));
            }
            Err(e) => return Err(e.into()),
        }
        state
            .store
            .audit(
                Some(sub),
                "prebooking.revived",
                Some(id),
                json!({"was": row.closed_reason}),
                now,
            )
            .await?;
        row = booking(state, id).await?;
    }
    if now < row.start_date && !force {
        return Err(AppError::conflict(
            "outside_window",
            "this booking's window has not opened; launching with force starts it early",
        ));
    }
    let outcome = launch_one(state, &row).await?;
    record(state, &row, &outcome, Some(sub)).await?;
    if let Launch::Waiting(note) = outcome {
        return Err(AppError::conflict("not_launched", note));
    }
    state
        .store
        .audit(
            Some(sub),
            "prebooking.operator_launch",
            Some(id),
            json!({"force": force}),
            now,
        )
        .await?;
    overview_of(state, &booking(state, id).await?).await
}

/// What one expire-prebook tick did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExpireSweep {
    pub closed: usize,
    /// Closed with the instance's delete requested and not confirmed (a stuck delete).
    pub unconfirmed: usize,
    /// Left open this tick: the instance could not be deleted yet (still being created).
    pub deferred: usize,
}

/// expire-prebook (E3.4, G's trigger 5): each open booking whose window has ended has its
/// instance deleted through G and is then closed.
pub async fn expire_once(state: &AppState) -> AppResult<ExpireSweep> {
    let ended = state.store.prebookings_ended(state.clock.now()).await?;
    let mut sweep = ExpireSweep::default();
    for row in &ended {
        let mut deletion = None;
        if let Some(vm) = launched_live(state, row).await? {
            match instances::delete(state, Deleter::Job("expire-prebook"), &vm.id).await {
                Ok(d) => deletion = Some(d.state),
                Err(e @ AppError::Internal(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(prebooking = %row.id, vm = %vm.id, error = %e, "window ended; the instance cannot be deleted yet");
                    sweep.deferred += 1;
                    continue;
                }
            }
        }
        let now = state.clock.now();
        if state
            .store
            .close_prebooking(&row.id, ClosedReason::Ended, now)
            .await?
            == GuardedWrite::Written
        {
            sweep.closed += 1;
            let confirmed = deletion.map(|d| d == byo_wire::vm::DeletionState::Deleted);
            if confirmed == Some(false) {
                sweep.unconfirmed += 1;
            }
            state
                .store
                .audit(
                    None,
                    "prebooking.closed",
                    Some(&row.id),
                    json!({"reason": "ended", "vm_id": row.launched_vm_id,
                           "delete_confirmed": confirmed}),
                    now,
                )
                .await?;
        }
    }
    Ok(sweep)
}
