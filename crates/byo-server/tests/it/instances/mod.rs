//! Instances through the API on both backends: SSH keys, the dashboard create (E1), the
//! delete every caller shares (G), notify-stuck-deletes and the heartbeat (133). The hosts'
//! agents are a fake that records every call and answers as told: ok, refuse, hang, 404,
//! or not at all. Every refusal reads the rows back to show nothing changed.
//!
//! One test binary (each costs link time), one module per topic; `world` is what they share.

mod admin;
mod create;
mod delete;
mod heartbeat;
mod http_client;
mod pages;
mod placement;
mod power;
mod races;
mod reconcile;
mod ssh_keys;
pub(crate) mod world;
