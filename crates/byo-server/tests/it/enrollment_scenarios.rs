//! The agent's side of enrolment, the design's five scenarios, driving the real server over
//! HTTP and the real agent code: 1 enrols, 2–4 are refused, 5 finds the host already
//! enrolled. Plus the retry while the backend cannot be reached.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use byo_agent::enroll::{EnrollError, EnrollOutcome, EnrollPaths, Enroller};
use byo_core::keylist::check_key;
use byo_core::keylist_testing as testing;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::operator_keys::{KeyChange, PublishedKey};
use byo_server::app::host_provision::provision;
use byo_server::auth::CurrentUser;
use byo_server::clock::Clock;
use byo_server::{AppState, Config};
use byo_wire::Role;
use byo_wire::enroll::{EnrollRequest, NodeReport, ProvisionRequest};

async fn served() -> World {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    world_on(Some(listener)).await
}

struct World {
    state: AppState,
    clock: Clock,
    server: String,
    owner: CurrentUser,
    _db: byo_db::testing::TestDb,
    stop: tokio::sync::oneshot::Sender<()>,
    stopped: Option<tokio::sync::oneshot::Receiver<()>>,
}

fn spark() -> EnrollRequest {
    EnrollRequest {
        node: NodeReport {
            gpu_model: Some("GB10".into()),
            gpu_count: Some(1),
            gpu_mem_mib: Some(122880),
            arch: Some("aarch64".into()),
            os_id: Some("ubuntu".into()),
            os_version: Some("24.04".into()),
            driver_version: Some("580.65.06".into()),
            machine_id: Some("3f2a".into()),
            hardware_id: Some("b41c".into()),
            node_index: 0,
            rails: Vec::new(),
        },
        peers: Vec::new(),
    }
}

async fn world_on(listener: Option<tokio::net::TcpListener>) -> World {
    let db = byo_db::testing::sqlite().await;
    let signing = testing::private_key();
    let mut config = Config {
        metrics_listen: None,
        secret_key: Some(byo_server::seal::Sealer::generate_hex().into()),
        password_hashing: byo_server::config::PasswordHashing {
            memory_kib: 256,
            iterations: 1,
            parallelism: 1,
        },
        ..Config::default()
    };
    config.operator_keys.signing_keys = vec![signing.public_key().to_openssh().unwrap()];
    // Not production: as `byo up` runs, so nothing leans on a built-in environment.
    config.environment = "local".into();
    let clock = Clock::manual(chrono::Utc::now());
    let state = AppState::new(db.store.clone(), config).with_clock(clock.clone());
    let now = clock.now();
    let user = db
        .create_user(
            byo_db::users::NewUser {
                email: "owner@example.com",
                display_name: "",
                password_hash: "x",
            },
            now,
        )
        .await
        .unwrap();
    db.grant_role(&user.sub, Role::CommunityHost, None, now)
        .await
        .unwrap();
    let owner = CurrentUser {
        roles: vec![Role::CommunityHost],
        via: None,
        user,
    };

    // A published operator-key list, so enrolment delivers one (step 29).
    let login = testing::login_key(&owner.user.sub, "laptop");
    let list = testing::list(&state.config.environment, 1, vec![login.clone()], now);
    let body = list.to_canonical();
    let fp = check_key(&login).unwrap().fingerprint;
    db.apply_key_change(
        KeyChange {
            user_sub: &owner.user.sub,
            action: "add",
            fingerprint: &fp,
            label: "laptop",
        },
        now,
        |_, _| Ok(body.clone()),
    )
    .await
    .unwrap();
    let envelope = String::from_utf8(testing::envelope(&list, &[&signing])).unwrap();
    let published = PublishedKey {
        user_sub: login.user_sub.clone(),
        label: login.label.clone(),
        public_key: login.public_key.clone(),
        fingerprint: fp,
    };
    db.publish_key_list(1, &envelope, &[published], &owner.user.sub, now)
        .await
        .unwrap();

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut w = World {
        state,
        clock,
        server: String::new(),
        owner,
        _db: db,
        stop,
        stopped: Some(stopped),
    };
    if let Some(listener) = listener {
        w.serve(listener);
    }
    w
}

