//! The customer's command line (issue #43, 2 and 4) against `byo up`, as a person runs it:
//! `byo login` with a token from the account's API, keys added from a real `ssh-keygen`
//! file, a create that queues (byo up has no host) followed with `--wait` and cancelled from
//! a second terminal, the queue and bookings, and every refusal with its exit code and
//! nothing changed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use byo_wire::enroll::OwnerHostView;
use byo_wire::vm::{InstanceQueued, InstanceView, QueuedView, SshKeyView};
use serde_json::json;

use crate::support::{ByoUp, byo_cli as byo, byo_command};

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// Exit 0, its standard output.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "byo failed: {}\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The exit code and standard error of a command that must fail.
fn refused(out: Output) -> (i32, String) {
    assert!(
        !out.status.success(),
        "byo succeeded: {}",
        text(&out.stdout)
    );
    (out.status.code().unwrap_or(-1), text(&out.stderr))
}

fn json<T: serde::de::DeserializeOwned>(out: Output) -> T {
    let stdout = ok(out);
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"))
}

/// A token of `scope` made through the account's session, as the account page makes one.
async fn token(up: &ByoUp, name: &str, scope: &str) -> String {
    let client = reqwest::Client::builder()
        .cookie_store(true)
        .build()
        .unwrap();
    let login = client
        .post(format!("{}/api/auth/login", up.url))
        .json(&json!({"email": up.email, "password": up.password}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
    let made: serde_json::Value = client
        .post(format!("{}/api/me/tokens", up.url))
        .json(&json!({"name": name, "scope": scope}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    made["token"].as_str().expect("a token").to_owned()
}

/// A real key pair from `ssh-keygen` in `dir`; the public file and its fingerprint.
fn keygen(dir: &Path, comment: &str) -> (PathBuf, String) {
    let private = dir.join(comment);
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
        .arg(&private)
        .status()
        .expect("ssh-keygen runs");
    assert!(made.success());
    let public = private.with_extension("pub");
    let listed = Command::new("ssh-keygen")
        .arg("-lf")
        .arg(&public)
        .output()
        .unwrap();
    let fingerprint = text(&listed.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_owned();
    (public, fingerprint)
}

fn mode(path: &Path) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions()) & 0o777
}

#[tokio::test]
async fn a_customer_logs_in_keeps_keys_and_follows_a_queued_create_from_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let up = ByoUp::on_loopback(&dir.path().join("data"), dir.path());
    let config = dir.path().join("config");
    let instances = token(&up, "laptop", "instances").await;

    // Nothing is written for what is not a token, nor for one the server refuses.
    let (code, err) = refused(byo(&config, &["login", "--server", &up.url], "hunter2\n"));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not an API token"), "{err}");
    let forged = format!("{}x", &instances[..instances.len() - 1]);
    let (code, err) = refused(byo(&config, &["login", "--server", &up.url], &forged));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("401"), "the server's refusal: {err}");
    assert!(!config.join("credentials.json").exists());
    // A token goes over plain http only to this machine.
    let (code, err) = refused(byo(
        &config,
        &["login", "--server", "http://byo.example.com"],
        &instances,
    ));
    assert_eq!((code, err.contains("only over https")), (1, true), "{err}");

    let said = ok(byo(&config, &["login", "--server", &up.url], &instances));
    assert!(said.contains(&up.email), "{said}");
    let kept = config.join("credentials.json");
    assert_eq!(mode(&kept), 0o600);
    assert_eq!(mode(&config), 0o700);
    assert!(std::fs::read_to_string(&kept).unwrap().contains(&instances));

    // Keys: a real public key added, named after its comment; a private key refused unsent.
    let (public, fingerprint) = keygen(dir.path(), "ana-laptop");
    let (code, err) = refused(byo(
        &config,
        &[
            "ssh-keys",
            "add",
            &public.with_extension("").to_string_lossy(),
        ],
        "",
    ));
    assert_eq!((code, err.contains("private key")), (1, true), "{err}");
    assert!(ok(byo(&config, &["ssh-keys", "list"], "")).contains("No SSH keys yet"));
    ok(byo(
        &config,
        &["ssh-keys", "add", &public.to_string_lossy()],
        "",
    ));
    let keys: Vec<SshKeyView> = json(byo(&config, &["ssh-keys", "list", "--json"], ""));
    assert_eq!(keys.len(), 1);
    assert_eq!(
        (keys[0].name.as_str(), keys[0].fingerprint.as_str()),
        ("ana-laptop", fingerprint.as_str())
    );
    let table = ok(byo(&config, &["ssh-keys", "list"], ""));
    assert!(
        table.starts_with("NAME") && table.contains(&fingerprint),
        "{table}"
    );

    // No host in byo up: the create queues, and says so; --key may be left out with one key.
    let queued: InstanceQueued = json(byo(
        &config,
        &["instances", "create", "--gpu", "linux-test", "--json"],
        "",
    ));
    assert_eq!(queued.queued.position, 1);
    let open: Vec<QueuedView> = json(byo(&config, &["queue", "list", "--json"], ""));
    assert_eq!(open, vec![queued.queued.clone()]);
    // Keep waiting, from the terminal: the lapse moves to 72 h from now.
    let waits = ok(byo(&config, &["queue", "extend", &queued.queued.id], ""));
    assert!(
        waits.contains("keeps waiting until") && waits.contains("place 1 in line"),
        "{waits}"
    );
    let open: Vec<QueuedView> = json(byo(&config, &["queue", "list", "--json"], ""));
    assert!(open[0].expires_at >= queued.queued.expires_at, "{open:?}");
    ok(byo(&config, &["queue", "cancel", &queued.queued.id], ""));
    assert!(ok(byo(&config, &["queue", "list"], "")).contains("Nothing queued"));

    // --wait follows a queued create with its place in line, and ends when it ends: here
    // cancelled from a second terminal, which it reports and exits 1.
    let mut waiting = byo_command(
        &config,
        &[
            "instances",
            "create",
            "--gpu",
            "linux-test",
            "--key",
            "ana-laptop",
            "--wait",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let stderr = waiting.stderr.take().unwrap();
    let progress = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut seen = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap();
            seen.push_str(&line);
            seen.push('\n');
        }
        seen
    });
    let open = crate::support::platform::until(
        "the --wait create queued",
        std::time::Duration::from_secs(20),
        async || {
            let open: Vec<QueuedView> = json(byo(&config, &["queue", "list", "--json"], ""));
            (!open.is_empty()).then_some(open)
        },
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    ok(byo(&config, &["queue", "cancel", &open[0].id], ""));
    let exit = tokio::task::spawn_blocking(move || waiting.wait().unwrap())
        .await
        .unwrap();
    let seen = progress.join().unwrap();
    assert_eq!(exit.code(), Some(1), "{seen}");
    assert!(
        seen.contains("queued for a linux-test host: place 1 in line"),
        "progress, a line per change off a terminal: {seen}"
    );
    assert!(
        seen.contains("ended without an instance: cancelled"),
        "{seen}"
    );

    // Reading: no instance, no booking; one that is not there is named.
    let none: Vec<InstanceView> = json(byo(&config, &["instances", "list", "--json"], ""));
    assert!(none.is_empty());
    let bookings: Vec<serde_json::Value> = json(byo(&config, &["bookings", "--json"], ""));
    assert!(bookings.is_empty());
    let listed: Vec<serde_json::Value> = json(byo(&config, &["bookings", "list", "--json"], ""));
    assert!(listed.is_empty(), "`bookings list` is `bookings`");
    let (code, err) = refused(byo(&config, &["bookings", "cancel", "no-such-booking"], ""));
    assert_eq!(code, 1);
    assert!(err.contains("404"), "{err}");
    let (code, err) = refused(byo(&config, &["instances", "show", "brave-otter"], ""));
    assert_eq!(code, 1);
    assert!(
        err.contains("none of your instances is named \"brave-otter\""),
        "{err}"
    );

    // Two keys: a create must say which, and nothing is queued.
    let (second, _) = keygen(dir.path(), "ana-desk");
    ok(byo(
        &config,
        &[
            "ssh-keys",
            "add",
            &second.to_string_lossy(),
            "--name",
            "desk",
        ],
        "",
    ));
    let (code, err) = refused(byo(
        &config,
        &["instances", "create", "--gpu", "linux-test"],
        "",
    ));
    assert_eq!(code, 1);
    assert!(err.contains("--key (ana-laptop, desk)"), "{err}");
    ok(byo(&config, &["ssh-keys", "rm", "desk"], ""));
    let keys: Vec<SshKeyView> = json(byo(&config, &["ssh-keys", "list", "--json"], ""));
    assert_eq!(keys.len(), 1);
    let open: Vec<QueuedView> = json(byo(&config, &["queue", "list", "--json"], ""));
    assert!(open.is_empty());

    // A read token reads and changes nothing: the server's refusal, exit 1, the key kept.
    let read = token(&up, "dashboard", "read").await;
    let reader = dir.path().join("reader");
    ok(byo(&reader, &["login", "--server", &up.url], &read));
    let (code, err) = refused(byo(&reader, &["ssh-keys", "rm", "ana-laptop"], ""));
    assert_eq!(code, 1);
    assert!(err.contains("403"), "{err}");
    let keys: Vec<SshKeyView> = json(byo(&reader, &["ssh-keys", "list", "--json"], ""));
    assert_eq!(keys.len(), 1, "nothing removed");

    // Usage is 2 (clap's); a server that does not answer is 3; logged out is 1, and says how.
    let out = byo(&config, &["instances", "create"], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    drop(up);
    let (code, err) = refused(byo(&config, &["instances", "list"], ""));
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("could not reach"), "{err}");
    assert!(ok(byo(&config, &["logout"], "")).contains("Logged out"));
    assert!(!kept.exists());
    let (code, err) = refused(byo(&config, &["instances", "list"], ""));
    assert_eq!(code, 1);
    assert!(err.contains("byo login"), "{err}");
}

#[test]
fn completions_are_scripts_their_shell_reads() {
    let dir = tempfile::tempdir().unwrap();
    let script = ok(byo(dir.path(), &["completions", "bash"], ""));
    assert!(
        script.contains("instances") && script.contains("ssh-keys"),
        "{script}"
    );
    let file = dir.path().join("byo.bash");
    std::fs::write(&file, &script).unwrap();
    let checked = Command::new("bash").arg("-n").arg(&file).output().unwrap();
    assert!(checked.status.success(), "{}", text(&checked.stderr));
    let (code, _) = refused(byo(dir.path(), &["completions", "tcsh"], ""));
    assert_eq!(code, 2);
}

#[tokio::test]
async fn an_owner_adds_a_gpu_and_reads_it_in_the_pages_words_from_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let up = ByoUp::on_loopback(&dir.path().join("data"), dir.path());
    let config = dir.path().join("config");
    ok(byo(
        &config,
        &["login", "--server", &up.url],
        &token(&up, "rentals", "instances").await,
    ));
    // Out of its scope: the server's refusal, and no GPU added.
    let (code, err) = refused(byo(
        &config,
        &["hosts", "add", "--profile", "linux-test"],
        "",
    ));
    assert_eq!(code, 1);
    assert!(err.contains("403"), "{err}");
    let (code, err) = refused(byo(&config, &["hosts", "list"], ""));
    assert_eq!(code, 1);
    assert!(err.contains("does not reach GET /api/hosts"), "{err}");

    ok(byo(
        &config,
        &["login", "--server", &up.url],
        &token(&up, "machines", "hosts").await,
    ));
    let none: Vec<OwnerHostView> = json(byo(&config, &["hosts", "list", "--json"], ""));
    assert!(none.is_empty(), "the refused add added nothing");
    let said = ok(byo(
        &config,
        &["hosts", "add", "--profile", "linux-test"],
        "",
    ));
    assert!(
        said.contains("curl -fsSL") && said.contains("install.sh"),
        "{said}"
    );
    let mine: Vec<OwnerHostView> = json(byo(&config, &["hosts", "list", "--json"], ""));
    assert_eq!(mine.len(), 1);
    let slug = mine[0].slug.clone().expect("a slug");
    assert!(
        mine[0]
            .state
            .starts_with("waiting for the command (expires "),
        "{mine:?}"
    );
    assert!(mine[0].may_cancel && !mine[0].may_stop);
    let table = ok(byo(&config, &["hosts", "list"], ""));
    assert!(
        table.contains(&slug) && table.contains("waiting for the command"),
        "{table}"
    );
    let shown = ok(byo(&config, &["hosts", "show", &slug], ""));
    assert!(
        shown.contains("linux-test") && shown.contains("waiting for the command"),
        "{shown}"
    );

    // Not hosting yet: stopping is the server's refusal, and nothing changes.
    let (code, err) = refused(byo(&config, &["hosts", "stop-hosting", &slug], ""));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("never enrolled"), "{err}");
    let after: Vec<OwnerHostView> = json(byo(&config, &["hosts", "list", "--json"], ""));
    assert_eq!(after, mine);
    // Never run: cancelled from the terminal, and then nothing more to cancel.
    let said = ok(byo(&config, &["hosts", "cancel", &slug], ""));
    assert!(said.starts_with(&format!("Cancelled {slug}")), "{said}");
    let after: Vec<OwnerHostView> = json(byo(&config, &["hosts", "list", "--json"], ""));
    assert!(
        !after[0].may_cancel && after[0].host_id.is_none(),
        "{after:?}"
    );
    let (code, err) = refused(byo(&config, &["hosts", "cancel", &slug], ""));
    assert_eq!(code, 1, "{err}");
    let (code, err) = refused(byo(&config, &["hosts", "show", "spark-nope"], ""));
    assert_eq!(code, 1);
    assert!(
        err.contains("none of your GPUs is named \"spark-nope\""),
        "{err}"
    );
}
