//! Invoices in the store (issue #40, 1; migration 0023), on both backends: an account's
//! uninvoiced charges less its credits; an invoice made takes exactly those, once, and a
//! second is refused while one is pending; nothing positive, no invoice; a status moves only
//! forward with its stamps set once; the unfinished ones and an account's list; an owner's
//! payout (migration 0024) takes their lines paid before its cutoff, once.

use byo_db::GuardedWrite;
use byo_db::Store;
use byo_db::billing::{NewRefund, NewUsageCharge};
use byo_db::invoices::{InvoiceUpdate, REASON_MONTH_END, REASON_THRESHOLD};
use byo_db::testing;
use byo_db::users::NewUser;
use byo_db::vms::NewVm;
use byo_wire::states::InvoiceStatus;
use chrono::{DateTime, TimeDelta, Utc};

on_both!(
    an_invoice_takes_the_accounts_uninvoiced_charges_less_credits_once,
    an_invoice_status_moves_only_forward_and_stamps_once,
    instances_stopped_for_a_declined_invoice_are_released_once_it_is_paid,
    the_billing_page_reads_the_instances_billable_since_and_the_credits,
    a_bookings_payment_and_refund_are_kept_once_and_a_paid_booking_cancels_only_before_its_window,
    an_owners_earning_lines_are_the_invoiced_charges_and_credits_of_their_hosts,
    a_payout_takes_an_owners_lines_paid_before_its_cutoff_once,
);

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_900_000_000, 0).unwrap()
}

