//! Start, stop and reboot.

use crate::pages::location;
use crate::with_world;
use crate::world::*;

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
    assert!(r.json()["message"].as_str().unwrap().contains("busy"));
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

with_world!(e1_power_changes_reach_the_host_and_move_the_row_only_when_done,);
