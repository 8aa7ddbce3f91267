//! The agent's side of M: a list is applied only when every rule passes, a refusal leaves
//! the host exactly as it was, and a crash between keeping and applying heals at start.

use std::path::Path;
use std::process::Command;

use byo_agent::operator_keys::{OperatorKeys, Paths, ReceiveError};
use byo_core::keylist::{self, OperatorKey, Refusal};
use byo_core::keylist_testing as testing;
use chrono::{DateTime, Duration, Utc};
use ssh_key::PrivateKey;

fn now() -> DateTime<Utc> {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn login_key(label: &str) -> OperatorKey {
    testing::login_key("op-1", label)
}

fn signed(version: u64, keys: Vec<OperatorKey>, sk: &PrivateKey) -> Vec<u8> {
    testing::envelope(&testing::list("prod", version, keys, now()), &[sk])
}

struct Host {
    _dir: tempfile::TempDir,
    keys: OperatorKeys,
    sk: PrivateKey,
}

fn host() -> Host {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("home/spark/.ssh")).unwrap();
    let keys = OperatorKeys {
        paths: Paths {
            trusted: dir.path().join("signing-keys"),
            held: dir.path().join("operator-keys.signed"),
            authorized_keys: dir.path().join("home/spark/.ssh/authorized_keys"),
            request: dir.path().join("operator-keys-requested"),
        },
        environment: "prod".into(),
        host: None,
    };
    let sk = testing::private_key();
    keys.trust(&sk.public_key().to_openssh().unwrap()).unwrap();
    Host {
        _dir: dir,
        keys,
        sk,
    }
}

/// The file enrolment keeps the host's environment in, holding `env`.
fn environment_file(h: &Host, env: &str) -> std::path::PathBuf {
    let file = h.keys.paths.held.with_file_name("environment");
    std::fs::write(&file, format!("{env}\n")).unwrap();
    file
}

type Snapshot = (Option<Vec<u8>>, Option<Vec<u8>>, Option<Vec<u8>>);

fn snapshot(h: &Host) -> Snapshot {
    let read = |p: &Path| std::fs::read(p).ok();
    (
        read(&h.keys.paths.trusted),
        read(&h.keys.paths.held),
        read(&h.keys.paths.authorized_keys),
    )
}

fn refused<T: std::fmt::Debug>(result: Result<T, ReceiveError>) -> Refusal {
    match result {
        Err(ReceiveError::Refused(r)) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_verified_list_becomes_authorized_keys_and_is_kept_as_received() {
    let h = host();
    let (a, b) = (login_key("laptop"), login_key("desktop"));
    let bytes = signed(1, vec![a.clone(), b.clone()], &h.sk);
    let applied = h.keys.receive(&bytes, now()).unwrap();
    assert_eq!((applied.version, applied.keys), (1, 2));
    let text = std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();
    assert!(text.contains(&a.public_key) && text.contains(&b.public_key));
    let meta = std::fs::metadata(&h.keys.paths.authorized_keys).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::read(&h.keys.paths.held).unwrap(),
        bytes,
        "the exact bytes received"
    );
}

#[test]
fn every_refusal_leaves_the_host_unchanged() {
    let h = host();
    let a = login_key("a");
    h.keys
        .receive(&signed(5, vec![a.clone()], &h.sk), now())
        .unwrap();
    let before = snapshot(&h);
    let stranger = testing::private_key();
    let mut options = login_key("b");
    options.public_key = format!("no-pty {}", options.public_key);
    let mut control = login_key("c");
    control.label = "laptop\u{7}".into();

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("older version", signed(4, vec![a.clone()], &h.sk)),
        (
            "same version, other keys",
            signed(5, vec![login_key("c")], &h.sk),
        ),
        ("empty", signed(6, vec![], &h.sk)),
        ("untrusted signer", signed(6, vec![a.clone()], &stranger)),
        ("key options", signed(6, vec![options], &h.sk)),
        ("control characters", signed(6, vec![control], &h.sk)),
        (
            "duplicate",
            signed(
                6,
                vec![
                    a.clone(),
                    OperatorKey {
                        label: "again".into(),
                        ..a.clone()
                    },
                ],
                &h.sk,
            ),
        ),
        ("oversized", vec![b'x'; keylist::MAX_ENVELOPE_BYTES + 1]),
        ("garbage", b"{}".to_vec()),
    ];
    for (name, bytes) in cases {
        let r = refused(h.keys.receive(&bytes, now()));
        assert_eq!(snapshot(&h), before, "{name} ({r}) changed the host");
    }
    // Expired: a good list, read after its expiry.
    let later = now() + Duration::days(91);
    assert!(matches!(
        refused(h.keys.receive(&signed(6, vec![a.clone()], &h.sk), later)),
        Refusal::Expired { .. }
    ));
    assert_eq!(snapshot(&h), before);
    // Another environment's host refuses this environment's list.
    let other_env = OperatorKeys {
        environment: "staging".into(),
        host: None,
        ..h.keys.clone()
    };
    assert!(matches!(
        refused(other_env.receive(&signed(6, vec![a], &h.sk), now())),
        Refusal::WrongEnvironment { .. }
    ));
    assert_eq!(snapshot(&h), before);
}

