//! Pure decisions shared by the server, the agent and the relay: no tokio, no filesystem,
//! no processes, and time is always passed in.

pub mod break_glass;
pub mod fleet;
pub mod keylist;
#[cfg(feature = "testing")]
pub mod keylist_testing;
pub mod lockstep;
pub mod logins;
pub mod lxd_gate;
pub mod notices;
pub mod prepare;
pub mod probe;
pub mod redeem;
pub mod release;
pub mod render;
pub mod ring;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokens;
