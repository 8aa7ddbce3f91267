//! E1: the dashboard create.

use crate::instances::world::*;
use crate::with_world;

async fn e1_create_stamps_created_at_before_the_host_is_contacted(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let key = w.add_key(&w.customer).await;
    let committed = w.clock.now();
    // The host takes a while: the clock moves on while it works.
    w.agents.takes(Op::Create, TimeDelta::seconds(40));
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let body = r.json();
    let id = body["instance"]["id"].as_str().unwrap();

    let calls = w.agents.calls(Op::Create);
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.host_id, host.id);
    assert_eq!(call.at, committed);
    // When the host was contacted, the row was already there: host, name and SSH name
    // written together, created_at stamped.
    let at_contact = call.row.as_ref().expect("the row precedes dispatch");
    assert_eq!(at_contact.id, id);
    assert_eq!(at_contact.host_id.as_deref(), Some(host.id.as_str()));
    assert_eq!(at_contact.created_at, committed);
    assert_eq!(at_contact.status, VmStatus::Creating);
    assert_eq!(
        at_contact.ssh_hostname.as_deref(),
        Some(format!("{}.spark-1.ssh.localhost", call.name).as_str())
    );

    let row = w.vm(id).await;
    assert_eq!(
        row.created_at, committed,
        "billing runs from the commitment"
    );
    assert!(w.clock.now() > committed);
    assert_eq!(
        (row.status.as_str(), row.ssh_port, row.creation_failed_at),
        ("running", Some(2201), None)
    );
    // The advisories are reported, not fatal (47–48).
    assert_eq!(body["gpu_check"]["ok"], false);
    assert_eq!(body["instance"]["status"], "running");
    assert_eq!(
        body["instance"]["ssh_hostname"].as_str(),
        row.ssh_hostname.as_deref()
    );
    // The customer sees it; nobody else does.
    let mine = w.customer.get("/api/vms").await.json();
    assert_eq!(mine.as_array().unwrap().len(), 1);
    assert_eq!(
        w.customer.get(&format!("/api/vms/{id}")).await.status,
        StatusCode::OK
    );
    assert_eq!(
        w.other.get(&format!("/api/vms/{id}")).await.status,
        StatusCode::NOT_FOUND
    );
    assert!(
        w.other
            .get("/api/vms")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
}

