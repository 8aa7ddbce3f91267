//! The Store conformance suite: every scenario runs on SQLite, and on PostgreSQL whenever
//! the test command started one (always under CI). Scenario names point into the design.

use byo_wire::states::{EnrollmentState, KeyListState};
use std::sync::Arc;

use byo_core::tokens::{SecretToken, TokenHash, TokenKind};
use byo_db::enrollments::NewEnrollment;
use byo_db::hosts::{NewHost, NewHostNode};
use byo_db::operator_keys::KeyChange;
use byo_db::provisioning::{RedeemDecision, RedeemNode, Redeemed};
use byo_db::signups::SignupRow;
use byo_db::testing::{self, TestDb};
use byo_db::users::NewUser;
use byo_db::vms::{HostBenchRow, NewVm, PlacementScore};
use byo_db::{DbError, GuardedWrite, Store};
use byo_wire::Role;
use byo_wire::prepare::{PrepareState, StepState};
use chrono::{DateTime, Duration, DurationRound, TimeDelta, Utc};
use serde_json::json;

/// Generates `<scenario>::sqlite` and `<scenario>::postgres` tests for each scenario.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(byo_db::testing::sqlite().await).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                if let Some(db) = byo_db::testing::postgres().await {
                    super::$name(db).await
                }
            }
        }
    )*};
}

conformance!(
    g8_guarded_delete_writes_first_lands_wins,
    g8_concurrent_confirmations_write_deleted_at_once,
    n6_retired_host_is_held_inactive_and_undedicated,
    d3_activation_refused_until_preparation_finished,
    n7_hardware_id_unique_among_nodes_not_retired,
    k_131_a_nodes_rails_are_replaced_whole_on_a_live_host_only,
    step28_single_use_token_redeemed_once_by_32_callers,
    step28_unknown_spent_rejected_and_expired_tokens_get_the_same_none,
    last_superadmin_cannot_be_revoked,
    accounts_a_user_is_read_by_id_and_email_and_the_overview_is_each_ones_own,
    g_instances_are_read_live_by_owner_and_by_host_and_a_stuck_delete_is_found,
    c_a_host_is_known_by_its_token_reached_by_its_target_and_its_progress_kept_per_machine,
    a_the_relay_ca_is_made_once_and_the_first_insert_wins,
    step133_beats_arriving_together_are_written_together_each_answered_as_if_alone,
    e1_placement_benches_a_host_after_failures_in_a_row_and_a_success_or_an_operator_clears_it,
    sessions_expire_and_end,
    a36_a_signup_waits_until_it_expires_or_its_address_is_confirmed,
    email_is_unique,
    no_table_holds_a_plaintext_token,
    m10_changes_before_a_signature_add_up_in_one_draft,
    m10_concurrent_changes_are_applied_one_on_top_of_the_other,
    m10_one_of_two_concurrent_publishes_wins_and_only_the_newest,
    m12_withdrawing_deletes_the_draft_and_its_changes,
    m6_a_failed_push_keeps_the_version_the_host_held,
    i_a_login_is_kept_once_bounded_and_newest_first,
    e2_the_pick_the_claim_and_the_batchs_keys_read_what_is_there,
    e2_step59_a_batchs_attempts_are_written_together_each_started_taken_or_lost_alone,
    e2_the_queues_reads_count_what_is_open_and_a_run_lets_go_of_its_claims,
    billing_a_customer_is_kept_once_and_the_first_writer_wins,
    billing_a_webhook_event_is_new_then_unfinished_then_processed,
    billing_usage_reads_billable_instances_a_page_at_a_time,
    billing_one_charge_per_period_and_one_refund_per_instance,
    e3_2_a_booking_pins_a_free_host_and_never_one_held_for_its_window,
    e3_the_unpaid_cap_counts_open_unpaid_bookings_only,
    e3_1_paid_at_is_written_once_and_cancel_is_only_the_bookers_unpaid,
    e3_4_due_ended_close_reopen_and_the_launchers_write,
    h1_depool_then_a_revoke_recorded_step_by_step_and_never_backwards,
    n1_retire_blockers_and_the_relays_kept_key,
    a_a_relays_secrets_token_is_spent_once_and_never_when_lapsed_or_revoked,
    g_unsettled_creates_by_age_and_a_delete_of_one_that_never_ran,
    n_the_one_host_pages_reads_its_instances_and_its_audit,
    a_provision_counts_the_cap_and_never_reuses_a_slug,
    a_the_relay_and_tunnel_are_recorded_on_the_host,
    step28_redeem_writes_what_the_judge_decided_and_an_abort_nothing,
    reap_hands_back_rejected_revoked_and_lapsed_allocations,
    h_revoking_a_booked_never_redeemed_host_is_refused_and_reap_keeps_what_is_named,
    e2_keep_waiting_and_the_ended_rows,
    fleet_read_gauges_and_stopped_hosts,
    a36_8_sealed_values_are_read_by_version_and_replaced_only_where_unchanged,
    d_a_path_walk_runs_one_at_a_time_per_host_and_ends_once,
);

// The Store rules of the files whose rules the server's suites drove alone (issue #19: a byo-db
// mutant runs byo-db's tests only, so those rules are pinned here too).
#[path = "conformance/billing.rs"]
mod billing_rules;
use billing_rules::*;
#[path = "conformance/prebookings.rs"]
mod prebooking_rules;
use prebooking_rules::*;
#[path = "conformance/lifecycle.rs"]
mod lifecycle_rules;
use lifecycle_rules::*;
#[path = "conformance/provisioning.rs"]
mod provisioning_rules;
use provisioning_rules::*;
#[path = "conformance/sealed.rs"]
mod sealed_rules;
use sealed_rules::*;

/// Microsecond precision: what both backends store.
fn now() -> DateTime<Utc> {
    Utc::now()
        .duration_trunc(TimeDelta::microseconds(1))
        .unwrap()
}

async fn user(store: &Store, email: &str) -> String {
    store
        .create_user(
            NewUser {
                email,
                display_name: "",
                password_hash: "$argon2id$x",
            },
            now(),
        )
        .await
        .unwrap()
        .sub
}

async fn host(store: &Store, owner: &str, slug: &str) -> String {
    store
        .insert_host(
            NewHost {
                slug,
                owner_sub: owner,
                profile_id: "gb10-spark-1",
                gpu_type: "spark-1",
            },
            now(),
        )
        .await
        .unwrap()
        .id
}

async fn vm(store: &Store, user_sub: &str, host_id: &str) -> String {
    store
        .create_vm(
            NewVm {
                user_sub,
                host_id: Some(host_id),
                name: "vm-1",
                gpu_type: "spark-1",
                ssh_hostname: Some("abc.spark-1.ssh.example"),
            },
            now(),
        )
        .await
        .unwrap()
        .id
}

async fn g8_guarded_delete_writes_first_lands_wins(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let h = host(&db, &owner, "spark-1").await;
    let v = vm(&db, &owner, &h).await;
    let first = now();
    let later = first + Duration::seconds(5);

    assert_eq!(
        db.request_vm_delete(&v, first).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.request_vm_delete(&v, later).await.unwrap(),
        GuardedWrite::AlreadySet
    );
    let row = db.vm(&v).await.unwrap().unwrap();
    assert_eq!(
        row.delete_requested_at,
        Some(first),
        "the second request changed nothing"
    );
    assert_eq!(row.deleted_at, None, "a request stops nothing");

    assert_eq!(
        db.confirm_vm_deleted(&v, later).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.confirm_vm_deleted(&v, later + Duration::seconds(1))
            .await
            .unwrap(),
        GuardedWrite::AlreadySet
    );
    let row = db.vm(&v).await.unwrap().unwrap();
    assert_eq!(row.deleted_at, Some(later));
    assert_eq!(row.delete_requested_at, Some(first));

    // Either order composes: confirmation landing before the request leaves both facts.
    let v2 = vm(&db, &owner, &h).await;
    assert_eq!(
        db.confirm_vm_deleted(&v2, first).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.request_vm_delete(&v2, later).await.unwrap(),
        GuardedWrite::Written
    );
    let row = db.vm(&v2).await.unwrap().unwrap();
    assert_eq!(
        (row.deleted_at, row.delete_requested_at),
        (Some(first), Some(later))
    );
}

async fn g8_concurrent_confirmations_write_deleted_at_once(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let h = host(&db, &owner, "spark-1").await;
    let v = vm(&db, &owner, &h).await;
    let base = now();
    let store = Arc::new(db.store.clone());
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = store.clone();
            let v = v.clone();
            let at = base + Duration::milliseconds(i);
            tokio::spawn(async move { (at, store.confirm_vm_deleted(&v, at).await.unwrap()) })
        })
        .collect();
    let mut winners = Vec::new();
    for t in tasks {
        let (at, outcome) = t.await.unwrap();
        if outcome == GuardedWrite::Written {
            winners.push(at);
        }
    }
    assert_eq!(winners.len(), 1, "exactly one confirmation writes");
    assert_eq!(
        db.vm(&v).await.unwrap().unwrap().deleted_at,
        Some(winners[0])
    );
}

async fn n6_retired_host_is_held_inactive_and_undedicated(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let op = user(&db, "op@example.com").await;
    let h = host(&db, &owner, "spark-7").await;
    db.mark_host_prepared(&h, now()).await.unwrap();
    assert_eq!(
        db.hosts_in_service("spark-1").await.unwrap(),
        0,
        "not active yet"
    );
    db.activate_host(&h, "shared", None, false, &op, now())
        .await
        .unwrap();
    // In service: active and not retired, counted by its kind (issue #42, 1).
    assert_eq!(db.hosts_in_service("spark-1").await.unwrap(), 1);
    assert_eq!(db.hosts_in_service("spark-2").await.unwrap(), 0);

    // Retiring an active host is refused by the schema, and nothing changes.
    let err = db.retire_host(&h, now()).await.unwrap_err();
    assert!(err.is_constraint("hosts_retired_inactive"), "{err:?}");
    let row = db.host(&h).await.unwrap().unwrap();
    assert!(row.active && row.retired_at.is_none());

    db.execute_unchecked(&format!("update hosts set active = false where id = '{h}'"))
        .await
        .unwrap();
    // A live instance holds it in service (N.1); a failed create does not.
    let v = vm(&db, &owner, &h).await;
    let err = db.retire_host(&h, now()).await.unwrap_err();
    assert!(err.is_constraint("host_has_live_instance"), "{err:?}");
    assert!(db.host(&h).await.unwrap().unwrap().retired_at.is_none());
    db.confirm_vm_deleted(&v, now()).await.unwrap();
    db.retire_host(&h, now()).await.unwrap();

    // Every writer is held: the Store API and raw UPDATEs alike.
    let err = db
        .activate_host(&h, "shared", None, false, &op, now())
        .await
        .unwrap_err();
    assert!(err.is_constraint("hosts_retired_inactive"), "{err:?}");
    let err = db.set_host_dedicated(&h, Some(&owner)).await.unwrap_err();
    assert!(err.is_constraint("hosts_retired_inactive"), "{err:?}");
    for raw in [
        format!("update hosts set active = true where id = '{h}'"),
        format!("update hosts set dedicated = true where id = '{h}'"),
        format!("update hosts set active = true, dedicated = true where id = '{h}'"),
    ] {
        let err = db.execute_unchecked(&raw).await.unwrap_err();
        assert!(
            err.is_constraint("hosts_retired_inactive"),
            "{raw}: {err:?}"
        );
    }
    let row = db.host(&h).await.unwrap().unwrap();
    assert!(!row.active && !row.dedicated && row.retired_at.is_some());
    assert_eq!(db.hosts_in_service("spark-1").await.unwrap(), 0, "retired");
}

async fn d3_activation_refused_until_preparation_finished(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let op = user(&db, "op@example.com").await;
    let h = host(&db, &owner, "spark-3").await;
    let err = db
        .activate_host(&h, "shared", None, false, &op, now())
        .await
        .unwrap_err();
    assert!(err.is_constraint("hosts_active_prepared"), "{err:?}");
    let err = db
        .execute_unchecked(&format!("update hosts set active = true where id = '{h}'"))
        .await
        .unwrap_err();
    assert!(err.is_constraint("hosts_active_prepared"), "{err:?}");
    let row = db.host(&h).await.unwrap().unwrap();
    assert!(!row.active && row.placement.is_none() && row.activated_at.is_none());

    db.mark_host_prepared(&h, now()).await.unwrap();
    db.activate_host(&h, "shared", None, false, &op, now())
        .await
        .unwrap();
    let row = db.host(&h).await.unwrap().unwrap();
    assert!(row.active);
    assert_eq!(row.placement.as_deref(), Some("shared"));
    assert_eq!(row.gpu_type, "spark-1", "activation never changes gpu_type");
}

