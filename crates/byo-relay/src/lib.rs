//! The relay (place 5): one per host. `ssh_mapd` (HTTP on 10.8.0.1:8754, the relay's own
//! token) programs the `LOFISPARK_VMSSH` chain that forwards a customer's public :22 into
//! their container through WireGuard.
//!
//! Like the agent it never links the server's dependencies (`crates/byo/tests/architecture.rs`).
//! ssh_mapd and the chain arrive with the relay issue.
