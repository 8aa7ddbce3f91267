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

/// One entry of [`Store::audit_all`]. `details` must never carry a secret.
#[derive(Clone, Debug)]
pub struct NewAudit<'a> {
    pub actor_sub: Option<&'a str>,
    pub action: &'a str,
    pub target: Option<&'a str>,
    pub details: Value,
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
        let entry = NewAudit {
            actor_sub,
            action,
            target,
            details,
        };
        self.audit_all(std::slice::from_ref(&entry), now).await
    }

    /// Record several actions at `now`, all or none: one statement on PostgreSQL, one
    /// transaction on SQLite (a batch of placements is audited in one write).
    pub async fn audit_all(&self, entries: &[NewAudit<'_>], now: DateTime<Utc>) -> Result<()> {
        let via = VIA_TOKEN.try_with(Clone::clone).ok();
        match &self.pool {
            crate::Pool::Postgres(p) => {
                let col = |f: &dyn Fn(&NewAudit<'_>) -> Option<String>| -> Vec<Option<String>> {
                    entries.iter().map(f).collect()
                };
                sqlx::query(
                    "insert into audit_log (id, at, actor_sub, action, target, details, via_token)
                     select e.id, $1, e.actor_sub, e.action, e.target, cast(e.details as jsonb), $2
                     from unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
                          as e(id, actor_sub, action, target, details)",
                )
                .bind(now)
                .bind(via)
                .bind(col(&|_| Some(new_id())))
                .bind(col(&|e| e.actor_sub.map(str::to_owned)))
                .bind(col(&|e| Some(e.action.to_owned())))
                .bind(col(&|e| e.target.map(str::to_owned)))
                .bind(col(&|e| Some(e.details.to_string())))
                .execute(p)
                .await?;
            }
            crate::Pool::Sqlite(p) => {
                let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                for e in entries {
                    sqlx::query(
                        "insert into audit_log (id, at, actor_sub, action, target, details, via_token)
                         values ($1, $2, $3, $4, $5, $6, $7)",
                    )
                    .bind(new_id())
                    .bind(now)
                    .bind(e.actor_sub)
                    .bind(e.action)
                    .bind(e.target)
                    .bind(Json(&e.details))
                    .bind(via.as_deref())
                    .execute(&mut *tx)
                    .await?;
                }
                tx.commit().await?;
            }
        }
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
