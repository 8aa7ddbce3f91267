//! The customer's path walked before a customer walks it (issue #38, 4). The design's
//! set-aside list keeps one thing "worth having one day": "the backend has never used the
//! customer's own path (F) before a customer does". A walk makes a scratch instance on the host
//! through the agent with a key made for it, logs in to it over plain ssh exactly as a customer
//! would (the instance's address on :22: DNS or the relay, the relay's DNAT, the tunnel), runs
//! `hostname`, and deletes it through the agent's delete (G), timing each leg.
//!
//! It is not the set-aside acceptance probe, whose reason stands: what the command answers comes
//! back through the host, so it proves only that the path reaches *that* instance (the answer
//! must be the scratch instance's own name), never the GPU claim.
//!
//! Activation (`admin_host_action::activate`) walks a host that has no passed walk since its
//! preparation finished, and refuses one whose walk failed unless the operator gives a reason
//! to override (audited). A host in service is not walked: its customers walk it, and a
//! scratch instance would take its one slot from them.

use std::time::{Duration, Instant};

use byo_db::path_walks::{PathWalkRow, WalkEnd};
use byo_wire::vm::CreateVm;
use serde_json::json;
use ssh_key::{Algorithm, PrivateKey, rand_core::OsRng};

use crate::app::instances::{Answer, ask_create, mint_name, ssh_hostname};
use crate::error::{AppError, AppResult};
use crate::providers::customer_ssh::Login;
use crate::state::AppState;

/// What the walk runs once logged in; the answer must be the scratch instance's name.
pub const WALK_COMMAND: &str = "hostname";

/// A walk still open after this is taken for abandoned (its server stopped) when the next
/// one starts: well past the longest a walk can take (create + login + delete waits).
pub const WALK_ABANDONED_AFTER: Duration = Duration::from_secs(15 * 60);

/// Walk `host_id`'s customer path now, as `by` (an operator's subject) asked; the walk as
/// recorded. Refused before anything is made when the host is not one to walk (unknown,
/// retired, in service, not prepared, holding an instance, no relay yet) or a walk of it is
/// already running.
pub async fn walk(state: &AppState, host_id: &str, by: Option<&str>) -> AppResult<PathWalkRow> {
    let store = &state.store;
    let host = store.host(host_id).await?.ok_or(AppError::NotFound)?;
    if host.retired_at.is_some() {
        return Err(AppError::conflict(
            "retired",
            "a retired host is not walked",
        ));
    }
    if host.active {
        return Err(AppError::conflict(
            "in_service",
            "this host is in service: its customers walk its path, and a scratch instance would \
             take their slot. De-pool it first to walk it",
        ));
    }
    if host.prepared_at.is_none() {
        return Err(AppError::conflict(
            "not_prepared",
            "this host's preparation has not finished; there is no path to walk yet",
        ));
    }
    if let Some(vm) = store.live_vms_on_host(host_id).await?.first() {
        return Err(AppError::conflict(
            "occupied",
            format!(
                "this host holds instance {}; a walk needs its one slot",
                vm.name
            ),
        ));
    }
    let target = store
        .agent_target(host_id)
        .await?
        .filter(|t| t.relay_ip.is_some())
        .ok_or_else(|| {
            AppError::conflict(
                "no_relay",
                "this host's relay has no address yet; the path begins there",
            )
        })?;
    let name = mint_name();
    let now = state.clock.now();
    let stale = now - chrono::TimeDelta::from_std(WALK_ABANDONED_AFTER).unwrap_or_default();
    let row = store
        .start_path_walk(host_id, &name, by, now, stale)
        .await?
        .ok_or_else(|| {
            AppError::conflict(
                "walk_running",
                "a walk of this host's path is under way; its result will stand beside Activate",
            )
        })?;
    tracing::info!(host = %target.slug, walk = %row.id, name, "walking the customer's path");
    let legs = walk_legs(state, &target, &name).await;
    let end = WalkEnd {
        passed: legs.failed.is_none(),
        stage: legs.failed.as_ref().map(|(stage, _)| *stage),
        error: legs.failed.as_ref().map(|(_, e)| e.as_str()),
        create_ms: legs.create_ms,
        ssh_ms: legs.ssh_ms,
        delete_ms: legs.delete_ms,
    };
    let now = state.clock.now();
    store.finish_path_walk(&row.id, &end, now).await?;
    match &legs.failed {
        None => {
            tracing::info!(host = %target.slug, walk = %row.id, create_ms = ?legs.create_ms, ssh_ms = ?legs.ssh_ms, delete_ms = ?legs.delete_ms, "the customer's path walked")
        }
        Some((stage, e)) => {
            tracing::warn!(host = %target.slug, walk = %row.id, stage, error = %e, "the customer's path walk failed")
        }
    }
    store
        .audit(
            by,
            "host.path_walk",
            Some(host_id),
            json!({"walk_id": row.id, "passed": end.passed, "stage": end.stage, "error": end.error,
                   "create_ms": end.create_ms, "ssh_ms": end.ssh_ms, "delete_ms": end.delete_ms}),
            now,
        )
        .await?;
    store
        .latest_path_walk(host_id)
        .await?
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("the walk just recorded is gone")))
}

