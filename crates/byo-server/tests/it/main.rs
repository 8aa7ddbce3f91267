//! byo-server's integration tests: one binary (each costs a link of most of the workspace), one
//! module per topic. `scripts/test` runs each topic in a process of its own (`<topic>::`),
//! scheduled across two lanes by measured duration; `cargo test --test it` runs them all
//! in one.
mod support;

mod accounts;
mod api_tokens;
mod authorization;
mod billing;
mod bounds;
mod browser;
mod cli;
mod cloudflare_tunnels;
mod enrollment_scenarios;
mod fleet_metrics;
mod gcp_relays;
mod instances;
mod jobs;
mod lifecycle;
mod listener;
mod notices;
mod onboarding;
mod operator_keys;
mod operator_logins;
mod prebookings;
mod queue;
mod releases;
mod sealed;
mod secrets;
mod signup_by_mail;
