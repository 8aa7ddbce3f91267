//! Pre-bookings (E3): a named box for a date range, pinned at booking time.

use chrono::{DateTime, Utc};

use crate::{GuardedWrite, Result, Store};

impl Store {
    /// The one write of `prebookings.paid_at` (E3.1: the launcher's only gate). Guarded: a
    /// booking already paid keeps its first payment time, so a replayed payment changes
    /// nothing.
    pub async fn mark_prebooking_paid(
        &self,
        id: &str,
        paid_at: DateTime<Utc>,
    ) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query("update prebookings set paid_at = $2 where id = $1 and paid_at is null")
                .bind(id)
                .bind(paid_at)
                .execute(p)
                .await
                .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }
}