/// An account with a Stripe customer `cus_<email>` and an instance.
async fn account(store: &Store, email: &str) -> (String, String) {
    let sub = store
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
        .sub;
    store
        .keep_stripe_customer(&sub, &format!("cus_{email}"), t0())
        .await
        .unwrap();
    let vm = store
        .create_vm(
            NewVm {
                user_sub: &sub,
                host_id: None,
                name: email,
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            t0(),
        )
        .await
        .unwrap()
        .id;
    (sub, vm)
}

/// `owner`'s host `spark-a` and `customer`'s instance `on-a` on it: (host, instance).
async fn owned_vm(store: &Store, owner: &str, customer: &str) -> (String, String) {
    let host = store
        .insert_host(
            byo_db::hosts::NewHost {
                slug: "spark-a",
                owner_sub: owner,
                profile_id: "gb10-spark-1",
                gpu_type: "spark-1",
            },
            t0(),
        )
        .await
        .unwrap()
        .id;
    let vm = store
        .create_vm(
            NewVm {
                user_sub: customer,
                host_id: Some(&host),
                name: "on-a",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            t0(),
        )
        .await
        .unwrap()
        .id;
    (host, vm)
}

async fn charge(store: &Store, sub: &str, vm: &str, day: i64, cents: i32) {
    let start = t0() + TimeDelta::days(day);
    let key = format!("usage-{vm}-{day}");
    store
        .record_usage_charge(
            &NewUsageCharge {
                vm_id: vm,
                user_sub: sub,
                period_start: start,
                period_end: start + TimeDelta::days(1),
                seconds: 86_400,
                amount_cents: cents,
                currency: "usd",
                idempotency_key: &key,
                stripe_invoice_item_id: Some("ii_1"),
            },
            t0(),
        )
        .await
        .unwrap();
}

async fn credit(store: &Store, sub: &str, vm: &str, cents: i32) {
    let key = format!("refund-{vm}");
    store
        .record_refund(
            &NewRefund {
                vm_id: vm,
                user_sub: sub,
                from_at: t0(),
                to_at: t0() + TimeDelta::hours(1),
                seconds: 3600,
                amount_cents: cents,
                currency: "usd",
                idempotency_key: &key,
                stripe_credit_id: Some("ii_c"),
            },
            t0(),
        )
        .await
        .unwrap();
}

async fn an_invoice_takes_the_accounts_uninvoiced_charges_less_credits_once(db: testing::TestDb) {
    let (a, vm_a) = account(&db, "a@example.com").await;
    let (b, vm_b) = account(&db, "b@example.com").await;
    assert!(db.uninvoiced_balances().await.unwrap().is_empty());
    charge(&db, &a, &vm_a, 2, 300).await;
    charge(&db, &a, &vm_a, 1, 200).await;
    credit(&db, &a, &vm_a, 50).await;
    charge(&db, &b, &vm_b, 3, 70).await;
    let balances = db.uninvoiced_balances().await.unwrap();
    let of = |sub: &str| {
        balances
            .iter()
            .find(|x| x.user_sub == sub)
            .cloned()
            .unwrap()
    };
    assert_eq!(balances.len(), 2);
    assert_eq!(of(&a).amount_cents, 450, "charges less the credit");
    assert_eq!(of(&a).customer_id, "cus_a@example.com");
    assert_eq!(of(&a).earliest, t0(), "the credit's start is the oldest");
    assert_eq!(
        (of(&b).amount_cents, of(&b).earliest),
        (70, t0() + TimeDelta::days(3))
    );

    let at = t0() + TimeDelta::days(5);
    let inv = db
        .open_invoice(&a, "cus_a@example.com", REASON_MONTH_END, "usd", at)
        .await
        .unwrap()
        .expect("an invoice");
    assert_eq!(
        (
            inv.status,
            inv.amount_cents,
            inv.reason.as_str(),
            inv.created_at
        ),
        (InvoiceStatus::Pending, 450, REASON_MONTH_END, at)
    );
    assert_eq!(db.invoice_lines_total(&inv.id).await.unwrap(), (500, 50));
    for c in db.usage_charges(&vm_a).await.unwrap() {
        assert_eq!(c.invoice_id.as_deref(), Some(inv.id.as_str()));
    }
    assert_eq!(
        db.refund_for(&vm_a).await.unwrap().unwrap().invoice_id,
        Some(inv.id.clone())
    );
    // b's charge is untouched, and only b is left uninvoiced.
    assert_eq!(db.usage_charges(&vm_b).await.unwrap()[0].invoice_id, None);
    let left = db.uninvoiced_balances().await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].user_sub, b);

    // A new charge while a's invoice is pending: no second invoice until it is at Stripe.
    charge(&db, &a, &vm_a, 4, 10).await;
    assert_eq!(
        db.open_invoice(&a, "cus_a@example.com", REASON_THRESHOLD, "usd", at)
            .await
            .unwrap(),
        None
    );
    assert_eq!(db.invoice_lines_total(&inv.id).await.unwrap(), (500, 50));
    db.update_invoice(
        &inv.id,
        &InvoiceUpdate {
            status: Some(InvoiceStatus::Draft),
            stripe_invoice_id: Some("in_1"),
            ..Default::default()
        },
        at,
    )
    .await
    .unwrap();
    let next = db
        .open_invoice(
            &a,
            "cus_a@example.com",
            REASON_THRESHOLD,
            "usd",
            at + TimeDelta::minutes(1),
        )
        .await
        .unwrap()
        .expect("the next invoice, once the first is at Stripe");
    assert_eq!(next.amount_cents, 10);
    assert_eq!(db.invoice_lines_total(&next.id).await.unwrap(), (10, 0));

    // Nothing positive: a credit alone waits for charges.
    let (c, vm_c) = account(&db, "c@example.com").await;
    charge(&db, &c, &vm_c, 1, 0).await;
    credit(&db, &c, &vm_c, 40).await;
    assert_eq!(
        db.open_invoice(&c, "cus_c@example.com", REASON_MONTH_END, "usd", at)
            .await
            .unwrap(),
        None
    );
    assert_eq!(db.invoices_for(&c, 10).await.unwrap(), vec![]);

    // The unfinished: the pending one and the draft, oldest first; a's list newest first.
    let unfinished: Vec<_> = db
        .unfinished_invoices()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(unfinished, vec![inv.id.clone(), next.id.clone()]);
    let listed: Vec<_> = db
        .invoices_for(&a, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(listed.len(), 2);
    assert_eq!(db.invoices_for(&a, 1).await.unwrap().len(), 1);
    assert_eq!(
        db.invoice_by_stripe_id("in_1").await.unwrap().map(|i| i.id),
        Some(inv.id)
    );
}

async fn an_invoice_status_moves_only_forward_and_stamps_once(db: testing::TestDb) {
    let (a, vm) = account(&db, "a@example.com").await;
    charge(&db, &a, &vm, 1, 500).await;
    let t = t0();
    let inv = db
        .open_invoice(&a, "cus_a@example.com", REASON_THRESHOLD, "usd", t)
        .await
        .unwrap()
        .unwrap();
    let step = |minutes: i64| t + TimeDelta::minutes(minutes);
    let open = InvoiceUpdate {
        status: Some(InvoiceStatus::Open),
        stripe_invoice_id: Some("in_9"),
        hosted_invoice_url: Some("https://invoice.example/in_9"),
        stripe_total_cents: Some(500),
        ..Default::default()
    };
    assert_eq!(
        db.update_invoice(&inv.id, &open, step(1)).await.unwrap(),
        GuardedWrite::Written
    );
    let declined = InvoiceUpdate {
        pay_attempted: true,
        payment_failed: true,
        last_error: Some("declined"),
        ..Default::default()
    };
    db.update_invoice(&inv.id, &declined, step(2))
        .await
        .unwrap();
    // A second decline keeps the first stamps; a Stripe id once set is kept.
    let again = InvoiceUpdate {
        stripe_invoice_id: Some("in_other"),
        ..declined.clone()
    };
    db.update_invoice(&inv.id, &again, step(3)).await.unwrap();
    let row = db.invoice(&inv.id).await.unwrap().unwrap();
    assert_eq!(row.status, InvoiceStatus::Open);
    assert_eq!(row.stripe_invoice_id.as_deref(), Some("in_9"));
    assert_eq!(
        row.hosted_invoice_url.as_deref(),
        Some("https://invoice.example/in_9")
    );
    assert_eq!(row.stripe_total_cents, Some(500));
    assert_eq!(
        (
            row.finalized_at,
            row.pay_attempted_at,
            row.payment_failed_at
        ),
        (Some(step(1)), Some(step(2)), Some(step(2)))
    );
    assert_eq!(row.last_error.as_deref(), Some("declined"));
    assert_eq!(row.updated_at, step(3));
    assert!(
        db.unfinished_invoices().await.unwrap().is_empty(),
        "open and asked to pay: the webhooks carry the rest"
    );

    let paid = InvoiceUpdate {
        status: Some(InvoiceStatus::Paid),
        ..Default::default()
    };
    assert_eq!(
        db.update_invoice(&inv.id, &paid, step(4)).await.unwrap(),
        GuardedWrite::Written
    );
    // A late event that would reopen or void it writes nothing at all.
    for late in [
        InvoiceStatus::Open,
        InvoiceStatus::Draft,
        InvoiceStatus::Void,
    ] {
        let u = InvoiceUpdate {
            status: Some(late),
            hosted_invoice_url: Some("https://elsewhere"),
            ..Default::default()
        };
        assert_eq!(
            db.update_invoice(&inv.id, &u, step(5)).await.unwrap(),
            GuardedWrite::AlreadySet,
            "{late}"
        );
    }
    let row = db.invoice(&inv.id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.paid_at, row.finalized_at, row.voided_at),
        (InvoiceStatus::Paid, Some(step(4)), Some(step(1)), None)
    );
    assert_eq!(row.updated_at, step(4));
    assert_eq!(
        row.hosted_invoice_url.as_deref(),
        Some("https://invoice.example/in_9")
    );
    // An id that names no invoice writes nothing.
    assert_eq!(
        db.update_invoice("nope", &paid, step(6)).await.unwrap(),
        GuardedWrite::AlreadySet
    );

    // Void from open stamps voided_at.
    charge(&db, &a, &vm, 2, 100).await;
    let second = db
        .open_invoice(&a, "cus_a@example.com", REASON_THRESHOLD, "usd", t)
        .await
        .unwrap()
        .unwrap();
    let void = InvoiceUpdate {
        status: Some(InvoiceStatus::Void),
        ..Default::default()
    };
    db.update_invoice(&second.id, &void, step(7)).await.unwrap();
    let row = db.invoice(&second.id).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.voided_at, row.paid_at),
        (InvoiceStatus::Void, Some(step(7)), None)
    );
}

