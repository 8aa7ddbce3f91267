//! The sealed columns' Store rules (issue #36, 8) on both backends: each column's values are
//! read by their seal's version with their row's key, a value is replaced only while its
//! row still holds the one read, the pass's finish is kept once, and an enrolment is written
//! under the id its secrets were sealed for.

use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::GuardedWrite;
use byo_db::provisioning::NewProvision;
use byo_db::relay_ca::RelayCaRow;
use byo_db::sealed::{RELAY_CA_ROW, SealedColumn, SealedValue};
use byo_db::testing::TestDb;
use chrono::Duration;

use super::{now, user};

fn value(row: &str, sealed: &str) -> SealedValue {
    SealedValue {
        row: row.into(),
        sealed: sealed.into(),
    }
}

pub(super) async fn a36_8_sealed_values_are_read_by_version_and_replaced_only_where_unchanged(
    db: TestDb,
) {
    let owner = user(&db, "owner@example.com").await;
    let token = SecretToken::generate(TokenKind::Enrollment);
    let enrollment_id = byo_db::new_id();
    let p = db
        .provision_host(
            NewProvision {
                enrollment_id: &enrollment_id,
                owner_sub: &owner,
                profile_id: "gb10-spark-1",
                gpu_type: "spark-1",
                token_hash: &token.hash(),
                token_expires_at: now() + Duration::hours(1),
                ssh_map_token_hash: &token.hash(),
                sealed_secrets: "sealed:v1:secrets",
            },
            now(),
        )
        .await
        .unwrap();
    assert_eq!(
        p.enrollment_id, enrollment_id,
        "the caller's id is the row's"
    );
    db.record_relay_key(&p.host_id, "sealed:v2:relay")
        .await
        .unwrap();
    db.record_tunnel(&p.host_id, "t-1", "spark-1.tunnel", "sealed:v1:tunnel")
        .await
        .unwrap();
    db.relay_ca_or_insert(&RelayCaRow {
        cert_pem: "CERT".into(),
        sealed_key: "sealed:v1:ca".into(),
        created_at: now(),
    })
    .await
    .unwrap();

    // Each column by its own name and its row's key; the version picks exactly.
    let v1 = |column| db.sealed_values(column, "sealed:v1:");
    assert_eq!(
        v1(SealedColumn::EnrollmentSecrets).await.unwrap(),
        [value(&enrollment_id, "sealed:v1:secrets")]
    );
    assert_eq!(
        v1(SealedColumn::TunnelToken).await.unwrap(),
        [value(&p.host_id, "sealed:v1:tunnel")]
    );
    assert_eq!(
        v1(SealedColumn::RelayCaKey).await.unwrap(),
        [value(RELAY_CA_ROW, "sealed:v1:ca")]
    );
    assert!(v1(SealedColumn::RelayWgKey).await.unwrap().is_empty());
    assert!(
        v1(SealedColumn::AgentToken).await.unwrap().is_empty(),
        "a null is no value"
    );
    assert_eq!(
        db.sealed_values(SealedColumn::RelayWgKey, "sealed:v2:")
            .await
            .unwrap(),
        [value(&p.host_id, "sealed:v2:relay")]
    );
    assert!(
        db.sealed_values(SealedColumn::TunnelToken, "SEALED:V1:")
            .await
            .unwrap()
            .is_empty(),
        "the prefix is matched exactly, case and all"
    );

    // Replaced only while the row holds what was read: a second pass, or one that read
    // before another writer, changes nothing.
    for (column, row, old) in [
        (
            SealedColumn::EnrollmentSecrets,
            enrollment_id.as_str(),
            "sealed:v1:secrets",
        ),
        (
            SealedColumn::TunnelToken,
            p.host_id.as_str(),
            "sealed:v1:tunnel",
        ),
        (SealedColumn::RelayCaKey, RELAY_CA_ROW, "sealed:v1:ca"),
    ] {
        let new = format!("sealed:v2:{}", column.name());
        assert_eq!(
            db.replace_sealed(column, row, old, &new).await.unwrap(),
            GuardedWrite::Written
        );
        assert_eq!(
            db.replace_sealed(column, row, old, "sealed:v2:late")
                .await
                .unwrap(),
            GuardedWrite::AlreadySet,
            "{}",
            column.name()
        );
        assert_eq!(
            db.sealed_values(column, "sealed:v2:").await.unwrap(),
            [value(row, &new)]
        );
        assert!(
            db.sealed_values(column, "sealed:v1:")
                .await
                .unwrap()
                .is_empty()
        );
    }
    assert_eq!(
        db.replace_sealed(
            SealedColumn::RelayWgKey,
            "no-such-host",
            "sealed:v2:relay",
            "x"
        )
        .await
        .unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(db.relay_ca().await.unwrap().unwrap().cert_pem, "CERT");

    // The pass's finish: none until marked, then the first mark kept.
    assert!(db.sealed_values_resealed_at().await.unwrap().is_none());
    let t = now();
    assert_eq!(
        db.mark_sealed_values_resealed(t).await.unwrap(),
        GuardedWrite::Written
    );
    assert_eq!(
        db.mark_sealed_values_resealed(t + Duration::hours(1))
            .await
            .unwrap(),
        GuardedWrite::AlreadySet
    );
    assert_eq!(db.sealed_values_resealed_at().await.unwrap(), Some(t));
}
