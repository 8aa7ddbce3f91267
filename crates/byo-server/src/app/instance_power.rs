//! A customer's start, stop or reboot of one of their instances (F's power actions). Above
//! both the instance and the host lifecycle: on a pair the customer's reboot is the pair's
//! reboot, `host_lifecycle::reboot_host`'s.

use byo_wire::states::{InstancePhase, VmStatus};
use byo_wire::vm::{InstanceView, VmAction};

use serde_json::json;

use crate::app::instances::{PAYMENT_REQUIRED, view};
use crate::app::power_wait::within_power_wait;
use crate::auth::CurrentUser;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// Start, stop or reboot one of the customer's live instances on its host. The row moves
/// only once the host carried it out; a refusal (502) or silence (504) changes nothing.
pub async fn change_power(
    state: &AppState,
    by: &CurrentUser,
    vm_id: &str,
    action: VmAction,
) -> AppResult<InstanceView> {
    let row = state.store.vm(vm_id).await?.ok_or(AppError::NotFound)?;
    if row.user_sub != by.user.sub {
        return Err(AppError::NotFound);
    }
    let live = matches!(row.phase(), InstancePhase::Running | InstancePhase::Stopped);
    if !live {
        return Err(AppError::conflict(
            "not_live",
            format!(
                "this instance is {}; only a running or stopped instance can be started, stopped or rebooted",
                row.status
            ),
        ));
    }
    // An account held by a declined, unpaid invoice starts nothing (issue #40, 2): what was
    // stopped for it starts by itself once it is paid.
    if action == VmAction::Start
        && state.billing.enabled()
        && let Some(invoice) = state.store.declined_unpaid_invoice(&row.user_sub).await?
    {
        return Err(AppError::payment_required(
            PAYMENT_REQUIRED,
            format!(
                "an invoice of {} is unpaid (its payment was declined): pay it from the Billing \
                 page (/billing); instances stopped for it start again by themselves once it is paid",
                crate::billing::money(i64::from(invoice.amount_cents), &invoice.currency)
            ),
        ));
    }
    let host_id = row.host_id.as_deref().ok_or(AppError::NotFound)?;
    // L4.4: on a pair (or a ring) the customer's reboot is the pair's reboot, the same call
    // as /admin's: node1 first, both machines, the instance back as it was.
    if action == VmAction::Reboot && state.store.host_nodes(host_id).await?.len() > 1 {
        crate::app::host_lifecycle::reboot_host(
            state,
            crate::app::host_lifecycle::Rebooter::Customer(by),
            host_id,
        )
        .await?;
        let row = state.store.vm(vm_id).await?.ok_or(AppError::NotFound)?;
        return view(state, &row).await;
    }
    let target = state.store.agent_target(host_id).await?.ok_or_else(|| {
        AppError::conflict("host_gone", "this instance's host is no longer in service")
    })?;
    within_power_wait(state.agents.vm_action(&target, &row.name, action)).await?;
    let status = if action == VmAction::Stop {
        VmStatus::Stopped
    } else {
        VmStatus::Running
    };
    state.store.set_vm_power(&row.id, status).await?;
    let now = state.clock.now();
    state
        .store
        .audit(
            Some(&by.user.sub),
            "vm.power",
            Some(&row.id),
            json!({"action": action, "host_id": host_id}),
            now,
        )
        .await?;
    let row = state.store.vm(vm_id).await?.ok_or(AppError::NotFound)?;
    view(state, &row).await
}
