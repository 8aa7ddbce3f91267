//! host-provision (A) and relay-provision: everything is provisioned before the box is
//! ever touched. One call allocates the slug, writes the hosts row inactive, the enrolment
//! with a token that dies within the hour (only its hash kept; the plaintext shown once,
//! in a form leak scanners recognise), the operator tunnel and its DNS, and starts the
//! relay — which the owner is never kept waiting for.

use crate::relay_ca::relay_name;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use byo_core::render::nft::Layout;
use byo_core::render::relay_bootstrap::Bootstrap;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::provisioning::{MAX_OUTSTANDING, NewProvision};
use byo_wire::Role;
use byo_wire::enroll::{ProvisionRequest, ProvisionResponse};
use byo_wire::profile::ProfilePlan;
use byo_wire::states::RelayState;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::CurrentUser;
use crate::error::{AppError, AppResult};
use crate::seal::{SealedAt, Sealer};
use crate::state::AppState;

/// How long a relay's secrets token lives: relay-provision boots the relay at once and its
/// first boot fetches within minutes, so a token not spent within the hour is one nobody
/// should be able to spend (the relay is then replaced from the host's page). Minted here;
/// `host_relay::secrets` spends it.
pub const SECRETS_TOKEN_MINUTES: i64 = 60;

/// How long an enrolment token lives (A note 4: "expires within the hour").
pub const TOKEN_MINUTES: i64 = 60;
pub const WIREGUARD_PORT: u16 = 51820;

/// The relay's public WireGuard endpoint, from its address: what redeem hands the host and
/// what `GET /api/host/relay` answers.
pub fn wireguard_endpoint(relay_ip: &str) -> String {
    format!("{relay_ip}:{WIREGUARD_PORT}")
}

/// What redeem hands over once, sealed on the enrolment until then.
#[derive(Serialize, Deserialize)]
pub struct EnrollmentSecrets {
    pub host_wg_private: String,
    pub host_wg_public: String,
    pub relay_wg_public: String,
    pub ssh_map_token: String,
}

/// A WireGuard keypair, base64 as `wg` prints it.
pub fn wireguard_keypair() -> (String, String) {
    let secret = x25519_dalek::StaticSecret::random_from_rng(rand::rngs::OsRng);
    let public = x25519_dalek::PublicKey::from(&secret);
    (
        STANDARD.encode(secret.to_bytes()),
        STANDARD.encode(public.as_bytes()),
    )
}

pub fn sealer(state: &AppState) -> AppResult<&Sealer> {
    state.sealer.as_ref().ok_or_else(|| {
        AppError::conflict(
            "no_secret_key",
            "this installation has no secret_key configured; hosts cannot be provisioned",
        )
    })
}

fn allocation_cap() -> AppError {
    AppError::conflict(
        "allocation_cap",
        format!(
            "you already hold {MAX_OUTSTANDING} GPUs waiting to be enrolled; run one of their commands or wait for one to lapse"
        ),
    )
}

