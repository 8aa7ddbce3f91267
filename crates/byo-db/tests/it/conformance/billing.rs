//! Billing's Store rules (issue #13, 4; docs/billing.md) on both backends: the one Stripe
//! customer per account, a webhook event processed once, the instances bill-usage reads (a
//! keyset page, failed and half-made creates and closed billing left out), one charge per
//! period and one refund per instance.

use byo_db::billing::{EventSeen, NewRefund, NewUsageCharge};
use byo_db::testing::TestDb;
use byo_db::{DbError, GuardedWrite};
use byo_wire::states::VmStatus;
use chrono::Duration;

use super::{host, now, user, vm};

pub(super) async fn billing_a_customer_is_kept_once_and_the_first_writer_wins(db: TestDb) {
    let a = user(&db, "a@example.com").await;
    let b = user(&db, "b@example.com").await;
    assert_eq!(db.stripe_customer(&a).await.unwrap(), None);
    assert_eq!(
        db.keep_stripe_customer(&a, "cus_first", now())
            .await
            .unwrap(),
        "cus_first"
    );
    // A second writer (a racing checkout) gets the first one's customer, not its own.
    assert_eq!(
        db.keep_stripe_customer(&a, "cus_second", now())
            .await
            .unwrap(),
        "cus_first"
    );
    assert_eq!(
        db.stripe_customer(&a).await.unwrap().as_deref(),
        Some("cus_first")
    );
    // Another account is another row.
    assert_eq!(db.stripe_customer(&b).await.unwrap(), None);
    db.keep_stripe_customer(&b, "cus_b", now()).await.unwrap();
    assert_eq!(
        db.stripe_customer(&b).await.unwrap().as_deref(),
        Some("cus_b")
    );
    assert_eq!(
        db.stripe_customer(&a).await.unwrap().as_deref(),
        Some("cus_first")
    );
}

