//! The CLI, `byo`: what customers do from a terminal through the public API (`api`,
//! `customer`), and what operators do from their own machine. `byo up` runs the whole
//! platform on this one.

pub mod api;
pub mod customer;
pub mod fleet;
pub mod host_ssh;
pub mod keys;
pub mod local_relay;
pub mod owner;
pub mod print;
pub mod release;
pub mod up;
