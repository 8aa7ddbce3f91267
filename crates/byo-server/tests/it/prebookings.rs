//! Pre-bookings (E3) on both backends, named after the design's numbered rules: booking
//! pins a host, the launcher (`launch-prebookings`) gates on paid_at alone (E3.1), keeps to
//! the pinned host (E3.2), self-heals at step 67 (E3.3), expire-prebook closes and tears
//! down through G (E3.4), the key is the booker's own (E3.5), and an operator's launch by
//! booking id with force (E0 caller 5). The jobs are driven through `JobDriver::tick`; the
//! hosts are the fake agents. Every refusal reads the rows back to show nothing changed.

use crate::with_world;

#[allow(dead_code, unused_imports)]
use crate::instances::world;

use byo_db::prebookings::{ClosedReason, PrebookingRow};
use byo_server::app::billing::{BillingGate, Charge};
use byo_server::app::jobs::{JobDriver, Tick, registry};
use byo_server::error::AppResult;
use world::*;

async fn world(backend: byo_db::Backend) -> Option<World> {
    world::world(backend).await
}

/// The world's clock starts at 2026-11-29T12:00Z; windows are whole hours from there.
fn at(hours: i64) -> DateTime<Utc> {
    "2026-11-29T12:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::hours(hours)
}

async fn book(user: &User, from: i64, to: i64) -> Reply {
    user.post(
        "/api/prebookings",
        json!({"gpu_type": "spark-1", "start_date": at(from), "end_date": at(to)}),
    )
    .await
}

/// A booking that must be made: its id.
async fn booked(user: &User, from: i64, to: i64) -> String {
    let r = book(user, from, to).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    r.json()["id"].as_str().unwrap().to_owned()
}

async fn row(w: &World, id: &str) -> PrebookingRow {
    w.db().prebooking(id).await.unwrap().unwrap()
}

async fn count(w: &World) -> usize {
    w.db().prebookings_overview(1000).await.unwrap().len()
}