pub(super) async fn billing_a_webhook_event_is_new_then_unfinished_then_processed(db: TestDb) {
    assert_eq!(db.stripe_event_count().await.unwrap(), 0);
    let t = now();
    assert_eq!(
        db.record_stripe_event("evt_1", "checkout.session.completed", t)
            .await
            .unwrap(),
        EventSeen::New
    );
    // Seen, its processing not finished (the server died mid-way): process it again.
    assert_eq!(
        db.record_stripe_event("evt_1", "checkout.session.completed", t)
            .await
            .unwrap(),
        EventSeen::Unfinished
    );
    assert_eq!(
        db.mark_stripe_event_processed("evt_1", t).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.mark_stripe_event_processed("evt_1", t + Duration::seconds(1))
            .await
            .unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(
        db.record_stripe_event("evt_1", "checkout.session.completed", t)
            .await
            .unwrap(),
        EventSeen::Processed
    );
    // An unknown event is not marked.
    assert_eq!(
        db.mark_stripe_event_processed("evt_unknown", t)
            .await
            .unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(
        db.record_stripe_event("evt_2", "checkout.session.completed", t)
            .await
            .unwrap(),
        EventSeen::New
    );
    assert_eq!(db.stripe_event_count().await.unwrap(), 2);
}

pub(super) async fn billing_usage_reads_billable_instances_a_page_at_a_time(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let paying = user(&db, "paying@example.com").await;
    let free = user(&db, "free@example.com").await;
    db.keep_stripe_customer(&paying, "cus_paying", now())
        .await
        .unwrap();

    // One instance per host (vms_one_live_per_host), created a second apart so the order is known.
    let mut ids = Vec::new();
    for i in 0..5 {
        let h = host(&db, &owner, &format!("bill-{i}")).await;
        let v = vm(&db, &paying, &h).await;
        ids.push(v);
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    // 0: still being created (not billable); 1: running; 2: a failed create; 3: running,
    // its billing closed; 4: ran, then confirmed deleted (billable: it ended). A row deleted
    // while still being created never ran and bills nothing (issue #39: its delete marks the
    // create failed — `g_unsettled_creates_by_age_and_a_delete_of_one_that_never_ran`).
    db.mark_vm_running(&ids[1], Some(2201)).await.unwrap();
    db.mark_vm_creation_failed(&ids[2], now()).await.unwrap();
    db.mark_vm_running(&ids[3], Some(2203)).await.unwrap();
    assert_eq!(
        db.close_billing(&ids[3], now()).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.close_billing(&ids[3], now()).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    db.mark_vm_running(&ids[4], Some(2204)).await.unwrap();
    db.confirm_vm_deleted(&ids[4], now()).await.unwrap();
    assert!(db.billing_closed(&ids[3]).await.unwrap());
    assert!(!db.billing_closed(&ids[1]).await.unwrap());

    // An account without a customer: its live instance waits, counted.
    let h = host(&db, &owner, "bill-free").await;
    let waiting = vm(&db, &free, &h).await;
    db.mark_vm_running(&waiting, Some(2299)).await.unwrap();
    assert_eq!(db.vms_without_customer().await.unwrap(), 1);

    let all = db.vms_to_bill(None, 100).await.unwrap();
    let got: Vec<_> = all.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(got, [ids[1].as_str(), ids[4].as_str()]);
    assert!(
        all.iter()
            .all(|r| r.customer_id == "cus_paying" && r.user_sub == paying)
    );
    assert_eq!(all[0].status, VmStatus::Running);
    assert!(all[1].deleted_at.is_some());
    assert!(!got.contains(&waiting.as_str()));

    // The keyset page: one at a time reaches both, in order, and then nothing.
    let first = db.vms_to_bill(None, 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].id, ids[1]);
    let next = db
        .vms_to_bill(Some((first[0].created_at, first[0].id.clone())), 1)
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].id, ids[4]);
    let end = db
        .vms_to_bill(Some((next[0].created_at, next[0].id.clone())), 1)
        .await
        .unwrap();
    assert!(end.is_empty(), "{end:?}");

    // Once the waiting account has a customer, its instance is read and no longer waits.
    db.keep_stripe_customer(&free, "cus_free", now())
        .await
        .unwrap();
    assert_eq!(db.vms_without_customer().await.unwrap(), 0);
    let all = db.vms_to_bill(None, 100).await.unwrap();
    assert!(
        all.iter()
            .any(|r| r.id == waiting && r.customer_id == "cus_free")
    );
}

pub(super) async fn billing_one_charge_per_period_and_one_refund_per_instance(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let h = host(&db, &owner, "bill-h").await;
    let v = vm(&db, &owner, &h).await;
    let t0 = now();
    let period = |start: i64, key: &'static str| NewUsageCharge {
        vm_id: &v,
        user_sub: &owner,
        period_start: t0 + Duration::hours(start),
        period_end: t0 + Duration::hours(start + 1),
        seconds: 3600,
        amount_cents: 120,
        currency: "usd",
        idempotency_key: key,
        stripe_invoice_item_id: Some("ii_1"),
    };
    // Recorded out of order, read oldest first.
    db.record_usage_charge(&period(1, "k-1"), t0).await.unwrap();
    db.record_usage_charge(&period(0, "k-0"), t0).await.unwrap();
    let twice = db.record_usage_charge(&period(1, "k-1-again"), t0).await;
    assert!(
        matches!(&twice, Err(DbError::Conflict(name)) if name.starts_with("usage_charges")),
        "usage_charges_one_per_vm_period (SQLite names the columns): {twice:?}"
    );
    let charges = db.usage_charges(&v).await.unwrap();
    let keys: Vec<_> = charges.iter().map(|c| c.idempotency_key.as_str()).collect();
    assert_eq!(keys, ["k-0", "k-1"]);
    assert_eq!(charges[0].period_start, t0);
    assert_eq!(charges[1].seconds, 3600);
    assert_eq!(charges[1].amount_cents, 120);
    assert_eq!(charges[1].stripe_invoice_item_id.as_deref(), Some("ii_1"));

    assert!(db.refund_for(&v).await.unwrap().is_none());
    let refund = |key: &'static str| NewRefund {
        vm_id: &v,
        user_sub: &owner,
        from_at: t0,
        to_at: t0 + Duration::minutes(30),
        seconds: 1800,
        amount_cents: 60,
        currency: "usd",
        idempotency_key: key,
        stripe_credit_id: Some("cbtxn_1"),
    };
    db.record_refund(&refund("r-1"), t0).await.unwrap();
    let again = db.record_refund(&refund("r-2"), t0).await;
    assert!(
        matches!(&again, Err(DbError::Conflict(name)) if name.starts_with("refunds")),
        "refunds_one_per_vm (SQLite names the column): {again:?}"
    );
    let r = db.refund_for(&v).await.unwrap().unwrap();
    assert_eq!(
        (
            r.idempotency_key.as_str(),
            r.seconds,
            r.amount_cents,
            r.to_at
        ),
        ("r-1", 1800, 60, t0 + Duration::minutes(30))
    );
    assert_eq!(r.stripe_credit_id.as_deref(), Some("cbtxn_1"));
}
