//! Life after go-live's Store rules (issue #12: de-pool, H's revoke recorded step by step,
//! N's blockers, the relay's sealed key, the one-host page's reads) on both backends.

use byo_db::DbError;
use byo_db::testing::{TestDb, pickable_host};
use byo_wire::states::RevokeStep;
use chrono::Duration;
use serde_json::json;

use super::{now, user, vm};

pub(super) async fn h1_depool_then_a_revoke_recorded_step_by_step_and_never_backwards(db: TestDb) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let staff = user(&db, "staff@example.com").await;
    let h = pickable_host(&db, &owner, "life-1", t).await;
    let row = db.host_lifecycle(&h).await.unwrap().unwrap();
    assert!(row.active && row.depooled_at.is_none() && row.revoke_step.0.is_none());
    assert!(db.host_lifecycle("no-such-host").await.unwrap().is_none());

    db.depool_host(&h, "fan noise", &owner, t).await.unwrap();
    let row = db.host_lifecycle(&h).await.unwrap().unwrap();
    assert!(!row.active);
    assert_eq!(
        (
            row.depooled_at,
            row.depooled_by.as_deref(),
            row.depool_reason.as_deref()
        ),
        (Some(t), Some(owner.as_str()), Some("fan noise"))
    );
    assert!(matches!(
        db.depool_host("no-such-host", "x", &owner, t).await,
        Err(DbError::NotFound)
    ));

    // The revoke keeps the first de-pool and the first request, however often it is begun.
    let later = t + Duration::minutes(5);
    db.begin_revoke(&h, "owner left", &staff, later)
        .await
        .unwrap();
    db.begin_revoke(&h, "again", &staff, later + Duration::minutes(1))
        .await
        .unwrap();
    let row = db.host_lifecycle(&h).await.unwrap().unwrap();
    assert_eq!(row.revoke_requested_at, Some(later));
    assert_eq!(row.revoke_step.0, Some(RevokeStep::Draining));
    assert_eq!(
        (
            row.depooled_at,
            row.depooled_by.as_deref(),
            row.depool_reason.as_deref()
        ),
        (Some(t), Some(owner.as_str()), Some("fan noise"))
    );
    let open = db.revokes_in_progress().await.unwrap();
    assert_eq!(open, [(h.clone(), RevokeStep::Draining, later)]);
    db.set_revoke_step(&h, RevokeStep::RemovingAccess)
        .await
        .unwrap();
    assert_eq!(
        db.revokes_in_progress().await.unwrap(),
        [(h.clone(), RevokeStep::RemovingAccess, later)]
    );

    // A host with no revoke does not get a step; a finish needs a revoke begun.
    let other = pickable_host(&db, &owner, "life-2", t).await;
    db.set_revoke_step(&other, RevokeStep::RemovingAccess)
        .await
        .unwrap();
    assert_eq!(
        db.host_lifecycle(&other)
            .await
            .unwrap()
            .unwrap()
            .revoke_step
            .0,
        None
    );
    assert!(matches!(
        db.finish_revoke(&other, t).await,
        Err(DbError::NotFound)
    ));
    assert!(
        db.host_lifecycle(&other)
            .await
            .unwrap()
            .unwrap()
            .relay_ip
            .is_some()
    );

    db.record_relay_key(&h, "sealed:key").await.unwrap();
    assert!(db.host_lifecycle(&h).await.unwrap().unwrap().relay_key_kept);
    let done = later + Duration::minutes(10);
    db.finish_revoke(&h, done).await.unwrap();
    let row = db.host_lifecycle(&h).await.unwrap().unwrap();
    assert_eq!(row.revoke_step.0, Some(RevokeStep::Revoked));
    assert_eq!(row.revoked_at, Some(done));
    assert!(!row.relay_key_kept && row.relay_ip.is_none());
    let relay = db.relay_record(&h).await.unwrap();
    assert!(relay.relay_ip.is_none() && relay.relay_state.0.is_none());
    // Finished stays finished: no step moves it back, and it is no longer in progress.
    db.set_revoke_step(&h, RevokeStep::Draining).await.unwrap();
    assert_eq!(
        db.host_lifecycle(&h).await.unwrap().unwrap().revoke_step.0,
        Some(RevokeStep::Revoked)
    );
    assert!(db.revokes_in_progress().await.unwrap().is_empty());
    // Finishing again keeps the first time.
    db.finish_revoke(&h, done + Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(
        db.host_lifecycle(&h).await.unwrap().unwrap().revoked_at,
        Some(done)
    );
}

