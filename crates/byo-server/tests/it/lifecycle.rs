//! Life after go-live (issue #12) on both backends, through the API and the pages, with the
//! real GCP and Cloudflare clients against the fakes in `support` (fault injection on
//! either) and the fake agents: de-pool, revoke of an enrolled host (H), retire (N),
//! replacing a dead relay (A.3), the one-host page and the owner's stop-hosting. Every
//! refusal reads the rows and the fakes back to show nothing changed.

use crate::support;
use crate::with_world;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use byo_db::lifecycle::HostLifecycleRow;
use byo_db::vms::NewVm;
use byo_server::agents::AgentWaits;
use byo_server::clock::Clock;
use byo_server::config::RelayRelease;
use byo_wire::states::{EnrollmentState, RevokeStep};
use serde_json::{Value, json};
use support::agents::{self, FakeAgents, FakeCustomerSsh, Op, SshWay};
use support::{TestApp, User, fake_cloudflare, fake_gcp};

struct World {
    app: TestApp,
    clock: Clock,
    agents: Arc<FakeAgents>,
    gcp: fake_gcp::Shared,
    cf: fake_cloudflare::Shared,
    owner: User,
    op: User,
    customer: User,
    /// The customer's ssh a path walk takes (issue #38, 4).
    ssh: Arc<FakeCustomerSsh>,
    _gcp_key: tempfile::TempDir,
}

async fn world(backend: byo_db::Backend) -> Option<World> {
    let mut config = support::test_config();
    config.relay_release = Some(RelayRelease {
        url: "https://releases.example.com/byo-relay".into(),
        sha256: "0".repeat(64),
    });
    let mut app = TestApp::with_config(backend, config).await?;
    app.publish_operator_keys().await;
    let clock = Clock::manual("2026-11-29T12:00:00Z".parse().unwrap());
    let agents = Arc::new(
        FakeAgents::new()
            .with_clock(clock.clone())
            .observing(app.db.store.clone()),
    );
    let fake_gcp::FakeGcp {
        fake: gcp,
        relays,
        dir: gcp_key,
        ..
    } = fake_gcp::start().await;
    let (cf, tunnels) = fake_cloudflare::start("cf-token").await;
    let relays = Arc::new(relays);
    let ssh = Arc::new(FakeCustomerSsh::over(Some(agents.clone())));
    app.state = app
        .state
        .clone()
        .with_clock(clock.clone())
        .with_agents(agents.clone())
        .with_customer_ssh(ssh.clone())
        .with_waits(AgentWaits {
            create: Duration::from_millis(400),
            delete: Duration::from_millis(400),
            login: Duration::from_millis(400),
        })
        .with_providers(relays, Arc::new(tunnels));
    app.router = byo_server::router(app.state.clone());
    let owner = app.community_host("owner@example.com").await;
    let op = app.operator("op@example.com").await;
    let customer = app.customer("customer@example.com").await;
    Some(World {
        app,
        clock,
        agents,
        gcp,
        cf,
        owner,
        op,
        customer,
        ssh,
        _gcp_key: gcp_key,
    })
}

with_world!(
    n_a_host_whose_agent_says_it_uninstalled_is_stopped_its_instances_end_and_it_is_retired_at_once,
    depool_takes_a_host_out_of_placement_with_its_reason_and_keeps_its_instance,
    depool_refuses_a_missing_or_unbounded_reason_and_changes_nothing,
    h1_revoke_depools_drains_then_removes_access,
    h2_a_host_that_does_not_confirm_its_drain_leaves_the_revoke_in_progress_and_revoke_again_resumes,
    h_revoking_a_host_that_never_redeemed_is_refused,
    h_a_revoked_host_can_be_retired,
    h_the_host_page_revokes_and_retires_only_once_the_host_is_named,
    n1_retire_refusals_change_nothing,
    n2_a_provider_fault_stops_retire_before_the_stamp_and_retire_again_finishes,
    n7_a_retired_hosts_hardware_enrols_again,
    a3_a_dead_relay_is_replaced_at_its_address_with_the_key_the_host_trusts,
    a_a_relays_secrets_are_not_in_its_metadata_and_its_first_boot_fetches_them_once,
    a4_the_owner_cancels_their_pending_allocation_and_everything_is_handed_back,
    h_revoking_a_booked_never_redeemed_host_is_refused_in_words_and_nothing_changes,
    n_a_stopped_host_silent_a_day_is_retired_on_its_own_or_listed_for_an_operator,
    i1_the_fleet_at_a_glance_names_every_host_and_its_problems,
    h_a_host_being_revoked_gets_no_relay_secrets,
    the_one_host_page_shows_the_host_and_its_actions_bounded,
    the_one_host_page_names_each_failure_within_one_heartbeat,
    l_a_failed_re_prepare_is_named_on_the_host_page_and_the_host_stays_in_service,
    a_host_being_revoked_or_without_a_kept_relay_key_is_refused_and_nothing_changes,
    stop_hosting_depools_and_drains_the_owners_own_host_then_shows_uninstall,
    stop_hosting_a_host_an_operator_depooled_makes_it_the_owners_stop,
    d_activation_walks_the_customer_path_first_and_a_failed_walk_holds_it_back,
    d_a_walk_on_demand_is_refused_for_a_host_in_service_and_its_scratch_instance_outlives_no_walk,
);

/// Issue #38, 4 (the design's set-aside list: "the backend has never used the customer's own
/// path (F) before a customer does"): activation walks a prepared host's customer path
/// first — a scratch instance made with a key of the walk's own, logged in to at the relay's
/// address, `hostname` answering its name, deleted — and records each leg. A failed walk
/// refuses activation with where and why, the host unchanged, until the operator overrides
/// it with a reason, which the audit keeps beside the walk it overrode.
async fn d_activation_walks_the_customer_path_first_and_a_failed_walk_holds_it_back(w: World) {
    let h = w.prepared_host_on("wa1k").await;
    let path = format!("/api/admin/hosts/{}/activate", h.id);
    w.ssh.set(SshWay::Fails(
        "root@relay: Permission denied (publickey).".into(),
    ));
    let r = w.op.post(&path, json!({"placement": "shared"})).await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("walk_failed")),
        "{}",
        r.text()
    );
    assert!(
        r.text().contains("failed at ssh")
            && r.text().contains("Permission denied")
            && r.json()["message"]
                .as_str()
                .is_some_and(|m| m.contains("Nothing was changed: mend the path")),
        "{}",
        r.text()
    );
    let host = w.db().host(&h.id).await.unwrap().unwrap();
    assert!(!host.active && host.placement.is_none(), "nothing changed");
    let walk = w.db().latest_path_walk(&h.id).await.unwrap().unwrap();
    assert_eq!(
        (walk.passed, walk.stage.as_deref(), walk.by_sub.as_deref()),
        (Some(false), Some("ssh"), Some(w.op.sub.as_str()))
    );
    assert!(walk.create_ms.is_some() && walk.ssh_ms.is_none() && walk.delete_ms.is_some());
    // The scratch instance: made on this host with a key no customer holds, logged in to at
    // the relay's address, deleted; no row, so nothing is billed.
    let creates = w.agents.calls(Op::Create);
    assert_eq!(creates.len(), 1);
    assert_eq!(
        (creates[0].host_id.as_str(), creates[0].name.as_str()),
        (h.id.as_str(), walk.vm_name.as_str())
    );
    let deletes = w.agents.calls(Op::Delete);
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].name, walk.vm_name);
    assert!(
        w.agents.containers().is_empty(),
        "nothing is left on the host"
    );
    // The customer's own address: the instance's name, published here (where DNS is not, the
    // relay's address: `instances::ssh_command`).
    let hostname = byo_server::app::instances::ssh_hostname(&w.app.state, &walk.vm_name, &h.slug);
    assert!(hostname.contains(&walk.vm_name));
    assert_eq!(*w.ssh.logins.lock().unwrap(), vec![hostname]);
    assert!(w.db().live_vms_on_host(&h.id).await.unwrap().is_empty());
    // Both pages say so beside Activate, and ask for the reason to activate anyway.
    for page in [format!("/admin/hosts/{}", h.id), "/admin/hosts".to_owned()] {
        let page = w.op.page(&page).await;
        assert!(
            page.contains("failed at ssh")
                && page.contains("name=\"walk_override\"")
                && page.contains(">Activate anyway<"),
            "{page}"
        );
    }
    // Asked again, the failed walk stands (walking again is the operator's, once mended).
    let r = w.op.post(&path, json!({"placement": "shared"})).await;
    assert_eq!(r.json()["error"].as_str(), Some("walk_failed"));
    assert_eq!(w.agents.calls(Op::Create).len(), 1, "not walked again");
    // An override with a reason: in service, the reason and the walk in the audit.
    let reason = "relay map mended by hand, walk queued for the morning";
    let r =
        w.op.post(
            &path,
            json!({"placement": "shared", "walk_override": format!("  {reason} ")}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert!(w.db().host(&h.id).await.unwrap().unwrap().active);
    let audit = w.db().audit_of_host(&h.id, 50).await.unwrap();
    let activated = audit.iter().find(|a| a.action == "host.activate").unwrap();
    assert_eq!(
        (
            &activated.details["walk_id"],
            &activated.details["walk_override"]
        ),
        (&json!(walk.id), &json!(reason))
    );
    let walked = audit.iter().find(|a| a.action == "host.path_walk").unwrap();
    assert_eq!(
        (
            walked.details["passed"].as_bool(),
            walked.details["stage"].as_str()
        ),
        (Some(false), Some("ssh"))
    );

    // A host whose path works: activation walks it and it goes into service on that walk,
    // each leg timed as it took.
    w.ssh.set(SshWay::Through);
    w.agents.delay(Op::Create, Duration::from_millis(60));
    w.agents.delay(Op::Delete, Duration::from_millis(60));
    let h2 = w.prepared_host_on("wa2k").await;
    let page = w.op.page(&format!("/admin/hosts/{}", h2.id)).await;
    assert!(
        page.contains(">Activate<") && !page.contains(">Activate anyway<"),
        "a host never walked is simply activated (and walked then): {page}"
    );
    let r =
        w.op.post(
            &format!("/api/admin/hosts/{}/activate", h2.id),
            json!({"placement": "shared"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let walk2 = w.db().latest_path_walk(&h2.id).await.unwrap().unwrap();
    assert_eq!((walk2.passed, walk2.stage.as_deref()), (Some(true), None));
    assert!(
        walk2.create_ms >= Some(60) && walk2.delete_ms >= Some(60),
        "{walk2:?}"
    );
    assert!(walk2.ssh_ms.is_some_and(|ms| ms < 60_000), "{walk2:?}");
    let audit = w.db().audit_of_host(&h2.id, 50).await.unwrap();
    let activated = audit.iter().find(|a| a.action == "host.activate").unwrap();
    assert_eq!(
        (
            &activated.details["walk_id"],
            &activated.details["walk_override"]
        ),
        (&json!(walk2.id), &json!(null))
    );
    assert!(w.agents.containers().is_empty());

    // A login that lands somewhere else (the relay mapping :22 to another sshd that let the
    // key in) is a failed walk, not a pass.
    w.ssh.set(SshWay::Elsewhere("spark-owner-box".into()));
    let h3 = w.prepared_host_on("wa3k").await;
    let r =
        w.op.post(
            &format!("/api/admin/hosts/{}/activate", h3.id),
            json!({"placement": "shared"}),
        )
        .await;
    assert_eq!(
        r.json()["error"].as_str(),
        Some("walk_failed"),
        "{}",
        r.text()
    );
    assert!(
        r.text().contains("not the scratch instance"),
        "{}",
        r.text()
    );
    assert!(!w.db().host(&h3.id).await.unwrap().unwrap().active);
}

/// Issue #38, 4: a walk asked for from the host's page (or the API) runs only on a host out
/// of service with its slot free, one at a time; and its scratch instance is passed over by
/// the heartbeat's orphan removal while the walk runs, and removed like any orphan after.
async fn d_a_walk_on_demand_is_refused_for_a_host_in_service_and_its_scratch_instance_outlives_no_walk(
    w: World,
) {
    let active = w.active_host().await;
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/walk", active.id))
            .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("in_service"))
    );
    assert!(w.agents.calls(Op::Create).is_empty(), "nothing was made");

    let h = w.prepared_host_on("wa4k").await;
    let walk =
        w.op.post_empty(&format!("/api/admin/hosts/{}/walk", h.id))
            .await;
    assert_eq!(walk.status, StatusCode::OK, "{}", walk.text());
    let walk = walk.json();
    assert_eq!(walk["passed"], json!(true));
    assert!(walk["ssh_ms"].is_number());
    // The host's page says so, beside the walk button.
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    assert!(
        page.contains("a customer&#39;s ssh reaches its instance")
            || page.contains("a customer's ssh reaches its instance"),
        "{page}"
    );

    // A walk under way: a second is refused, and its container is no orphan to the beat.
    let now = w.clock.now();
    let running = w
        .db()
        .start_path_walk(&h.id, "vm-walking1", Some(&w.op.sub), now, now)
        .await
        .unwrap()
        .unwrap();
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/walk", h.id))
            .await;
    assert_eq!(
        r.json()["error"].as_str(),
        Some("walk_running"),
        "{}",
        r.text()
    );
    let beat = || {
        w.app.send(
            Request::post("/api/host/heartbeat")
                .header(header::AUTHORIZATION, format!("Bearer {}", h.token))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(
                    json!({"agent_version": "0.7.3", "lxd": "ok", "relay": "ok", "tunnel": "ok",
                           "gpu": "ok", "storage": "ok", "instances": 1,
                           "vms": [{"name": "vm-walking1", "status": "Running"}]})
                    .to_string(),
                ))
                .unwrap(),
        )
    };
    let deletes = w.agents.calls(Op::Delete).len();
    assert_eq!(beat().await.status, StatusCode::NO_CONTENT);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        w.agents.calls(Op::Delete).len(),
        deletes,
        "a running walk's instance is not an orphan"
    );
    let end = byo_db::path_walks::WalkEnd {
        passed: false,
        stage: Some("ssh"),
        error: Some("x"),
        ..Default::default()
    };
    w.db()
        .finish_path_walk(&running.id, &end, now)
        .await
        .unwrap();
    assert_eq!(beat().await.status, StatusCode::NO_CONTENT);
    let removed = w.agents.contacted(Op::Delete, deletes + 1).await;
    assert_eq!(
        removed.name, "vm-walking1",
        "once the walk has ended it is an orphan"
    );
}