/// host-provision, as the API and the owner's page call it.
pub async fn provision(
    state: &AppState,
    by: &CurrentUser,
    req: &ProvisionRequest,
) -> AppResult<ProvisionResponse> {
    if !(by.has(Role::CommunityHost) || by.has(Role::Superadmin)) {
        return Err(AppError::Forbidden(
            "adding a GPU needs the community_host grant from an operator",
        ));
    }
    let Some(profile) = state.store.profile(&req.profile_id).await? else {
        // Say what there is: the CLI's help cannot know an installation's profiles.
        let yours: Vec<String> = state
            .store
            .profiles()
            .await?
            .into_iter()
            .filter(|p| !p.staff_only || by.is_operator())
            .map(|p| p.id)
            .collect();
        return Err(AppError::bad_request(
            "unknown_profile",
            format!(
                "there is no profile {:?}; you may add {}",
                req.profile_id,
                yours.join(", ")
            ),
        ));
    };
    if profile.staff_only && !by.is_operator() {
        return Err(AppError::Forbidden("that profile is for staff only"));
    }
    // A host's preparation starts by proving operators can administer it (operator-access
    // before owner-lockout), with the list its enrolment hands over (step 29). Without a
    // published list every one-liner handed out now would fail at that first step.
    if state.store.published_key_list().await?.is_none() {
        return Err(AppError::conflict(
            "no_operator_keys",
            "no operator-key list is published yet, so a host added now could not be \
             administered and its preparation would stop at its first step; an operator \
             publishes one at /admin/operator-keys (byo up publishes one at its first start)",
        ));
    }
    // Read before anything is allocated: a profile that does not parse provisions nothing.
    let plan: ProfilePlan = serde_json::from_value(profile.constants.0.clone()).map_err(|e| {
        AppError::Internal(anyhow::anyhow!(
            "profile {}'s constants do not parse: {e}",
            profile.id
        ))
    })?;
    let sealer = sealer(state)?;
    // A cheap early answer; the cap is checked again, and taken, in provision_host's locked
    // transaction, which is what holds it against a race.
    if state.store.outstanding_allocations(&by.user.sub).await? >= MAX_OUTSTANDING {
        return Err(allocation_cap());
    }
    let token = SecretToken::generate(TokenKind::Enrollment);
    let ssh_map_token = SecretToken::generate(TokenKind::SshMap);
    let (host_wg_private, host_wg_public) = wireguard_keypair();
    let (relay_wg_private, relay_wg_public) = wireguard_keypair();
    let secrets = EnrollmentSecrets {
        host_wg_private,
        host_wg_public,
        relay_wg_public,
        ssh_map_token: ssh_map_token.expose().to_owned(),
    };
    // The enrolment's id is made here so that its secrets are sealed for its row.
    let enrollment_id = byo_db::new_id();
    let sealed = sealer.seal(
        &SealedAt::enrollment_secrets(&enrollment_id),
        &serde_json::to_string(&secrets).expect("secrets serialise"),
    );
    let now = state.clock.now();
    let expires_at = now + chrono::Duration::minutes(TOKEN_MINUTES);
    let new = NewProvision {
        enrollment_id: &enrollment_id,
        owner_sub: &by.user.sub,
        profile_id: &profile.id,
        gpu_type: &profile.gpu_type,
        token_hash: &token.hash(),
        token_expires_at: expires_at,
        ssh_map_token_hash: &ssh_map_token.hash(),
        sealed_secrets: &sealed,
    };
    // The slug is taken from a high-water mark inside provision_host's locked transaction,
    // so two provisions never collide on it; the cap is what a race can refuse.
    let provisioned = match state.store.provision_host(new, now).await {
        Err(e) if e.breaks(byo_db::Rule::AllocationCap) => return Err(allocation_cap()),
        other => other?,
    };
    let slug = provisioned.slug.clone();
    // Kept sealed so a dead relay can be replaced by one the host's tunnel trusts (A.3).
    state
        .store
        .record_relay_key(
            &provisioned.host_id,
            &sealer.seal(
                &SealedAt::relay_wg_key(&provisioned.host_id),
                &relay_wg_private,
            ),
        )
        .await?;

    // The operator tunnel and its DNS are part of the call; a failure hands the allocation
    // straight back rather than leaving half of it.
    match state.tunnels.create(&slug).await {
        Ok(t) => {
            let sealed_token = sealer.seal(
                &SealedAt::tunnel_token(&provisioned.host_id),
                &t.connector_token,
            );
            state
                .store
                .record_tunnel(&provisioned.host_id, &t.id, &t.hostname, &sealed_token)
                .await?;
        }
        Err(e) => {
            state
                .store
                .revoke_enrollment(&provisioned.enrollment_id)
                .await?;
            crate::app::reap::reap_once(state).await?;
            return Err(AppError::Internal(anyhow::anyhow!(
                "creating the tunnel for {slug}: {e}"
            )));
        }
    }

    // relay-provision: its own function, and nobody waits on it.
    let bootstrap = match &state.config.relay_release {
        Some(release) => {
            let rendered = relay_bootstrap(
                state,
                &provisioned.host_id,
                &slug,
                &secrets.host_wg_public,
                ssh_map_token.hash().as_str(),
                release,
            )
            .await;
            rendered
                .map_err(
                    |e| tracing::error!(%slug, error = %e, "cannot render the relay bootstrap"),
                )
                .ok()
        }
        None => None,
    };
    let relay_state = state.clone();
    let (host_id, relay_slug) = (provisioned.host_id.clone(), slug.clone());
    tokio::spawn(async move {
        relay_provision(&relay_state, &host_id, &relay_slug, bootstrap.as_deref()).await
    });

    state
        .store
        .audit(
            Some(&by.user.sub),
            "host.provision",
            Some(&provisioned.host_id),
            json!({"slug": slug, "profile": profile.id}),
            now,
        )
        .await?;
    let peer = if plan.node_count > 1 {
        format!(" --peer --nodes={}", plan.node_count)
    } else {
        String::new()
    };
    let command = format!(
        "curl -fsSL {}/install.sh | sudo bash -s -- --token {}{peer}",
        state.config.public_url.trim_end_matches('/'),
        token.expose()
    );
    Ok(ProvisionResponse {
        host_id: provisioned.host_id,
        slug,
        enrollment_id: provisioned.enrollment_id,
        token: token.expose().to_owned(),
        expires_at,
        command,
    })
}

