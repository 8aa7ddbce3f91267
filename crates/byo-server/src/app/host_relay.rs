//! Where a host's relay is now, asked by the host with its host token. Redeem hands over the
//! relay's endpoint only if relay-provision has given the relay an address by then; a host
//! that redeemed earlier asks here (preparation does, at every attempt) and brings its
//! tunnel up once the answer carries one.

use byo_core::tokens::SecretToken;
use byo_wire::enroll::HostRelay;

use crate::app::host_provision::wireguard_endpoint;
use crate::error::AppResult;
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