/// Issue #39 (6): a host that never redeemed but that an open pre-booking names (written
/// by hand: no product path books such a host). The owner's cancel and the operator's
/// revoke of its enrolment are refused in words naming the booking, and nothing changes —
/// the enrolment stays open, the relay, address, tunnel and names stay held. Once the
/// booking is closed the owner's cancel hands everything back, and the host row the closed
/// booking still names is kept, retired, instead of reap meeting the foreign key.
async fn h_revoking_a_booked_never_redeemed_host_is_refused_in_words_and_nothing_changes(w: World) {
    let (id, slug, _token) = w.provisioned().await;
    let held = w.outside(&slug);
    let t = w.clock.now();
    w.db()
        .execute_unchecked(&format!(
            "insert into prebookings (id, user_sub, host_id, gpu_type, start_date, end_date, created_at)
             values ('b-pinned', '{}', '{id}', 'spark-1', '{}', '{}', '{}')",
            w.customer.sub,
            (t + chrono::TimeDelta::days(1)).to_rfc3339(),
            (t + chrono::TimeDelta::days(2)).to_rfc3339(),
            t.to_rfc3339()
        ))
        .await
        .unwrap();
    let enrolment = w
        .db()
        .enrollment_views(None)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.host_id.as_deref() == Some(id.as_str()))
        .unwrap();
    let refusals = [
        w.owner.post_empty(&format!("/api/hosts/{id}/cancel")).await,
        w.op.post_empty(&format!("/api/admin/enrollments/{}/revoke", enrolment.id))
            .await,
    ];
    for r in refusals {
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
        assert_eq!(r.json()["error"], "booked", "{}", r.text());
        let message = r.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.contains("b-pinned") && message.contains("nothing was changed"),
            "{message}"
        );
        assert!(!message.contains("FOREIGN KEY"), "{message}");
    }
    byo_server::app::reap::reap_once(&w.app.state)
        .await
        .unwrap();
    assert_eq!(w.outside(&slug), held, "nothing handed back by a refusal");
    let still = w
        .db()
        .enrollment_views(None)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.id == enrolment.id)
        .unwrap();
    assert_eq!(still.state, EnrollmentState::Pending);
    assert!(
        w.db()
            .host(&id)
            .await
            .unwrap()
            .unwrap()
            .retired_at
            .is_none()
    );
    assert!(
        w.db()
            .audit_log(100)
            .await
            .unwrap()
            .iter()
            .all(|a| a.action != "enrollment.cancel" && a.action != "enrollment.revoke")
    );

    // The booking closed (by hand, as it was made): the cancel goes through.
    w.db()
        .execute_unchecked(&format!(
            "update prebookings set closed_at = '{}', closed_reason = 'cancelled'
             where id = 'b-pinned'",
            t.to_rfc3339()
        ))
        .await
        .unwrap();
    let r = w.owner.post_empty(&format!("/api/hosts/{id}/cancel")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    assert_eq!(w.outside(&slug), (0, 0, 0, 0));
    let kept = w
        .db()
        .host(&id)
        .await
        .unwrap()
        .expect("the closed booking names it");
    assert!(kept.retired_at.is_some() && !kept.active, "{kept:?}");
    assert!(
        w.db().reapable(w.clock.now()).await.unwrap().is_empty(),
        "reap is done with it"
    );
}

/// Issue #39 (3): leaving gives everything back. A host its owner stopped hosting, drained,
/// whose agent then stays silent a day (uninstalled, switched off) is retired by
/// retire-stopped in N's order: one second short nothing happens; at the bound the relay,
/// address, tunnel and names are gone, the stamp is on, the host token is refused, audited
/// `host.retire` by the job. A stopped host that still beats is left alone; one an operator
/// de-pooled is not the job's. A refusal of N's (a pre-booking still owed) puts it on the
/// operators' worklist (API and page) with nothing touched, until it is settled; a provider
/// failing part way stamps nothing and the next run finishes.
/// Issue #39 (3): `byo-agent uninstall` ends by telling the server (`POST
/// /api/host/uninstalled`, the host token). An active host renting an instance is stopped as
/// its owner's stop-hosting stops it, the instance (whose container the uninstall deleted)
/// ends at that moment and bills no further, and `retire-stopped` retires the host at its next
/// run — no silent day — leaving nothing outside. Said twice, nothing more happens; a token
/// that is no host's is refused and changes nothing.
async fn n_a_host_whose_agent_says_it_uninstalled_is_stopped_its_instances_end_and_it_is_retired_at_once(
    w: World,
) {
    use byo_server::app::retire_stopped;
    let say = |token: &str| {
        let req = axum::http::Request::post("/api/host/uninstalled")
            .header(axum::http::header::AUTHORIZATION, format!("Bearer {token}"))
            .body(axum::body::Body::empty())
            .unwrap();
        w.app.send(req)
    };
    let host = w.active_host_on("hw-uninstalled").await;
    let other = w.active_host_on("hw-other").await;
    let vm = w.instance(&host, "vm-renting").await;
    assert!(w.beat(&host.token).await.status.is_success());
    let before = w.outside(&host.slug);
    assert_eq!(before.0, 1, "{before:?}");

    let stranger = byo_core::tokens::SecretToken::generate(byo_core::tokens::TokenKind::Host);
    assert_eq!(
        say(stranger.expose()).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert!(w.life(&host).await.active);

    w.clock.advance(chrono::TimeDelta::seconds(5));
    let at = w.clock.now();
    let r = say(&host.token).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let life = w.life(&host).await;
    assert!(!life.active);
    assert_eq!(
        (life.depool_reason.as_deref(), life.depooled_by.as_deref()),
        (
            Some(byo_server::app::host_lifecycle::STOP_REASON),
            Some(w.owner.sub.as_str())
        )
    );
    let ended = w.db().vm(&vm).await.unwrap().unwrap();
    assert_eq!(
        ended.deleted_at,
        Some(at),
        "billing ends when the host says so"
    );
    let audit: Vec<_> = w
        .db()
        .audit_of_host(&host.id, 50)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action == "host.uninstalled")
        .collect();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].details.0["instances_ended"], json!(["vm-renting"]));
    // The customer is told, once.
    let told = w.db().notices(Some(&w.customer.sub), 10).await.unwrap();
    assert_eq!(told.len(), 1, "{told:?}");
    assert_eq!(
        (told[0].kind.as_str(), told[0].subject.as_str()),
        ("instance.ended", "Your instance vm-renting has ended")
    );
    // Said again: nothing more.
    assert_eq!(say(&host.token).await.status, StatusCode::NO_CONTENT);
    assert_eq!(
        w.db()
            .audit_of_host(&host.id, 50)
            .await
            .unwrap()
            .iter()
            .filter(|a| a.action == "host.uninstalled")
            .count(),
        1
    );
    assert_eq!(
        w.db()
            .notices(Some(&w.customer.sub), 10)
            .await
            .unwrap()
            .len(),
        1
    );

    // Retired at the job's next run, a minute later, though it beat a minute ago.
    w.clock.advance(chrono::TimeDelta::minutes(1));
    let r = retire_stopped::retire_stopped_once(&w.app.state)
        .await
        .unwrap();
    assert_eq!((r.retired, r.refused, r.failed), (1, 0, 0), "{r}");
    assert!(w.life(&host).await.retired_at.is_some());
    assert_eq!(w.outside(&host.slug), (0, 0, 0, 0));
    assert!(w.life(&other).await.retired_at.is_none(), "only that host");
    assert_eq!(say(&host.token).await.status, StatusCode::UNAUTHORIZED);
}

