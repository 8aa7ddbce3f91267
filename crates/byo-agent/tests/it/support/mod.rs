pub mod cabled;
pub mod host_container;
/// Network namespaces, veths, WireGuard keys: the relay's test support, shared.
#[path = "../../../../byo-relay/tests/it/support/mod.rs"]
pub mod kernel;
pub mod mapd;
pub mod prepared;
