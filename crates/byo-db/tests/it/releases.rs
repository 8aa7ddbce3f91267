//! Releases and fleet upgrades in the store (issue #14, 1 and 5; migration 0018), on both
//! backends: what a publish writes and what the installer's path reads, the hosts a fleet
//! upgrade covers with their facts, one open run at a time, and the guarded moves of a run
//! and its hosts.

use byo_db::releases::{NewFleetHost, NewRelease};
use byo_db::testing::{self, TestDb};
use byo_db::users::NewUser;
use byo_db::vms::NewVm;
use byo_db::{DbError, Store};
use byo_wire::states::{FleetHostState as H, FleetRunState as R};
use chrono::{DateTime, Duration, Utc};

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_900_000_000, 0).unwrap()
}

async fn user(store: &Store) -> String {
    store
        .create_user(
            NewUser {
                email: "root@example.com",
                password_hash: "$argon2id$x",
                display_name: "Root",
            },
            t0(),
        )
        .await
        .unwrap()
        .sub
}

fn sha(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn new_release<'a>(arch: &'a str, sha: &'a str, by: &'a str) -> NewRelease<'a> {
    NewRelease {
        arch,
        version: "byo-agent 0.1.0",
        sha256: sha,
        signature: "-----BEGIN SSH SIGNATURE-----",
        size_bytes: 42,
        published_by: by,
    }
}

async fn j_releases_are_kept_once_and_the_newest_of_an_arch_is_served(db: TestDb) {
    let by = user(&db).await;
    assert!(db.newest_release("x86_64").await.unwrap().is_none());
    let (a, b, c) = (sha(1), sha(2), sha(3));
    let first = db
        .insert_release(new_release("x86_64", &a, &by), t0())
        .await
        .unwrap();
    assert_eq!(first.build, a[..12]);
    assert_eq!((first.arch.as_str(), first.size_bytes), ("x86_64", 42));
    assert_eq!(first.published_at, t0());
    db.insert_release(new_release("aarch64", &a, &by), t0() + Duration::seconds(1))
        .await
        .unwrap();
    db.insert_release(new_release("x86_64", &b, &by), t0() + Duration::seconds(2))
        .await
        .unwrap();
    // The same bytes for the same arch again: refused by the schema.
    let again = db
        .insert_release(new_release("x86_64", &a, &by), t0() + Duration::seconds(3))
        .await
        .unwrap_err();
    assert!(matches!(again, DbError::Conflict(_)), "{again:?}");
    assert_eq!(
        db.newest_release("x86_64").await.unwrap().unwrap().sha256,
        b
    );
    assert_eq!(
        db.newest_release("aarch64").await.unwrap().unwrap().sha256,
        a
    );
    assert!(db.newest_release("riscv64").await.unwrap().is_none());
    let all: Vec<_> = db
        .releases(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.arch, r.sha256))
        .collect();
    assert_eq!(
        all,
        [
            ("x86_64".to_owned(), b.clone()),
            ("aarch64".to_owned(), a.clone()),
            ("x86_64".to_owned(), a.clone())
        ]
    );
    assert_eq!(db.releases(1).await.unwrap().len(), 1);
    let of_a: Vec<_> = db
        .releases_of_build(&a[..12])
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.arch)
        .collect();
    assert_eq!(of_a, ["aarch64", "x86_64"]);
    assert!(db.releases_of_build(&c[..12]).await.unwrap().is_empty());
    // The schema holds the build to the digest's prefix, whoever writes.
    let refused = db
        .execute_unchecked(&format!(
            "insert into agent_releases (id, arch, version, sha256, build, signature, size_bytes, published_by, published_at)
             values ('r', 'x86_64', 'v', '{c}', 'ffffffffffff', 's', 1, '{by}', '2030-01-01T00:00:00Z')"
        ))
        .await
        .unwrap_err();
    assert!(
        refused.is_constraint("agent_releases_build_prefix"),
        "{refused:?}"
    );
}