/// One run of job `name` through the driver, which must succeed: its summary.
async fn tick(w: &World, name: &str) -> String {
    // The runs before, by id: on the tests' still clock two runs start at the same
    // instant, so "the newest" is this run's row, told apart by its id.
    let before: Vec<String> = w
        .db()
        .job_runs(name, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    let d = JobDriver::new(w.app.state.clone(), registry());
    assert_eq!(
        d.tick(name).await.unwrap(),
        Some(Tick::Ran { ok: true }),
        "{name}"
    );
    let runs = w.db().job_runs(name, 1000).await.unwrap();
    let run = runs
        .iter()
        .find(|r| !before.contains(&r.id))
        .expect("the tick recorded its run");
    assert_eq!(run.outcome, "ok", "{:?}", run.error);
    run.summary.clone().unwrap_or_default()
}

/// One launcher tick: its summary (`due N, launched N, live N, waiting N`).
async fn launcher(w: &World) -> String {
    tick(w, "launch-prebookings").await
}

/// One expire-prebook tick: its summary (`closed N, delete unconfirmed N, deferred N`).
async fn expire(w: &World) -> String {
    tick(w, "expire-prebook").await
}

async fn pay(admin: &User, id: &str) {
    let r = admin
        .post_empty(&format!("/api/admin/prebookings/{id}/paid"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

/// The booking as its booker's list shows it.
async fn mine(user: &User, id: &str) -> Value {
    let list = user.get("/api/prebookings").await.json();
    list.as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("{id} not in {list}"))
}

/// Move the clock to `hours` from the start. The test's sessions (an hour long) are made
/// to outlast the move.
async fn to(w: &World, hours: i64) {
    w.db()
        .execute_unchecked(&format!(
            "update sessions set expires_at = '{}'",
            fmt(at(24 * 1000))
        ))
        .await
        .unwrap();
    let now = w.clock.now();
    w.clock.advance(at(hours) - now);
}

async fn launch(admin: &User, id: &str, force: bool) -> Reply {
    admin
        .post(
            &format!("/api/admin/prebookings/{id}/launch"),
            json!({"force": force}),
        )
        .await
}

/// A booking: the host is chosen and pinned when it is made, the window is checked, the
/// answer says how to pay, and no host is pinned twice for overlapping windows.
async fn e3_booking_pins_a_host_and_says_how_to_pay(w: World) {
    let a = w.host("spark-1", Spec::default()).await;
    let id = booked(&w.customer, 2, 6).await;
    let b = row(&w, &id).await;
    assert_eq!(b.host_id.as_deref(), Some(a.id.as_str()), "pinned now");
    assert_eq!(
        (b.paid_at, b.closed_at, b.launched_vm_id),
        (None, None, None)
    );
    let view = mine(&w.customer, &id).await;
    assert_eq!(view["state"], "unpaid");
    assert!(
        view["how_to_pay"].as_str().unwrap().contains("off-band"),
        "{view}"
    );
    assert!(
        view.get("host_slug").is_none(),
        "the booker is not told the box"
    );
    assert_eq!(w.audits("prebooking.booked").await.len(), 1);

    // The only host is pinned for an overlapping window: nothing is booked.
    let r = book(&w.other, 5, 8).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(r.json()["error"], "no_host_for_window");
    assert_eq!(count(&w).await, 1);
    // Back to back is not an overlap: [2, 6) then [6, 8).
    let next = booked(&w.other, 6, 8).await;
    assert_eq!(row(&w, &next).await.host_id.as_deref(), Some(a.id.as_str()));
    // A second host takes the overlapping window.
    let b2 = w.host("spark-2", Spec::default()).await;
    let third = booked(&w.other, 3, 5).await;
    assert_eq!(
        row(&w, &third).await.host_id.as_deref(),
        Some(b2.id.as_str())
    );
    // Hosts that cannot be placed on are never pinned.
    w.host(
        "spark-3",
        Spec {
            active: false,
            ..Spec::default()
        },
    )
    .await;
    w.host(
        "spark-4",
        Spec {
            retired: true,
            ..Spec::default()
        },
    )
    .await;
    let r = book(&w.other, 4, 5).await;
    assert_eq!(r.json()["error"], "no_host_for_window", "{}", r.text());

    // The window: in the future, whole hours, end after start, at most 31 days, within a
    // year. Each refusal writes nothing.
    let before = count(&w).await;
    for (start, end, why) in [
        (at(-1), at(3), "in the past"),
        (at(0), at(3), "starting now"),
        (at(2) + TimeDelta::minutes(30), at(4), "not on a whole hour"),
        (at(4), at(4), "empty"),
        (at(4), at(3), "backwards"),
        (at(2), at(2 + 31 * 24 + 1), "longer than 31 days"),
        (at(24 * 400), at(24 * 400 + 2), "more than a year ahead"),
    ] {
        let r = w
            .customer
            .post(
                "/api/prebookings",
                json!({"gpu_type": "spark-1", "start_date": start, "end_date": end}),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{why}: {}", r.text());
        assert_eq!(r.json()["error"], "invalid_window", "{why}");
    }
    let r = w
        .customer
        .post(
            "/api/prebookings",
            json!({"gpu_type": "Spark 1!", "start_date": at(2), "end_date": at(3)}),
        )
        .await;
    assert_eq!(r.json()["error"], "invalid_gpu_type");
    assert_eq!(count(&w).await, before);

    // At most three open unpaid bookings per account.
    w.host("spark-5", Spec::default()).await;
    booked(&w.customer, 10, 11).await;
    booked(&w.customer, 12, 13).await;
    let before = count(&w).await;
    let r = book(&w.customer, 14, 15).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(r.json()["error"], "unpaid_cap");
    assert_eq!(count(&w).await, before);
}

/// E3.2's note names why the pinned host is passed over: here, a host whose heartbeat is
/// older than placement allows, with the time it was last heard from.
async fn e3_2_a_silent_pinned_host_is_named_as_silent_since_its_last_beat(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    pay(&admin, &id).await;
    to(&w, 2).await;
    launcher(&w).await;
    let b = row(&w, &id).await;
    assert_eq!(b.launched_vm_id, None);
    assert_eq!(
        b.launch_note.as_deref(),
        Some(
            "its pinned host has not been heard from since 2026-11-29 12:00 UTC; the booking stays open, is tried again each minute, and an operator can reassign it"
        )
    );
}

mod e3_2_a_silent_pinned_host_is_named_as_silent_since_its_last_beat {
    use super::world::{lenient_placement, world_with};
    use byo_server::config::PlacementConfig;

    /// Placement trusts a heartbeat for five minutes; the launch is two hours on.
    fn placement() -> PlacementConfig {
        PlacementConfig {
            max_heartbeat_age_secs: 300,
            ..lenient_placement()
        }
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        if let Some(w) = world_with(byo_db::Backend::Sqlite, placement()).await {
            super::e3_2_a_silent_pinned_host_is_named_as_silent_since_its_last_beat(w).await
        }
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        if let Some(w) = world_with(byo_db::Backend::Postgres, placement()).await {
            super::e3_2_a_silent_pinned_host_is_named_as_silent_since_its_last_beat(w).await
        }
    }
}

/// E3.4: an instance still being created when the window ends cannot be deleted yet; the
/// booking is left open that tick (deferred) and closed on a later one.
async fn e3_4_an_instance_still_being_created_defers_the_close(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 3).await;
    pay(&admin, &id).await;
    // A tenth of a second before the window ends, the host takes the create and says
    // nothing.
    to(&w, 3).await;
    w.clock.advance(-TimeDelta::milliseconds(100));
    w.answer_creates(Answer::Hang);
    launcher(&w).await;
    let vm_id = row(&w, &id).await.launched_vm_id.unwrap();
    assert_eq!(w.vm(&vm_id).await.status, VmStatus::Creating);
    w.clock.advance(TimeDelta::milliseconds(100));
    assert_eq!(
        expire(&w).await,
        "closed 0, delete unconfirmed 0, deferred 1"
    );
    assert_eq!(row(&w, &id).await.closed_at, None);
    assert!(w.audits("prebooking.closed").await.is_empty());
    // Past the create's deadline the delete goes ahead and the booking closes.
    w.clock.advance(TimeDelta::minutes(1));
    expire(&w).await;
    assert_eq!(row(&w, &id).await.closed_reason.as_deref(), Some("ended"));
}

/// Caller 5 at the window's opening: no force is needed once the window is open.
async fn e0_caller5_launch_at_the_opening_needs_no_force(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    pay(&admin, &id).await;
    to(&w, 2).await;
    let r = launch(&admin, &id, false).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["state"], "launched");
}

/// The window's bounds are inclusive: exactly 31 days long, or starting exactly a year
/// from now, is taken.
async fn e3_a_window_at_each_bound_is_taken(w: World) {
    w.host("spark-1", Spec::default()).await;
    let long = booked(&w.customer, 2, 2 + 31 * 24).await;
    let r = row(&w, &long).await;
    assert_eq!(r.end_date - r.start_date, TimeDelta::days(31));
    let ahead = booked(&w.customer, 365 * 24, 365 * 24 + 2).await;
    assert_eq!(
        row(&w, &ahead).await.start_date - at(0),
        TimeDelta::days(365)
    );
}

/// The schema holds the pin for every writer: a second open booking of one host for an
/// overlapping window is refused by `prebookings_host_not_double_booked`, on insert and on
/// update; a closed booking holds nothing.
async fn e3_2_a_host_is_never_pinned_twice_for_overlapping_windows(w: World) {
    let a = w.host("spark-1", Spec::default()).await;
    let id = booked(&w.customer, 2, 6).await;
    let insert = |id: &str, from: i64, to: i64| {
        format!(
            "insert into prebookings (id, user_sub, host_id, gpu_type, start_date, end_date, created_at)
             values ('{id}', '{}', '{}', 'spark-1', '{}', '{}', '{}')",
            w.other.sub,
            a.id,
            fmt(at(from)),
            fmt(at(to)),
            fmt(at(0))
        )
    };
    let e = w
        .db()
        .execute_unchecked(&insert("x1", 5, 7))
        .await
        .unwrap_err();
    assert!(e.is_constraint("prebookings_host_not_double_booked"), "{e}");
    w.db().execute_unchecked(&insert("x2", 6, 7)).await.unwrap();
    let e = w
        .db()
        .execute_unchecked(&format!(
            "update prebookings set start_date = '{}' where id = 'x2'",
            fmt(at(5))
        ))
        .await
        .unwrap_err();
    assert!(e.is_constraint("prebookings_host_not_double_booked"), "{e}");
    w.db()
        .close_prebooking(&id, ClosedReason::Ended, w.clock.now())
        .await
        .unwrap();
    w.db().execute_unchecked(&insert("x3", 2, 6)).await.unwrap();
}

/// Timestamps as both databases' text and timestamptz columns take them in SQL.
fn fmt(t: DateTime<Utc>) -> String {
    t.to_rfc3339()
}

/// A billing gate that would refuse everyone: the launcher must not ask it.
struct RefusingBilling;

impl BillingGate for RefusingBilling {
    fn may_charge<'a>(&'a self, _user_sub: &'a str) -> BoxFuture<'a, AppResult<Charge>> {
        Box::pin(async {
            Ok(Charge::Refused {
                reason: "card declined".into(),
            })
        })
    }
    fn enabled(&self) -> bool {
        true
    }
}

/// E3.1: the gate is paid_at alone. Unpaid, the window opening launches nothing; paid, it
/// launches even where a live billing check would refuse.
async fn e3_1_the_gate_is_paid_at_alone(mut w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    // Before the window: nothing, paid or not.
    launcher(&w).await;
    to(&w, 2).await;
    launcher(&w).await;
    assert!(w.agents.calls(Op::Create).is_empty(), "unpaid: no launch");
    let b = row(&w, &id).await;
    assert_eq!((b.launched_vm_id, b.launch_note), (None, None));
    assert_eq!(mine(&w.customer, &id).await["state"], "unpaid");

    pay(&admin, &id).await;
    assert_eq!(row(&w, &id).await.paid_at, Some(w.clock.now()));
    assert_eq!(w.audits("prebooking.paid").await.len(), 1);
    // Billing now says no to this customer; the launcher does not ask.
    w.app.state.billing = Arc::new(RefusingBilling);
    launcher(&w).await;
    let calls = w.agents.calls(Op::Create);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].host_id, host.id);
    let b = row(&w, &id).await;
    let vm_id = b.launched_vm_id.clone().expect("stamped");
    // The row was written, with the booking stamped, before the host was contacted.
    assert_eq!(calls[0].row.as_ref().unwrap().id, vm_id);
    let vm = w.vm(&vm_id).await;
    assert_eq!(
        (vm.status, vm.user_sub.as_str(), vm.host_id.as_deref()),
        (
            VmStatus::Running,
            w.customer.sub.as_str(),
            Some(host.id.as_str())
        )
    );
    // E3.4: the booking stays open after launching.
    assert_eq!(b.closed_at, None);
    assert_eq!(mine(&w.customer, &id).await["state"], "launched");
    assert_eq!(w.audits("prebooking.launched").await.len(), 1);
    // Its customer is told (issue #38, 3), once.
    launcher(&w).await;
    let told = w.db().notices(Some(&w.customer.sub), 10).await.unwrap();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(
        (told[0].kind.as_str(), told[0].subject.as_str()),
        ("booking.launched", "Your booking launched")
    );
    assert!(told[0].body.contains(&vm_id), "{}", told[0].body);
}

