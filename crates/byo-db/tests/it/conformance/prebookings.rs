//! Pre-bookings' Store rules (E3; docs/prebookings.md) on both backends: the pin taken at
//! booking (dedicated first, never a host another open booking holds for an overlapping
//! window), the unpaid cap, the one write of paid_at, cancel/close/reopen guarded, the
//! launcher's and expire-prebook's reads, and the launcher's write.

use byo_db::prebookings::{ClosedReason, NewPrebooking};
use byo_db::testing::{TestDb, pickable_host};
use byo_db::vms::NewVm;
use byo_db::{DbError, GuardedWrite};
use chrono::{DateTime, Duration, Utc};

use super::{now, user};

fn window<'a>(who: &'a str, from: DateTime<Utc>, hours: i64) -> NewPrebooking<'a> {
    NewPrebooking {
        user_sub: who,
        gpu_type: "spark-1",
        start_date: from,
        end_date: from + Duration::hours(hours),
    }
}

pub(super) async fn e3_2_a_booking_pins_a_free_host_and_never_one_held_for_its_window(db: TestDb) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let a = user(&db, "a@example.com").await;
    let b = user(&db, "b@example.com").await;
    let h1 = pickable_host(&db, &owner, "pin-1", t).await;
    let h2 = pickable_host(&db, &owner, "pin-2", t).await;
    let day = t + Duration::days(1);

    let first = db.book_prebooking(window(&a, day, 4), 5, t).await.unwrap();
    let second = db
        .book_prebooking(window(&b, day + Duration::hours(2), 4), 5, t)
        .await
        .unwrap();
    let (p1, p2) = (
        first.host_id.clone().unwrap(),
        second.host_id.clone().unwrap(),
    );
    assert_ne!(p1, p2, "overlapping windows pin different hosts");
    assert!([&h1, &h2].contains(&&p1) && [&h1, &h2].contains(&&p2));
    // Both hosts held for that time: a third overlapping window finds none, and writes nothing.
    let none = db
        .book_prebooking(window(&b, day + Duration::hours(2), 1), 5, t)
        .await;
    assert!(
        matches!(&none, Err(DbError::Refused(r)) if r == "no_host_for_window"),
        "{none:?}"
    );
    assert_eq!(db.prebookings_of(&b).await.unwrap().len(), 1);
    // A window that touches the end of the first (end is exclusive) takes that host again.
    let after = db
        .book_prebooking(window(&b, day + Duration::hours(6), 2), 5, t)
        .await
        .unwrap();
    assert!(after.host_id.is_some());
    // Retired and unprepared hosts are not pinned; a host dedicated to the booker comes first.
    let mine = pickable_host(&db, &owner, "pin-mine", t).await;
    db.set_host_dedicated(&mine, Some(&a)).await.unwrap();
    let dedicated = db
        .book_prebooking(window(&a, t + Duration::days(10), 1), 5, t)
        .await
        .unwrap();
    assert_eq!(dedicated.host_id.as_deref(), Some(mine.as_str()));
    // Someone else's dedicated box is never pinned for b.
    let others = db
        .book_prebooking(window(&b, t + Duration::days(10), 1), 5, t)
        .await
        .unwrap();
    assert_ne!(others.host_id.as_deref(), Some(mine.as_str()));

    // Moving a pin onto a host an overlapping open booking holds is refused by the schema.
    let moved = db.reassign_prebooking(&second.id, &p1).await;
    assert!(
        moved
            .as_ref()
            .is_err_and(|e| e.is_constraint("prebookings_host_not_double_booked")),
        "{moved:?}"
    );
    assert_eq!(
        db.prebooking(&second.id).await.unwrap().unwrap().host_id,
        Some(p2.clone())
    );
    // Onto a free host it moves, and the old pin's note goes with it.
    let spare = pickable_host(&db, &owner, "pin-spare", t).await;
    db.record_prebooking_note(&second.id, Some("host unreachable"), t)
        .await
        .unwrap();
    assert_eq!(
        db.reassign_prebooking(&second.id, &spare).await.unwrap(),
        GuardedWrite::Written
    );
    let row = db.prebooking(&second.id).await.unwrap().unwrap();
    assert_eq!(row.host_id.as_deref(), Some(spare.as_str()));
    assert_eq!((row.launch_note, row.launch_note_at), (None, None));
}

