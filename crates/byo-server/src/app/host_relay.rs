//! Where a host's relay is now, asked by the host with its host token. Redeem hands over the
//! relay's endpoint only if relay-provision has given the relay an address by then; a host
//! that redeemed earlier asks here (preparation does, at every attempt) and brings its
//! tunnel up once the answer carries one. And the relay's own one call: the fetch of its
//! secrets at its first boot.

use byo_core::render::relay_bootstrap::RelaySecrets;
use byo_core::tokens::SecretToken;
use byo_wire::enroll::HostRelay;
use serde_json::json;

use crate::app::host_provision::wireguard_endpoint;
use crate::error::{AppError, AppResult};
use crate::relay_ca::relay_name;
use crate::seal::SealedAt;
use crate::state::AppState;

/// The relay of the host `token` belongs to, as it stands now; `None` when the token is no
/// live host's (the one answer for that).
pub async fn current(state: &AppState, token: &SecretToken) -> AppResult<Option<HostRelay>> {
    let Some(host_id) = state.store.host_id_by_token(&token.hash()).await? else {
        return Ok(None);
    };
    let (_, relay_ip, _, _) = state.store.host_delivery(&host_id).await?;
    Ok(Some(HostRelay {
        endpoint: relay_ip.as_deref().map(wireguard_endpoint),
    }))
}

/// A relay's first-boot fetch of its secrets (issue #36): the token is spent in the same
/// statement that checks it; the WireGuard key is the one kept sealed for this host (so a
/// replacement relay has the key the host's tunnel trusts) and the certificate is issued
/// now by the relay CA. `None` for every token that does not qualify: unknown, spent,
/// lapsed, or a host retired or being revoked — one answer for all.
pub async fn secrets(
    state: &AppState,
    token: &SecretToken,
    from: std::net::IpAddr,
) -> AppResult<Option<String>> {
    let now = state.clock.now();
    let from = from.to_string();
    let Some(spent) = state
        .store
        .spend_relay_secrets_token(token.hash().as_str(), now, &from)
        .await?
    else {
        tracing::warn!(%from, "a relay secrets token that is not live was presented");
        return Ok(None);
    };
    let sealed = spent.relay_wg_key.ok_or_else(|| {
        AppError::Internal(anyhow::anyhow!(
            "{}'s relay key is not kept, so its relay cannot be given one",
            spent.slug
        ))
    })?;
    let wireguard_private_key = crate::app::host_provision::sealer(state)?
        .open(&SealedAt::relay_wg_key(&spent.host_id), &sealed)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("opening the relay key: {e}")))?;
    let cert = state
        .relay_ca
        .get()
        .await?
        .issue(&relay_name(&spent.slug, &state.config.public_url), now)?;
    let answer = RelaySecrets {
        wireguard_private_key,
        tls_cert_pem: cert.cert_pem,
        tls_key_pem: cert.key_pem,
    }
    .render()
    .map_err(|e| AppError::Internal(anyhow::anyhow!(e)))?;
    state
        .store
        .audit(
            None,
            "relay.secrets_fetched",
            Some(&spent.host_id),
            json!({"slug": spent.slug, "from": from}),
            now,
        )
        .await?;
    tracing::info!(slug = %spent.slug, %from, "a relay fetched its secrets");
    Ok(Some(answer))
}
