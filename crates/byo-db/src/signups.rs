//! Sign-ups waiting for their address to be confirmed (issue #36, 8). Only the hash of the
//! mailed token is stored, and the argon2 hash of the password chosen.

use byo_core::tokens::TokenHash;
use chrono::{DateTime, Utc};

use crate::{Result, Store};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct SignupRow {
    pub email: String,
    pub display_name: String,
    /// An argon2 PHC string; never a password.
    pub password_hash: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

impl Store {
    /// Keep a sign-up until its address is confirmed or `expires_at` passes.
    pub async fn create_signup(&self, token_hash: &TokenHash, row: &SignupRow) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "insert into signup_confirmations
               (token_hash, email, display_name, password_hash, created_at, expires_at)
             values ($1, $2, $3, $4, $5, $6)"
        )
        .bind(token_hash.as_str())
        .bind(&row.email)
        .bind(&row.display_name)
        .bind(&row.password_hash)
        .bind(row.created_at)
        .bind(row.expires_at)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// The sign-up a mailed token names, while it has not expired.
    pub async fn signup_by_token(
        &self,
        token_hash: &TokenHash,
        now: DateTime<Utc>,
    ) -> Result<Option<SignupRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, SignupRow>(
            "select email, display_name, password_hash, created_at, expires_at
             from signup_confirmations where token_hash = $1 and expires_at > $2"
        )
        .bind(token_hash.as_str())
        .bind(now)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Forget every sign-up of `email` (its account exists now). How many.
    pub async fn delete_signups_of(&self, email: &str) -> Result<u64> {
        let done = on_pool!(self, |p| sqlx::query(
            "delete from signup_confirmations where email = $1"
        )
        .bind(email)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done)
    }

    /// How many sign-ups of `email` are waiting (tests and the operator's questions).
    pub async fn signups_waiting(&self, email: &str) -> Result<i64> {
        on_pool!(self, |p| sqlx::query_scalar(
            "select count(*) from signup_confirmations where email = $1"
        )
        .bind(email)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn purge_expired_signups(&self, now: DateTime<Utc>) -> Result<u64> {
        let done = on_pool!(self, |p| sqlx::query(
            "delete from signup_confirmations where expires_at <= $1"
        )
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done)
    }
}
