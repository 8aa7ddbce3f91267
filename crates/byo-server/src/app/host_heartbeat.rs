//! The heartbeat (step 133): node0's agent reports its subsystems on the one schedule
//! serving keeps, authenticated by the host token, and the backend keeps the latest as the
//! host's host_status row with `seen_at` from its own clock. An unknown or retired host's
//! token gets the same 401 as host-report's, whatever the body.
//!
//! Reconciliation (issue #12, 7): the beat lists the instances the host holds, and the
//! backend settles what it left open from it. A row still `creating` whose container the
//! host runs becomes `running`; one the host does not hold once the create's deadline is
//! over gets `creation_failed_at` (never billed). A container no live row accounts for is
//! removed on the backend's instruction — its own delete call through the relay, audited
//! `vm.orphan_removed` once the host confirms — never by the agent deciding alone.

use byo_core::tokens::SecretToken;
use byo_db::GuardedWrite;
use byo_wire::states::VmStatus;
use byo_wire::vm::{
    BeatDetails, Heartbeat, HeldVm, MAX_HELD_VMS, MAX_LOGINS_PER_BEAT, MAX_RAIL_NEIGHBOURS,
    OperatorLogin, is_instance_name,
};
use serde_json::json;

use crate::app::host_report::HostCall;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// The beat's shape beyond its wire bounds and types: a printable agent version, and the held
/// instances' names and status words.
fn check(beat: &Heartbeat) -> AppResult<()> {
    let v = &beat.agent_version;
    if v.is_empty() || v.len() > 64 || v.chars().any(char::is_control) {
        return Err(AppError::bad_request(
            "invalid_heartbeat",
            "agent_version is 1 to 64 printable characters",
        ));
    }
    // Sizes (agent_version, details) are the wire type's bounds (`Bounded for Heartbeat`),
    // checked once by the extractor before this; what is left here is shape.
    if beat.vms.len() > MAX_HELD_VMS {
        return Err(AppError::bad_request(
            "invalid_heartbeat",
            format!("vms lists at most {MAX_HELD_VMS} instances"),
        ));
    }
    for vm in &beat.vms {
        if !is_instance_name(&vm.name)
            || vm.status.is_empty()
            || vm.status.len() > 32
            || !vm.status.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Err(AppError::bad_request(
                "invalid_heartbeat",
                "each of vms is an instance name and LXD's status word (at most 32 letters)",
            ));
        }
    }
    Ok(())
}

/// Attributable logins (#16, 5): the logins the beat carries in its details, taken out of
/// them (they are kept in their own table, not in host_status) and checked: at most
/// [`MAX_LOGINS_PER_BEAT`], each an address, a `SHA256:` fingerprint and, when attributed, a
/// printable user sub of the list's bound. A list that does not read refuses the whole beat.
pub fn take_logins(details: &mut BeatDetails) -> AppResult<Vec<OperatorLogin>> {
    let refused = |m: &str| AppError::bad_request("invalid_heartbeat", m.to_owned());
    let logins = details.operator_logins.take().unwrap_or_default();
    if logins.len() > MAX_LOGINS_PER_BEAT {
        return Err(refused(&format!(
            "operator_logins lists at most {MAX_LOGINS_PER_BEAT} logins"
        )));
    }
    for l in &logins {
        if l.source.parse::<std::net::IpAddr>().is_err()
            || !byo_core::logins::is_fingerprint(&l.fingerprint)
            || l.user_sub.as_ref().is_some_and(|u| {
                u.is_empty() || u.chars().count() > 128 || u.chars().any(char::is_control)
            })
            || l.certificate.as_ref().is_some_and(|c| {
                c.is_empty()
                    || c.chars().count() > byo_wire::vm::MAX_LOGIN_CERTIFICATE
                    || c.chars().any(char::is_control)
            })
        {
            return Err(refused(
                "each of operator_logins is an address, a SHA256 fingerprint, the list's user sub and the certificate sshd named",
            ));
        }
    }
    Ok(logins)
}