async fn n7_hardware_id_unique_among_nodes_not_retired(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let a = host(&db, &owner, "spark-1").await;
    let b = host(&db, &owner, "spark-2").await;
    let fp = json!({"gpu": "GB10", "arch": "aarch64"});
    let node = |host_id: &'static str| NewHostNode {
        host_id,
        index: 0,
        machine_id: Some("3f2a"),
        hardware_id: "b41c",
        fingerprint: Box::leak(Box::new(fp.clone())),
        rails: Box::leak(Box::new(json!({}))),
    };
    let a_id: &'static str = Box::leak(a.clone().into_boxed_str());
    let b_id: &'static str = Box::leak(b.clone().into_boxed_str());
    db.insert_host_node(node(a_id), now()).await.unwrap();

    // One box cannot be claimed by two live hosts.
    let err = db.insert_host_node(node(b_id), now()).await.unwrap_err();
    assert!(matches!(err, DbError::Conflict(_)), "{err:?}");
    assert!(
        db.host_nodes(&b).await.unwrap().is_empty(),
        "nothing was written for b"
    );

    // Once a is retired its machine is free, and a's row still says it was there.
    db.retire_host(&a, now()).await.unwrap();
    db.insert_host_node(node(b_id), now()).await.unwrap();
    let a_nodes = db.host_nodes(&a).await.unwrap();
    assert_eq!(a_nodes.len(), 1);
    assert_eq!(a_nodes[0].hardware_id, "b41c");
    assert!(
        a_nodes[0].retired_at.is_some(),
        "the trigger stamped the node retired"
    );
    assert_eq!(db.host_nodes(&b).await.unwrap()[0].hardware_id, "b41c");

    // A retired host takes no new machines.
    let err = db
        .insert_host_node(
            NewHostNode {
                hardware_id: "other",
                ..node(a_id)
            },
            now(),
        )
        .await
        .unwrap_err();
    assert!(err.is_constraint("host_retired"), "{err:?}");

    // A third live claim is refused again.
    let c = host(&db, &owner, "spark-3").await;
    let c_id: &'static str = Box::leak(c.into_boxed_str());
    assert!(matches!(
        db.insert_host_node(node(c_id), now()).await,
        Err(DbError::Conflict(_))
    ));
}

async fn k_131_a_nodes_rails_are_replaced_whole_on_a_live_host_only(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let h = host(&db, &owner, "spark-1").await;
    let at_127 = json!({"rail0": {"index": 0, "address": "192.168.100.11/24", "neighbours_discovered": 1},
                        "rail0b": {"neighbours_discovered": 1}});
    for (index, hardware_id) in [(0, "hw-node0"), (1, "hw-node1")] {
        db.insert_host_node(
            NewHostNode {
                host_id: &h,
                index,
                machine_id: None,
                hardware_id,
                fingerprint: &json!({}),
                rails: &at_127,
            },
            now(),
        )
        .await
        .unwrap();
    }
    async fn rails(db: &Store, h: String) -> Vec<serde_json::Value> {
        let nodes = db.host_nodes(&h).await.unwrap();
        nodes.iter().map(|n| n.rails.0.clone()).collect()
    }
    let refreshed = json!({"rail0": {"index": 0, "address": "192.168.100.11/24", "mtu": 9000,
                                     "neighbours_discovered": 1, "verified_at": "2026-09-08T14:20:03Z"}});
    assert!(db.record_node_rails(&h, 1, &refreshed).await.unwrap());
    assert_eq!(
        rails(&db, h.clone()).await,
        vec![at_127.clone(), refreshed.clone()],
        "node1's rails replaced whole (its twin gone with them), node0's untouched"
    );
    assert!(
        !db.record_node_rails(&h, 2, &json!({})).await.unwrap(),
        "no such node"
    );
    db.retire_host(&h, now()).await.unwrap();
    assert!(
        !db.record_node_rails(&h, 0, &refreshed).await.unwrap(),
        "a retired host's nodes keep what they last said"
    );
    assert_eq!(rails(&db, h).await, vec![at_127, refreshed]);
}

async fn enrollment(db: &Store, owner: &str, slug: &str, expires: DateTime<Utc>) -> SecretToken {
    let h = host(db, owner, slug).await;
    let token = SecretToken::generate(TokenKind::Enrollment);
    db.create_enrollment(
        NewEnrollment {
            host_id: &h,
            owner_sub: owner,
            profile_id: "gb10-spark-1",
            token_hash: &token.hash(),
            token_expires_at: expires,
        },
        now(),
    )
    .await
    .unwrap();
    token
}

/// Redeem as host-enroll does — `Store::redeem`, the one path — for a machine whose
/// hardware id is `hardware_id`, accepted (`accept`) or rejected by the judge.
async fn redeem(db: &Store, token: &TokenHash, hardware_id: &str, accept: bool) -> Redeemed {
    let hardware_id = hardware_id.to_owned();
    db.redeem(token, now(), move |_ctx| {
        if !accept {
            return RedeemDecision::Reject {
                request: json!({"hardware_id": hardware_id}),
                reason: "arch is x86_64".into(),
            };
        }
        RedeemDecision::Accept {
            nodes: vec![RedeemNode {
                index: 0,
                machine_id: None,
                hardware_id: hardware_id.clone(),
                fingerprint: json!({"hardware_id": hardware_id}),
                rails: json!([]),
            }],
            fingerprint: json!({"hardware_id": hardware_id}),
            host_pubkey: "wg-public".into(),
            host_token_hash: SecretToken::generate(TokenKind::Host).hash(),
            sealed_agent_token: "sealed".into(),
        }
    })
    .await
    .unwrap()
}

async fn step28_single_use_token_redeemed_once_by_32_callers(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let token = enrollment(&db, &owner, "spark-1", now() + Duration::hours(1)).await;
    let hash = token.hash();
    let start = Arc::new(tokio::sync::Barrier::new(32));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let store = db.store.clone();
            let hash = hash.clone();
            let start = start.clone();
            tokio::spawn(async move {
                start.wait().await;
                let hw = format!("hw-{i}");
                (redeem(&store, &hash, &hw, true).await, hw)
            })
        })
        .collect();
    let mut enrolled = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (Redeemed::Enrolled(ctx), hw) => enrolled.push((ctx, hw)),
            (Redeemed::NoSuchToken, _) => {}
            (other, _) => panic!("a loser must find no token, not {other:?}"),
        }
    }
    assert_eq!(enrolled.len(), 1, "exactly one of 32 callers redeems");
    let (ctx, hw) = &enrolled[0];
    let stored = db.enrollment(&ctx.enrollment_id).await.unwrap().unwrap();
    assert_eq!(stored.state, EnrollmentState::Enrolled);
    assert!(stored.redeemed_at.is_some());
    let nodes = db.host_nodes(&ctx.host_id).await.unwrap();
    assert_eq!(
        nodes
            .iter()
            .map(|n| n.hardware_id.as_str())
            .collect::<Vec<_>>(),
        [hw.as_str()],
        "only the winner's machine is the host"
    );
}

async fn step28_unknown_spent_rejected_and_expired_tokens_get_the_same_none(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let live = enrollment(&db, &owner, "spark-1", now() + Duration::hours(1)).await;
    let expired = enrollment(&db, &owner, "spark-2", now() - Duration::seconds(1)).await;
    let rejected = enrollment(&db, &owner, "spark-3", now() + Duration::hours(1)).await;
    let unknown = SecretToken::generate(TokenKind::Enrollment);

    assert!(matches!(
        redeem(&db, &live.hash(), "hw-1", true).await,
        Redeemed::Enrolled(_)
    ));
    assert!(matches!(
        redeem(&db, &rejected.hash(), "hw-3", false).await,
        Redeemed::Rejected { .. }
    ));
    for (what, token) in [
        ("spent", &live),
        ("rejected", &rejected),
        ("expired", &expired),
        ("unknown", &unknown),
    ] {
        assert!(
            matches!(
                redeem(&db, &token.hash(), "hw-9", true).await,
                Redeemed::NoSuchToken
            ),
            "{what}"
        );
    }
    assert!(
        db.dump_text()
            .await
            .unwrap()
            .iter()
            .all(|v| !v.value.contains("hw-9")),
        "nothing was written for them"
    );
}

async fn last_superadmin_cannot_be_revoked(db: TestDb) {
    let a = user(&db, "a@example.com").await;
    let b = user(&db, "b@example.com").await;
    assert!(
        db.grant_role(&a, Role::Superadmin, None, now())
            .await
            .unwrap()
    );
    assert!(
        !db.grant_role(&a, Role::Superadmin, None, now())
            .await
            .unwrap(),
        "idempotent"
    );
    let err = db.revoke_role(&a, Role::Superadmin).await.unwrap_err();
    assert!(err.is_constraint("last_superadmin"), "{err:?}");
    assert_eq!(db.roles_of(&a).await.unwrap(), vec![Role::Superadmin]);

    db.grant_role(&b, Role::Superadmin, Some(&a), now())
        .await
        .unwrap();
    assert!(db.revoke_role(&a, Role::Superadmin).await.unwrap());
    assert_eq!(db.superadmin_count().await.unwrap(), 1);
    assert!(db.roles_of(&a).await.unwrap().is_empty());

    db.grant_role(&b, Role::CommunityHost, Some(&b), now())
        .await
        .unwrap();
    assert_eq!(
        db.roles_of(&b).await.unwrap(),
        vec![Role::CommunityHost, Role::Superadmin]
    );
    let err = db
        .execute_unchecked(&format!(
            "insert into user_roles (user_sub, role, granted_at) values ('{b}', 'root', '2026-01-01T00:00:00Z')"
        ))
        .await
        .unwrap_err();
    assert!(err.is_constraint("user_roles_role_known"), "{err:?}");
}

