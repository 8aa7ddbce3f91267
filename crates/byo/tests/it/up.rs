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

    // The banner says the list as it stands (issue #42, 8): after the admin adds a key and
    // signs v2 with `byo keys sign` as the banner's line has it, a restart says v2.
    if !byo_core::testing::have_tools(&["ssh-agent", "ssh-add", "ssh-keygen"]) {
        return;
    }
    let third = start(dir.path());
    assert!(
        third.printed.contains("list v1 is published"),
        "{}",
        third.printed
    );
    let client = reqwest::Client::builder()
        .cookie_store(true)
        .build()
        .unwrap();
    let r = client
        .post(format!("{}/api/auth/login", third.url))
        .json(&json!({"email": email, "password": password}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let laptop = dir.path().join("laptop");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "laptop", "-f"])
        .arg(&laptop)
        .status()
        .unwrap();
    assert!(made.success());
    let laptop = std::fs::read_to_string(laptop.with_extension("pub")).unwrap();
    let laptop: Vec<&str> = laptop.split_whitespace().take(2).collect();
    let r = client
        .post(format!("{}/api/admin/operator-keys/changes", third.url))
        .json(&json!({"action": "add", "public_key": laptop.join(" "), "label": "laptop"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let mut sign = std::process::Command::new(env!("CARGO_BIN_EXE_byo"))
        .args([
            "keys", "sign", "--yes", "--server", &third.url, "--email", &email,
        ])
        .env("BYO_PASSWORD", &password)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut sign.stdin.take().unwrap(), &signing_key).unwrap();
    let signed = sign.wait_with_output().unwrap();
    assert!(
        signed.status.success(),
        "{}{}",
        String::from_utf8_lossy(&signed.stdout),
        String::from_utf8_lossy(&signed.stderr)
    );
    interrupt(third);
    let fourth = start(dir.path());
    assert!(
        fourth.printed.contains("list v2 is published"),
        "{}",
        fourth.printed
    );
    interrupt(fourth);
}
