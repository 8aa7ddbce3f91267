//! The audit log: who did what to which thing, and when.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use crate::{Result, Store, new_id};

tokio::task_local! {
    /// The API token (its name) the request being served acts through (issue #43), set by
    /// the server around a token's request: every row [`Store::audit`] writes inside names
    /// it in `via_token`, so what a script did is told apart from what its person clicked.
    pub static VIA_TOKEN: String;
}

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct AuditRow {
    pub id: String,
    pub at: DateTime<Utc>,
    pub actor_sub: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub details: Json<Value>,
    pub via_token: Option<String>,
}

impl Store {
    /// Record an action. `details` must never carry a secret.
    pub async fn audit(
        &self,
        actor_sub: Option<&str>,
        action: &str,
        target: Option<&str>,
        details: Value,
        now: DateTime<Utc>,
    ) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "insert into audit_log (id, at, actor_sub, action, target, details, via_token)
             values ($1, $2, $3, $4, $5, $6, $7)"
        )
        .bind(new_id())
        .bind(now)
        .bind(actor_sub)
        .bind(action)
        .bind(target)
        .bind(Json(&details))
        .bind(VIA_TOKEN.try_with(Clone::clone).ok())
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// The newest entries first.
    pub async fn audit_log(&self, limit: i64) -> Result<Vec<AuditRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, AuditRow>(
            "select id, at, actor_sub, action, target, details, via_token
             from audit_log order by at desc, id limit $1"
        )
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}