async fn sessions_expire_and_end(db: TestDb) {
    let a = user(&db, "a@example.com").await;
    let t = SecretToken::generate(TokenKind::Session);
    let start = now();
    db.create_session(&t.hash(), &a, start, start + Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(
        db.session_user(&t.hash(), start)
            .await
            .unwrap()
            .unwrap()
            .0
            .sub,
        a
    );
    // The session's answer carries the user's roles, in order, read with it.
    let store: &Store = &db;
    let roles = || async {
        store
            .session_user(&t.hash(), start)
            .await
            .unwrap()
            .unwrap()
            .1
    };
    assert_eq!(roles().await, []);
    db.grant_role(&a, Role::Superadmin, None, start)
        .await
        .unwrap();
    db.grant_role(&a, Role::CommunityHost, None, start)
        .await
        .unwrap();
    assert_eq!(roles().await, db.roles_of(&a).await.unwrap());
    assert_eq!(roles().await.len(), 2);
    assert!(
        db.session_user(&t.hash(), start + Duration::hours(2))
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        db.purge_expired_sessions(start + Duration::hours(2))
            .await
            .unwrap(),
        1
    );

    let t2 = SecretToken::generate(TokenKind::Session);
    db.create_session(&t2.hash(), &a, start, start + Duration::hours(1))
        .await
        .unwrap();
    db.delete_session(&t2.hash()).await.unwrap();
    assert!(db.session_user(&t2.hash(), start).await.unwrap().is_none());

    // Every session of one user ends at once (a password change), and nobody else's.
    let b = user(&db, "b@example.com").await;
    let (a1, a2, b1) = (
        SecretToken::generate(TokenKind::Session),
        SecretToken::generate(TokenKind::Session),
        SecretToken::generate(TokenKind::Session),
    );
    for (t, who) in [(&a1, &a), (&a2, &a), (&b1, &b)] {
        db.create_session(&t.hash(), who, start, start + Duration::hours(1))
            .await
            .unwrap();
    }
    assert_eq!(db.delete_sessions_of(&a).await.unwrap(), 2);
    assert!(db.session_user(&a1.hash(), start).await.unwrap().is_none());
    assert!(db.session_user(&a2.hash(), start).await.unwrap().is_none());
    assert!(db.session_user(&b1.hash(), start).await.unwrap().is_some());
    assert_eq!(db.delete_sessions_of(&a).await.unwrap(), 0);
    // The purge takes what has expired, and counts it.
    let b2 = SecretToken::generate(TokenKind::Session);
    db.create_session(&b2.hash(), &b, start, start + Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(db.purge_expired_sessions(start).await.unwrap(), 0);
    assert_eq!(
        db.purge_expired_sessions(start + Duration::hours(2))
            .await
            .unwrap(),
        2
    );
}

async fn email_is_unique(db: TestDb) {
    user(&db, "a@example.com").await;
    let err = db
        .create_user(
            NewUser {
                email: "a@example.com",
                display_name: "",
                password_hash: "x",
            },
            now(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, DbError::Conflict(_)), "{err:?}");
    assert_eq!(db.users_overview().await.unwrap().len(), 1);
}

/// Issue #36 (8): a sign-up is read by its token only while it lives; confirming forgets
/// every sign-up of the address and no other; the purge takes what expired, and counts it.
async fn a36_a_signup_waits_until_it_expires_or_its_address_is_confirmed(db: TestDb) {
    let start = now();
    let waiting = |email: &str, hours: i64| SignupRow {
        email: email.to_owned(),
        display_name: "Ana".to_owned(),
        password_hash: "$argon2id$v=19$m=256,t=1,p=1$c2FsdHNhbHQ$aGFzaA".to_owned(),
        created_at: start,
        expires_at: start + Duration::hours(hours),
    };
    let (a1, a2, b1) = (
        SecretToken::generate(TokenKind::SignupConfirm),
        SecretToken::generate(TokenKind::SignupConfirm),
        SecretToken::generate(TokenKind::SignupConfirm),
    );
    db.create_signup(&a1.hash(), &waiting("a@example.com", 24))
        .await
        .unwrap();
    db.create_signup(&a2.hash(), &waiting("a@example.com", 1))
        .await
        .unwrap();
    db.create_signup(&b1.hash(), &waiting("b@example.com", 24))
        .await
        .unwrap();
    assert_eq!(db.signups_waiting("a@example.com").await.unwrap(), 2);
    assert_eq!(db.signups_waiting("c@example.com").await.unwrap(), 0);
    let read = db
        .signup_by_token(&a1.hash(), start)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (read.email.as_str(), read.display_name.as_str()),
        ("a@example.com", "Ana")
    );
    // Expired is as unknown.
    let later = start + Duration::hours(2);
    assert!(
        db.signup_by_token(&a2.hash(), later)
            .await
            .unwrap()
            .is_none()
    );
    let unknown = SecretToken::generate(TokenKind::SignupConfirm);
    assert!(
        db.signup_by_token(&unknown.hash(), start)
            .await
            .unwrap()
            .is_none()
    );
    // An expiry not after the sign-up is refused by the schema.
    let mut backwards = waiting("c@example.com", 1);
    backwards.expires_at = start;
    assert!(db.create_signup(&unknown.hash(), &backwards).await.is_err());
    assert_eq!(db.purge_expired_signups(later).await.unwrap(), 1);
    assert_eq!(db.signups_waiting("a@example.com").await.unwrap(), 1);
    assert_eq!(db.delete_signups_of("a@example.com").await.unwrap(), 1);
    assert_eq!(db.signups_waiting("a@example.com").await.unwrap(), 0);
    assert!(
        db.signup_by_token(&a1.hash(), start)
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(db.signups_waiting("b@example.com").await.unwrap(), 1);
}

async fn no_table_holds_a_plaintext_token(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let session = SecretToken::generate(TokenKind::Session);
    db.create_session(&session.hash(), &owner, now(), now() + Duration::hours(1))
        .await
        .unwrap();
    let enr = enrollment(&db, &owner, "spark-1", now() + Duration::hours(1)).await;
    assert!(matches!(
        redeem(&db, &enr.hash(), "hw-1", true).await,
        Redeemed::Enrolled(_)
    ));
    db.audit(Some(&owner), "test.flow", None, json!({"ok": true}), now())
        .await
        .unwrap();

    let dump = db.dump_text().await.unwrap();
    assert!(
        dump.iter().any(|v| v.value == session.hash().as_str()),
        "the hash is stored"
    );
    for v in &dump {
        for secret in [&session, &enr] {
            assert!(
                !v.value.contains(secret.expose()),
                "{}.{} holds a plaintext token",
                v.table,
                v.column
            );
        }
        assert!(
            !v.value.contains("byo_"),
            "{}.{} holds something token-shaped",
            v.table,
            v.column
        );
    }
}

/// Issue #39 (2) on the Store: "keep waiting" moves only the owner's open row; the ended
/// rows are the owner's, latest first, within the window; every ending reads back by name.
async fn e2_keep_waiting_and_the_ended_rows(db: TestDb) {
    use byo_db::queue::{NewQueued, QueueClose};
    for c in [
        QueueClose::Placed,
        QueueClose::PlacedByOperator,
        QueueClose::Cancelled,
        QueueClose::ClosedByOperator,
        QueueClose::Expired,
    ] {
        assert_eq!(QueueClose::parse(c.as_str()), Some(c));
    }
    assert_eq!(QueueClose::parse("gone"), None);
    let a = user(&db, "a@example.com").await;
    let b = user(&db, "b@example.com").await;
    let t = now();
    let queue = |who: &str, at: DateTime<Utc>| {
        let who = who.to_owned();
        let db = &db;
        async move {
            db.enqueue_vm(
                NewQueued {
                    user_sub: &who,
                    gpu_type: "spark-1",
                    ssh_key_id: "k",
                    expires_at: at + TimeDelta::hours(72),
                },
                at,
                10,
            )
            .await
            .unwrap()
        }
    };
    let first = queue(&a, t).await;
    let second = queue(&a, t + TimeDelta::seconds(1)).await;
    let theirs = queue(&b, t).await;
    let until = t + TimeDelta::hours(100);
    assert!(
        db.extend_queued(&theirs.id, &a, until)
            .await
            .unwrap()
            .is_none()
    );
    assert!(db.extend_queued("nope", &a, until).await.unwrap().is_none());
    let moved = db
        .extend_queued(&first.id, &a, until)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (moved.id.as_str(), moved.expires_at),
        (first.id.as_str(), until)
    );
    assert_eq!(
        db.queue_row(&theirs.id).await.unwrap().unwrap().expires_at,
        theirs.expires_at
    );
    // Ended: none yet; then two of a's close, one later than the other.
    assert!(
        db.ended_queue(&a, t - TimeDelta::days(1), 10)
            .await
            .unwrap()
            .is_empty()
    );
    db.close_queued(
        &first.id,
        Some(&a),
        QueueClose::Cancelled,
        t + TimeDelta::minutes(1),
    )
    .await
    .unwrap();
    db.close_queued(
        &second.id,
        None,
        QueueClose::ClosedByOperator,
        t + TimeDelta::minutes(2),
    )
    .await
    .unwrap();
    assert!(
        db.extend_queued(&first.id, &a, until)
            .await
            .unwrap()
            .is_none(),
        "closed"
    );
    let ended = db.ended_queue(&a, t, 10).await.unwrap();
    let got: Vec<(&str, Option<&str>)> = ended
        .iter()
        .map(|r| (r.id.as_str(), r.close_reason.as_deref()))
        .collect();
    assert_eq!(
        got,
        [
            (second.id.as_str(), Some("closed_by_operator")),
            (first.id.as_str(), Some("cancelled"))
        ]
    );
    assert_eq!(db.ended_queue(&a, t, 1).await.unwrap().len(), 1);
    assert!(
        db.ended_queue(&a, t + TimeDelta::minutes(2), 10)
            .await
            .unwrap()
            .is_empty(),
        "only what ended after the bound"
    );
    assert!(db.ended_queue(&b, t, 10).await.unwrap().is_empty());
}

/// Issue #38 (1, 2) and #39 (3) on the Store: the fleet's read and gauges see a failed key
/// push and a halted upgrade, and retire-stopped's candidates are exactly the hosts their
/// owner stopped that have been silent since the bound.
async fn fleet_read_gauges_and_stopped_hosts(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let op = user(&db, "op@example.com").await;
    let t = now();
    let quiet = testing::pickable_host(&db, &owner, "spark-1", t - TimeDelta::hours(30)).await;
    let beating = testing::pickable_host(&db, &owner, "spark-2", t).await;
    let by_op = testing::pickable_host(&db, &owner, "spark-3", t - TimeDelta::hours(30)).await;
    db.execute_unchecked("update hosts set pubkey = 'wg'")
        .await
        .unwrap();
    let reason = "the owner stopped hosting";
    for h in [&quiet, &beating] {
        db.depool_host(h, reason, &owner, t - TimeDelta::hours(26))
            .await
            .unwrap();
    }
    db.depool_host(&by_op, reason, &op, t - TimeDelta::hours(26))
        .await
        .unwrap();
    let since = t - TimeDelta::hours(24);
    let found = || async {
        db.stopped_and_silent(reason, since, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.host.id)
            .collect::<Vec<String>>()
    };
    assert_eq!(found().await, std::slice::from_ref(&quiet));
    assert!(
        db.stopped_and_silent("another reason", since, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        db.stopped_and_silent(reason, t - TimeDelta::hours(31), 10)
            .await
            .unwrap()
            .is_empty(),
        "silent, but not yet past the bound"
    );
    // The agent said it was uninstalled: a candidate at once, beating a moment ago or not;
    // stamped once.
    assert!(db.mark_uninstalled(&beating, t).await.unwrap());
    assert!(!db.mark_uninstalled(&beating, t).await.unwrap(), "once");
    assert_eq!(found().await, [quiet.clone(), beating.clone()]);

    db.record_key_push(&beating, Err("sshd refused it"), t)
        .await
        .unwrap();
    db.execute_unchecked(&format!(
        "insert into fleet_upgrades (id, build, state, open_marker, canary, growth, wait_secs,
                                     started_by, started_at, updated_at)
         values ('run-1', 'aaaaaaaaaaaa', 'halted', 'open', 1, 2, 60, '{op}', '{t}', '{t}')",
        t = t.to_rfc3339()
    ))
    .await
    .unwrap();
    let g = db
        .fleet_gauges(t - TimeDelta::minutes(5), t - TimeDelta::minutes(10))
        .await
        .unwrap();
    assert_eq!(
        (
            g.hosts_depooled,
            g.key_pushes_failed,
            g.fleet_upgrades_halted
        ),
        (3, 1, 1)
    );
    let read = db.fleet_read().await.unwrap();
    let slugs: Vec<&str> = read.hosts.iter().map(|h| h.host.slug.as_str()).collect();
    assert_eq!(slugs, ["spark-1", "spark-2", "spark-3"]);
    assert!(
        read.hosts
            .iter()
            .all(|h| h.owner_email == "owner@example.com")
    );
    assert_eq!(read.statuses.len(), 3);
    assert_eq!(read.pushes.len(), 1);
    assert_eq!(read.pushes[0].error.as_deref(), Some("sshd refused it"));
}

/// `migrate` says what it did: on a database at 0020 every later migration is applied and
/// named; run again, nothing is, and the schema is at the same newest version.
#[tokio::test]
async fn migrate_says_which_migrations_it_applied() {
    for backend in [byo_db::Backend::Sqlite, byo_db::Backend::Postgres] {
        let Some(db) = testing::migrated_to(backend, 20).await else {
            continue;
        };
        let first = db.migrate().await.unwrap();
        let latest = first.latest.unwrap();
        assert!(latest >= 29, "{backend:?}: {first:?}");
        assert_eq!(
            first.applied,
            (21..=latest).collect::<Vec<_>>(),
            "{backend:?}"
        );
        assert_eq!(
            first.to_string(),
            format!(
                "applied {} migrations (0021–{latest:04}); the schema is at {latest:04}",
                latest - 20
            )
        );
        let again = db.migrate().await.unwrap();
        assert_eq!(
            (again.applied.len(), again.latest),
            (0, Some(latest)),
            "{backend:?}"
        );
        assert_eq!(
            again.to_string(),
            format!("the schema is up to date (at {latest:04}); nothing to apply")
        );
    }
}

/// Migration 0021 on a database in the field: a row open when it runs lapses 72 hours
/// after it was queued; closed rows keep their ending; the new ending is accepted and an
/// unknown one still refused.
#[tokio::test]
async fn migration_0021_gives_open_queue_rows_an_expiry() {
    for backend in [byo_db::Backend::Sqlite, byo_db::Backend::Postgres] {
        let Some(db) = testing::migrated_to(backend, 20).await else {
            continue;
        };
        db.execute_unchecked(
            "insert into users (sub, email, password_hash, created_at)
             values ('u-1', 'u@example.com', 'x', '2026-01-02T03:04:05.5+00:00')",
        )
        .await
        .unwrap();
        db.execute_unchecked(
            "insert into vm_queue (id, user_sub, gpu_type, ssh_key_id, created_at)
             values ('q-open', 'u-1', 'spark-1', 'k', '2026-01-02T03:04:05.5+00:00')",
        )
        .await
        .unwrap();
        db.execute_unchecked(
            "insert into vm_queue (id, user_sub, gpu_type, ssh_key_id, created_at, closed_at,
                                   close_reason)
             values ('q-done', 'u-1', 'spark-1', 'k', '2026-01-01T00:00:00+00:00',
                     '2026-01-01T01:00:00+00:00', 'cancelled')",
        )
        .await
        .unwrap();
        db.migrate().await.unwrap();
        let open = db.queue_row("q-open").await.unwrap().unwrap();
        assert_eq!(
            open.expires_at,
            open.created_at + chrono::TimeDelta::hours(72),
            "{backend:?}"
        );
        let done = db.queue_row("q-done").await.unwrap().unwrap();
        assert_eq!(
            done.close_reason.as_deref(),
            Some("cancelled"),
            "{backend:?}"
        );
        // The open row is still claimable before its time, and the sweep's once past it.
        let before = open.expires_at - chrono::TimeDelta::seconds(1);
        assert_eq!(db.expire_queued(before, 10).await.unwrap().len(), 0);
        let closed = db.expire_queued(open.expires_at, 10).await.unwrap();
        assert_eq!(closed.len(), 1, "{backend:?}");
        assert_eq!(closed[0].close_reason.as_deref(), Some("expired"));
        assert!(
            db.execute_unchecked("update vm_queue set close_reason = 'gone' where id = 'q-done'")
                .await
                .is_err(),
            "{backend:?}: the closed set still holds"
        );
    }
}

