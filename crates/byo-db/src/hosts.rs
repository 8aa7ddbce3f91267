//! Hosts and the machines they are made of (host_nodes).

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use crate::{DbError, Result, Store, new_id};

/// What an activation did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Activation {
    /// An inactive host is now active.
    Activated,
    /// An active host's placement changed, from this one.
    Changed {
        placement: Option<String>,
        dedicated_to: Option<String>,
    },
    /// The host is already active and the request did not ask for a change: nothing written.
    AlreadyActive {
        placement: Option<String>,
        dedicated_to: Option<String>,
    },
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct HostRow {
    pub id: String,
    pub slug: String,
    pub owner_sub: String,
    pub profile_id: String,
    pub gpu_type: String,
    pub active: bool,
    pub dedicated: bool,
    pub dedicated_to: Option<String>,
    pub placement: Option<String>,
    pub prepare_state: Option<Json<byo_wire::prepare::PrepareState>>,
    pub prepared_at: Option<DateTime<Utc>>,
    pub pubkey: Option<String>,
    pub lockout_owner: bool,
    pub relay_name: Option<String>,
    pub relay_ip: Option<String>,
    pub created_at: DateTime<Utc>,
    pub activated_at: Option<DateTime<Utc>>,
    pub retired_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug)]
pub struct NewHost<'a> {
    pub slug: &'a str,
    pub owner_sub: &'a str,
    pub profile_id: &'a str,
    pub gpu_type: &'a str,
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct HostNodeRow {
    pub host_id: String,
    pub index: i32,
    pub machine_id: Option<String>,
    pub hardware_id: String,
    pub fingerprint: Json<Value>,
    pub rails: Json<Value>,
    pub prepare_state: Option<Json<byo_wire::prepare::PrepareState>>,
    pub created_at: DateTime<Utc>,
    pub retired_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug)]
pub struct NewHostNode<'a> {
    pub host_id: &'a str,
    pub index: i32,
    pub machine_id: Option<&'a str>,
    pub hardware_id: &'a str,
    pub fingerprint: &'a Value,
    pub rails: &'a Value,
}

