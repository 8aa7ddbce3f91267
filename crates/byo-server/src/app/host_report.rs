//! host-report: what the host's agent tells the backend about its preparation, step by
//! step, authenticated by the host token it received at redeem. Progress is what the owner
//! watches and what the operator reads before approving (D).

use byo_core::tokens::SecretToken;
use byo_wire::prepare::{HostReport, NodeRails};

use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// What a call authenticated by a host token came to.
#[derive(Debug, PartialEq, Eq)]
pub enum HostCall {
    Recorded,
    /// The token is no live host's: the one answer for that, whatever the body.
    InvalidToken,
}

/// Record one prepare step's progress (node 0, or a satellite by its index). `report` is
/// the body, or why it could not be read; a caller that is not a host hears only that.
pub async fn record(
    state: &AppState,
    token: &SecretToken,
    report: Result<HostReport, String>,
) -> AppResult<HostCall> {
    let Some(host_id) = state.store.host_id_by_token(&token.hash()).await? else {
        return Ok(HostCall::InvalidToken);
    };
    let report = report.map_err(|why| AppError::bad_request("invalid_report", why))?;
    let node = i32::try_from(report.node)
        .map_err(|_| AppError::bad_request("invalid_report", "no such node"))?;
    let now = state.clock.now();
    if !state
        .store
        .record_prepare_state(
            &host_id,
            node,
            &report.state,
            report.completed && node == 0,
            now,
        )
        .await?
    {
        return Err(AppError::bad_request(
            "unknown_node",
            format!("this host has no node {}", report.node),
        ));
    }
    Ok(HostCall::Recorded)
}

/// Record one machine's rails as a rail step left them (130–132): that node's
/// `host_nodes.rails`, replaced whole, with `verified_at` stamped by this clock on every port
/// that carries a rail when rail-verify proved them. The host's own words, like its progress:
/// the addresses are what it configured, not a claim anything grants on.
pub async fn record_rails(
    state: &AppState,
    token: &SecretToken,
    rails: Result<NodeRails, String>,
) -> AppResult<HostCall> {
    let Some(host_id) = state.store.host_id_by_token(&token.hash()).await? else {
        return Ok(HostCall::InvalidToken);
    };
    let rails = rails.map_err(|why| AppError::bad_request("invalid_rails", why))?;
    let node = i32::try_from(rails.node)
        .map_err(|_| AppError::bad_request("invalid_rails", "no such node"))?;
    let verified_at = rails.verified.then(|| state.clock.now());
    let value = byo_core::redeem::node_rails(&rails.ports, |p| p.address.clone(), verified_at);
    if !state
        .store
        .record_node_rails(&host_id, node, &value)
        .await?
    {
        return Err(AppError::bad_request(
            "unknown_node",
            format!("this host has no node {}", rails.node),
        ));
    }
    Ok(HostCall::Recorded)
}

/// Who puts a failed preparation step right, in the owner's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fixer {
    /// Something on the owner's side: what they can do.
    Owner(&'static str),
    /// Something on ours: the owner has nothing to do.
    Us,
    /// Another machine's own line says (a pair's satellites).
    ItsOwnLine,
}

/// What the owner reads under a failed step: what is wrong, the usual cause when there is
/// one, and who fixes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureAdvice {
    pub wrong: &'static str,
    pub cause: Option<&'static str>,
    pub fixer: Fixer,
}

/// Package installs fail the same way whichever step asks for them.
const APT: &str = "A package install failed: most often another program is holding apt (an \
                   update running in the background), or this machine cannot reach the \
                   internet.";
const APT_FIX: &str = "let any update on the machine finish, and check that it can reach the \
                       internet.";

