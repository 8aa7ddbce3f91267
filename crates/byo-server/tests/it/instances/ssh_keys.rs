//! The customer's SSH keys.

use crate::instances::world::*;
use crate::with_world;

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

/// A 1024-bit RSA key (`ssh-keygen -t rsa -b 1024`): below `MIN_RSA_BITS`.
const RSA_1024: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQCmXGDevye359J5y+3Yk5G80jPUw69Y1O4N0vH55fQZyPvueE9TyFj9oUCVvMFr3prh7BUBYEE4YqcySYqwG2I09RSsjp6V72JRdsITwjV6b7tWhyz/xOITQy+FFyq3krySn05L6Nl9bItNmxRX/52RylXs3gC4P9CePrlCAo4Bjw==";
/// A 2048-bit RSA key: exactly `MIN_RSA_BITS`, accepted.
const RSA_2048: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQCygbvsvO85UibAPzaoasaBwtllGa6rBBXkE/gYcjRCZxI58Rmjbw53u4cXpZuCUwdTAH2QlDyl4FF9A9s6mG9vUAJOEptTjv9yhj8109cyETIOgoznYzJlFrewYCmW2/klkV+UziAI24C6ftYmbZSTxVs3pRZLj4rfhcxX1Tw+6k37CaURZzK3+0edWDNCa3TK2gSDlaQB9RrEyLQgs5ulnHIxWOEsWKyZVvgDERmk6WxGLO120Q1nY5Mm3OpDRZR9qf+OFZZONJlm/NohWV0B5S1f+bE4uamyotOFEzrdIJO4BoihfQleYP5a23CyipJ0qaVyhOIMBsos9BKdZ5FF";

/// The key rules at their edges: RSA below 2048 bits refused and at 2048 taken; a control
/// character anywhere in the line (an escape sequence in the comment, a tab, a bell)
/// refused; each refusal writes nothing.
async fn ssh_keys_refuse_short_rsa_and_control_characters(w: World) {
    let key = public_key_line();
    let before = w.db().ssh_keys_of(&w.customer.sub).await.unwrap().len();
    for (line, error, says) in [
        (
            RSA_1024.to_owned(),
            "invalid_public_key",
            "at least 2048 bits",
        ),
        // Nothing but blanks is refused before parsing.
        (
            " \n ".to_owned(),
            "invalid_public_key",
            "paste one OpenSSH public key line",
        ),
        (
            format!("{key} me\u{1b}[2J@laptop"),
            "invalid_public_key",
            "control characters",
        ),
        (
            format!("{key}\tme@laptop"),
            "invalid_public_key",
            "control characters",
        ),
        (
            format!("{key} \u{7}"),
            "invalid_public_key",
            "control characters",
        ),
        (
            format!("{key}\rssh-ed25519 AAAA"),
            "invalid_public_key",
            "control characters",
        ),
    ] {
        let r = w
            .customer
            .post("/api/ssh-keys", json!({"name": "k", "public_key": line}))
            .await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some(error)),
            "{line:?}: {}",
            r.text()
        );
        assert!(
            r.json()["message"].as_str().unwrap().contains(says),
            "{}",
            r.text()
        );
    }
    let r = w
        .customer
        .post(
            "/api/ssh-keys",
            json!({"name": "k", "public_key": "x", "extra": 1}),
        )
        .await;
    assert!(r.status.is_client_error());
    assert_eq!(
        w.db().ssh_keys_of(&w.customer.sub).await.unwrap().len(),
        before,
        "refusals kept nothing"
    );
    // A name with a control character is refused too.
    let r = w
        .customer
        .post(
            "/api/ssh-keys",
            json!({"name": "lap\u{1b}top", "public_key": key}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    // At the bound, taken.
    let r = w
        .customer
        .post(
            "/api/ssh-keys",
            json!({"name": "rsa", "public_key": RSA_2048}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    assert_eq!(r.json()["public_key"], RSA_2048);
}

with_world!(
    ssh_keys_are_checked_kept_once_and_private_to_their_user,
    ssh_keys_refuse_short_rsa_and_control_characters,
);
