//! Provisioning's Store rules (A, B steps 28–29, reap, H's revoke of an unredeemed
//! enrolment) on both backends: the owner's cap and the slug taken in one transaction, the
//! relay and tunnel recorded, redeem's three outcomes written (or, aborted, nothing), and the
//! allocation handed back.

use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::DbError;
use byo_db::provisioning::{MAX_OUTSTANDING, NewProvision, RedeemDecision, RedeemNode, Redeemed};
use byo_db::testing::TestDb;
use byo_wire::states::{EnrollmentState, RelayState};
use chrono::Duration;
use serde_json::json;

use super::{now, user};

async fn provision(db: &TestDb, owner: &str) -> (byo_db::provisioning::Provisioned, SecretToken) {
    let token = SecretToken::generate(TokenKind::Enrollment);
    let map = SecretToken::generate(TokenKind::SshMap);
    let p = db
        .provision_host(
            NewProvision {
                enrollment_id: &byo_db::new_id(),
                owner_sub: owner,
                profile_id: "gb10-spark-1",
                gpu_type: "spark-1",
                token_hash: &token.hash(),
                token_expires_at: now() + Duration::hours(1),
                ssh_map_token_hash: &map.hash(),
                sealed_secrets: "sealed:secrets",
            },
            now(),
        )
        .await
        .unwrap();
    (p, token)
}

async fn enrolment(db: &TestDb, id: &str) -> byo_db::provisioning::EnrollmentView {
    db.enrollment_views(None)
        .await
        .unwrap()
        .into_iter()
        .find(|e| e.id == id)
        .expect("the enrolment is listed")
}

fn accept(hardware_id: &str) -> RedeemDecision {
    let host_token = SecretToken::generate(TokenKind::Host);
    RedeemDecision::Accept {
        nodes: vec![RedeemNode {
            index: 0,
            machine_id: Some("m-0".into()),
            hardware_id: hardware_id.into(),
            fingerprint: json!({"gpu_model": "GB10"}),
            rails: json!({"enp1s0f0np0": {"carrier": true}}),
        }],
        fingerprint: json!({"gpu_model": "GB10"}),
        host_pubkey: "wg-public".into(),
        host_token_hash: host_token.hash(),
        sealed_agent_token: "sealed:agent".into(),
    }
}

pub(super) async fn a_provision_counts_the_cap_and_never_reuses_a_slug(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let other = user(&db, "other@example.com").await;
    assert_eq!(db.outstanding_allocations(&owner).await.unwrap(), 0);
    let mut made = Vec::new();
    for _ in 0..MAX_OUTSTANDING {
        made.push(provision(&db, &owner).await.0);
    }
    let slugs: Vec<_> = made.iter().map(|p| p.slug.as_str()).collect();
    assert_eq!(slugs, ["spark-1", "spark-2", "spark-3"]);
    assert_eq!(
        db.outstanding_allocations(&owner).await.unwrap(),
        MAX_OUTSTANDING
    );
    // One past the cap is refused and writes nothing.
    let token = SecretToken::generate(TokenKind::Enrollment);
    let past = db
        .provision_host(
            NewProvision {
                enrollment_id: &byo_db::new_id(),
                owner_sub: &owner,
                profile_id: "gb10-spark-1",
                gpu_type: "spark-1",
                token_hash: &token.hash(),
                token_expires_at: now() + Duration::hours(1),
                ssh_map_token_hash: &token.hash(),
                sealed_secrets: "x",
            },
            now(),
        )
        .await;
    assert!(
        matches!(&past, Err(DbError::Refused(r)) if r == "allocation_cap"),
        "{past:?}"
    );
    assert_eq!(db.hosts_of(&owner).await.unwrap().len(), 3);
    // The cap is the owner's: another owner provisions, under the next slug.
    let theirs = provision(&db, &other).await.0;
    assert_eq!(theirs.slug, "spark-4");
    // A revoked allocation frees a place; its slug is never given out again.
    assert!(db.revoke_enrollment(&made[2].enrollment_id).await.unwrap());
    assert!(
        !db.revoke_enrollment(&made[2].enrollment_id).await.unwrap(),
        "only once"
    );
    assert_eq!(db.outstanding_allocations(&owner).await.unwrap(), 2);
    db.release_allocation(&made[2].enrollment_id, now())
        .await
        .unwrap();
    assert!(
        db.host(&made[2].host_id).await.unwrap().is_none(),
        "an unredeemed host goes"
    );
    let next = provision(&db, &owner).await.0;
    assert_eq!(next.slug, "spark-5");
    // hosts_of: newest first, the owner's own.
    let mine: Vec<_> = db
        .hosts_of(&owner)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.slug)
        .collect();
    assert_eq!(mine, ["spark-5", "spark-2", "spark-1"]);
}