/// The plain sentence for a failed step, by the step's name (`docs/prepare.md`'s list). A
/// name this build does not know (a newer agent's step) gets the default. The technical
/// line stays beside it: this says what it means, not what happened.
pub fn failure_advice(step: &str) -> FailureAdvice {
    use Fixer::*;
    let (wrong, cause, fixer) = match step {
        "operator-access" => (
            "byo's operators cannot log in to this machine yet: the list of their access keys \
             is missing or has expired.",
            None,
            Us,
        ),
        "docker-purge" => (
            "Docker, which breaks the network of the customers' containers, could not be \
             removed.",
            Some(APT),
            Owner(APT_FIX),
        ),
        "swap-off" => (
            "Swap could not be turned off (a GPU machine must not swap).",
            None,
            Owner(
                "check that nothing on the machine turns swap back on, such as a swap file in \
                 /etc/fstab or a zram service.",
            ),
        ),
        "earlyoom" => (
            "earlyoom, which stops a runaway program before the machine runs out of memory, \
             could not be installed.",
            Some(APT),
            Owner(APT_FIX),
        ),
        "lxd-install" => (
            "LXD, which runs the customers' containers, could not be installed.",
            Some(APT),
            Owner(APT_FIX),
        ),
        "watchdog" => ("The hardware watchdog could not be set up.", None, Us),
        "zfs-arc-cap" => ("The memory cap for ZFS could not be set.", None, Us),
        "storage-pool" => (
            "The storage for the customers' containers could not be created.",
            None,
            Us,
        ),
        "lxd-network" => (
            "The network for the customers' containers could not be set up.",
            None,
            Us,
        ),
        "firewall" => (
            "The firewall could not be set to let the customers' containers reach the internet.",
            None,
            Us,
        ),
        "profiles" => (
            "The settings for the customers' containers could not be written.",
            None,
            Us,
        ),
        "base-image" => (
            "The image the customers' containers start from could not be built.",
            Some("Most often this machine could not download what it needs."),
            Owner("check that the machine can reach the internet."),
        ),
        "relay-peer" => (
            "The tunnel to byo's relay has not come up.",
            Some(
                "Most often another network on this machine or your LAN already uses 10.8.0.x \
                 addresses, or WireGuard could not be installed.",
            ),
            Owner(
                "check that nothing on your network uses 10.8.0.x addresses and that the \
                 machine can reach the internet.",
            ),
        ),
        "peer-access" => (
            "This machine could not log in to the other machines of this host with the login \
             you lent it.",
            None,
            Owner(
                "check that the other machines are on and cabled, and that the lent login's \
                 password is the one you gave.",
            ),
        ),
        "satellites" => (
            "Another machine of this host could not be prepared.",
            None,
            ItsOwnLine,
        ),
        "rail-network" => (
            "The network over the cables between the machines of this host could not be \
             configured.",
            None,
            Us,
        ),
        "rail-verify" => (
            "A cable between the machines of this host is not passing traffic.",
            None,
            Owner("check that the cable named above is seated firmly at both ends."),
        ),
        "owner-lockout" => (
            "Your own login could not be handed over safely, so it was left as it is.",
            None,
            Us,
        ),
        "self-check" => (
            "The final check of the whole machine found something not working.",
            None,
            Us,
        ),
        _ => ("A preparation step did not complete.", None, Us),
    };
    FailureAdvice {
        wrong,
        cause,
        fixer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_the_agent_runs_has_its_own_sentence_and_an_unknown_one_the_default() {
        let default = failure_advice("a-step-from-a-newer-agent");
        assert_eq!(default.fixer, Fixer::Us);
        for step in byo_agent::prepare::STEP_NAMES {
            assert_ne!(
                failure_advice(step),
                default,
                "{step} has no sentence of its own"
            );
        }
    }

    #[test]
    fn each_failure_names_the_one_who_fixes_it() {
        // Ours: the list of operators' keys is published on our side.
        assert_eq!(failure_advice("operator-access").fixer, Fixer::Us);
        assert!(
            failure_advice("operator-access")
                .wrong
                .contains("cannot log in")
        );
        // Package installs: the owner's machine, the owner's apt and network.
        for step in ["docker-purge", "earlyoom", "lxd-install"] {
            let a = failure_advice(step);
            assert_eq!(
                (a.cause, a.fixer),
                (Some(APT), Fixer::Owner(APT_FIX)),
                "{step}"
            );
            assert!(APT.contains("holding apt") && APT.contains("internet"));
        }
        assert!(
            failure_advice("relay-peer")
                .wrong
                .contains("tunnel to byo's relay")
        );
        assert!(
            matches!(failure_advice("rail-verify").fixer, Fixer::Owner(f) if f.contains("cable"))
        );
        assert_eq!(failure_advice("satellites").fixer, Fixer::ItsOwnLine);
    }
}
