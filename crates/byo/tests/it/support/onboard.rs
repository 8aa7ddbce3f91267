//! What the real-host onboarding tests share (`installer.rs`, `uninstall.rs`): a real server
//! on the test bridge with its operator-key list published, users, enrolment tokens, and the
//! one-liner run in a host container as an owner runs it. Included with
//! `#[path = "support/onboard.rs"] mod onboard;` beside `mod host_container;` and `mod support;`.
#![allow(dead_code)]

use std::path::PathBuf;

use byo_server::auth::CurrentUser;
use byo_server::clock::Clock;
use byo_server::{AppState, Config};
use byo_wire::Role;
use byo_wire::enroll::ProvisionRequest;

use crate::host_container::{HostContainer, bridge_gateway};

/// Serves `state`'s server on the bridge; `public_url` (what install.sh calls back) is its
/// own address unless given.
pub async fn serve(
    store: &byo_db::Store,
    release_dir: PathBuf,
    public_url: Option<String>,
    clock: &Clock,
) -> (String, AppState) {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let base = format!(
        "http://{}:{}",
        bridge_gateway(),
        listener.local_addr().unwrap().port()
    );
    let mut config = Config {
        metrics_listen: None,
        public_url: public_url.unwrap_or_else(|| base.clone()),
        cookie_secure: false,
        password_hashing: byo_server::config::PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        secret_key: Some(byo_server::seal::Sealer::generate_hex().into()),
        release_dir: Some(release_dir),
        release_key: Some(crate::support::release_public()),
        ..Config::default()
    };
    config.operator_keys.signing_keys = vec![signing_key().public_key().to_openssh().unwrap()];
    let state = AppState::new(store.clone(), config).with_clock(clock.clone());
    tokio::spawn(byo_server::serve(
        state.clone(),
        listener,
        std::future::pending(),
    ));
    (base, state)
}

/// The key this installation's operator-key lists are signed with.
pub fn signing_key() -> &'static ssh_key::PrivateKey {
    static KEY: std::sync::OnceLock<ssh_key::PrivateKey> = std::sync::OnceLock::new();
    KEY.get_or_init(byo_core::keylist_testing::private_key)
}

/// An operator-key list through the production rules (a change adding a new key, then the
/// signed publish), issued at the server's clock: host-provision hands out no one-liner
/// before a list is published.
pub async fn publish_operator_keys(state: &AppState, staff: &CurrentUser) {
    use byo_server::app::operator_keys;
    use byo_wire::api::{KeyChangeRequest, SignatureUpload};
    let op = byo_server::auth::Operator(staff.clone());
    let draft = operator_keys::change_keys(
        state,
        &op,
        KeyChangeRequest::Add {
            public_key: byo_core::keylist_testing::public_key_line(),
            label: "laptop".into(),
        },
    )
    .await
    .unwrap();
    let signature = byo_core::keylist_testing::sign(&draft.body, signing_key());
    operator_keys::publish(
        state,
        staff,
        draft.version,
        SignatureUpload {
            signature,
            more_signatures: Vec::new(),
        },
    )
    .await
    .unwrap();
}

pub async fn user(store: &byo_db::Store, email: &str, role: Role) -> CurrentUser {
    let now = chrono::Utc::now();
    let user = store
        .create_user(
            byo_db::users::NewUser {
                email,
                display_name: "",
                password_hash: "$argon2id$unused",
            },
            now,
        )
        .await
        .unwrap();
    store.grant_role(&user.sub, role, None, now).await.unwrap();
    CurrentUser {
        user,
        roles: vec![role],
        via: None,
    }
}

pub async fn token(state: &AppState, by: &CurrentUser, profile: &str) -> String {
    byo_server::app::host_provision::provision(
        state,
        by,
        &ProvisionRequest {
            profile_id: profile.into(),
        },
    )
    .await
    .unwrap()
    .token
}

/// What a run printed on the terminal (stdout, then stderr) and its exit status.
pub struct Ran {
    pub code: Option<i32>,
    pub terminal: String,
}

pub fn one_liner(host: &HostContainer, server: &str, token: &str, as_user: Option<&str>) -> Ran {
    let line = format!("curl -fsSL {server}/install.sh | bash -s -- --token '{token}'");
    on_terminal(host, &line, as_user)
}

/// `line` run by bash in `host`, as root or as `as_user`: what it printed and its status.
pub fn on_terminal(host: &HostContainer, line: &str, as_user: Option<&str>) -> Ran {
    let out = match as_user {
        Some(u) => host.exec(&["runuser", "-u", u, "--", "bash", "-c", line]),
        None => host.sh(line),
    };
    let ran = Ran {
        code: out.status.code(),
        terminal: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    };
    eprintln!(
        "--- `{line}` (as {}) exited {:?}:\n{}",
        as_user.unwrap_or("root"),
        ran.code,
        ran.terminal
    );
    ran
}
