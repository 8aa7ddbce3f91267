//! Attributable logins (issue #16, 5; migration 0017): the logins to spark that a host's
//! sshd accepted, as the heartbeat reports them. A login is kept once however often a beat
//! carrying it is sent (`operator_logins_once`); each host keeps its newest
//! [`KEEP_LOGINS_PER_HOST`].

use byo_wire::vm::OperatorLogin;
use chrono::{DateTime, Utc};

use crate::{Result, Store, new_id};

/// How many logins each host keeps; older ones are trimmed after each beat that adds some.
pub const KEEP_LOGINS_PER_HOST: i64 = 500;

/// One login as the pages show it: the operator's display name and key label where the
/// fingerprint or the sub is known here.
#[derive(Clone, Debug, sqlx::FromRow, serde::Serialize)]
pub struct OperatorLoginRow {
    pub logged_in_at: DateTime<Utc>,
    pub source: String,
    pub source_port: i32,
    pub fingerprint: String,
    pub user_sub: Option<String>,
    /// `users.display_name` of `user_sub`, when it has one (never the email: owners see it).
    pub operator_name: Option<String>,
    /// The label the operator gave the key, from `operator_keys` by fingerprint.
    pub key_label: Option<String>,
    /// The certificate the key came with (break glass), as sshd named it.
    pub certificate: Option<String>,
}

impl Store {
    /// Keep `logins` for `host_id`; a login already kept is left as it is. Returns how many
    /// were new.
    pub async fn record_operator_logins(
        &self,
        host_id: &str,
        logins: &[OperatorLogin],
        now: DateTime<Utc>,
    ) -> Result<u64> {
        if logins.is_empty() {
            return Ok(0);
        }
        let _turn = self.write_turn().await;
        let mut added = 0;
        for l in logins {
            added += on_pool!(self, |p| {
                sqlx::query(
                "insert into operator_logins
                   (id, host_id, logged_in_at, source, source_port, fingerprint, user_sub, reported_at, certificate)
                 values ($1, $2, $3, $4, $5, $6, $7, $8, $9)
                 on conflict (host_id, logged_in_at, source, source_port) do nothing"
            )
            .bind(new_id())
            .bind(host_id)
            .bind(l.at)
            .bind(&l.source)
            .bind(i32::from(l.source_port))
            .bind(&l.fingerprint)
            .bind(l.user_sub.as_deref())
            .bind(now)
            .bind(l.certificate.as_deref())
            .execute(p)
            .await
            .map(|r| r.rows_affected())
            })?;
        }
        on_pool!(self, |p| sqlx::query(
            "delete from operator_logins where host_id = $1 and id not in
               (select id from operator_logins where host_id = $1
                order by logged_in_at desc, id desc limit $2)"
        )
        .bind(host_id)
        .bind(KEEP_LOGINS_PER_HOST)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(added)
    }

    /// The newest `limit` logins to `host_id`, newest first.
    pub async fn operator_logins(
        &self,
        host_id: &str,
        limit: i64,
    ) -> Result<Vec<OperatorLoginRow>> {
        on_pool!(self, |p| sqlx::query_as::<_, OperatorLoginRow>(
            "select l.logged_in_at, l.source, l.source_port, l.fingerprint, l.user_sub, l.certificate,
                    nullif(u.display_name, '') as operator_name,
                    (select k.label from operator_keys k where k.fingerprint = l.fingerprint
                      order by k.created_at desc limit 1) as key_label
             from operator_logins l left join users u on u.sub = l.user_sub
             where l.host_id = $1
             order by l.logged_in_at desc, l.id desc limit $2"
        )
        .bind(host_id)
        .bind(limit)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }
}