#[tokio::test]
async fn the_migrated_schemas_are_the_same_on_both_backends() {
    let lite = testing::sqlite().await;
    let Some(pg) = testing::postgres().await else {
        return;
    };
    let a = lite.schema().await.unwrap();
    let b = pg.schema().await.unwrap();
    let names = |s: &byo_db::inspect::Schema| s.tables.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b), "same tables");
    for (name, t) in &a.tables {
        assert_eq!(
            Some(t),
            b.tables.get(name),
            "table {name} differs (left sqlite, right postgres)"
        );
    }
    for table in [
        "users",
        "user_roles",
        "sessions",
        "audit_log",
        "host_profiles",
        "hosts",
        "host_enrollments",
        "host_nodes",
        "host_status",
        "vms",
        "vm_queue",
        "prebookings",
        "ssh_keys",
        "operator_keys",
        "operator_key_lists",
        "operator_key_changes",
        "host_key_pushes",
    ] {
        assert!(a.tables.contains_key(table), "{table} is missing");
    }
    // Spot checks that the comparison sees what matters.
    // Spot checks that the comparison sees what matters: check expressions, partial
    // indexes' predicates and triggers' events, not only their names.
    let hosts = &a.tables["hosts"];
    assert_eq!(
        hosts.checks["hosts_retired_inactive"],
        "retired_at is null or active = false and dedicated = false"
    );
    assert!(
        a.tables["host_nodes"]
            .uniques
            .iter()
            .any(|u| u.columns == ["hardware_id"]
                && u.predicate.as_deref() == Some("retired_at is null"))
    );
    assert_eq!(
        a.tables["vms"].indexes["vms_stuck_deletes"]
            .predicate
            .as_deref(),
        Some("deleted_at is null and delete_requested_at is not null")
    );
    assert_eq!(a.tables["host_nodes"].primary_key, ["host_id", "index"]);
    assert_eq!(hosts.triggers["hosts_retire_nodes"], "after update");
}

#[tokio::test]
async fn profiles_are_seeded_with_the_design_plan() {
    for db in testing::each_backend().await {
        let profiles = db.profiles().await.unwrap();
        let ids: Vec<_> = profiles.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            ids,
            [
                "gb10-spark-1",
                "gb10-spark-2",
                "gb10-spark-4",
                "linux-test",
                "linux-test-2",
                "linux-test-4"
            ]
        );
        // The bed's pair and ring: the design's plans, staff only, a Debian container's prepare.
        for (id, nodes) in [("linux-test-2", 2), ("linux-test-4", 4)] {
            let p = db.profile(id).await.unwrap().unwrap();
            assert!(p.staff_only, "{id}");
            assert_eq!(p.constants.0["node_count"], nodes, "{id}");
            assert_eq!(
                p.constants.0["rails"].as_array().unwrap().len(),
                nodes,
                "{id}"
            );
            assert_eq!(p.constants.0["prepare"]["lxd"], "apt", "{id}");
        }
        let pair = db.profile("gb10-spark-2").await.unwrap().unwrap();
        assert_eq!(pair.constants.0["node_count"], 2);
        assert_eq!(pair.constants.0["rails"][1]["subnet"], "192.168.101.0/24");
        assert!(db.profile("linux-test").await.unwrap().unwrap().staff_only);
        assert!(!pair.staff_only);
    }
}

fn change<'a>(user_sub: &'a str, fingerprint: &'a str) -> KeyChange<'a> {
    KeyChange {
        user_sub,
        action: "add",
        fingerprint,
        label: "laptop",
    }
}

/// A stand-in body: the tokens of every change so far, in order.
fn appended(base: Option<&str>, token: &str) -> String {
    match base {
        Some(b) => format!("{b}|{token}"),
        None => token.to_owned(),
    }
}

async fn m10_changes_before_a_signature_add_up_in_one_draft(db: TestDb) {
    let tudor = user(&db, "tudor@example.com").await;
    let breno = user(&db, "breno@example.com").await;
    let a = db
        .apply_key_change(change(&tudor, "fp-a"), now(), |b, _| Ok(appended(b, "a")))
        .await
        .unwrap();
    let b = db
        .apply_key_change(change(&breno, "fp-b"), now(), |b, _| Ok(appended(b, "b")))
        .await
        .unwrap();
    assert_eq!((a.version, b.version), (1, 1), "one draft");
    assert_eq!(b.body, "a|b");
    assert_eq!(b.state, KeyListState::Draft);
    let changes = db.key_changes(1).await.unwrap();
    assert_eq!(
        changes
            .iter()
            .map(|c| c.user_sub.as_str())
            .collect::<Vec<_>>(),
        [&tudor, &breno]
    );

    // A refused change writes nothing.
    let err = db
        .apply_key_change(change(&tudor, "fp-c"), now(), |_, _| {
            Err(DbError::Refused("no_operator_left".into()))
        })
        .await
        .unwrap_err();
    assert!(err.is_constraint("no_operator_left"));
    assert_eq!(db.newest_key_list().await.unwrap().unwrap().body, "a|b");
    assert_eq!(db.key_changes(1).await.unwrap().len(), 2);
}