async fn instances_stopped_for_a_declined_invoice_are_released_once_it_is_paid(
    db: testing::TestDb,
) {
    let (a, vm) = account(&db, "a@example.com").await;
    let (b, vm_b) = account(&db, "b@example.com").await;
    db.mark_vm_running(&vm, Some(2222)).await.unwrap();
    db.mark_vm_running(&vm_b, Some(2223)).await.unwrap();
    // a's second instance: stopped by a's own hand; a third asked to be deleted.
    let second = db
        .create_vm(
            NewVm {
                user_sub: &a,
                host_id: None,
                name: "second",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            t0() + TimeDelta::minutes(1),
        )
        .await
        .unwrap()
        .id;
    db.mark_vm_running(&second, Some(2224)).await.unwrap();
    db.set_vm_power(&second, byo_wire::states::VmStatus::Stopped)
        .await
        .unwrap();
    charge(&db, &a, &vm, 1, 500).await;
    charge(&db, &b, &vm_b, 1, 500).await;
    let t = t0();
    let inv = db
        .open_invoice(&a, "cus_a@example.com", REASON_MONTH_END, "usd", t)
        .await
        .unwrap()
        .unwrap();
    let inv_b = db
        .open_invoice(&b, "cus_b@example.com", REASON_MONTH_END, "usd", t)
        .await
        .unwrap()
        .unwrap();
    let open = InvoiceUpdate {
        status: Some(InvoiceStatus::Open),
        stripe_invoice_id: Some("in_a"),
        ..Default::default()
    };
    db.update_invoice(&inv.id, &open, t).await.unwrap();
    assert!(db.declined_unpaid_invoices().await.unwrap().is_empty());
    assert_eq!(db.declined_unpaid_invoice(&a).await.unwrap(), None);
    let declined = InvoiceUpdate {
        pay_attempted: true,
        payment_failed: true,
        ..Default::default()
    };
    db.update_invoice(&inv.id, &declined, t).await.unwrap();
    // b's invoice declined later, still a draft's successor: open and declined too.
    db.update_invoice(
        &inv_b.id,
        &InvoiceUpdate {
            stripe_invoice_id: Some("in_b"),
            ..open.clone()
        },
        t,
    )
    .await
    .unwrap();
    db.update_invoice(&inv_b.id, &declined, t + TimeDelta::minutes(5))
        .await
        .unwrap();
    let ids: Vec<_> = db
        .declined_unpaid_invoices()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(
        ids,
        vec![inv.id.clone(), inv_b.id.clone()],
        "oldest decline first"
    );
    assert_eq!(
        db.declined_unpaid_invoice(&a).await.unwrap().map(|i| i.id),
        Some(inv.id.clone())
    );

    // Only a's running instance is to stop; once recorded, it is not listed again.
    let running = db.running_vms_of(&a).await.unwrap();
    assert_eq!(
        running.iter().map(|v| v.vm_id.as_str()).collect::<Vec<_>>(),
        [vm.as_str()]
    );
    assert!(!running[0].leaving);
    assert_eq!(running[0].invoice_id, None);
    assert_eq!(
        db.record_payment_stop(&vm, &a, &inv.id, t).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.record_payment_stop(&vm, &a, &inv.id, t).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    assert!(db.running_vms_of(&a).await.unwrap().is_empty());
    assert_eq!(db.payment_stop(&vm).await.unwrap(), Some(inv.id.clone()));
    assert_eq!(db.payment_stop(&second).await.unwrap(), None);
    assert_eq!(db.payment_stops_of(&a).await.unwrap(), 1);
    assert_eq!(db.payment_stops_of(&b).await.unwrap(), 0);
    let recent: Vec<_> = db
        .recent_invoices(10)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(recent.len(), 2);
    assert!(recent.contains(&inv.id) && recent.contains(&inv_b.id));
    assert_eq!(db.recent_invoices(1).await.unwrap().len(), 1);
    db.record_payment_stop(&vm_b, &b, &inv_b.id, t)
        .await
        .unwrap();
    // Nothing to release while the invoices are unpaid.
    assert!(db.payment_stops_to_release().await.unwrap().is_empty());
    // a pays: a's instance is to start, b's still waits.
    let paid = InvoiceUpdate {
        status: Some(InvoiceStatus::Paid),
        ..Default::default()
    };
    db.update_invoice(&inv.id, &paid, t).await.unwrap();
    let release = db.payment_stops_to_release().await.unwrap();
    assert_eq!(release.len(), 1);
    assert_eq!(
        (release[0].vm_id.as_str(), release[0].user_sub.as_str()),
        (vm.as_str(), a.as_str())
    );
    assert_eq!(release[0].name, "a@example.com");
    assert_eq!(release[0].invoice_id.as_deref(), Some(inv.id.as_str()));
    assert_eq!(release[0].status, byo_wire::states::VmStatus::Running);
    // Asked to be deleted meanwhile: leaving.
    db.request_vm_delete(&vm, t).await.unwrap();
    assert!(db.payment_stops_to_release().await.unwrap()[0].leaving);
    assert_eq!(
        db.release_payment_stop(&vm).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.release_payment_stop(&vm).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    assert!(db.payment_stops_to_release().await.unwrap().is_empty());
    assert_eq!(db.payment_stop(&vm_b).await.unwrap(), Some(inv_b.id));
}

async fn the_billing_page_reads_the_instances_billable_since_and_the_credits(db: testing::TestDb) {
    let (a, live) = account(&db, "a@example.com").await;
    let (b, _) = account(&db, "b@example.com").await;
    let make = |name: &'static str, at: DateTime<Utc>| {
        let (db, a) = (&db, a.clone());
        async move {
            db.create_vm(
                NewVm {
                    user_sub: &a,
                    host_id: None,
                    name,
                    gpu_type: "spark-1",
                    ssh_hostname: None,
                },
                at,
            )
            .await
            .unwrap()
            .id
        }
    };
    let since = t0() + TimeDelta::days(10);
    let gone_before = make("gone-before", t0()).await;
    db.mark_vm_running(&gone_before, Some(1)).await.unwrap();
    db.request_vm_delete(&gone_before, t0()).await.unwrap();
    db.confirm_vm_deleted(&gone_before, since - TimeDelta::seconds(1))
        .await
        .unwrap();
    let gone_after = make("gone-after", t0() + TimeDelta::minutes(1)).await;
    db.mark_vm_running(&gone_after, Some(2)).await.unwrap();
    db.request_vm_delete(&gone_after, t0()).await.unwrap();
    db.confirm_vm_deleted(&gone_after, since + TimeDelta::seconds(1))
        .await
        .unwrap();
    let failed = make("failed", t0()).await;
    db.mark_vm_creation_failed(&failed, t0()).await.unwrap();
    let rows = db.vms_billable_since(&a, since).await.unwrap();
    let names: Vec<_> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["a@example.com", "gone-after"], "oldest first");
    assert_eq!(rows[0].id, live);
    assert_eq!(rows[1].deleted_at, Some(since + TimeDelta::seconds(1)));
    assert!(db.vms_billable_since(&b, since).await.unwrap().len() == 1);

    assert!(db.refunds_of(&a, 10).await.unwrap().is_empty());
    credit(&db, &a, &live, 40).await;
    credit(&db, &a, &gone_after, 60).await;
    let credits = db.refunds_of(&a, 10).await.unwrap();
    assert_eq!(credits.len(), 2);
    assert_eq!(credits[0].amount_cents + credits[1].amount_cents, 100);
    assert_eq!(db.refunds_of(&a, 1).await.unwrap().len(), 1);
    assert!(db.refunds_of(&b, 10).await.unwrap().is_empty());
}

async fn a_bookings_payment_and_refund_are_kept_once_and_a_paid_booking_cancels_only_before_its_window(
    db: testing::TestDb,
) {
    use byo_db::billing::{BookingPaymentRow, BookingRefundRow};
    let (a, _) = account(&db, "a@example.com").await;
    let (b, _) = account(&db, "b@example.com").await;
    let start = t0() + TimeDelta::days(2);
    for (id, who) in [("pb-1", &a), ("pb-2", &a)] {
        db.execute_unchecked(&format!(
            "insert into prebookings (id, user_sub, gpu_type, start_date, end_date, created_at) \
             values ('{id}', '{who}', 'spark-1', '{}', '{}', '{}')",
            start.to_rfc3339(),
            (start + TimeDelta::days(1)).to_rfc3339(),
            t0().to_rfc3339()
        ))
        .await
        .unwrap();
    }
    assert_eq!(db.booking_payment("pb-1").await.unwrap(), None);
    let paid = BookingPaymentRow {
        prebooking_id: "pb-1".into(),
        payment_intent: "pi_1".into(),
        amount_cents: 7200,
        currency: "usd".into(),
        paid_at: t0(),
    };
    assert_eq!(
        db.record_booking_payment(&paid).await.unwrap(),
        GuardedWrite::Written
    );
    let again = BookingPaymentRow {
        payment_intent: "pi_other".into(),
        ..paid.clone()
    };
    assert_eq!(
        db.record_booking_payment(&again).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(db.booking_payment("pb-1").await.unwrap(), Some(paid));

    assert_eq!(db.booking_refund("pb-1").await.unwrap(), None);
    let refund = BookingRefundRow {
        prebooking_id: "pb-1".into(),
        stripe_refund_id: "re_1".into(),
        amount_cents: 7200,
        currency: "usd".into(),
        reason: "cancelled".into(),
        refunded_by: Some(a.clone()),
        created_at: t0(),
    };
    assert_eq!(
        db.record_booking_refund(&refund).await.unwrap(),
        GuardedWrite::Written
    );
    let second = BookingRefundRow {
        stripe_refund_id: "re_2".into(),
        ..refund.clone()
    };
    assert_eq!(
        db.record_booking_refund(&second).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(db.booking_refund("pb-1").await.unwrap(), Some(refund));

    // Unpaid: not cancelled this way. Paid: only by its booker, only before its window.
    assert_eq!(
        db.cancel_paid_prebooking("pb-2", &a, t0()).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    db.mark_prebooking_paid("pb-1", t0()).await.unwrap();
    db.mark_prebooking_paid("pb-2", t0()).await.unwrap();
    assert_eq!(
        db.cancel_paid_prebooking("pb-1", &b, t0()).await.unwrap(),
        GuardedWrite::AlreadySet,
        "another account's booking"
    );
    assert_eq!(
        db.cancel_paid_prebooking("pb-2", &a, start).await.unwrap(),
        GuardedWrite::AlreadySet,
        "its window has opened"
    );
    assert_eq!(
        db.cancel_paid_prebooking("pb-1", &a, start - TimeDelta::seconds(1))
            .await
            .unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.cancel_paid_prebooking("pb-1", &a, t0()).await.unwrap(),
        GuardedWrite::AlreadySet,
        "closed already"
    );
    let row = db.prebooking_for_billing("pb-1").await.unwrap().unwrap();
    assert_eq!(row.closed_at, Some(start - TimeDelta::seconds(1)));
    assert_eq!(
        db.prebooking_for_billing("pb-2")
            .await
            .unwrap()
            .unwrap()
            .closed_at,
        None
    );
}

async fn an_owners_earning_lines_are_the_invoiced_charges_and_credits_of_their_hosts(
    db: testing::TestDb,
) {
    let (customer, _) = account(&db, "c@example.com").await;
    let (owner, _) = account(&db, "owner@example.com").await;
    let (other, _) = account(&db, "other@example.com").await;
    let (host, vm) = owned_vm(&db, &owner, &customer).await;
    charge(&db, &customer, &vm, 1, 2880).await;
    credit(&db, &customer, &vm, 60).await;
    assert!(
        db.earning_lines(Some(&owner)).await.unwrap().is_empty(),
        "nothing invoiced yet"
    );
    let inv = db
        .open_invoice(
            &customer,
            "cus_c@example.com",
            REASON_MONTH_END,
            "usd",
            t0(),
        )
        .await
        .unwrap()
        .unwrap();
    let lines = db.earning_lines(Some(&owner)).await.unwrap();
    assert_eq!(lines.len(), 2);
    let credit_line = &lines[0];
    assert_eq!(
        (
            credit_line.kind.as_str(),
            credit_line.amount_cents,
            credit_line.seconds
        ),
        ("credit", -60, -3600)
    );
    let usage = &lines[1];
    assert_eq!(
        (usage.kind.as_str(), usage.amount_cents, usage.seconds),
        ("usage", 2880, 86_400)
    );
    assert_eq!(
        (
            usage.host_slug.as_str(),
            usage.vm_id.as_str(),
            usage.invoice_id.as_str()
        ),
        ("spark-a", vm.as_str(), inv.id.as_str())
    );
    assert_eq!(usage.host_id, host);
    assert_eq!(usage.at, t0() + TimeDelta::days(1));
    assert_eq!(usage.currency, "usd");
    assert_eq!(usage.invoice_status, InvoiceStatus::Pending);
    assert!(db.earning_lines(Some(&other)).await.unwrap().is_empty());
    assert_eq!(db.earning_lines(None).await.unwrap().len(), 2);
    // A void invoice earns nothing.
    db.update_invoice(
        &inv.id,
        &InvoiceUpdate {
            status: Some(InvoiceStatus::Void),
            ..Default::default()
        },
        t0(),
    )
    .await
    .unwrap();
    assert!(db.earning_lines(None).await.unwrap().is_empty());
}

/// Issue #40, 6: a payout takes the owner's part of exactly the lines on their hosts whose
/// invoice was paid before its cutoff and that no payout took; one per owner and month; a
/// part that comes to nothing writes nothing; a refused transfer is counted and waits for its
/// next attempt; a paid payout stays paid.
async fn a_payout_takes_an_owners_lines_paid_before_its_cutoff_once(db: testing::TestDb) {
    use byo_db::payouts::NewPayout;
    use byo_wire::states::PayoutStatus;
    let (customer, _) = account(&db, "c@example.com").await;
    let (owner, _) = account(&db, "owner@example.com").await;
    let (_, vm) = owned_vm(&db, &owner, &customer).await;
    charge(&db, &customer, &vm, 1, 2880).await;
    credit(&db, &customer, &vm, 60).await;
    let kept = db
        .keep_payout_account(&owner, "acct_1", t0())
        .await
        .unwrap();
    assert_eq!(kept.stripe_account_id, "acct_1");
    assert_eq!(
        db.keep_payout_account(&owner, "acct_2", t0())
            .await
            .unwrap()
            .stripe_account_id,
        "acct_1",
        "the first account is kept"
    );
    assert_eq!((kept.transfers_active, kept.checked_at), (false, None));
    db.record_payout_account_check(&owner, true, t0() + TimeDelta::hours(1))
        .await
        .unwrap();
    let checked = db.payout_account(&owner).await.unwrap().unwrap();
    assert_eq!(
        (checked.transfers_active, checked.checked_at),
        (true, Some(t0() + TimeDelta::hours(1)))
    );
    let far = t0() + TimeDelta::days(40);
    assert!(
        db.owners_due_payout("m1", far).await.unwrap().is_empty(),
        "nothing invoiced"
    );
    let inv = db
        .open_invoice(
            &customer,
            "cus_c@example.com",
            REASON_MONTH_END,
            "usd",
            t0(),
        )
        .await
        .unwrap()
        .unwrap();
    assert!(
        db.owners_due_payout("m1", far).await.unwrap().is_empty(),
        "invoiced, not paid"
    );
    let paid_at = t0() + TimeDelta::days(10);
    db.update_invoice(
        &inv.id,
        &InvoiceUpdate {
            status: Some(InvoiceStatus::Paid),
            ..Default::default()
        },
        paid_at,
    )
    .await
    .unwrap();
    assert!(
        db.owners_due_payout("m1", paid_at)
            .await
            .unwrap()
            .is_empty(),
        "paid at the cutoff, not before it"
    );
    let due = db.owners_due_payout("m1", far).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].user_sub, owner);
    let new = |month: &'static str| NewPayout {
        user_sub: &owner,
        month,
        stripe_account_id: "acct_1",
        currency: "usd",
        owner_share_bps: 7_000,
        paid_before: far,
        now: far,
    };
    // A part that comes to nothing writes nothing.
    assert!(db.open_payout(&new("m1"), |_| 0).await.unwrap().is_none());
    assert!(db.payouts_for(&owner, 10).await.unwrap().is_empty());
    assert!(
        db.earning_lines(Some(&owner))
            .await
            .unwrap()
            .iter()
            .all(|l| l.payout_id.is_none())
    );
    let p = db
        .open_payout(&new("m1"), |c| c * 7_000 / 10_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        p.amount_cents,
        2016 - 42,
        "each line's part, the credit's negative"
    );
    assert_eq!(
        (p.status, p.attempts, p.owner_share_bps),
        (PayoutStatus::Pending, 0, 7_000)
    );
    let lines = db.earning_lines(Some(&owner)).await.unwrap();
    assert_eq!(lines.len(), 2);
    assert!(
        lines
            .iter()
            .all(|l| l.payout_id.as_deref() == Some(p.id.as_str()))
    );
    // Once per owner and month, and a line is paid out once.
    assert!(db.open_payout(&new("m1"), |c| c).await.unwrap().is_none());
    assert!(db.open_payout(&new("m2"), |c| c).await.unwrap().is_none());
    assert!(db.owners_due_payout("m2", far).await.unwrap().is_empty());
    assert_eq!(
        db.payouts_for(&owner, 10).await.unwrap(),
        std::slice::from_ref(&p)
    );

    // A refused transfer waits for its next attempt.
    let next = far + TimeDelta::hours(1);
    assert_eq!(
        db.payout_failed(&p.id, "stripe: balance_insufficient", next, far)
            .await
            .unwrap(),
        GuardedWrite::Written
    );
    assert!(db.payouts_to_transfer(far).await.unwrap().is_empty());
    let due = db.payouts_to_transfer(next).await.unwrap();
    assert_eq!((due.len(), due[0].attempts), (1, 1));
    assert_eq!(db.pending_payouts().await.unwrap().len(), 1);
    assert_eq!(
        db.payout_paid(&p.id, "tr_1", next).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.payout_paid(&p.id, "tr_2", next).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(
        db.payout_failed(&p.id, "late", next, next).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    let p = db.payout(&p.id).await.unwrap().unwrap();
    assert_eq!(
        (
            p.status,
            p.stripe_transfer_id.as_deref(),
            p.last_error,
            p.paid_at
        ),
        (PayoutStatus::Paid, Some("tr_1"), None, Some(next))
    );
    assert!(db.payouts_to_transfer(next).await.unwrap().is_empty());
    assert!(db.pending_payouts().await.unwrap().is_empty());
}
