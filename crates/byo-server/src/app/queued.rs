//! E2's queue as its customer and operators see it: a create no host could take is queued
//! (step 58), its place in line, "keep waiting", cancel, an operator's close, and the
//! per-account limit a create and a queued create share. Placing the queued rows is the
//! drain's (`queue_drain`), which stands above the create (`instances`); this stands
//! below both.

use byo_db::DbError;
use byo_db::queue::{NewQueued, QueueClose, QueueCloseOutcome, QueueRow};
use byo_wire::vm::{AdminQueuedView, EndedQueuedView, InstanceQueued, QueueEnding, QueuedView};
use chrono::TimeDelta;
use serde_json::json;

use crate::auth::CurrentUser;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// The per-account limit's refusal, for every create path.
pub fn over_limit(state: &AppState) -> AppError {
    AppError::conflict(
        "instance_limit",
        format!(
            "an account may hold at most {} instances, live and queued together; delete one or \
             cancel a queued one first. Nothing was created or queued",
            state.config.instances.max_per_account
        ),
    )
}

/// How many open rows a listing shows.
pub const LIST_LIMIT: i64 = 500;

pub(crate) fn queued_view(row: &QueueRow, position: i64) -> QueuedView {
    QueuedView {
        id: row.id.clone(),
        gpu_type: row.gpu_type.clone(),
        position,
        created_at: row.created_at,
        attempts: row.attempts,
        last_error: row.last_error.clone(),
        last_error_at: row.last_error_at,
        expires_at: row.expires_at,
    }
}

/// Step 58: queue a create with no host (the caller has checked the gpu_type, the
/// staff-only rule and the key), under the per-account limit; nudge the drain.
pub async fn enqueue(
    state: &AppState,
    user_sub: &str,
    gpu_type: &str,
    ssh_key_id: &str,
) -> AppResult<InstanceQueued> {
    let now = state.clock.now();
    let new = NewQueued {
        user_sub,
        gpu_type,
        ssh_key_id,
        expires_at: state.config.instances.queue_expires_at(now),
    };
    let row = match state
        .store
        .enqueue_vm(new, now, state.config.instances.max_per_account)
        .await
    {
        Ok(row) => row,
        Err(DbError::Refused(rule)) if rule == "instance_limit" => return Err(over_limit(state)),
        Err(e) => return Err(e.into()),
    };
    state
        .store
        .audit(
            Some(user_sub),
            "queue.queued",
            Some(&row.id),
            json!({"gpu_type": gpu_type, "expires_at": row.expires_at}),
            now,
        )
        .await?;
    let position = position_of(state, user_sub, &row.id).await?;
    tracing::info!(queue = %row.id, %gpu_type, position, "create queued: no host free");
    if let Some(trigger) = state.drain.trigger() {
        trigger.nudge();
    }
    Ok(InstanceQueued {
        queued: queued_view(&row, position),
    })
}

/// The customer's open queued creates, with their places in line.
pub async fn mine(state: &AppState, by: &CurrentUser) -> AppResult<Vec<QueuedView>> {
    Ok(state
        .store
        .open_queue(Some(&by.user.sub), LIST_LIMIT)
        .await?
        .iter()
        .map(|q| queued_view(&q.row, q.position))
        .collect())
}

/// How far back a customer's ended queued creates are listed.
pub const ENDED_SHOWN_DAYS: i64 = 7;
/// How many of them.
pub const ENDED_SHOWN: i64 = 20;

/// The customer's queued creates that ended in the last [`ENDED_SHOWN_DAYS`], latest
/// first: what became of each (placed as which instance, cancelled, closed, expired).
pub async fn ended(state: &AppState, by: &CurrentUser) -> AppResult<Vec<EndedQueuedView>> {
    let since = state.clock.now() - TimeDelta::days(ENDED_SHOWN_DAYS);
    Ok(state
        .store
        .ended_queue(&by.user.sub, since, ENDED_SHOWN)
        .await?
        .into_iter()
        .filter_map(|row| {
            let ending = match QueueClose::parse(row.close_reason.as_deref()?)? {
                QueueClose::Placed => QueueEnding::Placed,
                QueueClose::PlacedByOperator => QueueEnding::PlacedByOperator,
                QueueClose::Cancelled => QueueEnding::Cancelled,
                QueueClose::ClosedByOperator => QueueEnding::ClosedByOperator,
                QueueClose::Expired => QueueEnding::Expired,
            };
            Some(EndedQueuedView {
                id: row.id,
                gpu_type: row.gpu_type,
                created_at: row.created_at,
                closed_at: row.closed_at?,
                ending,
                vm_id: row.vm_id,
                attempts: row.attempts,
                last_error: row.last_error,
            })
        })
        .collect())
}

