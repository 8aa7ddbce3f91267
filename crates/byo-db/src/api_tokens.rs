//! API tokens (issue #43): a person's account through the API, within one scope. Only the
//! SHA-256 of a token is stored; a revoked token keeps its row, so presenting it says so.

use byo_core::tokens::TokenHash;
use byo_wire::states::ApiScope;
use chrono::{DateTime, TimeDelta, Utc};

use crate::users::UserRow;
use crate::{DbError, Result, Store, new_id};

macro_rules! columns {
    () => {
        "id, user_sub, name, scope, created_at, expires_at, revoked_at, last_used_at, \
         last_used_from"
    };
}

#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct ApiTokenRow {
    pub id: String,
    pub user_sub: String,
    pub name: String,
    #[sqlx(try_from = "String")]
    pub scope: ApiScope,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub last_used_at: Option<DateTime<Utc>>,
    pub last_used_from: Option<String>,
}

#[derive(Clone, Debug)]
pub struct NewApiToken<'a> {
    pub user_sub: &'a str,
    pub name: &'a str,
    pub scope: ApiScope,
    pub token_hash: &'a TokenHash,
    pub expires_at: DateTime<Utc>,
}

/// A presented token's row and the person it acts for.
#[derive(Clone, Debug)]
pub struct PresentedToken {
    pub token: ApiTokenRow,
    pub user: UserRow,
}

/// The most live (not revoked) tokens one person holds; past it a create is refused with
/// [`DbError::Conflict`] naming `api_tokens_too_many`.
pub const MAX_LIVE_TOKENS: i64 = 50;

/// How stale a token's last use may get before a use writes it again: a script calling
/// every second writes once a minute, not every call. A use from another address writes
/// at once.
pub const LAST_USE_GRANULARITY: TimeDelta = TimeDelta::minutes(1);

impl Store {
    /// Keep a new token. A live token of the same name is a [`DbError::Conflict`] naming
    /// `api_tokens_live_name`; one past [`MAX_LIVE_TOKENS`], `api_tokens_too_many`.
    pub async fn insert_api_token(
        &self,
        new: NewApiToken<'_>,
        now: DateTime<Utc>,
    ) -> Result<ApiTokenRow> {
        let row = in_tx!(self, |tx, for_update| {
            // Serialise one person's creates (PostgreSQL: their user row; SQLite: the write
            // lock), so two at once cannot both pass the count.
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "select sub from users where sub = $1{for_update}"
            )))
            .bind(new.user_sub)
            .fetch_optional(&mut *tx)
            .await?;
            let live: i64 = sqlx::query_scalar(
                "select count(*) from api_tokens where user_sub = $1 and revoked_at is null",
            )
            .bind(new.user_sub)
            .fetch_one(&mut *tx)
            .await?;
            if live >= MAX_LIVE_TOKENS {
                return Err(DbError::Conflict("api_tokens_too_many".into()));
            }
            sqlx::query_as::<_, ApiTokenRow>(concat!(
                "insert into api_tokens (id, user_sub, name, scope, token_hash, created_at, \
                 expires_at) values ($1, $2, $3, $4, $5, $6, $7) returning ",
                columns!()
            ))
            .bind(new_id())
            .bind(new.user_sub)
            .bind(new.name)
            .bind(new.scope.as_str())
            .bind(new.token_hash.as_str())
            .bind(now)
            .bind(new.expires_at)
            .fetch_one(&mut *tx)
            .await
            .map_err(|e| match DbError::from(e) {
                // SQLite names the columns, not the index.
                DbError::Conflict(_) => DbError::Conflict("api_tokens_live_name".into()),
                other => other,
            })?
        });
        Ok(row)
    }

    /// One person's tokens that are not revoked (expired ones too, until revoked), newest
    /// first.
    pub async fn api_tokens_of(&self, user_sub: &str) -> Result<Vec<ApiTokenRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, ApiTokenRow>(concat!(
            "select ",
            columns!(),
            " from api_tokens where user_sub = $1 and revoked_at is null \
             order by created_at desc, id"
        ))
        .bind(user_sub)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The token a caller presented, whatever its state (expired and revoked are the
    /// caller's to be told), with its person.
    pub async fn api_token_by_hash(
        &self,
        token_hash: &TokenHash,
    ) -> Result<Option<PresentedToken>> {
        let token = on_pool!(self, |p| sqlx::query_as::<_, ApiTokenRow>(concat!(
            "select ",
            columns!(),
            " from api_tokens where token_hash = $1"
        ))
        .bind(token_hash.as_str())
        .fetch_optional(p)
        .await)?;
        let Some(token) = token else {
            return Ok(None);
        };
        let user = on_pool!(self, |p| sqlx::query_as::<_, UserRow>(
            "select sub, email, display_name, password_hash, created_at, disabled_at
             from users where sub = $1"
        )
        .bind(&token.user_sub)
        .fetch_one(p)
        .await)?;
        Ok(Some(PresentedToken { token, user }))
    }

    /// Revoke one of `user_sub`'s live tokens; `None` when they hold no such live token
    /// (another person's is as absent as none).
    pub async fn revoke_api_token(
        &self,
        user_sub: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<ApiTokenRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, ApiTokenRow>(concat!(
            "update api_tokens set revoked_at = $3
             where id = $1 and user_sub = $2 and revoked_at is null returning ",
            columns!()
        ))
        .bind(id)
        .bind(user_sub)
        .bind(now)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Note a use of token `id` from `from`: written when the last use is older than
    /// [`LAST_USE_GRANULARITY`] or was from elsewhere. Whether it wrote.
    pub async fn touch_api_token(&self, id: &str, now: DateTime<Utc>, from: &str) -> Result<bool> {
        let done = on_pool!(self, |p| sqlx::query(
            "update api_tokens set last_used_at = $2, last_used_from = $3
             where id = $1 and (last_used_at is null or last_used_at <= $4
                                or last_used_from is null or last_used_from <> $3)"
        )
        .bind(id)
        .bind(now)
        .bind(from)
        .bind(now - LAST_USE_GRANULARITY)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done == 1)
    }
}