/// E3.1: a payment collected off-band is recorded by hand, once (a second time is refused);
/// with billing on too — the design keeps it beside Checkout — but then only with a reason,
/// audited (issue #40, 5). A refusal changes nothing.
async fn e3_1_an_off_band_payment_is_recorded_once_and_with_billing_on_only_with_a_reason(
    mut w: World,
) {
    w.host("spark-1", Spec::default()).await;
    let id = booked(&w.customer, 2, 6).await;
    let admin = w.app.superadmin("root@example.com").await;
    pay(&admin, &id).await;
    let paid = row(&w, &id).await.paid_at;
    w.clock.advance(TimeDelta::minutes(5));
    let r = admin
        .post_empty(&format!("/api/admin/prebookings/{id}/paid"))
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["error"], "already_paid");
    assert_eq!(row(&w, &id).await.paid_at, paid, "the first time is kept");
    // An operator is not a superadmin.
    let second = booked(&w.customer, 8, 9).await;
    let r =
        w.op.post_empty(&format!("/api/admin/prebookings/{second}/paid"))
            .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(row(&w, &second).await.paid_at, None);

    w.app.state.billing = Arc::new(RefusingBilling);
    w.app.router = byo_server::router(w.app.state.clone());
    let admin = w.app.superadmin("root2@example.com").await;
    for body in [None, Some(json!({"reason": "  "})), Some(json!({}))] {
        let r = match &body {
            None => {
                admin
                    .post_empty(&format!("/api/admin/prebookings/{second}/paid"))
                    .await
            }
            Some(b) => {
                admin
                    .post(&format!("/api/admin/prebookings/{second}/paid"), b.clone())
                    .await
            }
        };
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body:?}: {}", r.text());
        assert_eq!(r.json()["error"], "reason_required");
    }
    assert_eq!(row(&w, &second).await.paid_at, None);
    assert_eq!(w.audits("prebooking.paid").await.len(), 1);
    let r = admin
        .post(
            &format!("/api/admin/prebookings/{second}/paid"),
            json!({"reason": "paid by bank transfer, ref 4471"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(row(&w, &second).await.paid_at.is_some());
    let audits = w.audits("prebooking.paid").await;
    assert_eq!(audits.len(), 2);
    assert!(
        audits
            .iter()
            .any(|a| a.details.0["reason"] == "paid by bank transfer, ref 4471"),
        "{audits:?}"
    );
}

/// E3.2: a pinned host that is unavailable (here: occupied by someone else) leaves the
/// booking open with the reason visible, is tried again each tick, and is never re-placed
/// on a free host; once the pin is free the booking launches there.
async fn e3_2_an_unavailable_pinned_host_leaves_the_booking_open(w: World) {
    let pinned = w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    pay(&admin, &id).await;
    // Another customer's instance takes the pinned host; a second host is free.
    let key = w.add_key(&w.other).await;
    let r = w.create(&w.other, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let theirs = r.json()["instance"]["id"].as_str().unwrap().to_owned();
    let free = w.host("spark-2", Spec::default()).await;
    let creates = w.agents.calls(Op::Create).len();

    to(&w, 2).await;
    launcher(&w).await;
    assert_eq!(
        w.audits("prebooking.waiting").await.len(),
        1,
        "the first tick that waits says why"
    );
    launcher(&w).await;
    assert_eq!(
        w.agents.calls(Op::Create).len(),
        creates,
        "never re-placed on the free host"
    );
    assert!(w.pickable(&free.id).await);
    let b = row(&w, &id).await;
    assert_eq!((b.closed_at, b.launched_vm_id.as_deref()), (None, None));
    assert!(
        b.launch_note
            .as_deref()
            .unwrap()
            .contains("occupied by another instance"),
        "{:?}",
        b.launch_note
    );
    assert_eq!(b.launch_note_at, Some(w.clock.now()));
    let view = mine(&w.customer, &id).await;
    assert_eq!(view["state"], "waiting");
    assert!(
        view["launch_note"]
            .as_str()
            .unwrap()
            .contains("an operator can reassign it")
    );
    assert_eq!(
        w.audits("prebooking.waiting").await.len(),
        1,
        "one entry while the reason holds, not one per tick"
    );

    // The pin frees up: the next tick launches there.
    assert_eq!(w.delete(&w.other, &theirs).await.status, StatusCode::OK);
    launcher(&w).await;
    let calls = w.agents.calls(Op::Create);
    assert_eq!(calls.len(), creates + 1);
    assert_eq!(calls.last().unwrap().host_id, pinned.id);
    let b = row(&w, &id).await;
    assert!(b.launched_vm_id.is_some());
    assert_eq!(b.launch_note, None, "the reason goes with the launch");
}

/// E3.2: a booking without a pin is a legacy row and falls back to the pool pick.
async fn e3_2_legacy_booking_without_pin_falls_back_to_the_pool(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    w.db()
        .execute_unchecked(&format!(
            "insert into prebookings (id, user_sub, gpu_type, start_date, end_date, created_at)
             values ('legacy', '{}', 'spark-1', '{}', '{}', '{}')",
            w.customer.sub,
            fmt(at(0)),
            fmt(at(4)),
            fmt(at(-24))
        ))
        .await
        .unwrap();
    w.db().mark_prebooking_paid("legacy", at(-1)).await.unwrap();
    launcher(&w).await;
    let calls = w.agents.calls(Op::Create);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].host_id, host.id);
    let b = row(&w, "legacy").await;
    assert_eq!(b.host_id, None, "still unpinned");
    assert_eq!(
        b.launched_vm_id.as_deref(),
        Some(calls[0].row.as_ref().unwrap().id.as_str())
    );

    // No free host in the pool: open, with the reason.
    w.db()
        .execute_unchecked(&format!(
            "insert into prebookings (id, user_sub, gpu_type, start_date, end_date, created_at)
             values ('legacy2', '{}', 'spark-1', '{}', '{}', '{}')",
            w.other.sub,
            fmt(at(0)),
            fmt(at(4)),
            fmt(at(-24))
        ))
        .await
        .unwrap();
    w.db()
        .mark_prebooking_paid("legacy2", at(-1))
        .await
        .unwrap();
    w.add_key(&w.other).await;
    launcher(&w).await;
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
    let b = row(&w, "legacy2").await;
    assert!(
        b.launch_note
            .as_deref()
            .unwrap()
            .contains("no spark-1 host is free"),
        "{:?}",
        b.launch_note
    );
}

/// E3.3: step 67 reads the launched row's liveness. A live instance: nothing. Deleted by
/// its customer mid-window, or a create the host refused: the booking relaunches.
async fn e3_3_step67_relaunches_when_the_launched_vm_is_not_live(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    pay(&admin, &id).await;
    to(&w, 2).await;
    assert_eq!(launcher(&w).await, "due 1, launched 1, live 0, waiting 0");
    let first = row(&w, &id).await.launched_vm_id.unwrap();
    assert_eq!(launcher(&w).await, "due 1, launched 0, live 1, waiting 0");
    assert_eq!(w.agents.calls(Op::Create).len(), 1, "live: nothing to do");
    assert_eq!(
        row(&w, &id).await.launched_vm_id.as_deref(),
        Some(first.as_str())
    );

    // The customer deletes it mid-window: launched_vm_id still names it (soft delete).
    w.clock.advance(TimeDelta::minutes(30));
    assert_eq!(w.delete(&w.customer, &first).await.status, StatusCode::OK);
    launcher(&w).await;
    let second = row(&w, &id).await.launched_vm_id.unwrap();
    assert_ne!(second, first);
    assert_eq!(w.vm(&second).await.status, VmStatus::Running);
    assert_eq!(w.agents.calls(Op::Create).len(), 2);

    // The host refuses a relaunch: the row is failed, the booking says why and is tried
    // again next tick.
    w.clock.advance(TimeDelta::minutes(30));
    assert_eq!(w.delete(&w.customer, &second).await.status, StatusCode::OK);
    w.answer_creates(Answer::Refuse);
    assert_eq!(launcher(&w).await, "due 1, launched 0, live 0, waiting 1");
    let b = row(&w, &id).await;
    let failed = b.launched_vm_id.clone().unwrap();
    assert_eq!(w.vm(&failed).await.status, VmStatus::Failed);
    assert!(
        b.launch_note
            .as_deref()
            .unwrap()
            .contains("the host refused"),
        "{:?}",
        b.launch_note
    );
    assert_eq!(mine(&w.customer, &id).await["state"], "waiting");
    w.answer_creates(Answer::Ok);
    launcher(&w).await;
    let third = row(&w, &id).await.launched_vm_id.unwrap();
    assert_ne!(third, failed);
    assert_eq!(w.vm(&third).await.status, VmStatus::Running);
    assert_eq!(mine(&w.customer, &id).await["state"], "launched");
}

/// E3.4: the booking stays open until end_date; then expire-prebook deletes its instance
/// through G (both edges) and closes it. A delete the host does not confirm closes the
/// booking with the instance left as a stuck delete.
async fn e3_4_expire_prebook_closes_and_tears_down_through_g(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.host("spark-2", Spec::default()).await;
    w.add_key(&w.customer).await;
    w.add_key(&w.other).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    let hung = booked(&w.other, 2, 7).await;
    pay(&admin, &id).await;
    pay(&admin, &hung).await;
    to(&w, 2).await;
    launcher(&w).await;
    let vm_id = row(&w, &id).await.launched_vm_id.unwrap();
    let hung_vm = row(&w, &hung).await.launched_vm_id.unwrap();

    // Inside the window expire-prebook touches nothing.
    to(&w, 5).await;
    assert_eq!(
        expire(&w).await,
        "closed 0, delete unconfirmed 0, deferred 0"
    );
    assert_eq!(row(&w, &id).await.closed_at, None);
    assert!(w.agents.calls(Op::Delete).is_empty());

    to(&w, 6).await;
    assert_eq!(
        expire(&w).await,
        "closed 1, delete unconfirmed 0, deferred 0"
    );
    let deletes = w.agents.calls(Op::Delete);
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].name, w.vm(&vm_id).await.name);
    let vm = w.vm(&vm_id).await;
    assert_eq!(
        (vm.delete_requested_at, vm.deleted_at),
        (Some(at(6)), Some(at(6)))
    );
    let b = row(&w, &id).await;
    assert_eq!(
        (b.closed_at, b.closed_reason.as_deref()),
        (Some(at(6)), Some("ended"))
    );
    let requested = w.audits("vm.delete_requested").await;
    assert_eq!(requested[0].details["by"], "expire-prebook");
    assert_eq!(requested[0].actor_sub, None, "nobody present");
    assert_eq!(mine(&w.customer, &id).await["state"], "closed");
    // After the window nothing relaunches it.
    launcher(&w).await;
    assert_eq!(w.agents.calls(Op::Create).len(), 2);

    // The other booking's host does not confirm its delete.
    w.answer_deletes(Answer::Hang);
    to(&w, 7).await;
    assert_eq!(
        expire(&w).await,
        "closed 1, delete unconfirmed 1, deferred 0"
    );
    let vm = w.vm(&hung_vm).await;
    assert_eq!(
        (vm.delete_requested_at, vm.deleted_at),
        (Some(at(7)), None),
        "billing continues and the host stays held until it confirms"
    );
    assert_eq!(row(&w, &hung).await.closed_reason.as_deref(), Some("ended"));
    let stuck =
        w.op.get("/api/admin/stuck-deletes?older_than_minutes=0")
            .await
            .json();
    assert_eq!(stuck[0]["vm_id"], hung_vm.as_str(), "visible as stuck");
    let closed = w.audits("prebooking.closed").await;
    assert_eq!(closed.len(), 2);
    let confirmed: Vec<_> = closed
        .iter()
        .map(|a| {
            (
                a.details["vm_id"].clone(),
                a.details["delete_confirmed"].clone(),
            )
        })
        .collect();
    assert!(
        confirmed.contains(&(json!(vm_id), json!(true))),
        "{confirmed:?}"
    );
    assert!(
        confirmed.contains(&(json!(hung_vm), json!(false))),
        "{confirmed:?}"
    );
    // Expiring again changes nothing.
    expire(&w).await;
    assert_eq!(w.audits("prebooking.closed").await.len(), 2);
}

