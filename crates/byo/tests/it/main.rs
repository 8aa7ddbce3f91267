//! byo's integration tests: one binary (each costs a link of most of the workspace), one
//! module per topic. `scripts/test` runs each topic in a process of its own (`<topic>::`),
//! scheduled across two lanes by measured duration; `cargo test --test it` runs them all
//! in one.
#[path = "../../../byo-agent/tests/it/support/cabled.rs"]
mod cabled;
#[path = "support/cabled_platform.rs"]
mod cabled_platform;
#[path = "../../../byo-server/tests/it/support/browser.rs"]
mod chromium;
#[path = "../../../byo-agent/tests/it/support/host_container.rs"]
mod host_container;
#[path = "support/onboard.rs"]
mod onboard;
#[path = "../../../byo-relay/tests/it/support/mod.rs"]
mod relay_support;
mod support;

mod architecture;
mod customer_cli;
mod docs;
mod fleet_upgrade;
mod golden_path;
mod installer;
mod keys_sign;
mod pair_golden_path;
mod releases;
mod ring_golden_path;
mod uninstall;
mod up;
mod walkthrough;
