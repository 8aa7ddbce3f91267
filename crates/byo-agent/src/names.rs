//! The names every part of the agent agrees on (a floor: it imports nothing of ours): the
//! administrator's login, LXD's profile and image names, what a customer's container shows
//! at login. Preparation writes them; serving, uninstall and the satellites' workers read
//! them.

/// The one administrator of a BYO host: every operator logs in as spark (I).
pub const SPARK: &str = "spark";
/// The profile every instance of ours is made on (and how uninstall knows ours).
pub const PROFILE_NAME: &str = "lofispark-base";
/// The image alias base-image builds and every create starts from.
pub const BASE_ALIAS: &str = "lofispark-base";
/// The profile a pair's containers add to lofispark-base: the node's cables.
pub const DUAL_PROFILE: &str = "lofispark-dual";
/// The config key a customer's container records its SSH port under: with [`HEAD_KEY`],
/// what makes an instance ours (the LXD gate, reconcile, uninstall).
pub const PORT_KEY: &str = "user.enverge.ssh_port";
/// The config key a worker records its head under: what makes a container on a satellite ours.
pub const HEAD_KEY: &str = "user.enverge.head";
/// Where instances' :22 are published on the host (the first port; one per instance).
pub const FIRST_SSH_PORT: u16 = 22000;
/// The ports serving may publish an instance's SSH on, from [`FIRST_SSH_PORT`].
pub const SSH_PORTS: u16 = 100;
/// Where root's LXD gate answers serving (`crate::lxd_gate`): serving is not in LXD's
/// `lxd` group, and this socket is its only way to LXD.
pub const LXD_GATE_SOCKET: &str = byo_core::render::units::LXD_GATE_SOCKET;
/// What a customer's container prints at login (its /etc/motd).
pub const LOGIN_BANNER: &str = include_str!("../assets/login-banner.txt");
/// The login the owner lends node0 for the other machines (user, then password; root-only),
/// deleted once peer-access admitted node0's peer key.
pub const PEER_LOGIN: &str = "/etc/enverge/peer-login";
/// Who ran the installer: the login owner-lockout removes (when the host says so).
pub const OWNER_FILE: &str = "/etc/enverge/owner";
/// The throwaway container base-image builds in (and uninstall removes when a build was cut).
pub const BUILD_INSTANCE: &str = "enverge-image-build";
/// Where the installer recorded the server this host enrolled with (root's, 0644).
pub const SERVER_FILE: &str = "/etc/enverge/server";
/// What enrolment returned, the host token among it.
pub const CREDENTIALS: &str = "/etc/enverge/credentials.json";
