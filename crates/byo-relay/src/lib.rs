//! The relay (place 5): one per host. `ssh_mapd` (HTTP on 10.8.0.1:8754, the relay's own
//! token) programs the `LOFISPARK_VMSSH` chain that forwards a customer's public :22 into
//! their container through WireGuard. The script a new relay runs at first boot is rendered
//! by the server (`byo_core::render::relay_bootstrap`) with this relay's keys and tokens.
//!
//! Like the agent it never links the server's dependencies (`crates/byo/tests/it/architecture.rs`).

pub mod mapd;
pub mod nft;