async fn m10_concurrent_changes_are_applied_one_on_top_of_the_other(db: TestDb) {
    let op = user(&db, "op@example.com").await;
    // Start from a published version, so the first concurrent changes race to create v2.
    db.apply_key_change(change(&op, "fp-0"), now(), |b, _| Ok(appended(b, "k0")))
        .await
        .unwrap();
    assert_eq!(
        db.publish_key_list(1, "{}", &[], &op, now()).await.unwrap(),
        GuardedWrite::Written
    );
    let tasks: Vec<_> = (1..=8)
        .map(|i| {
            let store = db.store.clone();
            let op = op.clone();
            tokio::spawn(async move {
                let token = format!("k{i}");
                for _ in 0..20 {
                    match store
                        .apply_key_change(change(&op, &token), now(), |b, _| {
                            Ok(appended(b, &token))
                        })
                        .await
                    {
                        Ok(row) => return row.version,
                        Err(DbError::Conflict(_)) => continue,
                        Err(e) => panic!("{e}"),
                    }
                }
                panic!("no progress after 20 retries");
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(
            t.await.unwrap(),
            2,
            "every change lands in the one new draft"
        );
    }
    let draft = db.newest_key_list().await.unwrap().unwrap();
    assert_eq!(draft.version, 2);
    let tokens: Vec<&str> = draft.body.split('|').collect();
    assert_eq!(
        tokens.len(),
        9,
        "no change overwrote another: {}",
        draft.body
    );
    for i in 0..=8 {
        assert!(
            tokens.contains(&format!("k{i}").as_str()),
            "k{i} lost: {}",
            draft.body
        );
    }
    assert_eq!(db.key_changes(2).await.unwrap().len(), 8);
}

async fn m10_one_of_two_concurrent_publishes_wins_and_only_the_newest(db: TestDb) {
    let op = user(&db, "op@example.com").await;
    db.apply_key_change(change(&op, "fp-a"), now(), |b, _| Ok(appended(b, "a")))
        .await
        .unwrap();
    let keys = vec![byo_db::operator_keys::PublishedKey {
        user_sub: op.clone(),
        label: "laptop".into(),
        public_key: "ssh-ed25519 AAAA".into(),
        fingerprint: "SHA256:a".into(),
    }];
    let tasks: Vec<_> = (0..2)
        .map(|i| {
            let store = db.store.clone();
            let (op, keys) = (op.clone(), keys.clone());
            tokio::spawn(async move {
                store
                    .publish_key_list(1, &format!("envelope-{i}"), &keys, &op, now())
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut written = 0;
    for t in tasks {
        if t.await.unwrap() == GuardedWrite::Written {
            written += 1;
        }
    }
    assert_eq!(written, 1, "exactly one publish wins");
    let published = db.published_key_list().await.unwrap().unwrap();
    assert!(
        published
            .envelope
            .as_deref()
            .unwrap()
            .starts_with("envelope-")
    );
    assert_eq!(
        db.operator_key_by_fingerprint("SHA256:a")
            .await
            .unwrap()
            .len(),
        1
    );

    // A later change builds on the published list, in the next version.
    let next = db
        .apply_key_change(change(&op, "fp-b"), now(), |b, v| {
            assert_eq!((b, v), (Some("a"), 2));
            Ok(appended(b, "b"))
        })
        .await
        .unwrap();
    assert_eq!(next.version, 2);
    // Version 1 is no longer the newest: it cannot be published (again), and publishing v2
    // retires the key it no longer holds in the registry.
    assert_eq!(
        db.publish_key_list(1, "late", &keys, &op, now())
            .await
            .unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(
        db.publish_key_list(2, "v2", &[], &op, now()).await.unwrap(),
        GuardedWrite::Written
    );
    let reg = db.operator_key_by_fingerprint("SHA256:a").await.unwrap();
    assert!(
        reg[0].removed_at.is_some(),
        "a removed key stays attributable, marked removed"
    );
}

async fn m12_withdrawing_deletes_the_draft_and_its_changes(db: TestDb) {
    let op = user(&db, "op@example.com").await;
    assert!(matches!(
        db.withdraw_key_drafts().await,
        Err(DbError::NotFound)
    ));
    db.apply_key_change(change(&op, "fp-a"), now(), |b, _| Ok(appended(b, "a")))
        .await
        .unwrap();
    db.publish_key_list(1, "v1", &[], &op, now()).await.unwrap();
    db.apply_key_change(change(&op, "fp-b"), now(), |b, _| Ok(appended(b, "b")))
        .await
        .unwrap();
    assert_eq!(db.withdraw_key_drafts().await.unwrap(), 1);
    let newest = db.newest_key_list().await.unwrap().unwrap();
    assert_eq!((newest.version, newest.state.as_str()), (1, "published"));
    assert!(db.key_changes(2).await.unwrap().is_empty());
    // The next change starts again from the published list, as version 2.
    let again = db
        .apply_key_change(change(&op, "fp-c"), now(), |b, _| Ok(appended(b, "c")))
        .await
        .unwrap();
    assert_eq!((again.version, again.body.as_str()), (2, "a|c"));
}

async fn m6_a_failed_push_keeps_the_version_the_host_held(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let h = host(&db, &owner, "spark-1").await;
    host(&db, &owner, "spark-2").await;
    db.record_key_push(&h, Ok(3), now()).await.unwrap();
    db.record_key_push(&h, Err("connection refused"), now())
        .await
        .unwrap();
    let status = db.key_push_status().await.unwrap();
    assert_eq!(status.len(), 2, "every host is listed, pushed to or not");
    let s1 = status.iter().find(|s| s.slug == "spark-1").unwrap();
    assert_eq!(
        (s1.version, s1.error.as_deref()),
        (Some(3), Some("connection refused"))
    );
    db.record_key_push(&h, Ok(4), now()).await.unwrap();
    let s1 = db
        .key_push_status()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.slug == "spark-1")
        .unwrap();
    assert_eq!((s1.version, s1.error), (Some(4), None));
    assert!(
        db.key_push_status()
            .await
            .unwrap()
            .iter()
            .any(|s| s.slug == "spark-2" && s.version.is_none())
    );
}

/// #16, 5 (migration 0017): a login a beat sends again is kept once, each host keeps its
/// newest, the text columns are bounded in the schema, and the read names the operator.
async fn i_a_login_is_kept_once_bounded_and_newest_first(db: TestDb) {
    use byo_db::logins::KEEP_LOGINS_PER_HOST;
    use byo_wire::vm::OperatorLogin;
    let store = &db.store;
    let owner = user(store, "owner@example.com").await;
    let op = store
        .create_user(
            NewUser {
                email: "op@example.com",
                display_name: "Olga Operator",
                password_hash: "$argon2id$x",
            },
            now(),
        )
        .await
        .unwrap()
        .sub;
    let h = host(store, &owner, "spark-1").await;
    let other = host(store, &owner, "spark-2").await;
    let t0 = now();
    let login = |i: i64, who: Option<&str>| OperatorLogin {
        at: t0 + Duration::seconds(i),
        source: "10.8.0.1".into(),
        source_port: 40000,
        fingerprint: "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU".into(),
        user_sub: who.map(str::to_owned),
        certificate: None,
    };
    let beat = [login(0, Some(&op)), login(1, None)];
    assert_eq!(
        store.record_operator_logins(&h, &beat, t0).await.unwrap(),
        2
    );
    // The same beat again, and then overlapping: only the new one is added.
    assert_eq!(
        store.record_operator_logins(&h, &beat, t0).await.unwrap(),
        0
    );
    assert_eq!(
        store
            .record_operator_logins(&h, &[login(1, None), login(2, Some(&op))], t0)
            .await
            .unwrap(),
        1
    );
    // The same moment and source on another host is another login.
    assert_eq!(
        store
            .record_operator_logins(&other, &beat[..1], t0)
            .await
            .unwrap(),
        1
    );
    let rows = store.operator_logins(&h, 10).await.unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| (r.logged_in_at, r.operator_name.as_deref()))
            .collect::<Vec<_>>(),
        [
            (t0 + Duration::seconds(2), Some("Olga Operator")),
            (t0 + Duration::seconds(1), None),
            (t0, Some("Olga Operator")),
        ]
    );
    assert_eq!(
        (rows[0].source.as_str(), rows[0].source_port),
        ("10.8.0.1", 40000)
    );
    assert_eq!(store.operator_logins(&h, 2).await.unwrap().len(), 2);
    // Break glass: the certificate sshd named is kept with the login (migration 0029).
    let certified = OperatorLogin {
        certificate: Some("break-glass:op@enverge.ai:spark-1 (serial 7)".into()),
        ..login(3, Some(&op))
    };
    store
        .record_operator_logins(&h, &[certified], t0)
        .await
        .unwrap();
    let rows = store.operator_logins(&h, 1).await.unwrap();
    assert_eq!(
        rows[0].certificate.as_deref(),
        Some("break-glass:op@enverge.ai:spark-1 (serial 7)")
    );
    assert_eq!(
        store.operator_logins(&h, 4).await.unwrap()[1].certificate,
        None
    );
    // Bounded in the schema, whoever writes.
    for bad in [
        OperatorLogin {
            source: "x".repeat(46),
            ..login(10, None)
        },
        OperatorLogin {
            fingerprint: "SHA256".into(),
            ..login(11, None)
        },
        OperatorLogin {
            fingerprint: "f".repeat(81),
            ..login(12, None)
        },
        OperatorLogin {
            user_sub: Some(String::new()),
            ..login(13, None)
        },
        OperatorLogin {
            user_sub: Some("u".repeat(129)),
            ..login(14, None)
        },
        OperatorLogin {
            certificate: Some(String::new()),
            ..login(15, None)
        },
        OperatorLogin {
            certificate: Some("c".repeat(201)),
            ..login(16, None)
        },
    ] {
        let e = store
            .record_operator_logins(&h, std::slice::from_ref(&bad), t0)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("operator_logins_"), "{bad:?}: {e}");
    }
    assert_eq!(
        store.operator_logins(&h, 100).await.unwrap().len(),
        4,
        "nothing kept"
    );
    // Each host keeps its newest KEEP_LOGINS_PER_HOST.
    let many: Vec<OperatorLogin> = (100..100 + KEEP_LOGINS_PER_HOST + 5)
        .map(|i| login(i, None))
        .collect();
    store.record_operator_logins(&h, &many, t0).await.unwrap();
    let kept = store.operator_logins(&h, 1000).await.unwrap();
    assert_eq!(kept.len() as i64, KEEP_LOGINS_PER_HOST);
    assert_eq!(
        kept[0].logged_in_at,
        t0 + Duration::seconds(104 + KEEP_LOGINS_PER_HOST)
    );
    assert_eq!(
        store.operator_logins(&other, 10).await.unwrap().len(),
        1,
        "another host's untouched"
    );
}

/// One open queue row for `user_sub` (step 58), queued at `at`: its id.
async fn enqueue(store: &Store, user_sub: &str, ssh_key_id: &str, at: DateTime<Utc>) -> String {
    store
        .enqueue_vm(
            byo_db::queue::NewQueued {
                user_sub,
                gpu_type: "spark-1",
                ssh_key_id,
                expires_at: at + chrono::TimeDelta::hours(72),
            },
            at,
            10,
        )
        .await
        .unwrap()
        .id
}

/// E2's steps 59 and 62 a batch at a time (the drain's one write per wave): each attempt
/// is started, finds its host taken (nothing written for it) or finds its claim lost
/// (nothing written), exactly as alone; the started ones are audited; the settle runs the
/// accepted instances and closes only the rows still open on that attempt.
async fn e2_step59_a_batchs_attempts_are_written_together_each_started_taken_or_lost_alone(
    db: TestDb,
) {
    use byo_db::queue::{NewAttempt, QueueAttempt, QueueClose, QueuePlaced};
    use byo_wire::states::VmStatus;
    let store = &db.store;
    let owner = user(store, "owner@example.com").await;
    let customer = user(store, "customer@example.com").await;
    let other = user(store, "other@example.com").await;
    let at = now();
    let mut hosts = Vec::new();
    for slug in ["batch-a", "batch-b", "batch-c", "batch-d"] {
        hosts.push(host(store, &owner, slug).await);
    }
    let key = store
        .insert_ssh_key(
            byo_db::ssh_keys::NewSshKey {
                user_sub: &customer,
                name: "laptop",
                public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBatch laptop",
                fingerprint: "SHA256:batch",
            },
            at,
        )
        .await
        .unwrap()
        .id;
    let mut rows = Vec::new();
    for i in 0..4 {
        rows.push(enqueue(store, &customer, &key, at + Duration::milliseconds(i)).await);
    }
    // The second host holds another customer's live instance.
    let theirs = store
        .create_vm(
            NewVm {
                user_sub: &other,
                host_id: Some(&hosts[1]),
                name: "vm-theirs01",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            at,
        )
        .await
        .unwrap();
    // This drainer holds the first three rows, another the fourth.
    let lease = at + Duration::minutes(1);
    assert_eq!(
        store
            .claim_queue_rows(at, lease, "mine", 3, &[])
            .await
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        store
            .claim_queue_rows(at, lease, "theirs", 1, &[])
            .await
            .unwrap()
            .len(),
        1
    );
    let names = ["vm-batch000", "vm-batch001", "vm-batch002", "vm-batch003"];
    let attempts: Vec<NewAttempt<'_>> = (0..4)
        .map(|i| NewAttempt {
            queue_id: &rows[i],
            vm: NewVm {
                user_sub: &customer,
                host_id: Some(&hosts[i]),
                name: names[i],
                gpu_type: "spark-1",
                ssh_hostname: Some("ssh.example"),
            },
            audit: json!({"attempt": i}),
        })
        .collect();
    let started_at = at + Duration::seconds(1);
    let longer = at + Duration::minutes(2);
    let got = store
        .start_queue_attempts("mine", &attempts, started_at, longer)
        .await
        .unwrap();
    let vm = |i: usize| match &got[i] {
        QueueAttempt::Started(vm) => (**vm).clone(),
        other => panic!("attempt {i} not started: {other:?}"),
    };
    assert!(matches!(got[1], QueueAttempt::HostTaken), "{:?}", got[1]);
    assert!(matches!(got[3], QueueAttempt::Lost), "{:?}", got[3]);
    for i in [0, 2] {
        let v = vm(i);
        assert_eq!(
            (
                v.host_id.as_deref(),
                v.name.as_str(),
                v.status,
                v.user_sub.as_str()
            ),
            (
                Some(hosts[i].as_str()),
                names[i],
                VmStatus::Creating,
                customer.as_str()
            )
        );
        assert_eq!(v.created_at, started_at);
        let q = store.queue_row(&rows[i]).await.unwrap().unwrap();
        assert_eq!(
            (q.vm_id.as_deref(), q.attempts, q.claimed_until),
            (Some(v.id.as_str()), 1, Some(longer))
        );
    }
    // Nothing written for the taken host's row or the lost one.
    for (i, token) in [(1, "mine"), (3, "theirs")] {
        let q = store.queue_row(&rows[i]).await.unwrap().unwrap();
        assert_eq!(
            (
                q.vm_id,
                q.attempts,
                q.claimed_until,
                q.claim_token.as_deref()
            ),
            (None, 0, Some(lease), Some(token))
        );
    }
    assert_eq!(
        store.live_vms_on_host(&hosts[1]).await.unwrap()[0].id,
        theirs.id
    );
    assert!(store.live_vms_on_host(&hosts[3]).await.unwrap().is_empty());
    let mut audited: Vec<(Option<String>, serde_json::Value)> = store
        .audit_log(50)
        .await
        .unwrap()
        .into_iter()
        .filter(|a| a.action == "vm.create")
        .map(|a| (a.target, a.details.0))
        .collect();
    audited.sort_by_key(|(_, d)| d["attempt"].as_i64());
    assert_eq!(
        audited,
        vec![
            (Some(vm(0).id), json!({"attempt": 0})),
            (Some(vm(2).id), json!({"attempt": 2}))
        ]
    );

    // Both hosts took theirs; the third row was closed meanwhile (its customer's row
    // placed by the heartbeat's path): its instance runs, its row is not closed twice.
    let (v0, v2) = (vm(0), vm(2));
    assert_eq!(
        store
            .close_queue_placed(&rows[2], &v2.id, QueueClose::Placed, started_at)
            .await
            .unwrap(),
        GuardedWrite::Written
    );
    let settled_at = at + Duration::seconds(2);
    let placed = [
        QueuePlaced {
            queue_id: &rows[0],
            vm_id: &v0.id,
            host_id: &hosts[0],
            ssh_port: Some(2201),
            how: QueueClose::Placed,
        },
        QueuePlaced {
            queue_id: &rows[2],
            vm_id: &v2.id,
            host_id: &hosts[2],
            ssh_port: None,
            how: QueueClose::Placed,
        },
    ];
    assert_eq!(
        store
            .settle_queue_placements(&placed, settled_at)
            .await
            .unwrap(),
        vec![GuardedWrite::Written, GuardedWrite::AlreadySet]
    );
    let v0 = store.vm(&v0.id).await.unwrap().unwrap();
    assert_eq!((v0.status, v0.ssh_port), (VmStatus::Running, Some(2201)));
    assert_eq!(
        store.vm(&v2.id).await.unwrap().unwrap().status,
        VmStatus::Running
    );
    let q0 = store.queue_row(&rows[0]).await.unwrap().unwrap();
    assert_eq!(
        (q0.closed_at, q0.close_reason.as_deref(), q0.claim_token),
        (Some(settled_at), Some("placed"), None)
    );
    assert_eq!(
        store.queue_row(&rows[2]).await.unwrap().unwrap().closed_at,
        Some(started_at),
        "closed once, by the first"
    );
}

/// E2 on the Store alone: the one placement pick returns the hosts a create may land on
/// (and only as many as asked), the claim takes open rows in order under its token and
/// leaves claimed rows and skipped kinds alone, and a batch's keys are read as stored.
async fn e2_the_pick_the_claim_and_the_batchs_keys_read_what_is_there(db: TestDb) {
    let store = &db.store;
    let owner = user(store, "owner@example.com").await;
    let customer = user(store, "customer@example.com").await;
    let a = testing::pickable_host(store, &owner, "spark-a", now()).await;
    let b = testing::pickable_host(store, &owner, "spark-b", now()).await;
    host(store, &owner, "spark-unprepared").await;
    let at = now();
    let pick = || byo_db::vms::HostPick::new("spark-1", &customer, at - Duration::minutes(1), at);
    let mut picked: Vec<String> = store
        .pick_hosts_for_gpu(pick())
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.id)
        .collect();
    picked.sort();
    let mut expected = vec![a.clone(), b.clone()];
    expected.sort();
    assert_eq!(
        picked, expected,
        "the two pickable hosts, not the unprepared one"
    );
    let first = store.pick_first_hosts_for_gpu(pick(), 1).await.unwrap();
    assert_eq!(first.len(), 1);
    assert!(expected.contains(&first[0].target.id));

    let public_key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIConformance laptop";
    let key = store
        .insert_ssh_key(
            byo_db::ssh_keys::NewSshKey {
                user_sub: &customer,
                name: "laptop",
                public_key,
                fingerprint: "SHA256:conformance",
            },
            at,
        )
        .await
        .unwrap()
        .id;
    assert_eq!(
        store.ssh_keys_by_id(&[&key, "no-such-key"]).await.unwrap(),
        vec![(key.clone(), customer.clone(), public_key.to_owned())]
    );

    let mut queued = Vec::new();
    for i in 0..2 {
        queued.push(enqueue(store, &customer, &key, at + Duration::milliseconds(i)).await);
    }
    let lease = at + Duration::minutes(1);
    let skipped = store
        .claim_queue_rows(at, lease, "run-0", 10, &["spark-1".to_owned()])
        .await
        .unwrap();
    assert!(
        skipped.is_empty(),
        "a skipped kind is not claimed: {skipped:?}"
    );
    let claimed = store
        .claim_queue_rows(at, lease, "run-1", 10, &[])
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|r| r.id.clone()).collect::<Vec<_>>(),
        queued,
        "open rows, oldest first"
    );
    assert!(
        claimed
            .iter()
            .all(|r| r.claim_token.as_deref() == Some("run-1") && r.claimed_until == Some(lease))
    );
    let again = store
        .claim_queue_rows(at, lease, "run-2", 10, &[])
        .await
        .unwrap();
    assert!(again.is_empty(), "rows under a live claim: {again:?}");
}

/// E2's reads and the end of a run, on the Store alone (issue #19: the queue's store rules
/// were pinned only by the server's suites): what a customer holds counts their live
/// instances and their open rows, the open queue and its tally read what is open, a run lets
/// go of exactly its own claims, an operator claims one row by id, a cancel is recorded by its
/// name, and a customer's keys are theirs alone.
async fn e2_the_queues_reads_count_what_is_open_and_a_run_lets_go_of_its_claims(db: TestDb) {
    let store = &db.store;
    let owner = user(store, "owner@example.com").await;
    let customer = user(store, "customer@example.com").await;
    let other = user(store, "other@example.com").await;
    let h = host(store, &owner, "spark-q").await;
    let at = now();
    let key = |who: &str, name: &'static str, fp: &'static str| {
        let who = who.to_owned();
        async move {
            store
                .insert_ssh_key(
                    byo_db::ssh_keys::NewSshKey {
                        user_sub: &who,
                        name,
                        public_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIConformance q",
                        fingerprint: fp,
                    },
                    at,
                )
                .await
                .unwrap()
                .id
        }
    };
    let mine = key(&customer, "laptop", "SHA256:mine").await;
    let theirs = key(&other, "desk", "SHA256:theirs").await;
    // A customer's keys are theirs alone.
    let listed: Vec<String> = store
        .ssh_keys_of(&customer)
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.id)
        .collect();
    assert_eq!(listed, vec![mine.clone()]);
    assert_eq!(
        store
            .ssh_key_of(&customer, &mine)
            .await
            .unwrap()
            .map(|k| k.name),
        Some("laptop".to_owned())
    );
    assert!(
        store
            .ssh_key_of(&customer, &theirs)
            .await
            .unwrap()
            .is_none()
    );

    assert_eq!(store.instances_held(&customer).await.unwrap(), 0);
    assert_eq!(store.open_queue_count().await.unwrap(), 0);
    vm(store, &customer, &h).await;
    let mut queued = Vec::new();
    for i in 0..2 {
        queued.push(enqueue(store, &customer, &mine, at + Duration::milliseconds(i)).await);
    }
    let other_row = enqueue(store, &other, &theirs, at + Duration::milliseconds(5)).await;
    // One live instance and two open rows.
    assert_eq!(store.instances_held(&customer).await.unwrap(), 3);
    assert_eq!(store.instances_held(&other).await.unwrap(), 1);
    assert_eq!(store.open_queue_count().await.unwrap(), 3);
    let open: Vec<(String, i64, String)> = store
        .open_queue(Some(&customer), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|q| (q.row.id, q.position, q.email))
        .collect();
    assert_eq!(
        open,
        [
            (queued[0].clone(), 1, "customer@example.com".to_owned()),
            (queued[1].clone(), 2, "customer@example.com".to_owned())
        ]
    );
    assert_eq!(store.open_queue(None, 10).await.unwrap().len(), 3);
    assert_eq!(store.open_queue(None, 1).await.unwrap().len(), 1);
    let row = store.queue_row(&queued[0]).await.unwrap().unwrap();
    assert_eq!(
        (row.user_sub.as_str(), row.gpu_type.as_str()),
        (customer.as_str(), "spark-1")
    );
    assert!(store.queue_row("no-such-row").await.unwrap().is_none());

    // Two runs claim; one lets go of its own claims and no other's.
    let lease = at + Duration::minutes(1);
    let first = store
        .claim_queue_row(&queued[0], at, lease, "run-a")
        .await
        .unwrap()
        .expect("an open row no one holds");
    assert_eq!(first.claim_token.as_deref(), Some("run-a"));
    assert!(
        store
            .claim_queue_row(&queued[0], at, lease, "run-b")
            .await
            .unwrap()
            .is_none(),
        "a row under a live claim"
    );
    store
        .claim_queue_row(&queued[1], at, lease, "run-b")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.release_queue_claims("run-a").await.unwrap(), 1);
    assert_eq!(store.release_queue_claims("run-a").await.unwrap(), 0);
    assert_eq!(
        store
            .queue_row(&queued[0])
            .await
            .unwrap()
            .unwrap()
            .claim_token,
        None
    );
    assert_eq!(
        store
            .queue_row(&queued[1])
            .await
            .unwrap()
            .unwrap()
            .claim_token
            .as_deref(),
        Some("run-b")
    );
    assert_eq!(store.release_queue_claims("run-b").await.unwrap(), 1);

    // A cancel is recorded by its name; the tally reads what is open and what was placed.
    let closed = store
        .close_queued(
            &other_row,
            Some(&other),
            byo_db::queue::QueueClose::Cancelled,
            at,
        )
        .await
        .unwrap();
    assert_eq!(closed, byo_db::queue::QueueCloseOutcome::Closed);
    assert_eq!(
        store
            .queue_row(&other_row)
            .await
            .unwrap()
            .unwrap()
            .close_reason
            .as_deref(),
        Some("cancelled")
    );
    assert_eq!(byo_db::queue::QueueClose::Placed.as_str(), "placed");
    assert_eq!(
        byo_db::queue::QueueClose::PlacedByOperator.as_str(),
        "placed_by_operator"
    );
    assert_eq!(
        byo_db::queue::QueueClose::ClosedByOperator.as_str(),
        "closed_by_operator"
    );
    assert_eq!(store.open_queue_count().await.unwrap(), 2);
    let tally = store.queue_tally().await.unwrap();
    assert_eq!(
        (
            tally.open,
            tally.placed,
            tally.placed_instances,
            tally.instances,
            tally.hosts_with_two_live
        ),
        (2, 0, 0, 1, 0)
    );
    assert!(!store.gpu_type_staff_only("spark-1").await.unwrap());
    assert!(store.gpu_type_staff_only("linux-test").await.unwrap());
    assert!(!store.gpu_type_staff_only("no-such-type").await.unwrap());

    // A customer removes their own key, once, and never another's.
    assert!(!store.delete_ssh_key(&customer, &theirs).await.unwrap());
    assert!(store.ssh_key_of(&other, &theirs).await.unwrap().is_some());
    assert!(store.delete_ssh_key(&customer, &mine).await.unwrap());
    assert!(!store.delete_ssh_key(&customer, &mine).await.unwrap());
    assert!(store.ssh_keys_of(&customer).await.unwrap().is_empty());
}

