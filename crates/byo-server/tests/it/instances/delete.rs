//! G: the delete every caller shares, and notify-stuck-deletes.

use crate::instances::world::*;
use crate::with_world;

async fn g_delete_writes_two_facts_and_closes_only_when_confirmed(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;

    // The host refuses: the delete is recorded, the row stays live.
    w.answer_deletes(Answer::Refuse);
    w.clock.advance(TimeDelta::minutes(5));
    let requested = w.clock.now();
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let body = r.json();
    assert_eq!(body["state"], "requested");
    // Our words, not the agent's (issue #36, 8: "lxd: the instance is busy" is the host's).
    let said = body["message"].as_str().unwrap();
    assert!(
        said.contains("the host could not carry it out") && !said.contains("lxd"),
        "{said}"
    );
    let row = w.vm(&vm.id).await;
    assert_eq!(row.delete_requested_at, Some(requested));
    assert_eq!((row.deleted_at, row.status.as_str()), (None, "running"));
    assert!(
        !w.pickable(&host.id).await,
        "the capacity really is still held"
    );
    assert!(w.drain.calls.lock().unwrap().is_empty(), "nothing drains");
    // When the host was asked, the first fact was already written and the second was not.
    let call = w.agents.calls(Op::Delete).pop().unwrap();
    let at_call = call.row.unwrap();
    assert_eq!(
        (at_call.delete_requested_at, at_call.deleted_at),
        (Some(requested), None)
    );

    // Asked again, the host confirms: the row closes, the first fact is kept.
    w.answer_deletes(Answer::Ok);
    w.clock.advance(TimeDelta::minutes(2));
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["state"], "deleted");
    let row = w.vm(&vm.id).await;
    assert_eq!(
        row.delete_requested_at,
        Some(requested),
        "the refund is sized from here"
    );
    assert_eq!(row.deleted_at, Some(w.clock.now()), "billing stops here");
    assert_eq!(row.status, VmStatus::Deleted);
    assert!(w.pickable(&host.id).await);
    assert!(w.agents.containers().is_empty());

    // Step 83 before step 84: when the drain ran, the freed host was already pickable.
    let drained = w.drain.calls.lock().unwrap().clone();
    assert_eq!(drained, vec![("spark-1".to_owned(), host.id.clone(), true)]);
}

