//! E2, the queue, on both backends: a create with no free host queues (step 58), the drain
//! places in order (steps 59–62) with its three outcomes per candidate, billing re-checked
//! live, concurrent drainers never placing twice, operators placing and closing by hand
//! (E0's caller 4), and the rules every create shares (staff-only GPU types, the
//! per-account limit). The world is the instances tests' (fake agents, manual clock); the
//! drain is called as its job would call it. Every refusal reads the rows back.

use crate::with_world;

use crate::instances::world;

use std::collections::HashMap;

use byo_db::queue::QueueRow;
use byo_server::app::billing::{BillingGate, Charge};
use byo_server::app::queue_drain::{self, DrainReport};
use byo_server::app::queued;
use byo_server::error::AppResult;
use byo_wire::Role;

use world::*;

async fn drain(w: &World) -> DrainReport {
    queue_drain::drain_once(&w.app.state).await.unwrap()
}

async fn queue_row(w: &World, id: &str) -> QueueRow {
    w.db().queue_row(id).await.unwrap().unwrap()
}

/// `n` spark-1 creates of the customer's queued straight in the store, a second apart
/// from now (past the API's per-account limit): the key they name.
async fn enqueue_many(w: &World, n: i64) -> String {
    let key = w.add_key_once(&w.customer).await;
    let start = w.clock.now();
    for i in 0..n {
        let new = byo_db::queue::NewQueued {
            user_sub: &w.customer.sub,
            gpu_type: "spark-1",
            ssh_key_id: &key,
            expires_at: start + TimeDelta::seconds(i) + TimeDelta::hours(72),
        };
        w.db()
            .enqueue_vm(new, start + TimeDelta::seconds(i), u32::MAX)
            .await
            .unwrap();
    }
    key
}

/// Queue a create of the customer's (no host is free): its id.
async fn queued(w: &World, user: &User, gpu_type: &str) -> String {
    let key = w.add_key_once(user).await;
    // The line is by `created_at`: the manual clock moves so each stands after the last.
    w.clock.advance(TimeDelta::seconds(1));
    let r = w.create(user, gpu_type, &key).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    r.json()["queued"]["id"].as_str().unwrap().to_owned()
}

fn live(rows: &[VmRow]) -> Vec<&VmRow> {
    rows.iter()
        .filter(|r| r.deleted_at.is_none() && r.creation_failed_at.is_none())
        .collect()
}

/// Billing as a test wants it: these accounts may not be charged, with this reason.
#[derive(Default)]
struct Billing {
    refused: Mutex<HashMap<String, String>>,
}

impl BillingGate for Billing {
    fn may_charge<'a>(&'a self, user_sub: &'a str) -> BoxFuture<'a, AppResult<Charge>> {
        Box::pin(async move {
            Ok(match self.refused.lock().unwrap().get(user_sub) {
                Some(reason) => Charge::Refused {
                    reason: reason.clone(),
                },
                None => Charge::Allowed,
            })
        })
    }
    fn enabled(&self) -> bool {
        true
    }
}

