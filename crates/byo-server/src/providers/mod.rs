//! The outside systems provisioning talks to, each behind a small trait: relays (GCP
//! Compute Engine, or `local`) and tunnels with their DNS (Cloudflare, or `local`). Tests
//! substitute fakes that reproduce the real APIs' shapes; `byo up` uses `local`.

pub mod cloudflare;
pub mod customer_ssh;
pub mod gcp;
pub mod local;
pub mod notify;
pub mod stripe;

use std::sync::Arc;

use futures::future::BoxFuture;

/// Why a provider call failed, in words an operator can act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ProviderError(pub String);

/// A relay as created: its instance name and the public address reserved for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayInfo {
    pub name: String,
    pub address: String,
}

/// relay-provision's other half: `<slug>-relay-ip` reserved, `<slug>-relay` created with
/// its bootstrap as metadata. Both calls are idempotent: provisioning what exists returns
/// it; releasing what is gone succeeds.
pub trait RelayProvider: Send + Sync {
    /// `bootstrap` is the relay's first-boot script, when the release it fetches is
    /// configured; a provider that boots a real instance refuses to go without it.
    fn provision<'a>(
        &'a self,
        slug: &'a str,
        bootstrap: Option<&'a str>,
    ) -> BoxFuture<'a, Result<RelayInfo, ProviderError>>;
    fn release<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Release the relay's instance and keep its reserved address (A.3, replacing a dead
    /// relay): the replacement boots at the same address with the same WireGuard key, so the
    /// host's peer endpoint stays right and its tunnel finds the new relay on its own. A
    /// provider whose address goes with its instance releases both.
    fn release_instance<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.release(slug)
    }
}

/// The operator tunnel with its DNS, and the customer SSH wildcard `*.<slug>.ssh`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TunnelInfo {
    pub id: String,
    pub hostname: String,
    /// cloudflared's connector token; returned to the agent at redeem, sealed at rest.
    pub connector_token: String,
}

pub trait TunnelProvider: Send + Sync {
    fn create<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<TunnelInfo, ProviderError>>;
    fn delete<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// The customer SSH wildcard: `name` (`*.<slug>.ssh.<domain>`) resolves to the relay's
    /// public address, DNS only (plain ssh cannot go through an HTTP proxy). Idempotent: an
    /// existing record is pointed at `address`.
    fn point_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
        address: &'a str,
    ) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Remove it; absent is fine.
    fn remove_ssh_wildcard<'a>(&'a self, name: &'a str)
    -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Whether the wildcard above is real DNS anyone can resolve. Where it is not (`local`,
    /// `byo up`), customers are given the relay's address instead of a name.
    fn publishes_dns(&self) -> bool {
        false
    }
}

/// The relay and tunnel providers an installation uses.
pub struct Providers {
    pub relays: Arc<dyn RelayProvider>,
    pub tunnels: Arc<dyn TunnelProvider>,
}
