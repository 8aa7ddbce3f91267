//! Host profiles: the plan for a kind of host, written once by migration.

use serde_json::Value;
use sqlx::types::Json;

use crate::{Result, Store};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct ProfileRow {
    pub id: String,
    pub gpu_type: String,
    pub description: String,
    pub constants: Json<Value>,
    pub staff_only: bool,
}

impl Store {
    pub async fn profiles(&self) -> Result<Vec<ProfileRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, ProfileRow>(
            "select id, gpu_type, description, constants, staff_only from host_profiles order by id"
        )
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn profile(&self, id: &str) -> Result<Option<ProfileRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, ProfileRow>(
            "select id, gpu_type, description, constants, staff_only from host_profiles where id = $1"
        )
        .bind(id)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }
}