pub(super) async fn n1_retire_blockers_and_the_relays_kept_key(db: TestDb) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let h = pickable_host(&db, &owner, "ret-1", t).await;
    let none = db.retire_blockers(&h, t).await.unwrap();
    assert_eq!((none.live, none.booked, none.enrollments.len()), (0, 0, 0));

    let live = vm(&db, &owner, &h).await;
    db.book_prebooking(
        byo_db::prebookings::NewPrebooking {
            user_sub: &owner,
            gpu_type: "spark-1",
            start_date: t + Duration::days(1),
            end_date: t + Duration::days(2),
        },
        5,
        t,
    )
    .await
    .unwrap();
    let b = db.retire_blockers(&h, t).await.unwrap();
    assert_eq!((b.live, b.booked), (1, 1));
    // After its window the booking no longer blocks; a confirmed delete no longer counts.
    let b = db.retire_blockers(&h, t + Duration::days(2)).await.unwrap();
    assert_eq!((b.live, b.booked), (1, 0));
    db.confirm_vm_deleted(&live, t).await.unwrap();
    assert_eq!(db.retire_blockers(&h, t).await.unwrap().live, 0);

    // The relay's sealed key, read back with what a replacement relay is booted with.
    assert_eq!(db.relay_rebuild(&h).await.unwrap().unwrap().0, None);
    db.record_relay_key(&h, "sealed:relay").await.unwrap();
    let (key, _pubkey, _ssh_map) = db.relay_rebuild(&h).await.unwrap().unwrap();
    assert_eq!(key.as_deref(), Some("sealed:relay"));
    assert!(db.relay_rebuild("no-such-host").await.unwrap().is_none());
    db.forget_relay_address(&h).await.unwrap();
    let relay = db.relay_record(&h).await.unwrap();
    assert_eq!(relay.relay_ip, None);
    assert_eq!(
        relay.relay_state.0.map(|s| s.as_str()),
        Some("provisioning")
    );
    assert!(matches!(
        db.relay_record("no-such-host").await,
        Err(DbError::NotFound)
    ));
}

pub(super) async fn n_the_one_host_pages_reads_its_instances_and_its_audit(db: TestDb) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let h = pickable_host(&db, &owner, "page-1", t).await;
    let elsewhere = pickable_host(&db, &owner, "page-2", t).await;
    // A failed create, a deleted instance, then a live one (one live per host).
    let failed = vm(&db, &owner, &h).await;
    db.mark_vm_creation_failed(&failed, t).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let gone = vm(&db, &owner, &h).await;
    db.confirm_vm_deleted(&gone, t).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let live = vm(&db, &owner, &h).await;
    let other = vm(&db, &owner, &elsewhere).await;

    let lives: Vec<_> = db
        .live_vms_of_host(&h)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.id)
        .collect();
    assert_eq!(lives, std::slice::from_ref(&live));
    let all: Vec<_> = db
        .vms_of_host(&h, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.id)
        .collect();
    assert_eq!(
        all,
        [live.clone(), gone.clone(), failed.clone()],
        "live first, then newest"
    );
    assert_eq!(db.vms_of_host(&h, 2).await.unwrap().len(), 2);

    db.audit(Some(&owner), "host.depool", Some(&h), json!({}), t)
        .await
        .unwrap();
    db.audit(
        Some(&owner),
        "vm.delete",
        Some(&gone),
        json!({}),
        t + Duration::seconds(1),
    )
    .await
    .unwrap();
    db.audit(Some(&owner), "vm.delete", Some(&other), json!({}), t)
        .await
        .unwrap();
    db.audit(None, "unrelated", None, json!({}), t)
        .await
        .unwrap();
    let trail = db.audit_of_host(&h, 10).await.unwrap();
    let seen: Vec<_> = trail
        .iter()
        .map(|a| (a.action.as_str(), a.target.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            ("vm.delete", Some(gone.clone())),
            ("host.depool", Some(h.clone()))
        ],
        "newest first, the host and its own instances only"
    );
    assert_eq!(db.audit_of_host(&h, 1).await.unwrap().len(), 1);
}

