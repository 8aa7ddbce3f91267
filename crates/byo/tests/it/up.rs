//! `byo up` as a person runs it: it prints how to sign in, Ctrl-C stops it cleanly, and
//! running it again finds the same state.

use crate::support;

use serde_json::json;
use support::ByoUp;

fn start(data_dir: &std::path::Path) -> ByoUp {
    ByoUp::on_loopback(data_dir, data_dir)
}

fn interrupt(mut r: ByoUp) {
    let exit = r.interrupt().expect("byo up did not stop on Ctrl-C");
    assert!(exit.success(), "byo up exits cleanly on Ctrl-C: {exit}");
}

async fn login(url: &str, email: &str, password: &str) -> reqwest::StatusCode {
    reqwest::Client::new()
        .post(format!("{url}/api/auth/login"))
        .json(&json!({"email": email, "password": password}))
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn byo_up_prints_credentials_stops_on_ctrl_c_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let first = start(dir.path());
    assert!(first.url.starts_with("http://localhost:"), "{}", first.url);
    let health: serde_json::Value = reqwest::get(format!("{}/healthz", first.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["database"], "sqlite");
    assert_eq!(login(&first.url, &first.email, &first.password).await, 200);
    let signup = reqwest::Client::new()
        .post(format!("{}/api/auth/signup", first.url))
        .json(&json!({"email": "ana@example.com", "password": "a long enough password"}))
        .send()
        .await
        .unwrap();
    assert_eq!(signup.status(), 202);
    let (email, password) = (first.email.clone(), first.password.clone());
    let signing_key = std::fs::read(dir.path().join("operator-signing-key")).unwrap();
    interrupt(first);

    let second = start(dir.path());
    assert_eq!(
        (&second.email, &second.password),
        (&email, &password),
        "the same admin"
    );
    assert_eq!(
        login(&second.url, "ana@example.com", "a long enough password").await,
        200
    );
    assert_eq!(login(&second.url, &email, &password).await, 200);
    assert_eq!(
        std::fs::read(dir.path().join("operator-signing-key")).unwrap(),
        signing_key,
        "the same keys"
    );
    for secret in ["admin-credentials", "operator-key", "operator-signing-key"] {
        let mode = std::fs::metadata(dir.path().join(secret)).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o077,
            0,
            "{secret}"
        );
    }
    interrupt(second);

    // Ready out of the box: list v1, signed at the first start, holds the admin's operator
    // key; the second start published nothing more.
    let store =
        byo_db::Store::connect(&format!("sqlite://{}", dir.path().join("byo.db").display()))
            .await
            .unwrap();
    let published = store.published_key_list().await.unwrap().expect("list v1");
    assert_eq!(published.version, 1);
    let newest = store.newest_key_list().await.unwrap().unwrap();
    assert_eq!(newest.version, 1, "no draft or second version");
    let public = std::fs::read_to_string(dir.path().join("operator-key.pub")).unwrap();
    let key = public.split_whitespace().nth(1).unwrap();
    assert!(published.body.contains(key), "{}", published.body);
    store.close().await;
}