async fn j9_the_fleet_covers_prepared_hosts_with_their_facts(db: TestDb) {
    let by = user(&db).await;
    let now = t0();
    let (a, _) = testing::fleet_host(&db, &by, "spark-a", "aarch64", now).await;
    let (b, tb) = testing::fleet_host(&db, &by, "spark-b", "x86_64", now).await;
    let (c, _) = testing::fleet_host(&db, &by, "spark-c", "x86_64", now).await;
    let (d, _) = testing::fleet_host(&db, &by, "spark-d", "x86_64", now).await;
    let (e, _) = testing::fleet_host(&db, &by, "spark-e", "x86_64", now).await;
    db.depool_host(&c, "maintenance", &by, now).await.unwrap();
    let vm = db
        .create_vm(
            NewVm {
                user_sub: &by,
                host_id: Some(&d),
                name: "box",
                gpu_type: "spark-1",
                ssh_hostname: None,
            },
            now,
        )
        .await
        .unwrap();
    db.execute_unchecked(&format!(
        "update hosts set retired_at = '2030-01-01T00:00:00Z', active = false where id = '{e}'"
    ))
    .await
    .unwrap();
    let mut beat = testing::healthy_beat();
    beat.agent_version = "0.1.0 (0123456789ab)".into();
    db.record_heartbeat(
        &byo_core::tokens::SecretToken::parse(byo_core::tokens::TokenKind::Host, &tb)
            .unwrap()
            .hash(),
        &beat,
        now,
    )
    .await
    .unwrap();
    // A host that never finished preparing is not covered.
    db.insert_host(
        byo_db::hosts::NewHost {
            slug: "spark-0",
            owner_sub: &by,
            profile_id: "gb10-spark-1",
            gpu_type: "spark-1",
        },
        now,
    )
    .await
    .unwrap();
    let seen: Vec<_> = db
        .fleet_candidates()
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.slug, c.arch, c.depooled, c.mid_create, c.agent_version))
        .collect();
    let v = |s: &str| Some(s.to_owned());
    assert_eq!(
        seen,
        [
            ("spark-a".into(), v("aarch64"), false, false, v("0.1.0")),
            (
                "spark-b".into(),
                v("x86_64"),
                false,
                false,
                v("0.1.0 (0123456789ab)")
            ),
            ("spark-c".into(), v("x86_64"), true, false, v("0.1.0")),
            ("spark-d".into(), v("x86_64"), false, true, v("0.1.0")),
        ]
    );
    assert_eq!(a.len(), b.len());
    // A running instance is not mid-create; its delete requested and unconfirmed is.
    db.execute_unchecked(&format!(
        "update vms set status = 'running' where id = '{}'",
        vm.id
    ))
    .await
    .unwrap();
    let mid = |db: Store| async move {
        db.fleet_candidates()
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.slug == "spark-d")
            .unwrap()
            .mid_create
    };
    assert!(!mid(db.store.clone()).await);
    db.execute_unchecked(&format!(
        "update vms set delete_requested_at = '2030-01-01T00:00:00Z' where id = '{}'",
        vm.id
    ))
    .await
    .unwrap();
    assert!(mid(db.store.clone()).await);
    db.execute_unchecked(&format!(
        "update vms set deleted_at = '2030-01-01T00:00:01Z', status = 'deleted' where id = '{}'",
        vm.id
    ))
    .await
    .unwrap();
    assert!(!mid(db.store.clone()).await);
    // A revoke in progress is out of the pool too; a re-activated host is back in it.
    db.execute_unchecked(&format!("update hosts set active = true where id = '{c}'"))
        .await
        .unwrap();
    let depooled = |db: Store, slug: &'static str| async move {
        db.fleet_candidates()
            .await
            .unwrap()
            .into_iter()
            .find(|c| c.slug == slug)
            .unwrap()
            .depooled
    };
    assert!(!depooled(db.store.clone(), "spark-c").await);
    db.execute_unchecked(&format!(
        "update hosts set active = false, revoke_requested_at = '2030-01-01T00:00:00Z' where id = '{a}'"
    ))
    .await
    .unwrap();
    assert!(depooled(db.store.clone(), "spark-a").await);
}