async fn n_a_stopped_host_silent_a_day_is_retired_on_its_own_or_listed_for_an_operator(
    mut w: World,
) {
    use byo_server::app::retire_stopped::{self, SILENT_HOURS};
    let run = |w: &World| {
        let state = w.app.state.clone();
        async move { retire_stopped::retire_stopped_once(&state).await.unwrap() }
    };
    let stopped = w.active_host_on("hw-stopped").await;
    let still_beating = w.active_host_on("hw-beating").await;
    let booked = w.active_host_on("hw-booked").await;
    let depooled_by_op = w.active_host_on("hw-depooled").await;
    for h in [&stopped, &still_beating, &booked] {
        assert!(w.beat(&h.token).await.status.is_success());
        let r = w
            .owner
            .post_empty(&format!("/api/hosts/{}/stop", h.id))
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    let r =
        w.op.post(
            &format!("/api/admin/hosts/{}/depool", depooled_by_op.id),
            json!({"reason": "disk failing"}),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text());
    let t = w.clock.now();
    w.db()
        .execute_unchecked(&format!(
            "insert into prebookings (id, user_sub, host_id, gpu_type, start_date, end_date, created_at)
             values ('b-owed', '{}', '{}', 'spark-1', '{}', '{}', '{}')",
            w.customer.sub,
            booked.id,
            (t + chrono::TimeDelta::days(3)).to_rfc3339(),
            (t + chrono::TimeDelta::days(4)).to_rfc3339(),
            t.to_rfc3339()
        ))
        .await
        .unwrap();
    let held = |w: &World| {
        [&stopped, &still_beating, &booked, &depooled_by_op].map(|h| w.outside(&h.slug))
    };
    let before = held(&w);
    assert!(
        before
            .iter()
            .all(|o| *o == before[0] && o.0 == 1 && o.3 > 0),
        "{before:?}"
    );

    // One second short of a day's silence: nothing.
    w.clock
        .advance(chrono::TimeDelta::hours(SILENT_HOURS) - chrono::TimeDelta::seconds(1));
    assert!(w.beat(&still_beating.token).await.status.is_success());
    assert_eq!(
        run(&w).await.to_string(),
        "retired 0, on the worklist 0, failed 0"
    );
    assert_eq!(held(&w), before);

    // At it, Cloudflare failing: nothing stamped, the names kept.
    w.clock.advance(chrono::TimeDelta::seconds(1));
    w.cf.lock().unwrap().fail = Some(Method::DELETE);
    let r = run(&w).await;
    assert_eq!((r.retired, r.refused, r.failed), (0, 1, 1), "{r}");
    assert!(w.life(&stopped).await.retired_at.is_none());
    assert_eq!(w.outside(&stopped.slug), before[0]);
    w.cf.lock().unwrap().fail = None;
    let r = run(&w).await;
    assert_eq!((r.retired, r.refused, r.failed), (1, 1, 0), "{r}");
    assert_eq!(w.outside(&stopped.slug), (0, 0, 0, 0));
    let life = w.life(&stopped).await;
    assert_eq!(life.retired_at, Some(w.clock.now()));
    assert_eq!(
        w.beat(&stopped.token).await.status,
        StatusCode::UNAUTHORIZED,
        "nothing it was issued still works"
    );
    let retired: Vec<_> = w
        .db()
        .audit_of_host(&stopped.id, 50)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action == "host.retire")
        .collect();
    assert_eq!(retired.len(), 1);
    assert_eq!(retired[0].actor_sub, None);
    assert_eq!(retired[0].details.0["by"], "retire-stopped");
    // The others: still beating, an operator's de-pool — untouched; the booked one waits.
    for h in [&still_beating, &depooled_by_op, &booked] {
        assert!(w.life(h).await.retired_at.is_none(), "{}", h.slug);
        assert_eq!(w.outside(&h.slug), before[0], "{}", h.slug);
    }
    assert_eq!(run(&w).await.retired, 0, "once");

    // The worklist: the booked one, with the refusal in words, on the API and the page.
    for who in [&mut w.op, &mut w.customer, &mut w.owner] {
        who.session = w.app.session_for(&who.sub).await;
    }
    let list = w.op.get("/api/admin/worklist").await.json();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(
        (list[0]["host_id"].as_str(), list[0]["refusal"].as_str()),
        (Some(booked.id.as_str()), Some("prebooked"))
    );
    assert_eq!(
        w.customer.get("/api/admin/worklist").await.status,
        StatusCode::FORBIDDEN
    );
    let page = w.op.page("/admin/hosts").await;
    assert!(page.contains("Needs an operator"), "{page}");
    assert!(page.contains(&format!("worklist-{}", booked.id)));
    assert!(page.contains("owed to a pre-booking"));
    // Settled (the booking closed): the next run retires it and the list empties.
    w.db()
        .execute_unchecked(&format!(
            "update prebookings set closed_at = '{}', closed_reason = 'cancelled'
             where id = 'b-owed'",
            w.clock.now().to_rfc3339()
        ))
        .await
        .unwrap();
    let r = run(&w).await;
    assert_eq!((r.retired, r.refused), (1, 0), "{r}");
    assert_eq!(w.outside(&booked.slug), (0, 0, 0, 0));
    assert!(
        w.op.get("/api/admin/worklist")
            .await
            .json()
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert!(
        !w.op
            .page("/admin/hosts")
            .await
            .contains("Needs an operator")
    );
}

/// Issue #38 (1): `/admin` and `GET /api/admin/fleet` on both databases, from rows the
/// product wrote: one host renting with a delete nobody confirmed, one idle and beating,
/// one whose agent went silent, one still enrolling. Each stands in one state, each problem
/// is named with its host, the filters narrow the rows and not the counts, the page links
/// each host to its own page, and a bad filter is refused by name.
async fn i1_the_fleet_at_a_glance_names_every_host_and_its_problems(mut w: World) {
    let renting = w.active_host_on("hw-renting").await;
    let idle = w.active_host_on("hw-idle").await;
    let silent = w.active_host_on("hw-silent").await;
    let (_enrolling, enrolling_slug, _) = w.provisioned().await;
    let vm = w.instance(&renting, "rented").await;
    w.db()
        .request_vm_delete(&vm, w.clock.now() - chrono::TimeDelta::minutes(1))
        .await
        .unwrap();
    for h in [&renting, &idle, &silent] {
        assert!(w.beat(&h.token).await.status.is_success());
    }
    w.clock.advance(chrono::TimeDelta::minutes(10));
    for h in [&renting, &idle] {
        assert!(w.beat(&h.token).await.status.is_success());
    }
    for who in [&mut w.op, &mut w.customer, &mut w.owner] {
        who.session = w.app.session_for(&who.sub).await;
    }
    let all = w.op.get("/api/admin/fleet").await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text());
    let o = all.json();
    assert_eq!(
        o["counts"],
        json!({"total": 4, "renting": 1, "idle": 1, "preparing": 0, "enrolling": 1,
               "depooled": 0, "unreachable": 1, "with_problem": 2})
    );
    let row = |slug: &str| {
        o["hosts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["slug"] == slug)
            .cloned()
            .unwrap()
    };
    assert_eq!(row(&renting.slug)["state"], "renting");
    assert_eq!(row(&renting.slug)["problems"][0]["name"], "stuck delete");
    assert_eq!(row(&renting.slug)["instances"], 1);
    assert_eq!(row(&idle.slug)["problems"], json!([]));
    assert_eq!(row(&idle.slug)["agent_version"], "0.7.3");
    assert_eq!(row(&silent.slug)["state"], "unreachable");
    assert_eq!(
        row(&silent.slug)["problems"][0]["name"],
        "agent unreachable"
    );
    assert_eq!(row(&enrolling_slug)["state"], "enrolling");
    // The oldest problem first: the delete asked for before the agent went quiet.
    assert_eq!(o["hosts"][0]["slug"], renting.slug.as_str());
    assert_eq!(o["hosts"][1]["slug"], silent.slug.as_str());

    let only =
        w.op.get("/api/admin/fleet?problem=agent%20unreachable")
            .await
            .json();
    assert_eq!(only["matching"], 1);
    assert_eq!(only["hosts"][0]["slug"], silent.slug.as_str());
    assert_eq!(only["counts"]["total"], 4, "the counts are the fleet's");
    let idle_only = w.op.get("/api/admin/fleet?state=idle").await.json();
    assert_eq!(idle_only["hosts"][0]["slug"], idle.slug.as_str());
    let r = w.op.get("/api/admin/fleet?state=sleeping").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"], "invalid_state");
    assert_eq!(
        w.customer.get("/api/admin/fleet").await.status,
        StatusCode::FORBIDDEN
    );

    let page = w.op.page("/admin").await;
    assert!(page.contains("The fleet"), "{page}");
    assert!(page.contains(&format!("href=\"/admin/hosts/{}\"", silent.id)));
    assert!(page.contains(&format!("href=\"/admin/hosts/{}#problems\"", renting.id)));
    assert!(page.contains("agent unreachable"));
    let filtered = w.op.page("/admin?state=unreachable").await;
    assert!(filtered.contains(&format!("fleet-{}", silent.id)));
    assert!(!filtered.contains(&format!("fleet-{}", idle.id)));
}

fn spark() -> Value {
    json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": "3f2a", "hardware_id": "b41c", "node_index": 0, "rails": []
    })
}

struct Host {
    id: String,
    slug: String,
    /// The host token redeem handed over.
    token: String,
}

impl World {
    fn db(&self) -> &byo_db::Store {
        &self.app.db.store
    }

    /// "Add a GPU", with the relay provisioned in the fake GCP.
    async fn provisioned(&self) -> (String, String, String) {
        let r = self
            .owner
            .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        let p = r.json();
        let id = p["host_id"].as_str().unwrap().to_owned();
        for _ in 0..500 {
            if self
                .db()
                .relay_record(&id)
                .await
                .unwrap()
                .relay_ip
                .is_some()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            self.db()
                .relay_record(&id)
                .await
                .unwrap()
                .relay_ip
                .is_some()
        );
        (
            id,
            p["slug"].as_str().unwrap().to_owned(),
            p["token"].as_str().unwrap().to_owned(),
        )
    }