async fn g_a_404_confirms(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    // The container went away and the agent's own write never landed: the orphan case.
    w.answer_deletes(Answer::NotFound);
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let row = w.vm(&vm.id).await;
    assert!(row.delete_requested_at.is_some() && row.deleted_at.is_some());
    assert!(w.pickable(&host.id).await);
    let confirmed = w.audits("vm.deleted").await;
    assert_eq!(confirmed.len(), 1);
    assert_eq!(confirmed[0].details.0["confirmed_by"], "not_found");
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn g_a_delete_that_times_out_stays_requested_and_is_listed_as_stuck(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    w.answer_deletes(Answer::Hang);
    let requested = w.clock.now();
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let body = r.json();
    assert_eq!(body["state"], "requested");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no answer within"),
        "{body}"
    );
    assert_eq!(body["instance"]["deleted_at"], Value::Null);
    let row = w.vm(&vm.id).await;
    assert_eq!(
        (row.delete_requested_at, row.deleted_at),
        (Some(requested), None)
    );
    assert!(
        !w.pickable(&host.id).await,
        "still occupied: the honest state"
    );

    // Not yet stuck; after ten minutes it is, to the operator's list and the sweep.
    assert!(w.stuck_list().await.json().as_array().unwrap().is_empty());
    let all =
        w.op.get("/api/admin/stuck-deletes?older_than_minutes=0")
            .await
            .json();
    assert_eq!(
        all.as_array().unwrap().len(),
        1,
        "every delete waiting, on request"
    );
    // The window is at most a year, taken inclusively; past it, a clear refusal.
    let year = 60 * 24 * 365;
    let r =
        w.op.get(&format!(
            "/api/admin/stuck-deletes?older_than_minutes={year}"
        ))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.json().as_array().unwrap().is_empty(), "none a year old");
    for bad in [year + 1, -1] {
        let r =
            w.op.get(&format!(
                "/api/admin/stuck-deletes?older_than_minutes={bad}"
            ))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}: {}", r.text());
        assert_eq!(r.json()["error"], "invalid_minutes");
    }
    w.clock.advance(TimeDelta::minutes(11));
    let r = w.stuck_list().await;
    assert_eq!(r.status, StatusCode::OK);
    let stuck = r.json();
    assert_eq!(stuck.as_array().unwrap().len(), 1, "{stuck}");
    assert_eq!(stuck[0]["vm_id"], vm.id.as_str());
    assert_eq!(stuck[0]["host_slug"], "spark-1");
    assert_eq!(stuck[0]["waiting_minutes"], 11);
    assert_eq!(
        stuck[0]["delete_requested_at"]
            .as_str()
            .map(|s| s.parse::<DateTime<Utc>>().unwrap()),
        Some(requested)
    );
    assert_eq!(
        w.customer.get("/api/admin/stuck-deletes").await.status,
        StatusCode::FORBIDDEN
    );

    // The scheduled sweep warns about it, naming the instance, the host and the wait.
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let found = {
        let _guard = tracing::subscriber::set_default(subscriber);
        byo_server::app::notify_stuck_deletes::notify_once(&w.app.state)
            .await
            .unwrap()
    };
    assert_eq!(found.len(), 1);
    let logged = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logged.contains("WARN"), "{logged}");
    assert!(logged.contains("stuck delete"), "{logged}");
    assert!(logged.contains(&vm.id), "{logged}");
    assert!(logged.contains("host=spark-1"), "{logged}");
    assert!(logged.contains("waiting_minutes=11"), "{logged}");

    // Asked again, the host answers: the row closes and it leaves the list.
    w.answer_deletes(Answer::Ok);
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(w.vm(&vm.id).await.delete_requested_at, Some(requested));
    assert!(w.stuck_list().await.json().as_array().unwrap().is_empty());
    assert!(
        byo_server::app::notify_stuck_deletes::notify_once(&w.app.state)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn g_both_writes_are_guarded(w: World) {
    w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    let r = w.delete(&w.customer, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK);
    let closed = w.vm(&vm.id).await;

    // A second delete, and an operator's, change nothing and do not bother the host.
    w.clock.advance(TimeDelta::minutes(3));
    for r in [
        w.delete(&w.customer, &vm.id).await,
        w.admin_delete(&w.op, &vm.id).await,
    ] {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["message"], "this instance is already deleted");
    }
    let again = w.vm(&vm.id).await;
    assert_eq!(
        (again.delete_requested_at, again.deleted_at),
        (closed.delete_requested_at, closed.deleted_at)
    );
    assert_eq!(w.agents.calls(Op::Delete).len(), 1);

    // Concurrent deletes from both callers: each fact is written once.
    let vm = w.running().await;
    w.agents.delay(Op::Delete, Duration::from_millis(100));
    let (a, b, c, d) = tokio::join!(
        w.delete(&w.customer, &vm.id),
        w.delete(&w.customer, &vm.id),
        w.admin_delete(&w.op, &vm.id),
        w.admin_delete(&w.op, &vm.id),
    );
    for r in [a, b, c, d] {
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let requested: Vec<_> = w
        .audits("vm.delete_requested")
        .await
        .into_iter()
        .filter(|a| a.target.as_deref() == Some(vm.id.as_str()))
        .collect();
    let deleted: Vec<_> = w
        .audits("vm.deleted")
        .await
        .into_iter()
        .filter(|a| a.target.as_deref() == Some(vm.id.as_str()))
        .collect();
    assert_eq!((requested.len(), deleted.len()), (1, 1));
    let row = w.vm(&vm.id).await;
    assert_eq!(row.delete_requested_at, Some(requested[0].at));
    assert_eq!(row.deleted_at, Some(deleted[0].at));
    assert_eq!(
        w.drain.calls.lock().unwrap().len(),
        2,
        "one drain per closed row"
    );

    // And at the store: a later write of either fact is a no-op.
    let later = w.clock.now() + TimeDelta::hours(1);
    assert_eq!(
        w.db().request_vm_delete(&vm.id, later).await.unwrap(),
        byo_db::GuardedWrite::AlreadySet
    );
    assert_eq!(
        w.db().confirm_vm_deleted(&vm.id, later).await.unwrap(),
        byo_db::GuardedWrite::AlreadySet
    );
    let unchanged = w.vm(&vm.id).await;
    assert_eq!(
        (unchanged.delete_requested_at, unchanged.deleted_at),
        (row.delete_requested_at, row.deleted_at)
    );
}

with_world!(
    g_delete_writes_two_facts_and_closes_only_when_confirmed,
    g_a_404_confirms,
    g_a_delete_that_times_out_stays_requested_and_is_listed_as_stuck,
    g_both_writes_are_guarded,
);
