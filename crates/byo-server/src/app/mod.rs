//! The rules: every decision the API and the pages make, one module per area, named as the
//! design names its edge function where it has one. A route unpacks a request, calls one
//! function here and shapes its answer; a page does the same with HTML. Nothing here
//! imports `routes` or `pages`, so both reach the same rules and neither reaches the other.
//!
//! The two scheduled jobs (`reap`, `notify_stuck_deletes`) live here too: reap's sweep is
//! a rule host-provision, host-enroll and admin-host-action call, and the stuck list is
//! what admin-vm-action answers; their schedules are a loop around that one function.

pub mod accounts;
pub mod admin_host_action;
pub mod admin_vm_action;
pub mod host_enroll;
pub mod host_heartbeat;
pub mod host_lifecycle;
pub mod host_problems;
pub mod host_provision;
pub mod host_relay;
pub mod host_report;
pub mod instances;
pub mod notify_stuck_deletes;
pub mod operator_keys;
pub mod placement;
pub mod reap;
pub mod ssh_keys;
pub mod users;

/// Run `sweep` every `every` until `stop` says so: the one loop both scheduled jobs use (a
/// tick missed while a sweep ran is delayed, not bunched), until a job driver replaces it.
pub async fn on_schedule<F, Fut>(
    every: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut sweep: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => sweep().await,
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    return;
                }
            }
        }
    }
}
