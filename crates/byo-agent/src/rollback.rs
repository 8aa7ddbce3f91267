//! The rollback (L1) is enverge-agent-rollback running `byo_core::render::units::rollback_script`,
//! a shell script beside the binary: a build that cannot start is not asked to put itself
//! back. What it leaves for the heartbeat is [`ROLLED_BACK`].

pub use byo_core::render::units::ROLLED_BACK;
