//! Placement that avoids dead hosts (issue #12, 6): the picker trusts the absence of a
//! heartbeat, a create walks on from a host that refuses or cannot be reached, and a host
//! that keeps failing is benched — visibly — until it beats again or an operator clears it.

use crate::instances::world::*;
use crate::with_world;

fn defaults() -> PlacementConfig {
    PlacementConfig::default()
}

/// These tests' world has placement as shipped (the other modules' is lenient).
async fn world(backend: byo_db::Backend) -> Option<World> {
    world_with(backend, defaults()).await
}

/// The rows of one customer, oldest first.
async fn rows_of(w: &World, user: &User) -> Vec<VmRow> {
    let mut rows = w
        .db()
        .vms_of(&user.sub, DateTime::<Utc>::UNIX_EPOCH)
        .await
        .unwrap();
    rows.sort_by_key(|r| (r.created_at, r.id.clone()));
    rows
}

fn hosts_contacted(w: &World) -> Vec<String> {
    w.agents
        .calls(Op::Create)
        .into_iter()
        .map(|c| c.host_id)
        .collect()
}

/// One dead host (its heartbeat older than the configured age, or none at all) and one
/// healthy: creates land on the healthy one and the dead one is never contacted.
async fn placement_skips_hosts_whose_heartbeat_is_stale(w: World) {
    assert_eq!(defaults().max_heartbeat_age_secs, 90, "three 30 s beats");
    // spark-a sorts first: it would be picked first if it were alive.
    let dead = w.host("spark-a", Spec::default()).await;
    let healthy = w.host("spark-b", Spec::default()).await;
    let key = w.add_key(&w.customer).await;

    // 91 s on, only spark-b has beaten since.
    w.clock.advance(TimeDelta::seconds(91));
    assert_eq!(w.beat(&healthy, &[]).await, StatusCode::NO_CONTENT);
    assert!(!w.pickable(&dead.id).await);
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(hosts_contacted(&w), vec![healthy.id.clone()]);
    let rows = rows_of(&w, &w.customer).await;
    assert_eq!(rows.len(), 1, "no row was written for the dead host");
    assert_eq!(rows[0].host_id.as_deref(), Some(healthy.id.as_str()));

    // With the healthy one taken, the dead one is still not capacity: queued, no
    // instance row written.
    let r = w
        .create(&w.other, "spark-1", &w.add_key(&w.other).await)
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert!(rows_of(&w, &w.other).await.is_empty());
    assert_eq!(hosts_contacted(&w).len(), 1);

    // A host that never beat at all is as dead.
    let silent = w.host("spark-c", Spec::default()).await;
    w.db()
        .execute_unchecked(&format!(
            "delete from host_status where host_id = '{}'",
            silent.id
        ))
        .await
        .unwrap();
    assert!(!w.pickable(&silent.id).await);

    // The dead host beats again: it is capacity again, and the next create lands there.
    assert_eq!(w.beat(&dead, &[]).await, StatusCode::NO_CONTENT);
    assert!(w.pickable(&dead.id).await);
    let r = w
        .create(&w.other, "spark-1", &w.add_key_once(&w.other).await)
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(hosts_contacted(&w).last(), Some(&dead.id));
}