pub(super) async fn e3_the_unpaid_cap_counts_open_unpaid_bookings_only(db: TestDb) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let a = user(&db, "a@example.com").await;
    for i in 0..4 {
        pickable_host(&db, &owner, &format!("cap-{i}"), t).await;
    }
    let day = t + Duration::days(1);
    let one = db.book_prebooking(window(&a, day, 1), 2, t).await.unwrap();
    let two = db.book_prebooking(window(&a, day, 1), 2, t).await.unwrap();
    let capped = db.book_prebooking(window(&a, day, 1), 2, t).await;
    assert!(
        matches!(&capped, Err(DbError::Refused(r)) if r == "prebookings_unpaid_cap"),
        "{capped:?}"
    );
    assert_eq!(db.prebookings_of(&a).await.unwrap().len(), 2);
    // A paid one no longer counts, nor a cancelled one.
    assert_eq!(
        db.mark_prebooking_paid(&one.id, t).await.unwrap(),
        GuardedWrite::Written
    );
    let three = db.book_prebooking(window(&a, day, 1), 2, t).await.unwrap();
    assert_eq!(
        db.cancel_prebooking(&three.id, &a, t).await.unwrap(),
        GuardedWrite::Written
    );
    db.book_prebooking(window(&a, day, 1), 2, t).await.unwrap();
    // Nor one whose window has ended by now (expire-prebook not run yet).
    let later = t + Duration::days(2);
    db.book_prebooking(window(&a, later, 1), 3, later)
        .await
        .unwrap();
    let _ = two;
}

