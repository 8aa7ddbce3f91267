//! Provisioning (A), redeem (B, steps 28–29) and reap: the allocation made before the box
//! is touched, the single-use point, and handing an unused allocation back.

use byo_core::tokens::TokenHash;
use byo_wire::states::{EnrollmentState, RelayState};
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use crate::hosts::HostRow;
use crate::{DbError, MaybeState, Result, Store, new_id};

/// At most this many allocations an owner may hold before any is redeemed (A note 4).
pub const MAX_OUTSTANDING: i64 = 3;

#[derive(Clone, Debug)]
pub struct NewProvision<'a> {
    /// The enrolment's id, made by the caller (`new_id`): its secrets are sealed for its row
    /// before the row is written.
    pub enrollment_id: &'a str,
    pub owner_sub: &'a str,
    pub profile_id: &'a str,
    pub gpu_type: &'a str,
    pub token_hash: &'a TokenHash,
    pub token_expires_at: DateTime<Utc>,
    pub ssh_map_token_hash: &'a TokenHash,
    /// The host's WireGuard private key, the relay's public key and the ssh-map token,
    /// sealed: delivered once, at redeem.
    pub sealed_secrets: &'a str,
}

#[derive(Clone, Debug)]
pub struct Provisioned {
    pub host_id: String,
    pub slug: String,
    pub enrollment_id: String,
}

/// What redeem judges, read under the row lock.
#[derive(Clone, Debug)]
pub struct RedeemContext {
    pub enrollment_id: String,
    pub host_id: String,
    pub slug: String,
    pub profile_id: String,
    pub constants: Value,
    pub sealed_secrets: Option<String>,
    /// hosts.lockout_owner: whether preparation removes the owner's login.
    pub lockout_owner: bool,
}

/// A node row to write at redeem.
#[derive(Clone, Debug)]
pub struct RedeemNode {
    pub index: i32,
    pub machine_id: Option<String>,
    pub hardware_id: String,
    pub fingerprint: Value,
    pub rails: Value,
}

/// What the judge decided.
#[derive(Clone, Debug)]
pub enum RedeemDecision {
    Accept {
        nodes: Vec<RedeemNode>,
        /// node0's identity, for host_enrollments.fingerprint.
        fingerprint: Value,
        host_pubkey: String,
        host_token_hash: TokenHash,
        sealed_agent_token: String,
    },
    /// The request as it arrived lands whole on the enrolment, state rejected.
    Reject { request: Value, reason: String },
    /// Something on our side is wrong (secrets that do not open, a profile that does not
    /// parse): write nothing, leaving the enrolment and its token exactly as they were.
    Abort(String),
}

#[derive(Clone, Debug)]
pub enum Redeemed {
    /// Unknown, spent, expired: one answer for all of them.
    NoSuchToken,
    Enrolled(RedeemContext),
    Rejected {
        context: RedeemContext,
        reason: String,
    },
    /// The caller's decision was [`RedeemDecision::Abort`]: nothing written, the token still
    /// good; the reason is for the operator's log.
    Aborted(String),
}

/// An allocation to hand back.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct Reapable {
    pub enrollment_id: String,
    pub host_id: Option<String>,
    pub slug: Option<String>,
    #[sqlx(try_from = "String")]
    pub state: EnrollmentState,
}

impl Store {
    /// Allocations of `owner_sub` that are neither redeemed nor handed back.
    pub async fn outstanding_allocations(&self, owner_sub: &str) -> Result<i64> {
        let n: i64 = on_pool!(self, |p| {
            sqlx::query_scalar(
            "select count(*) from host_enrollments where owner_sub = $1 and state in ('pending', 'ready')"
        )
        .bind(owner_sub)
        .fetch_one(p)
        .await
        })?;
        Ok(n)
    }

