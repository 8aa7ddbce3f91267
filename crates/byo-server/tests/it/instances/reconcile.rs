//! Reconciliation (issue #12, 7): no row and no container is ever lost. The heartbeat lists
//! the instances a host holds; a row left `creating` is settled from it, a container no live
//! row accounts for is removed on the backend's instruction (its own delete call, audited),
//! and a stuck `creating` row can be deleted like any other.

use crate::instances::world::*;
use crate::with_world;

/// A row as the create writes it before it contacts the host (step 44), for a create whose
/// server went away before the host answered: nothing else will ever touch it.
async fn left_creating(w: &World, host: &TestHost, slug: &str) -> VmRow {
    let name = byo_server::app::instances::mint_name();
    let hostname = format!("{name}.{slug}.ssh.localhost");
    w.db()
        .create_vm(
            byo_db::vms::NewVm {
                user_sub: &w.customer.sub,
                host_id: Some(&host.id),
                name: &name,
                gpu_type: "spark-1",
                ssh_hostname: Some(&hostname),
            },
            w.clock.now(),
        )
        .await
        .unwrap()
}

/// Wait (really) for the backend's spawned orphan removals to be audited.
async fn orphans_removed(w: &World, n: usize) -> Vec<byo_db::audit::AuditRow> {
    for _ in 0..100 {
        let audits = w.audits("vm.orphan_removed").await;
        if audits.len() >= n {
            return audits;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    w.audits("vm.orphan_removed").await
}

async fn reconciliation_settles_a_create_the_server_restarted_in_the_middle_of(w: World) {
    let a = w.host("spark-a", Spec::default()).await;
    let b = w.host("spark-b", Spec::default()).await;
    let made = left_creating(&w, &a, "spark-a").await;
    let never = left_creating(&w, &b, "spark-b").await;
    assert!(!w.pickable(&a.id).await && !w.pickable(&b.id).await);

    // Host a made it and runs it: running, with the port it reports.
    assert_eq!(
        w.beat(&a, &[(made.name.as_str(), "Running")]).await,
        StatusCode::NO_CONTENT
    );
    let row = w.vm(&made.id).await;
    assert_eq!(
        (row.status, row.ssh_port, row.creation_failed_at),
        (VmStatus::Running, Some(22000), None)
    );
    assert_eq!(
        row.created_at, made.created_at,
        "billing runs from the commitment"
    );
    let settled = w.audits("vm.settled").await;
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0].target.as_deref(), Some(made.id.as_str()));

    // Host b does not hold it: inside the create's deadline that settles nothing...
    assert_eq!(w.beat(&b, &[]).await, StatusCode::NO_CONTENT);
    assert_eq!(w.vm(&never.id).await.status, VmStatus::Creating);
    // ...after it, the create failed and bills nothing; the host is free again.
    w.clock.advance(TimeDelta::seconds(1));
    assert_eq!(w.beat(&b, &[]).await, StatusCode::NO_CONTENT);
    let row = w.vm(&never.id).await;
    assert_eq!(
        (row.status, row.creation_failed_at),
        (VmStatus::Failed, Some(w.clock.now()))
    );
    assert!(w.pickable(&b.id).await);
    assert_eq!(w.audits("vm.creation_failed").await.len(), 1);
    // A beat again changes nothing, and no container was asked to go.
    assert_eq!(
        w.beat(&a, &[(made.name.as_str(), "Running")]).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(w.audits("vm.settled").await.len(), 1);
    assert!(w.agents.calls(Op::Delete).is_empty());
}

async fn reconciliation_settles_a_slow_create_that_timed_out_to_running(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let key = w.add_key(&w.customer).await;
    // The host takes longer than the backend waits, and goes on.
    w.agents.delay(Op::Create, WAIT * 3);
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::GATEWAY_TIMEOUT, Some("host_silent")),
        "{}",
        r.text()
    );
    let call = w.agents.calls(Op::Create).pop().unwrap();
    let row = w
        .all_vms()
        .await
        .into_iter()
        .find(|v| v.name == call.name)
        .unwrap();
    assert_eq!(
        (row.status, row.creation_failed_at),
        (VmStatus::Creating, None),
        "silence is not a refusal"
    );
    assert!(!w.pickable(&host.id).await, "its host stays occupied");
    assert_eq!(w.audits("vm.create_unanswered").await.len(), 1);
    // Still creating as the customer sees it.
    let mine = w.customer.get(&format!("/api/vms/{}", row.id)).await.json();
    assert_eq!(mine["status"], "creating");

    // Long after the deadline, the host's beat lists it running: it is running.
    w.clock.advance(TimeDelta::minutes(5));
    assert_eq!(
        w.beat(&host, &[(row.name.as_str(), "Running")]).await,
        StatusCode::NO_CONTENT
    );
    let row = w.vm(&row.id).await;
    assert_eq!(
        (row.status, row.creation_failed_at, row.ssh_port),
        (VmStatus::Running, None, Some(22000))
    );
    let mine = w.customer.get(&format!("/api/vms/{}", row.id)).await.json();
    assert_eq!(mine["status"], "running");
    // It is the customer's to delete like any other.
    w.answer_deletes(Answer::Ok);
    let r = w.delete(&w.customer, &row.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        w.agents
            .calls(Op::Delete)
            .iter()
            .all(|c| c.name == row.name)
    );
}