async fn e2_step58_a_create_with_no_free_host_queues_with_no_host(w: World) {
    let key = w.add_key(&w.customer).await;
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    w.clock.advance(TimeDelta::seconds(1));
    let body = r.json();
    let id = body["queued"]["id"].as_str().unwrap().to_owned();
    assert_eq!(body["queued"]["position"], 1);
    // The row with no host: no instance row, no host contacted, nothing billed.
    assert!(w.all_vms().await.is_empty());
    assert!(w.agents.calls(Op::Create).is_empty());
    let row = queue_row(&w, &id).await;
    assert_eq!(
        (row.vm_id.as_deref(), row.attempts, row.closed_at),
        (None, 0, None)
    );
    // A second customer's create stands behind it, told so in the answer; each sees
    // their own place.
    let other_key = w.add_key_once(&w.other).await;
    w.clock.advance(TimeDelta::seconds(1));
    let r = w.create(&w.other, "spark-1", &other_key).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert_eq!(r.json()["queued"]["position"], 2);
    let other = r.json()["queued"]["id"].as_str().unwrap().to_owned();
    let mine = w.customer.get("/api/queue").await.json();
    assert_eq!(mine.as_array().unwrap().len(), 1);
    assert_eq!(
        (mine[0]["id"].as_str(), &mine[0]["position"]),
        (Some(id.as_str()), &json!(1))
    );
    let theirs = w.other.get("/api/queue").await.json();
    assert_eq!(
        (theirs[0]["id"].as_str(), &theirs[0]["position"]),
        (Some(other.as_str()), &json!(2))
    );
    // The customer's page shows it, with its place and a Cancel button.
    let page = w.customer.page("/instances").await;
    assert!(page.contains(&format!("queued-{id}")), "{page}");
    assert!(page.contains(&format!("/instances/queue/{id}/cancel")));

    // Someone else's row is as absent as an unknown one, and nothing changes.
    let r = w.other.delete(&format!("/api/queue/{id}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    let r = w.other.delete("/api/queue/no-such-row").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(queue_row(&w, &id).await.closed_at.is_none());

    // The customer cancels: closed, `cancelled`; the other customer moves up.
    let r = w.customer.delete(&format!("/api/queue/{id}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let row = queue_row(&w, &id).await;
    assert!(row.closed_at.is_some());
    assert_eq!(row.close_reason.as_deref(), Some("cancelled"));
    assert!(
        w.customer
            .get("/api/queue")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(w.other.get("/api/queue").await.json()[0]["position"], 1);
    // Cancelled twice: no longer open, as absent as none.
    let r = w.customer.delete(&format!("/api/queue/{id}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(w.audits("queue.cancelled").await.len(), 1);

    // A host frees up: the drain places the one still queued, not the cancelled one.
    let host = w.host("spark-1", Spec::default()).await;
    let report = drain(&w).await;
    assert_eq!(report.placed, 1, "{report}");
    let placed = queue_row(&w, &other).await;
    assert_eq!(placed.close_reason.as_deref(), Some("placed"));
    let vm = w.vm(placed.vm_id.as_deref().unwrap()).await;
    assert_eq!(vm.user_sub, w.other.sub);
    assert_eq!(vm.host_id.as_deref(), Some(host.id.as_str()));
    assert_eq!(vm.status, VmStatus::Running);
    assert!(queue_row(&w, &id).await.vm_id.is_none());
}

async fn e2_step62_the_drain_stamps_host_and_name_once_a_host_accepted(w: World) {
    let first = queued(&w, &w.customer, "spark-1").await;
    let second = queued(&w, &w.other, "spark-1").await;
    let host = w.host("spark-1", Spec::default()).await;
    let at = w.clock.now();
    let report = drain(&w).await;
    assert_eq!((report.placed, report.waiting), (1, 1), "{report}");

    // Oldest first.
    let row = queue_row(&w, &first).await;
    assert_eq!(
        (row.close_reason.as_deref(), row.attempts),
        (Some("placed"), 1)
    );
    let vm = w.vm(row.vm_id.as_deref().unwrap()).await;
    let calls = w.agents.calls(Op::Create);
    assert_eq!(calls.len(), 1);
    // E0: the row preceded dispatch, with the host it was sent to and the name minted for
    // that host's zone (step 59), created_at stamped before the host was contacted.
    let at_contact = calls[0].row.as_ref().expect("the row precedes dispatch");
    assert_eq!(at_contact.id, vm.id);
    assert_eq!(at_contact.host_id.as_deref(), Some(host.id.as_str()));
    assert_eq!(at_contact.status, VmStatus::Creating);
    assert_eq!(
        at_contact.ssh_hostname.as_deref(),
        Some(format!("{}.spark-1.ssh.localhost", calls[0].name).as_str())
    );
    assert_eq!(vm.created_at, at);
    assert_eq!((vm.status, vm.ssh_port), (VmStatus::Running, Some(2201)));
    // The customer sees the instance and no longer the queued row.
    assert!(
        w.customer
            .get("/api/queue")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
    let mine = w.customer.get("/api/vms").await.json();
    assert_eq!(mine[0]["id"].as_str(), Some(vm.id.as_str()));
    // The second waits, first in line now, with no instance row.
    let waiting = queue_row(&w, &second).await;
    assert_eq!((waiting.closed_at, waiting.vm_id), (None, None));
    assert_eq!(w.other.get("/api/queue").await.json()[0]["position"], 1);

    // Step 84: the delete that frees the host is what lets the second in.
    assert_eq!(w.delete(&w.customer, &vm.id).await.status, StatusCode::OK);
    let report = drain(&w).await;
    assert_eq!(report.placed, 1, "{report}");
    let placed = queue_row(&w, &second).await;
    let vm2 = w.vm(placed.vm_id.as_deref().unwrap()).await;
    assert_eq!(vm2.host_id.as_deref(), Some(host.id.as_str()));
    assert_ne!(vm2.name, vm.name, "a name is minted per attempt");
}

async fn e2_refused_host_is_benched_and_the_drain_moves_on(w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    let a = w.host("spark-1", Spec::default()).await;
    let b = w.host("spark-2", Spec::default()).await;
    w.agents.answer_on(
        &a.id,
        Op::Create,
        Some(agents::Answer::refused(409, "lxd: the instance is busy")),
    );
    let report = drain(&w).await;
    assert_eq!(
        report.to_string(),
        "placed 1, refused 1, skipped 0, held 0, waiting 0, pending 0 (claimed 1)"
    );

    // The refusing host: its attempt's row failed at once, so the queued create does not
    // occupy it (step 58's point), and it is benched.
    let hosts: Vec<String> = w
        .agents
        .calls(Op::Create)
        .into_iter()
        .map(|c| c.host_id)
        .collect();
    assert_eq!(hosts, vec![a.id.clone(), b.id.clone()]);
    assert!(w.db().live_vms_on_host(&a.id).await.unwrap().is_empty());
    let bench = w.db().host_bench(&a.id).await.unwrap().expect("benched");
    assert!(bench.in_effect(), "{bench:?}");
    assert_eq!(w.audits("host.benched").await.len(), 1);
    let failed: Vec<VmRow> = w
        .all_vms()
        .await
        .into_iter()
        .filter(|v| v.host_id.as_deref() == Some(a.id.as_str()))
        .collect();
    assert_eq!(failed.len(), 1);
    assert!(failed[0].creation_failed_at.is_some());
    // Placed on the next candidate, two attempts counted.
    let row = queue_row(&w, &id).await;
    assert_eq!(
        (row.close_reason.as_deref(), row.attempts),
        (Some("placed"), 2)
    );
    let vm = w.vm(row.vm_id.as_deref().unwrap()).await;
    assert_eq!(vm.host_id.as_deref(), Some(b.id.as_str()));
    assert!(w.db().host_bench(&b.id).await.unwrap().is_none());
}

async fn e2_an_unreadable_2xx_is_accepted_never_a_refusal(w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    let a = w.host("spark-1", Spec::default()).await;
    let _b = w.host("spark-2", Spec::default()).await;
    w.agents.then(Op::Create, agents::Answer::Unreadable);
    let report = drain(&w).await;
    assert_eq!((report.placed, report.refused), (1, 0), "{report}");
    // Exactly one container, on the first candidate; no second candidate was asked.
    assert_eq!(w.agents.containers().len(), 1);
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
    let row = queue_row(&w, &id).await;
    assert_eq!(row.close_reason.as_deref(), Some("placed"));
    let vm = w.vm(row.vm_id.as_deref().unwrap()).await;
    assert_eq!(vm.host_id.as_deref(), Some(a.id.as_str()));
    assert_eq!((vm.status, vm.ssh_port), (VmStatus::Running, None));
    // Not scored as a failure: no bench, no failure counted.
    assert!(w.db().host_bench(&a.id).await.unwrap().is_none());
    assert!(w.audits("vm.creation_failed").await.is_empty());
}

async fn e2_skipped_host_is_not_benched(w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    let a = w.host("spark-1", Spec::default()).await;
    let b = w.host("spark-2", Spec::default()).await;
    let c = w.host("spark-3", Spec::default()).await;
    // Every host takes a while; the first candidate refuses. While the drain waits on it,
    // another customer's create takes the second candidate, so the drain's stale list
    // meets a host it can no longer write a row for.
    w.agents.delay(Op::Create, Duration::from_millis(250));
    w.agents.answer_on(
        &a.id,
        Op::Create,
        Some(agents::Answer::refused(409, "lxd: the instance is busy")),
    );
    let state = w.app.state.clone();
    let drainer = tokio::spawn(async move { queue_drain::drain_once(&state).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(80)).await;
    let key = w.add_key_once(&w.other).await;
    let r = w.create(&w.other, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let theirs = r.json()["instance"]["id"].as_str().unwrap().to_owned();
    assert_eq!(w.vm(&theirs).await.host_id.as_deref(), Some(b.id.as_str()));
    let report = drainer.await.unwrap();
    assert_eq!(
        (report.placed, report.refused, report.skipped),
        (1, 1, 1),
        "{report}"
    );
    // The skipped host did nothing wrong: not benched, its instance untouched, never
    // asked by the drain.
    assert!(w.db().host_bench(&b.id).await.unwrap().is_none());
    let asked: Vec<String> = w
        .agents
        .calls(Op::Create)
        .into_iter()
        .map(|c| c.host_id)
        .collect();
    assert_eq!(
        asked.iter().filter(|h| **h == b.id).count(),
        1,
        "only the other customer's create"
    );
    assert_eq!(w.vm(&theirs).await.status, VmStatus::Running);
    let row = queue_row(&w, &id).await;
    let vm = w.vm(row.vm_id.as_deref().unwrap()).await;
    assert_eq!(vm.host_id.as_deref(), Some(c.id.as_str()));
    // Attempts count rows written: the refused one and the placed one.
    assert_eq!(row.attempts, 2);
}

async fn e2_billing_is_rechecked_live(mut w: World) {
    // Queued while billing allowed it.
    let id = queued(&w, &w.customer, "spark-1").await;
    let billing = Arc::new(Billing::default());
    billing
        .refused
        .lock()
        .unwrap()
        .insert(w.customer.sub.clone(), "the card was declined".into());
    w.app.state.billing = billing.clone();
    w.host("spark-1", Spec::default()).await;
    let report = drain(&w).await;
    assert_eq!((report.placed, report.held), (0, 1), "{report}");
    // Left queued, nothing written, no host asked; why is visible to both.
    let row = queue_row(&w, &id).await;
    assert_eq!(
        (row.closed_at, row.vm_id.as_deref(), row.attempts),
        (None, None, 0)
    );
    assert!(
        row.last_error
            .as_deref()
            .unwrap()
            .contains("card was declined")
    );
    assert!(w.all_vms().await.is_empty());
    assert!(w.agents.calls(Op::Create).is_empty());
    let mine = w.customer.get("/api/queue").await.json();
    assert!(
        mine[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("card was declined")
    );
    let all = w.op.get("/api/admin/queue").await.json();
    assert!(
        all[0]["queued"]["last_error"]
            .as_str()
            .unwrap()
            .contains("declined")
    );
    let page = w.op.page("/admin/queue").await;
    assert!(page.contains("the card was declined"), "{page}");
    // The claim was let go: the next run tries again, and billing now allows it.
    assert!(row.claimed_until.is_none());
    billing.refused.lock().unwrap().clear();
    let report = drain(&w).await;
    assert_eq!(report.placed, 1, "{report}");
    let row = queue_row(&w, &id).await;
    assert_eq!(row.close_reason.as_deref(), Some("placed"));
    assert!(row.last_error.is_none());
}

async fn e2_a_silent_host_leaves_the_row_for_its_heartbeat_and_no_other_host_is_tried(w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    let a = w.host("spark-1", Spec::default()).await;
    let _b = w.host("spark-2", Spec::default()).await;
    w.agents.then(Op::Create, agents::Answer::Hang);
    let report = drain(&w).await;
    assert_eq!((report.placed, report.pending), (0, 1), "{report}");
    assert_eq!(
        w.agents.calls(Op::Create).len(),
        1,
        "no second instance for one row"
    );
    let row = queue_row(&w, &id).await;
    let vm_id = row.vm_id.clone().unwrap();
    assert_eq!(w.vm(&vm_id).await.status, VmStatus::Creating);
    // While it is creating, runs leave it be.
    let report = drain(&w).await;
    assert_eq!(report.pending, 1, "{report}");
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
    // The host's heartbeat lists the instance: it runs, and the next run closes the row.
    let name = w.vm(&vm_id).await.name;
    assert!(w.beat(&a, &[(&name, "Running")]).await.is_success());
    assert_eq!(w.vm(&vm_id).await.status, VmStatus::Running);
    let report = drain(&w).await;
    assert_eq!(report.placed, 1, "{report}");
    let row = queue_row(&w, &id).await;
    assert_eq!(
        (row.close_reason.as_deref(), row.vm_id.as_deref()),
        (Some("placed"), Some(vm_id.as_str()))
    );
}

/// #41.4: a claimed batch's hosts are asked at once, so one silent host holds up no other
/// row: every host is contacted before the first one's silence is settled, the others are
/// placed (settled together, each audited and its customer told), and the silent one's row
/// waits for its heartbeat as alone.
async fn e2_a_batchs_hosts_are_asked_at_once_and_a_silent_one_holds_up_no_other(w: World) {
    enqueue_many(&w, 4).await;
    for i in 1..=4 {
        w.host(&format!("spark-{i}"), Spec::default()).await;
    }
    w.agents.then(Op::Create, agents::Answer::Hang);
    let state = w.app.state.clone();
    let drainer = tokio::spawn(async move { queue_drain::drain_once(&state).await.unwrap() });
    let silent = w.agents.contacted(Op::Create, 1).await;
    w.agents.contacted(Op::Create, 4).await;
    assert!(
        w.audits("vm.create_unanswered").await.is_empty(),
        "every host was asked while the first was still within its wait"
    );
    let report = drainer.await.unwrap();
    assert_eq!(
        (
            report.placed,
            report.pending,
            report.refused,
            report.skipped
        ),
        (3, 1, 0, 0),
        "{report}"
    );
    let hosts: HashSet<String> = w
        .agents
        .calls(Op::Create)
        .into_iter()
        .map(|c| c.host_id)
        .collect();
    assert_eq!(hosts.len(), 4, "one host per row");
    assert_eq!(w.audits("queue.placed").await.len(), 3);
    assert_eq!(w.audits("vm.create_unanswered").await.len(), 1);
    let open = w.db().open_queue(Some(&w.customer.sub), 10).await.unwrap();
    assert_eq!(open.len(), 1);
    let vm = w.vm(open[0].row.vm_id.as_deref().unwrap()).await;
    assert_eq!(
        (vm.status, vm.host_id.as_deref(), vm.name.as_str()),
        (
            VmStatus::Creating,
            Some(silent.host_id.as_str()),
            silent.name.as_str()
        )
    );
    let notices = w.db().notices(Some(&w.customer.sub), 10).await.unwrap();
    assert_eq!(
        notices.iter().filter(|n| n.kind == "queue.placed").count(),
        3
    );
}

async fn e2_concurrent_drainers_never_place_twice(w: World) {
    const ROWS: usize = 40;
    const HOSTS: usize = 25;
    let mut users = Vec::new();
    for i in 0..ROWS / 2 {
        users.push(w.app.customer(&format!("c{i}@example.com")).await);
    }
    let mut ids = Vec::new();
    for u in &users {
        ids.push(queued(&w, u, "spark-1").await);
        ids.push(queued(&w, u, "spark-1").await);
    }
    let mut hosts = Vec::new();
    for i in 0..HOSTS {
        hosts.push(w.host(&format!("spark-{}", i + 1), Spec::default()).await);
    }
    // Hosts take a little real time, so attempts overlap; one in five refuses.
    w.agents.delay(Op::Create, Duration::from_millis(5));
    for h in hosts.iter().step_by(5) {
        w.agents.answer_on(
            &h.id,
            Op::Create,
            Some(agents::Answer::refused(409, "lxd: the instance is busy")),
        );
    }
    // Four drainers: two on this server's state, two on a second server's own pool.
    let second = {
        let store = byo_db::Store::connect(&w.app.db.url).await.unwrap();
        byo_server::AppState::new(store, w.app.state.config.as_ref().clone())
            .with_clock(w.clock.clone())
            .with_fake_hosts(&w.agents)
            .with_waits(w.app.state.waits)
    };
    let states = [
        w.app.state.clone(),
        w.app.state.clone(),
        second.clone(),
        second,
    ];
    let tasks: Vec<_> = states
        .into_iter()
        .map(|s| tokio::spawn(async move { queue_drain::drain_once(&s).await.unwrap() }))
        .collect();
    let mut placed = 0;
    for t in tasks {
        placed += t.await.unwrap().placed;
    }
    let good = HOSTS - HOSTS.div_ceil(5);
    assert_eq!(placed as usize, good);

    let vms = w.all_vms().await;
    let live_rows = live(&vms);
    assert_eq!(live_rows.len(), good);
    // Every host holds at most one live row; every container is a live row's.
    let mut per_host: HashMap<&str, usize> = HashMap::new();
    for v in &live_rows {
        *per_host.entry(v.host_id.as_deref().unwrap()).or_default() += 1;
    }
    assert!(per_host.values().all(|n| *n == 1), "{per_host:?}");
    assert_eq!(w.agents.containers().len(), good);
    // Every queue row placed at most once: its one live instance is the one it names.
    let mut closed = 0;
    for id in &ids {
        let row = queue_row(&w, id).await;
        if row.close_reason.as_deref() == Some("placed") {
            closed += 1;
            let vm = w.vm(row.vm_id.as_deref().unwrap()).await;
            assert!(vm.deleted_at.is_none() && vm.creation_failed_at.is_none());
        } else {
            assert!(row.closed_at.is_none());
            assert!(row.claimed_until.is_none(), "a finished run holds nothing");
        }
    }
    assert_eq!(closed, good);
    // And every instance row belongs to exactly one create call.
    let names: HashSet<String> = w
        .agents
        .calls(Op::Create)
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names.len(), w.agents.calls(Op::Create).len());
    assert_eq!(names.len(), vms.len());
}

/// The drain's cost when no host is free: a run stops claiming a gpu_type once a batch of it
/// placed nothing and found no host (not O(queue)), and goes on with the other kinds.
async fn e2_a_run_stops_claiming_a_kind_with_no_free_host(w: World) {
    enqueue_many(&w, 40).await;
    // Behind them, another kind, queued with no host and then given one.
    w.clock.advance(TimeDelta::minutes(1));
    let other = queued(&w, &w.other, "spark-2").await;
    let host = w
        .host(
            "spark-9",
            Spec {
                gpu_type: "spark-2",
                ..Spec::default()
            },
        )
        .await;
    let report = drain(&w).await;
    assert_eq!(
        (report.claimed, report.waiting, report.placed),
        (
            u32::try_from(queue_drain::CLAIM_BATCH).unwrap() + 1,
            u32::try_from(queue_drain::CLAIM_BATCH).unwrap(),
            1
        ),
        "{report}"
    );
    let placed = queue_row(&w, &other).await;
    assert_eq!(placed.close_reason.as_deref(), Some("placed"));
    assert_eq!(
        w.vm(placed.vm_id.as_deref().unwrap()).await.host_id,
        Some(host.id.clone())
    );
    // Every spark-1 row still open, let go, never tried.
    let open = w.db().open_queue(Some(&w.customer.sub), 100).await.unwrap();
    assert_eq!(open.len(), 40);
    assert!(
        open.iter()
            .all(|q| q.row.claim_token.is_none() && q.row.attempts == 0)
    );
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
}

/// A batch of a kind that placed nothing because its rows were held (not for want of a
/// host) does not stop the run claiming that kind: a later row of it is placed in the
/// same run.
async fn e2_a_held_batch_does_not_stop_the_run_claiming_its_kind(w: World) {
    let key = enqueue_many(&w, queue_drain::CLAIM_BATCH).await;
    // Their key is removed: every one of that first batch is held.
    let r = w.customer.delete(&format!("/api/ssh-keys/{key}")).await;
    assert!(r.status.is_success(), "{}", r.text());
    w.clock.advance(TimeDelta::minutes(1));
    let other = queued(&w, &w.other, "spark-1").await;
    w.host("spark-1", Spec::default()).await;
    let report = drain(&w).await;
    let batch = u32::try_from(queue_drain::CLAIM_BATCH).unwrap();
    assert_eq!(
        (report.held, report.placed, report.claimed),
        (batch, 1, batch + 1),
        "{report}"
    );
    assert_eq!(
        queue_row(&w, &other).await.close_reason.as_deref(),
        Some("placed")
    );
}

/// The attempt's lease covers the create in flight: a second drainer arriving while the
/// host has not answered claims nothing, and the row's claim runs past the create's wait.
async fn e2_a_row_whose_create_is_in_flight_is_not_claimed_again(w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    w.host("spark-1", Spec::default()).await;
    w.agents.then(Op::Create, agents::Answer::Hang);
    let state = w.app.state.clone();
    let first = tokio::spawn(async move { queue_drain::drain_once(&state).await.unwrap() });
    // Waits on the event: the host has the create and is silent.
    let asked = tokio::time::Instant::now();
    while w.agents.calls(Op::Create).is_empty() {
        assert!(
            asked.elapsed() < Duration::from_secs(10),
            "the create never reached the host"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let row = queue_row(&w, &id).await;
    let until = row
        .claimed_until
        .expect("claimed while its create is in flight");
    assert!(
        until >= w.clock.now() + TimeDelta::seconds(queue_drain::LEASE_SECS),
        "claimed until {until}"
    );
    let second = drain(&w).await;
    assert_eq!(second.claimed, 0, "{second}");
    let first = first.await.unwrap();
    assert_eq!((first.claimed, first.pending), (1, 1), "{first}");
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
}

async fn e0_caller4_operator_places_a_queued_vm(w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    // A dedicated owner's box the picker cannot reach for this customer.
    let boxed = w
        .host(
            "spark-1",
            Spec {
                dedicated_to: Some(w.other.sub.clone()),
                ..Spec::default()
            },
        )
        .await;
    let inactive = w
        .host(
            "spark-2",
            Spec {
                active: false,
                ..Spec::default()
            },
        )
        .await;
    let other_kind = w
        .host(
            "spark-3",
            Spec {
                gpu_type: "spark-2",
                ..Spec::default()
            },
        )
        .await;
    // Holding an agent token but no relay address yet: nothing to call it through.
    let no_relay = w.host("spark-4", Spec::default()).await;
    w.db()
        .execute_unchecked(&format!(
            "update hosts set relay_ip = null where id = '{}'",
            no_relay.id
        ))
        .await
        .unwrap();
    assert_eq!(drain(&w).await.placed, 0, "the drain cannot reach it");
    let op = w.op.clone();
    let place = |host: &str| {
        let path = format!("/api/admin/queue/{id}/place");
        let body = json!({"host_id": host});
        let op = op.clone();
        async move { op.post(&path, body).await }
    };
    let unchanged = |row: QueueRow| {
        assert_eq!((row.closed_at, row.vm_id, row.attempts), (None, None, 0));
    };
    // Refusals, each with nothing changed.
    for (host, status, code) in [
        (
            inactive.id.as_str(),
            StatusCode::CONFLICT,
            "host_not_active",
        ),
        (
            other_kind.id.as_str(),
            StatusCode::CONFLICT,
            "wrong_gpu_type",
        ),
        ("no-such-host", StatusCode::CONFLICT, "unknown_host"),
        (
            no_relay.id.as_str(),
            StatusCode::CONFLICT,
            "host_unreachable",
        ),
    ] {
        let r = place(host).await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (status, Some(code)),
            "{}",
            r.text()
        );
        unchanged(queue_row(&w, &id).await);
    }
    let r = w
        .customer
        .post(
            &format!("/api/admin/queue/{id}/place"),
            json!({"host_id": boxed.id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r =
        w.op.post("/api/admin/queue/nope/place", json!({"host_id": boxed.id}))
            .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    unchanged(queue_row(&w, &id).await);
    assert!(w.all_vms().await.is_empty());
    assert!(w.agents.calls(Op::Create).is_empty());

    // The operator places it on the owner's box: the drain's steps, closed by hand.
    let r = place(&boxed.id).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let vm_id = r.json()["id"].as_str().unwrap().to_owned();
    let row = queue_row(&w, &id).await;
    assert_eq!(
        (
            row.close_reason.as_deref(),
            row.vm_id.as_deref(),
            row.attempts
        ),
        (Some("placed_by_operator"), Some(vm_id.as_str()), 1)
    );
    let vm = w.vm(&vm_id).await;
    assert_eq!(
        (vm.user_sub.as_str(), vm.host_id.as_deref(), vm.status),
        (
            w.customer.sub.as_str(),
            Some(boxed.id.as_str()),
            VmStatus::Running
        )
    );
    let audit = w.audits("queue.placed_by_operator").await;
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].actor_sub.as_deref(), Some(w.op.sub.as_str()));

    // A closed row is refused; so is a host holding a live instance.
    let r = place(&boxed.id).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_queued"))
    );
    let second = queued(&w, &w.customer, "spark-1").await;
    let r =
        w.op.post(
            &format!("/api/admin/queue/{second}/place"),
            json!({"host_id": boxed.id}),
        )
        .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("host_occupied")),
        "{}",
        r.text()
    );
    let row = queue_row(&w, &second).await;
    assert_eq!(
        (row.closed_at, row.vm_id, row.claimed_until),
        (None, None, None)
    );
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
    assert_eq!(w.all_vms().await.len(), 1);

    // Closing by hand: a reason is required; then closed, audited, and not again.
    let close = format!("/api/admin/queue/{second}/close");
    let r = w.op.post(&close, json!({"reason": "  "})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(queue_row(&w, &second).await.closed_at.is_none());
    let r = w.customer.post(&close, json!({"reason": "mine"})).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(queue_row(&w, &second).await.closed_at.is_none());
    let r =
        w.op.post(&close, json!({"reason": "placed on spark-9 by hand"}))
            .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let row = queue_row(&w, &second).await;
    assert_eq!(row.close_reason.as_deref(), Some("closed_by_operator"));
    let r = w.op.post(&close, json!({"reason": "again"})).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("not_queued"))
    );
    let audit = w.audits("queue.closed_by_operator").await;
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].details["reason"], "placed on spark-9 by hand");
}

async fn admin_queue_page_lists_open_rows_with_place_and_close(w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    let page = w.op.page("/admin/queue").await;
    assert!(page.contains(&format!("queued-{id}")), "{page}");
    assert!(page.contains("customer@example.com"));
    assert!(page.contains(&format!("/admin/queue/{id}/place")));
    assert!(page.contains(&format!("/admin/queue/{id}/close")));
    assert!(
        page.contains("href=\"/admin/queue\""),
        "linked from the admin nav"
    );
    assert_eq!(
        w.customer.get("/admin/queue").await.status,
        StatusCode::FORBIDDEN
    );
    // The forms carry the same rules.
    let r =
        w.op.post_form(
            &format!("/admin/queue/{id}/close"),
            &[("reason", "duplicate")],
        )
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    assert_eq!(
        queue_row(&w, &id).await.close_reason.as_deref(),
        Some("closed_by_operator")
    );
    // The customer's Cancel button.
    let id = queued(&w, &w.customer, "spark-1").await;
    let r = w
        .customer
        .post_form(&format!("/instances/queue/{id}/cancel"), &[])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    assert_eq!(
        queue_row(&w, &id).await.close_reason.as_deref(),
        Some("cancelled")
    );
}

/// Under `byo up` its customers rent its test hosts (issue #42): a local platform's only
/// hosts are test hosts. The setting is `byo up`'s own, set in code; the installation here
/// (its default) keeps linux-test for staff (the scenario below).
async fn byo_ups_customers_rent_its_test_hosts(w: World) {
    w.host(
        "spark-1",
        Spec {
            gpu_type: "linux-test",
            ..Spec::default()
        },
    )
    .await;
    let mut config = (*w.app.state.config).clone();
    config.test_hosts_for_everyone = true;
    let mut up = w.app.state.clone();
    up.config = std::sync::Arc::new(config);
    let customer = w.customer.on(byo_server::router(up));
    let offered = |page: &str| page.contains("value=\"linux-test\"");
    assert!(!offered(&w.customer.page("/instances").await));
    assert!(
        offered(&customer.page("/instances").await),
        "the form offers the test hosts"
    );
    let key = w.add_key(&w.customer).await;
    let r = customer
        .post(
            "/api/vms",
            json!({"gpu_type": "linux-test", "ssh_key_id": key}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(w.all_vms().await.len(), 1);
}

async fn staff_only_refused_to_customers_at_rent_time(w: World) {
    let host = w
        .host(
            "spark-1",
            Spec {
                gpu_type: "linux-test",
                ..Spec::default()
            },
        )
        .await;
    // The API refuses, not only the page's menu; nothing written, nothing queued.
    let key = w.add_key(&w.customer).await;
    let r = w.create(&w.customer, "linux-test", &key).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("staff_only")),
        "{}",
        r.text()
    );
    assert!(w.all_vms().await.is_empty());
    assert!(
        w.customer
            .get("/api/queue")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(w.agents.calls(Op::Create).is_empty());
    // The page's form posts to the same rule.
    let r = w
        .customer
        .post_form(
            "/instances",
            &[("gpu_type", "linux-test"), ("ssh_key_id", &key)],
        )
        .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(w.all_vms().await.is_empty());
    // Staff may.
    let op_key = w.add_key(&w.op).await;
    let r = w.create(&w.op, "linux-test", &op_key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let vm_id = r.json()["instance"]["id"].as_str().unwrap().to_owned();

    // Queued while staff, drained after the grant went: held, not placed.
    let staff = w.app.operator("staff@example.com").await;
    let id = queued(&w, &staff, "linux-test").await;
    w.db()
        .revoke_role(&staff.sub, Role::Operator)
        .await
        .unwrap();
    assert_eq!(w.delete(&w.op, &vm_id).await.status, StatusCode::OK);
    let report = drain(&w).await;
    assert_eq!((report.placed, report.held), (0, 1), "{report}");
    let row = queue_row(&w, &id).await;
    assert_eq!((row.closed_at, row.vm_id), (None, None));
    assert!(row.last_error.as_deref().unwrap().contains("staff only"));
    assert_eq!(w.agents.calls(Op::Create).len(), 1);
    assert!(w.db().live_vms_on_host(&host.id).await.unwrap().is_empty());
}

async fn per_account_limit_counts_live_and_queued(w: World) {
    assert_eq!(w.app.state.config.instances.max_per_account, 2);
    w.host("spark-1", Spec::default()).await;
    let running = w.running().await;
    // One live, one queued: the limit.
    let q = queued(&w, &w.customer, "spark-1").await;
    let key = w.add_key_once(&w.customer).await;
    let audits = w.db().audit_log(1000).await.unwrap().len();
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("instance_limit")),
        "{}",
        r.text()
    );
    assert_eq!(w.all_vms().await.len(), 1);
    assert_eq!(
        w.customer
            .get("/api/queue")
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(w.db().audit_log(1000).await.unwrap().len(), audits);
    // Another account is not held by it.
    assert_eq!(
        w.create(&w.other, "spark-1", &w.add_key(&w.other).await)
            .await
            .status,
        StatusCode::ACCEPTED
    );
    // Cancelling the queued one makes room; a free host takes a create directly, and
    // that counts too.
    assert_eq!(
        w.customer.delete(&format!("/api/queue/{q}")).await.status,
        StatusCode::NO_CONTENT
    );
    w.host("spark-2", Spec::default()).await;
    w.host("spark-3", Spec::default()).await;
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(
        r.json()["error"].as_str(),
        Some("instance_limit"),
        "{}",
        r.text()
    );
    assert_eq!(w.agents.calls(Op::Create).len(), 2);
    // A deleted instance no longer counts.
    assert_eq!(
        w.delete(&w.customer, &running.id).await.status,
        StatusCode::OK
    );
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
}

async fn per_account_limit_holds_under_racing_creates(w: World) {
    // No host is free, so every create queues; eight at once may make only two.
    let key = w.add_key(&w.customer).await;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let user = w.customer.clone();
            let key = key.clone();
            tokio::spawn(async move {
                user.post(
                    "/api/vms",
                    json!({"gpu_type": "spark-1", "ssh_key_id": key}),
                )
                .await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap().status);
    }
    let queued = statuses
        .iter()
        .filter(|s| **s == StatusCode::ACCEPTED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!((queued, refused), (2, 6), "{statuses:?}");
    assert_eq!(
        w.customer
            .get("/api/queue")
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

async fn the_drain_is_a_job_nudged_when_capacity_frees(w: World) {
    let jobs = byo_server::app::jobs::registry();
    let job = jobs
        .iter()
        .find(|j| j.name == "queue-drain")
        .expect("registered");
    assert_eq!(job.every, queue_drain::DRAIN_EVERY);
    // The server's own hook (not the test world's recorder) hands out the job's trigger.
    let state = w
        .app
        .state
        .clone()
        .with_drain(Arc::new(byo_server::queue::NudgeDrain::default()));
    let driver = byo_server::app::jobs::JobDriver::new(state.clone(), jobs);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tasks = driver.spawn(stop_rx);
    // Let the first (immediate) ticks pass, then queue and free a host.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = queued(&w, &w.customer, "spark-1").await;
    w.host("spark-1", Spec::default()).await;
    state.drain.capacity_freed("spark-1", "any").await;
    let mut placed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if queue_row(&w, &id).await.closed_at.is_some() {
            placed = true;
            break;
        }
    }
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    assert!(
        placed,
        "the nudge ran the drain well before its 30 s period"
    );
    assert_eq!(
        queue_row(&w, &id).await.close_reason.as_deref(),
        Some("placed")
    );
    let runs = w.db().job_runs("queue-drain", 10).await.unwrap();
    assert!(
        runs.iter()
            .any(|r| r.summary.as_deref().unwrap_or("").starts_with("placed 1")),
        "{runs:?}"
    );
}

async fn expire(w: &World) -> u64 {
    queue_drain::expire_once(&w.app.state).await.unwrap()
}

/// Issue #39 (2): a queued create lapses at its `expires_at` (72 hours by default): the
/// customer sees when while it waits; one second short nothing moves; at it no drain
/// places it even with a host free, the expire-queue job closes it `expired`, audited with
/// what the customer is to be told, and the customer's list says what became of it.
async fn e2_a_queued_create_no_host_took_expires_and_its_customer_is_told(mut w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    let queued_at = w.clock.now();
    let row = queue_row(&w, &id).await;
    assert_eq!(row.expires_at, queued_at + TimeDelta::hours(72));
    let mine = w.customer.get("/api/queue").await.json();
    assert_eq!(
        mine[0]["expires_at"]
            .as_str()
            .map(|t| t.parse::<DateTime<Utc>>().unwrap()),
        Some(row.expires_at)
    );
    assert!(w.customer.page("/instances").await.contains("Keep waiting"));
    // Another customer's row, queued later, lapses later.
    let later = queued(&w, &w.other, "spark-1").await;

    w.clock
        .advance(row.expires_at - TimeDelta::seconds(1) - w.clock.now());
    w.sign_in_again().await;
    assert_eq!(expire(&w).await, 0);
    assert!(queue_row(&w, &id).await.closed_at.is_none());

    // At its time a host frees up: the drain leaves the lapsed row and places the next.
    w.clock.advance(TimeDelta::seconds(1));
    let host = w.host("spark-1", Spec::default()).await;
    let report = drain(&w).await;
    assert_eq!(report.placed, 1, "{report}");
    let placed = queue_row(&w, &later).await;
    assert_eq!(placed.close_reason.as_deref(), Some("placed"));
    assert_eq!(
        w.vm(placed.vm_id.as_deref().unwrap())
            .await
            .host_id
            .as_deref(),
        Some(host.id.as_str())
    );
    let lapsed = queue_row(&w, &id).await;
    assert_eq!((lapsed.vm_id, lapsed.attempts), (None, 0), "never tried");

    // The sweep closes it, once.
    assert_eq!(expire(&w).await, 1);
    assert_eq!(expire(&w).await, 0);
    let row = queue_row(&w, &id).await;
    assert_eq!(
        (row.close_reason.as_deref(), row.closed_at),
        (Some("expired"), Some(w.clock.now()))
    );
    let audits = w.audits("queue.expired").await;
    assert_eq!(audits.len(), 1);
    assert_eq!(audits[0].target.as_deref(), Some(id.as_str()));
    assert_eq!(audits[0].actor_sub, None);
    assert_eq!(audits[0].details.0["user_sub"], w.customer.sub.as_str());
    assert_eq!(audits[0].details.0["gpu_type"], "spark-1");
    // The placement is recorded for its customer too.
    let placed_audits = w.audits("queue.placed").await;
    assert_eq!(placed_audits.len(), 1);
    assert_eq!(placed_audits[0].target.as_deref(), Some(later.as_str()));
    assert_eq!(placed_audits[0].details.0["user_sub"], w.other.sub.as_str());
    assert_eq!(
        placed_audits[0].details.0["vm_id"].as_str(),
        placed.vm_id.as_deref()
    );

    // Both reach their customer as notices (issue #38, 3), once each: the expiry to the
    // customer, the placement with its ssh line to the other.
    let mine = w.customer.get("/api/me/notices").await.json();
    let recent = mine["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 1, "{mine}");
    assert_eq!(recent[0]["kind"], "queue.expired");
    assert_eq!(recent[0]["subject"], "Your queued spark-1 instance expired");
    assert_eq!(recent[0]["to"], w.customer.email.as_str());
    let theirs = w.other.get("/api/me/notices").await.json();
    let recent = theirs["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 1, "{theirs}");
    assert_eq!(recent[0]["kind"], "queue.placed");
    let vm = w.vm(placed.vm_id.as_deref().unwrap()).await;
    let body = recent[0]["body"].as_str().unwrap();
    assert!(body.contains(&vm.name), "{theirs}");
    assert!(
        body.contains(&format!(
            "Log in with: ssh -o HostKeyAlias=byo-{} root@",
            vm.id
        )),
        "{theirs}"
    );
    assert_eq!(expire(&w).await, 0);
    assert_eq!(w.db().notices(None, 10).await.unwrap().len(), 2);

    // The customer's open list is empty; what ended says how, on the API and the page.
    assert!(
        w.customer
            .get("/api/queue")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
    let ended = w.customer.get("/api/queue/ended").await.json();
    assert_eq!(ended.as_array().unwrap().len(), 1, "{ended}");
    assert_eq!(
        (ended[0]["id"].as_str(), &ended[0]["ending"]),
        (Some(id.as_str()), &json!("expired"))
    );
    let page = w.customer.page("/instances").await;
    assert!(page.contains(&format!("queue-ended-{id}")), "{page}");
    assert!(page.contains("Expired: no host of that kind was free in time"));
    let theirs = w.other.get("/api/queue/ended").await.json();
    assert_eq!(
        (theirs[0]["ending"].as_str(), theirs[0]["vm_id"].as_str()),
        (Some("placed"), placed.vm_id.as_deref())
    );
    assert_eq!(theirs.as_array().unwrap().len(), 1, "only their own");
    // A week on, the ended list forgets it.
    w.clock
        .advance(TimeDelta::days(queued::ENDED_SHOWN_DAYS) + TimeDelta::seconds(1));
    w.sign_in_again().await;
    assert!(
        w.customer
            .get("/api/queue/ended")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
}

/// A lapsed row whose attempt is still being created (a silent host) is not closed under
/// it: the heartbeat settles the attempt first. Once it failed, the sweep closes the row.
async fn e2_a_lapsed_row_with_a_create_in_flight_waits_for_its_heartbeat(w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    let host = w.host("spark-1", Spec::default()).await;
    w.agents.then(Op::Create, agents::Answer::Hang);
    let report = drain(&w).await;
    assert_eq!(report.pending, 1, "{report}");
    let row = queue_row(&w, &id).await;
    w.clock
        .advance(row.expires_at + TimeDelta::minutes(1) - w.clock.now());
    assert_eq!(
        expire(&w).await,
        0,
        "an attempt in flight holds the row open"
    );
    assert!(queue_row(&w, &id).await.closed_at.is_none());
    // The host beats without it, past the create's deadline: the attempt fails.
    assert!(w.beat(&host, &[]).await.is_success());
    let vm = w.vm(row.vm_id.as_deref().unwrap()).await;
    assert!(vm.creation_failed_at.is_some(), "{vm:?}");
    assert_eq!(expire(&w).await, 1);
    assert_eq!(
        queue_row(&w, &id).await.close_reason.as_deref(),
        Some("expired")
    );
}

/// "Keep waiting" moves the expiry the configured age from now, for the customer's own
/// open row only; anyone else's, an unknown one or a closed one is 404 and nothing moves.
/// An operator cannot place a lapsed row.
async fn e2_keep_waiting_moves_the_expiry_and_nothing_else(mut w: World) {
    let id = queued(&w, &w.customer, "spark-1").await;
    let before = queue_row(&w, &id).await;
    w.clock.advance(TimeDelta::hours(71));
    w.sign_in_again().await;
    // Refusals first, each leaving the row as it was.
    let r = w.other.post_empty(&format!("/api/queue/{id}/extend")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    let r = w.op.post_empty(&format!("/api/queue/{id}/extend")).await;
    assert_eq!(
        r.status,
        StatusCode::NOT_FOUND,
        "an operator's own queue is empty"
    );
    let r = w.customer.post_empty("/api/queue/no-such-row/extend").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(queue_row(&w, &id).await.expires_at, before.expires_at);
    assert!(w.audits("queue.extended").await.is_empty());

    let r = w
        .customer
        .post_empty(&format!("/api/queue/{id}/extend"))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let until = w.clock.now() + TimeDelta::hours(72);
    assert_eq!(
        r.json()["expires_at"]
            .as_str()
            .map(|t| t.parse::<DateTime<Utc>>().unwrap()),
        Some(until)
    );
    assert_eq!(r.json()["position"], 1);
    let row = queue_row(&w, &id).await;
    assert_eq!(row.expires_at, until);
    assert_eq!(
        (row.closed_at, row.attempts, row.created_at),
        (None, 0, before.created_at),
        "its place in line is kept"
    );
    assert_eq!(w.audits("queue.extended").await.len(), 1);
    // Past the first expiry the sweep leaves it.
    w.clock.advance(TimeDelta::hours(2));
    w.sign_in_again().await;
    assert_eq!(expire(&w).await, 0);
    // The page's button does the same.
    let r = w
        .customer
        .post_form(&format!("/instances/queue/{id}/extend"), &[])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    assert_eq!(
        queue_row(&w, &id).await.expires_at,
        w.clock.now() + TimeDelta::hours(72)
    );

    // Lapsed: an operator cannot place it, and nothing changes.
    let host = w.host("spark-1", Spec::default()).await;
    w.clock
        .advance(queue_row(&w, &id).await.expires_at - w.clock.now());
    w.sign_in_again().await;
    let r =
        w.op.post(
            &format!("/api/admin/queue/{id}/place"),
            json!({"host_id": host.id}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(r.json()["error"], "expired");
    assert!(w.all_vms().await.is_empty());
    assert!(w.agents.calls(Op::Create).is_empty());
    // Closed: keep waiting is 404 and the row stays closed.
    assert_eq!(expire(&w).await, 1);
    let r = w
        .customer
        .post_empty(&format!("/api/queue/{id}/extend"))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let row = queue_row(&w, &id).await;
    assert_eq!(row.close_reason.as_deref(), Some("expired"));
    assert_eq!(row.expires_at, w.clock.now());
}

/// `[instances] queue_expires_after_hours` loads from the file and the environment, 72 when
/// absent; 0 and past 30 days are refused at load, saying which setting.
#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
fn the_queue_age_is_a_setting_checked_at_load() {
    use byo_server::config::Config;
    figment::Jail::expect_with(|jail| {
        assert_eq!(
            Config::load(None)
                .unwrap()
                .instances
                .queue_expires_after_hours,
            72
        );
        jail.create_file("byo.toml", "[instances]\nqueue_expires_after_hours = 24\n")?;
        let c = Config::load(Some(std::path::Path::new("byo.toml"))).expect("loads");
        assert_eq!(c.instances.queue_expires_after_hours, 24);
        for bad in ["0", "721"] {
            jail.set_env("BYO_INSTANCES__QUEUE_EXPIRES_AFTER_HOURS", bad);
            let err = Config::load(None).unwrap_err().to_string();
            assert!(err.contains("queue_expires_after_hours"), "{bad}: {err}");
        }
        Ok(())
    });
}

/// The age is `[instances] queue_expires_after_hours`: a row queued under a shorter one
/// lapses then; the job is registered with its period.
async fn e2_the_queue_age_is_configured_and_the_sweep_is_a_job(mut w: World) {
    let jobs = byo_server::app::jobs::registry();
    let job = jobs
        .iter()
        .find(|j| j.name == queue_drain::EXPIRE_QUEUE)
        .expect("registered");
    assert_eq!(job.every, queue_drain::EXPIRE_EVERY);
    let mut config = (*w.app.state.config).clone();
    config.instances.queue_expires_after_hours = 2;
    w.app.state.config = Arc::new(config);
    let key = w.add_key_once(&w.customer).await;
    let q = queued::enqueue(&w.app.state, &w.customer.sub, "spark-1", &key)
        .await
        .unwrap();
    assert_eq!(q.queued.expires_at, w.clock.now() + TimeDelta::hours(2));
    w.clock.advance(TimeDelta::hours(2));
    assert_eq!(expire(&w).await, 1);
    assert_eq!(
        queue_row(&w, &q.queued.id).await.close_reason.as_deref(),
        Some("expired")
    );
}

with_world!(
    e2_a_queued_create_no_host_took_expires_and_its_customer_is_told,
    e2_a_lapsed_row_with_a_create_in_flight_waits_for_its_heartbeat,
    e2_keep_waiting_moves_the_expiry_and_nothing_else,
    e2_the_queue_age_is_configured_and_the_sweep_is_a_job,
    e2_step58_a_create_with_no_free_host_queues_with_no_host,
    e2_step62_the_drain_stamps_host_and_name_once_a_host_accepted,
    e2_refused_host_is_benched_and_the_drain_moves_on,
    e2_a_held_batch_does_not_stop_the_run_claiming_its_kind,
    e2_a_row_whose_create_is_in_flight_is_not_claimed_again,
    e2_an_unreadable_2xx_is_accepted_never_a_refusal,
    e2_skipped_host_is_not_benched,
    e2_billing_is_rechecked_live,
    e2_a_silent_host_leaves_the_row_for_its_heartbeat_and_no_other_host_is_tried,
    e2_concurrent_drainers_never_place_twice,
    e2_a_batchs_hosts_are_asked_at_once_and_a_silent_one_holds_up_no_other,
    e0_caller4_operator_places_a_queued_vm,
    admin_queue_page_lists_open_rows_with_place_and_close,
    staff_only_refused_to_customers_at_rent_time,
    byo_ups_customers_rent_its_test_hosts,
    e2_a_run_stops_claiming_a_kind_with_no_free_host,
    per_account_limit_counts_live_and_queued,
    per_account_limit_holds_under_racing_creates,
    the_drain_is_a_job_nudged_when_capacity_frees,
);
