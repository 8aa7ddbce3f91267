//! API tokens in the store (issue #43; migration 0025), on both backends: a live name once
//! per person, at most fifty live tokens, found by hash whatever their state, revoked only
//! by their person, their last use noted at most once a minute from one address, and the
//! audit rows a token's request writes naming it.

use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::api_tokens::{LAST_USE_GRANULARITY, MAX_LIVE_TOKENS, NewApiToken};
use byo_db::testing::TestDb;
use byo_db::users::NewUser;
use byo_db::{DbError, Store};
use byo_wire::states::ApiScope;
use chrono::{DateTime, Duration, Utc};

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_900_000_000, 0).unwrap()
}

async fn user(store: &Store, email: &str) -> String {
    store
        .create_user(
            NewUser {
                email,
                password_hash: "$argon2id$x",
                display_name: "",
            },
            t0(),
        )
        .await
        .unwrap()
        .sub
}

async fn make(
    store: &Store,
    sub: &str,
    name: &str,
    at: DateTime<Utc>,
) -> Result<(SecretToken, String), DbError> {
    let secret = SecretToken::generate(TokenKind::Api);
    let row = store
        .insert_api_token(
            NewApiToken {
                user_sub: sub,
                name,
                scope: ApiScope::Instances,
                token_hash: &secret.hash(),
                expires_at: at + Duration::days(90),
            },
            at,
        )
        .await?;
    Ok((secret, row.id))
}

async fn names_and_limits(db: TestDb) {
    let store = &db.store;
    let ann = user(store, "ann@example.com").await;
    let bob = user(store, "bob@example.com").await;
    let (_, first) = make(store, &ann, "laptop", t0()).await.unwrap();
    // The same name: refused for ann while hers is live, free for bob.
    let again = make(store, &ann, "laptop", t0()).await.unwrap_err();
    assert!(
        matches!(&again, DbError::Conflict(c) if c == "api_tokens_live_name"),
        "{again:?}"
    );
    make(store, &bob, "laptop", t0()).await.unwrap();
    // Another person's token cannot be revoked by her; her own can, once.
    assert_eq!(
        store.revoke_api_token(&bob, &first, t0()).await.unwrap(),
        None
    );
    let revoked = store
        .revoke_api_token(&ann, &first, t0())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked.revoked_at, Some(t0()));
    assert_eq!(
        store.revoke_api_token(&ann, &first, t0()).await.unwrap(),
        None
    );
    // The name is free again, and a revoked token leaves the list.
    make(store, &ann, "laptop", t0() + Duration::seconds(1))
        .await
        .unwrap();
    let listed = store.api_tokens_of(&ann).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_ne!(listed[0].id, first);

    // Newest first; fifty live at most, revoked ones not counted.
    for i in 1..MAX_LIVE_TOKENS {
        make(
            store,
            &ann,
            &format!("t{i}"),
            t0() + Duration::seconds(1 + i),
        )
        .await
        .unwrap();
    }
    let listed = store.api_tokens_of(&ann).await.unwrap();
    assert_eq!(listed.len() as i64, MAX_LIVE_TOKENS);
    assert_eq!(listed[0].name, format!("t{}", MAX_LIVE_TOKENS - 1));
    let over = make(store, &ann, "one-more", t0() + Duration::hours(1))
        .await
        .unwrap_err();
    assert!(
        matches!(&over, DbError::Conflict(c) if c == "api_tokens_too_many"),
        "{over:?}"
    );
    assert_eq!(
        store.api_tokens_of(&ann).await.unwrap().len() as i64,
        MAX_LIVE_TOKENS
    );
    let oldest = listed.last().unwrap().id.clone();
    store
        .revoke_api_token(&ann, &oldest, t0())
        .await
        .unwrap()
        .unwrap();
    make(store, &ann, "one-more", t0() + Duration::hours(1))
        .await
        .unwrap();
}

async fn found_by_hash_whatever_its_state(db: TestDb) {
    let store = &db.store;
    let ann = user(store, "ann@example.com").await;
    let (secret, id) = make(store, &ann, "ci", t0()).await.unwrap();
    let found = store
        .api_token_by_hash(&secret.hash())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (found.token.id.as_str(), found.user.sub.as_str()),
        (id.as_str(), ann.as_str())
    );
    assert_eq!(found.token.scope, ApiScope::Instances);
    assert_eq!(found.token.expires_at, t0() + Duration::days(90));
    store.revoke_api_token(&ann, &id, t0()).await.unwrap();
    let found = store
        .api_token_by_hash(&secret.hash())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        found.token.revoked_at,
        Some(t0()),
        "a revoked token is still found, to say so"
    );
    let stranger = SecretToken::generate(TokenKind::Api);
    assert!(
        store
            .api_token_by_hash(&stranger.hash())
            .await
            .unwrap()
            .is_none()
    );
}

async fn last_use_is_noted_once_a_minute_from_one_place(db: TestDb) {
    let store = &db.store;
    let ann = user(store, "ann@example.com").await;
    let (_, id) = make(store, &ann, "poller", t0()).await.unwrap();
    let last = |store: &Store| {
        let ann = ann.clone();
        let store = store.clone();
        async move {
            let row = store.api_tokens_of(&ann).await.unwrap().remove(0);
            (row.last_used_at, row.last_used_from)
        }
    };
    assert!(store.touch_api_token(&id, t0(), "192.0.2.1").await.unwrap());
    assert_eq!(last(store).await, (Some(t0()), Some("192.0.2.1".into())));
    let soon = t0() + LAST_USE_GRANULARITY - Duration::seconds(1);
    assert!(!store.touch_api_token(&id, soon, "192.0.2.1").await.unwrap());
    assert_eq!(last(store).await.0, Some(t0()));
    // From elsewhere: at once.
    assert!(
        store
            .touch_api_token(&id, soon, "198.51.100.9")
            .await
            .unwrap()
    );
    assert_eq!(last(store).await, (Some(soon), Some("198.51.100.9".into())));
    let later = soon + LAST_USE_GRANULARITY;
    assert!(
        store
            .touch_api_token(&id, later, "198.51.100.9")
            .await
            .unwrap()
    );
    assert_eq!(last(store).await.0, Some(later));
}

async fn audit_rows_name_the_token_they_were_written_through(db: TestDb) {
    let store = &db.store;
    let ann = user(store, "ann@example.com").await;
    store
        .audit(Some(&ann), "by.session", None, serde_json::json!({}), t0())
        .await
        .unwrap();
    byo_db::audit::VIA_TOKEN
        .scope(
            "ci-deploy".to_owned(),
            store.audit(
                Some(&ann),
                "by.token",
                None,
                serde_json::json!({}),
                t0() + Duration::seconds(1),
            ),
        )
        .await
        .unwrap();
    let log = store.audit_log(10).await.unwrap();
    let via = |action: &str| {
        log.iter()
            .find(|a| a.action == action)
            .unwrap()
            .via_token
            .clone()
    };
    assert_eq!(via("by.token").as_deref(), Some("ci-deploy"));
    assert_eq!(via("by.session"), None);
}

on_both!(
    names_and_limits,
    found_by_hash_whatever_its_state,
    last_use_is_noted_once_a_minute_from_one_place,
    audit_rows_name_the_token_they_were_written_through,
);
