//! The outbox (issue #38, 3): one row per notice per person, and the kinds each person
//! turned off. Migration 0022 says why the rows look as they do.

use chrono::{DateTime, Utc};

use crate::{Result, Store, new_id};

/// A notice as stored: to whom, about what, and how far its delivery got.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct NoticeRow {
    pub id: String,
    pub kind: String,
    pub condition: String,
    pub recipient_sub: String,
    pub email: String,
    pub subject: String,
    pub body: String,
    pub created_at: DateTime<Utc>,
    pub cleared_at: Option<DateTime<Utc>>,
    pub attempts: i32,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub email_sent_at: Option<DateTime<Utc>>,
    pub webhook_sent_at: Option<DateTime<Utc>>,
    pub given_up_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
}

/// A notice to raise for one person.
#[derive(Clone, Debug)]
pub struct NewNotice<'a> {
    pub kind: &'a str,
    /// What it is about; one open notice per (condition, person).
    pub condition: &'a str,
    pub recipient_sub: &'a str,
    pub subject: &'a str,
    pub body: &'a str,
    /// When the delivery job should first try it; `None` when no channel is configured
    /// (the outbox page is then the only delivery).
    pub deliver_at: Option<DateTime<Utc>>,
}

/// A delivery channel, each stamped on its own so one is never re-sent for the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    Email,
    Webhook,
}

/// sqlx takes only static SQL: the columns of a `NoticeRow`, spliced by `concat!`.
macro_rules! columns {
    () => {
        "select id, kind, condition, recipient_sub, email, subject, body, created_at, cleared_at, \
         attempts, next_attempt_at, email_sent_at, webhook_sent_at, given_up_at, last_error \
         from notices "
    };
}

impl Store {
    /// Raise `n` at `now`. Nothing is written — and `false` returned — when the person has an
    /// open notice on the same condition, has turned this kind off, is disabled or unknown.
    pub async fn raise_notice(&self, n: &NewNotice<'_>, now: DateTime<Utc>) -> Result<bool> {
        Ok(self.raise_notices(std::slice::from_ref(n), now).await? == 1)
    }

