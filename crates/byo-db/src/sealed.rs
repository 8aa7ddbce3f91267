//! The columns that hold a value sealed with the server key, and the one pass that re-seals
//! them in place (issue #36, 8). The server binds each sealed value to its column and its row
//! (`byo-server::seal`); this is where those columns are named, so the place a value is
//! sealed for and the place it is kept are spelled once.

use chrono::{DateTime, Utc};

use crate::{GuardedWrite, Result, Store};

/// A column that holds sealed values. Its row is named by the table's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SealedColumn {
    /// `hosts.agent_token`: what the backend presents to the host's agent (M.7).
    AgentToken,
    /// `hosts.tunnel_token`: the tunnel's connector token, handed over at redeem.
    TunnelToken,
    /// `hosts.relay_wg_key`: the relay's WireGuard key, for a replacement relay (A.3).
    RelayWgKey,
    /// `host_enrollments.wg_config`: the secrets redeem hands over once.
    EnrollmentSecrets,
    /// `relay_ca.sealed_key`: the relay CA's key; its one row's key is `1`.
    RelayCaKey,
}

impl SealedColumn {
    pub const ALL: [SealedColumn; 5] = [
        SealedColumn::AgentToken,
        SealedColumn::TunnelToken,
        SealedColumn::RelayWgKey,
        SealedColumn::EnrollmentSecrets,
        SealedColumn::RelayCaKey,
    ];

    /// `table.column`, as the schema spells it.
    pub fn name(self) -> &'static str {
        match self {
            SealedColumn::AgentToken => "hosts.agent_token",
            SealedColumn::TunnelToken => "hosts.tunnel_token",
            SealedColumn::RelayWgKey => "hosts.relay_wg_key",
            SealedColumn::EnrollmentSecrets => "host_enrollments.wg_config",
            SealedColumn::RelayCaKey => "relay_ca.sealed_key",
        }
    }

    /// (table, column, the table's key column).
    fn parts(self) -> (&'static str, &'static str, &'static str) {
        let (table, column) = self.name().split_once('.').expect("table.column");
        (table, column, "id")
    }
}

/// The key of the relay CA's one row, as [`Store::sealed_values`] reads it.
pub const RELAY_CA_ROW: &str = "1";

/// One sealed value and the key of the row that holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealedValue {
    pub row: String,
    pub sealed: String,
}

impl Store {
    /// The values of `column` that begin with `prefix` (a seal's version), with their rows'
    /// keys as text.
    pub async fn sealed_values(
        &self,
        column: SealedColumn,
        prefix: &str,
    ) -> Result<Vec<SealedValue>> {
        let (table, col, key) = column.parts();
        // The names come from the closed list above, never from a caller.
        let sql = format!(
            "select cast({key} as text), {col} from {table}
             where substr({col}, 1, length(cast($1 as text))) = $1 order by {key}"
        );
        let rows: Vec<(String, String)> =
            on_pool!(self, |p| sqlx::query_as(sqlx::AssertSqlSafe(sql))
                .bind(prefix)
                .fetch_all(p)
                .await)?;
        Ok(rows
            .into_iter()
            .map(|(row, sealed)| SealedValue { row, sealed })
            .collect())
    }

    /// Write `new` in place of `old` in `column` of `row`, only while the row still holds
    /// `old`: a value another writer (or another server's pass) changed since it was read
    /// is left as that writer left it ([`GuardedWrite::AlreadySet`]).
    pub async fn replace_sealed(
        &self,
        column: SealedColumn,
        row: &str,
        old: &str,
        new: &str,
    ) -> Result<GuardedWrite> {
        let (table, col, key) = column.parts();
        let sql =
            format!("update {table} set {col} = $3 where cast({key} as text) = $1 and {col} = $2");
        let rows = on_pool!(self, |p| sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(row)
            .bind(old)
            .bind(new)
            .execute(p)
            .await
            .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(rows))
    }

    /// When the pass that re-sealed every old value in place finished, if it has (0026).
    pub async fn sealed_values_resealed_at(&self) -> Result<Option<DateTime<Utc>>> {
        on_pool!(self, |p| sqlx::query_scalar(
            "select resealed_at from sealed_v2 where id = 1"
        )
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// Record that the pass finished; the first record is kept.
    pub async fn mark_sealed_values_resealed(&self, now: DateTime<Utc>) -> Result<GuardedWrite> {
        let rows = on_pool!(self, |p| sqlx::query(
            "insert into sealed_v2 (id, resealed_at) values (1, $1) on conflict (id) do nothing"
        )
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(GuardedWrite::from_rows(rows))
    }
}