async fn reconciliation_removes_an_orphan_container_on_the_backends_instruction(w: World) {
    let a = w.host("spark-a", Spec::default()).await;
    let b = w.host("spark-b", Spec::default()).await;
    let key = w.add_key(&w.customer).await;
    // A live instance on a (its container must stay)...
    let live = w.running().await;
    assert_eq!(live.host_id.as_deref(), Some(a.id.as_str()));
    // ...a create b refused (its row failed; a container by that name would be an orphan)...
    w.answer_creates(Answer::Refuse);
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    let failed = w.agents.calls(Op::Create).pop().unwrap();
    assert_eq!(failed.host_id, b.id);
    let before: Vec<VmRow> = w.all_vms().await;

    // a holds its instance and a container nobody has a row for; b holds the failed one.
    assert_eq!(
        w.beat(
            &a,
            &[(live.name.as_str(), "Running"), ("vm-orphan01", "Stopped")]
        )
        .await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        w.beat(&b, &[(failed.name.as_str(), "Running")]).await,
        StatusCode::NO_CONTENT
    );
    let audits = orphans_removed(&w, 2).await;
    assert_eq!(audits.len(), 2, "{audits:?}");
    let mut removed: Vec<(String, String)> = w
        .agents
        .calls(Op::Delete)
        .into_iter()
        .map(|c| (c.host_id, c.name))
        .collect();
    removed.sort();
    let mut expected = vec![
        (a.id.clone(), "vm-orphan01".to_owned()),
        (b.id.clone(), failed.name.clone()),
    ];
    expected.sort();
    assert_eq!(
        removed, expected,
        "each orphan removed on its own host, the live one kept"
    );
    for audit in &audits {
        let d = &audit.details.0;
        assert!(
            expected
                .iter()
                .any(|(h, n)| d["host_id"] == h.as_str() && d["name"] == n.as_str()),
            "{d}"
        );
        assert_eq!(audit.actor_sub, None, "the backend's own doing");
    }
    // No row moved: the orphans had none live, the live one is untouched.
    let after = w.all_vms().await;
    assert_eq!(
        format!("{:?}", sorted(before)),
        format!("{:?}", sorted(after))
    );
    assert_eq!(w.vm(&live.id).await.status, VmStatus::Running);
}

fn sorted(mut rows: Vec<VmRow>) -> Vec<VmRow> {
    rows.sort_by(|x, y| x.id.cmp(&y.id));
    rows
}

/// A heartbeat whose list breaks its bounds is refused (400) and settles nothing.
async fn reconciliation_refuses_a_list_out_of_bounds_and_changes_nothing(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let row = left_creating(&w, &host, "spark-1").await;
    w.clock.advance(TimeDelta::seconds(1));
    let seen = w.db().host_status(&host.id).await.unwrap().unwrap().seen_at;
    let names: Vec<String> = (0..65).map(|i| format!("vm-{i:08}")).collect();
    let too_many: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "Running")).collect();
    let long_status = "R".repeat(33);
    for vms in [
        too_many,
        vec![("Not A Name", "Running")],
        vec![(row.name.as_str(), long_status.as_str())],
        vec![(row.name.as_str(), "Run ning")],
    ] {
        assert_eq!(
            w.beat(&host, &vms).await,
            StatusCode::BAD_REQUEST,
            "{vms:?}"
        );
    }
    assert_eq!(w.vm(&row.id).await.status, VmStatus::Creating);
    assert_eq!(
        w.db().host_status(&host.id).await.unwrap().unwrap().seen_at,
        seen
    );
    assert!(w.agents.calls(Op::Delete).is_empty());
}

