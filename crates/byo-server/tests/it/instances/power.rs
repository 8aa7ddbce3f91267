//! Start, stop and reboot.

use crate::instances::pages::location;
use crate::instances::world::*;
use crate::with_world;

/// Start, stop, reboot: the row moves only once the host carried it out; every refusal
/// changes nothing.
async fn e1_power_changes_reach_the_host_and_move_the_row_only_when_done(w: World) {
    w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    let power = |user: User, action: &'static str| {
        let path = format!("/api/vms/{}/state", vm.id);
        async move { user.post(&path, json!({"action": action})).await }
    };
    let r = power(w.customer.clone(), "stop").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["status"], "stopped");
    assert_eq!(w.vm(&vm.id).await.status, VmStatus::Stopped);
    assert_eq!(w.agents.calls(Op::Power).len(), 1);
    let r = power(w.customer.clone(), "start").await;
    assert_eq!(
        (r.status, w.vm(&vm.id).await.status),
        (StatusCode::OK, VmStatus::Running)
    );
    // The page's buttons go the same way.
    let page = w.customer.page("/instances").await;
    assert!(page.contains(&format!("/instances/{}/state", vm.id)) && page.contains(">Stop<"));
    let r = w
        .customer
        .post_form(
            &format!("/instances/{}/state", vm.id),
            &[("action", "stop")],
        )
        .await;
    assert!(location(&r).starts_with("/instances"));
    assert_eq!(w.vm(&vm.id).await.status, VmStatus::Stopped);
    assert!(w.customer.page("/instances").await.contains(">Start<"));
    let r = power(w.customer.clone(), "start").await;
    assert_eq!(r.status, StatusCode::OK);

    // Refusals: someone else's (404, host not asked), a host that refuses (502) or is silent
    // (504): the row keeps its status.
    let asked = w.agents.calls(Op::Power).len();
    let r = power(w.other.clone(), "stop").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        w.agents.calls(Op::Power).len(),
        asked,
        "the host was asked for someone else"
    );
    w.answer_deletes(Answer::Refuse);
    let r = power(w.customer.clone(), "stop").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    // Our words, not the host's "lxd: the instance is busy" (issue #36, 8).
    let said = r.json()["message"].as_str().unwrap().to_owned();
    assert!(
        said == "the host refused: the host could not carry it out" && !said.contains("lxd"),
        "{said}"
    );
    w.answer_deletes(Answer::Unreachable);
    let r = power(w.customer.clone(), "reboot").await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.text());
    assert_eq!(w.vm(&vm.id).await.status, VmStatus::Running);
    let r = power(w.customer.clone(), "hibernate").await;
    assert!(r.status.is_client_error());

    // A deleted instance cannot be started again.
    w.answer_deletes(Answer::Ok);
    assert_eq!(w.delete(&w.customer, &vm.id).await.status, StatusCode::OK);
    let r = power(w.customer.clone(), "start").await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(w.vm(&vm.id).await.status, VmStatus::Deleted);
}

/// L4: on a pair the customer's reboot is the pair's reboot — the agent's one host call
/// (node1 first, both deferred: 202), not the container's restart — and /admin's button is
/// the same call; a single Spark's reboot stays the container's. Audited as `host.reboot`
/// with who pressed it; a host that does not answer changes nothing and records nothing.
async fn l4_a_pairs_reboot_is_one_call_for_the_customer_and_admin(w: World) {
    let h = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;
    let press = |action: &'static str| {
        let (user, path) = (w.customer.clone(), format!("/api/vms/{}/state", vm.id));
        async move { user.post(&path, json!({"action": action})).await }
    };
    let calls = || {
        (
            w.agents.calls(Op::Power).len(),
            w.agents.calls(Op::Reboot).len(),
        )
    };
    let node = |index: i32| byo_db::hosts::NewHostNode {
        host_id: &h.id,
        index,
        machine_id: None,
        hardware_id: if index == 0 { "hw-0" } else { "hw-1" },
        fingerprint: &serde_json::Value::Null,
        rails: &serde_json::Value::Null,
    };
    // A single Spark (no host_nodes row, then the one enrolment writes): the container's
    // restart.
    let r = press("reboot").await;
    assert_eq!(
        (r.status, calls()),
        (StatusCode::OK, (1, 0)),
        "{}",
        r.text()
    );
    w.db()
        .insert_host_node(node(0), w.clock.now())
        .await
        .unwrap();
    let r = press("reboot").await;
    assert_eq!(
        (r.status, calls()),
        (StatusCode::OK, (2, 0)),
        "{}",
        r.text()
    );
    // node1, a second row: a pair. Its reboot is the host's; the instance stays running.
    w.db()
        .insert_host_node(node(1), w.clock.now())
        .await
        .unwrap();
    let r = press("reboot").await;
    assert_eq!(
        (r.status, calls()),
        (StatusCode::OK, (2, 1)),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["status"], "running");
    // A stop and a start are still the instance's own.
    let r = press("stop").await;
    assert_eq!(
        (r.status, calls()),
        (StatusCode::OK, (3, 1)),
        "{}",
        r.text()
    );
    assert_eq!(press("start").await.status, StatusCode::OK);
    // /admin's button: the same call, and the page says what happens.
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    assert!(
        page.contains("/reboot\""),
        "the button is on the host's page"
    );
    let r =
        w.op.post_form(&format!("/admin/hosts/{}/reboot", h.id), &[])
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.text()
            .contains("node1 is rebooting; node0 goes down in 3 s"),
        "the page says what happens: {}",
        r.text()
    );
    assert_eq!(calls(), (4, 2));
    let audits = w.audits("host.reboot").await;
    let mut by: Vec<&str> = audits
        .iter()
        .map(|a| a.details.0["by"].as_str().unwrap())
        .collect();
    by.sort();
    assert_eq!(by, ["customer", "operator"]);
    assert_eq!(audits[0].details.0["satellites"][0]["node"], 1);
    // A host that does not answer: 504, the row as it was, nothing audited.
    w.agents.answer(
        Op::Reboot,
        agents::Answer::unreachable("connection refused"),
    );
    let r = press("reboot").await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.text());
    assert_eq!(w.vm(&vm.id).await.status, VmStatus::Running);
    assert_eq!(w.audits("host.reboot").await.len(), 2);
}

with_world!(
    e1_power_changes_reach_the_host_and_move_the_row_only_when_done,
    l4_a_pairs_reboot_is_one_call_for_the_customer_and_admin,
);
