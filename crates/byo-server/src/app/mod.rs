//! The rules: every decision the API and the pages make, one module per area, named as the
//! design names its edge function where it has one. A route unpacks a request, calls one
//! function here and shapes its answer; a page does the same with HTML. Nothing here
//! imports `routes` or `pages`, so both reach the same rules and neither reaches the other.
//!
//! The scheduled jobs live here too: `jobs` is the one driver and its one list,
//! `jobs::registry()` (`docs/jobs.md` has each job). A job is a call to a rule others call
//! as well: reap's sweep is what host-provision, host-enroll, admin-host-action and the
//! owner's cancel run at once, the stuck list is what admin-vm-action answers, and
//! settle-creates fails a create through `instances::fail_create`, the one way any create
//! is failed.

pub mod accounts;
pub mod admin_host_action;
pub mod admin_vm_action;
pub mod api_tokens;
pub mod billing;
pub mod billing_admin;
pub mod earnings;
pub mod fleet_metrics;
pub mod fleet_overview;
pub mod fleet_upgrade;
pub mod host_enroll;
pub mod host_heartbeat;
pub mod host_lifecycle;
pub mod host_problems;
pub mod host_provision;
pub mod host_relay;
pub mod host_report;
pub mod instance_power;
pub mod instances;
pub mod jobs;
pub mod notices;
pub mod notify_stuck_deletes;
pub mod operator_keys;
pub mod owner_hosts;
pub mod path_walk;
pub mod payouts;
pub mod placement;
pub mod power_wait;
pub mod prebookings;
// The queue (E2): issue #13 item 2.
pub mod queue_drain;
pub mod queued;
pub mod reap;
pub mod releases;
pub mod retire_stopped;
pub mod sealed;
pub mod settle_creates;
pub mod ssh_keys;
pub mod unpaid;
pub mod users;
