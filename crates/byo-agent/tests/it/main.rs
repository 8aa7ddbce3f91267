//! byo-agent's integration tests: one binary (each costs a link of most of the workspace), one
//! module per topic. `scripts/test` runs each topic in a process of its own (`<topic>::`),
//! scheduled across two lanes by measured duration; `cargo test --test it` runs them all
//! in one.
mod support;

mod cabled;
mod cloudflared_real_host;
mod detect;
mod generated;
mod host_container;
mod instances_real_host;
mod listener;
mod operator_keys;
mod pair_prepare;
mod prepare;
mod prepare_real_host;
mod ring;
mod uninstall;
mod units;
mod vm_api;
