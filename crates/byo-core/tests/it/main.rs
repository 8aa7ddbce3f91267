//! byo-core's integration tests: one binary (each costs a link of most of the workspace), one
//! module per topic. `scripts/test` runs each topic in a process of its own (`<topic>::`),
//! scheduled across two lanes by measured duration; `cargo test --test it` runs them all
//! in one.

mod break_glass;
mod fuzz;
mod keylist;
mod prepare_engine;
mod probe;
mod redeem;
