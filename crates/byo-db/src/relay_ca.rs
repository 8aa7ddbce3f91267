//! The installation's relay CA: one row, created once. Two servers starting together may
//! both generate one; the first insert wins and both read it back.

use chrono::{DateTime, Utc};

use crate::{Result, Store};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct RelayCaRow {
    pub cert_pem: String,
    /// The CA's private key, sealed with the server key.
    pub sealed_key: String,
    pub created_at: DateTime<Utc>,
}

impl Store {
    /// The relay CA, if one was made.
    pub async fn relay_ca(&self) -> Result<Option<RelayCaRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, RelayCaRow>(
            "select cert_pem, sealed_key, created_at from relay_ca where id = 1"
        )
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Keep `candidate` as the relay CA unless one exists, and return the one that is kept.
    pub async fn relay_ca_or_insert(&self, candidate: &RelayCaRow) -> Result<RelayCaRow> {
        on_pool!(self, |p| sqlx::query(
            "insert into relay_ca (id, cert_pem, sealed_key, created_at)
             values (1, $1, $2, $3) on conflict (id) do nothing"
        )
        .bind(&candidate.cert_pem)
        .bind(&candidate.sealed_key)
        .bind(candidate.created_at)
        .execute(p)
        .await
        .map(drop))?;
        Ok(self
            .relay_ca()
            .await?
            .expect("the relay CA row exists after its insert"))
    }
}
