//! admin-vm-action: the operator's delete, from the API and from the operator's page.

use crate::instances::pages::{alert, location, notice, row};
use crate::instances::world::*;
use crate::with_world;

async fn g_admin_vm_action_uses_the_same_path(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let vm = w.running().await;

    // Only an operator may use it; the customer's own route is theirs alone.
    for (user, status) in [
        (&w.customer, StatusCode::FORBIDDEN),
        (&w.other, StatusCode::FORBIDDEN),
    ] {
        assert_eq!(w.admin_delete(user, &vm.id).await.status, status);
    }
    assert_eq!(
        w.delete(&w.other, &vm.id).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(w.delete(&w.op, &vm.id).await.status, StatusCode::NOT_FOUND);
    let row = w.vm(&vm.id).await;
    assert_eq!((row.delete_requested_at, row.deleted_at), (None, None));
    assert!(w.agents.calls(Op::Delete).is_empty());

    // Not confirmed in time: the same 202, the same first fact, the same live row.
    w.answer_deletes(Answer::Hang);
    let requested = w.clock.now();
    let r = w.admin_delete(&w.op, &vm.id).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let row = w.vm(&vm.id).await;
    assert_eq!(
        (row.delete_requested_at, row.deleted_at),
        (Some(requested), None)
    );
    let audit = w.audits("vm.delete_requested").await;
    assert_eq!(audit[0].actor_sub.as_deref(), Some(w.op.sub.as_str()));
    assert_eq!(audit[0].details.0["by"], "operator");

    // Confirmed: the operator's caller owns the second edge too (G.7).
    w.answer_deletes(Answer::Ok);
    w.clock.advance(TimeDelta::seconds(30));
    let r = w.admin_delete(&w.op, &vm.id).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let row = w.vm(&vm.id).await;
    assert_eq!(row.delete_requested_at, Some(requested));
    assert_eq!(row.deleted_at, Some(w.clock.now()));
    let calls = w.agents.calls(Op::Delete);
    assert_eq!(calls.len(), 2);
    assert!(
        calls
            .iter()
            .all(|c| c.host_id == host.id && c.name == vm.name)
    );
    assert_eq!(
        w.drain.calls.lock().unwrap().clone(),
        vec![("spark-1".to_owned(), host.id.clone(), true)]
    );
    assert_eq!(
        w.admin_delete(&w.op, "no-such-vm").await.status,
        StatusCode::NOT_FOUND
    );
}

/// The operator's page: every live instance with its host and owner; the delete goes
/// through admin-vm-action (audited as the operator's, the same two facts); a delete
/// unconfirmed for ten minutes is listed with how long it has waited, and leaves the list
/// once confirmed; refusals show in place and change nothing; nobody else gets in.
async fn the_operators_page_deletes_through_admin_vm_action_and_lists_stuck_deletes(w: World) {
    w.host("spark-1", Spec::default()).await;
    w.host("spark-2", Spec::default()).await;
    let mine = w.running().await;
    let key = w.add_key(&w.other).await;
    let r = w.create(&w.other, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let theirs = w.vm(r.json()["instance"]["id"].as_str().unwrap()).await;
    let mut slugs = Vec::new();
    for vm in [&mine, &theirs] {
        let host = w.db().host(vm.host_id.as_deref().unwrap()).await.unwrap();
        slugs.push(host.unwrap().slug);
    }
    let (mine_slug, theirs_slug) = (slugs[0].clone(), slugs[1].clone());
    assert_ne!(mine_slug, theirs_slug);

    // Nobody else may see it or use it.
    for user in [&w.customer, &w.other] {
        for r in [
            user.get("/admin/instances").await,
            user.get(&format!("/admin/instances/{}/delete", theirs.id))
                .await,
            user.post_form(&format!("/admin/instances/{}/delete", theirs.id), &[])
                .await,
        ] {
            assert_eq!(r.status, StatusCode::FORBIDDEN);
        }
    }
    assert!(w.agents.calls(Op::Delete).is_empty());
    assert_eq!(w.vm(&theirs.id).await.delete_requested_at, None);

    // Every live instance, with its host's slug and its owner's email.
    let page = w.op.page("/admin/instances").await;
    for (vm, slug, email) in [
        (&mine, &mine_slug, "customer@example.com"),
        (&theirs, &theirs_slug, "other@example.com"),
    ] {
        let listed = row(&page, &format!("instance-{}", vm.id)).unwrap();
        assert!(
            listed.contains(&format!("<td class=\"host\">{slug}</td>"))
                && listed.contains(&format!("<td class=\"owner\">{email}</td>"))
                && listed.contains(&vm.name),
            "{listed}"
        );
    }
    assert!(page.contains("id=\"no-stuck\""));

    // The customer's delete is not confirmed: deleting at once, stuck after ten minutes.
    w.answer_deletes(Answer::Hang);
    let requested = w.clock.now();
    assert_eq!(
        w.delete(&w.customer, &mine.id).await.status,
        StatusCode::ACCEPTED
    );
    w.clock.advance(TimeDelta::minutes(9));
    let page = w.op.page("/admin/instances").await;
    assert!(page.contains("id=\"no-stuck\""), "not yet ten minutes");
    assert!(
        row(&page, &format!("instance-{}", mine.id))
            .unwrap()
            .contains("deleting: waiting for the host to confirm")
    );
    w.clock.advance(TimeDelta::minutes(3));
    let page = w.op.page("/admin/instances").await;
    let stuck = row(&page, &format!("stuck-{}", mine.id)).expect("listed as stuck");
    assert!(
        stuck.contains(&format!("<td class=\"host\">{mine_slug}</td>"))
            && stuck.contains("<td class=\"owner\">customer@example.com</td>")
            && stuck.contains("<td class=\"waiting\">12 min</td>")
            && stuck.contains(&format!(
                "<time datetime=\"{}\">",
                requested.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
            )),
        "{stuck}"
    );
    assert!(row(&page, &format!("stuck-{}", theirs.id)).is_none());

    // The operator deletes someone else's instance: a confirmation first, which changes
    // nothing, then admin-vm-action's delete.
    w.answer_deletes(Answer::Ok);
    let confirm =
        w.op.page(&format!("/admin/instances/{}/delete", theirs.id))
            .await;
    assert!(confirm.contains("other@example.com"));
    assert!(confirm.contains(&format!("action=\"/admin/instances/{}/delete\"", theirs.id)));
    assert_eq!(w.vm(&theirs.id).await.delete_requested_at, None);
    let r =
        w.op.post_form(&format!("/admin/instances/{}/delete", theirs.id), &[])
            .await;
    assert_eq!(location(&r), "/admin/instances");
    let closed = w.vm(&theirs.id).await;
    assert_eq!(
        (closed.delete_requested_at, closed.deleted_at),
        (Some(w.clock.now()), Some(w.clock.now()))
    );
    let by: Vec<_> = w
        .audits("vm.delete_requested")
        .await
        .into_iter()
        .filter(|a| a.target.as_deref() == Some(theirs.id.as_str()))
        .collect();
    assert_eq!(by.len(), 1);
    assert_eq!(by[0].actor_sub.as_deref(), Some(w.op.sub.as_str()));
    assert_eq!(by[0].details.0["by"], "operator");
    assert!(
        w.agents
            .calls(Op::Delete)
            .iter()
            .any(|c| c.name == theirs.name)
    );
    let page = w.op.page("/admin/instances").await;
    assert!(
        row(&page, &format!("instance-{}", theirs.id)).is_none(),
        "not live"
    );

    // The stuck one, when its host still does not answer: the API's 202, still stuck,
    // the first request kept.
    w.answer_deletes(Answer::Hang);
    let r =
        w.op.post_form(&format!("/admin/instances/{}/delete", mine.id), &[])
            .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert!(notice(&r.text()).unwrap().contains("has not confirmed it"));
    assert!(row(&r.text(), &format!("stuck-{}", mine.id)).is_some());
    assert_eq!(w.vm(&mine.id).await.delete_requested_at, Some(requested));
    // Confirmed: it leaves both lists.
    w.answer_deletes(Answer::Ok);
    let r =
        w.op.post_form(&format!("/admin/instances/{}/delete", mine.id), &[])
            .await;
    assert_eq!(location(&r), "/admin/instances");
    let closed = w.vm(&mine.id).await;
    assert_eq!(
        (closed.delete_requested_at, closed.deleted_at),
        (Some(requested), Some(w.clock.now()))
    );
    let page = w.op.page("/admin/instances").await;
    assert!(page.contains("id=\"no-stuck\"") && page.contains("id=\"no-instances\""));

    // Refusals in place: no such instance; one that was never created.
    let r =
        w.op.post_form("/admin/instances/no-such-vm/delete", &[])
            .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("there is no instance with that id")
    );
    w.answer_creates(Answer::Refuse);
    let mine_key = w.add_key_once(&w.customer).await;
    let r = w.create(&w.customer, "spark-1", &mine_key).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let failed = w.agents.calls(Op::Create).pop().unwrap().name;
    let failed = w
        .all_vms()
        .await
        .into_iter()
        .find(|v| v.name == failed)
        .unwrap();
    let r =
        w.op.post_form(&format!("/admin/instances/{}/delete", failed.id), &[])
            .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(
        alert(&r.text())
            .unwrap()
            .starts_with("this instance was never created")
    );
    assert_eq!(w.vm(&failed.id).await.delete_requested_at, None);
    assert_eq!(w.agents.calls(Op::Delete).len(), 4);
}

with_world!(
    g_admin_vm_action_uses_the_same_path,
    the_operators_page_deletes_through_admin_vm_action_and_lists_stuck_deletes,
);
