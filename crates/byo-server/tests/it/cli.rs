//! The `byo-server` command as an operator runs it.

use std::io::Write;
use std::process::{Command, Stdio};

fn byo_server(db: &std::path::Path, args: &[&str], stdin: &str) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_byo-server"))
        .args(args)
        .env("BYO_DATABASE_URL", format!("sqlite://{}", db.display()))
        .env("BYO_PASSWORD_HASHING__MEMORY_KIB", "256")
        .env("BYO_PASSWORD_HASHING__ITERATIONS", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[tokio::test]
async fn create_superadmin_makes_a_user_who_can_sign_in_and_refuses_a_weak_password() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("byo.db");
    let weak = byo_server(
        &db,
        &["create-superadmin", "--email", "root@example.com"],
        "short\n",
    );
    assert!(!weak.status.success());
    assert!(String::from_utf8_lossy(&weak.stderr).contains("at least 12 characters"));

    let out = byo_server(
        &db,
        &["create-superadmin", "--email", "root@example.com"],
        "a long enough password\n",
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("created superadmin root@example.com"));

    let store = byo_db::Store::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let user = store
        .user_by_email("root@example.com")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.roles_of(&user.sub).await.unwrap(),
        vec![byo_wire::Role::Superadmin]
    );
    assert!(
        user.password_hash.starts_with("$argon2id$") && !user.password_hash.contains("long enough")
    );

    let again = byo_server(
        &db,
        &["create-superadmin", "--email", "ROOT@example.com"],
        "a long enough password\n",
    );
    assert!(
        !again.status.success(),
        "the email is taken, whatever its case"
    );
}

#[test]
fn the_openapi_command_prints_the_document_and_help_teaches() {
    let dir = tempfile::tempdir().unwrap();
    let out = byo_server(&dir.path().join("x.db"), &["openapi"], "");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["paths"]["/api/enroll"].is_object());
    let help = byo_server(&dir.path().join("x.db"), &["--help"], "");
    let text = String::from_utf8_lossy(&help.stdout);
    for word in [
        "serve",
        "migrate",
        "create-superadmin",
        "openapi",
        "BYO_DATABASE_URL",
    ] {
        assert!(text.contains(word), "--help mentions {word}: {text}");
    }
}
