//! When a payment fails (issue #40, 2). An invoice whose payment was declined and is still
//! unpaid holds its account: the billing gate refuses it every create, queued create and
//! booking (`StripeBilling::check`, before Stripe is asked), and the customer is told once,
//! with the time their instances stop. Past `payment_grace_hours` the account's running
//! instances are stopped on their hosts — never deleted — each recorded in `payment_stops`
//! and audited; the customer cannot start them again by hand. Once the account owes nothing
//! declined (the invoice paid, by webhook or by a later `/pay`, or voided), they are started
//! again. Only instances running when the grace ran out are stopped, so one the customer had
//! stopped stays stopped.
//!
//! It runs in `bill-usage` after invoicing, and the release also right after the webhook
//! that saw the invoice paid, so a customer who pays waits seconds, not a run.

use anyhow::anyhow;
use byo_db::invoices::InvoiceRow;
use byo_wire::vm::VmAction;
use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;

use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// What one pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Instances stopped because their account's invoice stayed unpaid past the grace.
    pub stopped: usize,
    /// Instances started again because their account paid.
    pub started: usize,
    /// Stops and starts a host refused or did not answer (tried again next pass).
    pub failed: usize,
}

/// When the account's running instances stop: the decline plus the grace.
pub fn stop_at(declined_at: DateTime<Utc>, grace_hours: u32) -> DateTime<Utc> {
    declined_at + TimeDelta::hours(i64::from(grace_hours))
}

/// Tell each held account once; stop the instances of those past the grace; start the
/// instances of those that paid. A host that refuses or does not answer is counted and
/// retried next pass; the first such error is returned beside what was done.
pub async fn settle_once(
    state: &AppState,
    grace_hours: u32,
) -> AppResult<(Settled, Option<String>)> {
    let now = state.clock.now();
    let mut done = Settled::default();
    let mut first_error = None;
    for invoice in state.store.declined_unpaid_invoices().await? {
        let Some(declined) = invoice.payment_failed_at else {
            continue;
        };
        let stop = stop_at(declined, grace_hours);
        let amount = crate::billing::money(i64::from(invoice.amount_cents), &invoice.currency);
        super::notices::payment_failed(state, &invoice, &amount, stop).await;
        if now < stop {
            continue;
        }
        let names = stop_account(state, &invoice, now, &mut done, &mut first_error).await?;
        if !names.is_empty() {
            super::notices::instances_stopped(state, &invoice, &amount, &names).await;
        }
    }
    release(state, &mut done, &mut first_error).await?;
    Ok((done, first_error))
}

/// Stop the account's running instances for `invoice`; the names of those stopped.
async fn stop_account(
    state: &AppState,
    invoice: &InvoiceRow,
    now: DateTime<Utc>,
    done: &mut Settled,
    first_error: &mut Option<String>,
) -> AppResult<Vec<String>> {
    let mut names = Vec::new();
    for vm in state.store.running_vms_of(&invoice.user_sub).await? {
        if let Err(e) = power(state, &vm, VmAction::Stop).await {
            tracing::warn!(vm = %vm.vm_id, invoice = %invoice.id, error = %e, "unpaid: the instance could not be stopped; tried again next pass");
            first_error.get_or_insert_with(|| e.to_string());
            done.failed += 1;
            continue;
        }
        state
            .store
            .set_vm_power(&vm.vm_id, byo_wire::states::VmStatus::Stopped)
            .await?;
        state
            .store
            .record_payment_stop(&vm.vm_id, &vm.user_sub, &invoice.id, now)
            .await?;
        state
            .store
            .audit(
                None,
                "billing.instance_stopped",
                Some(&vm.vm_id),
                json!({"invoice_id": invoice.id, "user_sub": vm.user_sub,
                       "declined_at": invoice.payment_failed_at}),
                now,
            )
            .await?;
        tracing::info!(vm = %vm.vm_id, invoice = %invoice.id, "unpaid: instance stopped");
        done.stopped += 1;
        names.push(vm.name);
    }
    Ok(names)
}

/// Start again every instance stopped for payment whose account now owes nothing declined.
/// Each is claimed (its row deleted) before its host is asked, so two passes never start it
/// twice; a start that fails puts the row back for the next pass.
async fn release(
    state: &AppState,
    done: &mut Settled,
    first_error: &mut Option<String>,
) -> AppResult<()> {
    for vm in state.store.payment_stops_to_release().await? {
        let Some(invoice) = vm.invoice_id.clone() else {
            continue;
        };
        if state.store.release_payment_stop(&vm.vm_id).await? == byo_db::GuardedWrite::AlreadySet {
            continue;
        }
        let now = state.clock.now();
        if vm.leaving || vm.status != byo_wire::states::VmStatus::Stopped {
            // Deleted meanwhile (or started by an operator): nothing to start.
            continue;
        }
        if let Err(e) = power(state, &vm, VmAction::Start).await {
            tracing::warn!(vm = %vm.vm_id, error = %e, "paid: the instance could not be started; tried again next pass");
            first_error.get_or_insert_with(|| e.to_string());
            done.failed += 1;
            state
                .store
                .record_payment_stop(&vm.vm_id, &vm.user_sub, &invoice, now)
                .await?;
            continue;
        }
        state
            .store
            .set_vm_power(&vm.vm_id, byo_wire::states::VmStatus::Running)
            .await?;
        state
            .store
            .audit(
                None,
                "billing.instance_started",
                Some(&vm.vm_id),
                json!({"invoice_id": invoice, "user_sub": vm.user_sub}),
                now,
            )
            .await?;
        tracing::info!(vm = %vm.vm_id, invoice = %invoice, "paid: instance started again");
        done.started += 1;
    }
    Ok(())
}

/// The release alone, in the background: what the webhook starts when it sees an invoice
/// paid. Its failures are logged; the next `bill-usage` pass retries them.
pub fn release_soon(state: &AppState) {
    let state = state.clone();
    tokio::spawn(async move {
        let mut done = Settled::default();
        let mut first_error = None;
        match release(&state, &mut done, &mut first_error).await {
            Ok(()) if done.started > 0 || done.failed > 0 => {
                tracing::info!(started = done.started, failed = done.failed, error = ?first_error, "paid: instances released");
            }
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "paid: the release failed; bill-usage retries it"),
        }
    });
}

async fn power(
    state: &AppState,
    vm: &byo_db::invoices::PaymentStopVm,
    action: VmAction,
) -> AppResult<()> {
    let host_id = vm
        .host_id
        .as_deref()
        .ok_or_else(|| AppError::Internal(anyhow!("instance {} has no host", vm.vm_id)))?;
    let target = state.store.agent_target(host_id).await?.ok_or_else(|| {
        AppError::Internal(anyhow!(
            "instance {}'s host is no longer in service",
            vm.vm_id
        ))
    })?;
    super::power_wait::within_power_wait(state.agents.vm_action(&target, &vm.name, action)).await
}