/// A picked host that refuses, or cannot be reached, is not the end of the create: its
/// attempt's row gets `creation_failed_at` (nothing billed), and the create tries the next
/// candidate, where it lands — one live row, and one running instance, per request.
async fn placement_moves_on_when_a_picked_host_refuses_or_cannot_be_reached(w: World) {
    let refusing = w.host("spark-a", Spec::default()).await;
    let unreachable = w.host("spark-b", Spec::default()).await;
    let healthy = w.host("spark-c", Spec::default()).await;
    w.agents.answer_on(
        &refusing.id,
        Op::Create,
        Some(agents::Answer::refused(
            409,
            "the relay refused the SSH map: 403",
        )),
    );
    w.agents.answer_on(
        &unreachable.id,
        Op::Create,
        Some(agents::Answer::unreachable("connection refused")),
    );
    let key = w.add_key(&w.customer).await;
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(
        hosts_contacted(&w),
        vec![
            refusing.id.clone(),
            unreachable.id.clone(),
            healthy.id.clone()
        ],
        "the candidates in order, each once"
    );
    let rows = rows_of(&w, &w.customer).await;
    assert_eq!(
        rows.len(),
        3,
        "one row per attempt, each under its own host's name"
    );
    let calls = w.agents.calls(Op::Create);
    let rows: Vec<VmRow> = calls
        .iter()
        .map(|c| rows.iter().find(|r| r.name == c.name).unwrap().clone())
        .collect();
    for (row, call) in rows.iter().zip(&calls) {
        assert_eq!(row.name, call.name);
        assert_eq!(row.host_id.as_deref(), Some(call.host_id.as_str()));
        assert!(
            row.ssh_hostname.as_deref().unwrap().ends_with(&format!(
                ".{}.ssh.localhost",
                if call.host_id == refusing.id {
                    "spark-a"
                } else if call.host_id == unreachable.id {
                    "spark-b"
                } else {
                    "spark-c"
                }
            )),
            "a name lives under the zone of the host it was written with"
        );
    }
    for failed in &rows[..2] {
        assert_eq!(failed.status, VmStatus::Failed);
        assert_eq!(failed.creation_failed_at, Some(w.clock.now()));
    }
    assert_eq!(rows[2].status, VmStatus::Running);
    assert_eq!(r.json()["instance"]["id"], rows[2].id.as_str());
    assert_eq!(w.audits("vm.creation_failed").await.len(), 2);
    // The hosts that failed are free again (their rows are not live); each counts one.
    assert!(w.pickable(&refusing.id).await && w.pickable(&unreachable.id).await);
    for h in [&refusing, &unreachable] {
        let b = w.db().host_bench(&h.id).await.unwrap().unwrap();
        assert_eq!((b.consecutive_failures, b.in_effect()), (1, false));
    }
    assert!(w.db().host_bench(&healthy.id).await.unwrap().is_none());

    // Every candidate fails: the customer hears the last one's reason, nothing is live.
    let key = w.add_key(&w.other).await;
    let r = w.create(&w.other, "spark-1", &key).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::GATEWAY_TIMEOUT, Some("host_unreachable")),
        "{}",
        r.text()
    );
    assert!(r.text().contains("nothing is billed"));
    let theirs = rows_of(&w, &w.other).await;
    assert_eq!(theirs.len(), 2);
    assert!(theirs.iter().all(|r| r.creation_failed_at.is_some()));
}