    /// [`raise_notice`](Store::raise_notice) for several at once, in one statement on
    /// PostgreSQL and one transaction on SQLite (a drain's batch of placements). How many
    /// were written.
    pub async fn raise_notices(&self, ns: &[NewNotice<'_>], now: DateTime<Utc>) -> Result<u64> {
        match &self.pool {
            crate::Pool::Postgres(p) => {
                let col = |f: &dyn Fn(&NewNotice<'_>) -> String| -> Vec<String> {
                    ns.iter().map(f).collect()
                };
                let written = sqlx::query(
                    "insert into notices (id, kind, condition, recipient_sub, email, subject, body,
                                          created_at, next_attempt_at)
                     select n.id, n.kind, n.condition, u.sub, u.email, n.subject, n.body, $1,
                            n.deliver_at
                     from unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                                 $7::text[], $8::timestamptz[])
                          as n(id, kind, condition, recipient_sub, subject, body, deliver_at)
                     join users u on u.sub = n.recipient_sub
                     where u.disabled_at is null
                       and not exists (select 1 from notice_opt_outs o
                                       where o.user_sub = u.sub and o.kind = n.kind)
                     on conflict do nothing",
                )
                .bind(now)
                .bind(col(&|_| new_id()))
                .bind(col(&|n| n.kind.to_owned()))
                .bind(col(&|n| n.condition.to_owned()))
                .bind(col(&|n| n.recipient_sub.to_owned()))
                .bind(col(&|n| n.subject.to_owned()))
                .bind(col(&|n| n.body.to_owned()))
                .bind(ns.iter().map(|n| n.deliver_at).collect::<Vec<_>>())
                .execute(p)
                .await?
                .rows_affected();
                Ok(written)
            }
            crate::Pool::Sqlite(p) => {
                let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                let mut written = 0;
                for n in ns {
                    written += sqlx::query(
                        "insert into notices (id, kind, condition, recipient_sub, email, subject,
                                              body, created_at, next_attempt_at)
                         select $1, $2, $3, u.sub, u.email, $5, $6, $7, $8
                         from users u
                         where u.sub = $4 and u.disabled_at is null
                           and not exists (select 1 from notice_opt_outs o
                                           where o.user_sub = u.sub and o.kind = $2)
                         on conflict do nothing",
                    )
                    .bind(new_id())
                    .bind(n.kind)
                    .bind(n.condition)
                    .bind(n.recipient_sub)
                    .bind(n.subject)
                    .bind(n.body)
                    .bind(now)
                    .bind(n.deliver_at)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                }
                tx.commit().await?;
                Ok(written)
            }
        }
    }

    /// The conditions of `kind` that have an open notice (to anyone), each once.
    pub async fn open_notice_conditions(&self, kind: &str) -> Result<Vec<String>> {
        on_pool!(self, |p| sqlx::query_scalar::<_, String>(
            "select distinct condition from notices
             where kind = $1 and cleared_at is null order by condition"
        )
        .bind(kind)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The condition went away: its open notices are stamped cleared, so its return is a new
    /// notice. Returns how many were cleared.
    pub async fn clear_notice_condition(&self, condition: &str, now: DateTime<Utc>) -> Result<u64> {
        on_pool!(self, |p| sqlx::query(
            "update notices set cleared_at = $2 where condition = $1 and cleared_at is null"
        )
        .bind(condition)
        .bind(now)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))
        .map_err(Into::into)
    }

    /// Notices with something left to send whose time has come, soonest first.
    pub async fn due_notices(&self, now: DateTime<Utc>, limit: i64) -> Result<Vec<NoticeRow>> {
        let sql = concat!(
            columns!(),
            "where next_attempt_at is not null and next_attempt_at <= $1
             order by next_attempt_at, id limit $2"
        );
        on_pool!(self, |p| sqlx::query_as::<_, NoticeRow>(sql)
            .bind(now)
            .bind(limit)
            .fetch_all(p)
            .await)
        .map_err(Into::into)
    }

    /// `channel` took notice `id` at `now`.
    pub async fn mark_notice_sent(
        &self,
        id: &str,
        channel: Channel,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let sql = match channel {
            Channel::Email => "update notices set email_sent_at = $2 where id = $1",
            Channel::Webhook => "update notices set webhook_sent_at = $2 where id = $1",
        };
        on_pool!(self, |p| sqlx::query(sql)
            .bind(id)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// One delivery attempt of notice `id` ended: counted, with when to try again (`None`:
    /// nothing left to send), when it was given up (`Some` on a permanent refusal) and the
    /// last error (`None` when it all went).
    pub async fn end_notice_attempt(
        &self,
        id: &str,
        next_attempt_at: Option<DateTime<Utc>>,
        given_up_at: Option<DateTime<Utc>>,
        last_error: Option<&str>,
    ) -> Result<()> {
        on_pool!(self, |p| sqlx::query(
            "update notices set attempts = attempts + 1, next_attempt_at = $2,
                                given_up_at = $3, last_error = $4
             where id = $1"
        )
        .bind(id)
        .bind(next_attempt_at)
        .bind(given_up_at)
        .bind(last_error)
        .execute(p)
        .await
        .map(|r| r.rows_affected()))?;
        Ok(())
    }

    /// The outbox, newest first; `recipient` narrows it to one person's.
    pub async fn notices(&self, recipient: Option<&str>, limit: i64) -> Result<Vec<NoticeRow>> {
        let sql = concat!(
            columns!(),
            "where ($1 is null or recipient_sub = $1)
             order by created_at desc, id limit $2"
        );
        on_pool!(self, |p| sqlx::query_as::<_, NoticeRow>(sql)
            .bind(recipient)
            .bind(limit)
            .fetch_all(p)
            .await)
        .map_err(Into::into)
    }

    /// Everyone who runs the platform and is not disabled: operators and superadmins, each
    /// once — the recipients of the operators' notices.
    pub async fn operator_subs(&self) -> Result<Vec<String>> {
        on_pool!(self, |p| sqlx::query_scalar::<_, String>(
            "select distinct r.user_sub from user_roles r join users u on u.sub = r.user_sub
             where r.role in ('operator', 'superadmin') and u.disabled_at is null
             order by r.user_sub"
        )
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// The kinds `user_sub` turned off.
    pub async fn notice_opt_outs(&self, user_sub: &str) -> Result<Vec<String>> {
        on_pool!(self, |p| sqlx::query_scalar::<_, String>(
            "select kind from notice_opt_outs where user_sub = $1 order by kind"
        )
        .bind(user_sub)
        .fetch_all(p)
        .await)
        .map_err(Into::into)
    }

    /// Turn `kind` off (`off`) or back on for `user_sub`. Idempotent either way.
    pub async fn set_notice_opt_out(
        &self,
        user_sub: &str,
        kind: &str,
        off: bool,
        now: DateTime<Utc>,
    ) -> Result<()> {
        if off {
            on_pool!(self, |p| sqlx::query(
                "insert into notice_opt_outs (user_sub, kind, created_at) values ($1, $2, $3)
                 on conflict do nothing"
            )
            .bind(user_sub)
            .bind(kind)
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected()))?;
        } else {
            on_pool!(self, |p| sqlx::query(
                "delete from notice_opt_outs where user_sub = $1 and kind = $2"
            )
            .bind(user_sub)
            .bind(kind)
            .execute(p)
            .await
            .map(|r| r.rows_affected()))?;
        }
        Ok(())
    }
}