    async fn enroll(&self, token: &str) -> support::Reply {
        self.app
            .send(
                Request::post("/api/enroll")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(spark().to_string()))
                    .unwrap(),
            )
            .await
    }

    /// A host as onboarding leaves one: provisioned, redeemed, prepared, activated.
    async fn active_host(&self) -> Host {
        self.active_host_on("b41c").await
    }

    /// A host enrolled from `hardware_id`, prepared, and beating healthy: one an operator
    /// may activate.
    async fn prepared_host_on(&self, hardware_id: &str) -> Host {
        let host = self
            .enrolled_on(hardware_id, &format!("m-{hardware_id}"))
            .await;
        self.db()
            .mark_host_prepared(&host.id, self.clock.now())
            .await
            .unwrap();
        // Its agent serves: an operator activates a host only on a fresh, healthy beat.
        self.app.idle_heartbeat(&host.token).await;
        host
    }

    /// [`World::active_host`] on the machine whose hardware id is `hardware_id`.
    async fn active_host_on(&self, hardware_id: &str) -> Host {
        let Host {
            id,
            slug,
            token: host_token,
        } = self.prepared_host_on(hardware_id).await;
        self.app.path_walked(&id).await;
        let a = self
            .op
            .post(
                &format!("/api/admin/hosts/{id}/activate"),
                json!({"placement": "shared"}),
            )
            .await;
        assert_eq!(a.status, StatusCode::NO_CONTENT, "{}", a.text());
        Host {
            id,
            slug,
            token: host_token,
        }
    }

    /// A running instance of the customer's on `host`, written as create leaves one.
    async fn instance(&self, host: &Host, name: &str) -> String {
        let vm = self
            .db()
            .create_vm(
                NewVm {
                    user_sub: &self.customer.sub,
                    host_id: Some(&host.id),
                    name,
                    gpu_type: "spark-1",
                    ssh_hostname: None,
                },
                self.clock.now(),
            )
            .await
            .unwrap();
        self.db().mark_vm_running(&vm.id, Some(2201)).await.unwrap();
        vm.id
    }

    async fn life(&self, host: &Host) -> HostLifecycleRow {
        self.db().host_lifecycle(&host.id).await.unwrap().unwrap()
    }

    /// What the host's token still reaches: `GET /api/host/relay`.
    async fn host_relay(&self, token: &str) -> support::Reply {
        self.app
            .send(
                Request::get("/api/host/relay")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
    }

    /// The startup script the fake GCP holds for `slug`'s relay: its instance metadata.
    fn relay_metadata(&self, slug: &str) -> String {
        self.gcp.lock().unwrap().instances[&format!("{slug}-relay")]["metadata"]["items"][0]
            ["value"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// A relay's first-boot fetch of its secrets, with the token its metadata carries.
    async fn fetch_relay_secrets(&self, slug: &str) -> support::Reply {
        let script = self.relay_metadata(slug);
        let token = script
            .split("Authorization: Bearer ")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .expect("the script carries a bearer token")
            .to_owned();
        self.relay_secrets_with(&token).await
    }

    async fn relay_secrets_with(&self, token: &str) -> support::Reply {
        self.app
            .send(
                Request::post("/api/relay/secrets")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
    }

    /// The relay WireGuard key kept (sealed) for the host, opened.
    async fn kept_relay_key(&self, id: &str) -> String {
        let sealed = self
            .db()
            .relay_rebuild(id)
            .await
            .unwrap()
            .unwrap()
            .0
            .unwrap();
        self.app
            .state
            .sealer
            .as_ref()
            .unwrap()
            .open(&byo_server::seal::SealedAt::relay_wg_key(id), &sealed)
            .unwrap()
    }

    /// Everything the fakes hold for `slug`: GCP instances and addresses, Cloudflare
    /// tunnels and records.
    fn outside(&self, slug: &str) -> (usize, usize, usize, usize) {
        let g = self.gcp.lock().unwrap();
        let c = self.cf.lock().unwrap();
        let mine = |v: &Value| v.to_string().contains(slug);
        (
            g.instances.keys().filter(|k| k.starts_with(slug)).count(),
            g.addresses.keys().filter(|k| k.starts_with(slug)).count(),
            c.tunnels.values().filter(|t| mine(t)).count(),
            c.records.values().filter(|r| mine(r)).count(),
        )
    }

    async fn actions(&self, host: &Host) -> Vec<String> {
        self.db()
            .audit_of_host(&host.id, 100)
            .await
            .unwrap()
            .into_iter()
            .map(|a| a.action)
            .collect()
    }

    async fn enrollment_state(&self, host: &Host) -> EnrollmentState {
        self.db()
            .enrollment_views(None)
            .await
            .unwrap()
            .into_iter()
            .find(|e| e.host_id.as_deref() == Some(host.id.as_str()))
            .unwrap()
            .state
    }
}

/// The facts a refusal must leave as they were.
async fn snapshot(w: &World, h: &Host) -> String {
    let l = w.life(h).await;
    let vms = w.db().vms_of_host(&h.id, 100).await.unwrap();
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        l.active,
        l.retired_at,
        l.depooled_at,
        l.depool_reason,
        l.revoke_step.0,
        vms.iter()
            .map(|v| (v.delete_requested_at, v.deleted_at))
            .collect::<Vec<_>>(),
        w.outside(&h.slug),
        w.host_relay(&h.token).await.status,
        w.actions(h).await.len(),
    )
}

async fn depool_takes_a_host_out_of_placement_with_its_reason_and_keeps_its_instance(w: World) {
    let h = w.active_host().await;
    let idle = w.instance(&h, "before").await;
    assert!(w.beat(&h.token).await.status.is_success());
    w.db()
        .confirm_vm_deleted(&idle, w.clock.now())
        .await
        .unwrap();
    assert!(
        w.pickable(&h).await,
        "before: an idle, heard-from host is picked"
    );
    let vm = w.instance(&h, "keep-me").await;
    let r =
        w.op.post(
            &format!("/api/admin/hosts/{}/depool", h.id),
            json!({"reason": "  fan failing, owner informed  "}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let l = w.life(&h).await;
    assert!(!l.active);
    assert_eq!(
        l.depool_reason.as_deref(),
        Some("fan failing, owner informed")
    );
    assert_eq!(l.depooled_by.as_deref(), Some(w.op.sub.as_str()));
    // The instance stays until drained, and nothing new is placed there.
    let v = w.db().vm(&vm).await.unwrap().unwrap();
    assert!(v.delete_requested_at.is_none() && v.deleted_at.is_none());
    assert!(w.agents.calls(Op::Delete).is_empty());
    w.db().confirm_vm_deleted(&vm, w.clock.now()).await.unwrap();
    assert!(!w.pickable(&h).await, "a de-pooled host is not picked");
    // Audited with the reason.
    let audit = w.db().audit_of_host(&h.id, 10).await.unwrap();
    let a = audit.iter().find(|a| a.action == "host.depool").unwrap();
    assert_eq!(a.details.0["reason"], "fan failing, owner informed");
    assert_eq!(a.actor_sub.as_deref(), Some(w.op.sub.as_str()));
    // The host's page shows it as words, not raw JSON (issue #42, 2).
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    let trail = &page[page.find("id=\"audit\"").unwrap()..];
    assert!(
        trail.contains(
            "<span class=\"k\">reason</span>: <span class=\"v\">fan failing, owner informed</span>"
        ),
        "{trail}"
    );
    assert!(!trail.contains("{&quot;"), "no raw JSON: {trail}");
    // Re-activation is the existing activate.
    let r =
        w.op.post(
            &format!("/api/admin/hosts/{}/activate", h.id),
            json!({"placement": "shared"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(w.life(&h).await.active);
    // The /admin form does the same.
    let r =
        w.op.post_form(
            &format!("/admin/hosts/{}/depool", h.id),
            &[("reason", "maintenance window")],
        )
        .await;
    assert!(r.status.is_redirection(), "{}", r.status);
    assert_eq!(
        w.life(&h).await.depool_reason.as_deref(),
        Some("maintenance window")
    );
}

async fn depool_refuses_a_missing_or_unbounded_reason_and_changes_nothing(w: World) {
    let h = w.active_host().await;
    let before = snapshot(&w, &h).await;
    for reason in [
        String::new(),
        "   ".into(),
        "x".repeat(501),
        "a\u{7}b".into(),
    ] {
        let r =
            w.op.post(
                &format!("/api/admin/hosts/{}/depool", h.id),
                json!({"reason": reason}),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{reason:?}");
        assert_eq!(r.json()["error"], "invalid_reason");
    }
    let r =
        w.op.post(&format!("/api/admin/hosts/{}/depool", h.id), json!({}))
            .await;
    assert!(r.status.is_client_error());
    assert_eq!(snapshot(&w, &h).await, before);
    assert!(w.life(&h).await.active);
    // The schema holds the same bound for every writer.
    let e = w
        .db()
        .depool_host(&h.id, &"y".repeat(501), &w.op.sub, w.clock.now())
        .await
        .unwrap_err();
    assert!(e.is_constraint("hosts_depool_reason_bounded"), "{e}");
    // At the bound, a reason is taken.
    let r =
        w.op.post(
            &format!("/api/admin/hosts/{}/depool", h.id),
            json!({"reason": "z".repeat(500)}),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text());
    assert_eq!(
        w.life(&h).await.depool_reason.map(|r| r.chars().count()),
        Some(500)
    );
    // A host that does not exist.
    let r =
        w.op.post("/api/admin/hosts/nope/depool", json!({"reason": "x"}))
            .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

async fn h1_revoke_depools_drains_then_removes_access(w: World) {
    let h = w.active_host().await;
    let vm = w.instance(&h, "tenant").await;
    assert_eq!(
        w.outside(&h.slug),
        (1, 1, 1, 2),
        "relay, address, tunnel, DNS + wildcard"
    );
    w.agents.answer(Op::Delete, agents::Answer::Ok);
    w.agents.takes(Op::Delete, chrono::TimeDelta::seconds(5));
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/revoke", h.id))
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let p = r.json();
    assert_eq!(p["step"], "revoked");
    assert_eq!(p["done"], true);
    assert_eq!(p["drain"]["confirmed"], json!([vm]));
    // Drained through G: both facts, the host's confirmation first.
    let v = w.db().vm(&vm).await.unwrap().unwrap();
    assert!(v.delete_requested_at.is_some() && v.deleted_at.is_some());
    assert_eq!(w.agents.calls(Op::Delete).len(), 1);
    // Access removed: nothing left outside.
    assert_eq!(w.outside(&h.slug), (0, 0, 0, 0));
    // Nothing the host was issued works; the enrolment is revoked and closed.
    assert_eq!(
        w.host_relay(&h.token).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(w.enrollment_state(&h).await, EnrollmentState::Revoked);
    let l = w.life(&h).await;
    assert_eq!(l.revoke_step.0, Some(RevokeStep::Revoked));
    assert!(!l.active && l.revoked_at.is_some());
    assert!(l.retired_at.is_none(), "revoke is not retire");
    assert!(!l.relay_key_kept);
    // The order, as the audit log has it: the host took 5 s to confirm, and access went
    // only after that.
    let audit = w.db().audit_of_host(&h.id, 100).await.unwrap();
    let when = |a: &str| audit.iter().find(|x| x.action == a).unwrap().at;
    assert!(when("host.revoke_requested") <= when("vm.delete_requested"));
    assert!(when("vm.delete_requested") + chrono::Duration::seconds(5) <= when("host.revoked"));
    // A revoked host is held inactive by the schema, whoever writes.
    let r =
        w.op.post(
            &format!("/api/admin/hosts/{}/activate", h.id),
            json!({"placement": "shared"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.text().contains("hosts_revoked_inactive"), "{}", r.text());
    // Revoking again is calm: nothing more is done.
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/revoke", h.id))
            .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(w.agents.calls(Op::Delete).len(), 1);
    // Reap's sweep leaves the revoked enrolment alone: it is closed.
    byo_server::app::reap::reap_once(&w.app.state)
        .await
        .unwrap();
    assert!(w.db().host(&h.id).await.unwrap().is_some());
}

async fn h2_a_host_that_does_not_confirm_its_drain_leaves_the_revoke_in_progress_and_revoke_again_resumes(
    w: World,
) {
    let h = w.active_host().await;
    let vm = w.instance(&h, "tenant").await;
    w.agents.answer(
        Op::Delete,
        agents::Answer::unreachable("connection refused"),
    );
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/revoke", h.id))
            .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    let p = r.json();
    assert_eq!(
        (p["step"].as_str(), p["done"].as_bool()),
        (Some("draining"), Some(false))
    );
    assert_eq!(p["drain"]["waiting"], json!([vm]));
    assert_eq!(
        p["message"],
        format!(
            "the host has not confirmed the end of 1 instance(s) ({vm}); nothing further was done — run it again to resume once the host answers"
        )
    );
    // De-pooled and requested, but nothing of ours is gone: the host is still reachable.
    let l = w.life(&h).await;
    assert!(!l.active);
    assert_eq!(l.revoke_step.0, Some(RevokeStep::Draining));
    let v = w.db().vm(&vm).await.unwrap().unwrap();
    assert!(v.delete_requested_at.is_some() && v.deleted_at.is_none());
    assert_eq!(w.outside(&h.slug), (1, 1, 1, 2));
    assert_eq!(w.host_relay(&h.token).await.status, StatusCode::OK);
    assert_eq!(w.enrollment_state(&h).await, EnrollmentState::Enrolled);
    // Visible as stuck on /admin, and on the host's own page.
    let list = w.op.page("/admin/hosts").await;
    assert!(list.contains("revoke stopped at draining"), "{list}");
    assert!(list.contains(&format!("/admin/hosts/{}", h.id)));
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    assert!(page.contains("revoke in progress, stopped at draining"));
    assert!(page.contains("Resume revoke"));
    assert!(
        page.contains("not confirmed by the host"),
        "the stuck delete"
    );
    // A page cannot activate it meanwhile: the schema holds it inactive.
    let e = w
        .db()
        .activate_host(&h.id, "shared", None, false, &w.op.sub, w.clock.now())
        .await
        .unwrap_err();
    assert!(e.is_constraint("hosts_revoked_inactive"), "{e}");
    // The host answers again: revoke resumes where it stopped, from the page this time.
    w.agents.answer(Op::Delete, agents::Answer::NotFound);
    let r =
        w.op.post_form(&format!("/admin/hosts/{}/revoke", h.id), &[])
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.text().contains("revoked: drained"));
    let v = w.db().vm(&vm).await.unwrap().unwrap();
    assert!(v.deleted_at.is_some(), "its own 404 confirms");
    assert_eq!(w.life(&h).await.revoke_step.0, Some(RevokeStep::Revoked));
    assert_eq!(w.outside(&h.slug), (0, 0, 0, 0));
    assert_eq!(
        w.host_relay(&h.token).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        w.actions(&h)
            .await
            .iter()
            .filter(|a| *a == "host.revoke_requested")
            .count(),
        1,
        "one revoke, resumed"
    );

    // A provider failing at the access step leaves it at removing_access; again resumes.
    let h2 = w.active_host_with_other_hardware().await;
    w.cf.lock().unwrap().fail = Some(Method::DELETE);
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/revoke", h2.id))
            .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert_eq!(r.json()["error"], "provider_failed");
    assert_eq!(
        w.life(&h2).await.revoke_step.0,
        Some(RevokeStep::RemovingAccess)
    );
    assert_eq!(
        w.host_relay(&h2.token).await.status,
        StatusCode::OK,
        "tokens kept"
    );
    w.cf.lock().unwrap().fail = None;
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/revoke", h2.id))
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(w.outside(&h2.slug), (0, 0, 0, 0));
}

impl World {
    /// One heartbeat with `token`.
    async fn beat(&self, token: &str) -> support::Reply {
        self.app
            .send(
                Request::post("/api/host/heartbeat")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(
                        json!({"agent_version": "0.7.3", "lxd": "ok", "relay": "ok", "tunnel": "ok",
                               "gpu": "ok", "storage": "ok", "instances": 1})
                        .to_string(),
                    ))
                    .unwrap(),
            )
            .await
    }

    /// Whether a create for the customer could land on `host` now.
    async fn pickable(&self, host: &Host) -> bool {
        self.db()
            .pick_hosts_for_gpu(byo_server::app::instances::host_pick(
                &self.app.state,
                "spark-1",
                &self.customer.sub,
                None,
            ))
            .await
            .unwrap()
            .iter()
            .any(|p| p.id == host.id)
    }

    /// A second active host, on other hardware.
    async fn active_host_with_other_hardware(&self) -> Host {
        self.enrolled_on("c52d", "4e3b").await
    }

    /// A host provisioned and enrolled from the machine `hardware_id`, `machine_id`.
    async fn enrolled_on(&self, hardware_id: &str, machine_id: &str) -> Host {
        let (id, slug, token) = self.provisioned().await;
        let mut body = spark();
        body["hardware_id"] = json!(hardware_id);
        body["machine_id"] = json!(machine_id);
        let r = self
            .app
            .send(
                Request::post("/api/enroll")
                    .header(header::AUTHORIZATION, format!("Bearer {token}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap(),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let host_token = r.json()["host_token"].as_str().unwrap().to_owned();
        Host {
            id,
            slug,
            token: host_token,
        }
    }
}

async fn h_revoking_a_host_that_never_redeemed_is_refused(w: World) {
    let (id, slug, _token) = w.provisioned().await;
    let h = Host {
        id,
        slug,
        token: "byo_hst_none".into(),
    };
    let before = snapshot(&w, &h).await;
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/revoke", h.id))
            .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["error"], "not_enrolled");
    assert_eq!(snapshot(&w, &h).await, before);
    assert!(w.enrollment_state(&h).await.is_open());
}

async fn h_a_revoked_host_can_be_retired(w: World) {
    let h = w.active_host().await;
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/revoke", h.id))
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/retire", h.id))
            .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let l = w.life(&h).await;
    assert!(l.retired_at.is_some());
    // Its page no longer calls the relay it released "ready" (issue #42, 7).
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    let relay = &page[page.find("class=\"relay\"").unwrap()..];
    let relay = &relay[..relay.find("</dd>").unwrap()];
    assert!(
        relay.contains("released when the host was retired"),
        "{relay}"
    );
    assert!(!relay.contains("ready"), "{relay}");
    // The enrolment keeps saying what ended it.
    assert_eq!(w.enrollment_state(&h).await, EnrollmentState::Revoked);
}

/// Issue #42, 7: on the host's page, revoke and retire — neither can be undone — run only
/// once the operator has typed the host's name; a missing or wrong name is refused in words
/// and changes nothing. Afterwards the owner is told what to do next.
async fn h_the_host_page_revokes_and_retires_only_once_the_host_is_named(w: World) {
    let h = w.active_host().await;
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    assert!(
        page.contains("name=\"confirm\"") && page.contains(&format!("placeholder=\"{}\"", h.slug)),
        "{page}"
    );
    for (action, typed) in [
        ("revoke", None),
        ("revoke", Some("spark-999")),
        ("retire", Some(" ")),
    ] {
        let before = snapshot(&w, &h).await;
        let mut form = Vec::new();
        if let Some(t) = typed {
            form.push(("confirm", t));
        }
        let r =
            w.op.post_form(&format!("/admin/hosts/{}/{action}", h.id), &form)
                .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{action}: {}", r.text());
        assert!(
            r.text().contains(&format!("type its name ({})", h.slug))
                && r.text().contains("nothing was done"),
            "{}",
            r.text()
        );
        assert_eq!(snapshot(&w, &h).await, before, "{action} with {typed:?}");
    }
    let r =
        w.op.post_form(
            &format!("/admin/hosts/{}/revoke", h.id),
            &[("confirm", &h.slug)],
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(w.life(&h).await.revoke_step.0.is_some());
    retire_on_page(&w, &h).await;
    assert!(w.life(&h).await.retired_at.is_some());
    let mine = w.owner.page("/hosts").await;
    assert!(
        mine.contains("retired: it is no longer rented")
            && mine.contains("sudo byo-agent uninstall"),
        "{mine}"
    );
}

/// The operator retires `h` from its page, naming it as the form asks.
async fn retire_on_page(w: &World, h: &Host) {
    let r =
        w.op.post_form(
            &format!("/admin/hosts/{}/retire", h.id),
            &[("confirm", &h.slug)],
        )
        .await;
    assert!(r.status.is_redirection(), "{} {}", r.status, r.text());
}

async fn n1_retire_refusals_change_nothing(w: World) {
    let h = w.active_host().await;
    let retire = |id: String| {
        let op = w.op.clone();
        async move {
            op.post_empty(&format!("/api/admin/hosts/{id}/retire"))
                .await
        }
    };
    let refused = |r: support::Reply, code: &str| {
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
        assert_eq!(r.json()["error"], code, "{}", r.text());
    };
    // Active.
    let before = snapshot(&w, &h).await;
    refused(retire(h.id.clone()).await, "active");
    assert_eq!(snapshot(&w, &h).await, before);
    // Dedicated (and de-pooled).
    w.db()
        .depool_host(&h.id, "retiring", &w.op.sub, w.clock.now())
        .await
        .unwrap();
    w.db()
        .set_host_dedicated(&h.id, Some(&w.customer.sub))
        .await
        .unwrap();
    let before = snapshot(&w, &h).await;
    refused(retire(h.id.clone()).await, "dedicated");
    assert_eq!(snapshot(&w, &h).await, before);
    w.db().set_host_dedicated(&h.id, None).await.unwrap();
    // A live instance.
    let vm = w.instance(&h, "live").await;
    let before = snapshot(&w, &h).await;
    refused(retire(h.id.clone()).await, "live_instance");
    assert_eq!(snapshot(&w, &h).await, before);
    // ... a failed create is not one.
    w.db().confirm_vm_deleted(&vm, w.clock.now()).await.unwrap();
    let failed = w
        .db()
        .create_vm(
            NewVm {
                user_sub: &w.customer.sub,
                host_id: Some(&h.id),
                name: "never",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            w.clock.now(),
        )
        .await
        .unwrap();
    w.db()
        .mark_vm_creation_failed(&failed.id, w.clock.now())
        .await
        .unwrap();
    // A pre-booking whose window has not ended.
    w.db()
        .execute_unchecked(&format!(
            "insert into prebookings (id, user_sub, host_id, gpu_type, start_date, end_date, created_at)
             values ('pb-1', '{}', '{}', 'spark-1', '2026-11-01T00:00:00Z', '2027-01-01T00:00:00Z', '2026-11-01T00:00:00Z')",
            w.customer.sub, h.id
        ))
        .await
        .unwrap();
    let before = snapshot(&w, &h).await;
    refused(retire(h.id.clone()).await, "prebooked");
    assert_eq!(snapshot(&w, &h).await, before);
    // Its window ended: no longer owed.
    w.db()
        .execute_unchecked("update prebookings set end_date = '2025-01-01T00:00:00Z', start_date = '2024-12-01T00:00:00Z' where id = 'pb-1'")
        .await
        .unwrap();
    // Never enrolled: revoke (the enrolment) instead.
    let (id, slug, _) = w.provisioned().await;
    let never = Host {
        id,
        slug,
        token: "byo_hst_none".into(),
    };
    let before = snapshot(&w, &never).await;
    refused(retire(never.id.clone()).await, "revoke_instead");
    assert_eq!(snapshot(&w, &never).await, before);
    // Never enrolled and its enrolment ended without a redeem: still not a retire (its
    // allocation goes back through the enrolment's end, H), refused the same way.
    w.db()
        .execute_unchecked(&format!(
            "update host_enrollments set state = 'expired' where host_id = '{}'",
            never.id
        ))
        .await
        .unwrap();
    let before = snapshot(&w, &never).await;
    refused(retire(never.id.clone()).await, "revoke_instead");
    assert_eq!(snapshot(&w, &never).await, before);
    // Everything cleared: it retires, the failed create notwithstanding.
    let r = retire(h.id.clone()).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    // Retired is for good: retired again, de-pooled or activated, each refused by name and
    // the row as it was.
    refused(retire(h.id.clone()).await, "retired");
    for (action, body) in [
        ("depool", json!({"reason": "x"})),
        ("activate", json!({"placement": "shared"})),
    ] {
        let before = snapshot(&w, &h).await;
        let r =
            w.op.post(&format!("/api/admin/hosts/{}/{action}", h.id), body)
                .await;
        refused(r, "retired");
        assert_eq!(snapshot(&w, &h).await, before, "{action}");
    }
}

async fn n2_a_provider_fault_stops_retire_before_the_stamp_and_retire_again_finishes(w: World) {
    let h = w.active_host().await;
    w.db()
        .depool_host(&h.id, "retiring", &w.op.sub, w.clock.now())
        .await
        .unwrap();
    // Cloudflare fails: the names go first (issue #36, 8: no name may point at an address
    // handed back), so the first removal fails and the relay and its address are kept;
    // nothing is stamped.
    w.cf.lock().unwrap().fail = Some(Method::DELETE);
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/retire", h.id))
            .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert_eq!(r.json()["error"], "provider_failed");
    assert_eq!(
        w.outside(&h.slug),
        (1, 1, 1, 2),
        "the names go first: the relay and its address are kept"
    );
    assert!(w.life(&h).await.retired_at.is_none(), "nothing stamped");
    assert_eq!(w.host_relay(&h.token).await.status, StatusCode::OK);
    w.cf.lock().unwrap().fail = None;

    // GCP fails on a second host: the names are gone, the relay and its address kept,
    // nothing stamped.
    let h2 = w.active_host_with_other_hardware().await;
    w.db()
        .depool_host(&h2.id, "retiring", &w.op.sub, w.clock.now())
        .await
        .unwrap();
    w.gcp.lock().unwrap().fail = Some(Method::DELETE);
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/retire", h2.id))
            .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    assert_eq!(w.outside(&h2.slug), (1, 1, 0, 0));
    assert!(w.life(&h2).await.retired_at.is_none());
    w.gcp.lock().unwrap().fail = None;

    // Retire again carries on, and finishes with nothing left in either fake.
    for host in [&h, &h2] {
        let r =
            w.op.post_empty(&format!("/api/admin/hosts/{}/retire", host.id))
                .await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
        assert_eq!(w.outside(&host.slug), (0, 0, 0, 0));
        let l = w.life(host).await;
        assert!(l.retired_at.is_some() && !l.active);
        assert!(!l.relay_key_kept);
        // Nothing it was issued still works; its enrolment is closed.
        assert_eq!(
            w.host_relay(&host.token).await.status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(w.enrollment_state(host).await, EnrollmentState::Released);
    }
    let g = w.gcp.lock().unwrap();
    let c = w.cf.lock().unwrap();
    assert!(g.instances.is_empty() && g.addresses.is_empty());
    assert!(c.tunnels.is_empty() && c.records.is_empty());
}

async fn n7_a_retired_hosts_hardware_enrols_again(w: World) {
    let h = w.active_host().await;
    // While it is not retired, the same box cannot become a second host.
    let (_, _, token) = w.provisioned().await;
    let r = w.enroll(&token).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text());
    // Retired through the page.
    w.db()
        .depool_host(&h.id, "retiring", &w.op.sub, w.clock.now())
        .await
        .unwrap();
    retire_on_page(&w, &h).await;
    let nodes = w.db().host_nodes(&h.id).await.unwrap();
    assert!(nodes[0].retired_at.is_some(), "hosts_retire_nodes");
    // The same hardware redeems again, as a new host.
    let (new_id, _, token) = w.provisioned().await;
    let r = w.enroll(&token).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let nodes = w.db().host_nodes(&new_id).await.unwrap();
    assert_eq!(nodes[0].hardware_id, "b41c");
    // The retired rows still say which host it was in.
    assert_eq!(
        w.db().host_nodes(&h.id).await.unwrap()[0].hardware_id,
        "b41c"
    );
}

async fn a3_a_dead_relay_is_replaced_at_its_address_with_the_key_the_host_trusts(w: World) {
    let h = w.active_host().await;
    let old = w.db().relay_record(&h.id).await.unwrap().relay_ip.unwrap();
    assert_eq!(
        w.host_relay(&h.token).await.json()["endpoint"],
        format!("{old}:51820")
    );
    // The first relay booted and fetched its key.
    let first = w.fetch_relay_secrets(&h.slug).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let first_bootstrap = w.relay_metadata(&h.slug);
    // The relay died: mark the instance GCP holds, to tell it from its replacement.
    w.gcp
        .lock()
        .unwrap()
        .instances
        .get_mut(&format!("{}-relay", h.slug))
        .unwrap()["dead"] = json!(true);
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/replace-relay", h.id))
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let rr = r.json();
    let new = rr["new_address"].as_str().unwrap().to_owned();
    assert_eq!(new, old, "the reserved address is kept");
    assert_eq!(rr["old_address"], old.as_str());
    assert_eq!(rr["same_address"], true);
    assert_eq!(rr["name"], format!("{}-relay", h.slug));
    // The host's endpoint is unchanged: it needs nothing.
    assert_eq!(
        w.host_relay(&h.token).await.json()["endpoint"],
        format!("{old}:51820")
    );
    // One relay, a new instance at the same address, booted with the same WireGuard key
    // (the host's tunnel trusts it); one address, the same.
    assert_eq!(w.outside(&h.slug).0, 1);
    assert_eq!(w.outside(&h.slug).1, 1);
    {
        let g = w.gcp.lock().unwrap();
        let inst = &g.instances[&format!("{}-relay", h.slug)];
        assert!(inst.get("dead").is_none(), "the dead instance was replaced");
        assert_eq!(
            inst["networkInterfaces"][0]["accessConfigs"][0]["natIP"],
            new.as_str()
        );
        let script = inst["metadata"]["items"][0]["value"].as_str().unwrap();
        assert_ne!(script, first_bootstrap, "the new relay has its own token");
    }
    // The new relay's first boot fetches the same WireGuard key: the one the host trusts.
    let again = w.fetch_relay_secrets(&h.slug).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    let key_of = |r: &support::Reply| {
        r.text()
            .lines()
            .find_map(|l| l.strip_prefix("wireguard-private-key ").map(str::to_owned))
            .unwrap()
    };
    assert_eq!(key_of(&again), key_of(&first));
    // The customer SSH wildcard still points at it.
    {
        let c = w.cf.lock().unwrap();
        let wildcard = c
            .records
            .values()
            .find(|r| r["type"] == "A" && r["name"].as_str().unwrap().contains(&h.slug))
            .unwrap();
        assert_eq!(wildcard["content"], new.as_str());
    }
    let a = w.db().audit_of_host(&h.id, 10).await.unwrap();
    let a = a
        .iter()
        .find(|a| a.action == "host.relay_replaced")
        .unwrap();
    assert_eq!(a.details.0["new_address"], new.as_str());

    // Refused for a host that never redeemed (its relay is onboarding's), changing nothing.
    let (id, slug, _) = w.provisioned().await;
    let never = Host {
        id,
        slug,
        token: "byo_hst_none".into(),
    };
    let before = snapshot(&w, &never).await;
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/replace-relay", never.id))
            .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.json()["error"], "not_enrolled");
    assert_eq!(snapshot(&w, &never).await, before);
    // GCP failing to release: the relay is not recorded as replaced; again finishes.
    w.gcp.lock().unwrap().fail = Some(Method::DELETE);
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/replace-relay", h.id))
            .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    w.gcp.lock().unwrap().fail = None;
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/replace-relay", h.id))
            .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(w.outside(&h.slug).0, 1);
}

async fn the_one_host_page_shows_the_host_and_its_actions_bounded(w: World) {
    let h = w.active_host().await;
    let vm = w.instance(&h, "on-the-page").await;
    let beat = json!({"agent_version": "0.7.3+abc", "lxd": "ok", "relay": "ok",
        "tunnel": "down", "gpu": "ok", "storage": "ok",
        "instances": 1, "details": {"tunnel": "q".repeat(8_000)}});
    let r = w
        .app
        .send(
            Request::post("/api/host/heartbeat")
                .header(header::AUTHORIZATION, format!("Bearer {}", h.token))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(beat.to_string()))
                .unwrap(),
        )
        .await;
    assert!(r.status.is_success(), "{} {}", r.status, r.text());
    w.clock.advance(chrono::Duration::seconds(42));
    let list = w.op.page("/admin/hosts").await;
    assert!(list.contains(&format!("href=\"/admin/hosts/{}\"", h.id)));
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    for want in [
        &format!("Host {}", h.slug),
        "active (shared)",
        "(42 s ago)",
        "0.7.3+abc",
        "finished 2026-11-29",
        "holds version",
        "on-the-page",
        "live",
        "host.activate",
        "De-pool",
        "Revoke",
        "Retire",
        "Replace relay",
        "Takes it out of placement",
    ] {
        assert!(page.contains(want), "{want} missing");
    }
    assert!(!page.contains(&"q".repeat(3000)), "the details are cut");
    assert!(page.len() < 40_000, "{} bytes", page.len());
    // Stuck deletes show.
    w.db().request_vm_delete(&vm, w.clock.now()).await.unwrap();
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    assert!(page.contains("not confirmed by the host"));
    // Only operators read it.
    let r = w.customer.get(&format!("/admin/hosts/{}", h.id)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // A refusal from an action is shown on the page.
    let r =
        w.op.post_form(
            &format!("/admin/hosts/{}/retire", h.id),
            &[("confirm", &h.slug)],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(r.text().contains("de-pool it first"));
}

async fn stop_hosting_depools_and_drains_the_owners_own_host_then_shows_uninstall(w: World) {
    let h = w.active_host().await;
    let vm = w.instance(&h, "rented").await;
    // The owner's words: renting, idle, unreachable.
    assert!(w.beat(&h.token).await.status.is_success());
    let page = w.owner.page("/hosts").await;
    assert!(page.contains("renting: a customer is using it"), "{page}");
    assert!(page.contains("Stop hosting"));
    // The API says what the page says (issue #43, 3: `byo hosts list`).
    let listed = owner_api_view(&w, &h).await;
    assert_eq!(listed["state"], "renting: a customer is using it");
    assert_eq!(listed["may_stop"], json!(true));
    w.clock.advance(chrono::Duration::minutes(10));
    let page = w.owner.page("/hosts").await;
    assert!(
        page.contains("unreachable since 2026-11-29 12:00 UTC"),
        "{page}"
    );
    assert!(w.beat(&h.token).await.status.is_success());

    // Nobody else may stop it: a customer, another host owner, even an operator (theirs is
    // de-pool and revoke) are told there is no such host, and nothing changes.
    let other = w.app.community_host("other-owner@example.com").await;
    let before = snapshot(&w, &h).await;
    for u in [&w.customer, &other, &w.op] {
        let r = u.post_empty(&format!("/api/hosts/{}/stop", h.id)).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", u.email);
    }
    assert_eq!(snapshot(&w, &h).await, before);

    // The host does not confirm: stopping, and the page says so.
    w.agents.answer(
        Op::Delete,
        agents::Answer::unreachable("connection refused"),
    );
    let r = w
        .owner
        .post_empty(&format!("/api/hosts/{}/stop", h.id))
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert_eq!(r.json()["drain"]["waiting"], json!([vm]));
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .starts_with("the host has not confirmed the end of 1 instance(s)"),
        "{}",
        r.text()
    );
    assert!(!w.life(&h).await.active);
    let page = w.owner.page("/hosts").await;
    assert!(
        page.contains("stopping: waiting for 1 instance(s) to end"),
        "{page}"
    );
    assert!(!page.contains("byo-agent uninstall"));
    // It answers: stopped, and the uninstall instructions show, from the page's form.
    w.agents.answer(Op::Delete, agents::Answer::Ok);
    let r = w
        .owner
        .post_form(&format!("/hosts/{}/stop", h.id), &[])
        .await;
    assert!(r.status.is_redirection(), "{} {}", r.status, r.text());
    let v = w.db().vm(&vm).await.unwrap().unwrap();
    assert!(v.deleted_at.is_some());
    let deleted = w
        .db()
        .audit_of_host(&h.id, 50)
        .await
        .unwrap()
        .into_iter()
        .find(|a| a.action == "vm.delete_requested")
        .unwrap();
    assert_eq!(deleted.details.0["by"], "host_owner");
    let page = w.owner.page("/hosts").await;
    assert!(page.contains("stopped: you can uninstall now"), "{page}");
    let listed = owner_api_view(&w, &h).await;
    assert_eq!(listed["state"], "stopped: you can uninstall now");
    assert_eq!(listed["may_stop"], json!(false));
    assert!(page.contains("sudo byo-agent uninstall"));
    assert!(page.contains("--keep-lxd"));
    assert!(
        page.contains("curl -fsSL http://localhost:8080/install.sh | sudo bash -s -- --uninstall")
    );
    assert!(!page.contains(">Stop hosting<"));
    // The second stop found it de-pooled by its owner already: one stop recorded.
    let stops = w
        .db()
        .audit_of_host(&h.id, 50)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action == "host.stop_hosting")
        .count();
    assert_eq!(stops, 1);
    // De-pool and drain only: access is kept (not a revoke), nothing retired.
    let l = w.life(&h).await;
    assert!(l.revoke_step.0.is_none() && l.retired_at.is_none());
    assert_eq!(w.outside(&h.slug), (1, 1, 1, 2));
}

/// The owner's own listing of `h` (`GET /api/hosts`); nobody else's lists it.
async fn owner_api_view(w: &World, h: &Host) -> Value {
    let r = w.owner.get("/api/hosts").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let mine = r.json().as_array().unwrap().clone();
    let other = w.customer.get("/api/hosts").await.json();
    assert!(
        other
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["host_id"] != json!(h.id))
    );
    mine.into_iter()
        .find(|v| v["host_id"] == json!(h.id))
        .expect("the owner's host is listed")
}

/// An owner stopping a host an operator de-pooled takes it over as stopped: the reason
/// becomes the owner's, and the page offers the uninstall.
async fn stop_hosting_a_host_an_operator_depooled_makes_it_the_owners_stop(w: World) {
    let h = w.active_host().await;
    let r =
        w.op.post(
            &format!("/api/admin/hosts/{}/depool", h.id),
            json!({"reason": "maintenance"}),
        )
        .await;
    assert!(r.status.is_success(), "{}", r.text());
    assert!(
        w.owner
            .page("/hosts")
            .await
            .contains("de-pooled: maintenance")
    );
    let r = w
        .owner
        .post_empty(&format!("/api/hosts/{}/stop", h.id))
        .await;
    assert!(r.status.is_success(), "{}", r.text());
    let page = w.owner.page("/hosts").await;
    assert!(page.contains("stopped: you can uninstall now"), "{page}");
}

/// Item 8: each failure the design names is on /admin/hosts/{id} by name as soon as the
/// heartbeat (or the backend's own record) carrying it lands, with no SSH to the host.
async fn the_one_host_page_names_each_failure_within_one_heartbeat(w: World) {
    let h = w.active_host().await;
    let problems = |page: &str| -> Vec<String> {
        page.split("<li class=\"problem\"><strong>")
            .skip(1)
            .map(|p| p.split('<').next().unwrap().to_owned())
            .collect()
    };
    let page_of = |h: &Host| format!("/admin/hosts/{}", h.id);
    let beat = |details: Value| {
        let token = h.token.clone();
        let app = &w.app;
        async move {
            let r = app
                .send(
                    Request::post("/api/host/heartbeat")
                        .header(header::AUTHORIZATION, format!("Bearer {token}"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Body::from(
                            json!({"agent_version": "0.7.3", "lxd": "ok", "relay": "ok",
                                   "tunnel": "ok", "gpu": "ok", "storage": "ok",
                                   "instances": 0, "details": details})
                            .to_string(),
                        ))
                        .unwrap(),
                )
                .await;
            assert!(r.status.is_success(), "{}", r.text());
        }
    };
    // Heard from and in order: nothing is named.
    beat(json!({"relay_map": "in_sync"})).await;
    let page = w.op.page(&page_of(&h)).await;
    assert!(problems(&page).is_empty(), "{:?}", problems(&page));
    assert!(page.contains("None seen."));

    // Relay map drift, and a rollback, each named by the beat that carries it.
    beat(json!({"relay_map": "drift_rewritten"})).await;
    assert_eq!(
        problems(&w.op.page(&page_of(&h)).await),
        ["relay map drift"]
    );
    beat(json!({"relay_map": "in_sync", "rollback": {"at": "2026-11-29T12:00:05Z"}})).await;
    assert_eq!(problems(&w.op.page(&page_of(&h)).await), ["rollback fired"]);
    // L3.3: a pair whose node1 does not answer is named half a pair, with the agent's words.
    beat(json!({"relay_map": "in_sync", "half_a_pair": ["node1 cannot be reached over the management network: timed out"]})).await;
    let page = w.op.page(&page_of(&h)).await;
    assert_eq!(problems(&page), ["half a pair"]);
    assert!(
        page.contains("node1 cannot be reached over the management network"),
        "{page}"
    );
    // #16: the host reports the list it holds; one past its expiry is named.
    beat(json!({"relay_map": "in_sync", "operator_keys": {"version": 1, "expires": "2026-11-01T00:00:00Z"}})).await;
    assert_eq!(
        problems(&w.op.page(&page_of(&h)).await),
        ["key list expired"]
    );
    beat(json!({"relay_map": "in_sync", "operator_keys": {"version": 1, "expires": "2027-02-01T00:00:00Z"}})).await;
    assert!(problems(&w.op.page(&page_of(&h)).await).is_empty());
    beat(json!({"relay_map": "in_sync"})).await;

    // A stuck delete, a failed push (and the list it leaves the host lagging on), a bench.
    let vm = w.instance(&h, "stuck-one").await;
    w.db().request_vm_delete(&vm, w.clock.now()).await.unwrap();
    w.db()
        .record_key_push(&h.id, Err("the host did not answer"), w.clock.now())
        .await
        .unwrap();
    for _ in 0..3 {
        w.db()
            .record_placement_failure(&h.id, "refused", 3, w.clock.now())
            .await
            .unwrap();
    }
    assert_eq!(
        problems(&w.op.page(&page_of(&h)).await),
        ["stuck delete", "failed push", "benched"],
        "a failed push keeps the version the host held (v1, from its enrolment): not lagging"
    );

    // A preparation that stopped: named with its step.
    let preparing = w.active_host_with_other_hardware().await;
    let id = preparing.id.clone();
    w.db()
        .record_prepare_state(
            &id,
            0,
            &byo_wire::prepare::PrepareState {
                step: "lxd-install".into(),
                state: byo_wire::prepare::StepState::Failed,
                attempt: 1,
                error: Some("apt said no".into()),
                is_final: false,
                at: w.clock.now(),
            },
            false,
            w.clock.now(),
        )
        .await
        .unwrap();
    let page = w.op.page(&format!("/admin/hosts/{id}")).await;
    assert!(
        problems(&page).contains(&"prepare stopped".to_owned()),
        "{page}"
    );
    assert!(page.contains("at step lxd-install"));

    // Silence past placement's age: the agent is named unreachable; near the published
    // list's expiry, the list is named expiring.
    let published = w.db().published_key_list().await.unwrap().unwrap();
    let expires = byo_core::keylist::KeyList::from_canonical(&published.body)
        .unwrap()
        .expires;
    w.clock
        .advance(expires - w.clock.now() - chrono::Duration::days(3));
    // (a session from then: the first one has lapsed)
    let op = w.app.operator("later-op@example.com").await;
    let named = problems(&op.page(&page_of(&h)).await);
    assert_eq!(named[0], "agent unreachable");
    assert!(named.contains(&"key list expiring".to_owned()), "{named:?}");
}

/// Host configuration after go-live, 5: the deliberate run (`byo-agent prepare --again`)
/// reports every step through host-report as the first preparation did. A failed step on a
/// host in service is named on /admin ("re-prepare failed", its step and reason) and takes
/// nothing away: the host stays active and prepared, with its instance, its placement and
/// its audit as they were. A completed run clears the name.
async fn l_a_failed_re_prepare_is_named_on_the_host_page_and_the_host_stays_in_service(w: World) {
    let h = w.active_host().await;
    w.instance(&h, "stays").await;
    let host_row = || async { w.db().host(&h.id).await.unwrap().unwrap() };
    let before = host_row().await;
    let facts = snapshot(&w, &h).await;
    let report = |state: Value, completed: bool| {
        let token = h.token.clone();
        let app = &w.app;
        async move {
            let r = app
                .send(
                    Request::post("/api/host/report")
                        .header(header::AUTHORIZATION, format!("Bearer {token}"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Body::from(
                            json!({"node": 0, "state": state, "completed": completed}).to_string(),
                        ))
                        .unwrap(),
                )
                .await;
            assert!(r.status.is_success(), "{}", r.text());
        }
    };
    let at = w.clock.now().to_rfc3339();
    let step = |name: &str, state: &str, error: Option<&str>| json!({"step": name, "state": state, "attempt": 1, "error": error, "final": false, "at": at});
    report(step("operator-access", "satisfied", None), false).await;
    report(
        step(
            "earlyoom",
            "failed",
            Some("apply failed: systemctl enable earlyoom: Unit file earlyoom.service is masked."),
        ),
        false,
    )
    .await;
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    assert!(
        page.contains(
            "<strong>re-prepare failed</strong>: at earlyoom: apply failed: systemctl enable earlyoom: Unit file earlyoom.service is masked."
        ),
        "{page}"
    );
    assert!(!page.contains("prepare stopped"), "{page}");
    assert!(
        page.contains("prepared again since, which stopped at: earlyoom failed"),
        "{page}"
    );
    // Nothing taken away: still active, prepared when it was, its instance and the rest.
    let after = host_row().await;
    assert!(after.active);
    assert_eq!(after.prepared_at, before.prepared_at);
    assert_eq!(after.placement, before.placement);
    assert_eq!(snapshot(&w, &h).await, facts);

    // Run again to completion: the last step's report carries completed, and the name goes.
    report(step("self-check", "satisfied", None), true).await;
    let page = w.op.page(&format!("/admin/hosts/{}", h.id)).await;
    assert!(!page.contains("re-prepare failed"), "{page}");
    assert_eq!(host_row().await.prepared_at, before.prepared_at);
}

/// Retire refuses a revoke still in progress, replace-relay refuses a host being revoked and a
/// host provisioned before relay keys were kept; each refusal leaves the host, its relay and
/// the outside exactly as they were.
async fn a_host_being_revoked_or_without_a_kept_relay_key_is_refused_and_nothing_changes(w: World) {
    let h = w.active_host().await;
    // Drained, then stopped removing access: GCP fails every delete.
    w.gcp.lock().unwrap().fail = Some(Method::DELETE);
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/revoke", h.id))
            .await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    w.gcp.lock().unwrap().fail = None;
    assert_eq!(
        w.life(&h).await.revoke_step.0,
        Some(RevokeStep::RemovingAccess)
    );
    let before = (snapshot(&w, &h).await, w.outside(&h.slug));
    for (path, code) in [
        ("retire", "revoke_in_progress"),
        ("replace-relay", "revoked"),
    ] {
        let r =
            w.op.post_empty(&format!("/api/admin/hosts/{}/{path}", h.id))
                .await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{path}: {}", r.text());
        assert_eq!(r.json()["error"], code, "{path}");
        assert_eq!(
            (snapshot(&w, &h).await, w.outside(&h.slug)),
            before,
            "{path}"
        );
    }

    // Provisioned before 0007: no relay key kept, so no relay it could trust.
    let old = w.active_host_with_other_hardware().await;
    w.db()
        .execute_unchecked(&format!(
            "update hosts set relay_wg_key = null where id = '{}'",
            old.id
        ))
        .await
        .unwrap();
    let before = (snapshot(&w, &old).await, w.outside(&old.slug));
    let r =
        w.op.post_empty(&format!("/api/admin/hosts/{}/replace-relay", old.id))
            .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(r.json()["error"], "relay_key_unknown");
    assert_eq!((snapshot(&w, &old).await, w.outside(&old.slug)), before);
}

/// Issue #36: a relay's WireGuard key and TLS key are not in its instance metadata (readable
/// by anything on the relay and every project viewer, for the instance's life); its startup
/// script carries a single-use token, and the first boot fetches them with it — once, within
/// the hour, and never for a host being revoked. Every refusal spends nothing and writes
/// nothing.
async fn a_a_relays_secrets_are_not_in_its_metadata_and_its_first_boot_fetches_them_once(w: World) {
    let (id, slug, _) = w.provisioned().await;
    let kept = w.kept_relay_key(&id).await;
    let script = w.relay_metadata(&slug);
    assert!(
        !script.contains(&kept) && !script.lines().any(|l| l.starts_with("-----BEGIN")),
        "no secret in the metadata:\n{script}"
    );
    assert!(script.contains("/api/relay/secrets") && script.contains("byo_rly_"));

    // Tokens that are not this relay's: none, another kind, a well-formed stranger.
    let stranger =
        byo_core::tokens::SecretToken::generate(byo_core::tokens::TokenKind::RelaySecrets);
    let host_kind = byo_core::tokens::SecretToken::generate(byo_core::tokens::TokenKind::Host);
    for bad in ["", host_kind.expose(), stranger.expose()] {
        let r = w.relay_secrets_with(bad).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{bad:?}: {}", r.text());
        assert_eq!(r.json()["error"], "invalid_token");
    }
    assert!(w.db().relay_secrets_fetched(&id).await.unwrap().is_none());
    assert_eq!(relay_fetches(&w, &id).await, 0);

    // The relay's own: its kept WireGuard key and a certificate and key for its name.
    let r = w.fetch_relay_secrets(&slug).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let answer = r.text();
    assert_eq!(
        answer.lines().next(),
        Some(format!("wireguard-private-key {kept}").as_str())
    );
    let cert = answer
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)
        .expect("a certificate");
    assert!(cert.contains("-----END CERTIFICATE-----"));
    assert!(answer.contains("-----BEGIN PRIVATE KEY-----"));
    let cert_pem = format!("-----BEGIN CERTIFICATE-----{cert}");
    let cert_pem = &cert_pem[..cert_pem.find("-----END CERTIFICATE-----").unwrap() + 25];
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("relay.crt"), cert_pem).unwrap();
    let shown = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
        .arg(dir.path().join("relay.crt"))
        .output()
        .unwrap();
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(&format!("DNS:{slug}.relay.")),
        "{}",
        String::from_utf8_lossy(&shown.stdout)
    );
    let fetched = w.db().relay_secrets_fetched(&id).await.unwrap().unwrap();
    assert_eq!(fetched.0, w.clock.now());
    assert_eq!(relay_fetches(&w, &id).await, 1);

    // Once: the token in the metadata is spent, and a second fetch changes nothing.
    let again = w.fetch_relay_secrets(&slug).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED, "{}", again.text());
    assert_eq!(
        w.db().relay_secrets_fetched(&id).await.unwrap(),
        Some(fetched)
    );
    assert_eq!(relay_fetches(&w, &id).await, 1);

    // A token not spent within the hour lapses.
    let (late, late_slug, _) = w.provisioned().await;
    w.clock.advance(chrono::Duration::minutes(
        byo_server::app::host_provision::SECRETS_TOKEN_MINUTES,
    ));
    let r = w.fetch_relay_secrets(&late_slug).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    assert!(w.db().relay_secrets_fetched(&late).await.unwrap().is_none());
}

async fn relay_fetches(w: &World, id: &str) -> usize {
    w.db()
        .audit_of_host(id, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action == "relay.secrets_fetched")
        .count()
}

/// A host being revoked is given no relay secrets, whatever token its relay holds.
async fn h_a_host_being_revoked_gets_no_relay_secrets(w: World) {
    let h = w.active_host().await;
    w.db()
        .begin_revoke(&h.id, "owner left", &w.op.sub, w.clock.now())
        .await
        .unwrap();
    let r = w.fetch_relay_secrets(&h.slug).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    assert!(w.db().relay_secrets_fetched(&h.id).await.unwrap().is_none());
}

/// Issue #39 (A.4): an owner who clicked "Add a GPU" and will not run the command cancels
/// the allocation from their page, and the relay, its address, the tunnel and the names are
/// handed back at once rather than when the token lapses. Nobody else can (404, as for a host
/// that does not exist); an enrolled host is refused (stop hosting is its way out); a
/// provider failing part way leaves the enrolment revoked and reap's next sweep finishes.
async fn a4_the_owner_cancels_their_pending_allocation_and_everything_is_handed_back(w: World) {
    let (id, slug, token) = w.provisioned().await;
    let held = w.outside(&slug);
    assert_eq!((held.0, held.1, held.2), (1, 1, 1), "{held:?}");
    let path = format!("/api/hosts/{id}/cancel");
    for who in [&w.customer, &w.op] {
        let r = who.post_empty(&path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text());
    }
    let r = w.owner.post_empty("/api/hosts/no-such-host/cancel").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(w.outside(&slug), held, "nothing handed back by a refusal");

    // Cloudflare failing: revoked at once, the rest handed back by reap's next sweep.
    w.cf.lock().unwrap().fail = Some(Method::DELETE);
    let r = w.owner.post_empty(&path).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert!(
        w.enroll(&token).await.status.is_client_error(),
        "the command no longer works"
    );
    assert_eq!(w.outside(&slug).0, 1, "the relay waits for the names to go");
    w.cf.lock().unwrap().fail = None;
    byo_server::app::reap::reap_once(&w.app.state)
        .await
        .unwrap();
    assert_eq!(w.outside(&slug), (0, 0, 0, 0));
    let cancelled: Vec<_> = w
        .db()
        .audit_log(100)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action == "enrollment.cancel")
        .collect();
    assert_eq!(cancelled.len(), 1);
    assert_eq!(
        cancelled[0].actor_sub.as_deref(),
        Some(w.owner.sub.as_str())
    );
    assert_eq!(cancelled[0].details.0["host_id"], id.as_str());

    // The plain case, from the page: 303 to /hosts, and nothing left outside.
    let (id2, slug2, _) = w.provisioned().await;
    let page = w.owner.get("/hosts").await.text();
    assert!(
        page.contains(&format!("action=\"/hosts/{id2}/cancel\"")),
        "the owner's page offers the cancel: {page}"
    );
    let r = w
        .owner
        .post_form(&format!("/hosts/{id2}/cancel"), &[])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    assert_eq!(w.outside(&slug2), (0, 0, 0, 0));
    let r = w
        .owner
        .post_empty(&format!("/api/hosts/{id2}/cancel"))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "gone: {}", r.text());

    // An enrolled host is the owner's to stop, not to cancel; nothing changes.
    let h = w.active_host().await;
    let before = snapshot(&w, &h).await;
    let r = w
        .owner
        .post_empty(&format!("/api/hosts/{}/cancel", h.id))
        .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("enrolled"))
    );
    assert_eq!(snapshot(&w, &h).await, before);
}
