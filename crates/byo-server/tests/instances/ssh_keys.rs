//! The customer's SSH keys.

use crate::with_world;
use crate::world::*;

async fn ssh_keys_are_checked_kept_once_and_private_to_their_user(w: World) {
    let key = public_key_line();
    async fn add(user: &User, body: Value) -> Reply {
        user.post("/api/ssh-keys", body).await
    }
    let r = add(
        &w.customer,
        json!({"name": "laptop", "public_key": format!("{key} me@laptop")}),
    )
    .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let k = r.json();
    assert!(k["fingerprint"].as_str().unwrap().starts_with("SHA256:"));
    let id = k["id"].as_str().unwrap().to_owned();

    // The same key again (another comment, another name) is the same key.
    let r = add(
        &w.customer,
        json!({"name": "again", "public_key": format!("{key} other-comment")}),
    )
    .await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (StatusCode::CONFLICT, Some("duplicate_key"))
    );
    // Not a key, options in front, two keys, no name: refused.
    for body in [
        json!({"name": "x", "public_key": "ssh-ed25519 AAAAnotbase64"}),
        json!({"name": "x", "public_key": format!("command=\"/bin/sh\" {}", public_key_line())}),
        json!({"name": "x", "public_key": format!("{}\n{}", public_key_line(), public_key_line())}),
        json!({"name": " ", "public_key": public_key_line()}),
    ] {
        let r = add(&w.customer, body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
    }
    let mine = w.db().ssh_keys_of(&w.customer.sub).await.unwrap();
    assert_eq!(mine.len(), 1, "refusals kept nothing");

    // Another user may hold the same key; each sees only their own.
    assert_eq!(
        add(&w.other, json!({"name": "shared", "public_key": key}))
            .await
            .status,
        StatusCode::CREATED
    );
    let theirs = w.other.get("/api/ssh-keys").await.json();
    assert_eq!(theirs.as_array().unwrap().len(), 1);
    assert_ne!(theirs[0]["id"], id);
    // Deleting someone else's key is a 404, and it stays.
    let r = w.other.delete(&format!("/api/ssh-keys/{id}")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(w.db().ssh_keys_of(&w.customer.sub).await.unwrap().len(), 1);
    let r = w.customer.delete(&format!("/api/ssh-keys/{id}")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(
        w.db()
            .ssh_keys_of(&w.customer.sub)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(w.db().ssh_keys_of(&w.other.sub).await.unwrap().len(), 1);
}

with_world!(ssh_keys_are_checked_kept_once_and_private_to_their_user,);
