//! `byo keys sign` against a running control plane, with the real ssh-agent, ssh-add and
//! ssh-keygen: a missing or untrusted key fails cleanly and publishes nothing; the right
//! key, piped on standard input, publishes the list that was shown.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use byo_server::app::accounts;
use byo_server::config::PasswordHashing;
use byo_server::{AppState, Config};
use serde_json::{Value, json};

const EMAIL: &str = "root@example.com";
const PASSWORD: &str = "a long enough password";

fn tools_present() -> bool {
    byo_core::testing::have_tools(&["ssh-agent", "ssh-add", "ssh-keygen"])
}

fn keygen(dir: &std::path::Path, name: &str) -> (String, String) {
    let path = dir.join(name);
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(st.success());
    (
        std::fs::read_to_string(&path).unwrap(),
        std::fs::read_to_string(path.with_extension("pub")).unwrap(),
    )
}

fn run_sign(server: &str, stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_byo"))
        .args([
            "keys", "sign", "--yes", "--server", server, "--email", EMAIL,
        ])
        .env("BYO_PASSWORD", PASSWORD)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byo_keys_sign_shows_the_bytes_signs_through_an_agent_and_publishes() {
    if !tools_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (signing_private, signing_public) = keygen(dir.path(), "signing");
    let (stranger_private, _) = keygen(dir.path(), "stranger");
    let (_, login_public) = keygen(dir.path(), "login");

    let store =
        byo_db::Store::connect(&format!("sqlite://{}", dir.path().join("byo.db").display()))
            .await
            .unwrap();
    store.migrate().await.unwrap();
    let mut config = Config {
        metrics_listen: None,
        password_hashing: PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        ..Config::default()
    };
    config.operator_keys.signing_keys = vec![signing_public.trim().to_owned()];
    let state = AppState::new(store, config);
    accounts::create_superadmin(&state, EMAIL, PASSWORD)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(byo_server::serve(state, listener, std::future::pending()));

    let client = reqwest::Client::builder()
        .cookie_store(true)
        .build()
        .unwrap();
    let r = client
        .post(format!("{server}/api/auth/login"))
        .json(&json!({"email": EMAIL, "password": PASSWORD}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let login_key = login_public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let r = client
        .post(format!("{server}/api/admin/operator-keys/changes"))
        .json(&json!({"action": "add", "public_key": login_key, "label": "laptop"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let overview = |c: reqwest::Client| {
        let server = server.clone();
        async move {
            c.get(format!("{server}/api/admin/operator-keys"))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let fingerprint = overview(client.clone()).await["draft"]["keys"][0]["fingerprint"]
        .as_str()
        .unwrap()
        .to_owned();

    let server_for = server.clone();
    let sign = move |stdin: Vec<u8>| {
        let server = server_for.clone();
        async move {
            tokio::task::spawn_blocking(move || run_sign(&server, &stdin))
                .await
                .unwrap()
        }
    };

    // No key on standard input: a clean failure, no fallback, nothing published.
    let out = sign(Vec::new()).await;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no private key on standard input"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(overview(client.clone()).await["published"].is_null());

    // A key hosts do not trust: refused before anything is signed or uploaded.
    let out = sign(stranger_private.into_bytes()).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not the signing key hosts trust"));
    assert!(overview(client.clone()).await["published"].is_null());

    // The signing key: the list is shown from its bytes, signed and published.
    let out = sign(signing_private.into_bytes()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&fingerprint) && stdout.contains("machine laptop"),
        "{stdout}"
    );
    // The operator is named by their email, beside the account the list binds.
    assert!(stdout.contains(&format!("operator {EMAIL} (")), "{stdout}");
    assert!(stdout.contains("published version 1"), "{stdout}");
    let o = overview(client).await;
    assert_eq!(o["published"]["version"], 1);
    assert!(o["draft"].is_null());
    // No agent is left behind, and nothing of the key was written where we ran.
    let agents = Command::new("sh")
        .args(["-c", "ls /tmp | grep -c '^byo-sign-' || true"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&agents.stdout).trim(),
        "0",
        "the throwaway agent's directory is gone"
    );
}