/// Each leg's time, and where the walk stopped with why.
#[derive(Default)]
struct Legs {
    create_ms: Option<i32>,
    ssh_ms: Option<i32>,
    delete_ms: Option<i32>,
    failed: Option<(&'static str, String)>,
}

fn ms(since: Instant) -> Option<i32> {
    i32::try_from(since.elapsed().as_millis()).ok()
}

async fn walk_legs(state: &AppState, target: &byo_db::hosts::AgentTargetRow, name: &str) -> Legs {
    let mut legs = Legs::default();
    let key = match PrivateKey::random(&mut OsRng, Algorithm::Ed25519) {
        Ok(k) => k,
        Err(e) => {
            legs.failed = Some(("create", format!("making the walk's key: {e}")));
            return legs;
        }
    };
    let public = match key.public_key().to_openssh() {
        Ok(p) => p,
        Err(e) => {
            legs.failed = Some(("create", format!("encoding the walk's key: {e}")));
            return legs;
        }
    };
    let hostname = ssh_hostname(state, name, &target.slug);
    let request = CreateVm {
        name: name.to_owned(),
        ssh_public_key: public,
        ssh_hostname: Some(hostname.clone()),
    };
    let started = Instant::now();
    match ask_create(state, target, &request, state.waits.create).await {
        Answer::Accepted(_) => legs.create_ms = ms(started),
        Answer::Refused(e) => {
            legs.failed = Some(("create", format!("the host did not make it: {e}")));
            return legs;
        }
        // It may yet exist: the delete below takes it back either way.
        Answer::Silent => {
            legs.failed = Some((
                "create",
                format!(
                    "the host did not answer within {} s",
                    state.waits.create.as_secs()
                ),
            ))
        }
    }
    if legs.failed.is_none() {
        // The customer's own address: the name where DNS is published, else the relay's.
        let address = match state.tunnels.publishes_dns() {
            true => hostname.as_str(),
            false => target.relay_ip.as_deref().unwrap_or_default(),
        };
        let alias = format!("byo-walk-{name}");
        let login = Login {
            address,
            host_key_alias: &alias,
            key: &key,
            command: WALK_COMMAND,
            within: state.waits.login,
        };
        let started = Instant::now();
        match state.customer_ssh.run(login).await {
            Ok(out) if out.trim() == name => legs.ssh_ms = ms(started),
            Ok(out) => {
                legs.failed = Some((
                    "ssh",
                    format!(
                        "logged in to {address}:22, but it is not the scratch instance: \
                         `{WALK_COMMAND}` answered {:?}, not {name}",
                        out.trim()
                    ),
                ))
            }
            Err(e) => legs.failed = Some(("ssh", format!("{address}:22: {e}"))),
        }
    }
    let started = Instant::now();
    let deleted = tokio::time::timeout(state.waits.delete, state.agents.delete_vm(target, name));
    match deleted.await {
        Ok(Ok(_)) => legs.delete_ms = ms(started),
        Ok(Err(e)) => {
            legs.failed
                .get_or_insert(("delete", format!("the host did not delete it: {e}")));
        }
        Err(_) => {
            legs.failed.get_or_insert((
                "delete",
                format!(
                    "the host did not answer the delete within {} s",
                    state.waits.delete.as_secs()
                ),
            ));
        }
    }
    legs
}

/// The walk activation goes on: the newest, when it started since the host's preparation
/// finished (one from before walked a host that has been prepared again since).
pub fn since_prepared(
    newest: Option<&PathWalkRow>,
    prepared_at: chrono::DateTime<chrono::Utc>,
) -> Option<&PathWalkRow> {
    newest.filter(|w| w.started_at >= prepared_at)
}

/// Whether the walk activation goes on failed: activation then needs an override.
pub fn failed_since(
    newest: Option<&PathWalkRow>,
    prepared_at: chrono::DateTime<chrono::Utc>,
) -> bool {
    since_prepared(newest, prepared_at).is_some_and(|w| w.passed == Some(false))
}

/// A walk as the API shows it.
pub fn view(w: PathWalkRow) -> byo_wire::api::PathWalkView {
    byo_wire::api::PathWalkView {
        id: w.id,
        vm_name: w.vm_name,
        started_at: w.started_at,
        finished_at: w.finished_at,
        passed: w.passed,
        stage: w.stage,
        error: w.error,
        create_ms: w.create_ms,
        ssh_ms: w.ssh_ms,
        delete_ms: w.delete_ms,
    }
}

/// A walk in a sentence, as the host's page and a page's notice say it.
pub fn sentence(w: &PathWalkRow) -> String {
    let secs = |ms: Option<i32>| {
        ms.map_or("—".to_owned(), |m| {
            format!("{:.1} s", f64::from(m) / 1000.0)
        })
    };
    let legs = format!(
        "create {}, first login {}, delete {}",
        secs(w.create_ms),
        secs(w.ssh_ms),
        secs(w.delete_ms)
    );
    match w.passed {
        None => format!(
            "walking since {} (scratch instance {})",
            w.started_at.format("%Y-%m-%d %H:%M:%S"),
            w.vm_name
        ),
        Some(true) => format!(
            "walked {}: a customer's ssh reaches its instance ({legs})",
            w.started_at.format("%Y-%m-%d %H:%M")
        ),
        Some(false) => format!(
            "the walk of {} failed at {}: {} ({legs})",
            w.started_at.format("%Y-%m-%d %H:%M"),
            w.stage.as_deref().unwrap_or("an unknown stage"),
            w.error.as_deref().unwrap_or("no reason recorded")
        ),
    }
}