/// Step 133 on a pair or a ring: the machines that answered on each of node0's rail ports,
/// taken out of the beat's details (node0's host_nodes.rails is where they are kept) and
/// checked: at most `limits::RAILS` ports, each a short printable name with a count of at most
/// [`MAX_RAIL_NEIGHBOURS`]. A map that does not read refuses the whole beat.
pub fn take_rail_neighbours(
    details: &mut BeatDetails,
) -> AppResult<std::collections::BTreeMap<String, u64>> {
    let refused = |m: &str| AppError::bad_request("invalid_heartbeat", m.to_owned());
    let counts = details.rail_neighbours.take().unwrap_or_default();
    if counts.len() > byo_wire::limits::RAILS
        || counts.iter().any(|(iface, n)| {
            iface.is_empty()
                || iface.chars().count() > byo_wire::limits::SHORT
                || iface.chars().any(char::is_control)
                || *n > MAX_RAIL_NEIGHBOURS
        })
    {
        return Err(refused(&format!(
            "rail_neighbours lists at most {} ports, each a name and at most {MAX_RAIL_NEIGHBOURS} machines",
            byo_wire::limits::RAILS
        )));
    }
    Ok(counts)
}

/// Keep node0's `neighbours_discovered` per rail port as the beat counted it (133): the other
/// fields of host_nodes.rails stay as the rail steps left them; a port the row does not list
/// yet is added with its count alone. Written only when a count changed.
async fn keep_rail_neighbours(
    state: &AppState,
    host_id: &str,
    counts: &std::collections::BTreeMap<String, u64>,
) -> AppResult<()> {
    let nodes = state.store.host_nodes(host_id).await?;
    let Some(node0) = nodes.iter().find(|n| n.index == 0) else {
        return Ok(());
    };
    let mut rails = node0.rails.0.clone();
    if !rails.is_object() {
        rails = json!({});
    }
    for (iface, n) in counts {
        let port = &mut rails[iface.as_str()];
        if !port.is_object() {
            *port = json!({});
        }
        port["neighbours_discovered"] = json!(n);
    }
    if rails != node0.rails.0 {
        state.store.record_node_rails(host_id, 0, &rails).await?;
    }
    Ok(())
}

/// Keep the host's health as its host_status row. `beat` is the body, or why it could not
/// be read; a caller that is not a host hears only that.
pub async fn record(
    state: &AppState,
    token: &SecretToken,
    beat: Result<Heartbeat, String>,
) -> AppResult<HostCall> {
    let hash = token.hash();
    let (beat, logins, rail_neighbours) = match beat.and_then(|mut b| {
        check(&b).map_err(|e| e.to_string())?;
        let logins = take_logins(&mut b.details).map_err(|e| e.to_string())?;
        let rails = take_rail_neighbours(&mut b.details).map_err(|e| e.to_string())?;
        Ok((b, logins, rails))
    }) {
        Ok(read) => read,
        Err(why) => {
            // A body we cannot use is the host's to hear about only if it is a host.
            if state.store.host_id_by_token(&hash).await?.is_none() {
                return Ok(HostCall::InvalidToken);
            }
            return Err(AppError::bad_request("invalid_heartbeat", why));
        }
    };
    // The token lookup and the upsert are one statement: one round trip per beat.
    match state
        .store
        .record_heartbeat(&hash, &beat, state.clock.now())
        .await?
    {
        Some((host_id, holds_live_row)) => {
            if !logins.is_empty() {
                state
                    .store
                    .record_operator_logins(&host_id, &logins, state.clock.now())
                    .await?;
            }
            if !rail_neighbours.is_empty() {
                keep_rail_neighbours(state, &host_id, &rail_neighbours).await?;
            }
            if holds_live_row || !beat.vms.is_empty() {
                reconcile(state, &host_id, &beat.vms).await?;
            }
            Ok(HostCall::Recorded)
        }
        None => Ok(HostCall::InvalidToken),
    }
}

