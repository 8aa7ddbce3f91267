//! Pure renderings of our artefacts that one side writes and the other runs: the agent's
//! systemd units (served by the server inside `install.sh`, installed on the host), the
//! relay's nftables layout and its first-boot script (rendered by the server, run on the
//! relay). They live here so the server links neither the agent nor the relay: both sides
//! render from the same text, and nothing else builds these artefacts another way.

pub mod nft;
pub mod relay_bootstrap;
pub mod units;
