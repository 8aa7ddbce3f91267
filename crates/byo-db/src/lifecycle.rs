//! Life after go-live (issue #12): de-pool, the revoke of an enrolled host (H) recorded as
//! it goes, what retire (N) checks before anything outside is touched, the relay's sealed
//! WireGuard key (A.3's replacement), and the reads the one-host page is made of.

use byo_wire::states::{EnrollmentState, RelayState, RevokeStep};
use chrono::{DateTime, Utc};

use crate::audit::AuditRow;
use crate::vms::{VM_COLUMNS, VmRow};
use crate::{DbError, MaybeState, Result, Store};

/// The lifecycle columns of one hosts row.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct HostLifecycleRow {
    pub id: String,
    pub slug: String,
    pub owner_sub: String,
    pub active: bool,
    pub dedicated: bool,
    pub pubkey: Option<String>,
    pub relay_ip: Option<String>,
    pub relay_name: Option<String>,
    pub activated_at: Option<DateTime<Utc>>,
    pub retired_at: Option<DateTime<Utc>>,
    pub depooled_at: Option<DateTime<Utc>>,
    pub depooled_by: Option<String>,
    pub depool_reason: Option<String>,
    pub revoke_requested_at: Option<DateTime<Utc>>,
    #[sqlx(try_from = "Option<String>")]
    pub revoke_step: MaybeState<RevokeStep>,
    pub revoked_at: Option<DateTime<Utc>>,
    /// Whether the relay's WireGuard key is kept (sealed), so the relay can be replaced.
    pub relay_key_kept: bool,
}

/// Where a host's relay stands.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct RelayRecord {
    pub relay_ip: Option<String>,
    #[sqlx(try_from = "Option<String>")]
    pub relay_state: MaybeState<RelayState>,
    pub relay_error: Option<String>,
}

/// A relay's secrets token, spent: whose relay it was.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct SpentRelaySecrets {
    pub host_id: String,
    pub slug: String,
    /// The relay's WireGuard key, sealed with the server key (`hosts.relay_wg_key`).
    pub relay_wg_key: Option<String>,
}

/// What retire (N.1, N.5) refuses on, read before anything outside is touched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RetireBlockers {
    /// Live instances (a failed create is not one).
    pub live: i64,
    /// Pre-bookings whose window has not ended.
    pub booked: i64,
    /// The states of the host's enrolments.
    pub enrollments: Vec<EnrollmentState>,
}

/// A host its owner stopped that has been silent since: retire-stopped's candidate (issue
/// #39, 3), with when its agent last beat (`None`: never, or its status row is gone).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct StoppedHost {
    #[sqlx(flatten)]
    pub host: HostLifecycleRow,
    pub seen_at: Option<DateTime<Utc>>,
}