impl Store {
    /// How many hosts of `gpu_type` are in service (active, not retired), free or not: whether
    /// a create of that kind has anywhere to go at all (issue #42, 1).
    pub async fn hosts_in_service(&self, gpu_type: &str) -> Result<i64> {
        on_pool!(self, |p| sqlx::query_scalar::<_, i64>(
            "select count(*) from hosts where gpu_type = $1 and active = true and retired_at is null"
        )
        .bind(gpu_type)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    /// Write a new hosts row. It is born inactive: `active = false` is the default and
    /// only [`Store::activate_host`] writes true.
    pub async fn insert_host(&self, new: NewHost<'_>, now: DateTime<Utc>) -> Result<HostRow> {
        on_pool!(self, |p| sqlx::query_as::<_, HostRow>(
            "insert into hosts (id, slug, owner_sub, profile_id, gpu_type, created_at)
             values ($1, $2, $3, $4, $5, $6)
             returning id, slug, owner_sub, profile_id, gpu_type, active, dedicated, dedicated_to,
                       placement, prepare_state, prepared_at, pubkey, lockout_owner, relay_name,
                       relay_ip, created_at, activated_at, retired_at"
        )
        .bind(new_id())
        .bind(new.slug)
        .bind(new.owner_sub)
        .bind(new.profile_id)
        .bind(new.gpu_type)
        .bind(now)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    /// The relay address of each of these hosts that has one, in one round trip (the
    /// instance list names each instance's relay).
    pub async fn relay_ips(
        &self,
        ids: &[&str],
    ) -> Result<std::collections::HashMap<String, String>> {
        if ids.is_empty() {
            return Ok(Default::default());
        }
        let sql = format!(
            "select id, relay_ip from hosts where relay_ip is not null and id in ({})",
            crate::marks(1, ids.len())
        );
        let rows: Vec<(String, String)> = on_pool!(self, |p| {
            // Only the count of placeholders is formatted in; every id is bound.
            let mut q = sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()));
            for id in ids {
                q = q.bind(*id);
            }
            q.fetch_all(p).await
        })?;
        Ok(rows.into_iter().collect())
    }

    pub async fn host(&self, id: &str) -> Result<Option<HostRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, HostRow>(
            "select id, slug, owner_sub, profile_id, gpu_type, active, dedicated, dedicated_to,
                    placement, prepare_state, prepared_at, pubkey, lockout_owner, relay_name,
                    relay_ip, created_at, activated_at, retired_at
             from hosts where id = $1"
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Record that preparation completed (the record L's rule 1 reads).
    pub async fn mark_host_prepared(&self, id: &str, now: DateTime<Utc>) -> Result<()> {
        let done = on_pool!(self, |p| sqlx::query(
            "update hosts set prepared_at = $2 where id = $1 and retired_at is null"
        )
        .bind(id)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        if done == 0 {
            return Err(DbError::NotFound);
        }
        Ok(())
    }

    /// The operator's approval: the single flag plus the placement chosen with it
    /// (`shared`, or `dedicated` to one user). A host whose preparation did not finish is
    /// refused by the schema (`hosts_active_prepared`), a retired one by
    /// `hosts_retired_inactive`, and a placement outside the closed set by
    /// `hosts_placement_closed_set`, whoever writes. Read and written under the row's lock:
    /// an already active host keeps its placement unless `change` says otherwise
    /// ([`Activation::AlreadyActive`]).
    pub async fn activate_host(
        &self,
        id: &str,
        placement: &str,
        dedicated_to: Option<&str>,
        change: bool,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<Activation> {
        in_tx!(self, |tx, for_update| {
            let current: Option<(bool, Option<String>, Option<String>)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!(
                    "select active, placement, dedicated_to from hosts where id = $1{for_update}"
                )))
                .bind(id)
                .fetch_optional(&mut *tx)
                .await?;
            let Some((active, was, was_to)) = current else {
                return Err(DbError::NotFound);
            };
            if active && !change {
                return Ok(Activation::AlreadyActive {
                    placement: was,
                    dedicated_to: was_to,
                });
            }
            sqlx::query(
                "update hosts set active = true, placement = $2, dedicated = $3, dedicated_to = $4,
                        activated_at = case when active then activated_at else $5 end,
                        activated_by = case when active then activated_by else $6 end
                 where id = $1",
            )
            .bind(id)
            .bind(placement)
            .bind(dedicated_to.is_some())
            .bind(dedicated_to)
            .bind(now)
            .bind(by)
            .execute(&mut *tx)
            .await?;
            Ok(if active {
                Activation::Changed {
                    placement: was,
                    dedicated_to: was_to,
                }
            } else {
                Activation::Activated
            })
        })
    }

    pub async fn set_host_dedicated(&self, id: &str, to: Option<&str>) -> Result<()> {
        let done = on_pool!(self, |p| sqlx::query(
            "update hosts set dedicated = $2, dedicated_to = $3 where id = $1"
        )
        .bind(id)
        .bind(to.is_some())
        .bind(to)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        if done == 0 {
            return Err(DbError::NotFound);
        }
        Ok(())
    }

    /// Stamp a host retired and clear what it was issued (N). Refused while it still has a
    /// live instance or a pre-booking whose window has not ended; the schema refuses a
    /// retired host that is active or dedicated; the `hosts_retire_nodes` trigger frees its
    /// machines' hardware ids. The enrolled enrolment is released with its secrets cleared.
    pub async fn retire_host(&self, id: &str, now: DateTime<Utc>) -> Result<()> {
        in_tx!(self, |tx, for_update| {
            let found: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "select id from hosts where id = $1 and retired_at is null{for_update}"
            )))
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?;
            if found.is_none() {
                return Err(DbError::NotFound);
            }
            let live: i64 = sqlx::query_scalar(
                "select count(*) from vms
                 where host_id = $1 and deleted_at is null and creation_failed_at is null",
            )
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
            if live > 0 {
                return Err(DbError::Refused("host_has_live_instance".into()));
            }
            let booked: i64 = sqlx::query_scalar(
                "select count(*) from prebookings
                 where host_id = $1 and closed_at is null and end_date > $2",
            )
            .bind(id)
            .bind(now)
            .fetch_one(&mut *tx)
            .await?;
            if booked > 0 {
                return Err(DbError::Refused("host_has_prebooking".into()));
            }
            sqlx::query(
                "update hosts set retired_at = $2, token_hash = null, ssh_map_token_hash = null,
                        tunnel_token = null, relay_wg_key = null,
                        relay_secrets_token_hash = null
                 where id = $1",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "update host_enrollments
                 set state = case when state = 'enrolled' then 'released' else state end,
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

    /// Write one machine of a host that is not retired. A hardware_id already in a host
    /// that is not retired is a [`DbError::Conflict`].
    pub async fn insert_host_node(&self, new: NewHostNode<'_>, now: DateTime<Utc>) -> Result<()> {
        let done = on_pool!(self, |p| {
            sqlx::query(
            r#"insert into host_nodes (host_id, "index", machine_id, hardware_id, fingerprint, rails, created_at)
               select $1, $2, $3, $4, $5, $6, $7
               where exists (select 1 from hosts where id = $1 and retired_at is null)"#
        )
        .bind(new.host_id)
        .bind(new.index)
        .bind(new.machine_id)
        .bind(new.hardware_id)
        .bind(Json(new.fingerprint))
        .bind(Json(new.rails))
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        })?;
        if done == 0 {
            return Err(DbError::Refused("host_retired".into()));
        }
        Ok(())
    }

    pub async fn host_nodes(&self, host_id: &str) -> Result<Vec<HostNodeRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, HostNodeRow>(
            r#"select host_id, "index", machine_id, hardware_id, fingerprint, rails, prepare_state,
                      created_at, retired_at
               from host_nodes where host_id = $1 order by "index""#
        )
        .bind(host_id)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}

/// How the backend reaches a host's agent.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct AgentTargetRow {
    pub id: String,
    pub slug: String,
    pub relay_ip: Option<String>,
    /// Sealed with the server key.
    pub agent_token: Option<String>,
}

impl Store {
    /// Every host that is not retired, rented or not, with how to reach its agent.
    pub async fn agent_targets(&self) -> Result<Vec<AgentTargetRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, AgentTargetRow>(
            "select id, slug, relay_ip, agent_token from hosts where retired_at is null order by slug"
        )
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn agent_target(&self, host_id: &str) -> Result<Option<AgentTargetRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, AgentTargetRow>(
            "select id, slug, relay_ip, agent_token from hosts where id = $1 and retired_at is null"
        )
        .bind(host_id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }
}

impl Store {
    /// The host a presented host token belongs to; retired hosts have none (N.6).
    pub async fn host_id_by_token(
        &self,
        token_hash: &byo_core::tokens::TokenHash,
    ) -> Result<Option<String>> {
        on_pool!(self, |p| sqlx::query_scalar::<_, String>(
            "select id from hosts where token_hash = $1 and retired_at is null"
        )
        .bind(token_hash.as_str())
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Record one progress event: node 0 on the hosts row, a satellite on its node row.
    /// `completed` stamps `prepared_at`, the record activation is gated on. Returns false
    /// when the host has no such node.
    pub async fn record_prepare_state(
        &self,
        host_id: &str,
        node: i32,
        state: &byo_wire::prepare::PrepareState,
        completed: bool,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let rows = if node == 0 {
            on_pool!(self, |p| {
                sqlx::query(
                "update hosts set prepare_state = $2,
                        prepared_at = case when $3 then coalesce(prepared_at, $4) else prepared_at end
                 where id = $1 and retired_at is null"
            )
            .bind(host_id)
            .bind(Json(state))
            .bind(completed)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected())
            })?
        } else {
            on_pool!(self, |p| sqlx::query(
                r#"update host_nodes set prepare_state = $3 where host_id = $1 and "index" = $2"#
            )
            .bind(host_id)
            .bind(node)
            .bind(Json(state))
            .execute(p)
            .await
            .map(|r| r.rows_affected()))?
        };
        Ok(rows == 1)
    }
}

impl Store {
    /// One machine's `host_nodes.rails` as a rail step left them (130–132): the whole value
    /// replaced. Returns false when the host (live, not retired) has no such node.
    pub async fn record_node_rails(&self, host_id: &str, node: i32, rails: &Value) -> Result<bool> {
        let rows = on_pool!(self, |p| sqlx::query(
            r#"update host_nodes set rails = $3
               where host_id = $1 and "index" = $2
                 and host_id in (select id from hosts where retired_at is null)"#
        )
        .bind(host_id)
        .bind(node)
        .bind(Json(rails))
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(rows == 1)
    }
}

/// node0's host_status row, as the last heartbeat left it (133).
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct HostStatusRow {
    pub host_id: String,
    pub seen_at: DateTime<Utc>,
    pub agent_version: Option<String>,
    pub lxd: Option<String>,
    pub relay: Option<String>,
    pub tunnel: Option<String>,
    pub gpu: Option<String>,
    pub storage: Option<String>,
    pub instances: Option<i32>,
    /// What the beat said beyond the columns, less the logins and rail counts, which are
    /// kept where they belong.
    pub details: Json<byo_wire::vm::BeatDetails>,
}

impl Store {
    /// One heartbeat (133), authenticated and written in one statement: the host whose
    /// token hashes to `token_hash` (not retired) gets its host_status row upserted with
    /// `seen_at = now`; the answer is its id and whether it holds a live row. `None` when no
    /// host holds that token — nothing is written. Beats arriving together are written
    /// together (`beats`: group commit); each is answered once its row is committed.
    pub async fn record_heartbeat(
        &self,
        token_hash: &byo_core::tokens::TokenHash,
        beat: &byo_wire::vm::Heartbeat,
        now: DateTime<Utc>,
    ) -> Result<Option<(String, bool)>> {
        self.beat_in_batch(crate::beats::BeatRow::of(token_hash, beat, now))
            .await
    }

    /// [`Store::record_heartbeat`] as its one statement alone, no batching: the database's
    /// own limit for a beat, which the heartbeat bench reads the rest against.
    pub async fn record_heartbeat_alone(
        &self,
        token_hash: &byo_core::tokens::TokenHash,
        beat: &byo_wire::vm::Heartbeat,
        now: DateTime<Utc>,
    ) -> Result<Option<(String, bool)>> {
        self.write_alone(&crate::beats::BeatRow::of(token_hash, beat, now))
            .await
    }

    pub async fn host_status(&self, host_id: &str) -> Result<Option<HostStatusRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, HostStatusRow>(
            "select host_id, seen_at, agent_version, lxd, relay, tunnel, gpu, storage, instances,
                    details
             from host_status where host_id = $1"
        )
        .bind(host_id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }
}