pub(super) async fn a_the_relay_and_tunnel_are_recorded_on_the_host(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let (p, _) = provision(&db, &owner).await;
    let (name, ip, tunnel, token) = db.host_delivery(&p.host_id).await.unwrap();
    assert_eq!(name.as_deref(), Some(format!("{}-relay", p.slug).as_str()));
    assert_eq!((ip, tunnel, token), (None, None, None));
    db.record_relay(&p.host_id, Some("203.0.113.7"), RelayState::Ready, None)
        .await
        .unwrap();
    // A later failure keeps the address it had, and records the error.
    db.record_relay(&p.host_id, None, RelayState::Failed, Some("quota"))
        .await
        .unwrap();
    let relay = db.relay_record(&p.host_id).await.unwrap();
    assert_eq!(relay.relay_ip.as_deref(), Some("203.0.113.7"));
    assert_eq!(relay.relay_state.0, Some(RelayState::Failed));
    assert_eq!(relay.relay_error.as_deref(), Some("quota"));
    db.record_tunnel(&p.host_id, "tun-1", "spark-1.example", "sealed:tunnel")
        .await
        .unwrap();
    let (_, ip, tunnel, token) = db.host_delivery(&p.host_id).await.unwrap();
    assert_eq!(ip.as_deref(), Some("203.0.113.7"));
    assert_eq!(tunnel.as_deref(), Some("spark-1.example"));
    assert_eq!(token.as_deref(), Some("sealed:tunnel"));
}

pub(super) async fn step28_redeem_writes_what_the_judge_decided_and_an_abort_nothing(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let (p, token) = provision(&db, &owner).await;
    // An abort leaves the enrolment and its token exactly as they were.
    let aborted = db
        .redeem(&token.hash(), now(), |_| {
            RedeemDecision::Abort("secrets do not open".into())
        })
        .await;
    assert!(
        matches!(&aborted, Ok(Redeemed::Aborted(r)) if r == "secrets do not open"),
        "{aborted:?}"
    );
    let v = enrolment(&db, &p.enrollment_id).await;
    assert_eq!(v.state, EnrollmentState::Pending);
    assert_eq!(v.node_count, 0);
    // The context carries what the judge needs.
    let seen = std::sync::Mutex::new(None);
    let got = db
        .redeem(&token.hash(), now(), |ctx| {
            *seen.lock().unwrap() = Some((
                ctx.slug.clone(),
                ctx.profile_id.clone(),
                ctx.sealed_secrets.clone(),
            ));
            accept("hw-node0")
        })
        .await
        .unwrap();
    assert!(matches!(got, Redeemed::Enrolled(_)));
    assert_eq!(
        seen.into_inner().unwrap(),
        Some((
            p.slug.clone(),
            "gb10-spark-1".into(),
            Some("sealed:secrets".into())
        ))
    );
    let v = enrolment(&db, &p.enrollment_id).await;
    assert_eq!(v.state, EnrollmentState::Enrolled);
    assert_eq!(v.node_count, 1);
    assert!(v.redeemed_at.is_some());
    let host = db.host(&p.host_id).await.unwrap().unwrap();
    assert_eq!(host.pubkey.as_deref(), Some("wg-public"));
    let nodes = db.host_nodes(&p.host_id).await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].hardware_id, "hw-node0");
    // Spent: the same token is no token at all, and the enrolment is no longer outstanding.
    assert!(matches!(
        db.redeem(&token.hash(), now(), |_| accept("hw-x"))
            .await
            .unwrap(),
        Redeemed::NoSuchToken
    ));
    assert_eq!(db.outstanding_allocations(&owner).await.unwrap(), 0);
    // A redeemed enrolment is not revoked, and its host survives a release.
    assert!(!db.revoke_enrollment(&p.enrollment_id).await.unwrap());
    db.release_allocation(&p.enrollment_id, now())
        .await
        .unwrap();
    assert!(db.host(&p.host_id).await.unwrap().is_some());

    // A second machine with the same hardware is rejected, and the rejection recorded whole.
    let (q, token2) = provision(&db, &owner).await;
    let got = db
        .redeem(&token2.hash(), now(), |_| accept("hw-node0"))
        .await
        .unwrap();
    let Redeemed::Rejected { reason, .. } = got else {
        panic!("{got:?}")
    };
    assert_eq!(reason, "node 0 is already enrolled as another host");
    let v = enrolment(&db, &q.enrollment_id).await;
    assert_eq!(v.state, EnrollmentState::Rejected);
    assert_eq!(v.reject_reason.as_deref(), Some(reason.as_str()));
    assert_eq!(v.fingerprint.unwrap().0, json!({"hardware_id": "hw-node0"}));
    assert!(db.host_nodes(&q.host_id).await.unwrap().is_empty());
}