async fn j9_one_run_is_open_and_its_moves_are_guarded(db: TestDb) {
    let by = user(&db).await;
    let now = t0();
    let (a, _) = testing::fleet_host(&db, &by, "spark-a", "x86_64", now).await;
    let (b, _) = testing::fleet_host(&db, &by, "spark-b", "x86_64", now).await;
    let hosts = vec![
        NewFleetHost {
            host_id: b.clone(),
            wave: 0,
            state: H::Waiting,
            reason: None,
        },
        NewFleetHost {
            host_id: a.clone(),
            wave: -1,
            state: H::Skipped,
            reason: Some("de-pooled".into()),
        },
    ];
    let run = db
        .open_fleet_run("0123456789ab", (1, 2, 300), &hosts, &by, now)
        .await
        .unwrap();
    assert_eq!(
        (run.state, run.canary, run.growth, run.wait_secs),
        (R::Running, 1, 2, 300)
    );
    assert_eq!(
        (run.started_at, run.updated_at, run.closed_at),
        (now, now, None)
    );
    let rows = db.fleet_run_hosts(&run.id).await.unwrap();
    let seen: Vec<_> = rows
        .iter()
        .map(|h| {
            (
                h.slug.as_str(),
                h.position,
                h.wave,
                h.state,
                h.reason.as_deref(),
                h.judged_at,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("spark-b", 0, 0, H::Waiting, None, None),
            ("spark-a", 1, -1, H::Skipped, Some("de-pooled"), Some(now)),
        ]
    );
    // A second open run: refused by the schema, nothing written.
    let second = db
        .open_fleet_run("0123456789ab", (1, 2, 300), &hosts, &by, now)
        .await
        .unwrap_err();
    assert!(
        second.is_constraint("open_marker") || second.is_constraint("fleet_upgrades_one_open"),
        "{second:?}"
    );
    assert_eq!(db.fleet_runs(10).await.unwrap().len(), 1);
    assert_eq!(db.open_fleet_run_row().await.unwrap().unwrap().id, run.id);

    // Host moves happen only from the state named.
    let later = now + Duration::seconds(5);
    assert!(
        !db.move_fleet_host(&run.id, &b, H::Upgrading, H::Failed, Some("x"), later)
            .await
            .unwrap()
    );
    assert!(
        db.move_fleet_host(&run.id, &b, H::Waiting, H::Upgrading, None, later)
            .await
            .unwrap()
    );
    let h = &db.fleet_run_hosts(&run.id).await.unwrap()[0];
    assert_eq!(
        (h.state, h.started_at, h.judged_at),
        (H::Upgrading, Some(later), None)
    );
    let judged = later + Duration::seconds(5);
    assert!(
        db.move_fleet_host(&run.id, &b, H::Upgrading, H::Failed, Some("why"), judged)
            .await
            .unwrap()
    );
    let h = &db.fleet_run_hosts(&run.id).await.unwrap()[0];
    assert_eq!(
        (h.state, h.reason.as_deref(), h.started_at, h.judged_at),
        (H::Failed, Some("why"), Some(later), Some(judged))
    );
    assert!(
        db.move_fleet_host(&run.id, &b, H::Failed, H::Waiting, None, judged)
            .await
            .unwrap()
    );
    let h = &db.fleet_run_hosts(&run.id).await.unwrap()[0];
    assert_eq!(
        (h.state, h.reason.as_deref(), h.judged_at),
        (H::Waiting, None, None)
    );
    // The schema: upgrading needs its start.
    let refused = db
        .execute_unchecked(&format!(
            "update fleet_upgrade_hosts set state = 'upgrading', started_at = null where host_id = '{b}'"
        ))
        .await
        .unwrap_err();
    assert!(
        refused.is_constraint("fleet_upgrade_hosts_upgrading_started"),
        "{refused:?}"
    );

    // Run moves: halted with its reason, running again, closed once.
    assert!(
        !db.move_fleet_run(&run.id, R::Halted, R::Running, None, later)
            .await
            .unwrap()
    );
    assert!(
        db.move_fleet_run(&run.id, R::Running, R::Halted, Some("spark-b: why"), later)
            .await
            .unwrap()
    );
    let r = db.fleet_run(&run.id).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.halt_reason.as_deref(), r.updated_at),
        (R::Halted, Some("spark-b: why"), later)
    );
    assert!(
        db.move_fleet_run(&run.id, R::Halted, R::Running, None, judged)
            .await
            .unwrap()
    );
    let r = db.fleet_run(&run.id).await.unwrap().unwrap();
    assert_eq!(
        (r.state, r.halt_reason.as_deref()),
        (R::Running, Some("spark-b: why")),
        "the last halt's reason is kept"
    );
    assert!(
        db.move_fleet_run(&run.id, R::Running, R::Closed, None, judged)
            .await
            .unwrap()
    );
    let r = db.fleet_run(&run.id).await.unwrap().unwrap();
    assert_eq!((r.state, r.closed_at), (R::Closed, Some(judged)));
    assert!(db.open_fleet_run_row().await.unwrap().is_none());
    assert!(matches!(
        db.move_fleet_run(&run.id, R::Closed, R::Running, None, judged)
            .await,
        Err(DbError::Refused(_))
    ));
    // A closed run's hosts do not move.
    assert!(
        !db.move_fleet_host(&run.id, &b, H::Waiting, H::Upgrading, None, judged)
            .await
            .unwrap()
    );
    assert!(db.fleet_run("nope").await.unwrap().is_none());
    // Closed: another may open; the newest is listed first.
    let next = db
        .open_fleet_run("0123456789ab", (2, 3, 60), &[], &by, judged)
        .await
        .unwrap();
    let runs: Vec<_> = db
        .fleet_runs(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(runs, [next.id.clone(), run.id.clone()]);
    assert_eq!(db.fleet_runs(1).await.unwrap().len(), 1);
}

on_both!(
    j_releases_are_kept_once_and_the_newest_of_an_arch_is_served,
    j9_the_fleet_covers_prepared_hosts_with_their_facts,
    j9_one_run_is_open_and_its_moves_are_guarded,
);
