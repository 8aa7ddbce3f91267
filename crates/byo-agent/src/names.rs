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