impl Store {
    /// Hosts de-pooled by their own owner with `reason` (the owner's stop-hosting), enrolled,
    /// not retired, inactive, with no revoke under way, whose agent has not beaten since
    /// `silent_since` and whose stop is older than it too — or whose agent said it was
    /// uninstalled (`uninstalled_at`), however recently: longest silent first.
    pub async fn stopped_and_silent(
        &self,
        reason: &str,
        silent_since: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<StoppedHost>> {
        on_pool!(self, |p| sqlx::query_as::<_, StoppedHost>(
            "select h.id, h.slug, h.owner_sub, h.active, h.dedicated, h.pubkey, h.relay_ip,
                    h.relay_name, h.activated_at, h.retired_at, h.depooled_at, h.depooled_by,
                    h.depool_reason, h.revoke_requested_at, h.revoke_step, h.revoked_at,
                    h.relay_wg_key is not null as relay_key_kept, s.seen_at
             from hosts h left join host_status s on s.host_id = h.id
             where h.retired_at is null and h.active = false and h.pubkey is not null
               and h.depool_reason = $1 and h.depooled_by = h.owner_sub
               and h.revoke_step is null
               and (h.uninstalled_at is not null
                    or (h.depooled_at <= $2 and (s.seen_at is null or s.seen_at <= $2)))
             order by coalesce(s.seen_at, h.depooled_at), h.id
             limit $3"
        )
        .bind(reason)
        .bind(silent_since)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The host's agent said it was uninstalled: stamped once, the first time. Whether this
    /// call stamped it.
    pub async fn mark_uninstalled(&self, id: &str, now: DateTime<Utc>) -> Result<bool> {
        let done = on_pool!(self, |p| sqlx::query(
            "update hosts set uninstalled_at = $2
             where id = $1 and uninstalled_at is null and retired_at is null"
        )
        .bind(id)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done == 1)
    }

    pub async fn host_lifecycle(&self, id: &str) -> Result<Option<HostLifecycleRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, HostLifecycleRow>(
            "select id, slug, owner_sub, active, dedicated, pubkey, relay_ip, relay_name,
                    activated_at, retired_at, depooled_at, depooled_by, depool_reason,
                    revoke_requested_at, revoke_step, revoked_at,
                    relay_wg_key is not null as relay_key_kept
             from hosts where id = $1"
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Take a host out of placement (`active = false`) with the reason, kept on the row for
    /// the pages (the audit log keeps every one). Its instances stay until drained.
    pub async fn depool_host(
        &self,
        id: &str,
        reason: &str,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let done = on_pool!(self, |p| {
            sqlx::query(
            "update hosts set active = false, depooled_at = $3, depooled_by = $4, depool_reason = $2
             where id = $1 and retired_at is null"
        )
        .bind(id)
        .bind(reason)
        .bind(now)
        .bind(by)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        })?;
        if done == 0 {
            return Err(DbError::NotFound);
        }
        Ok(())
    }

    /// H.1's first step, recorded: de-pooled, and the revoke in progress at `draining`
    /// (or where an earlier run left it). Idempotent; the first request time is kept.
    pub async fn begin_revoke(
        &self,
        id: &str,
        reason: &str,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let done = on_pool!(self, |p| sqlx::query(
            "update hosts set active = false,
                    revoke_requested_at = coalesce(revoke_requested_at, $3),
                    revoke_step = coalesce(revoke_step, 'draining'),
                    depooled_at = coalesce(depooled_at, $3),
                    depooled_by = coalesce(depooled_by, $4),
                    depool_reason = coalesce(depool_reason, $2)
             where id = $1 and retired_at is null"
        )
        .bind(id)
        .bind(reason)
        .bind(now)
        .bind(by)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        if done == 0 {
            return Err(DbError::NotFound);
        }
        Ok(())
    }

    /// Move a revoke on to `step` (never backwards: a finished revoke stays finished).
    pub async fn set_revoke_step(&self, id: &str, step: RevokeStep) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "update hosts set revoke_step = $2
             where id = $1 and revoke_step is not null and revoke_step <> 'revoked'"
        )
        .bind(id)
        .bind(step.as_str())
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// H's last step, once everything outside is gone: nothing the host was issued still
    /// works (host token, ssh-map token, the tunnel's connector token, the relay's key),
    /// the relay's address is forgotten, and the enrolled enrolment is revoked with its
    /// token and WireGuard config cleared — closed, so no sweep picks it up.
    pub async fn finish_revoke(&self, id: &str, now: DateTime<Utc>) -> Result<()> {
        in_tx!(self, |tx, _for_update| {
            let n = sqlx::query(
                "update hosts set revoke_step = 'revoked', revoked_at = coalesce(revoked_at, $2),
                        token_hash = null, ssh_map_token_hash = null, tunnel_token = null,
                        relay_wg_key = null, relay_ip = null, relay_state = null,
                        tunnel_id = null, tunnel_hostname = null
                 where id = $1 and revoke_step is not null",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if n == 0 {
                return Err(DbError::NotFound);
            }
            sqlx::query(
                "update host_enrollments
                 set state = case when state = 'enrolled' then 'revoked' else state end,
                     released_at = coalesce(released_at, $2), token_hash = null, wg_config = null
                 where host_id = $1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            Ok(())
        })
    }

    pub async fn retire_blockers(&self, id: &str, now: DateTime<Utc>) -> Result<RetireBlockers> {
        let (live, booked) = on_pool!(self, |p| sqlx::query_as::<_, (i64, i64)>(
            "select
               (select count(*) from vms where host_id = $1
                  and deleted_at is null and creation_failed_at is null),
               (select count(*) from prebookings where host_id = $1
                  and closed_at is null and end_date > $2)"
        )
        .bind(id)
        .bind(now)
        .fetch_one(p)
        .await)?;
        let states: Vec<String> = on_pool!(self, |p| sqlx::query_scalar(
            "select state from host_enrollments where host_id = $1 order by created_at"
        )
        .bind(id)
        .fetch_all(p)
        .await)?;
        let enrollments = states
            .into_iter()
            .map(|s| {
                s.parse()
                    .map_err(|e: String| DbError::Backend(sqlx::Error::Decode(e.into())))
            })
            .collect::<Result<Vec<EnrollmentState>>>()?;
        Ok(RetireBlockers {
            live,
            booked,
            enrollments,
        })
    }

    /// Keep the relay's WireGuard private key, sealed, so a replacement relay (A.3) is one
    /// the host's tunnel already trusts.
    pub async fn record_relay_key(&self, id: &str, sealed: &str) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "update hosts set relay_wg_key = $2 where id = $1 and retired_at is null"
        )
        .bind(id)
        .bind(sealed)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// What a replacement relay is booted with: the sealed relay key, the host's WireGuard
    /// public key and the ssh-map token's hash.
    pub async fn relay_rebuild(
        &self,
        id: &str,
    ) -> Result<Option<(Option<String>, Option<String>, Option<String>)>> {
        on_pool!(self, |p| sqlx::query_as::<
            _,
            (Option<String>, Option<String>, Option<String>),
        >(
            "select relay_wg_key, pubkey, ssh_map_token_hash from hosts
             where id = $1 and retired_at is null"
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Arm a relay's one fetch of its secrets: the token's hash and when it lapses. A new
    /// token (a relay replaced) takes the place of one not spent.
    pub async fn issue_relay_secrets_token(
        &self,
        id: &str,
        token_hash: &str,
        expires_at: DateTime<Utc>,
    ) -> Result<()> {
        let n = on_pool!(self, |p| sqlx::query(
            "update hosts set relay_secrets_token_hash = $2, relay_secrets_expires_at = $3,
                    relay_secrets_fetched_at = null, relay_secrets_fetched_from = null
             where id = $1 and retired_at is null"
        )
        .bind(id)
        .bind(token_hash)
        .bind(expires_at)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        if n == 0 {
            return Err(DbError::NotFound);
        }
        Ok(())
    }

    /// Spend a relay's secrets token: the one statement that both checks it (live, not
    /// lapsed, the host neither retired nor being revoked) and clears it, so two fetches
    /// racing get one answer between them. `None` for every token that does not qualify.
    pub async fn spend_relay_secrets_token(
        &self,
        token_hash: &str,
        now: DateTime<Utc>,
        from: &str,
    ) -> Result<Option<SpentRelaySecrets>> {
        on_pool!(self, |p| sqlx::query_as::<_, SpentRelaySecrets>(
            "update hosts set relay_secrets_token_hash = null, relay_secrets_fetched_at = $2,
                    relay_secrets_fetched_from = $3
             where relay_secrets_token_hash = $1 and relay_secrets_expires_at > $2
               and retired_at is null and revoke_requested_at is null
             returning id as host_id, slug, relay_wg_key"
        )
        .bind(token_hash)
        .bind(now)
        .bind(from)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// When and from where a host's relay last fetched its secrets, if it has.
    pub async fn relay_secrets_fetched(&self, id: &str) -> Result<Option<(DateTime<Utc>, String)>> {
        let row = on_pool!(self, |p| sqlx::query_as::<
            _,
            (Option<DateTime<Utc>>, Option<String>),
        >(
            "select relay_secrets_fetched_at, relay_secrets_fetched_from from hosts where id = $1"
        )
        .bind(id)
        .fetch_optional(p)
        .await)?
        .ok_or(DbError::NotFound)?;
        Ok(row.0.zip(row.1))
    }

    pub async fn relay_record(&self, id: &str) -> Result<RelayRecord> {
        on_pool!(self, |p| sqlx::query_as::<_, RelayRecord>(
            "select relay_ip, relay_state, relay_error from hosts where id = $1"
        )
        .bind(id)
        .fetch_optional(p)
        .await)?
        .ok_or(DbError::NotFound)
    }

    /// Before a relay is replaced: the old address is about to be released, so the host's
    /// row stops pointing at it (the relay is provisioning until relay-provision records it).
    pub async fn forget_relay_address(&self, id: &str) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "update hosts set relay_ip = null, relay_state = 'provisioning', relay_error = null
             where id = $1 and retired_at is null"
        )
        .bind(id)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// Hosts whose revoke is in progress (stopped at a step), with the step and since when.
    pub async fn revokes_in_progress(&self) -> Result<Vec<(String, RevokeStep, DateTime<Utc>)>> {
        let rows: Vec<(String, String, DateTime<Utc>)> = on_pool!(self, |p| sqlx::query_as(
            "select id, revoke_step, revoke_requested_at from hosts
             where revoke_step in ('draining', 'removing_access') and retired_at is null
             order by revoke_requested_at"
        )
        .fetch_all(p)
        .await)?;
        rows.into_iter()
            .map(|(id, step, at)| {
                step.parse()
                    .map(|s| (id, s, at))
                    .map_err(|e: String| DbError::Backend(sqlx::Error::Decode(e.into())))
            })
            .collect()
    }

    /// A host's live instances, oldest first.
    pub async fn live_vms_of_host(&self, host_id: &str) -> Result<Vec<VmRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(
            format!(
                "select {VM_COLUMNS} from vms
             where host_id = $1 and deleted_at is null and creation_failed_at is null
             order by created_at, id"
            )
        ))
        .bind(host_id)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// A host's instances, live and recent, newest first, at most `limit`.
    pub async fn vms_of_host(&self, host_id: &str, limit: i64) -> Result<Vec<VmRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, VmRow>(sqlx::AssertSqlSafe(
            format!(
                "select {VM_COLUMNS} from vms where host_id = $1
             order by (deleted_at is null and creation_failed_at is null) desc, created_at desc, id
             limit $2"
            )
        ))
        .bind(host_id)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The audit trail of one host (entries whose target is the host or one of its
    /// instances or enrolments), newest first, at most `limit`.
    pub async fn audit_of_host(&self, host_id: &str, limit: i64) -> Result<Vec<AuditRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, AuditRow>(
            "select id, at, actor_sub, action, target, details, via_token from audit_log
             where target = $1
                or target in (select id from vms where host_id = $1)
                or target in (select id from host_enrollments where host_id = $1)
             order by at desc, id limit $2"
        )
        .bind(host_id)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}
