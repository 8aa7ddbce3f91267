//! Browser sessions. Only the hash of a session token is stored.

use byo_core::tokens::TokenHash;
use chrono::{DateTime, Utc};

use crate::users::UserRow;
use crate::{Result, Store};

impl Store {
    pub async fn create_session(
        &self,
        token_hash: &TokenHash,
        user_sub: &str,
        now: DateTime<Utc>,
        expires_at: DateTime<Utc>,
    ) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "insert into sessions (token_hash, user_sub, created_at, expires_at)
             values ($1, $2, $3, $4)"
        )
        .bind(token_hash.as_str())
        .bind(user_sub)
        .bind(now)
        .bind(expires_at)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// The user behind a live session (not expired, the user not disabled) with their roles,
    /// in one round trip: what every request a browser makes asks first (issue #41, 3: the
    /// check is a read, and one).
    pub async fn session_user(
        &self,
        token_hash: &TokenHash,
        now: DateTime<Utc>,
    ) -> Result<Option<(UserRow, Vec<byo_wire::Role>)>> {
        #[derive(sqlx::FromRow)]
        struct Row {
            #[sqlx(flatten)]
            user: UserRow,
            roles: Option<String>,
        }
        let row = on_pool!(self, |p| {
            sqlx::query_as::<_, Row>(
            "select u.sub, u.email, u.display_name, u.password_hash, u.created_at, u.disabled_at,
                    (select string_agg(r.role, ',' order by r.role) from user_roles r
                     where r.user_sub = u.sub) as roles
             from sessions s join users u on u.sub = s.user_sub
             where s.token_hash = $1 and s.expires_at > $2 and u.disabled_at is null"
        )
        .bind(token_hash.as_str())
        .bind(now)
        .fetch_optional(p)
        .await
        })?;
        Ok(row.map(|r| {
            // An unknown role cannot be stored (user_roles_role_known).
            let roles = r
                .roles
                .iter()
                .flat_map(|s| s.split(','))
                .filter_map(|role| role.parse().ok())
                .collect();
            (r.user, roles)
        }))
    }

    pub async fn delete_session(&self, token_hash: &TokenHash) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "delete from sessions where token_hash = $1"
        )
        .bind(token_hash.as_str())
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// End every session of a user (after a password change, say).
    pub async fn delete_sessions_of(&self, user_sub: &str) -> Result<u64> {
        let done = on_pool!(self, |p| sqlx::query(
            "delete from sessions where user_sub = $1"
        )
        .bind(user_sub)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done)
    }

    pub async fn purge_expired_sessions(&self, now: DateTime<Utc>) -> Result<u64> {
        let done = on_pool!(self, |p| sqlx::query(
            "delete from sessions where expires_at <= $1"
        )
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done)
    }
}