async fn e1_a_host_holding_a_live_row_is_never_picked(w: World) {
    // Every host that must never be picked.
    let never = [
        (
            "spark-1",
            Spec {
                active: false,
                ..Spec::default()
            },
        ),
        (
            "spark-2",
            Spec {
                active: false,
                prepared: false,
                ..Spec::default()
            },
        ),
        (
            "spark-3",
            Spec {
                retired: true,
                ..Spec::default()
            },
        ),
        (
            "spark-4",
            Spec {
                gpu_type: "spark-2",
                ..Spec::default()
            },
        ),
        (
            "spark-5",
            Spec {
                reachable: false,
                ..Spec::default()
            },
        ),
        (
            "spark-6",
            Spec {
                placement: "dedicated",
                ..Spec::default()
            },
        ),
        (
            "spark-7",
            Spec {
                dedicated_to: Some(w.other.sub.clone()),
                ..Spec::default()
            },
        ),
    ];
    for (slug, spec) in never {
        w.host(slug, spec).await;
    }
    let key = w.add_key(&w.customer).await;
    let audits_before = w.db().audit_log(1000).await.unwrap().len();
    // No host may take it: it is queued (E2, step 58) with no host, and no instance row.
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let queued = r.json()["queued"]["id"].as_str().unwrap().to_owned();
    assert!(w.all_vms().await.is_empty(), "no instance row was written");
    assert_eq!(
        w.db().audit_log(1000).await.unwrap().len(),
        audits_before + 1,
        "only queue.queued"
    );
    assert!(
        w.agents.calls(Op::Create).is_empty(),
        "no host was contacted"
    );
    let r = w.customer.delete(&format!("/api/queue/{queued}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);

    // A dedicated host serves its own user, first.
    let other_key = w.add_key(&w.other).await;
    let r = w.create(&w.other, "spark-1", &other_key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let dedicated = w
        .db()
        .host(&w.agents.calls(Op::Create)[0].host_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(dedicated.slug, "spark-7");

    // One free shared host: the first create takes it, and while its row is live the
    // host is never picked again.
    let free = w.host("spark-8", Spec::default()).await;
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let first = r.json()["instance"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        w.vm(&first).await.host_id.as_deref(),
        Some(free.id.as_str())
    );
    assert!(!w.pickable(&free.id).await);
    let live_before = w.all_vms().await.len();
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "queued: {}", r.text());
    assert_eq!(
        w.all_vms().await.len(),
        live_before,
        "no instance row was written"
    );
    assert_eq!(w.agents.calls(Op::Create).len(), 2);
    let queued = r.json()["queued"]["id"].as_str().unwrap().to_owned();
    let r = w.customer.delete(&format!("/api/queue/{queued}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);

    // The rule binds every writer: a second live row on that host is refused by the schema.
    let err = w
        .db()
        .create_vm(
            byo_db::vms::NewVm {
                user_sub: &w.customer.sub,
                host_id: Some(&free.id),
                name: "vm-intruder",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            w.clock.now(),
        )
        .await
        .unwrap_err();
    assert!(err.is_constraint("vms_one_live_per_host"), "{err:?}");

    // Deleted, the host is free again.
    assert_eq!(w.delete(&w.customer, &first).await.status, StatusCode::OK);
    assert!(w.pickable(&free.id).await);
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
}

async fn e1_refusals_before_any_host_write_nothing(w: World) {
    w.host("spark-1", Spec::default()).await;
    let theirs = w.add_key(&w.other).await;
    let mine = w.add_key(&w.customer).await;
    for (key, gpu, code) in [
        (theirs.as_str(), "spark-1", "unknown_ssh_key"),
        ("no-such-key", "spark-1", "unknown_ssh_key"),
        (mine.as_str(), "Spark 1; drop", "invalid_gpu_type"),
    ] {
        let r = w.create(&w.customer, gpu, key).await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code))
        );
    }
    assert!(w.all_vms().await.is_empty());
    assert!(w.agents.calls(Op::Create).is_empty());
    assert!(w.audits("vm.create").await.is_empty());
}

async fn e1_a_host_that_never_answers_marks_creation_failed_and_bills_nothing(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let key = w.add_key(&w.customer).await;
    for (answer, status, code) in [
        (Answer::Hang, StatusCode::GATEWAY_TIMEOUT, "host_silent"),
        (
            Answer::Unreachable,
            StatusCode::GATEWAY_TIMEOUT,
            "host_unreachable",
        ),
        (Answer::Refuse, StatusCode::BAD_GATEWAY, "host_refused"),
    ] {
        w.answer_creates(answer);
        w.clock.advance(TimeDelta::minutes(1));
        let started = w.clock.now();
        let contacts = w.agents.calls(Op::Create).len();
        // While the host is still working on it, the instance cannot be deleted.
        let meanwhile = async {
            if answer != Answer::Hang {
                return;
            }
            // The host has been contacted (so the row is written) and is hanging.
            w.agents.contacted(Op::Create, contacts + 1).await;
            let creating = w
                .all_vms()
                .await
                .into_iter()
                .find(|v| v.status == VmStatus::Creating);
            let creating = creating.expect("the row is written while the host works");
            let r = w.delete(&w.customer, &creating.id).await;
            assert_eq!(
                (r.status, r.json()["error"].as_str()),
                (StatusCode::CONFLICT, Some("still_creating"))
            );
            assert_eq!(w.vm(&creating.id).await.delete_requested_at, None);
        };
        let (r, ()) = tokio::join!(w.create(&w.customer, "spark-1", &key), meanwhile);
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (status, Some(code)),
            "{answer:?}: {}",
            r.text()
        );
        if answer == Answer::Hang {
            // Silence is not a refusal: the host may still be making it, so the row stays
            // `creating` (and its host occupied) until the host's heartbeat settles it.
            assert!(r.text().contains("never billed"), "{}", r.text());
            let row = w
                .all_vms()
                .await
                .into_iter()
                .find(|v| v.status == VmStatus::Creating)
                .expect("the row stays creating");
            assert!(!w.pickable(&host.id).await, "its host stays occupied");
            assert_eq!(w.beat(&host, &[]).await, StatusCode::NO_CONTENT);
            assert_eq!(
                w.vm(&row.id).await.status,
                VmStatus::Creating,
                "inside the create's deadline, an absence settles nothing"
            );
            w.clock.advance(TimeDelta::seconds(1));
            assert_eq!(w.beat(&host, &[]).await, StatusCode::NO_CONTENT);
        } else {
            assert!(r.text().contains("nothing is billed"), "{}", r.text());
        }
        if answer == Answer::Refuse {
            // Issue #36, 8: the customer hears our words; the agent's own reason, which
            // names the host's insides, is the operators' (the audit, the log, /admin).
            assert!(
                !r.text().contains("SSH map")
                    && r.text().contains("the host could not carry it out"),
                "the agent's reason stays with operators: {}",
                r.text()
            );
            let failed = w.audits("vm.creation_failed").await;
            assert!(
                failed.iter().any(|a| a.details.0["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("the relay refused the SSH map: 403"))),
                "the agent's reason is audited: {failed:?}"
            );
        }
        if answer == Answer::Unreachable {
            assert!(!r.text().contains("connection refused"), "{}", r.text());
        }
        let call = w.agents.calls(Op::Create).pop().unwrap();
        let row = w
            .all_vms()
            .await
            .into_iter()
            .find(|v| v.name == call.name)
            .expect("the row was written before dispatch");
        assert_eq!(row.created_at, started);
        assert_eq!(row.creation_failed_at, Some(w.clock.now()));
        assert_eq!((row.status.as_str(), row.deleted_at), ("failed", None));
        // Not live: the host is free again, and the failure is the customer's to see.
        assert!(w.pickable(&host.id).await, "{answer:?}");
        let listed = w.customer.get("/api/vms").await.json();
        assert!(
            listed
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["id"] == row.id.as_str() && v["status"] == "failed")
        );
        // There is nothing to delete, and trying writes nothing.
        let r = w.delete(&w.customer, &row.id).await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (StatusCode::CONFLICT, Some("never_created"))
        );
        assert_eq!(w.vm(&row.id).await.delete_requested_at, None);
    }
    assert!(w.agents.calls(Op::Delete).is_empty());
    assert_eq!(w.audits("vm.creation_failed").await.len(), 3);

    // The host that failed is picked for the next create, which works.
    w.answer_creates(Answer::Ok);
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(w.agents.calls(Op::Create).pop().unwrap().host_id, host.id);
}

/// One instance per host is the host's rule too: a host that answers `host_occupied` (it
/// holds a container the database does not call live) is no capacity to the customer —
/// the create is queued (202), nothing billed, and not the other customer's instance name
/// — while the operators' audit keeps the host's reason, which names it.
async fn e1_a_host_that_already_holds_an_instance_is_no_capacity(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let key = w.add_key(&w.customer).await;
    w.agents.answer(
        Op::Create,
        agents::Answer::Occupied(
            "this host already holds instance vm-orphan1 (one instance per host); nothing was created".into(),
        ),
    );
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert!(r.json()["queued"]["id"].is_string(), "{}", r.text());
    assert!(!r.text().contains("vm-orphan1"), "{}", r.text());
    let call = w.agents.calls(Op::Create).pop().unwrap();
    let row = w
        .all_vms()
        .await
        .into_iter()
        .find(|v| v.name == call.name)
        .unwrap();
    assert_eq!(row.status, VmStatus::Failed);
    assert_eq!(row.creation_failed_at, Some(w.clock.now()));
    let audits = w.audits("vm.creation_failed").await;
    assert_eq!(audits.len(), 1);
    assert!(
        format!("{audits:?}").contains("vm-orphan1"),
        "the operators can see what the host holds: {audits:?}"
    );
    assert!(w.pickable(&host.id).await);
}

with_world!(
    e1_a_host_that_already_holds_an_instance_is_no_capacity,
    e1_create_stamps_created_at_before_the_host_is_contacted,
    e1_a_host_holding_a_live_row_is_never_picked,
    e1_refusals_before_any_host_write_nothing,
    e1_a_host_that_never_answers_marks_creation_failed_and_bills_nothing,
);