/// The accounts' reads (issue #19: pinned before only through the server's account suites):
/// a user by id and by email, a password hash replaced (and a missing user named), the hosts
/// a user owns, and the overview giving each user their own roles and hosts.
async fn accounts_a_user_is_read_by_id_and_email_and_the_overview_is_each_ones_own(db: TestDb) {
    let store = &db.store;
    let a = user(store, "a@example.com").await;
    let b = user(store, "b@example.com").await;
    assert_eq!(
        store.user(&a).await.unwrap().map(|u| u.email),
        Some("a@example.com".into())
    );
    assert!(store.user("no-such-sub").await.unwrap().is_none());
    assert_eq!(
        store
            .user_by_email("b@example.com")
            .await
            .unwrap()
            .map(|u| u.sub),
        Some(b.clone())
    );
    assert!(
        store
            .user_by_email("nobody@example.com")
            .await
            .unwrap()
            .is_none()
    );
    // Several at once by id (the operator-key list's names): unknown ids left out.
    let mut both = vec![
        (a.clone(), "a@example.com".to_owned()),
        (b.clone(), "b@example.com".to_owned()),
    ];
    both.sort();
    assert_eq!(
        store.emails_of(&[&b, "no-such-sub", &a]).await.unwrap(),
        both
    );
    assert!(store.emails_of(&[]).await.unwrap().is_empty());

    store
        .set_password_hash(&a, "$argon2id$replaced")
        .await
        .unwrap();
    assert_eq!(
        store.user(&a).await.unwrap().unwrap().password_hash,
        "$argon2id$replaced"
    );
    assert_eq!(
        store.user(&b).await.unwrap().unwrap().password_hash,
        "$argon2id$x"
    );
    assert!(matches!(
        store.set_password_hash("no-such-sub", "$argon2id$y").await,
        Err(DbError::NotFound)
    ));

    host(store, &a, "spark-a1").await;
    host(store, &a, "spark-a2").await;
    assert_eq!(store.hosts_owned(&a).await.unwrap(), 2);
    assert_eq!(store.hosts_owned(&b).await.unwrap(), 0);

    store
        .grant_role(&a, Role::Superadmin, None, now())
        .await
        .unwrap();
    store
        .grant_role(&b, Role::Operator, Some(&a), now())
        .await
        .unwrap();
    assert_eq!(store.superadmin_count().await.unwrap(), 1);
    let overview: Vec<(String, Vec<Role>, i64)> = store
        .users_overview()
        .await
        .unwrap()
        .into_iter()
        .map(|o| (o.user.email, o.roles, o.hosts_owned))
        .collect();
    assert_eq!(
        overview,
        [
            ("a@example.com".to_owned(), vec![Role::Superadmin], 2),
            ("b@example.com".to_owned(), vec![Role::Operator], 0)
        ]
    );
    store
        .grant_role(&b, Role::Superadmin, Some(&a), now())
        .await
        .unwrap();
    assert_eq!(store.superadmin_count().await.unwrap(), 2);
}

