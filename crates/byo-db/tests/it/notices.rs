//! The outbox in the store (issue #38, 3; migration 0022), on both backends: a notice is
//! raised once per open condition and person, not for a person who turned its kind off or
//! is disabled; a cleared condition comes back as a new notice; delivery is stamped per
//! channel and each attempt counted; the operators are the operators and superadmins.

use byo_db::Store;
use byo_db::notices::{Channel, NewNotice};
use byo_db::testing;
use byo_db::users::NewUser;
use byo_wire::Role;
use chrono::{DateTime, TimeDelta, Utc};

on_both!(
    a_condition_is_noticed_once_per_person_until_it_clears,
    delivery_is_stamped_per_channel_and_each_attempt_counted,
    opt_outs_and_the_operators,
);

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_900_000_000, 0).unwrap()
}

async fn user(store: &Store, email: &str) -> String {
    store
        .create_user(
            NewUser {
                email,
                display_name: "",
                password_hash: "$argon2id$x",
            },
            t0(),
        )
        .await
        .unwrap()
        .sub
}

fn notice<'a>(condition: &'a str, to: &'a str, at: Option<DateTime<Utc>>) -> NewNotice<'a> {
    NewNotice {
        kind: "host.unreachable",
        condition,
        recipient_sub: to,
        subject: "spark-1 is unreachable",
        body: "since 12:00",
        deliver_at: at,
    }
}

async fn a_condition_is_noticed_once_per_person_until_it_clears(db: testing::TestDb) {
    let a = user(&db, "a@example.com").await;
    let b = user(&db, "b@example.com").await;
    let t = t0();
    assert!(
        db.raise_notice(&notice("host:1", &a, Some(t)), t)
            .await
            .unwrap()
    );
    assert!(
        !db.raise_notice(&notice("host:1", &a, Some(t)), t)
            .await
            .unwrap(),
        "an open condition is not noticed twice"
    );
    assert!(
        db.raise_notice(&notice("host:1", &b, Some(t)), t)
            .await
            .unwrap()
    );
    assert!(
        db.raise_notice(&notice("host:2", &a, None), t)
            .await
            .unwrap()
    );
    assert!(
        !db.raise_notice(&notice("host:3", "nobody", Some(t)), t)
            .await
            .unwrap(),
        "an unknown person is noticed nothing"
    );
    assert_eq!(
        db.open_notice_conditions("host.unreachable").await.unwrap(),
        ["host:1", "host:2"]
    );
    assert!(db.open_notice_conditions("other").await.unwrap().is_empty());

    let later = t + TimeDelta::minutes(5);
    assert_eq!(db.clear_notice_condition("host:1", later).await.unwrap(), 2);
    assert_eq!(db.clear_notice_condition("host:1", later).await.unwrap(), 0);
    assert_eq!(
        db.open_notice_conditions("host.unreachable").await.unwrap(),
        ["host:2"]
    );
    assert!(
        db.raise_notice(&notice("host:1", &a, Some(later)), later)
            .await
            .unwrap(),
        "a condition that cleared and came back is a new notice"
    );

    let mine = db.notices(Some(&a), 10).await.unwrap();
    assert_eq!(mine.len(), 3);
    assert!(
        mine.iter()
            .all(|n| n.recipient_sub == a && n.email == "a@example.com")
    );
    assert_eq!(mine[0].cleared_at, None, "newest first");
    assert_eq!(mine[0].created_at, later);
    assert_eq!(
        mine.iter().filter(|n| n.cleared_at == Some(later)).count(),
        1
    );
    assert_eq!(db.notices(None, 10).await.unwrap().len(), 4);
    assert_eq!(db.notices(None, 2).await.unwrap().len(), 2);
}