pub(super) async fn e3_1_paid_at_is_written_once_and_cancel_is_only_the_bookers_unpaid(db: TestDb) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let a = user(&db, "a@example.com").await;
    let b = user(&db, "b@example.com").await;
    pickable_host(&db, &owner, "paid-1", t).await;
    let booking = db
        .book_prebooking(window(&a, t + Duration::days(1), 2), 5, t)
        .await
        .unwrap();
    assert_eq!(booking.paid_at, None);
    // Someone else's booking is not theirs to cancel.
    assert_eq!(
        db.cancel_prebooking(&booking.id, &b, t).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(
        db.prebooking(&booking.id).await.unwrap().unwrap().closed_at,
        None
    );
    assert_eq!(
        db.mark_prebooking_paid(&booking.id, t).await.unwrap(),
        GuardedWrite::Written
    );
    // A replayed payment keeps the first time.
    assert_eq!(
        db.mark_prebooking_paid(&booking.id, t + Duration::hours(1))
            .await
            .unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(
        db.prebooking(&booking.id).await.unwrap().unwrap().paid_at,
        Some(t)
    );
    // What its checkout and its payment webhook read.
    let bill = db
        .prebooking_for_billing(&booking.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            bill.id.as_str(),
            bill.user_sub.as_str(),
            bill.gpu_type.as_str()
        ),
        (booking.id.as_str(), a.as_str(), "spark-1")
    );
    assert_eq!(
        (bill.start_date, bill.end_date, bill.paid_at, bill.closed_at),
        (booking.start_date, booking.end_date, Some(t), None)
    );
    assert!(
        db.prebooking_for_billing("no-such-booking")
            .await
            .unwrap()
            .is_none()
    );
    // A paid booking is not cancelled.
    assert_eq!(
        db.cancel_prebooking(&booking.id, &a, t).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    let row = db.prebooking(&booking.id).await.unwrap().unwrap();
    assert_eq!((row.closed_at, row.closed_reason), (None, None));

    let unpaid = db
        .book_prebooking(window(&a, t + Duration::days(3), 2), 5, t)
        .await
        .unwrap();
    assert_eq!(
        db.cancel_prebooking(&unpaid.id, &a, t).await.unwrap(),
        GuardedWrite::Written
    );
    let row = db.prebooking(&unpaid.id).await.unwrap().unwrap();
    assert_eq!(
        (row.closed_at, row.closed_reason.as_deref()),
        (Some(t), Some("cancelled"))
    );
    assert_eq!(
        db.cancel_prebooking(&unpaid.id, &a, t).await.unwrap(),
        GuardedWrite::AlreadySet
    );
}

pub(super) async fn e3_4_due_ended_close_reopen_and_the_launchers_write(db: TestDb) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let a = user(&db, "a@example.com").await;
    let h = pickable_host(&db, &owner, "due-1", t).await;
    let booking = db
        .book_prebooking(window(&a, t + Duration::hours(1), 2), 5, t)
        .await
        .unwrap();
    let inside = t + Duration::minutes(90);
    // Unpaid: not due, even inside its window.
    assert!(db.prebookings_due(inside).await.unwrap().is_empty());
    db.mark_prebooking_paid(&booking.id, t).await.unwrap();
    assert!(
        db.prebookings_due(t).await.unwrap().is_empty(),
        "before its start"
    );
    let due: Vec<_> = db
        .prebookings_due(inside)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(due, std::slice::from_ref(&booking.id));
    let at_end = t + Duration::hours(3);
    assert!(
        db.prebookings_due(at_end).await.unwrap().is_empty(),
        "end is exclusive"
    );
    assert!(db.prebookings_ended(inside).await.unwrap().is_empty());
    let ended: Vec<_> = db
        .prebookings_ended(at_end)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(ended, std::slice::from_ref(&booking.id));

    // The launcher's write: the instance and launched_vm_id together, the note cleared.
    db.record_prebooking_note(&booking.id, Some(&"x".repeat(600)), inside)
        .await
        .unwrap();
    let noted = db.prebooking(&booking.id).await.unwrap().unwrap();
    assert_eq!(
        noted.launch_note.as_ref().map(|n| n.chars().count()),
        Some(500)
    );
    assert_eq!(noted.launch_note_at, Some(inside));
    let new = |name: &'static str| NewVm {
        user_sub: &a,
        host_id: Some(&h),
        name,
        gpu_type: "spark-1",
        ssh_hostname: None,
    };
    let vm = db
        .create_prebooking_vm(&booking.id, new("booked-1"), inside)
        .await
        .unwrap();
    let row = db.prebooking(&booking.id).await.unwrap().unwrap();
    assert_eq!(row.launched_vm_id.as_deref(), Some(vm.id.as_str()));
    assert_eq!((row.launch_note, row.launch_note_at), (None, None));
    // A second live instance for the booking is refused, and nothing is written: named by
    // the rule it breaks, on either backend (SQLite names the columns, PostgreSQL the index)
    // — on another, free host the booking's own rule; on the host holding the first, the host's.
    let elsewhere = pickable_host(&db, &owner, "due-2", t).await;
    let twice = db
        .create_prebooking_vm(
            &booking.id,
            NewVm {
                host_id: Some(&elsewhere),
                ..new("booked-2")
            },
            inside,
        )
        .await;
    assert!(
        matches!(&twice, Err(DbError::Conflict(n)) if n == "vms_one_live_per_prebooking"),
        "{twice:?}"
    );
    let later = db
        .book_prebooking(window(&a, t + Duration::hours(10), 1), 5, t)
        .await
        .unwrap();
    let on_held_host = db
        .create_prebooking_vm(&later.id, new("walk-in"), inside)
        .await;
    assert!(
        matches!(&on_held_host, Err(DbError::Conflict(n)) if n == "vms_one_live_per_host"),
        "{on_held_host:?}"
    );
    assert_eq!(
        db.prebooking(&booking.id)
            .await
            .unwrap()
            .unwrap()
            .launched_vm_id
            .as_deref(),
        Some(vm.id.as_str())
    );
    // A note of None clears it.
    db.record_prebooking_note(&booking.id, Some("later"), inside)
        .await
        .unwrap();
    db.record_prebooking_note(&booking.id, None, inside)
        .await
        .unwrap();
    let row = db.prebooking(&booking.id).await.unwrap().unwrap();
    assert_eq!((row.launch_note, row.launch_note_at), (None, None));

    // Closed at its end: no longer ended-and-open, closed once, and the launcher refused.
    assert_eq!(
        db.close_prebooking(&booking.id, ClosedReason::Ended, at_end)
            .await
            .unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.close_prebooking(&booking.id, ClosedReason::Cancelled, at_end)
            .await
            .unwrap(),
        GuardedWrite::AlreadySet
    );
    let row = db.prebooking(&booking.id).await.unwrap().unwrap();
    assert_eq!(
        (row.closed_at, row.closed_reason.as_deref()),
        (Some(at_end), Some("ended"))
    );
    assert!(db.prebookings_ended(at_end).await.unwrap().is_empty());
    db.confirm_vm_deleted(&vm.id, at_end).await.unwrap();
    let closed = db
        .create_prebooking_vm(&booking.id, new("booked-3"), at_end)
        .await;
    assert!(
        matches!(&closed, Err(DbError::Refused(r)) if r == "prebooking_closed"),
        "{closed:?}"
    );
    // An operator opens it again (a forced launch); an open one is not reopened.
    assert_eq!(
        db.reopen_prebooking(&booking.id).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.reopen_prebooking(&booking.id).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    let row = db.prebooking(&booking.id).await.unwrap().unwrap();
    assert_eq!((row.closed_at, row.closed_reason), (None, None));

    // The operators' overview: open first, with the host's slug and the booker's email.
    let other = db
        .book_prebooking(window(&a, t + Duration::days(5), 1), 5, t)
        .await
        .unwrap();
    db.cancel_prebooking(&other.id, &a, t).await.unwrap();
    let all = db.prebookings_overview(10).await.unwrap();
    let ids: Vec<_> = all.iter().map(|r| r.booking.id.as_str()).collect();
    assert_eq!(
        ids,
        [booking.id.as_str(), later.id.as_str(), other.id.as_str()]
    );
    assert_eq!(all[0].host_slug.as_deref(), Some("due-1"));
    assert_eq!(all[0].booker_email, "a@example.com");
    assert_eq!(db.prebookings_overview(1).await.unwrap().len(), 1);
}
