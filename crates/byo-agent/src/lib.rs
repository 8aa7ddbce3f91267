//! The agent on the owner's Spark host (place 1): three systemd units from one binary —
//! `enverge-agent-prepare` (root: enrol, the prepare state machine, peer steps),
//! `enverge-agent` (serving, unprivileged: the VM API, heartbeat, relay map, operator
//! keys) and `enverge-agent-rollback`.
//!
//! It must stay small: it may link `byo-wire` and `byo-core`, and never the server's
//! dependencies (no database driver, no password hashing, no templates); `crates/byo/tests/it/architecture.rs`
//! enforces it. Enrolment, preparation and the serving API arrive with their issues.

pub mod cable;
pub mod detect;
pub mod enroll;
pub mod heartbeat;
pub mod host;
pub mod lock;
pub mod logins;
pub mod lxd;
pub mod lxd_gate;
pub mod machines;
pub mod names;
pub mod operator_keys;
pub mod prepare;
pub mod report;
pub mod rollback;
pub mod serve;
pub mod uninstall;
pub mod upgrade;
pub mod vms;
pub mod workers;