/// E3.5: the key is the booker's own, resolved from ssh_keys by user_sub; a booker with no
/// key leaves the booking open with the reason visible.
async fn e3_5_the_key_is_the_bookers_own_and_no_key_leaves_it_open(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.add_key(&w.other).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    pay(&admin, &id).await;
    to(&w, 2).await;
    launcher(&w).await;
    assert!(w.agents.calls(Op::Create).is_empty());
    let b = row(&w, &id).await;
    assert!(
        b.launch_note.as_deref().unwrap().contains("no SSH key"),
        "{:?}",
        b.launch_note
    );
    assert_eq!(b.launched_vm_id, None);
    let view = mine(&w.customer, &id).await;
    assert_eq!(view["state"], "waiting");

    w.add_key(&w.customer).await;
    w.clock.advance(TimeDelta::minutes(1));
    let newest = w.add_key(&w.customer).await;
    launcher(&w).await;
    let calls = w.agents.calls(Op::Create);
    assert_eq!(calls.len(), 1);
    let keys = w.db().ssh_keys_of(&w.customer.sub).await.unwrap();
    let sent = &calls[0].create.as_ref().unwrap().ssh_public_key;
    let newest = keys.iter().find(|k| k.id == newest).unwrap();
    assert_eq!(sent, &newest.public_key, "the booker's newest key");
    for k in w.db().ssh_keys_of(&w.other.sub).await.unwrap() {
        assert_ne!(sent, &k.public_key);
    }
}

