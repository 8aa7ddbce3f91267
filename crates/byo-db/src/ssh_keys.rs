//! Customers' SSH keys. A create sends the one the customer names to the host; a key is
//! unique per user by its fingerprint (`ssh_keys_user_fingerprint_key`).

use chrono::{DateTime, Utc};

use crate::{DbError, Result, Store, new_id};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct SshKeyRow {
    pub id: String,
    pub user_sub: String,
    pub name: String,
    pub public_key: String,
    pub fingerprint: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug)]
pub struct NewSshKey<'a> {
    pub user_sub: &'a str,
    pub name: &'a str,
    pub public_key: &'a str,
    pub fingerprint: &'a str,
}

impl Store {
    /// Keep a key. The same key twice for one user is a [`DbError::Conflict`] naming
    /// `ssh_keys_user_fingerprint_key`.
    pub async fn insert_ssh_key(
        &self,
        new: NewSshKey<'_>,
        now: DateTime<Utc>,
    ) -> Result<SshKeyRow> {
        on_pool!(self, |p| sqlx::query_as::<_, SshKeyRow>(
            "insert into ssh_keys (id, user_sub, name, public_key, fingerprint, created_at)
             values ($1, $2, $3, $4, $5, $6)
             returning id, user_sub, name, public_key, fingerprint, created_at"
        )
        .bind(new_id())
        .bind(new.user_sub)
        .bind(new.name)
        .bind(new.public_key)
        .bind(new.fingerprint)
        .bind(now)
        .fetch_one(p)
        .await)
        .map_err(|e| match DbError::from(e) {
            // SQLite names the columns, not the constraint.
            DbError::Conflict(_) => DbError::Conflict("ssh_keys_user_fingerprint_key".into()),
            other => other,
        })
    }

    /// One user's keys, oldest first.
    pub async fn ssh_keys_of(&self, user_sub: &str) -> Result<Vec<SshKeyRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, SshKeyRow>(
            "select id, user_sub, name, public_key, fingerprint, created_at
             from ssh_keys where user_sub = $1 order by created_at, id"
        )
        .bind(user_sub)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The key `id` if `user_sub` holds it; another user's key is as absent as none.
    pub async fn ssh_key_of(&self, user_sub: &str, id: &str) -> Result<Option<SshKeyRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, SshKeyRow>(
            "select id, user_sub, name, public_key, fingerprint, created_at
             from ssh_keys where id = $1 and user_sub = $2"
        )
        .bind(id)
        .bind(user_sub)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Remove one of `user_sub`'s keys; false when they hold no such key. Instances
    /// already created keep the key they were created with.
    pub async fn delete_ssh_key(&self, user_sub: &str, id: &str) -> Result<bool> {
        let done = on_pool!(self, |p| sqlx::query(
            "delete from ssh_keys where id = $1 and user_sub = $2"
        )
        .bind(id)
        .bind(user_sub)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done == 1)
    }
}
