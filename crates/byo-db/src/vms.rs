//! Instances. Two facts end one (G): `delete_requested_at` when a delete is accepted and
//! `deleted_at` when the container is confirmed gone. Both writes are guarded by
//! `is null`, so whichever lands first wins and the other is a no-op.

use chrono::{DateTime, Utc};

use crate::{GuardedWrite, Result, Store, new_id};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct VmRow {
    pub id: String,
    pub user_sub: String,
    pub host_id: Option<String>,
    pub name: String,
    pub gpu_type: String,
    pub ssh_hostname: Option<String>,
    pub status: String,
    pub created_at: DateTime<Utc>,
    pub creation_failed_at: Option<DateTime<Utc>>,
    pub delete_requested_at: Option<DateTime<Utc>>,
    pub deleted_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug)]
pub struct NewVm<'a> {
    pub user_sub: &'a str,
    pub host_id: Option<&'a str>,
    pub name: &'a str,
    pub gpu_type: &'a str,
    pub ssh_hostname: Option<&'a str>,
}

impl Store {
    /// Write the row, host and name in one statement, with `created_at` as committed
    /// before the host is contacted (step 44).
    pub async fn create_vm(&self, new: NewVm<'_>, created_at: DateTime<Utc>) -> Result<VmRow> {
        on_pool!(self, |p| sqlx::query_as::<_, VmRow>(
            "insert into vms (id, user_sub, host_id, name, gpu_type, ssh_hostname, created_at)
             values ($1, $2, $3, $4, $5, $6, $7)
             returning id, user_sub, host_id, name, gpu_type, ssh_hostname, status, created_at,
                       creation_failed_at, delete_requested_at, deleted_at"
        )
        .bind(new_id())
        .bind(new.user_sub)
        .bind(new.host_id)
        .bind(new.name)
        .bind(new.gpu_type)
        .bind(new.ssh_hostname)
        .bind(created_at)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn vm(&self, id: &str) -> Result<Option<VmRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, VmRow>(
            "select id, user_sub, host_id, name, gpu_type, ssh_hostname, status, created_at,
                    creation_failed_at, delete_requested_at, deleted_at
             from vms where id = $1"
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// The backend accepted a delete. Stops nothing; billing continues.
    pub async fn request_vm_delete(&self, id: &str, now: DateTime<Utc>) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
            "update vms set delete_requested_at = $2 where id = $1 and delete_requested_at is null"
        )
        .bind(id)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }

    /// The container is confirmed gone (a 404 from the agent confirms). Billing stops here.
    pub async fn confirm_vm_deleted(&self, id: &str, now: DateTime<Utc>) -> Result<GuardedWrite> {
        let done = on_pool!(self, |p| {
            sqlx::query(
            "update vms set deleted_at = $2, status = 'deleted' where id = $1 and deleted_at is null"
        )
        .bind(id)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected())
        })?;
        Ok(GuardedWrite::from_rows(done))
    }
}