impl World {
    fn serve(&mut self, listener: tokio::net::TcpListener) {
        self.server = format!("http://{}", listener.local_addr().unwrap());
        let stopped = self.stopped.take().expect("served once");
        tokio::spawn(byo_server::serve(self.state.clone(), listener, async {
            let _ = stopped.await;
        }));
    }

    async fn one_liner_token(&self) -> String {
        provision(
            &self.state,
            &self.owner,
            &ProvisionRequest {
                profile_id: "gb10-spark-1".into(),
            },
        )
        .await
        .unwrap()
        .token
    }

    fn enroller(&self, root: &std::path::Path) -> Enroller {
        Enroller {
            retry_every: Duration::from_millis(50),
            give_up_after: Duration::from_secs(10),
            ..Enroller::new(
                &self.server,
                EnrollPaths {
                    root: root.to_owned(),
                },
            )
        }
    }
}

fn nothing_kept(root: &std::path::Path) -> bool {
    walk(root).is_empty()
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_1_a_spark_enrolls_and_keeps_everything_root_only() {
    let w = served().await;
    let token = w.one_liner_token().await;
    let host = tempfile::tempdir().unwrap();
    let e = w.enroller(host.path());
    assert_eq!(
        e.enroll(&token, &spark()).await.unwrap(),
        EnrollOutcome::Enrolled {
            slug: "spark-1".into()
        }
    );

    let creds = e.kept().unwrap().unwrap();
    let mode = std::fs::metadata(host.path().join("etc/enverge/credentials.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "credentials are root-only");
    let agent_token = SecretToken::parse(TokenKind::Agent, &creds.agent_token).unwrap();
    let kept_hash =
        std::fs::read_to_string(host.path().join("etc/enverge/agent-token.sha256")).unwrap();
    assert_eq!(kept_hash.trim(), agent_token.hash().as_str());
    // The signing key is pinned and the list it signed is kept, verified, where preparation reads it.
    assert!(
        std::fs::read_to_string(host.path().join("etc/enverge/signing-keys"))
            .unwrap()
            .starts_with("ssh-ed25519 ")
    );
    let keys = e.operator_keys(&creds.environment);
    assert_eq!(keys.held().unwrap().unwrap().1.version, 1);
    // The environment it enrolled into is kept where serving (unprivileged) reads it: every
    // list pushed later is checked against it.
    let env_file = host.path().join("etc/enverge/environment");
    assert_eq!(
        std::fs::read_to_string(&env_file).unwrap().trim(),
        w.state.config.environment
    );
    assert_eq!(
        std::fs::metadata(&env_file).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert_eq!(
        byo_agent::enroll::enrolled_environment(&env_file, &keys.paths.held)
            .unwrap()
            .as_deref(),
        Some(creds.environment.as_str())
    );
    // The backend holds the host's hashes and sealed tokens, not the plaintext it handed over.
    let dump = w.state.store.dump_text().await.unwrap();
    assert!(
        dump.iter()
            .all(|v| !v.value.contains(&creds.agent_token) && !v.value.contains(&creds.host_token))
    );
    let _ = w.stop.send(());
}

/// A relay provider whose relay gets its address only when the test says so: a host can
/// redeem before it has one.
#[derive(Default)]
struct LateRelays {
    up: tokio::sync::Notify,
}

impl byo_server::providers::RelayProvider for LateRelays {
    fn provision<'a>(
        &'a self,
        slug: &'a str,
        _: Option<&'a str>,
    ) -> futures::future::BoxFuture<
        'a,
        Result<byo_server::providers::RelayInfo, byo_server::providers::ProviderError>,
    > {
        Box::pin(async move {
            self.up.notified().await;
            Ok(byo_server::providers::RelayInfo {
                name: format!("{slug}-relay"),
                address: "203.0.113.9".into(),
            })
        })
    }
    fn release<'a>(
        &'a self,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(), byo_server::providers::ProviderError>> {
        Box::pin(async { Ok(()) })
    }
}

/// Early redeem heals (#11): a host that redeems before its relay has an address is given
/// no endpoint; `GET /api/host/relay` says so too; once the relay has its address the next
/// answer carries it, and preparation's ask (`learn_relay_endpoint`, run by every attempt)
/// keeps it in the credentials, which is where relay-peer's wg0.conf comes from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_redeem_learns_the_relays_endpoint_once_it_has_one() {
    use byo_agent::prepare::unit::learn_relay_endpoint;
    use byo_agent::report::Reporter;

    let relays = std::sync::Arc::new(LateRelays::default());
    let mut w = world_on(None).await;
    w.state = w.state.clone().with_providers(
        relays.clone(),
        std::sync::Arc::new(byo_server::providers::local::LocalTunnels::default()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    w.serve(listener);
    let token = w.one_liner_token().await;
    let host = tempfile::tempdir().unwrap();
    let e = w.enroller(host.path());
    e.enroll(&token, &spark()).await.unwrap();
    let creds = e.kept().unwrap().unwrap();
    assert_eq!(
        creds.wireguard.endpoint, None,
        "redeemed before the relay had an address"
    );

    let server = w.server.clone();
    let host_token = creds.host_token.clone();
    let ask = move || {
        let (server, host_token) = (server.clone(), host_token.clone());
        tokio::task::spawn_blocking(move || {
            Reporter::new(&server, &host_token)
                .unwrap()
                .relay()
                .unwrap()
        })
    };
    assert_eq!(ask().await.unwrap().endpoint, None);
    let learn = |creds| {
        let (e, server) = (e.clone(), w.server.clone());
        tokio::task::spawn_blocking(move || learn_relay_endpoint(&e, &server, creds))
    };
    let creds = learn(creds).await.unwrap();
    assert_eq!(creds.wireguard.endpoint, None);
    assert_eq!(e.kept().unwrap().unwrap().wireguard.endpoint, None);

    // relay-provision finishes: the relay has its address.
    relays.up.notify_one();
    let started = std::time::Instant::now();
    while ask().await.unwrap().endpoint.is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the relay never got its address"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        ask().await.unwrap().endpoint.as_deref(),
        Some("203.0.113.9:51820")
    );
    let learnt = learn(creds.clone()).await.unwrap();
    assert_eq!(
        learnt.wireguard.endpoint.as_deref(),
        Some("203.0.113.9:51820")
    );
    // Kept, root-only, everything else as received: the next attempt (and a re-prepare
    // after a reboot) reads it from there.
    let kept = e.kept().unwrap().unwrap();
    assert_eq!(
        kept.wireguard.endpoint.as_deref(),
        Some("203.0.113.9:51820")
    );
    assert_eq!(
        (
            kept.host_token.as_str(),
            kept.wireguard.private_key.as_str()
        ),
        (
            creds.host_token.as_str(),
            creds.wireguard.private_key.as_str()
        )
    );
    let mode = std::fs::metadata(host.path().join("etc/enverge/credentials.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let plan = byo_agent::prepare::plan_from(&kept, None).unwrap();
    assert!(
        byo_agent::prepare::render_wireguard(plan.wireguard.as_ref().unwrap())
            .contains("Endpoint = 203.0.113.9:51820")
    );
    // A token that is no live host's learns nothing.
    let stranger = SecretToken::generate(TokenKind::Host);
    let server = w.server.clone();
    let refused = tokio::task::spawn_blocking(move || {
        Reporter::new(&server, stranger.expose()).unwrap().relay()
    })
    .await
    .unwrap();
    assert!(refused.unwrap_err().contains("401"));
    let _ = w.stop.send(());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_2_a_spent_token_is_refused() {
    let w = served().await;
    let token = w.one_liner_token().await;
    let first = tempfile::tempdir().unwrap();
    w.enroller(first.path())
        .enroll(&token, &spark())
        .await
        .unwrap();
    let second = tempfile::tempdir().unwrap();
    let mut other = spark();
    other.node.hardware_id = Some("another-box".into());
    let err = w
        .enroller(second.path())
        .enroll(&token, &other)
        .await
        .unwrap_err();
    assert!(matches!(err, EnrollError::InvalidToken(_)), "{err}");
    assert!(nothing_kept(second.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_3_an_expired_or_mistyped_token_is_refused() {
    let w = served().await;
    let token = w.one_liner_token().await;
    w.clock.advance(chrono::Duration::minutes(61));
    let host = tempfile::tempdir().unwrap();
    let err = w
        .enroller(host.path())
        .enroll(&token, &spark())
        .await
        .unwrap_err();
    assert!(matches!(err, EnrollError::InvalidToken(_)), "{err}");
    let err = w
        .enroller(host.path())
        .enroll("byo_enr_typo", &spark())
        .await
        .unwrap_err();
    assert!(matches!(err, EnrollError::InvalidToken(_)), "{err}");
    assert!(nothing_kept(host.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_4_hardware_that_is_not_a_gb10_spark_is_turned_away() {
    let w = served().await;
    let token = w.one_liner_token().await;
    let host = tempfile::tempdir().unwrap();
    let mut pc = spark();
    pc.node.gpu_model = Some("GeForce RTX 4090".into());
    pc.node.arch = Some("x86_64".into());
    let err = w
        .enroller(host.path())
        .enroll(&token, &pc)
        .await
        .unwrap_err();
    match err {
        EnrollError::Rejected(why) => assert!(why.contains("gpu_model"), "{why}"),
        other => panic!("{other}"),
    }
    assert!(nothing_kept(host.path()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scenario_5_a_machine_that_already_enrolled_reuses_its_credentials() {
    let w = served().await;
    let token = w.one_liner_token().await;
    let host = tempfile::tempdir().unwrap();
    w.enroller(host.path())
        .enroll(&token, &spark())
        .await
        .unwrap();
    let before = std::fs::read(host.path().join("etc/enverge/credentials.json")).unwrap();
    // The backend is gone and the token spent: running the one-liner again calls nothing.
    let _ = w.stop.send(());
    let again = Enroller {
        give_up_after: Duration::ZERO,
        ..Enroller::new(
            "http://127.0.0.1:9",
            EnrollPaths {
                root: host.path().to_owned(),
            },
        )
    };
    assert_eq!(
        again.enroll(&token, &spark()).await.unwrap(),
        EnrollOutcome::AlreadyEnrolled {
            slug: "spark-1".into()
        }
    );
    assert_eq!(
        std::fs::read(host.path().join("etc/enverge/credentials.json")).unwrap(),
        before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_backend_is_retried_while_the_token_lives() {
    let mut w = world_on(None).await;
    let token = w.one_liner_token().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let host = tempfile::tempdir().unwrap();
    let enroller = Enroller {
        retry_every: Duration::from_millis(50),
        give_up_after: Duration::from_secs(10),
        ..Enroller::new(
            &format!("http://127.0.0.1:{port}"),
            EnrollPaths {
                root: host.path().to_owned(),
            },
        )
    };
    // The backend comes up only after the agent has started trying.
    let attempt = tokio::spawn({
        let (token, enroller) = (token.clone(), enroller.clone());
        async move { enroller.enroll(&token, &spark()).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !attempt.is_finished(),
        "still trying while the backend is down"
    );
    w.serve(
        tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap(),
    );
    assert_eq!(
        attempt.await.unwrap().unwrap(),
        EnrollOutcome::Enrolled {
            slug: "spark-1".into()
        }
    );

    // And it gives up once the token could no longer live.
    let elsewhere = tempfile::tempdir().unwrap();
    let gone = Enroller {
        retry_every: Duration::from_millis(20),
        give_up_after: Duration::from_millis(100),
        ..Enroller::new(
            "http://127.0.0.1:9",
            EnrollPaths {
                root: elsewhere.path().to_owned(),
            },
        )
    };
    assert!(matches!(
        gone.enroll(&token, &spark()).await,
        Err(EnrollError::Unreachable(_))
    ));
    let _ = w.stop.send(());
}