/// The instance reads the server's pages, its heartbeat reconciliation and
/// notify-stuck-deletes stand on (issue #19: they were pinned by the server's suites alone):
/// the operator's list of live rows with host and owner, a customer's rows (the live ones and
/// those ended since), a host's live rows, and the deletes accepted and never confirmed.
async fn g_instances_are_read_live_by_owner_and_by_host_and_a_stuck_delete_is_found(db: TestDb) {
    let store = &db.store;
    let alice = user(store, "alice@example.com").await;
    let bob = user(store, "bob@example.com").await;
    let (a, b, c) = (
        host(store, &alice, "spark-a").await,
        host(store, &alice, "spark-b").await,
        host(store, &alice, "spark-c").await,
    );
    let t0 = now();
    let at = |s: i64| t0 + Duration::seconds(s);
    let create = |who: String, on: String, name: &'static str, when: DateTime<Utc>| async move {
        store
            .create_vm(
                NewVm {
                    user_sub: &who,
                    host_id: Some(&on),
                    name,
                    gpu_type: "spark-1",
                    ssh_hostname: None,
                },
                when,
            )
            .await
            .unwrap()
            .id
    };
    let live = create(alice.clone(), a.clone(), "a-live", at(0)).await;
    let failed = create(alice.clone(), b.clone(), "a-failed", at(1)).await;
    store.mark_vm_creation_failed(&failed, at(2)).await.unwrap();
    let gone = create(alice.clone(), c.clone(), "a-gone", at(3)).await;
    store.request_vm_delete(&gone, at(4)).await.unwrap();
    store.confirm_vm_deleted(&gone, at(5)).await.unwrap();
    let bobs = create(bob.clone(), b.clone(), "b-live", at(6)).await;
    let stuck = create(bob.clone(), c.clone(), "b-stuck", at(7)).await;
    store.request_vm_delete(&stuck, at(8)).await.unwrap();

    // The operator's list: every live row (a delete not yet confirmed is still live), oldest
    // first, with its host's slug and its owner's email.
    let listed: Vec<(String, Option<String>, String)> = store
        .live_vms()
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.vm.id, r.host_slug, r.owner_email))
        .collect();
    assert_eq!(
        listed,
        [
            (
                live.clone(),
                Some("spark-a".into()),
                "alice@example.com".into()
            ),
            (
                bobs.clone(),
                Some("spark-b".into()),
                "bob@example.com".into()
            ),
            (
                stuck.clone(),
                Some("spark-c".into()),
                "bob@example.com".into()
            ),
        ]
    );
    // A customer's: the live ones and those that ended after `since`, newest first; nobody
    // else's.
    let of = |who: String, since: DateTime<Utc>| async move {
        store
            .vms_of(&who, since)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(of(alice.clone(), at(4)).await, [gone.clone(), live.clone()]);
    assert_eq!(
        of(alice.clone(), at(1)).await,
        [gone.clone(), failed.clone(), live.clone()]
    );
    assert_eq!(of(alice.clone(), at(9)).await, std::slice::from_ref(&live));
    assert_eq!(of(bob.clone(), at(0)).await, [stuck.clone(), bobs.clone()]);
    // The same list with each host's relay address, read with it (only spark-b has one here).
    store
        .execute_unchecked(&format!(
            "update hosts set relay_ip = '203.0.113.9' where id = '{b}'"
        ))
        .await
        .unwrap();
    let with_relays: Vec<(String, Option<String>)> = store
        .listed_vms_of(&bob, at(0))
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.vm.id, l.relay_ip))
        .collect();
    assert_eq!(
        with_relays,
        [
            (stuck.clone(), None),
            (bobs.clone(), Some("203.0.113.9".into()))
        ]
    );
    // A host's live rows: what its heartbeat's list is compared with.
    for (on, want) in [(&a, &live), (&b, &bobs), (&c, &stuck)] {
        let held: Vec<String> = store
            .live_vms_on_host(on)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(held, std::slice::from_ref(want), "{on}");
    }
    // Stuck: requested at or before the cut-off and never confirmed.
    let stuck_at = |cut: DateTime<Utc>| async move {
        store
            .stuck_deletes(cut)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.id, r.host_slug, r.delete_requested_at))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        stuck_at(at(8)).await,
        [(stuck.clone(), Some("spark-c".into()), at(8))]
    );
    assert!(stuck_at(at(7)).await.is_empty());
}

/// E1's placement memory (migration 0008): a host that failed creates `bench_after` times in a
/// row is benched from the last failure's time; a create it takes forgets the count and the
/// bench; an operator's clear says whether there was anything to clear. A bench is in effect
/// until a heartbeat later than it.
async fn e1_placement_benches_a_host_after_failures_in_a_row_and_a_success_or_an_operator_clears_it(
    db: TestDb,
) {
    let store = &db.store;
    let owner = user(store, "owner@example.com").await;
    let h = host(store, &owner, "spark-a").await;
    let t0 = now();
    let at = |s: i64| t0 + Duration::seconds(s);
    assert!(store.host_bench(&h).await.unwrap().is_none());
    let fail = |n: i64| store.record_placement_failure(&h, "the agent refused", 3, at(n));
    assert_eq!(
        fail(0).await.unwrap(),
        PlacementScore {
            consecutive_failures: 1,
            benched: false
        }
    );
    let bench = store.host_bench(&h).await.unwrap().expect("remembered");
    assert_eq!(
        (
            bench.consecutive_failures,
            bench.last_failure.as_deref(),
            bench.last_failure_at,
            bench.benched_at,
            bench.seen_at
        ),
        (1, Some("the agent refused"), Some(at(0)), None, None)
    );
    assert!(!bench.in_effect());
    fail(1).await.unwrap();
    assert_eq!(
        fail(2).await.unwrap(),
        PlacementScore {
            consecutive_failures: 3,
            benched: true
        }
    );
    let bench = store.host_bench(&h).await.unwrap().unwrap();
    assert_eq!(bench.benched_at, Some(at(2)));
    assert!(bench.in_effect(), "benched and never heard from since");
    // A create the host took: nothing is remembered.
    store.record_placement_success(&h).await.unwrap();
    assert!(store.host_bench(&h).await.unwrap().is_none());
    // Benched again; an operator clears it, and a second clear finds nothing.
    store
        .record_placement_failure(&h, "no answer", 1, at(3))
        .await
        .unwrap();
    assert!(store.host_bench(&h).await.unwrap().unwrap().in_effect());
    assert!(store.clear_placement_bench(&h).await.unwrap());
    assert!(store.host_bench(&h).await.unwrap().is_none());
    assert!(!store.clear_placement_bench(&h).await.unwrap());

    // In effect until a heartbeat later than the bench: one at the bench's own time is not.
    let row = |benched: Option<i64>, seen: Option<i64>| HostBenchRow {
        host_id: h.clone(),
        consecutive_failures: 3,
        last_failure: None,
        last_failure_at: None,
        benched_at: benched.map(at),
        seen_at: seen.map(at),
    };
    assert!(row(Some(5), None).in_effect());
    assert!(row(Some(5), Some(4)).in_effect());
    assert!(row(Some(5), Some(5)).in_effect());
    assert!(!row(Some(5), Some(6)).in_effect());
    assert!(!row(None, Some(6)).in_effect());
    assert!(!row(None, None).in_effect());
}

/// How the backend finds and reaches a host (issue #19: pinned by the server's suites alone):
/// the host a presented token belongs to, retired hosts holding none; every target not
/// retired, by slug, with its relay and sealed agent token; and preparation's progress (129)
/// kept per machine — node0's on the host's row, stamping `prepared_at` once, a satellite's on
/// its node row, a machine the host does not have refused.
async fn c_a_host_is_known_by_its_token_reached_by_its_target_and_its_progress_kept_per_machine(
    db: TestDb,
) {
    let store = &db.store;
    let owner = user(store, "owner@example.com").await;
    let a = host(store, &owner, "spark-b").await;
    let b = host(store, &owner, "spark-a").await;
    let gone = host(store, &owner, "spark-c").await;
    let (ta, tgone) = (
        SecretToken::generate(TokenKind::Host),
        SecretToken::generate(TokenKind::Host),
    );
    for (h, t, ip) in [(&a, &ta, "203.0.113.1"), (&gone, &tgone, "203.0.113.3")] {
        store
            .execute_unchecked(&format!(
                "update hosts set token_hash = '{}', relay_ip = '{ip}', agent_token = 'sealed:{h}'
                 where id = '{h}'",
                t.hash().as_str()
            ))
            .await
            .unwrap();
    }
    store.retire_host(&gone, now()).await.unwrap();
    // The instance list's relay addresses, in one read: only hosts that have one.
    assert_eq!(
        store.relay_ips(&[&a, &b, "no-such-host"]).await.unwrap(),
        [(a.clone(), "203.0.113.1".to_owned())].into()
    );
    assert!(store.relay_ips(&[]).await.unwrap().is_empty());

    let targets: Vec<(String, String, Option<String>, Option<String>)> = store
        .agent_targets()
        .await
        .unwrap()
        .into_iter()
        .map(|t| (t.id, t.slug, t.relay_ip, t.agent_token))
        .collect();
    let reach_a = (
        a.clone(),
        "spark-b".to_owned(),
        Some("203.0.113.1".to_owned()),
        Some(format!("sealed:{a}")),
    );
    assert_eq!(
        targets,
        [(b.clone(), "spark-a".into(), None, None), reach_a.clone()]
    );
    let one = store.agent_target(&a).await.unwrap().expect("a's target");
    assert_eq!((one.id, one.slug, one.relay_ip, one.agent_token), reach_a);
    assert!(store.agent_target(&gone).await.unwrap().is_none());
    assert!(store.agent_target("no-such-host").await.unwrap().is_none());

    assert_eq!(
        store.host_id_by_token(&ta.hash()).await.unwrap(),
        Some(a.clone())
    );
    assert_eq!(store.host_id_by_token(&tgone.hash()).await.unwrap(), None);
    let stranger = SecretToken::generate(TokenKind::Host);
    assert_eq!(
        store.host_id_by_token(&stranger.hash()).await.unwrap(),
        None
    );

    // Progress: node0's on the host's row, prepared_at stamped once.
    store
        .insert_host_node(
            NewHostNode {
                host_id: &a,
                index: 1,
                machine_id: None,
                hardware_id: "node1-hw",
                fingerprint: &json!({}),
                rails: &json!({}),
            },
            now(),
        )
        .await
        .unwrap();
    let (t1, t2) = (now(), now() + Duration::seconds(5));
    let step = |step: &str, state: StepState, at: DateTime<Utc>| PrepareState {
        step: step.to_owned(),
        state,
        attempt: 1,
        error: None,
        is_final: false,
        at,
    };
    let running = step("lxd", StepState::Applying, t1);
    assert!(
        store
            .record_prepare_state(&a, 0, &running, false, t1)
            .await
            .unwrap()
    );
    let row = store.host(&a).await.unwrap().unwrap();
    assert_eq!(
        (row.prepare_state.map(|s| s.0), row.prepared_at),
        (Some(running.clone()), None)
    );
    let done = PrepareState {
        is_final: true,
        ..step("self-check", StepState::Satisfied, t1)
    };
    for at in [t1, t2] {
        assert!(
            store
                .record_prepare_state(&a, 0, &done, true, at)
                .await
                .unwrap()
        );
    }
    let row = store.host(&a).await.unwrap().unwrap();
    assert_eq!(
        (row.prepare_state.map(|s| s.0), row.prepared_at),
        (Some(done.clone()), Some(t1))
    );
    // A satellite's on its node row; the host's row is left as it was.
    let node1 = step("rail-network", StepState::Applying, t2);
    assert!(
        store
            .record_prepare_state(&a, 1, &node1, false, t2)
            .await
            .unwrap()
    );
    let nodes = store.host_nodes(&a).await.unwrap();
    let one = nodes.iter().find(|n| n.index == 1).unwrap();
    assert_eq!(one.prepare_state.as_ref().map(|s| &s.0), Some(&node1));
    assert_eq!(
        store
            .host(&a)
            .await
            .unwrap()
            .unwrap()
            .prepare_state
            .map(|s| s.0),
        Some(done.clone())
    );
    // A machine the host does not have, or a retired host: nothing to write.
    assert!(
        !store
            .record_prepare_state(&a, 2, &node1, false, t2)
            .await
            .unwrap()
    );
    assert!(
        !store
            .record_prepare_state(&gone, 0, &running, false, t2)
            .await
            .unwrap()
    );
    assert!(
        store
            .host(&gone)
            .await
            .unwrap()
            .unwrap()
            .prepare_state
            .is_none()
    );

    // A beat (133) is kept as the host's status, read back whole.
    assert!(store.host_status(&a).await.unwrap().is_none());
    let mut beat = testing::healthy_beat();
    beat.instances = 2;
    assert_eq!(
        store.record_heartbeat(&ta.hash(), &beat, t2).await.unwrap(),
        Some((a.clone(), false))
    );
    let status = store.host_status(&a).await.unwrap().expect("a's status");
    assert_eq!(
        (status.host_id, status.seen_at, status.instances),
        (a.clone(), t2, Some(2))
    );
    assert!(store.host_status(&b).await.unwrap().is_none());
}