pub(super) async fn reap_hands_back_rejected_revoked_and_lapsed_allocations(db: TestDb) {
    let owner = user(&db, "owner@example.com").await;
    let (lapsed, _) = provision(&db, &owner).await;
    let (revoked, _) = provision(&db, &owner).await;
    let (kept, _) = provision(&db, &owner).await;
    db.revoke_enrollment(&revoked.enrollment_id).await.unwrap();
    let t = now();
    let ids = |r: Vec<byo_db::provisioning::Reapable>| {
        r.into_iter().map(|r| r.enrollment_id).collect::<Vec<_>>()
    };
    // Before expiry only the revoked one; after it, the lapsed ones too, oldest first.
    assert_eq!(
        ids(db.reapable(t).await.unwrap()),
        std::slice::from_ref(&revoked.enrollment_id)
    );
    let later = t + Duration::hours(2);
    assert_eq!(
        ids(db.reapable(later).await.unwrap()),
        [
            lapsed.enrollment_id.clone(),
            revoked.enrollment_id.clone(),
            kept.enrollment_id.clone()
        ]
    );
    db.release_allocation(&lapsed.enrollment_id, later)
        .await
        .unwrap();
    db.release_allocation(&lapsed.enrollment_id, later)
        .await
        .unwrap();
    let v = enrolment(&db, &lapsed.enrollment_id).await;
    assert_eq!(v.state, EnrollmentState::Expired);
    assert!(v.slug.is_none(), "the host row is gone");
    assert!(db.host(&lapsed.host_id).await.unwrap().is_none());
    assert_eq!(
        ids(db.reapable(later).await.unwrap()),
        [revoked.enrollment_id.clone(), kept.enrollment_id.clone()]
    );
    assert!(matches!(
        db.release_allocation("no-such-enrolment", later).await,
        Err(DbError::NotFound)
    ));
    // Everyone's list for operators; one owner's for the owner.
    let other = user(&db, "other@example.com").await;
    provision(&db, &other).await;
    assert_eq!(db.enrollment_views(None).await.unwrap().len(), 4);
    assert_eq!(db.enrollment_views(Some(&owner)).await.unwrap().len(), 3);
    assert_eq!(
        db.enrollment_views(Some(&other)).await.unwrap()[0].owner_email,
        "other@example.com"
    );
}

/// Issue #39 (6): a host that never redeemed but that a pre-booking names (written by hand:
/// no product path books one). Revoking its enrolment is refused while the booking is open,
/// and nothing changes; the booking named. Once the booking is closed the revoke goes
/// through and reap's release keeps the host row (a closed booking still names it) retired
/// instead of meeting the foreign key on every sweep. A delete that meets the key answers
/// `DbError::ForeignKey`, not a bare refusal.
pub(super) async fn h_revoking_a_booked_never_redeemed_host_is_refused_and_reap_keeps_what_is_named(
    db: TestDb,
) {
    let owner = user(&db, "owner@example.com").await;
    let customer = user(&db, "customer@example.com").await;
    let (p, _) = provision(&db, &owner).await;
    let t = now();
    db.execute_unchecked(&format!(
        "insert into prebookings (id, user_sub, host_id, gpu_type, start_date, end_date, created_at)
         values ('b-1', '{customer}', '{}', 'spark-1', '{}', '{}', '{}')",
        p.host_id,
        (t + Duration::days(1)).to_rfc3339(),
        (t + Duration::days(2)).to_rfc3339(),
        t.to_rfc3339()
    ))
    .await
    .unwrap();
    assert_eq!(
        db.open_booking_on_host(&p.host_id)
            .await
            .unwrap()
            .as_deref(),
        Some("b-1")
    );
    assert!(!db.revoke_enrollment(&p.enrollment_id).await.unwrap());
    assert_eq!(
        enrolment(&db, &p.enrollment_id).await.state,
        EnrollmentState::Pending,
        "nothing changed"
    );
    // The key itself, met by a careless writer: a worded variant, nothing deleted.
    let err = db
        .execute_unchecked(&format!("delete from hosts where id = '{}'", p.host_id))
        .await
        .unwrap_err();
    assert!(matches!(err, DbError::ForeignKey(_)), "{err:?}");
    assert!(db.host(&p.host_id).await.unwrap().is_some());

    // The booking closed: the revoke goes through; the release keeps the named row, retired.
    db.execute_unchecked(&format!(
        "update prebookings set closed_at = '{}', closed_reason = 'cancelled' where id = 'b-1'",
        t.to_rfc3339()
    ))
    .await
    .unwrap();
    assert_eq!(db.open_booking_on_host(&p.host_id).await.unwrap(), None);
    assert!(db.revoke_enrollment(&p.enrollment_id).await.unwrap());
    db.release_allocation(&p.enrollment_id, t).await.unwrap();
    db.release_allocation(&p.enrollment_id, t).await.unwrap();
    let kept = db
        .host(&p.host_id)
        .await
        .unwrap()
        .expect("a booking names it");
    assert_eq!((kept.retired_at, kept.active), (Some(t), false));
    let e = enrolment(&db, &p.enrollment_id).await;
    assert_eq!(e.state, EnrollmentState::Revoked);
    assert!(
        db.reapable(t).await.unwrap().is_empty(),
        "released: reap is done with it"
    );

    // One nobody names goes, as before.
    let (q, _) = provision(&db, &owner).await;
    assert!(db.revoke_enrollment(&q.enrollment_id).await.unwrap());
    db.release_allocation(&q.enrollment_id, t).await.unwrap();
    assert!(db.host(&q.host_id).await.unwrap().is_none());
}
