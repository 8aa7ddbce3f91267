//! The audit log: who did what to which thing, and when.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::types::Json;

use crate::{Result, Store, new_id};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct AuditRow {
    pub id: String,
    pub at: DateTime<Utc>,
    pub actor_sub: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub details: Json<Value>,
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
            "insert into audit_log (id, at, actor_sub, action, target, details)
             values ($1, $2, $3, $4, $5, $6)"
        )
        .bind(new_id())
        .bind(now)
        .bind(actor_sub)
        .bind(action)
        .bind(target)
        .bind(Json(&details))
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// The newest entries first.
    pub async fn audit_log(&self, limit: i64) -> Result<Vec<AuditRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, AuditRow>(
            "select id, at, actor_sub, action, target, details
             from audit_log order by at desc, id limit $1"
        )
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}
