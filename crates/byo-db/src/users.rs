//! Local accounts and their grants.

use byo_wire::Role;
use chrono::{DateTime, Utc};

use crate::{DbError, Result, Store, new_id};

#[derive(Clone, Debug, sqlx::FromRow)]
pub struct UserRow {
    pub sub: String,
    pub email: String,
    pub display_name: String,
    /// An argon2 PHC string; never a password.
    pub password_hash: String,
    pub created_at: DateTime<Utc>,
    pub disabled_at: Option<DateTime<Utc>>,
}

#[derive(Clone, Debug)]
pub struct NewUser<'a> {
    pub email: &'a str,
    pub display_name: &'a str,
    pub password_hash: &'a str,
}

/// A user with what the operator's users page shows beside them.
#[derive(Clone, Debug)]
pub struct UserOverview {
    pub user: UserRow,
    pub roles: Vec<Role>,
    pub hosts_owned: i64,
}

#[derive(sqlx::FromRow)]
struct RoleRow {
    user_sub: String,
    role: String,
}

fn parse_roles(rows: Vec<RoleRow>) -> Vec<(String, Role)> {
    rows.into_iter()
        // An unknown role cannot be stored (user_roles_role_known), so skipping is unreachable.
        .filter_map(|r| r.role.parse().ok().map(|role| (r.user_sub, role)))
        .collect()
}

impl Store {
    /// Create a user. An email already taken is a [`DbError::Conflict`].
    pub async fn create_user(&self, new: NewUser<'_>, now: DateTime<Utc>) -> Result<UserRow> {
        let sub = new_id();
        on_pool!(self, |p| sqlx::query_as::<_, UserRow>(
            "insert into users (sub, email, display_name, password_hash, created_at)
             values ($1, $2, $3, $4, $5)
             returning sub, email, display_name, password_hash, created_at, disabled_at"
        )
        .bind(&sub)
        .bind(new.email)
        .bind(new.display_name)
        .bind(new.password_hash)
        .bind(now)
        .fetch_one(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn user(&self, sub: &str) -> Result<Option<UserRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, UserRow>(
            "select sub, email, display_name, password_hash, created_at, disabled_at
             from users where sub = $1"
        )
        .bind(sub)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    /// The email addresses of the accounts `subs` name, as (sub, email); unknown ones are
    /// left out. For naming people where a list holds their ids (the operator-key list).
    pub async fn emails_of(&self, subs: &[&str]) -> Result<Vec<(String, String)>> {
        if subs.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "select sub, email from users where sub in ({}) order by sub",
            crate::marks(1, subs.len())
        );
        on_pool!(self, |p| {
            let mut q = sqlx::query_as::<_, (String, String)>(sqlx::AssertSqlSafe(sql.clone()));
            for sub in subs {
                q = q.bind(*sub);
            }
            q.fetch_all(p).await
        })
        .map_err(Into::into)
    }

    pub async fn user_by_email(&self, email: &str) -> Result<Option<UserRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, UserRow>(
            "select sub, email, display_name, password_hash, created_at, disabled_at
             from users where email = $1"
        )
        .bind(email)
        .fetch_optional(p)
        .await)
        .map_err(Into::into)
    }

    pub async fn set_password_hash(&self, sub: &str, password_hash: &str) -> Result<()> {
        let done = on_pool!(self, |p| sqlx::query(
            "update users set password_hash = $2 where sub = $1"
        )
        .bind(sub)
        .bind(password_hash)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        if done == 0 {
            return Err(DbError::NotFound);
        }
        Ok(())
    }

    pub async fn roles_of(&self, sub: &str) -> Result<Vec<Role>> {
        let rows = on_pool!(self, |p| sqlx::query_as::<_, RoleRow>(
            "select user_sub, role from user_roles where user_sub = $1 order by role"
        )
        .bind(sub)
        .fetch_all(p)
        .await)?;
        Ok(parse_roles(rows).into_iter().map(|(_, r)| r).collect())
    }

    /// How many hosts (not retired) this user owns.
    pub async fn hosts_owned(&self, sub: &str) -> Result<i64> {
        let n: i64 = on_pool!(self, |p| sqlx::query_scalar(
            "select count(*) from hosts where owner_sub = $1 and retired_at is null"
        )
        .bind(sub)
        .fetch_one(p)
        .await)?;
        Ok(n)
    }

    /// Every user, oldest first, with their grants and host counts.
    pub async fn users_overview(&self) -> Result<Vec<UserOverview>> {
        let users = on_pool!(self, |p| sqlx::query_as::<_, UserRow>(
            "select sub, email, display_name, password_hash, created_at, disabled_at
             from users order by created_at, email"
        )
        .fetch_all(p)
        .await)?;
        let roles = parse_roles(on_pool!(self, |p| sqlx::query_as::<_, RoleRow>(
            "select user_sub, role from user_roles order by role"
        )
        .fetch_all(p)
        .await)?);
        let counts: Vec<(String, i64)> = on_pool!(self, |p| sqlx::query_as(
            "select owner_sub, count(*) from hosts where retired_at is null group by owner_sub"
        )
        .fetch_all(p)
        .await)?;
        Ok(users
            .into_iter()
            .map(|user| UserOverview {
                roles: roles
                    .iter()
                    .filter(|(s, _)| *s == user.sub)
                    .map(|(_, r)| *r)
                    .collect(),
                hosts_owned: counts
                    .iter()
                    .find(|(s, _)| *s == user.sub)
                    .map_or(0, |(_, n)| *n),
                user,
            })
            .collect())
    }

    /// Grant a role. Returns false when the user already held it.
    pub async fn grant_role(
        &self,
        sub: &str,
        role: Role,
        granted_by: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<bool> {
        let done = on_pool!(self, |p| sqlx::query(
            "insert into user_roles (user_sub, role, granted_by, granted_at)
             values ($1, $2, $3, $4) on conflict (user_sub, role) do nothing"
        )
        .bind(sub)
        .bind(role.as_str())
        .bind(granted_by)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(done == 1)
    }

    /// Revoke a role. Returns false when the user did not hold it. Revoking the last
    /// superadmin is refused: it would leave nobody able to grant anything.
    pub async fn revoke_role(&self, sub: &str, role: Role) -> Result<bool> {
        in_tx!(self, |tx, for_update| {
            if role == Role::Superadmin {
                // Lock every superadmin grant, so two revokes at once cannot each see the
                // other as the one left.
                let holders: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "select user_sub from user_roles where role = 'superadmin'{for_update}"
                )))
                .fetch_all(&mut *tx)
                .await?;
                if holders.iter().all(|h| h == sub) {
                    return Err(crate::Rule::LastSuperadmin.refused());
                }
            }
            let done = sqlx::query("delete from user_roles where user_sub = $1 and role = $2")
                .bind(sub)
                .bind(role.as_str())
                .execute(&mut *tx)
                .await?;
            Ok(done.rows_affected() == 1)
        })
    }

    /// How many users hold superadmin.
    pub async fn superadmin_count(&self) -> Result<i64> {
        let n: i64 = on_pool!(self, |p| sqlx::query_scalar(
            "select count(*) from user_roles where role = 'superadmin'"
        )
        .fetch_one(p)
        .await)?;
        Ok(n)
    }
}
