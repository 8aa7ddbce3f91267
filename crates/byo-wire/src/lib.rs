//! Wire shapes shared by the server, the agent, the relay and the operator CLI.
//!
//! Only this crate derives serde for anything that crosses a process boundary, so a
//! shape has one definition and one spelling. Names follow the design document. The server
//! enables the `openapi` feature to derive schemas; the agent and the relay do not pay for
//! it. A shape holding a password or a token implements `Debug` by hand, the secret redacted.

pub mod api;
pub mod billing;
pub mod enroll;
pub mod fleet;
pub mod lifecycle;
pub mod limits;
pub mod notices;
pub mod overview;
pub mod peers;
pub mod prebooking;
pub mod prepare;
pub mod profile;
pub mod relay;
pub mod role;
pub mod states;
pub mod vm;

pub use role::Role;