/// The customer's "keep waiting": their open queued create lapses the configured age
/// from now instead. Someone else's, or one no longer open, is as absent as none.
pub async fn extend(state: &AppState, by: &CurrentUser, id: &str) -> AppResult<QueuedView> {
    let now = state.clock.now();
    let until = state.config.instances.queue_expires_at(now);
    let Some(row) = state.store.extend_queued(id, &by.user.sub, until).await? else {
        return Err(AppError::NotFound);
    };
    state
        .store
        .audit(
            Some(&by.user.sub),
            "queue.extended",
            Some(id),
            json!({"expires_at": until}),
            now,
        )
        .await?;
    let position = position_of(state, &by.user.sub, &row.id).await?;
    Ok(queued_view(&row, position))
}

/// An open row's place in its gpu_type's line, as the customer's list shows it.
pub(crate) async fn position_of(state: &AppState, user_sub: &str, id: &str) -> AppResult<i64> {
    Ok(state
        .store
        .open_queue(Some(user_sub), LIST_LIMIT)
        .await?
        .into_iter()
        .find(|q| q.row.id == id)
        .map_or(1, |q| q.position))
}

/// Every open queued create, oldest first (/admin/queue).
pub async fn open_rows(state: &AppState) -> AppResult<Vec<AdminQueuedView>> {
    Ok(state
        .store
        .open_queue(None, LIST_LIMIT)
        .await?
        .iter()
        .map(|q| AdminQueuedView {
            queued: queued_view(&q.row, q.position),
            user_sub: q.row.user_sub.clone(),
            email: q.email.clone(),
        })
        .collect())
}

pub(crate) fn placing_now() -> AppError {
    AppError::conflict(
        "placing",
        "this queued create is being placed on a host right now; wait for it to finish",
    )
}

/// The customer cancels one of their queued creates: `closed_at`, `cancelled`. Someone
/// else's is as absent as none.
pub async fn cancel(state: &AppState, by: &CurrentUser, id: &str) -> AppResult<()> {
    let now = state.clock.now();
    match state
        .store
        .close_queued(id, Some(&by.user.sub), QueueClose::Cancelled, now)
        .await?
    {
        QueueCloseOutcome::Closed => {}
        QueueCloseOutcome::NotOpen => return Err(AppError::NotFound),
        QueueCloseOutcome::Placing => return Err(placing_now()),
    }
    state
        .store
        .audit(
            Some(&by.user.sub),
            "queue.cancelled",
            Some(id),
            json!({}),
            now,
        )
        .await?;
    Ok(())
}

/// An operator closes a queued create (the row the drain would have closed, E0.1).
pub async fn close_by_operator(
    state: &AppState,
    by: &CurrentUser,
    id: &str,
    reason: &str,
) -> AppResult<()> {
    let reason = reason.trim();
    // The same bound as the API's body, for the page's form too.
    if let Err(breach) = byo_wire::limits::text("reason", reason, byo_wire::limits::MESSAGE) {
        return Err(AppError::out_of_bounds(breach));
    }
    if reason.is_empty() {
        return Err(AppError::bad_request(
            "reason_required",
            "say why the queued create is closed; the customer's record keeps it",
        ));
    }
    let now = state.clock.now();
    match state
        .store
        .close_queued(id, None, QueueClose::ClosedByOperator, now)
        .await?
    {
        QueueCloseOutcome::Closed => {}
        QueueCloseOutcome::NotOpen => return Err(not_queued(state, id).await),
        QueueCloseOutcome::Placing => return Err(placing_now()),
    }
    state
        .store
        .audit(
            Some(&by.user.sub),
            "queue.closed_by_operator",
            Some(id),
            json!({"reason": reason}),
            now,
        )
        .await?;
    Ok(())
}

/// 404 for an unknown row, 409 for one that is already closed.
pub(crate) async fn not_queued(state: &AppState, id: &str) -> AppError {
    match state.store.queue_row(id).await {
        Ok(Some(row)) => AppError::conflict(
            "not_queued",
            format!(
                "this queued create is already closed ({})",
                row.close_reason.as_deref().unwrap_or("closed")
            ),
        ),
        Ok(None) => AppError::NotFound,
        Err(e) => e.into(),
    }
}