/// A `creating` row past its create's deadline is stuck, not still being created: its
/// customer and operators can delete it through G's one path (the host confirms, or the
/// delete stays requested). Inside the deadline the refusal stands (`still_creating`).
async fn reconciliation_a_stuck_creating_row_can_be_deleted_by_its_customer_and_operators(
    w: World,
) {
    let a = w.host("spark-a", Spec::default()).await;
    let b = w.host("spark-b", Spec::default()).await;
    let mine = left_creating(&w, &a, "spark-a").await;
    let theirs = left_creating(&w, &b, "spark-b").await;
    let r = w.delete(&w.customer, &mine.id).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("still_creating"))
    );
    assert_eq!(w.vm(&mine.id).await.delete_requested_at, None);

    w.clock.advance(TimeDelta::seconds(1));
    w.answer_deletes(Answer::NotFound);
    let r = w.delete(&w.customer, &mine.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let row = w.vm(&mine.id).await;
    assert_eq!(row.deleted_at, Some(w.clock.now()));
    // It never ran, so it bills nothing (issue #39): a 404-confirmed delete of a row still
    // `creating` was billed from `created_at` for a container that never existed.
    assert_eq!(row.creation_failed_at, Some(w.clock.now()));
    assert_eq!(billable(&row, w.clock.now()), None);
    assert!(w.pickable(&a.id).await);

    // An operator's, on a host that does not answer: requested, billed, listed as stuck.
    w.answer_deletes(Answer::Unreachable);
    let r = w.admin_delete(&w.op, &theirs.id).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let row = w.vm(&theirs.id).await;
    assert_eq!(
        (row.delete_requested_at, row.deleted_at),
        (Some(w.clock.now()), None)
    );
    assert!(!w.pickable(&b.id).await);
    w.answer_deletes(Answer::Ok);
    let r = w.admin_delete(&w.op, &theirs.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(w.pickable(&b.id).await);
}

fn billable(row: &VmRow, now: DateTime<Utc>) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    use byo_server::app::billing::usage;
    usage::billable(
        &usage::VmTimes {
            created_at: row.created_at,
            creation_failed_at: row.creation_failed_at,
            delete_requested_at: row.delete_requested_at,
            deleted_at: row.deleted_at,
        },
        now,
    )
}

/// Issue #39: a create nobody answers — the server went away mid-create and its host never
/// beat again — settles on its own. Past the create's deadline and the grace, settle-creates
/// fails it (never billed); a host that comes back holding the container has it removed as
/// an orphan, on the backend's instruction.
async fn reconciliation_a_create_on_a_host_that_never_beats_again_settles_on_its_own(w: World) {
    use byo_server::app::settle_creates::{SETTLE_GRACE_MINUTES, settle_once};
    let a = w.host("spark-a", Spec::default()).await;
    let b = w.host("spark-b", Spec::default()).await;
    let row = left_creating(&w, &a, "spark-a").await;
    let bound = TimeDelta::from_std(WAIT).unwrap() + TimeDelta::minutes(SETTLE_GRACE_MINUTES);
    w.clock.advance(bound - TimeDelta::seconds(1));
    // A row made later on another host is inside its own bound and stays.
    let young = left_creating(&w, &b, "spark-b").await;
    assert_eq!(settle_once(&w.app.state).await.unwrap(), 0);
    assert_eq!(w.vm(&row.id).await.status, VmStatus::Creating);
    assert!(w.audits("vm.creation_failed").await.is_empty());

    w.clock.advance(TimeDelta::seconds(1));
    assert_eq!(settle_once(&w.app.state).await.unwrap(), 1);
    let failed = w.vm(&row.id).await;
    assert_eq!(
        (failed.status, failed.creation_failed_at, failed.deleted_at),
        (VmStatus::Failed, Some(w.clock.now()), None)
    );
    assert_eq!(billable(&failed, w.clock.now()), None, "never billed");
    assert_eq!(w.vm(&young.id).await.status, VmStatus::Creating);
    let audits = w.audits("vm.creation_failed").await;
    assert_eq!(audits.len(), 1);
    assert_eq!(audits[0].target.as_deref(), Some(row.id.as_str()));
    assert_eq!(audits[0].details.0["by"], "settle-creates");
    assert_eq!(audits[0].actor_sub, None);
    // Settled once: the next sweep finds nothing.
    assert_eq!(settle_once(&w.app.state).await.unwrap(), 0);

    // The host comes back running the container: no live row accounts for it, so the
    // backend removes it; the row stays failed.
    assert!(w.agents.calls(Op::Delete).is_empty());
    assert_eq!(
        w.beat(&a, &[(row.name.as_str(), "Running")]).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(orphans_removed(&w, 1).await.len(), 1);
    let removed: Vec<(String, String)> = w
        .agents
        .calls(Op::Delete)
        .into_iter()
        .map(|c| (c.host_id, c.name))
        .collect();
    assert_eq!(removed, [(a.id.clone(), row.name.clone())]);
    assert_eq!(w.vm(&row.id).await.status, VmStatus::Failed);
    assert!(w.pickable(&a.id).await, "its host is free again");
}

with_world!(
    reconciliation_a_create_on_a_host_that_never_beats_again_settles_on_its_own,
    reconciliation_settles_a_create_the_server_restarted_in_the_middle_of,
    reconciliation_settles_a_slow_create_that_timed_out_to_running,
    reconciliation_removes_an_orphan_container_on_the_backends_instruction,
    reconciliation_refuses_a_list_out_of_bounds_and_changes_nothing,
    reconciliation_a_stuck_creating_row_can_be_deleted_by_its_customer_and_operators,
);