/// Issue #36: a relay's secrets are fetched once, with a token that lapses, and never for a
/// host retired or being revoked; a second token (a relay replaced) takes the first's place.
pub(super) async fn a_a_relays_secrets_token_is_spent_once_and_never_when_lapsed_or_revoked(
    db: TestDb,
) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let staff = user(&db, "staff@example.com").await;
    let h = pickable_host(&db, &owner, "rly-1", t).await;
    db.record_relay_key(&h, "sealed:relay").await.unwrap();
    assert!(db.relay_secrets_fetched(&h).await.unwrap().is_none());
    let lapses = t + Duration::hours(1);
    db.issue_relay_secrets_token(&h, "hash-1", lapses)
        .await
        .unwrap();
    // Unknown, and lapsed (exactly at the bound too), answer none and spend nothing.
    assert!(
        db.spend_relay_secrets_token("hash-0", t, "10.0.0.9")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        db.spend_relay_secrets_token("hash-1", lapses, "10.0.0.9")
            .await
            .unwrap()
            .is_none()
    );
    assert!(db.relay_secrets_fetched(&h).await.unwrap().is_none());
    let spent = db
        .spend_relay_secrets_token("hash-1", t, "34.1.2.1")
        .await
        .unwrap()
        .expect("a live token is spent");
    assert_eq!(
        (spent.host_id.as_str(), spent.relay_wg_key.as_deref()),
        (h.as_str(), Some("sealed:relay"))
    );
    assert_eq!(
        db.relay_secrets_fetched(&h).await.unwrap(),
        Some((t, "34.1.2.1".to_owned()))
    );
    assert!(
        db.spend_relay_secrets_token("hash-1", t, "34.1.2.1")
            .await
            .unwrap()
            .is_none(),
        "spent once"
    );
    // A replacement's token: the old one (had it not been spent) no longer counts.
    db.issue_relay_secrets_token(&h, "hash-2", lapses)
        .await
        .unwrap();
    db.issue_relay_secrets_token(&h, "hash-3", lapses)
        .await
        .unwrap();
    assert!(db.relay_secrets_fetched(&h).await.unwrap().is_none());
    assert!(
        db.spend_relay_secrets_token("hash-2", t, "x")
            .await
            .unwrap()
            .is_none()
    );
    // A host being revoked gets nothing.
    db.begin_revoke(&h, "owner left", &staff, t).await.unwrap();
    assert!(
        db.spend_relay_secrets_token("hash-3", t, "x")
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        db.issue_relay_secrets_token("no-such-host", "hash-4", lapses)
            .await,
        Err(DbError::NotFound)
    ));
}

/// Issue #39: the creates nobody settled are read by age, and a delete of a row that never
/// ran marks it failed as it deletes it (bills nothing); a running row's delete does not.
pub(super) async fn g_unsettled_creates_by_age_and_a_delete_of_one_that_never_ran(db: TestDb) {
    let t = now();
    let owner = user(&db, "owner@example.com").await;
    let h1 = pickable_host(&db, &owner, "settle-1", t).await;
    let h2 = pickable_host(&db, &owner, "settle-2", t).await;
    let h3 = pickable_host(&db, &owner, "settle-3", t).await;
    let creating = vm(&db, &owner, &h1).await;
    let running = vm(&db, &owner, &h2).await;
    db.mark_vm_running(&running, Some(2201)).await.unwrap();
    let failed = vm(&db, &owner, &h3).await;
    db.mark_vm_creation_failed(&failed, t).await.unwrap();
    let made = db.vm(&creating).await.unwrap().unwrap().created_at;
    let ids = |rows: Vec<byo_db::vms::VmRow>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(db.unsettled_creates(made, 10).await.unwrap()),
        [creating.as_str()]
    );
    assert!(
        db.unsettled_creates(made - Duration::seconds(1), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(db.unsettled_creates(made, 0).await.unwrap().is_empty());

    let later = t + Duration::minutes(30);
    db.confirm_vm_deleted(&creating, later).await.unwrap();
    db.confirm_vm_deleted(&running, later).await.unwrap();
    let c = db.vm(&creating).await.unwrap().unwrap();
    let r = db.vm(&running).await.unwrap().unwrap();
    assert_eq!(
        (c.deleted_at, c.creation_failed_at),
        (Some(later), Some(later))
    );
    assert_eq!((r.deleted_at, r.creation_failed_at), (Some(later), None));
    assert!(db.unsettled_creates(later, 10).await.unwrap().is_empty());
}
