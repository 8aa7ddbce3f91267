//! The operator's CLI, `byo`: what operators do from their own machine. `byo up` runs the
//! whole platform on this one.

pub mod fleet;
pub mod host_ssh;
pub mod keys;
pub mod local_relay;
pub mod release;
pub mod up;