#[test]
fn a_host_that_trusts_no_key_refuses_every_list_until_one_is_pinned() {
    let h = host();
    std::fs::remove_file(&h.keys.paths.trusted).unwrap();
    let bytes = signed(1, vec![login_key("a")], &h.sk);
    assert_eq!(
        refused(h.keys.receive(&bytes, now())),
        Refusal::NoTrustedKey
    );
    assert!(!h.keys.paths.authorized_keys.exists());
    h.keys
        .trust(&h.sk.public_key().to_openssh().unwrap())
        .unwrap();
    h.keys.receive(&bytes, now()).unwrap();
    // Once pinned, trusting another key is refused: no call changes it.
    let other = testing::private_key();
    let before = std::fs::read(&h.keys.paths.trusted).unwrap();
    assert!(
        h.keys
            .trust(&other.public_key().to_openssh().unwrap())
            .is_err()
    );
    assert_eq!(std::fs::read(&h.keys.paths.trusted).unwrap(), before);
}

#[test]
fn a_crash_between_keeping_and_applying_heals_at_start() {
    let h = host();
    let (a, b) = (login_key("a"), login_key("b"));
    h.keys
        .receive(&signed(1, vec![a.clone()], &h.sk), now())
        .unwrap();
    let applied_v1 = std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();

    // Version 2 removes a and adds b; the process dies after keeping it, before applying.
    let v2 = signed(2, vec![b.clone()], &h.sk);
    h.keys.accept(&v2, now()).unwrap();
    h.keys.persist(&v2).unwrap();
    assert_eq!(
        std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap(),
        applied_v1,
        "authorized_keys is still whole: the last list applied"
    );
    // The next start brings authorized_keys to the kept list; a is gone.
    assert!(h.keys.reconcile(now()).unwrap());
    let text = std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();
    assert!(text.contains(&b.public_key) && !text.contains(&a.public_key));
    assert!(
        !h.keys.reconcile(now()).unwrap(),
        "a second start writes nothing"
    );
    // The kept version refuses a replay of version 1, which would bring a back.
    assert!(matches!(
        refused(h.keys.receive(&signed(1, vec![a], &h.sk), now())),
        Refusal::OlderVersion {
            held: 2,
            offered: 1
        }
    ));
}

/// A host that knows its slug (spark-7), holding version 1: one operator's key.
fn spark_7_holding_one_key() -> (Host, OperatorKey) {
    let mut h = host();
    h.keys.host = Some("spark-7".into());
    let a = login_key("a");
    h.keys
        .receive(&signed(1, vec![a.clone()], &h.sk), now())
        .unwrap();
    (h, a)
}