/// Group commit (issue #41, 2): a hundred beats at once — 24 hosts, several beats each, one
/// host holding a live row, a retired host's token and tokens no host holds — are written in
/// batches, and each caller hears what its beat alone would have answered; each host's row is
/// one of its beats. On PostgreSQL a beat the database refuses (a NUL in its details) fails
/// its own caller only.
async fn step133_beats_arriving_together_are_written_together_each_answered_as_if_alone(
    db: TestDb,
) {
    let store = &db.store;
    let owner = user(store, "owner@example.com").await;
    let mut hosts = Vec::new();
    for i in 0..25 {
        let id = host(store, &owner, &format!("spark-{i}")).await;
        let token = SecretToken::generate(TokenKind::Host);
        store
            .execute_unchecked(&format!(
                "update hosts set token_hash = '{}' where id = '{id}'",
                token.hash().as_str()
            ))
            .await
            .unwrap();
        hosts.push((id, token));
    }
    let (gone, gone_token) = hosts.pop().unwrap();
    store.retire_host(&gone, now()).await.unwrap();
    vm(store, &owner, &hosts[3].0).await;
    let strangers: Vec<SecretToken> = (0..4)
        .map(|_| SecretToken::generate(TokenKind::Host))
        .collect();

    // Beat `k` of a host says `instances = k`: the row kept is one of the host's beats. Each
    // call: the token, the answer it must hear, `k`.
    type Call = (TokenHash, Option<(String, bool)>, u32);
    let calls: Vec<Call> = (0..100u32)
        .map(|k| match k % 25 {
            24 => (gone_token.hash(), None, k),
            20..=23 => (strangers[(k % 4) as usize].hash(), None, k),
            i => {
                let (id, token) = &hosts[i as usize];
                (token.hash(), Some((id.clone(), i == 3)), k)
            }
        })
        .collect();
    let t = now();
    let writes_before = store.heartbeat_writes();
    let answers = futures::future::join_all(calls.iter().map(|(hash, _, k)| {
        let mut beat = testing::healthy_beat();
        beat.instances = *k;
        async move { store.record_heartbeat(hash, &beat, t).await }
    }))
    .await;
    for ((_, want, k), got) in calls.iter().zip(answers) {
        assert_eq!(got.unwrap(), *want, "beat {k}");
    }
    // Written together: far fewer writes than beats (each writer takes what queued meanwhile).
    let writes = store.heartbeat_writes() - writes_before;
    assert!(writes < 50, "100 beats took {writes} writes");
    for (i, (id, _)) in hosts.iter().enumerate().take(20) {
        let status = store.host_status(id).await.unwrap().expect("a status row");
        let k = status.instances.unwrap() as usize;
        assert!(k % 25 == i && status.seen_at == t, "{id}: beat {k}");
    }
    assert!(store.host_status(&gone).await.unwrap().is_none());
    // The single statement alone (the bench's anchor) answers as a batch does.
    let beat = testing::healthy_beat();
    for (hash, want) in [
        (hosts[3].1.hash(), Some((hosts[3].0.clone(), true))),
        (hosts[4].1.hash(), Some((hosts[4].0.clone(), false))),
        (gone_token.hash(), None),
        (strangers[0].hash(), None),
    ] {
        assert_eq!(
            store.record_heartbeat_alone(&hash, &beat, t).await.unwrap(),
            want
        );
    }

    // One refused beat among many: it fails alone where the database refuses it.
    let t2 = t + Duration::seconds(1);
    let answers =
        futures::future::join_all(hosts.iter().take(20).enumerate().map(|(i, (_, token))| {
            let mut beat = testing::healthy_beat();
            if i == 7 {
                beat.details.gpu = Some("nul \u{0} here".into());
            }
            async move { store.record_heartbeat(&token.hash(), &beat, t2).await }
        }))
        .await;
    for (i, got) in answers.into_iter().enumerate() {
        match (i, db.backend()) {
            (7, byo_db::Backend::Postgres) => assert!(got.is_err(), "the NUL beat: {got:?}"),
            _ => assert_eq!(got.unwrap(), Some((hosts[i].0.clone(), i == 3)), "host {i}"),
        }
    }
    let kept = store.host_status(&hosts[0].0).await.unwrap().unwrap();
    assert_eq!(kept.seen_at, t2);
}

/// The installation's relay CA (one row): none until made; of two candidates the first kept,
/// and both callers read that one back.
async fn a_the_relay_ca_is_made_once_and_the_first_insert_wins(db: TestDb) {
    use byo_db::relay_ca::RelayCaRow;
    let store = &db.store;
    assert!(store.relay_ca().await.unwrap().is_none());
    let made = |pem: &str| RelayCaRow {
        cert_pem: pem.into(),
        sealed_key: format!("sealed:{pem}"),
        created_at: now(),
    };
    let first = made("first");
    let kept = store.relay_ca_or_insert(&first).await.unwrap();
    assert_eq!(
        (kept.cert_pem, kept.sealed_key),
        ("first".into(), "sealed:first".into())
    );
    let again = store.relay_ca_or_insert(&made("second")).await.unwrap();
    assert_eq!(
        (again.cert_pem, again.created_at),
        ("first".into(), first.created_at)
    );
    let read = store.relay_ca().await.unwrap().expect("made");
    assert_eq!(
        (read.cert_pem, read.sealed_key),
        ("first".into(), "sealed:first".into())
    );
}

/// Issue #38, 4: `path_walks`. One walk of a host runs at a time (a second start answers
/// none, another host's is its own); the newest is read, running or ended; a verdict is
/// written once, with its stage, error and legs; only a running walk's instance is passed
/// over by orphan removal; a walk left open past `stale_before` is closed as abandoned by the
/// next start.
async fn d_a_path_walk_runs_one_at_a_time_per_host_and_ends_once(db: TestDb) {
    use byo_db::path_walks::{WALK_ABANDONED, WalkEnd};
    let store = &db.store;
    let owner = user(store, "owner@example.com").await;
    let h = host(store, &owner, "walked").await;
    let other = host(store, &owner, "other").await;
    let t0 = now();
    assert!(store.latest_path_walk(&h).await.unwrap().is_none());
    let first = store
        .start_path_walk(
            &h,
            "vm-walk0001",
            Some(&owner),
            t0,
            t0 - TimeDelta::hours(1),
        )
        .await
        .unwrap()
        .expect("the first walk starts");
    assert_eq!(
        (
            first.host_id.as_str(),
            first.vm_name.as_str(),
            first.by_sub.as_deref(),
            first.started_at,
            first.passed
        ),
        (h.as_str(), "vm-walk0001", Some(owner.as_str()), t0, None)
    );
    assert!(
        store
            .start_path_walk(&h, "vm-walk0002", None, t0, t0 - TimeDelta::hours(1))
            .await
            .unwrap()
            .is_none(),
        "one at a time"
    );
    let theirs = store
        .start_path_walk(&other, "vm-walk0003", None, t0, t0 - TimeDelta::hours(1))
        .await
        .unwrap()
        .expect("another host's walk is its own");
    assert_eq!(
        store.walking_vm_names(&h).await.unwrap(),
        vec!["vm-walk0001".to_owned()]
    );
    assert_eq!(
        store.latest_path_walk(&h).await.unwrap(),
        Some(first.clone())
    );

    let t1 = t0 + TimeDelta::seconds(9);
    let failed = WalkEnd {
        passed: false,
        stage: Some("ssh"),
        error: Some("Permission denied (publickey)."),
        create_ms: Some(1200),
        ssh_ms: None,
        delete_ms: Some(800),
    };
    store
        .finish_path_walk(&first.id, &failed, t1)
        .await
        .unwrap();
    // Written once: a second verdict leaves the first.
    let passed = WalkEnd {
        passed: true,
        ..Default::default()
    };
    store
        .finish_path_walk(&first.id, &passed, t1 + TimeDelta::seconds(1))
        .await
        .unwrap();
    let ended = store.latest_path_walk(&h).await.unwrap().unwrap();
    assert_eq!(
        (
            ended.finished_at,
            ended.passed,
            ended.stage.as_deref(),
            ended.error.as_deref()
        ),
        (
            Some(t1),
            Some(false),
            Some("ssh"),
            Some("Permission denied (publickey).")
        )
    );
    assert_eq!(
        (ended.create_ms, ended.ssh_ms, ended.delete_ms),
        (Some(1200), None, Some(800))
    );
    assert!(store.walking_vm_names(&h).await.unwrap().is_empty());
    assert_eq!(
        store.walking_vm_names(&other).await.unwrap(),
        vec!["vm-walk0003".to_owned()]
    );

    // The next walk is the newest.
    let t2 = t1 + TimeDelta::minutes(1);
    let second = store
        .start_path_walk(&h, "vm-walk0004", None, t2, t2 - TimeDelta::hours(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.latest_path_walk(&h).await.unwrap().map(|w| w.id),
        Some(second.id.clone())
    );
    // Left open (its server stopped): closed as abandoned by a start after `stale_before`.
    let t3 = t2 + TimeDelta::hours(2);
    let third = store
        .start_path_walk(&h, "vm-walk0005", None, t3, t3 - TimeDelta::hours(1))
        .await
        .unwrap()
        .expect("the abandoned walk does not hold the host");
    let walks = store.path_walks_of(&h, 10).await.unwrap();
    assert_eq!(
        walks.iter().map(|w| w.id.as_str()).collect::<Vec<_>>(),
        vec![third.id.as_str(), second.id.as_str(), first.id.as_str()],
        "newest first"
    );
    assert_eq!(
        (
            walks[1].finished_at,
            walks[1].passed,
            walks[1].error.as_deref(),
            walks[1].stage.as_deref()
        ),
        (Some(t3), Some(false), Some(WALK_ABANDONED), None)
    );
    assert_eq!(store.path_walks_of(&h, 1).await.unwrap().len(), 1);
    assert_eq!(
        store.walking_vm_names(&h).await.unwrap(),
        vec!["vm-walk0005".to_owned()]
    );
    assert!(
        store
            .start_path_walk(&other, "vm-walk0006", None, t3, t0 - TimeDelta::hours(1))
            .await
            .unwrap()
            .is_none(),
        "a walk newer than stale_before is not abandoned"
    );
    assert_eq!(
        store.latest_path_walk(&other).await.unwrap().map(|w| w.id),
        Some(theirs.id.clone())
    );
    // Several hosts' newest at once (the hosts list): one each, none for a host never walked.
    let never = host(store, &owner, "never").await;
    let mut both = vec![
        (h.clone(), third.id.clone()),
        (other.clone(), theirs.id.clone()),
    ];
    both.sort();
    let newest = store
        .latest_path_walks(&[&other, &never, &h])
        .await
        .unwrap();
    assert_eq!(
        newest
            .into_iter()
            .map(|w| (w.host_id, w.id))
            .collect::<Vec<_>>(),
        both
    );
    assert!(store.latest_path_walks(&[]).await.unwrap().is_empty());
}
