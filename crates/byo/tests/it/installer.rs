//! The real `install.sh`, served by a real server (on SQLite), run by `curl … | bash` in a
//! real Debian host container: every refusal prints its reason on the terminal, exits with
//! its own status and leaves nothing installed; then a good token enrols, and preparation
//! reuses the kept credentials instead of enrolling again. One container for every case.
//!
//! And, in a second container, a preparation that failed recovering on its own: the real
//! units under systemd retry it on their schedule, and a list published meanwhile reaches it.

use crate::host_container;
use crate::onboard;
use crate::support;

use std::time::{Duration, Instant};

use byo_core::tokens::{SecretToken, TokenKind};
use byo_server::Config;
use byo_server::clock::Clock;
use byo_wire::Role;
use byo_wire::enroll::{EnrollRequest, NodeReport, ProvisionRequest};
use host_container::{HostContainer, bridge_gateway};
use onboard::{Ran, one_liner, publish_operator_keys, serve, token, user};
use support::release;

/// Whatever an install leaves on the host: the binary, the units, /etc/enverge (token,
/// credentials), the agent's state.
fn left_behind(host: &HostContainer) -> String {
    host.sh_ok(
        "for p in /usr/local/bin/byo-agent /usr/local/bin/byo-agent.previous /usr/local/bin/byo-agent.new \
         /etc/enverge /var/lib/enverge-agent /etc/systemd/system/enverge-agent*; do \
           if [ -e \"$p\" ]; then echo \"$p\"; fi; done; \
         systemctl list-unit-files 'enverge*' --no-legend || true",
    )
    .trim()
    .to_owned()
}

fn refused(host: &HostContainer, case: &str, ran: &Ran, code: i32, says: &[&str]) {
    assert_eq!(
        ran.code,
        Some(code),
        "{case}: exit status\n{}",
        ran.terminal
    );
    for s in says {
        assert!(
            ran.terminal.contains(s),
            "{case}: the terminal does not say {s:?}:\n{}",
            ran.terminal
        );
    }
    assert!(
        !ran.terminal.contains("byo agent installed"),
        "{case}: {}",
        ran.terminal
    );
    let left = left_behind(host);
    assert!(left.is_empty(), "{case}: left behind:\n{left}");
}