/// M at expiry (#39, 5): once the kept list has expired the host admits a break-glass
/// certificate for its own slug from the relay, signed by a key it trusts to sign lists; a
/// host that does not know its slug admits none; the first list that has not expired takes
/// the lines away again. (That sshd really admits the certificate, and only then, is
/// byo-relay's `m_at_expiry_break_glass_…` on a real sshd.)
#[test]
fn m_at_expiry_the_kept_list_admits_break_glass_for_this_host_until_a_new_list_comes() {
    let (h, a) = spark_7_holding_one_key();
    let text = || std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();
    assert!(!text().contains("cert-authority"), "{}", text());
    assert!(!h.keys.reconcile(now() + Duration::days(89)).unwrap());

    // The clock passes the list's expiry (90 days) with no new list.
    let later = now() + Duration::days(91);
    assert!(
        h.keys.reconcile(later).unwrap(),
        "the beat after expiry rewrites"
    );
    let signer = h.sk.public_key().to_openssh().unwrap();
    let signer: String = signer
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let expired = text();
    assert!(
        expired.contains(&format!(
            "cert-authority,principals=\"spark-7\",from=\"10.8.0.1\" {signer} byo-break-glass\n"
        )),
        "{expired}"
    );
    assert_eq!(
        expired.matches("cert-authority").count(),
        1,
        "one line per trusted signer: {expired}"
    );
    assert!(
        expired.contains(&a.public_key),
        "the list's own lines stay, their expiry-time past"
    );
    assert!(
        !h.keys.reconcile(later).unwrap(),
        "the next beat writes nothing"
    );

    // A host that does not know its slug admits no certificate at all.
    let mut nameless = h.keys.clone();
    nameless.host = None;
    assert!(nameless.reconcile(later).unwrap());
    assert!(!text().contains("cert-authority"), "{}", text());
    assert!(h.keys.reconcile(later).unwrap());

    // The first list that has not expired ends break glass.
    let v2 = testing::envelope(&testing::list("prod", 2, vec![a.clone()], later), &[&h.sk]);
    h.keys.receive(&v2, later).unwrap();
    assert!(!text().contains("cert-authority"), "{}", text());
    assert!(text().contains(&a.public_key));
    assert!(!h.keys.reconcile(later).unwrap());
}

#[test]
fn the_agent_command_applies_refuses_and_shows_a_list() {
    let h = host();
    let a = login_key("work laptop");
    let file = h.keys.paths.held.with_file_name("incoming.json");
    std::fs::write(&file, signed(3, vec![a], &h.sk)).unwrap();
    let run = |args: &[&str], env: &str| {
        Command::new(env!("CARGO_BIN_EXE_byo-agent"))
            .arg("operator-keys")
            .args(args)
            .arg("--trusted")
            .arg(&h.keys.paths.trusted)
            .arg("--held")
            .arg(&h.keys.paths.held)
            .arg("--authorized-keys")
            .arg(&h.keys.paths.authorized_keys)
            .arg("--environment-file")
            .arg(environment_file(&h, env))
            .output()
            .unwrap()
    };
    let file = file.to_str().unwrap();
    let refused = run(&["apply", file], "staging");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("environment"));
    assert!(!h.keys.paths.held.exists(), "a refused list is not kept");

    let out = run(&["apply", file], "prod");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("version 3"));

    let out = run(&["show"], "prod");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("version 3") && text.contains("SHA256:") && text.contains("work laptop"),
        "{text}"
    );
}

/// `byo-agent serve` as the unit runs it, on a free port, with `h`'s paths and
/// `environment_file`; and a PUT of a list to it, answered as raw HTTP. Beside it, root's
/// half as `enverge-operator-keys.path` runs it: whenever serving leaves a request, the
/// agent binary's `operator-keys apply-requested` with the same paths (systemd does the
/// watching on a host; the real units run in the real-host scenarios).
struct Serving {
    child: std::process::Child,
    port: u16,
    _root: RootHelper,
}