/// Settle this host's open rows from the instances it holds, and have it remove the ones
/// no live row accounts for.
pub async fn reconcile(state: &AppState, host_id: &str, held: &[HeldVm]) -> AppResult<()> {
    let rows = state.store.live_vms_on_host(host_id).await?;
    if rows.is_empty() && held.is_empty() {
        return Ok(());
    }
    let now = state.clock.now();
    for row in rows.iter().filter(|r| r.status == VmStatus::Creating) {
        let found = held.iter().find(|h| h.name == row.name);
        if let Some(h) = found.filter(|h| h.is_running()) {
            let port = h.ssh_port.map(i32::from);
            if state.store.mark_vm_running(&row.id, port).await? == GuardedWrite::Written {
                tracing::info!(vm = %row.id, host = %host_id, name = %row.name, "a create left open is settled: the host runs it");
                state.store.record_placement_success(host_id).await?;
                state
                    .store
                    .audit(
                        None,
                        "vm.settled",
                        Some(&row.id),
                        json!({"host_id": host_id, "status": "running", "by": "heartbeat"}),
                        now,
                    )
                    .await?;
            }
        } else if found.is_none()
            // Inside the deadline the create may still be under way; a container that
            // exists and does not run (yet) is nothing to settle on.
            && crate::app::instances::create_deadline_passed(state, row)
            && crate::app::instances::fail_create(
                state,
                &row.id,
                Some(host_id),
                "the host's heartbeat does not list it after the create's deadline",
                Some("heartbeat"),
            )
            .await?
        {
            tracing::warn!(vm = %row.id, host = %host_id, name = %row.name, "a create left open is settled: the host does not hold it; nothing billed");
        }
    }
    let mut orphans: Vec<String> = held
        .iter()
        .filter(|h| !rows.iter().any(|r| r.name == h.name))
        .map(|h| h.name.clone())
        .collect();
    if orphans.is_empty() {
        return Ok(());
    }
    // A path walk's scratch instance has no row while the walk runs (issue #38, 4); once
    // the walk has ended, one it could not delete is an orphan like any other.
    let walking = state.store.walking_vm_names(host_id).await?;
    orphans.retain(|name| !walking.contains(name));
    if orphans.is_empty() {
        return Ok(());
    }
    let Some(target) = state.store.agent_target(host_id).await? else {
        return Ok(());
    };
    for name in orphans {
        let state = state.clone();
        let target = target.clone();
        // Not awaited: the beat is answered at once, the delete takes its own time (and a
        // later beat asks again if this one does not land).
        tokio::spawn(async move {
            if let Err(e) = remove_orphan(&state, &target, &name).await {
                tracing::warn!(host = %target.slug, name = %name, error = %e, "an orphan container was not removed");
            }
        });
    }
    Ok(())
}

/// Delete a container no live row accounts for, through the agent's own delete.
async fn remove_orphan(
    state: &AppState,
    target: &byo_db::hosts::AgentTargetRow,
    name: &str,
) -> AppResult<()> {
    let wait = state.waits.delete;
    let gone = match tokio::time::timeout(wait, state.agents.delete_vm(target, name)).await {
        Ok(Ok(gone)) => gone,
        Ok(Err(e)) => {
            tracing::warn!(host = %target.slug, name, error = %e, "the host did not remove an orphan container");
            return Ok(());
        }
        Err(_) => {
            tracing::warn!(host = %target.slug, name, "the host did not answer an orphan's removal in time");
            return Ok(());
        }
    };
    let how = match gone {
        crate::agents::Gone::Deleted => "deleted",
        crate::agents::Gone::NotFound => "not_found",
    };
    tracing::warn!(host = %target.slug, name, how, "an orphan container (no live row) was removed");
    state
        .store
        .audit(
            None,
            "vm.orphan_removed",
            Some(&target.id),
            json!({"host_id": target.id, "name": name, "confirmed_by": how}),
            state.clock.now(),
        )
        .await?;
    Ok(())
}