/// `line` run by bash in `host` on a terminal (util-linux's `script` gives it a pty, as an
/// owner's ssh session has), typing each reply once its prompt has appeared, as a person
/// would: what the terminal showed and the status.
fn typed_on_a_terminal(host: &HostContainer, line: &str, typed: &[(&str, &str)]) -> Ran {
    use std::io::{Read, Write};
    let mut child = std::process::Command::new("lxc")
        .args([
            "exec",
            host.name(),
            "--",
            "script",
            "-qec",
            line,
            "/dev/null",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut stdin = child.stdin.take().unwrap();
    let mut shown = Vec::new();
    for (prompt, reply) in typed {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !String::from_utf8_lossy(&shown).contains(prompt) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(chunk) => shown.extend(chunk),
                Err(_) => panic!(
                    "no prompt {prompt:?} on the terminal:\n{}",
                    String::from_utf8_lossy(&shown)
                ),
            }
        }
        stdin.write_all(format!("{reply}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
    while let Ok(chunk) = rx.recv_timeout(Duration::from_secs(120)) {
        shown.extend(chunk);
    }
    reader.join().unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    shown.extend(out.stderr);
    let ran = Ran {
        code: out.status.code(),
        terminal: String::from_utf8_lossy(&shown).into_owned(),
    };
    eprintln!(
        "--- `{line}` on a terminal exited {:?}:\n{}",
        ran.code, ran.terminal
    );
    ran
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_sh_fails_loudly_leaves_nothing_behind_and_then_enrols() {
    let Some(host) = HostContainer::launch("byo-installer") else {
        return;
    };
    let t0 = Instant::now();
    let db = byo_db::testing::sqlite().await;
    let store = db.store.clone();
    let work = tempfile::tempdir().unwrap();
    let arch = host.sh_ok("uname -m").trim().to_owned();
    let clock = Clock::manual(chrono::Utc::now());

    // The server, its agent build for the container's arch; a second with builds only for
    // another arch; a third whose install.sh points at a port nobody listens on.
    let releases = release(&work.path().join("releases"), &[&arch]);
    let (server, state) = serve(&store, releases.clone(), None, &clock).await;
    let elsewhere = if arch == "aarch64" {
        "riscv64"
    } else {
        "aarch64"
    };
    let other = release(&work.path().join("other"), &[elsewhere]);
    let (no_build, _) = serve(&store, other, None, &clock).await;
    let closed = {
        let l = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        format!(
            "http://{}:{}",
            bridge_gateway(),
            l.local_addr().unwrap().port()
        )
    };
    let (down, _) = serve(&store, releases.clone(), Some(closed.clone()), &clock).await;

    let staff = user(&store, "staff@example.com", Role::Superadmin).await;
    let owner = user(&store, "owner@example.com", Role::CommunityHost).await;
    publish_operator_keys(&state, &staff).await;
    // Expired: minted an hour and a minute ago (the clock moves on after).
    let expired = token(&state, &staff, "linux-test").await;
    clock.advance(chrono::Duration::minutes(61));
    let good = token(&state, &staff, "linux-test").await;
    let spark = token(&state, &owner, "gb10-spark-1").await;
    // Spent: redeemed by another box.
    let spent = token(&state, &staff, "linux-test").await;
    let answer = reqwest::Client::new()
        .post(format!("{server}/api/enroll"))
        .bearer_auth(&spent)
        .json(&EnrollRequest {
            node: NodeReport {
                gpu_model: None,
                gpu_count: None,
                gpu_mem_mib: None,
                arch: Some(arch.clone()),
                os_id: Some("debian".into()),
                os_version: Some("12".into()),
                driver_version: None,
                machine_id: Some("another-box".into()),
                hardware_id: Some("another-box".into()),
                node_index: 0,
                rails: Vec::new(),
            },
            peers: Vec::new(),
        })
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200, "{}", answer.text().await.unwrap());
    let unknown = SecretToken::generate(TokenKind::Enrollment)
        .expose()
        .to_owned();
    let cut_short = good[..good.len() - 9].to_owned();
    let mistyped = {
        let mut t = good.clone().into_bytes();
        let i = "byo_enr_".len() + 3;
        t[i] = if t[i] == b'a' { b'b' } else { b'a' };
        String::from_utf8(t).unwrap()
    };
    assert!(left_behind(&host).is_empty(), "a fresh host holds no agent");

    let server_refusal = "byo-agent: the server refused this token: this enrolment token is not valid: it may be mistyped, already used or expired.";
    let failed = |code: i32| {
        format!("install.sh: enrolment failed (byo-agent exit {code}); nothing was installed")
    };

    let ran = one_liner(&host, &server, &good, Some("nobody"));
    refused(&host, "not root", &ran, 1, &["install.sh: run as root"]);

    let ran = one_liner(&host, &server, "", None);
    refused(
        &host,
        "no token",
        &ran,
        2,
        &["install.sh: no token: pass --token or --token-file"],
    );

    for (case, t) in [("cut short", &cut_short), ("mistyped", &mistyped)] {
        let ran = one_liner(&host, &server, t, None);
        refused(
            &host,
            case,
            &ran,
            4,
            &[
                "byo-agent: this is not a whole enrolment token (checked on this machine, before any call to the server)",
                &failed(4),
            ],
        );
    }

    for (case, t) in [
        ("unknown", &unknown),
        ("spent", &spent),
        ("expired", &expired),
    ] {
        let ran = one_liner(&host, &server, t, None);
        refused(&host, case, &ran, 3, &[server_refusal, &failed(3)]);
    }

    let ran = one_liner(&host, &server, &spark, None);
    refused(
        &host,
        "not the profile's hardware",
        &ran,
        5,
        &[
            "byo-agent: the server turned this machine away: ",
            "gpu",
            &failed(5),
        ],
    );

    let ran = one_liner(&host, &down, &good, None);
    refused(
        &host,
        "server unreachable",
        &ran,
        6,
        &[&format!("install.sh: could not reach {closed}")],
    );

    let ran = one_liner(&host, &no_build, &good, None);
    refused(
        &host,
        "no build for this arch",
        &ran,
        7,
        &[&format!("install.sh: no agent build for {arch}")],
    );

    // Step 123's refusals (docs/pairs.md): a pair's one-liner with no terminal to ask node1's
    // login on and no file, a login file others can read, a node count that is no count.
    let pair = |extra: &str| {
        format!("curl -fsSL {server}/install.sh | bash -s -- --token '{good}' --peer {extra}")
    };
    let ran = onboard::on_terminal(&host, &pair("--nodes=2"), None);
    refused(
        &host,
        "a pair with no terminal and no login file",
        &ran,
        2,
        &["install.sh: no terminal to ask node1's login on: pass --peer-login-file FILE"],
    );
    host.sh_ok("printf 'owner\\nsecret\\n' > /root/node1-login && chmod 644 /root/node1-login");
    let ran = onboard::on_terminal(
        &host,
        &pair("--nodes=2 --peer-login-file /root/node1-login"),
        None,
    );
    refused(
        &host,
        "a login file others can read",
        &ran,
        2,
        &["--peer-login-file must be a file owned by root and readable by root alone"],
    );
    assert!(!ran.terminal.contains("secret"), "{}", ran.terminal);
    host.sh_ok("rm /root/node1-login");
    let ran = onboard::on_terminal(&host, &pair("--nodes=one"), None);
    refused(
        &host,
        "a node count that is no count",
        &ran,
        2,
        &["install.sh: --nodes must be the host's number of machines (2 or more), not 'one'"],
    );

    // Step 123 on a terminal: with no login file, install.sh asks for node1's login on the
    // terminal it runs on; the user is echoed and the password is not. The login is kept
    // root-only for the probe; with no cable here the enrolment gives up after its retries,
    // and the login goes with everything else the run made.
    let pair_token = token(&state, &staff, "linux-test-2").await;
    let ran = typed_on_a_terminal(
        &host,
        &format!(
            "curl -fsSL {server}/install.sh | bash -s -- --token '{pair_token}' --peer --nodes=2"
        ),
        &[
            ("user: ", "owner"),
            ("password for owner on node1: ", "pa55-typed"),
        ],
    );
    assert!(
        ran.terminal.contains(&format!(
            "node1's login (it stays on this machine, is deleted once node1 is set up, and is never sent to {server})"
        )),
        "{}",
        ran.terminal
    );
    assert!(
        !ran.terminal.contains("pa55-typed"),
        "the password was echoed:\n{}",
        ran.terminal
    );
    refused(
        &host,
        "a pair on a terminal, with no cable to probe",
        &ran,
        ran.code.filter(|c| *c != 0).unwrap_or(-1),
        &["install.sh: enrolment failed", "nothing was installed"],
    );

    // After every refusal, the good token still enrols.
    let ran = one_liner(&host, &server, &good, None);
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    assert!(
        ran.terminal.contains("enrolled as spark-") && ran.terminal.contains("byo agent installed"),
        "{}",
        ran.terminal
    );
    assert!(host.read("/etc/enverge/credentials.json").is_some());
    assert!(host.read("/etc/enverge/enrol-token").is_none());
    let units = host.sh_ok("systemctl list-unit-files 'enverge*' --no-legend");
    assert!(
        units.contains("enverge-agent-prepare.service") && units.contains("enverge-agent.service"),
        "{units}"
    );
    // Preparation finds the kept credentials and goes straight on (no token is left for it
    // to enrol with). Stopped there: preparing is another test's work.
    let started = Instant::now();
    let journal = loop {
        let j = host.sh_ok("journalctl -u enverge-agent-prepare --no-pager -o cat");
        if j.contains("preparing spark-") || started.elapsed() > Duration::from_secs(60) {
            break j;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    host.sh_ok("systemctl stop enverge-agent-prepare.service enverge-agent.service");
    assert!(
        journal.contains("preparing spark-") && !journal.contains("enrolled as"),
        "{journal}"
    );

    // The server gone between the download and the enrolment: the agent's own answer,
    // which install.sh passes on (there with --retry-every 5 --give-up-after 20).
    let out = host.exec(&[
        "/usr/local/bin/byo-agent",
        "enroll",
        "--server",
        &closed,
        "--token",
        &unknown,
        "--root",
        "/tmp/elsewhere",
        "--retry-every",
        "1",
        "--give-up-after",
        "1",
    ]);
    let said = String::from_utf8_lossy(&out.stderr);
    eprintln!(
        "--- byo-agent enroll against {closed} exited {:?}:\n{said}",
        out.status.code()
    );
    assert_eq!(out.status.code(), Some(6), "{said}");
    assert!(
        said.contains(&format!("byo-agent: could not reach {closed}: "))
            && said.contains("Connection refused"),
        "{said}"
    );
    assert!(
        host.read("/tmp/elsewhere/etc/enverge/credentials.json")
            .is_none()
    );

    // An upgrade (already enrolled) is as before: no token needed, the credentials reused;
    // a token given anyway is not used, and the owner is told so (issue #42, 8).
    let before = host.read("/etc/enverge/credentials.json");
    let ran = one_liner(&host, &server, "byo_enr_not-used", None);
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    assert!(
        ran.terminal
            .contains("This machine is already enrolled; reusing its credentials.")
            && ran.terminal.contains("The token given was not used"),
        "{}",
        ran.terminal
    );
    host.sh_ok("systemctl stop enverge-agent-prepare.service enverge-agent.service");
    assert_eq!(host.read("/etc/enverge/credentials.json"), before);

    // Issue #14, 2: what the installer runs is signed by the release key the first install
    // pinned (the one install.sh carried). A signed new build upgrades, keeping .previous.
    let pinned = host
        .read("/etc/enverge/release-key")
        .expect("the first install pinned the key");
    assert_eq!(
        String::from_utf8(pinned).unwrap().trim(),
        support::release_public().trim()
    );
    let agent = std::fs::read(support::sibling("byo-agent")).unwrap();
    let build = |mark: &str| {
        let mut b = agent.clone();
        b.extend_from_slice(format!("\nbyo test build: {mark}\n").as_bytes());
        b
    };
    support::publish_agent(&releases, &arch, &build("signed"), support::release_key());
    let ran = one_liner(&host, &server, "", None);
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    host.sh_ok("systemctl stop enverge-agent-prepare.service enverge-agent.service");
    let installed = || {
        host.sh_ok(
            "cd /usr/local/bin && sha256sum byo-agent byo-agent.previous 2>&1; ls -l --time-style=+%s byo-agent*",
        )
    };
    let kept = installed();
    assert!(kept.contains("byo-agent.previous"), "{kept}");
    let other_key = byo_core::keylist_testing::private_key();
    let refused_build = |case: &str, ran: &Ran, says: &str| {
        assert_eq!(ran.code, Some(8), "{case}: {}", ran.terminal);
        assert!(
            ran.terminal.contains(says),
            "{case}: {says:?} not in:\n{}",
            ran.terminal
        );
        assert!(!ran.terminal.contains("byo agent installed"), "{case}");
        assert_eq!(
            installed(),
            kept,
            "{case}: the running build and .previous are untouched"
        );
    };
    let not_signed =
        "is not signed by the release key pinned on this machine (/etc/enverge/release-key)";
    // Tampered: new bytes, their own sha256 beside them, the old build's signature.
    let tampered = build("tampered");
    let good_sig = std::fs::read(releases.join(format!("byo-agent-{arch}.sig"))).unwrap();
    support::publish_agent(&releases, &arch, &tampered, support::release_key());
    std::fs::write(releases.join(format!("byo-agent-{arch}.sig")), &good_sig).unwrap();
    refused_build(
        "tampered binary",
        &one_liner(&host, &server, "", None),
        not_signed,
    );
    // Signed by another key (as a server that named that key would serve it).
    support::publish_agent(&releases, &arch, &build("other key"), &other_key);
    refused_build(
        "wrong key",
        &one_liner(&host, &server, "", None),
        not_signed,
    );
    // A signature that is not one.
    support::publish_agent(
        &releases,
        &arch,
        &build("bad signature"),
        support::release_key(),
    );
    std::fs::write(
        releases.join(format!("byo-agent-{arch}.sig")),
        "-----BEGIN SSH SIGNATURE-----\nbm90IGEgc2lnbmF0dXJl\n-----END SSH SIGNATURE-----\n",
    )
    .unwrap();
    refused_build(
        "wrong signature",
        &one_liner(&host, &server, "", None),
        not_signed,
    );
    // No signature at all.
    std::fs::remove_file(releases.join(format!("byo-agent-{arch}.sig"))).unwrap();
    refused_build(
        "no signature",
        &one_liner(&host, &server, "", None),
        &format!("offers byo-agent-{arch} without its signature (.sig); nothing was installed"),
    );

    // Issue #36, 2: what `byo fleet upgrade` runs is the host's own verifier, never a script
    // the server serves. A compromised server at the address this host enrolled with: its
    // install.sh has no check at all (it would leave /tmp/pwned), and its build is signed by
    // a key of its own.
    let hostile_dir = work.path().join("hostile");
    std::fs::create_dir_all(&hostile_dir).unwrap();
    support::publish_agent(&hostile_dir, &arch, &build("hostile"), &other_key);
    let (hostile, asked) = hostile_server(hostile_dir).await;
    let enrolled_with = host.read("/etc/enverge/server").unwrap();
    host.write(
        "/etc/enverge/server",
        format!("{hostile}\n").as_bytes(),
        0o644,
    );
    let verifier =
        |build: &str| onboard::on_terminal(&host, &byo::fleet::upgrade_command(build), None);
    // The build the fleet names, signed by the release key and served by the real server.
    let verified = build("verified");
    let verified_sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&verified))
    };
    let verified_id = &verified_sha[..12];
    support::publish_agent(&releases, &arch, &verified, support::release_key());
    let ran = verifier(verified_id);
    refused_build("a compromised server", &ran, not_signed);
    assert!(!ran.terminal.contains("Upgraded"), "{}", ran.terminal);
    assert!(
        host.read("/tmp/pwned").is_none(),
        "no script of the server's ran"
    );
    assert_eq!(
        asked.lock().unwrap().clone(),
        [
            format!("/agent/byo-agent-{arch}"),
            format!("/agent/byo-agent-{arch}.sig")
        ],
        "the host fetched the build and its signature, never install.sh"
    );
    host.write("/etc/enverge/server", &enrolled_with, 0o644);
    // The real server, but not the build the operator named: nothing changes (exit 10).
    let ran = verifier("000000000000");
    assert_eq!(ran.code, Some(10), "{}", ran.terminal);
    assert!(
        ran.terminal.contains(&format!(
            "serves build {verified_id} for {arch}, not 000000000000; nothing was installed"
        )),
        "{}",
        ran.terminal
    );
    assert_eq!(installed(), kept, "another build: nothing replaced");
    // The build named, signed by the pinned key: installed, detached, the running build kept
    // as .previous, the new build's units written, preparation started (not handed over yet).
    let running = host.sh_ok("sha256sum /usr/local/bin/byo-agent | cut -d' ' -f1");
    let ran = verifier(verified_id);
    host.sh_ok("systemctl stop enverge-agent-prepare.service enverge-agent.service");
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    assert!(
        ran.terminal.contains(&format!(
            "Fetched build {verified_id} for {arch} from {server}"
        )) && ran
            .terminal
            .contains(&format!("Upgraded to build {verified_id}.")),
        "{}",
        ran.terminal
    );
    let now = installed();
    assert!(
        now.contains(&format!("{verified_sha}  byo-agent\n"))
            && now.contains(&format!("{}  byo-agent.previous", running.trim())),
        "{now}"
    );
    assert!(
        host.sh_ok("ls -d /run/enverge-install.* 2>/dev/null || true")
            .trim()
            .is_empty(),
        "the staging directory is gone"
    );
    eprintln!("all cases in {:.1} s", t0.elapsed().as_secs_f64());
}

/// A compromised control plane: `install.sh` without any check (it leaves /tmp/pwned on the
/// host that runs it) and `/agent/…` from `dir`; every path asked for is recorded.
async fn hostile_server(
    dir: std::path::PathBuf,
) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    type Asked = std::sync::Arc<std::sync::Mutex<Vec<String>>>;
    let asked = Asked::default();
    let app = axum::Router::new()
        .route(
            "/install.sh",
            axum::routing::get(
                |State((asked, _)): State<(Asked, std::path::PathBuf)>| async move {
                    asked.lock().unwrap().push("/install.sh".to_owned());
                    "#!/bin/sh\ntouch /tmp/pwned\n"
                },
            ),
        )
        .route(
            "/agent/{file}",
            axum::routing::get(
                |State((asked, dir)): State<(Asked, std::path::PathBuf)>,
                 Path(file): Path<String>| async move {
                    asked.lock().unwrap().push(format!("/agent/{file}"));
                    std::fs::read(dir.join(&file)).map_err(|_| StatusCode::NOT_FOUND)
                },
            ),
        )
        .with_state((asked.clone(), dir));
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let url = format!(
        "http://{}:{}",
        bridge_gateway(),
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, asked)
}

/// A host whose preparation failed recovers with nobody at it: the one list published at
/// its enrolment had expired, so `operator-access` fails (operators could not log in) and
/// the owner's page says so in their words; an operator publishes a new list, and the
/// prepare unit's next try on its own schedule fetches it, completes, and starts serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preparation_stopped_by_an_expired_list_recovers_on_its_own_once_a_new_one_is_published()
{
    use byo_core::render::units::PREPARE_RETRY_SECS;
    let Some(host) = HostContainer::launch("byo-recover") else {
        return;
    };
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let db = byo_db::testing::sqlite().await;
    let store = db.store.clone();
    let work = tempfile::tempdir().unwrap();
    let arch = host.sh_ok("uname -m").trim().to_owned();
    // The server's clock starts a list's validity and an hour before now: the list it
    // publishes then has expired an hour ago by the time the host reads it.
    let validity = chrono::Duration::days(Config::default().operator_keys.validity_days);
    let back = validity + chrono::Duration::hours(1);
    let clock = Clock::manual(chrono::Utc::now() - back);
    let releases = release(&work.path().join("releases"), &[&arch]);
    let (server, state) = serve(&store, releases, None, &clock).await;
    let staff = user(&store, "staff@example.com", Role::Superadmin).await;
    publish_operator_keys(&state, &staff).await;
    clock.advance(back);
    let provisioned = byo_server::app::host_provision::provision(
        &state,
        &staff,
        &ProvisionRequest {
            profile_id: "linux-test".into(),
        },
    )
    .await
    .unwrap();
    let host_id = provisioned.host_id.clone();
    let session = SecretToken::generate(TokenKind::Session);
    let now = chrono::Utc::now();
    store
        .create_session(
            &session.hash(),
            &staff.user.sub,
            now,
            now + chrono::Duration::hours(2),
        )
        .await
        .unwrap();
    let owners_view = async || {
        reqwest::Client::new()
            .get(format!("{server}/hosts/{host_id}/progress"))
            .header("cookie", format!("byo_session={}", session.expose()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    };
    // relay-peer brings wg0 up through wireguard-go here, which needs the tun device.
    let tun = std::process::Command::new("lxc")
        .args(["config", "device", "add", host.name(), "tun", "unix-char"])
        .arg("path=/dev/net/tun")
        .output()
        .unwrap();
    assert!(tun.status.success(), "{tun:?}");
    let journal = || {
        host.sh_ok("journalctl -u enverge-agent-prepare -u enverge-agent -u enverge-agent-rollback --no-pager -o cat")
    };

    let ran = one_liner(&host, &server, &provisioned.token, None);
    assert_eq!(ran.code, Some(0), "{}", ran.terminal);
    phase("the one-liner ran");

    // The first attempt stops at operator-access, and says so to the backend and the owner.
    let started = Instant::now();
    let failed = loop {
        let h = store.host(&host_id).await.unwrap().unwrap();
        if let Some(p) = h.prepare_state.as_ref().map(|p| p.0.clone())
            && p.failed()
        {
            break p;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no failure was reported ({:?}):\n{}",
            h.prepare_state,
            journal()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    phase("operator-access failed");
    assert_eq!(failed.step, "operator-access", "{failed:?}");
    assert!(
        failed
            .error
            .as_deref()
            .unwrap()
            .contains("no operator-key list is kept on this host"),
        "{failed:?}"
    );
    let said = journal();
    assert!(
        said.contains("the published operator-key list was not kept (refused: the list expired at"),
        "the fetched list was refused as a push's would be:\n{said}"
    );
    let view = owners_view().await;
    for says in [
        "byo's operators cannot log in to this machine yet: the list of their access keys is missing or has expired.",
        "Nothing for you to do: we fix this on our side.",
        &format!("Preparation tries again on its own about every {PREPARE_RETRY_SECS} seconds"),
    ] {
        assert!(
            view.contains(says),
            "{says:?} is not on the owner's page:\n{view}"
        );
    }
    let active = host.sh("systemctl is-active enverge-agent.service");
    assert_ne!(
        String::from_utf8_lossy(&active.stdout).trim(),
        "active",
        "serving waits for preparation"
    );

    // An operator publishes a new list; nobody touches the host.
    publish_operator_keys(&state, &staff).await;
    phase("list v2 published");
    let started = Instant::now();
    loop {
        let h = store.host(&host_id).await.unwrap().unwrap();
        if h.prepared_at.is_some() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(PREPARE_RETRY_SECS + 150),
            "preparation did not recover ({:?}):\n{}",
            h.prepare_state,
            journal()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    phase("prepared");
    // Its Wants= starts serving once the retry succeeded.
    let started = Instant::now();
    loop {
        let out = host.sh("systemctl is-active enverge-agent.service");
        if String::from_utf8_lossy(&out.stdout).trim() == "active" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "serving did not start after the retry:\n{}\n{}",
            host.sh_ok("systemctl status enverge-agent-prepare enverge-agent --no-pager || true"),
            journal()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    phase("serving");
    let said = journal();
    assert!(
        said.contains("operator-key list version 2 (2 keys) is the published one; kept")
            && said.contains("prepared: the credentials are handed to serving"),
        "{said}"
    );
    // The retry was the unit's own (no human re-run). Each failed attempt failed serving's
    // start job too, which fires its OnFailure=; the rollback, which is for a serving that
    // will not stay up, saw preparation had not handed over and restored nothing.
    let restarts = host.sh_ok("systemctl show -p NRestarts --value enverge-agent-prepare.service");
    assert!(
        restarts.trim().parse::<u32>().unwrap() >= 1,
        "NRestarts={restarts}"
    );
    let rollback = host.sh_ok("journalctl -u enverge-agent-rollback --no-pager -o cat -q");
    assert!(
        rollback.contains("nothing to roll back")
            && !rollback.contains("restored")
            && !rollback.contains("Failed"),
        "the rollback:\n{rollback}"
    );
    let held = host.sh_ok("/usr/local/bin/byo-agent operator-keys show");
    assert!(held.contains("version 2 "), "{held}");
    let view = owners_view().await;
    assert!(
        view.contains("prepared: waiting for an operator") && !view.contains("tries again"),
        "{view}"
    );
    eprintln!("recovered in {:.1} s", t0.elapsed().as_secs_f64());
}