    /// Step 11: the hosts row (inactive), the enrolment and its token, in one transaction,
    /// under the next `spark-N` slug. The owner's cap ([`MAX_OUTSTANDING`]) is checked and
    /// taken inside the same locked transaction (the owner's users row locked on
    /// PostgreSQL, the database's write lock on SQLite), so racing provisions cannot pass
    /// it together: one past it is [`DbError::Refused`]`("allocation_cap")`. Slugs come from
    /// `slug_high_water`, never from the hosts that remain, so a slug is never reused:
    /// not after a rejection, a revocation or a retirement.
    pub async fn provision_host(
        &self,
        new: NewProvision<'_>,
        now: DateTime<Utc>,
    ) -> Result<Provisioned> {
        in_tx!(self, |tx, for_update| {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select sub from users where sub = $1{for_update}"
            )))
            .bind(new.owner_sub)
            .fetch_optional(&mut *tx)
            .await?;
            let outstanding: i64 = sqlx::query_scalar(
                "select count(*) from host_enrollments where owner_sub = $1 and state in ('pending', 'ready')",
            )
            .bind(new.owner_sub)
            .fetch_one(&mut *tx)
            .await?;
            if outstanding >= MAX_OUTSTANDING {
                return Err(crate::Rule::AllocationCap.refused());
            }
            // Past any slug a writer other than this one took (a hand-built row).
            let slug = loop {
                let next: i64 = sqlx::query_scalar(
                    "update slug_high_water set last = last + 1 where id = 1
                     returning cast(last as bigint)",
                )
                .fetch_one(&mut *tx)
                .await?;
                let slug = format!("spark-{next}");
                let taken: Option<i64> =
                    sqlx::query_scalar("select cast(1 as bigint) from hosts where slug = $1")
                        .bind(&slug)
                        .fetch_optional(&mut *tx)
                        .await?;
                if taken.is_none() {
                    break slug;
                }
            };
            let host_id = new_id();
            sqlx::query(
                "insert into hosts (id, slug, owner_sub, profile_id, gpu_type, ssh_map_token_hash, relay_name, relay_state, created_at)
                 values ($1, $2, $3, $4, $5, $6, $7, 'provisioning', $8)",
            )
            .bind(&host_id)
            .bind(&slug)
            .bind(new.owner_sub)
            .bind(new.profile_id)
            .bind(new.gpu_type)
            .bind(new.ssh_map_token_hash.as_str())
            .bind(format!("{slug}-relay"))
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "insert into host_enrollments
                   (id, host_id, owner_sub, profile_id, state, token_hash, token_expires_at, wg_config, created_at)
                 values ($1, $2, $3, $4, 'pending', $5, $6, $7, $8)",
            )
            .bind(new.enrollment_id)
            .bind(&host_id)
            .bind(new.owner_sub)
            .bind(new.profile_id)
            .bind(new.token_hash.as_str())
            .bind(new.token_expires_at)
            .bind(new.sealed_secrets)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            Ok(Provisioned {
                host_id,
                slug,
                enrollment_id: new.enrollment_id.to_owned(),
            })
        })
    }

    /// The relay-provision outcome, on the hosts row (there is no relays table).
    pub async fn record_relay(
        &self,
        host_id: &str,
        relay_ip: Option<&str>,
        state: RelayState,
        error: Option<&str>,
    ) -> Result<()> {
        on_pool!(self, |p| {
            sqlx::query(
            "update hosts set relay_ip = coalesce($2, relay_ip), relay_state = $3, relay_error = $4 where id = $1"
        )
        .bind(host_id)
        .bind(relay_ip)
        .bind(state.as_str())
        .bind(error)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        })?;
        Ok(())
    }

    pub async fn record_tunnel(
        &self,
        host_id: &str,
        tunnel_id: &str,
        hostname: &str,
        sealed_token: &str,
    ) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "update hosts set tunnel_id = $2, tunnel_hostname = $3, tunnel_token = $4 where id = $1"
        )
        .bind(host_id)
        .bind(tunnel_id)
        .bind(hostname)
        .bind(sealed_token)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// What redeem returns about the relay and tunnel: (relay_name, relay_ip, tunnel_hostname, sealed tunnel token).
    pub async fn host_delivery(
        &self,
        host_id: &str,
    ) -> Result<(
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    )> {
        on_pool!(self, |p| sqlx::query_as(
            "select relay_name, relay_ip, tunnel_hostname, tunnel_token from hosts where id = $1"
        )
        .bind(host_id)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    /// Steps 28–29 in one transaction: lock the enrolment by its token, let `decide` judge
    /// it, and write what it decided. A token that is unknown, spent or expired gets
    /// [`Redeemed::NoSuchToken`]; a machine whose hardware already belongs to a live host
    /// is rejected like any other evidence.
    pub async fn redeem<F>(
        &self,
        token_hash: &TokenHash,
        now: DateTime<Utc>,
        decide: F,
    ) -> Result<Redeemed>
    where
        F: FnOnce(&RedeemContext) -> RedeemDecision,
    {
        in_tx!(self, |tx, for_update| {
            let row: Option<(String, Option<String>, String, Option<String>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "select id, host_id, profile_id, wg_config from host_enrollments
                 where token_hash = $1 and state in ('pending', 'ready') and token_expires_at > $2{for_update}"
            )))
            .bind(token_hash.as_str())
            .bind(now)
            .fetch_optional(&mut *tx)
            .await?;
            let Some((enrollment_id, Some(host_id), profile_id, sealed_secrets)) = row else {
                return Ok(Redeemed::NoSuchToken);
            };
            let (slug, constants, lockout_owner): (String, Json<Value>, bool) = sqlx::query_as(
                "select h.slug, p.constants, h.lockout_owner from hosts h join host_profiles p on p.id = h.profile_id where h.id = $1",
            )
            .bind(&host_id)
            .fetch_one(&mut *tx)
            .await?;
            let context = RedeemContext {
                enrollment_id,
                host_id,
                slug,
                profile_id,
                constants: constants.0,
                sealed_secrets,
                lockout_owner,
            };
            let mut decision = decide(&context);
            if let RedeemDecision::Accept { nodes, .. } = &decision {
                for n in nodes {
                    let taken: Option<String> = sqlx::query_scalar(
                        "select host_id from host_nodes where hardware_id = $1 and retired_at is null",
                    )
                    .bind(&n.hardware_id)
                    .fetch_optional(&mut *tx)
                    .await?;
                    if taken.is_some() {
                        decision = RedeemDecision::Reject {
                            request: serde_json::json!({"hardware_id": n.hardware_id}),
                            reason: format!("node {} is already enrolled as another host", n.index),
                        };
                        break;
                    }
                }
            }
            match decision {
                // Nothing was written (only read and locked): ending here leaves all as it was.
                RedeemDecision::Abort(why) => Ok(Redeemed::Aborted(why)),
                RedeemDecision::Reject { request, reason } => {
                    sqlx::query(
                        "update host_enrollments set state = 'rejected', redeemed_at = $2, fingerprint = $3,
                                reject_reason = $4, token_hash = null, wg_config = null
                         where id = $1",
                    )
                    .bind(&context.enrollment_id)
                    .bind(now)
                    .bind(Json(&request))
                    .bind(&reason)
                    .execute(&mut *tx)
                    .await?;
                    Ok(Redeemed::Rejected { context, reason })
                }
                RedeemDecision::Accept {
                    nodes,
                    fingerprint,
                    host_pubkey,
                    host_token_hash,
                    sealed_agent_token,
                } => {
                    for n in &nodes {
                        sqlx::query(
                            r#"insert into host_nodes (host_id, "index", machine_id, hardware_id, fingerprint, rails, created_at)
                               values ($1, $2, $3, $4, $5, $6, $7)"#,
                        )
                        .bind(&context.host_id)
                        .bind(n.index)
                        .bind(&n.machine_id)
                        .bind(&n.hardware_id)
                        .bind(Json(&n.fingerprint))
                        .bind(Json(&n.rails))
                        .bind(now)
                        .execute(&mut *tx)
                        .await?;
                    }
                    sqlx::query("update hosts set pubkey = $2, token_hash = $3, agent_token = $4 where id = $1")
                        .bind(&context.host_id)
                        .bind(&host_pubkey)
                        .bind(host_token_hash.as_str())
                        .bind(&sealed_agent_token)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query(
                        "update host_enrollments set state = 'enrolled', redeemed_at = $2, fingerprint = $3,
                                token_hash = null, wg_config = null
                         where id = $1",
                    )
                    .bind(&context.enrollment_id)
                    .bind(now)
                    .bind(Json(&fingerprint))
                    .execute(&mut *tx)
                    .await?;
                    Ok(Redeemed::Enrolled(context))
                }
            }
        })
    }

    /// Allocations to hand back: rejected, revoked, or lapsed (still pending past expiry).
    pub async fn reapable(&self, now: DateTime<Utc>) -> Result<Vec<Reapable>> {
        on_pool!(self, |p| sqlx::query_as::<_, Reapable>(
            "select e.id as enrollment_id, e.host_id, h.slug, e.state
             from host_enrollments e left join hosts h on h.id = e.host_id
             where e.released_at is null
               and (e.state in ('rejected', 'revoked', 'expired')
                    or (e.state in ('pending', 'ready') and e.token_expires_at <= $1))
             order by e.created_at"
        )
        .bind(now)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The last step of reap, once everything outside is handed back: the hosts row goes
    /// (it never redeemed, so nothing points at it), and the enrolment is closed with its
    /// secrets cleared. Idempotent.
    pub async fn release_allocation(&self, enrollment_id: &str, now: DateTime<Utc>) -> Result<()> {
        in_tx!(self, |tx, _for_update| {
            let host: Option<Option<String>> =
                sqlx::query_scalar("select host_id from host_enrollments where id = $1")
                    .bind(enrollment_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            let Some(host) = host else {
                return Err(DbError::NotFound);
            };
            sqlx::query(
                "update host_enrollments
                 set state = case when state in ('pending', 'ready') then 'expired' else state end,
                     released_at = coalesce(released_at, $2), token_hash = null, wg_config = null
                 where id = $1",
            )
            .bind(enrollment_id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            if let Some(host_id) = host {
                // Only a host that never redeemed: no pubkey, no nodes. A row another still
                // names (a pre-booking or an instance row pinned to it by hand: no product
                // path books a host that never redeemed) cannot go without losing that
                // record, so it is kept, retired (N.1: unless an instance row is live on it),
                // as the record of the setup; the sweep is not stopped by a foreign key on
                // every pass.
                let deleted = sqlx::query(
                    "delete from hosts where id = $1 and pubkey is null
                       and not exists (select 1 from prebookings where host_id = $1)
                       and not exists (select 1 from vms where host_id = $1)",
                )
                .bind(&host_id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                if deleted == 0 {
                    sqlx::query(
                        "update hosts set retired_at = coalesce(retired_at, $2), active = false,
                                dedicated = false, dedicated_to = null
                         where id = $1 and pubkey is null
                           and not exists (select 1 from vms where host_id = $1
                                           and deleted_at is null and creation_failed_at is null)",
                    )
                    .bind(&host_id)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                }
            }
            Ok(())
        })
    }

    /// The open pre-booking pinned to `host_id`, if any (its id): revoking the enrolment of
    /// a host a booking names is refused in words (issue #39, 6).
    pub async fn open_booking_on_host(&self, host_id: &str) -> Result<Option<String>> {
        on_pool!(self, |p| sqlx::query_scalar(
            "select id from prebookings where host_id = $1 and closed_at is null
             order by start_date, id limit 1"
        )
        .bind(host_id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Revoke an enrolment that has not redeemed (H): its allocation is reaped next.
    /// Guarded: only an open enrolment, and not while an open pre-booking is pinned to its
    /// host (the caller words that refusal with [`Store::open_booking_on_host`]).
    pub async fn revoke_enrollment(&self, enrollment_id: &str) -> Result<bool> {
        let n = on_pool!(self, |p| {
            sqlx::query(
                "update host_enrollments set state = 'revoked', token_hash = null
             where id = $1 and state in ('pending', 'ready')
               and not exists (select 1 from prebookings b
                               where b.host_id = host_enrollments.host_id and b.closed_at is null)",
            )
            .bind(enrollment_id)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
        })?;
        Ok(n == 1)
    }

    /// Hosts an owner holds (not retired), newest first.
    pub async fn hosts_of(&self, owner_sub: &str) -> Result<Vec<HostRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, HostRow>(
            "select id, slug, owner_sub, profile_id, gpu_type, active, dedicated, dedicated_to,
                    placement, prepare_state, prepared_at, pubkey, lockout_owner, relay_name,
                    relay_ip, created_at, activated_at, retired_at
             from hosts where owner_sub = $1 and retired_at is null order by created_at desc"
        )
        .bind(owner_sub)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}

/// An enrolment as the owner's and operator's pages show it.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct EnrollmentView {
    pub id: String,
    pub host_id: Option<String>,
    pub slug: Option<String>,
    pub owner_sub: String,
    pub owner_email: String,
    pub profile_id: String,
    #[sqlx(try_from = "String")]
    pub state: EnrollmentState,
    pub token_expires_at: DateTime<Utc>,
    pub fingerprint: Option<Json<Value>>,
    pub reject_reason: Option<String>,
    pub created_at: DateTime<Utc>,
    pub redeemed_at: Option<DateTime<Utc>>,
    pub prepared_at: Option<DateTime<Utc>>,
    pub prepare_state: Option<Json<byo_wire::prepare::PrepareState>>,
    pub active: Option<bool>,
    #[sqlx(try_from = "Option<String>")]
    pub relay_state: MaybeState<RelayState>,
    /// The host's machines that are not retired (0 before redeem and once released).
    pub node_count: i64,
}

impl Store {
    /// Enrolments, newest first: one owner's (`Some`), or everyone's for operators.
    pub async fn enrollment_views(&self, owner_sub: Option<&str>) -> Result<Vec<EnrollmentView>> {
        on_pool!(self, |p| sqlx::query_as::<_, EnrollmentView>(
            "select e.id, e.host_id, h.slug, e.owner_sub, u.email as owner_email, e.profile_id, e.state,
                    e.token_expires_at, e.fingerprint, e.reject_reason, e.created_at, e.redeemed_at,
                    h.prepared_at, h.prepare_state, h.active, h.relay_state,
                    (select count(*) from host_nodes n
                      where n.host_id = e.host_id and n.retired_at is null) as node_count
             from host_enrollments e
             join users u on u.sub = e.owner_sub
             left join hosts h on h.id = e.host_id
             where ($1 is null or e.owner_sub = $1)
             order by e.created_at desc
             limit 500"
        )
        .bind(owner_sub)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}