/// The relay's first-boot script: the host's public key, the ssh-map token's hash, the
/// release it fetches, and a fresh single-use token for its secrets (issue #36: its
/// WireGuard key and TLS certificate are fetched with it, `app::host_relay::secrets`, never
/// carried in the instance's metadata). Issuing the token replaces any earlier one.
pub async fn relay_bootstrap(
    state: &AppState,
    host_id: &str,
    slug: &str,
    host_public_key: &str,
    ssh_map_token_hash: &str,
    release: &crate::config::RelayRelease,
) -> anyhow::Result<String> {
    let token = SecretToken::generate(TokenKind::RelaySecrets);
    let lapses = state.clock.now() + chrono::Duration::minutes(SECRETS_TOKEN_MINUTES);
    state
        .store
        .issue_relay_secrets_token(host_id, token.hash().as_str(), lapses)
        .await?;
    Bootstrap {
        slug: slug.to_owned(),
        host_public_key: host_public_key.to_owned(),
        wireguard_port: WIREGUARD_PORT,
        ssh_map_token_hash: ssh_map_token_hash.to_owned(),
        public_name: relay_name(slug, &state.config.public_url),
        secrets_url: format!(
            "{}/api/relay/secrets",
            state.config.public_url.trim_end_matches('/')
        ),
        secrets_token: token.expose().to_owned(),
        relay_binary_url: release.url.clone(),
        relay_binary_sha256: release.sha256.clone(),
        layout: Layout::default(),
    }
    .script()
    .map_err(anyhow::Error::msg)
}

/// relay-provision: reserve `<slug>-relay-ip`, create `<slug>-relay` with its bootstrap,
/// and record the outcome on the hosts row.
pub async fn relay_provision(state: &AppState, host_id: &str, slug: &str, bootstrap: Option<&str>) {
    let outcome = state.relays.provision(slug, bootstrap).await;
    let recorded = match &outcome {
        Ok(relay) => {
            tracing::info!(%slug, address = %relay.address, "relay ready");
            // Customers' ssh names resolve to this relay (F).
            let wildcard = crate::app::instances::ssh_wildcard(state, slug);
            let dns = state
                .tunnels
                .point_ssh_wildcard(&wildcard, &relay.address)
                .await;
            if let Err(e) = &dns {
                tracing::error!(%slug, %wildcard, error = %e, "the customer ssh wildcard was not written");
            }
            let note = dns
                .err()
                .map(|e| format!("the ssh wildcard {wildcard} was not written: {e}"));
            state
                .store
                .record_relay(
                    host_id,
                    Some(&relay.address),
                    RelayState::Ready,
                    note.as_deref(),
                )
                .await
        }
        Err(e) => {
            tracing::error!(%slug, error = %e, "relay-provision failed");
            state
                .store
                .record_relay(host_id, None, RelayState::Failed, Some(&e.to_string()))
                .await
        }
    };
    if let Err(e) = recorded {
        tracing::error!(%slug, error = %e, "recording the relay");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b64: &str) -> [u8; 32] {
        STANDARD
            .decode(b64)
            .expect("base64")
            .try_into()
            .expect("32 bytes")
    }

    #[test]
    fn a_wireguard_keypair_is_a_fresh_private_key_and_its_own_public_key() {
        let (private, public) = wireguard_keypair();
        let secret = x25519_dalek::StaticSecret::from(key(&private));
        assert_eq!(
            x25519_dalek::PublicKey::from(&secret).as_bytes(),
            &key(&public)
        );
        let (other, _) = wireguard_keypair();
        assert_ne!(private, other, "each call draws a new key");
    }
}
