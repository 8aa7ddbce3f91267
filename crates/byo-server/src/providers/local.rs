//! `local` providers for `byo up` and tests: allocations that live in this process, named
//! and shaped as the real ones are. They create no machine and no DNS record: on one
//! machine the relay is reached on loopback.

use std::collections::BTreeMap;
use std::sync::Mutex;

use byo_core::tokens::{SecretToken, TokenKind};
use futures::future::BoxFuture;

use super::{ProviderError, RelayInfo, RelayProvider, TunnelInfo, TunnelProvider};

/// Relays on this machine: `<slug>-relay` at 127.0.0.1.
#[derive(Debug, Default)]
pub struct LocalRelays {
    pub relays: Mutex<BTreeMap<String, RelayInfo>>,
}

impl RelayProvider for LocalRelays {
    fn provision<'a>(
        &'a self,
        slug: &'a str,
        _bootstrap: Option<&'a str>,
    ) -> BoxFuture<'a, Result<RelayInfo, ProviderError>> {
        Box::pin(async move {
            let mut relays = self.relays.lock().expect("relays lock");
            Ok(relays
                .entry(slug.to_owned())
                .or_insert_with(|| RelayInfo {
                    name: format!("{slug}-relay"),
                    address: "127.0.0.1".into(),
                })
                .clone())
        })
    }

    fn release<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.relays.lock().expect("relays lock").remove(slug);
            Ok(())
        })
    }
}

/// Tunnels on this machine: `<slug>.tunnel.localhost`; the SSH wildcards are kept as the
/// records they would be (name → address).
#[derive(Debug, Default)]
pub struct LocalTunnels {
    pub tunnels: Mutex<BTreeMap<String, TunnelInfo>>,
    pub wildcards: Mutex<BTreeMap<String, String>>,
}

impl TunnelProvider for LocalTunnels {
    fn create<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<TunnelInfo, ProviderError>> {
        Box::pin(async move {
            let mut tunnels = self.tunnels.lock().expect("tunnels lock");
            Ok(tunnels
                .entry(slug.to_owned())
                .or_insert_with(|| TunnelInfo {
                    id: uuid::Uuid::new_v4().to_string(),
                    hostname: format!("{slug}.tunnel.localhost"),
                    connector_token: SecretToken::generate(TokenKind::Agent).expose().to_owned(),
                })
                .clone())
        })
    }

    fn delete<'a>(&'a self, slug: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.tunnels.lock().expect("tunnels lock").remove(slug);
            Ok(())
        })
    }

    fn point_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
        address: &'a str,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.wildcards
                .lock()
                .expect("wildcards lock")
                .insert(name.to_owned(), address.to_owned());
            Ok(())
        })
    }

    fn remove_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async move {
            self.wildcards.lock().expect("wildcards lock").remove(name);
            Ok(())
        })
    }
}