/// A host that fails `bench_after_failures` creates in a row is benched: skipped by the
/// picker (never contacted), shown with its count, reason and time, lifted by a heartbeat
/// later than the bench, and cleared — count and all — by an operator.
async fn placement_benches_a_host_that_fails_repeatedly_and_shows_it(w: World) {
    assert_eq!(defaults().bench_after_failures, 3);
    let flaky = w.host("spark-a", Spec::default()).await;
    let healthy = w.host("spark-b", Spec::default()).await;
    w.agents.answer_on(
        &flaky.id,
        Op::Create,
        Some(agents::Answer::refused(500, "lxd: storage pool is full")),
    );
    let key = w.add_key(&w.customer).await;
    // Three creates: each tries spark-a first, fails there, lands on spark-b (deleted again
    // so it is free for the next).
    for n in 1..=3 {
        w.clock.advance(TimeDelta::seconds(5));
        assert_eq!(w.beat(&healthy, &[]).await, StatusCode::NO_CONTENT);
        let r = w.create(&w.customer, "spark-1", &key).await;
        assert_eq!(r.status, StatusCode::CREATED, "{n}: {}", r.text());
        let id = r.json()["instance"]["id"].as_str().unwrap().to_owned();
        assert_eq!(w.delete(&w.customer, &id).await.status, StatusCode::OK);
        let b = w.db().host_bench(&flaky.id).await.unwrap().unwrap();
        assert_eq!(b.consecutive_failures, n);
        assert_eq!(b.in_effect(), n == 3, "benched at the third failure");
    }
    let benched_at = w.clock.now();
    let b = w.db().host_bench(&flaky.id).await.unwrap().unwrap();
    assert_eq!(b.benched_at, Some(benched_at));
    assert_eq!(b.last_failure_at, Some(benched_at));
    assert!(
        b.last_failure
            .as_deref()
            .unwrap()
            .contains("storage pool is full"),
        "{b:?}"
    );
    let benched = w.audits("host.benched").await;
    assert_eq!(benched.len(), 1);
    assert_eq!(benched[0].target.as_deref(), Some(flaky.id.as_str()));
    // Shown to operators, with the heartbeat age beside it.
    let shown =
        w.op.get(&format!("/api/admin/hosts/{}/placement", flaky.id))
            .await;
    assert_eq!(shown.status, StatusCode::OK, "{}", shown.text());
    let shown = shown.json();
    assert_eq!(shown["benched"], true);
    assert_eq!(shown["consecutive_failures"], 3);
    assert!(
        shown["last_failure"]
            .as_str()
            .unwrap()
            .contains("storage pool is full")
    );
    assert!(shown["heartbeat_age_seconds"].as_i64().is_some());
    // This world's window is ten years: its beats are fresh.
    assert_eq!(shown["heartbeat_fresh"], true, "{shown}");

    // Skipped: the next create goes straight to spark-b.
    let before = hosts_contacted(&w).len();
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(
        &hosts_contacted(&w)[before..],
        std::slice::from_ref(&healthy.id)
    );
    assert!(!w.pickable(&flaky.id).await);
    let id = r.json()["instance"]["id"].as_str().unwrap().to_owned();
    assert_eq!(w.delete(&w.customer, &id).await.status, StatusCode::OK);

    // A heartbeat later than the bench lifts it; the count runs on, so the next failure
    // benches it again at once.
    w.clock.advance(TimeDelta::seconds(30));
    assert_eq!(w.beat(&flaky, &[]).await, StatusCode::NO_CONTENT);
    assert_eq!(w.beat(&healthy, &[]).await, StatusCode::NO_CONTENT);
    assert!(w.pickable(&flaky.id).await);
    let b = w.db().host_bench(&flaky.id).await.unwrap().unwrap();
    assert_eq!((b.consecutive_failures, b.in_effect()), (3, false));
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let b = w.db().host_bench(&flaky.id).await.unwrap().unwrap();
    assert_eq!((b.consecutive_failures, b.in_effect()), (4, true));
    let id = r.json()["instance"]["id"].as_str().unwrap().to_owned();
    assert_eq!(w.delete(&w.customer, &id).await.status, StatusCode::OK);

    // A customer may not clear it; an operator may, and then it is forgotten.
    let r = w
        .customer
        .post_empty(&format!("/api/admin/hosts/{}/placement/clear", flaky.id))
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(
        w.db()
            .host_bench(&flaky.id)
            .await
            .unwrap()
            .unwrap()
            .in_effect()
    );
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/placement/clear", flaky.id))
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["benched"], false);
    assert_eq!(r.json()["consecutive_failures"], 0);
    assert!(w.db().host_bench(&flaky.id).await.unwrap().is_none());
    assert!(w.pickable(&flaky.id).await);
    assert_eq!(w.audits("host.bench_cleared").await.len(), 1);

    // A create the host takes also forgets its failures.
    w.agents.answer_on(
        &flaky.id,
        Op::Create,
        Some(agents::Answer::refused(500, "once more")),
    );
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let id = r.json()["instance"]["id"].as_str().unwrap().to_owned();
    assert_eq!(w.delete(&w.customer, &id).await.status, StatusCode::OK);
    assert_eq!(
        w.db()
            .host_bench(&flaky.id)
            .await
            .unwrap()
            .unwrap()
            .consecutive_failures,
        1
    );
    w.agents.answer_on(&flaky.id, Op::Create, None);
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(hosts_contacted(&w).last(), Some(&flaky.id));
    assert!(w.db().host_bench(&flaky.id).await.unwrap().is_none());
}

with_world!(
    placement_skips_hosts_whose_heartbeat_is_stale,
    placement_moves_on_when_a_picked_host_refuses_or_cannot_be_reached,
    placement_benches_a_host_that_fails_repeatedly_and_shows_it,
);
