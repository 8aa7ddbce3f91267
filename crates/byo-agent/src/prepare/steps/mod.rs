//! The steps, one file each, and **the registry**: [`registry!`]'s list below is the one
//! ordered list of steps. Their names ([`STEP_NAMES`]), which of them a satellite runs
//! ([`Scope`]) and the engine's list ([`all`]) are all derived from it; `docs/prepare.md`'s
//! table is checked against it (`tests/it/prepare.rs`).
//!
//! Each step is a check (reads only), an apply, and sometimes a skip with its reason; all of
//! them act through [`Host`], so the same code prepares node0, a satellite over SSH and the
//! simulated Spark. Where a landmine's failure would surface somewhere that does not name it,
//! the step that fails says what caused it.

use std::marker::PhantomData;

use byo_core::prepare::{Check, Step};

use super::Plan;
use crate::host::{Fallible, Host};

mod shared;

// The steps' modules, declared here rather than by `registry!` so that rustfmt, which does
// not follow a module a macro declares, formats them (issue #37).
mod base_image;
mod docker_purge;
mod earlyoom;
mod firewall;
mod lxd_install;
mod lxd_network;
mod operator_access;
mod owner_lockout;
mod peer_access;
mod profiles;
mod rail_network;
mod rail_verify;
mod relay_peer;
mod satellites;
mod self_check;
mod storage_pool;
mod swap_off;
mod watchdog;
mod zfs_arc_cap;

pub use base_image::{
    BASE_ALIAS, BUILD_INSTANCE, BUILDER_SCRIPT, LOGIN_BANNER, UDHCPC_SCRIPT, recipe_digest,
};
pub use firewall::refresh as refresh_tenant_firewall;
pub use profiles::render_base_profile;
pub use rail_network::{DUAL_PROFILE, render_dual_profile};
pub use relay_peer::render_wireguard;
pub use shared::{PROFILE_NAME, SPARK};

/// What uninstall (`crate::uninstall`) must know of what the steps write.
pub(crate) mod written {
    pub(crate) use super::docker_purge::DOCKER_REMOVED;
    pub(crate) use super::firewall::{
        UFW_POLICY_UNSET, UFW_POLICY_WAS, UFW_RULES, UNIT_PATH as TENANT_FIREWALL_UNIT,
    };
    pub(crate) use super::lxd_install::{APT_DROP_IN as APT_LXD_DROP_IN, LXD_INSTALLED};
    pub(crate) use super::operator_access::{
        CLOUDFLARED_BIN, CLOUDFLARED_INSTALLED, SPARK_CREATED, SUDOERS, TUNNEL_UNIT,
    };
    pub(crate) use super::owner_lockout::{ADMIN_GROUPS, LOCKOUT_CONF, OWNER_GROUPS};
    pub(crate) use super::rail_network::{SYSCTL_PING, SYSCTL_RAILS};
    pub(crate) use super::relay_peer::WG_CONF;
    pub(crate) use super::shared::{BRIDGE, POOL, WG_UNIT};
    pub(crate) use super::shared::{
        UFW_DEFAULTS, forward_policy_in_file, swaps, ufw_active, with_forward_policy,
    };
    pub(crate) use super::swap_off::{SWAP_DISABLED, SWAP_WAS_ON};
    pub(crate) use super::watchdog::WATCHDOG_CONF;
    pub(crate) use super::zfs_arc_cap::ZFS_CONF;
}

/// Which machines run a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// node0 and every satellite (each satellite's subset runs in node0's order).
    EveryNode,
    /// node0 only: the relay peer, and the pair steps that reach the satellites from it.
    Node0,
}

/// A step as the registry lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepInfo {
    pub name: &'static str,
    pub scope: Scope,
}

/// One step's definition: its name, where it runs, and its check, apply and skip over any
/// host. The plan is everything a step reads besides the host.
pub(crate) trait StepDef {
    /// Named rather than numbered: a step inserted in the middle renumbers nothing a reader
    /// trusts.
    const NAME: &str;
    const SCOPE: Scope = Scope::EveryNode;

    /// Reads only: what is missing, or satisfied.
    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check>;

    /// Runs only when check said something is missing; check runs again after it.
    fn apply<H: Host>(_: &mut H, _: &Plan) -> Fallible<()> {
        Err("this step has nothing to apply".into())
    }

    /// A reason to skip the step here, reported like any other outcome.
    fn skip<H: Host>(_: &mut H, _: &Plan) -> Option<String> {
        None
    }
}

/// A definition bound to a plan: what the engine runs.
struct Bound<'p, D, H> {
    plan: &'p Plan,
    def: PhantomData<fn(D, &mut H)>,
}

impl<D: StepDef, H: Host> Step<H> for Bound<'_, D, H> {
    fn name(&self) -> &'static str {
        D::NAME
    }
    fn check(&self, host: &mut H) -> Result<Check, String> {
        D::check(host, self.plan)
    }
    fn apply(&self, host: &mut H) -> Result<(), String> {
        D::apply(host, self.plan)
    }
    fn skip(&self, host: &mut H) -> Option<String> {
        D::skip(host, self.plan)
    }
}

fn bound<'p, D: StepDef + 'p, H: Host + 'p>(plan: &'p Plan) -> Box<dyn Step<H> + 'p> {
    Box::new(Bound::<D, H> {
        plan,
        def: PhantomData,
    })
}

/// Derives everything that lists steps from the one list.
macro_rules! registry {
    ($($module:ident::$def:ident),* $(,)?) => {
        /// Every step, in the order whose landmines `docs/prepare.md` explains.
        pub const STEPS: &[StepInfo] = &[
            $(StepInfo { name: <$module::$def as StepDef>::NAME, scope: <$module::$def as StepDef>::SCOPE },)*
        ];

        /// The steps' names, in order.
        pub const STEP_NAMES: &[&str] = &[$(<$module::$def as StepDef>::NAME,)*];

        /// The steps bound to `plan`, in order, for the engine.
        pub(super) fn all<'p, H: Host + 'p>(plan: &'p Plan) -> Vec<Box<dyn Step<H> + 'p>> {
            vec![$(bound::<$module::$def, H>(plan),)*]
        }
    };
}

registry![
    operator_access::OperatorAccess,
    docker_purge::DockerPurge,
    swap_off::SwapOff,
    earlyoom::Earlyoom,
    watchdog::Watchdog,
    zfs_arc_cap::ZfsArcCap,
    lxd_install::LxdInstall,
    storage_pool::StoragePool,
    lxd_network::LxdNetwork,
    firewall::Firewall,
    profiles::Profiles,
    base_image::BaseImage,
    relay_peer::RelayPeer,
    peer_access::PeerAccess,
    satellites::Satellites,
    rail_network::RailNetwork,
    rail_verify::RailVerify,
    owner_lockout::OwnerLockout,
    self_check::SelfCheck,
];
