//! The signed operator-key lists (M): drafts that collect every operator's changes, the
//! published versions as their exact signed bytes, the fingerprint registry that makes
//! logins attributable (I), and per-host delivery.

use byo_wire::states::KeyListState;
use chrono::{DateTime, Utc};

use crate::{DbError, GuardedWrite, Result, Store, new_id};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct KeyListRow {
    pub version: i32,
    #[sqlx(try_from = "String")]
    pub state: KeyListState,
    /// The canonical bytes that are, or will be, signed.
    pub body: String,
    /// The signed envelope, exactly as verified, once published.
    pub envelope: Option<String>,
    pub created_at: DateTime<Utc>,
    pub created_by: Option<String>,
    pub published_at: Option<DateTime<Utc>>,
    pub published_by: Option<String>,
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct KeyChangeRow {
    pub id: String,
    pub version: i32,
    pub user_sub: String,
    pub action: String,
    pub fingerprint: String,
    pub label: String,
    pub at: DateTime<Utc>,
}

/// One key added or removed, by the operator it belongs to.
#[derive(Clone, Debug)]
pub struct KeyChange<'a> {
    pub user_sub: &'a str,
    /// `add`, `remove`, `depart` (every key of one operator) or `rotate` (M.13).
    pub action: &'a str,
    pub fingerprint: &'a str,
    pub label: &'a str,
}

/// A key as the registry holds it: whose it is, for attributing a login.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct OperatorKeyRow {
    pub user_sub: String,
    pub label: String,
    pub public_key: String,
    pub fingerprint: String,
    pub created_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
}

/// A key of a published list, for the registry.
#[derive(Clone, Debug)]
pub struct PublishedKey {
    pub user_sub: String,
    pub label: String,
    pub public_key: String,
    pub fingerprint: String,
}