/// E0 caller 5: a superadmin launches a booking by id, whatever the tick. Without force it
/// refuses a closed booking, one outside its window and one already live; force starts one
/// early and revives one torn down inside its own window; nothing launches after the window.
async fn e0_caller5_operator_launch_with_force(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    pay(&admin, &id).await;

    // An operator is not a superadmin.
    assert_eq!(launch(&w.op, &id, true).await.status, StatusCode::FORBIDDEN);
    let r = launch(&admin, &id, false).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(r.json()["error"], "outside_window");
    assert!(w.agents.calls(Op::Create).is_empty());
    assert_eq!(row(&w, &id).await.launched_vm_id, None);
    assert_eq!(
        admin
            .post("/api/admin/prebookings/nope/launch", json!({}))
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // Force: early.
    let r = launch(&admin, &id, true).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["state"], "launched");
    let first = row(&w, &id).await.launched_vm_id.unwrap();
    // Live: refused, with force too; nothing changes.
    for force in [false, true] {
        let r = launch(&admin, &id, force).await;
        assert_eq!(r.json()["error"], "already_live", "{}", r.text());
    }
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
    assert_eq!(
        row(&w, &id).await.launched_vm_id.as_deref(),
        Some(first.as_str())
    );

    // Torn down inside its own window: its instance deleted and the booking closed.
    to(&w, 3).await;
    assert_eq!(w.delete(&w.customer, &first).await.status, StatusCode::OK);
    w.db()
        .close_prebooking(&id, ClosedReason::Ended, w.clock.now())
        .await
        .unwrap();
    let r = launch(&admin, &id, false).await;
    assert_eq!(r.json()["error"], "booking_closed", "{}", r.text());
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
    assert!(row(&w, &id).await.closed_at.is_some());
    // The launcher does not revive it either.
    launcher(&w).await;
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
    // Closed, its host was booked by someone else for an overlapping window: force does
    // not revive it over that booking.
    let theirs = booked(&w.other, 4, 5).await;
    let r = launch(&admin, &id, true).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(r.json()["error"], "host_booked");
    assert!(row(&w, &id).await.closed_at.is_some());
    assert_eq!(w.audits("prebooking.revived").await.len(), 0);
    let r = w
        .other
        .post_empty(&format!("/api/prebookings/{theirs}/cancel"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = launch(&admin, &id, true).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let b = row(&w, &id).await;
    assert_eq!((b.closed_at, b.closed_reason), (None, None), "revived");
    assert_ne!(b.launched_vm_id.as_deref(), Some(first.as_str()));
    assert_eq!(w.audits("prebooking.revived").await.len(), 1);
    assert_eq!(w.audits("prebooking.operator_launch").await.len(), 2);

    // After the window: refused, with force too.
    to(&w, 6).await;
    expire(&w).await;
    let r = launch(&admin, &id, true).await;
    assert_eq!(r.json()["error"], "window_ended", "{}", r.text());
    assert_eq!(w.agents.calls(Op::Create).len(), 2);
}

/// The booker cancels an open unpaid booking; not anyone else's, not a paid one, not a
/// closed one — each refusal changes nothing.
async fn e3_the_booker_cancels_an_unpaid_booking(w: World) {
    w.host("spark-1", Spec::default()).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 4).await;
    let paid = booked(&w.customer, 5, 6).await;
    pay(&admin, &paid).await;

    let r = w
        .other
        .post_empty(&format!("/api/prebookings/{id}/cancel"))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(row(&w, &id).await.closed_at, None);
    let r = w
        .customer
        .post_empty(&format!("/api/prebookings/{paid}/cancel"))
        .await;
    assert_eq!(r.json()["error"], "booking_paid");
    assert_eq!(row(&w, &paid).await.closed_at, None);

    let r = w
        .customer
        .post_empty(&format!("/api/prebookings/{id}/cancel"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["state"], "closed");
    let b = row(&w, &id).await;
    assert_eq!(
        (b.closed_at, b.closed_reason.as_deref()),
        (Some(w.clock.now()), Some("cancelled"))
    );
    w.clock.advance(TimeDelta::minutes(1));
    let r = w
        .customer
        .post_empty(&format!("/api/prebookings/{id}/cancel"))
        .await;
    assert_eq!(r.json()["error"], "booking_closed");
    assert_eq!(row(&w, &id).await.closed_at, b.closed_at);
    // The window it held is free again.
    booked(&w.other, 2, 4).await;
    // A closed booking cannot be paid.
    let r = admin
        .post_empty(&format!("/api/admin/prebookings/{id}/paid"))
        .await;
    assert_eq!(r.json()["error"], "booking_closed");
    assert_eq!(row(&w, &id).await.paid_at, None);
}

/// E3.2: an operator reassigns an open booking to another host of its type that no open
/// booking holds for an overlapping window; every other target is refused, unchanged.
async fn e3_2_an_operator_reassigns_the_pin(w: World) {
    let a = w.host("spark-1", Spec::default()).await;
    let id = booked(&w.customer, 2, 6).await;
    let b = w.host("spark-2", Spec::default()).await;
    let other_gpu = w
        .host(
            "spark-3",
            Spec {
                gpu_type: "spark-2x",
                ..Spec::default()
            },
        )
        .await;
    let retired = w
        .host(
            "spark-4",
            Spec {
                retired: true,
                ..Spec::default()
            },
        )
        .await;
    let op = &w.op;
    let reassign = |host: &str| {
        let path = format!("/api/admin/prebookings/{id}/reassign");
        let body = json!({"host_id": host});
        async move { op.post(&path, body).await }
    };
    // Taken out of service after it was placed: its placement is still `shared`.
    let inactive = w.host("spark-5", Spec::default()).await;
    w.db()
        .execute_unchecked(&format!(
            "update hosts set active = false where id = '{}'",
            inactive.id
        ))
        .await
        .unwrap();
    let theirs_alone = w
        .host(
            "spark-6",
            Spec {
                dedicated_to: Some(w.op.sub.clone()),
                ..Spec::default()
            },
        )
        .await;
    for (host, error) in [
        (other_gpu.id.as_str(), "wrong_gpu_type"),
        (retired.id.as_str(), "host_not_placeable"),
        (inactive.id.as_str(), "host_not_placeable"),
        (theirs_alone.id.as_str(), "host_not_placeable"),
        ("no-such-host", "unknown_host"),
    ] {
        let r = reassign(host).await;
        assert_eq!(r.json()["error"], error, "{}", r.text());
        assert_eq!(row(&w, &id).await.host_id.as_deref(), Some(a.id.as_str()));
    }
    // spark-2 is held by another open booking for an overlapping window.
    let theirs = booked(&w.other, 5, 8).await;
    assert_eq!(
        row(&w, &theirs).await.host_id.as_deref(),
        Some(b.id.as_str())
    );
    let r = reassign(&b.id).await;
    assert_eq!(r.json()["error"], "host_booked", "{}", r.text());
    assert_eq!(row(&w, &id).await.host_id.as_deref(), Some(a.id.as_str()));
    assert_eq!(
        w.customer
            .post(
                &format!("/api/admin/prebookings/{id}/reassign"),
                json!({"host_id": a.id})
            )
            .await
            .status,
        StatusCode::FORBIDDEN
    );
    // Free it, and the pin moves.
    let admin = w.app.superadmin("root@example.com").await;
    let r = w
        .other
        .post_empty(&format!("/api/prebookings/{theirs}/cancel"))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let r = reassign(&b.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["host_slug"], "spark-2");
    assert_eq!(row(&w, &id).await.host_id.as_deref(), Some(b.id.as_str()));
    assert_eq!(w.audits("prebooking.reassigned").await.len(), 1);

    // A live booking is not moved from under its instance.
    w.add_key(&w.customer).await;
    pay(&admin, &id).await;
    to(&w, 2).await;
    launcher(&w).await;
    assert!(row(&w, &id).await.launched_vm_id.is_some());
    let r = reassign(&a.id).await;
    assert_eq!(r.json()["error"], "already_live", "{}", r.text());
    assert_eq!(row(&w, &id).await.host_id.as_deref(), Some(b.id.as_str()));
}

/// `vms_one_live_per_prebooking`: a booking holds at most one live instance, for every
/// writer.
async fn e3_a_booking_holds_one_live_instance(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.host("spark-2", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    pay(&admin, &id).await;
    to(&w, 2).await;
    launcher(&w).await;
    let free = w
        .db()
        .pick_hosts_for_gpu(byo_db::vms::HostPick::new(
            "spark-1",
            &w.customer.sub,
            at(-100),
            w.clock.now(),
        ))
        .await
        .unwrap();
    assert_eq!(free.len(), 1);
    let e = w
        .db()
        .create_prebooking_vm(
            &id,
            byo_db::vms::NewVm {
                user_sub: &w.customer.sub,
                host_id: Some(&free[0].id),
                name: "vm-second",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            w.clock.now(),
        )
        .await
        .unwrap_err();
    assert!(e.is_constraint("vms_one_live_per_prebooking"), "{e}");
    assert!(w.pickable(&free[0].id).await, "nothing written");
}

/// The pages: the customer's `/prebookings` (the form, each booking's state in words, the
/// cancel of an unpaid one) and `/admin/prebookings` (recording payment, launching,
/// reassigning), both linked from the nav; a refusal is shown in place, nothing changed.
async fn e3_the_prebooking_pages(w: World) {
    w.host("spark-1", Spec::default()).await;
    let admin = w.app.superadmin("root@example.com").await;
    let html = w.customer.page("/prebookings").await;
    assert!(
        html.contains(r#"href="/prebookings""#),
        "linked from the nav"
    );
    assert!(html.contains(r#"id="no-prebookings""#));
    assert!(html.contains(r#"id="needs-key""#), "told to add a key");
    assert!(html.contains(r#"form id="book""#));

    // A refused window shows in place, with the form as sent; nothing is booked.
    let r = w
        .customer
        .post_form(
            "/prebookings",
            &[
                ("gpu_type", "spark-1"),
                ("start", "2026-11-29T10:00"),
                ("end", "2026-11-29T16:00"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.text().contains("a booking starts in the future"),
        "{}",
        r.text()
    );
    assert!(r.text().contains(r#"value="2026-11-29T16:00""#));
    assert_eq!(count(&w).await, 0);
    let r = w
        .customer
        .post_form(
            "/prebookings",
            &[
                ("gpu_type", "spark-1"),
                ("start", "tomorrow"),
                ("end", "2026-11-29T16:00"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(count(&w).await, 0);

    let r = w
        .customer
        .post_form(
            "/prebookings",
            &[
                ("gpu_type", "spark-1"),
                ("start", "2026-11-29T14:00"),
                ("end", "2026-11-29T18:00"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let id = w.db().prebookings_of(&w.customer.sub).await.unwrap()[0]
        .id
        .clone();
    let b = row(&w, &id).await;
    assert_eq!((b.start_date, b.end_date), (at(2), at(6)));
    // Issue #42, 5: back to the page, which says what happened and marks the row, with no
    // jump down to it.
    let back = r.headers[axum::http::header::LOCATION]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(back, format!("/prebookings?done=booked&id={id}"));
    let said = w.customer.page(&back).await;
    assert!(
        said.contains("Your spark-1 booking is made: it launches by itself when its window opens."),
        "{said}"
    );
    assert!(
        said.contains(&format!(r#"<tr id="prebooking-{id}" class="done">"#)),
        "{said}"
    );
    let html = w.customer.page("/prebookings").await;
    assert!(!html.contains(r#"class="done""#), "{html}");
    let line = row_html(&html, &id);
    assert!(line.contains("unpaid"), "{line}");
    assert!(line.contains("payment is collected off-band"), "{line}");
    assert!(line.contains(&format!(r#"action="/prebookings/{id}/cancel""#)));

    // Operators: the booking with its host and booker; superadmins record payment.
    let html = w.op.page("/admin/prebookings").await;
    assert!(
        html.contains(r#"href="/admin/prebookings""#),
        "linked from the nav"
    );
    assert!(html.contains("Billing is off"));
    let line = row_html(&html, &id);
    assert!(
        line.contains("customer@example.com") && line.contains("spark-1"),
        "{line}"
    );
    assert!(
        !line.contains("Record payment"),
        "an operator is not a superadmin"
    );
    assert!(line.contains("Reassign"));
    let html = admin.page("/admin/prebookings").await;
    assert!(row_html(&html, &id).contains("Record payment"));
    let r = admin
        .post_form(&format!("/admin/prebookings/{id}/paid"), &[])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    assert!(row(&w, &id).await.paid_at.is_some());
    let line = row_html(&w.customer.page("/prebookings").await, &id);
    assert!(
        line.contains("paid; launches when its window opens"),
        "{line}"
    );
    assert!(
        !line.contains("/cancel"),
        "a paid booking is not cancelled here"
    );

    // Launch now without force: refused in place, nothing launched.
    let r = admin
        .post_form(&format!("/admin/prebookings/{id}/launch"), &[])
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.text().contains("window has not opened"), "{}", r.text());
    assert_eq!(row(&w, &id).await.launched_vm_id, None);

    // The window opens with no key: waiting, with the reason.
    to(&w, 2).await;
    launcher(&w).await;
    let line = row_html(&w.customer.page("/prebookings").await, &id);
    assert!(line.contains("waiting: the booker"), "{line}");
    assert!(line.contains("no SSH key"), "{line}");
    w.add_key(&w.customer).await;
    let r = admin
        .post_form(
            &format!("/admin/prebookings/{id}/launch"),
            &[("force", "true")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let vm = row(&w, &id).await.launched_vm_id.unwrap();
    let line = row_html(&w.customer.page("/prebookings").await, &id);
    assert!(line.contains("launched"), "{line}");
    assert!(
        line.contains(&format!(r#"href="/instances#instance-{vm}""#)),
        "{line}"
    );

    // Reassigning a live booking: refused in place, the pin kept.
    let spare = w.host("spark-2", Spec::default()).await;
    let r =
        w.op.post_form(
            &format!("/admin/prebookings/{id}/reassign"),
            &[("host_id", spare.id.as_str())],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.text().contains("delete it before moving the booking"));
    assert_ne!(
        row(&w, &id).await.host_id.as_deref(),
        Some(spare.id.as_str())
    );

    // Cancel an unpaid one from the page.
    let r = w
        .customer
        .post_form(
            "/prebookings",
            &[
                ("gpu_type", "spark-1"),
                ("start", "2026-11-30T14:00"),
                ("end", "2026-11-30T18:00"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let second = w
        .db()
        .prebookings_of(&w.customer.sub)
        .await
        .unwrap()
        .into_iter()
        .find(|b| b.id != id)
        .unwrap()
        .id;
    let r = w
        .customer
        .post_form(&format!("/prebookings/{second}/cancel"), &[])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let line = row_html(&w.customer.page("/prebookings").await, &second);
    assert!(line.contains("closed: cancelled"), "{line}");
    let r = w
        .other
        .post_form(&format!("/prebookings/{id}/cancel"), &[])
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(row(&w, &id).await.closed_at, None);
}

/// The requests' fields are bounded (docs/security.md): a booking's `gpu_type` and a
/// reassign's `host_id` past `SHORT` are refused naming the field, nothing written.
async fn e3_requests_are_bounded(w: World) {
    w.host("spark-1", Spec::default()).await;
    let long = "a".repeat(129);
    let r = w
        .customer
        .post(
            "/api/prebookings",
            json!({"gpu_type": long, "start_date": at(2), "end_date": at(3)}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let message = r.json()["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("gpu_type") && message.contains("128"),
        "{message}"
    );
    assert_eq!(count(&w).await, 0);
    let id = booked(&w.customer, 2, 3).await;
    let pinned = row(&w, &id).await.host_id;
    let r =
        w.op.post(
            &format!("/api/admin/prebookings/{id}/reassign"),
            json!({"host_id": long}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(r.json()["message"].as_str().unwrap().contains("host_id"));
    assert_eq!(row(&w, &id).await.host_id, pinned);
}

/// Racing bookings: twelve customers book the same window at once over three hosts;
/// exactly three get one, each a different host, and the rest are told no host is free.
async fn e3_racing_bookings_never_pin_a_host_twice(w: World) {
    let mut hosts = HashSet::new();
    for slug in ["spark-1", "spark-2", "spark-3"] {
        hosts.insert(w.host(slug, Spec::default()).await.id);
    }
    let mut users = Vec::new();
    for i in 0..12 {
        users.push(w.app.customer(&format!("racer{i}@example.com")).await);
    }
    let replies = futures::future::join_all(users.iter().map(|u| book(u, 2, 6))).await;
    let mut pinned = HashSet::new();
    for r in &replies {
        match r.status {
            StatusCode::CREATED => {
                let id = r.json()["id"].as_str().unwrap().to_owned();
                assert!(pinned.insert(row(&w, &id).await.host_id.unwrap()));
            }
            StatusCode::CONFLICT => assert_eq!(r.json()["error"], "no_host_for_window"),
            other => panic!("{other}: {}", r.text()),
        }
    }
    assert_eq!(pinned, hosts, "every host once");
    assert_eq!(count(&w).await, 3);

    // One customer racing six bookings of free windows gets exactly the unpaid cap.
    let greedy = &users[11];
    let mine = w.db().prebookings_of(&greedy.sub).await.unwrap().len();
    let replies =
        futures::future::join_all((0..6).map(|i| book(greedy, 10 + 2 * i, 11 + 2 * i))).await;
    let created = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .count();
    assert_eq!(mine + created, 3);
    for r in replies.iter().filter(|r| r.status != StatusCode::CREATED) {
        assert_eq!(r.json()["error"], "unpaid_cap", "{}", r.text());
    }
    assert_eq!(w.db().prebookings_of(&greedy.sub).await.unwrap().len(), 3);
}

/// E3.2 with E1 and E2: a paid booking's pinned host is held for it from the launcher's
/// tick before its window opens until its end: a dashboard create queues rather than take
/// it, the drain does not place on it; the booking launches there; after `end_date` the
/// host is anyone's again and the drain places the queued create on it.
async fn e3_2_a_paid_pin_is_not_picked_by_a_create_or_the_drain_inside_its_window(w: World) {
    let pinned = w.host("spark-1", Spec::default()).await;
    w.add_key(&w.customer).await;
    let admin = w.app.superadmin("root@example.com").await;
    let id = booked(&w.customer, 2, 6).await;
    assert_eq!(
        row(&w, &id).await.host_id.as_deref(),
        Some(pinned.id.as_str())
    );
    // Half a minute before the window, within the launcher's tick: unpaid, nobody holds it.
    to(&w, 1).await;
    w.clock
        .advance(TimeDelta::minutes(59) + TimeDelta::seconds(30));
    assert!(
        w.pickable(&pinned.id).await,
        "an unpaid booking holds nothing"
    );
    pay(&admin, &id).await;
    assert!(
        !w.pickable(&pinned.id).await,
        "paid, opening within the tick"
    );

    // E1: another customer's create finds no host and queues; the pin is not asked.
    let key = w.add_key(&w.other).await;
    let r = w.create(&w.other, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let queued = r.json()["queued"]["id"].as_str().unwrap().to_owned();
    assert!(w.agents.calls(Op::Create).is_empty());
    // E2: the drain inside the window does not place it there either.
    to(&w, 2).await;
    tick(&w, "queue-drain").await;
    assert!(w.agents.calls(Op::Create).is_empty());
    let q = w.db().queue_row(&queued).await.unwrap().unwrap();
    assert_eq!((q.closed_at, q.vm_id), (None, None));
    assert!(
        w.db()
            .live_vms_on_host(&pinned.id)
            .await
            .unwrap()
            .is_empty()
    );

    // The booking launches on its host.
    launcher(&w).await;
    let calls = w.agents.calls(Op::Create);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].host_id, pinned.id);
    let vm = row(&w, &id).await.launched_vm_id.unwrap();
    assert_eq!(
        w.db().vm(&vm).await.unwrap().unwrap().user_sub,
        w.customer.sub
    );

    // After end_date expire-prebook tears it down and the pin is anyone's: the drain
    // places the queued create there.
    to(&w, 6).await;
    expire(&w).await;
    assert!(row(&w, &id).await.closed_at.is_some());
    assert!(w.pickable(&pinned.id).await);
    tick(&w, "queue-drain").await;
    let q = w.db().queue_row(&queued).await.unwrap().unwrap();
    assert_eq!(q.close_reason.as_deref(), Some("placed"));
    let placed = w
        .db()
        .vm(q.vm_id.as_deref().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (placed.host_id.as_deref(), placed.user_sub.as_str()),
        (Some(pinned.id.as_str()), w.other.sub.as_str())
    );
}

/// E3.2: the hold ends with the window (before expire-prebook has closed the booking) and
/// with the booking's close.
async fn e3_2_a_pin_is_picked_again_after_end_date_or_once_closed(w: World) {
    let pinned = w.host("spark-1", Spec::default()).await;
    let admin = w.app.superadmin("root@example.com").await;
    // The booker has no key: the launcher leaves both bookings open (E3.5).
    let first = booked(&w.customer, 2, 4).await;
    let second = booked(&w.customer, 5, 7).await;
    pay(&admin, &first).await;
    pay(&admin, &second).await;
    for b in [&first, &second] {
        assert_eq!(
            row(&w, b).await.host_id.as_deref(),
            Some(pinned.id.as_str())
        );
    }
    assert!(w.pickable(&pinned.id).await, "before any window");
    to(&w, 3).await;
    launcher(&w).await;
    assert!(!w.pickable(&pinned.id).await, "inside the first window");
    to(&w, 4).await;
    assert!(row(&w, &first).await.closed_at.is_none(), "not yet expired");
    assert!(w.pickable(&pinned.id).await, "its end_date passed");
    to(&w, 5).await;
    assert!(!w.pickable(&pinned.id).await, "inside the second window");
    w.db()
        .close_prebooking(&second, ClosedReason::Ended, w.clock.now())
        .await
        .unwrap();
    assert!(w.pickable(&pinned.id).await, "closed");
    let key = w.add_key(&w.other).await;
    let r = w.create(&w.other, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(w.agents.calls(Op::Create)[0].host_id, pinned.id);
}

/// Issue #13, 5 at booking time: a staff-only GPU type is refused to a customer as at
/// rent time (one rule, `instances::check_may_rent`); nothing is booked or pinned.
async fn e3_staff_only_gpu_types_are_refused_to_customers_at_booking(w: World) {
    w.host(
        "spark-1",
        Spec {
            gpu_type: "linux-test",
            ..Spec::default()
        },
    )
    .await;
    let body = json!({"gpu_type": "linux-test", "start_date": at(2), "end_date": at(6)});
    let r = w.customer.post("/api/prebookings", body.clone()).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("staff_only")),
        "{}",
        r.text()
    );
    assert_eq!(count(&w).await, 0, "no prebookings row");
    assert!(w.audits("prebooking.booked").await.is_empty());
    // Staff may.
    let r = w.op.post("/api/prebookings", body).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(count(&w).await, 1);
}

/// The `<tr>` of booking `id` in a page.
fn row_html(html: &str, id: &str) -> String {
    let start = html
        .find(&format!(r#"id="prebooking-{id}""#))
        .unwrap_or_else(|| panic!("no row for {id} in {html}"));
    let end = html[start..].find("</tr>").unwrap();
    html[start..start + end].to_owned()
}

with_world!(
    e3_booking_pins_a_host_and_says_how_to_pay,
    e3_a_window_at_each_bound_is_taken,
    e3_2_a_host_is_never_pinned_twice_for_overlapping_windows,
    e3_1_the_gate_is_paid_at_alone,
    e3_1_an_off_band_payment_is_recorded_once_and_with_billing_on_only_with_a_reason,
    e3_2_an_unavailable_pinned_host_leaves_the_booking_open,
    e3_2_legacy_booking_without_pin_falls_back_to_the_pool,
    e3_3_step67_relaunches_when_the_launched_vm_is_not_live,
    e3_4_expire_prebook_closes_and_tears_down_through_g,
    e3_5_the_key_is_the_bookers_own_and_no_key_leaves_it_open,
    e0_caller5_operator_launch_with_force,
    e0_caller5_launch_at_the_opening_needs_no_force,
    e3_4_an_instance_still_being_created_defers_the_close,
    e3_the_booker_cancels_an_unpaid_booking,
    e3_2_an_operator_reassigns_the_pin,
    e3_a_booking_holds_one_live_instance,
    e3_the_prebooking_pages,
    e3_requests_are_bounded,
    e3_racing_bookings_never_pin_a_host_twice,
    e3_2_a_paid_pin_is_not_picked_by_a_create_or_the_drain_inside_its_window,
    e3_2_a_pin_is_picked_again_after_end_date_or_once_closed,
    e3_staff_only_gpu_types_are_refused_to_customers_at_booking,
);