struct RootHelper {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RootHelper {
    fn start(h: &Host, environment_file: &Path) -> RootHelper {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let paths = h.keys.paths.clone();
        let environment_file = environment_file.to_owned();
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                if paths.request.exists() {
                    let out = Command::new(env!("CARGO_BIN_EXE_byo-agent"))
                        .args(["operator-keys", "apply-requested", "--trusted"])
                        .arg(&paths.trusted)
                        .arg("--held")
                        .arg(&paths.held)
                        .arg("--authorized-keys")
                        .arg(&paths.authorized_keys)
                        .arg("--request")
                        .arg(&paths.request)
                        .arg("--environment-file")
                        .arg(&environment_file)
                        .output()
                        .unwrap();
                    eprintln!(
                        "enverge-operator-keys: {}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
        RootHelper {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for RootHelper {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Serving {
    fn start(h: &Host, hash_file: &Path, environment_file: &Path) -> Serving {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_byo-agent"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--agent-token-hash",
            ])
            .arg(hash_file)
            .arg("--trusted")
            .arg(&h.keys.paths.trusted)
            .arg("--held")
            .arg(&h.keys.paths.held)
            .arg("--authorized-keys")
            .arg(&h.keys.paths.authorized_keys)
            .arg("--environment-file")
            .arg(environment_file)
            .arg("--request")
            .arg(&h.keys.paths.request)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let root = RootHelper::start(h, environment_file);
        let s = Serving {
            child,
            port,
            _root: root,
        };
        let _ = s.connect();
        s
    }

    fn connect(&self) -> std::net::TcpStream {
        for _ in 0..200 {
            if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("byo-agent serve did not listen");
    }

    fn put(&self, bearer: &str, body: &[u8]) -> String {
        use std::io::{Read, Write};
        let mut s = self.connect();
        write!(
            s,
            "PUT /v1/operator-keys HTTP/1.1\r\nHost: agent\r\nAuthorization: Bearer {bearer}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(body).unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent_token(h: &Host) -> (byo_core::tokens::SecretToken, std::path::PathBuf) {
    use byo_core::tokens::{SecretToken, TokenKind};
    let token = SecretToken::generate(TokenKind::Agent);
    let hash_file = h.keys.paths.held.with_file_name("agent-token.sha256");
    std::fs::write(&hash_file, format!("{}\n", token.hash().as_str())).unwrap();
    (token, hash_file)
}

/// `byo-agent serve` as the unit runs it: at start it heals authorized_keys from the kept
/// list, then answers pushes only with the agent token.
#[test]
fn the_serving_process_heals_at_start_and_checks_the_token() {
    use byo_core::tokens::{SecretToken, TokenKind};

    let h = host();
    let a = login_key("a");
    let v1 = signed(1, vec![a.clone()], &h.sk);
    // A crash left version 1 kept but never applied.
    h.keys.persist(&v1).unwrap();
    let (token, hash_file) = agent_token(&h);
    let serving = Serving::start(&h, &hash_file, &environment_file(&h, "prod"));
    let put = |bearer: &str, body: &[u8]| serving.put(bearer, body);
    // Serving asks at start, and root heals it.
    let started = std::time::Instant::now();
    while !std::fs::read_to_string(&h.keys.paths.authorized_keys)
        .unwrap_or_default()
        .contains(&a.public_key)
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "not healed at start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let b = login_key("b");
    let v2 = signed(2, vec![b.clone()], &h.sk);
    let wrong = SecretToken::generate(TokenKind::Agent);
    assert!(put(wrong.expose(), &v2).starts_with("HTTP/1.1 401"));
    assert!(
        !std::fs::read_to_string(&h.keys.paths.authorized_keys)
            .unwrap()
            .contains(&b.public_key)
    );
    assert!(
        put(token.expose(), &signed(1, vec![b.clone()], &h.sk)).starts_with("HTTP/1.1 422"),
        "a replay is refused"
    );
    let ok = put(token.expose(), &v2);
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let text = std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();
    assert!(text.contains(&b.public_key) && !text.contains(&a.public_key));
}

/// Serving checks pushes against the environment the host enrolled into (the file
/// enrolment keeps), not a built-in one: a host enrolled into `local` (as `byo up` is) takes
/// a list for `local` and refuses one for `production`, changing nothing. A host enrolled
/// before that file was kept reads its environment from the list it holds.
#[test]
fn serving_checks_lists_against_the_environment_the_host_enrolled_into() {
    let h = host();
    let (token, hash_file) = agent_token(&h);
    let for_env = |env: &str, version: u64, key: &OperatorKey| {
        testing::envelope(
            &testing::list(env, version, vec![key.clone()], now()),
            &[&h.sk],
        )
    };
    let (a, b, c) = (login_key("a"), login_key("b"), login_key("c"));
    {
        let serving = Serving::start(&h, &hash_file, &environment_file(&h, "local"));
        let ok = serving.put(token.expose(), &for_env("local", 1, &a));
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        let before = snapshot(&h);
        let refused = serving.put(token.expose(), &for_env("production", 2, &b));
        assert!(refused.starts_with("HTTP/1.1 422"), "{refused}");
        assert!(refused.contains(r#""error":"refused""#), "{refused}");
        assert!(
            refused.contains("environment") && refused.contains("local"),
            "{refused}"
        );
        assert_eq!(snapshot(&h), before, "a refused list changes nothing");
    }
    // No environment file (enrolled before it was kept): the held list's environment.
    let missing = h.keys.paths.held.with_file_name("no-such-environment");
    let serving = Serving::start(&h, &hash_file, &missing);
    let before = snapshot(&h);
    let refused = serving.put(token.expose(), &for_env("production", 2, &b));
    assert!(refused.starts_with("HTTP/1.1 422"), "{refused}");
    assert_eq!(snapshot(&h), before);
    let ok = serving.put(token.expose(), &for_env("local", 2, &c));
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let text = std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();
    assert!(text.contains(&c.public_key) && !text.contains(&a.public_key));
}

/// M.13 on the host, with the real verifier: a rotation list signed by the pinned key (and
/// by its successor) moves the trust; one signed by the wrong key changes nothing; after
/// the rotation the old key signs nothing; the pin file itself is never rewritten.
#[test]
fn m13_signing_key_rotation_is_applied_only_from_a_list_the_current_trust_signed() {
    let h = host();
    let pin_before = std::fs::read(&h.keys.paths.trusted).unwrap();
    let laptop = login_key("laptop");
    h.keys
        .receive(&signed(1, vec![laptop.clone()], &h.sk), now())
        .unwrap();
    let successor = testing::private_key();
    let mut successor_line = successor.public_key().clone();
    successor_line.set_comment("");
    let rotation = |version: u64| {
        let mut l = testing::list("prod", version, vec![laptop.clone()], now());
        l.next_signing_keys = Some(vec![successor_line.to_openssh().unwrap()]);
        l
    };
    // Signed by a stranger (and the successor): refused, nothing changed.
    let stranger = testing::private_key();
    let before = snapshot(&h);
    let r = refused(h.keys.receive(
        &testing::envelope(&rotation(2), &[&stranger, &successor]),
        now(),
    ));
    assert!(matches!(r, Refusal::BadSignature { .. }), "{r:?}");
    assert_eq!(snapshot(&h), before);
    // Signed by the pin alone: the successor has not proven itself; nothing changed.
    let r = refused(
        h.keys
            .receive(&testing::envelope(&rotation(2), &[&h.sk]), now()),
    );
    assert!(matches!(r, Refusal::SuccessorUnproven { .. }), "{r:?}");
    assert_eq!(snapshot(&h), before);
    // Signed by both: applied; the next list's trust is the successor's alone.
    h.keys
        .receive(
            &testing::envelope(&rotation(2), &[&h.sk, &successor]),
            now(),
        )
        .unwrap();
    assert_eq!(
        h.keys.signing_trust().unwrap(),
        vec![successor_line.clone()]
    );
    assert_eq!(
        std::fs::read(&h.keys.paths.trusted).unwrap(),
        pin_before,
        "the pin file is untouched"
    );
    let desktop = login_key("desktop");
    let mut next = rotation(3);
    next.keys.push(desktop.clone());
    let before = snapshot(&h);
    let r = refused(h.keys.receive(&testing::envelope(&next, &[&h.sk]), now()));
    assert!(
        matches!(r, Refusal::BadSignature { .. }),
        "the old key signs nothing now: {r:?}"
    );
    assert_eq!(snapshot(&h), before);
    h.keys
        .receive(&testing::envelope(&next, &[&successor]), now())
        .unwrap();
    let text = std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();
    assert!(text.contains(&desktop.public_key));
}

/// Issue #36: root keeps and writes the list, serving only passes it on. Serving's answer is
/// root's verdict; root trusts nothing of serving's but the bytes it verifies itself.
#[test]
fn a36_serving_passes_a_list_to_root_and_answers_only_what_root_applied() {
    let h = host();
    let root = |keys: OperatorKeys| {
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            while started.elapsed() < std::time::Duration::from_secs(5) {
                if keys.paths.request.exists() {
                    return keys.apply_requested(now());
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Ok(None)
        })
    };
    let within = std::time::Duration::from_secs(5);
    let a = login_key("a");
    let v1 = signed(1, vec![a.clone()], &h.sk);
    let helper = root(h.keys.clone());
    let applied = h.keys.receive_through_root(&v1, now(), within).unwrap();
    assert_eq!(applied.version, 1);
    assert_eq!(helper.join().unwrap().unwrap().unwrap().version, 1);
    assert_eq!(std::fs::read(&h.keys.paths.held).unwrap(), v1);
    let text = std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();
    assert!(text.contains(&a.public_key), "{text}");
    assert!(!h.keys.paths.request.exists());

    // No root answering: the push fails, and nothing changed yet.
    let b = login_key("b");
    let v2 = signed(2, vec![b.clone()], &h.sk);
    let before = snapshot(&h);
    let late = h
        .keys
        .receive_through_root(&v2, now(), std::time::Duration::from_millis(200));
    assert!(matches!(late, Err(ReceiveError::Io { .. })), "{late:?}");
    assert_eq!(snapshot(&h), before);
    std::fs::remove_file(&h.keys.paths.request).unwrap();

    // Root's trust is root's: a list serving would take, root refuses, and serving says so.
    let mut roots = h.keys.clone();
    roots.paths.trusted = h.keys.paths.trusted.with_file_name("roots-signing-keys");
    let other = testing::private_key();
    std::fs::write(
        &roots.paths.trusted,
        format!("{}\n", other.public_key().to_openssh().unwrap()),
    )
    .unwrap();
    let helper = root(roots.clone());
    let by_root = h.keys.receive_through_root(&v2, now(), within);
    assert!(
        matches!(by_root, Err(ReceiveError::Io { .. })),
        "{by_root:?}"
    );
    assert!(matches!(
        helper.join().unwrap(),
        Err(ReceiveError::Refused(_))
    ));
    assert_eq!(snapshot(&h), before, "root refused: nothing changed");

    // A serving that skips its own check and leaves a forged list (a stranger's signature,
    // its own key in it) gets nothing from root.
    let forged = testing::envelope(
        &testing::list("prod", 9, vec![login_key("intruder")], now()),
        &[&other],
    );
    std::fs::write(&h.keys.paths.request, &forged).unwrap();
    let r = refused(h.keys.apply_requested(now()));
    assert!(matches!(r, Refusal::BadSignature { .. }), "{r:?}");
    assert_eq!(snapshot(&h), before);
    assert!(
        !h.keys.paths.request.exists(),
        "the request is taken either way"
    );

    // A request that is not a plain file (a link to a file of root's) is not read.
    let secret = h.keys.paths.held.with_file_name("roots-secret");
    std::fs::write(&secret, &v2).unwrap();
    std::os::unix::fs::symlink(&secret, &h.keys.paths.request).unwrap();
    let r = h.keys.apply_requested(now());
    assert!(
        matches!(&r, Err(ReceiveError::Io { context, .. }) if context.contains("serving's request")),
        "{r:?}"
    );
    assert_eq!(snapshot(&h), before);
    assert_eq!(
        std::fs::read(&secret).unwrap(),
        v2,
        "the link's target untouched"
    );
}

/// At the kept list's expiry serving cannot write break glass in itself: it asks, and root
/// writes it from its own kept list and clock; once written, serving asks nothing more.
#[test]
fn a36_at_expiry_serving_asks_root_for_break_glass() {
    let (h, _) = spark_7_holding_one_key();
    assert!(
        !h.keys.reconcile_through_root(now()).unwrap(),
        "nothing to ask"
    );
    assert!(!h.keys.paths.request.exists());
    let later = now() + Duration::days(91);
    assert!(h.keys.reconcile_through_root(later).unwrap());
    assert_eq!(std::fs::read(&h.keys.paths.request).unwrap(), b"");
    assert!(!h.keys.reconcile_through_root(later).unwrap(), "asked once");
    assert_eq!(h.keys.apply_requested(later).unwrap(), None);
    let text = std::fs::read_to_string(&h.keys.paths.authorized_keys).unwrap();
    assert!(
        text.contains("cert-authority,principals=\"spark-7\""),
        "{text}"
    );
    assert!(!h.keys.reconcile_through_root(later).unwrap());
}
