//! Enrolments: the allocation made at provisioning and the single-use token that redeems it.

use byo_core::tokens::TokenHash;
use byo_wire::states::EnrollmentState;
use chrono::{DateTime, Utc};

use crate::{Result, Store, new_id};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct EnrollmentRow {
    pub id: String,
    pub host_id: Option<String>,
    pub owner_sub: String,
    pub profile_id: String,
    #[sqlx(try_from = "String")]
    pub state: EnrollmentState,
    pub token_expires_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub redeemed_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug)]
pub struct NewEnrollment<'a> {
    pub host_id: &'a str,
    pub owner_sub: &'a str,
    pub profile_id: &'a str,
    pub token_hash: &'a TokenHash,
    pub token_expires_at: DateTime<Utc>,
}

impl Store {
    pub async fn create_enrollment(
        &self,
        new: NewEnrollment<'_>,
        now: DateTime<Utc>,
    ) -> Result<EnrollmentRow> {
        on_pool!(self, |p| sqlx::query_as::<_, EnrollmentRow>(
            "insert into host_enrollments
               (id, host_id, owner_sub, profile_id, state, token_hash, token_expires_at, created_at)
             values ($1, $2, $3, $4, 'pending', $5, $6, $7)
             returning id, host_id, owner_sub, profile_id, state, token_expires_at, created_at, redeemed_at"
        )
        .bind(new_id())
        .bind(new.host_id)
        .bind(new.owner_sub)
        .bind(new.profile_id)
        .bind(new.token_hash.as_str())
        .bind(new.token_expires_at)
        .bind(now)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn enrollment(&self, id: &str) -> Result<Option<EnrollmentRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, EnrollmentRow>(
            "select id, host_id, owner_sub, profile_id, state, token_expires_at, created_at, redeemed_at
             from host_enrollments where id = $1"
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }
}
