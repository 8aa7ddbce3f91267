//! host-enroll: redeem (steps 28–29). The row is locked, so two machines running the same
//! one-liner cannot both become this host; unknown, spent, expired and malformed tokens get
//! one byte-identical answer; hardware that is not the profile's is rejected and its
//! allocation released; one answer carries everything the agent needs.

use byo_core::redeem::judge;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::provisioning::{RedeemDecision, RedeemNode, Redeemed};
use byo_wire::enroll::{EnrollRequest, EnrollResponse, WireGuardConfig};
use byo_wire::profile::ProfilePlan;
use serde_json::json;

use crate::app::host_provision::{EnrollmentSecrets, sealer, wireguard_endpoint};
use crate::error::{AppError, AppResult};
use crate::seal::SealedAt;
use crate::state::AppState;

/// What a redeem came to.
pub enum Redemption {
    /// Unknown, spent, expired or mistyped: which, a caller has not earned (B note 1).
    InvalidToken,
    /// The hardware is not the profile's; the reason, and the allocation is released.
    Rejected(String),
    /// Everything the agent needs, handed over once.
    Enrolled(Box<EnrollResponse>),
}

/// Redeem `token` for the machine `req` describes, in one locked transaction.
pub async fn redeem(
    state: &AppState,
    token: &SecretToken,
    req: EnrollRequest,
) -> AppResult<Redemption> {
    let sealer = sealer(state)?.clone();
    let now = state.clock.now();
    let host_token = SecretToken::generate(TokenKind::Host);
    let agent_token = SecretToken::generate(TokenKind::Agent);
    let mut delivered: Option<EnrollmentSecrets> = None;
    // The connector build for this machine's arch, pinned by configuration.
    let cloudflared = req
        .node
        .arch
        .as_deref()
        .and_then(|arch| state.config.cloudflared_build(arch));

    let outcome = state
        .store
        .redeem(&token.hash(), now, |ctx| {
            let secrets = ctx
                .sealed_secrets
                .as_deref()
                .and_then(|s| {
                    sealer
                        .open(&SealedAt::enrollment_secrets(&ctx.enrollment_id), s)
                        .ok()
                })
                .and_then(|s| serde_json::from_str::<EnrollmentSecrets>(&s).ok());
            let plan = serde_json::from_value::<ProfilePlan>(ctx.constants.clone());
            let (Some(secrets), Ok(plan)) = (secrets, plan) else {
                return RedeemDecision::Abort(format!(
                    "enrolment {} has unreadable secrets or profile",
                    ctx.enrollment_id
                ));
            };
            match judge(&plan, &req) {
                Err(rejection) => RedeemDecision::Reject {
                    request: serde_json::to_value(&req).unwrap_or_default(),
                    reason: rejection.to_string(),
                },
                Ok(rows) => {
                    let decision = RedeemDecision::Accept {
                        nodes: rows
                            .into_iter()
                            .map(|r| RedeemNode {
                                index: r.index as i32,
                                machine_id: r.machine_id,
                                hardware_id: r.hardware_id,
                                fingerprint: r.fingerprint,
                                rails: r.rails,
                            })
                            .collect(),
                        fingerprint: byo_core::redeem::identity(&req.node),
                        host_pubkey: secrets.host_wg_public.clone(),
                        host_token_hash: host_token.hash(),
                        sealed_agent_token: sealer
                            .seal(&SealedAt::agent_token(&ctx.host_id), agent_token.expose()),
                    };
                    delivered = Some(secrets);
                    decision
                }
            }
        })
        .await?;
    match outcome {
        Redeemed::NoSuchToken => Ok(Redemption::InvalidToken),
        // Our own fault, not the caller's: a 500, and the token is still good.
        Redeemed::Aborted(why) => Err(AppError::Internal(anyhow::anyhow!("redeem aborted: {why}"))),
        Redeemed::Rejected { context, reason } => {
            tracing::info!(slug = %context.slug, %reason, "enrolment rejected");
            state
                .store
                .audit(
                    None,
                    "host.enroll_rejected",
                    Some(&context.host_id),
                    json!({"reason": reason}),
                    now,
                )
                .await?;
            // The allocation it was holding is released now, not at the next sweep.
            let reaper = state.clone();
            tokio::spawn(async move {
                if let Err(e) = crate::app::reap::reap_once(&reaper).await {
                    tracing::error!(error = %e, "reaping a rejected enrolment");
                }
            });
            Ok(Redemption::Rejected(reason))
        }
        Redeemed::Enrolled(context) => {
            let secrets = delivered.expect("an accepted enrolment carries its secrets");
            let (relay_name, relay_ip, tunnel_hostname, tunnel_token) =
                state.store.host_delivery(&context.host_id).await?;
            // A token that does not open (sealed for another host's row) is not handed over;
            // the host then runs without its tunnel, and the log says why.
            let tunnel_connector_token = tunnel_token.and_then(|t| {
                sealer
                    .open(&SealedAt::tunnel_token(&context.host_id), &t)
                    .map_err(|e| {
                        tracing::error!(slug = %context.slug, error = %e, "the tunnel's connector token does not open");
                    })
                    .ok()
            });
            let published = state.store.published_key_list().await?;
            // The answer carries the published list, so from here the host holds that
            // version: record it where publish and "send again" record theirs, or the
            // operators' page shows a host that holds a list as holding none. The token
            // is already spent, so a failure here is logged, never the agent's answer.
            if let Some(p) = &published
                && let Err(e) = state
                    .store
                    .record_key_delivery_at_enrollment(&context.host_id, p.version, now)
                    .await
            {
                tracing::error!(slug = %context.slug, error = %e, "recording the operator-key list handed over at enrolment");
            }
            state
                .store
                .audit(
                    None,
                    "host.enrolled",
                    Some(&context.host_id),
                    json!({"slug": context.slug}),
                    now,
                )
                .await?;
            let response = EnrollResponse {
                host_id: context.host_id,
                slug: context.slug.clone(),
                environment: state.config.environment.clone(),
                host_token: host_token.expose().to_owned(),
                agent_token: agent_token.expose().to_owned(),
                wireguard: WireGuardConfig {
                    private_key: secrets.host_wg_private,
                    address: "10.8.0.2/24".into(),
                    peer_public_key: secrets.relay_wg_public,
                    endpoint: relay_ip.as_deref().map(wireguard_endpoint),
                    allowed_ips: "10.8.0.1/32".into(),
                },
                relay_name: relay_name.unwrap_or_else(|| format!("{}-relay", context.slug)),
                ssh_map_endpoint: "10.8.0.1:8754".into(),
                ssh_map_token: secrets.ssh_map_token,
                tunnel_hostname,
                tunnel_connector_token,
                operator_keys: published.and_then(|p| p.envelope),
                // The trust in force now (M.13): after a rotation the configured keys no
                // longer sign, and the published list handed over is the successors'.
                signing_keys: crate::app::operator_keys::signing_trust(state)
                    .await?
                    .iter()
                    .filter_map(|k| k.to_openssh().ok())
                    .collect(),
                profile_id: context.profile_id,
                constants: context.constants,
                lockout_owner: context.lockout_owner,
                cloudflared,
            };
            Ok(Redemption::Enrolled(Box::new(response)))
        }
    }
}