async fn delivery_is_stamped_per_channel_and_each_attempt_counted(db: testing::TestDb) {
    let a = user(&db, "a@example.com").await;
    let t = t0();
    db.raise_notice(&notice("c:1", &a, Some(t)), t)
        .await
        .unwrap();
    db.raise_notice(&notice("c:2", &a, Some(t + TimeDelta::seconds(30))), t)
        .await
        .unwrap();
    db.raise_notice(&notice("c:3", &a, None), t).await.unwrap();
    let due = db.due_notices(t, 10).await.unwrap();
    assert_eq!(
        due.len(),
        1,
        "only what is due now, never what nobody can send"
    );
    assert_eq!(due[0].condition, "c:1");
    let later = t + TimeDelta::seconds(30);
    let due: Vec<String> = db
        .due_notices(later, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.condition)
        .collect();
    assert_eq!(due, ["c:1", "c:2"], "soonest first");
    assert_eq!(db.due_notices(later, 1).await.unwrap().len(), 1);

    let id = db.due_notices(t, 1).await.unwrap().remove(0).id;
    db.mark_notice_sent(&id, Channel::Webhook, t).await.unwrap();
    let retry = t + TimeDelta::minutes(1);
    db.end_notice_attempt(&id, Some(retry), None, Some("451 try later"))
        .await
        .unwrap();
    let due = db.due_notices(retry, 10).await.unwrap();
    assert_eq!(due.len(), 2);
    let n = due.into_iter().find(|n| n.id == id).unwrap();
    assert_eq!(n.attempts, 1);
    assert_eq!(n.webhook_sent_at, Some(t));
    assert_eq!(n.email_sent_at, None);
    assert_eq!(n.next_attempt_at, Some(retry));
    assert_eq!(n.last_error.as_deref(), Some("451 try later"));

    db.mark_notice_sent(&id, Channel::Email, retry)
        .await
        .unwrap();
    db.end_notice_attempt(&id, None, None, None).await.unwrap();
    let n = db
        .notices(None, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.id == id)
        .unwrap();
    assert_eq!(
        (n.attempts, n.next_attempt_at, n.last_error),
        (2, None, None)
    );
    assert_eq!((n.email_sent_at, n.webhook_sent_at), (Some(retry), Some(t)));
    assert!(
        !db.due_notices(retry, 10)
            .await
            .unwrap()
            .iter()
            .any(|n| n.id == id)
    );

    let other = db.due_notices(later, 10).await.unwrap().remove(0);
    db.end_notice_attempt(&other.id, None, Some(later), Some("550 no such user"))
        .await
        .unwrap();
    let n = db
        .notices(None, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|n| n.id == other.id)
        .unwrap();
    assert_eq!((n.given_up_at, n.next_attempt_at), (Some(later), None));
}

async fn opt_outs_and_the_operators(db: testing::TestDb) {
    let t = t0();
    let op = user(&db, "op@example.com").await;
    let root = user(&db, "root@example.com").await;
    let both = user(&db, "both@example.com").await;
    let owner = user(&db, "owner@example.com").await;
    let gone = user(&db, "gone@example.com").await;
    db.grant_role(&op, Role::Operator, None, t).await.unwrap();
    db.grant_role(&root, Role::Superadmin, None, t)
        .await
        .unwrap();
    db.grant_role(&both, Role::Superadmin, None, t)
        .await
        .unwrap();
    db.grant_role(&both, Role::Operator, None, t).await.unwrap();
    db.grant_role(&owner, Role::CommunityHost, None, t)
        .await
        .unwrap();
    db.grant_role(&gone, Role::Operator, None, t).await.unwrap();
    db.execute_unchecked(&format!(
        "update users set disabled_at = '{}' where sub = '{gone}'",
        t.to_rfc3339()
    ))
    .await
    .unwrap();
    let mut want = vec![op.clone(), root.clone(), both.clone()];
    want.sort();
    assert_eq!(db.operator_subs().await.unwrap(), want);
    assert!(
        !db.raise_notice(&notice("c:1", &gone, Some(t)), t)
            .await
            .unwrap(),
        "a disabled person is noticed nothing"
    );

    assert!(db.notice_opt_outs(&op).await.unwrap().is_empty());
    for _ in 0..2 {
        db.set_notice_opt_out(&op, "host.unreachable", true, t)
            .await
            .unwrap();
    }
    db.set_notice_opt_out(&op, "queue.placed", true, t)
        .await
        .unwrap();
    assert_eq!(
        db.notice_opt_outs(&op).await.unwrap(),
        ["host.unreachable", "queue.placed"]
    );
    assert!(
        !db.raise_notice(&notice("c:1", &op, Some(t)), t)
            .await
            .unwrap(),
        "a kind turned off is not raised"
    );
    for _ in 0..2 {
        db.set_notice_opt_out(&op, "host.unreachable", false, t)
            .await
            .unwrap();
    }
    assert_eq!(db.notice_opt_outs(&op).await.unwrap(), ["queue.placed"]);
    assert!(
        db.raise_notice(&notice("c:1", &op, Some(t)), t)
            .await
            .unwrap()
    );
    assert!(db.notice_opt_outs(&root).await.unwrap().is_empty());
}