/// What each host holds, for the operators' page.
#[derive(Clone, Debug, sqlx::FromRow)]
pub struct HostKeyPushRow {
    pub host_id: String,
    pub slug: String,
    pub version: Option<i32>,
    pub attempted_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

const LIST_COLUMNS: &str =
    "version, state, body, envelope, created_at, created_by, published_at, published_by";

impl Store {
    /// The newest version, draft or published.
    pub async fn newest_key_list(&self) -> Result<Option<KeyListRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, KeyListRow>(
            sqlx::AssertSqlSafe(format!(
                "select {LIST_COLUMNS} from operator_key_lists order by version desc limit 1"
            ))
        )
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// The newest published version: what enrolment and "send again" deliver.
    pub async fn published_key_list(&self) -> Result<Option<KeyListRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, KeyListRow>(
            sqlx::AssertSqlSafe(format!(
                "select {LIST_COLUMNS} from operator_key_lists where state = 'published'
             order by version desc limit 1"
            ))
        )
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn key_changes(&self, version: i32) -> Result<Vec<KeyChangeRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, KeyChangeRow>(
            "select id, version, user_sub, action, fingerprint, label, at
             from operator_key_changes where version = $1 order by at, id"
        )
        .bind(version)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Apply one change to the newest list (M.10). `build` gets the newest list's body (the
    /// draft if one is waiting, else the newest published one, else none) and the version
    /// the result will carry, and returns the new body — or refuses, changing nothing. The
    /// newest row is locked, so two changes at once are applied one on top of the other;
    /// two creating the first draft of a version at once collide on the key and the loser
    /// gets [`DbError::Conflict`], to retry.
    pub async fn apply_key_change<F>(
        &self,
        change: KeyChange<'_>,
        now: DateTime<Utc>,
        build: F,
    ) -> Result<KeyListRow>
    where
        F: FnOnce(Option<&str>, i32) -> Result<String>,
    {
        in_tx!(self, |tx, for_update| {
            let newest = sqlx::query_as::<_, KeyListRow>(sqlx::AssertSqlSafe(format!(
                "select {LIST_COLUMNS} from operator_key_lists order by version desc limit 1{for_update}"
            )))
            .fetch_optional(&mut *tx)
            .await?;
            let (version, draft_exists) = match &newest {
                Some(row) if row.state == KeyListState::Draft => (row.version, true),
                Some(row) => (row.version + 1, false),
                None => (1, false),
            };
            let body = build(newest.as_ref().map(|r| r.body.as_str()), version)?;
            if draft_exists {
                sqlx::query("update operator_key_lists set body = $2 where version = $1 and state = 'draft'")
                    .bind(version)
                    .bind(&body)
                    .execute(&mut *tx)
                    .await?;
            } else {
                sqlx::query(
                    "insert into operator_key_lists (version, state, body, created_at, created_by)
                     values ($1, 'draft', $2, $3, $4)",
                )
                .bind(version)
                .bind(&body)
                .bind(now)
                .bind(change.user_sub)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(
                "insert into operator_key_changes (id, version, user_sub, action, fingerprint, label, at)
                 values ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(new_id())
            .bind(version)
            .bind(change.user_sub)
            .bind(change.action)
            .bind(change.fingerprint)
            .bind(change.label)
            .bind(now)
            .execute(&mut *tx)
            .await?;
            let row = sqlx::query_as::<_, KeyListRow>(sqlx::AssertSqlSafe(format!(
                "select {LIST_COLUMNS} from operator_key_lists where version = $1"
            )))
            .bind(version)
            .fetch_one(&mut *tx)
            .await?;
            Ok(row)
        })
    }

    /// Publish `version` with its verified envelope. Only the newest version, and only
    /// while it is a draft: of two publishes at once exactly one writes. The registry of
    /// operator keys is brought to the published set in the same transaction.
    pub async fn publish_key_list(
        &self,
        version: i32,
        envelope: &str,
        keys: &[PublishedKey],
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        in_tx!(self, |tx, _for_update| {
            let done = sqlx::query(
                "update operator_key_lists
                 set state = 'published', envelope = $2, published_at = $3, published_by = $4
                 where version = $1 and state = 'draft'
                   and version = (select max(version) from operator_key_lists)",
            )
            .bind(version)
            .bind(envelope)
            .bind(now)
            .bind(by)
            .execute(&mut *tx)
            .await?;
            if done.rows_affected() == 0 {
                return Ok(GuardedWrite::AlreadySet);
            }
            let live: Vec<String> = sqlx::query_scalar(
                "select fingerprint from operator_keys where removed_at is null",
            )
            .fetch_all(&mut *tx)
            .await?;
            for fp in live
                .iter()
                .filter(|fp| !keys.iter().any(|k| &k.fingerprint == *fp))
            {
                sqlx::query("update operator_keys set removed_at = $2 where fingerprint = $1 and removed_at is null")
                    .bind(fp)
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
            }
            for k in keys.iter().filter(|k| !live.contains(&k.fingerprint)) {
                sqlx::query(
                    "insert into operator_keys (id, user_sub, label, public_key, fingerprint, created_at)
                     values ($1, $2, $3, $4, $5, $6)",
                )
                .bind(new_id())
                .bind(&k.user_sub)
                .bind(&k.label)
                .bind(&k.public_key)
                .bind(&k.fingerprint)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            }
            Ok(GuardedWrite::Written)
        })
    }

    /// Withdraw every unsigned draft (M.12), with the changes it collected. Nothing
    /// unsigned ever reached a host, so there is nothing to undo there.
    pub async fn withdraw_key_drafts(&self) -> Result<u64> {
        let n = on_pool!(self, |p| sqlx::query(
            "delete from operator_key_lists where state = 'draft'"
        )
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        if n == 0 {
            return Err(DbError::NotFound);
        }
        Ok(n)
    }

    /// Who a key belongs to, by the fingerprint sshd logged — including keys removed since.
    pub async fn operator_key_by_fingerprint(
        &self,
        fingerprint: &str,
    ) -> Result<Vec<OperatorKeyRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, OperatorKeyRow>(
            "select user_sub, label, public_key, fingerprint, created_at, removed_at
             from operator_keys where fingerprint = $1 order by created_at"
        )
        .bind(fingerprint)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Record the outcome of pushing a list to a host: the version it now holds, or why
    /// the push failed (the version it held before is kept).
    pub async fn record_key_push(
        &self,
        host_id: &str,
        outcome: std::result::Result<i32, &str>,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let (version, error) = match outcome {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e)),
        };
        on_pool!(self, |p| sqlx::query(
            "insert into host_key_pushes (host_id, version, attempted_at, error)
             values ($1, $2, $3, $4)
             on conflict (host_id) do update set
               version = coalesce(excluded.version, host_key_pushes.version),
               attempted_at = excluded.attempted_at,
               error = excluded.error"
        )
        .bind(host_id)
        .bind(version)
        .bind(now)
        .bind(error)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// Record the list handed over in a host's enrolment answer (step 29) as the version it
    /// holds, attempted at `now`. A push recorded meanwhile (a publish racing the redeem) is
    /// newer news: its attempt and outcome stay, only a version it lacks is filled in.
    pub async fn record_key_delivery_at_enrollment(
        &self,
        host_id: &str,
        version: i32,
        now: DateTime<Utc>,
    ) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "insert into host_key_pushes (host_id, version, attempted_at, error)
             values ($1, $2, $3, null)
             on conflict (host_id) do update set
               version = coalesce(host_key_pushes.version, excluded.version)"
        )
        .bind(host_id)
        .bind(version)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// Every host that is not retired, with the version it holds and the last failure.
    pub async fn key_push_status(&self) -> Result<Vec<HostKeyPushRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, HostKeyPushRow>(
            "select h.id as host_id, h.slug, k.version, k.attempted_at, k.error
             from hosts h left join host_key_pushes k on k.host_id = h.id
             where h.retired_at is null order by h.slug"
        )
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}
