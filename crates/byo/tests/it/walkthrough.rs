//! The README's "whole flow by hand", followed literally on real parts: the commands are
//! read out of README.md's code block and run as written (the build's `byo` for
//! `target/release/byo`, a free port for 8080, a fresh container name), and each numbered
//! step is done in headless Chromium the way a person would — sign in, *Your GPUs*, add a
//! `linux-test` GPU, copy the one-liner and paste it into the simulated Spark, watch
//! preparation, activate at /admin/hosts, add an SSH key and create at /instances, copy the
//! `ssh root@…` the row prints and run it, stop, start, delete — then the same rental from
//! the terminal with `byo` and a token made on /account. A screenshot of every step is kept under `target/screenshots/walkthrough/`. When the README and the product drift
//! apart (a command, a page name, a profile, the connect line), this fails.

use crate::chromium;
use crate::host_container;
use crate::relay_support;
use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use chromium::{Browser, components};
use fantoccini::{Client, Locator};
use support::ByoUp;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The README's by-hand section: its commands (comments cut) and its numbered steps.
struct ByHand {
    commands: Vec<String>,
    steps: String,
}

fn readme_by_hand() -> ByHand {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let section = readme
        .split_once("**The whole flow by hand")
        .expect("README.md has the whole flow by hand")
        .1;
    let section = section.split("**Run every test**").next().unwrap();
    let (_, rest) = section.split_once("```sh\n").expect("its commands block");
    let (block, steps) = rest.split_once("```").unwrap();
    let commands = block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    ByHand {
        commands,
        steps: steps.to_owned(),
    }
}

fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `byo up` as the README starts it (the build's `byo` for `target/release/byo`, a free port
/// for 8080), in `dir`.
fn start_up(command: &str, dir: &Path) -> ByoUp {
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(
        &words[..3],
        ["target/release/byo", "up", "--listen"],
        "README: {command}"
    );
    let listen = words[3]
        .strip_suffix(":8080")
        .unwrap_or_else(|| panic!("README listens on port 8080: {command}"));
    let listen = format!("{listen}:0");
    let mut args = vec!["--listen", listen.as_str()];
    args.extend(&words[4..]);
    let up = ByoUp::start(&args, dir);
    eprintln!("--- byo up printed:\n{}", up.printed);
    up
}

/// The simulated Spark `scripts/simulated-spark` made, deleted (its own `--delete`) at the end.
struct Spark {
    name: String,
    address: String,
    /// The line it printed for running the one-liner, `<the one-liner>` still in it.
    exec_line: String,
}

impl Drop for Spark {
    fn drop(&mut self) {
        let _ = Command::new(repo().join("scripts/simulated-spark"))
            .args([&self.name, "--delete"])
            .output();
    }
}

fn simulated_spark(command: &str, name: &str) -> Spark {
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(words.len(), 2, "README: {command}");
    assert_eq!(words[0], "scripts/simulated-spark", "README: {command}");
    let _ = Command::new(repo().join(words[0]))
        .args([name, "--delete"])
        .output();
    // Deleted at the end whatever happens, even when what it printed does not parse.
    let mut spark = Spark {
        name: name.to_owned(),
        address: String::new(),
        exec_line: String::new(),
    };
    let out = Command::new(repo().join(words[0]))
        .arg(name)
        .current_dir(repo())
        .output()
        .unwrap();
    let printed = output_text(&out);
    assert!(out.status.success(), "{command}:\n{printed}");
    eprintln!("--- {command} printed:\n{printed}");
    // lxc's progress lines end in a carriage return; a terminal overwrites them.
    let lines = || printed.split(['\n', '\r']);
    let address = lines()
        .find_map(|l| l.strip_prefix(&format!("{name} is up at ")))
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no address printed:\n{printed}"))
        .to_owned();
    assert!(
        address.parse::<std::net::Ipv4Addr>().is_ok(),
        "one IPv4 address: {address:?}"
    );
    let exec_line = lines()
        .map(str::trim)
        .find(|l| l.starts_with("lxc exec") && l.contains("<the one-liner>"))
        .unwrap_or_else(|| panic!("no one-liner line printed:\n{printed}"))
        .to_owned();
    spark.address = address;
    spark.exec_line = exec_line;
    spark
}

/// Deletes the relay containers of one `byo up` (by their name prefix) however the test ends.
struct RemoveRelays(String);

impl Drop for RemoveRelays {
    fn drop(&mut self) {
        let listed = Command::new("lxc")
            .args(["list", "--format", "csv", "-c", "n"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for name in listed.lines().filter(|n| n.starts_with(&self.0)) {
            let _ = Command::new("lxc")
                .args(["delete", "--force", name])
                .output();
        }
    }
}

/// One person's session in the browser, with the numbered screenshots of the walk.
struct Person {
    browser: Browser,
    base: String,
    shots: std::cell::Cell<u32>,
}

impl Person {
    fn c(&self) -> &Client {
        &self.browser.client
    }

    async fn shot(&self, what: &str) {
        let n = self.shots.get() + 1;
        self.shots.set(n);
        let path = self
            .browser
            .screenshot(&format!("walkthrough/{n:02}-{what}.png"))
            .await;
        eprintln!("    screenshot {}", path.display());
    }

    async fn goto(&self, path: &str) {
        self.c()
            .goto(&format!("{}{path}", self.base))
            .await
            .unwrap();
    }

    async fn click(&self, css: &str) {
        self.c()
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css} is not on the page: {e}"))
            .click()
            .await
            .unwrap();
    }

    /// Follow a link the way a person does: by its words.
    async fn follow(&self, words: &str) {
        self.c()
            .find(Locator::LinkText(words))
            .await
            .unwrap_or_else(|e| panic!("no link reads {words:?}: {e}"))
            .click()
            .await
            .unwrap();
    }

    async fn type_into(&self, css: &str, text: &str) {
        let e = self.c().find(Locator::Css(css)).await.unwrap();
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    async fn text(&self, css: &str) -> Option<String> {
        self.browser.text(css).await
    }

    /// Wait for `css`'s text to satisfy `ok`, reloading when `reload` (pages that do not
    /// update themselves) and otherwise leaving the page's own script to change it.
    async fn wait_text(
        &self,
        css: &str,
        ok: impl Fn(&str) -> bool,
        within: Duration,
        reload: bool,
        what: &str,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            let text = self.text(css).await;
            if let Some(t) = &text
                && ok(t)
            {
                return t.clone();
            }
            if Instant::now() > deadline {
                self.shot("stuck").await;
                let body = self.text("body").await;
                panic!("{what}: {css} shows {text:?}; the page reads:\n{body:?}");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            if reload {
                // Open the page again (a GET), as a person would; a refresh of a form's
                // answer would send the form again.
                let mut url = self.c().current_url().await.unwrap();
                url.set_fragment(None);
                self.c().goto(url.as_str()).await.unwrap();
            }
        }
    }

    /// Follow "Sign in", give `email` and `password`, and see the page name who is signed in.
    async fn sign_in(&self, email: &str, password: &str) {
        self.follow("Sign in").await;
        self.type_into("input[name=email]", email).await;
        self.type_into("input[name=password]", password).await;
        self.click("form[action='/login'] button[type=submit]")
            .await;
        self.wait_text(
            ".who",
            |t| t == email,
            Duration::from_secs(10),
            false,
            "signed in",
        )
        .await;
    }

    /// On /instances: add `public` under `name` and see it listed; `shot` names the screenshot.
    async fn add_key(&self, name: &str, public: &str, shot: &str) {
        self.follow("Instances").await;
        self.type_into("#add-key input[name=name]", name).await;
        self.type_into("#add-key textarea[name=public_key]", public)
            .await;
        self.click("#add-key button[type=submit]").await;
        self.wait_text(
            "#ssh-keys",
            |t| t.contains(name),
            Duration::from_secs(10),
            false,
            "the key to be added",
        )
        .await;
        self.shot(shot).await;
    }

    /// On /instances: create a `linux-test` instance with the form and wait for its row to
    /// run. Its name, its row's id and the instance's id.
    async fn create_linux_test(&self, shot: &str) -> (String, String, String) {
        self.c()
            .find(Locator::Css("#create select[name=gpu_type]"))
            .await
            .unwrap()
            .select_by_value("linux-test")
            .await
            .unwrap();
        self.click("#create button[type=submit]").await;
        self.wait_text(
            "#instances tbody tr td.status",
            |t| t == "running",
            Duration::from_secs(180),
            true,
            "the instance to run",
        )
        .await;
        self.shot(shot).await;
        let row = self
            .c()
            .find(Locator::Css("#instances tbody tr"))
            .await
            .unwrap();
        let name = row.attr("data-name").await.unwrap().unwrap();
        let row_id = row.attr("id").await.unwrap().unwrap();
        let vm_id = row_id.strip_prefix("instance-").unwrap().to_owned();
        (name, row_id, vm_id)
    }

    /// Delete the row's instance through its confirmation and wait for the row to say so.
    async fn delete(&self, row_id: &str, shots: [&str; 2]) {
        self.follow("Delete").await;
        self.shot(shots[0]).await;
        self.click("#confirm-delete button[type=submit]").await;
        self.wait_text(
            &format!("#{row_id} td.status"),
            |t| t == "deleted",
            Duration::from_secs(120),
            true,
            "the instance to be deleted",
        )
        .await;
        self.shot(shots[1]).await;
    }

    /// What the page's Copy button for `code_id` hands the clipboard.
    async fn copy(&self, code_id: &str) -> String {
        self.browser.watch_copies().await;
        self.click(&format!("button[data-copy='{code_id}']")).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(text) = self.browser.copied().await {
                return text;
            }
            assert!(Instant::now() < deadline, "the Copy button copied nothing");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Run the connect line a page printed, as a customer would, with their key; the remote
/// command's output when the login worked.
fn run_ssh_line(line: &str, key: &Path, remote: &str) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"ssh"), "a connect line: {line:?}");
    let mut args = words[1..].to_vec();
    args.push(remote);
    support::ssh(key, &args)
}

/// The ssh options of a customer who keeps host keys, as ssh does by default: each new key
/// is learnt into `known_hosts`, and a changed one is refused ("REMOTE HOST IDENTIFICATION HAS
/// CHANGED"). Only what the test must fix (no config, that key only, no prompt) besides.
fn keeping_host_keys(key: &Path, known_hosts: &Path) -> Vec<String> {
    [
        "-i",
        &key.to_string_lossy(),
        "-F",
        "/dev/null",
        "-o",
        &format!("UserKnownHostsFile={}", known_hosts.display()),
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=3",
        "-o",
        "IdentitiesOnly=yes",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// A customer's connect line run as they run it, host keys kept in `known_hosts`.
fn run_customer_line(
    line: &str,
    key: &Path,
    known_hosts: &Path,
    remote: &str,
) -> Result<String, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"ssh"), "a connect line: {line:?}");
    let out = Command::new("ssh")
        .args(keeping_host_keys(key, known_hosts))
        .args(&words[1..])
        .arg(remote)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(output_text(&out))
    }
}

async fn ssh_until(line: &str, key: &Path, known_hosts: &Path, expect: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        match run_customer_line(line, key, known_hosts, "hostname") {
            Ok(name) if name == expect => return,
            other => assert!(
                Instant::now() < deadline,
                "`{line}` did not reach {expect} within {within:?}: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "me@laptop", "-f"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", output_text(&out));
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    (key, public.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_by_hand_flow_works_as_written_from_sign_in_to_delete() {
    if !relay_support::kernel_parts(&[
        "ip",
        "nft",
        "wg",
        "wireguard-go",
        "caddy",
        "ssh",
        "ssh-keygen",
        "lxc",
    ]) {
        return;
    }
    if let Err(why) = host_container::lxd_ready() {
        byo_core::testing::skip(
            "lxd",
            &format!("{why}; the README walk-through did not run"),
        );
        return;
    }
    let Some((chromium, chromedriver)) = components() else {
        return;
    };
    let t0 = Instant::now();
    let phase = |what: &str| eprintln!("[{:>6.1} s] {what}", t0.elapsed().as_secs_f64());
    let by_hand = readme_by_hand();
    let [lxd, up, spark] = &by_hand.commands[..] else {
        panic!(
            "the README's by-hand block is three commands: {:?}",
            by_hand.commands
        );
    };
    // The numbered steps name what a person clicks; this walk clicks the same.
    for named in [
        "*Your GPUs*",
        "`linux-test`",
        "`/admin/hosts`",
        "activate",
        "`/instances`",
        "add an SSH key",
        "create an instance",
        "`ssh … root@…`",
        "HostKeyAlias",
        "the relay's address",
    ] {
        assert!(
            by_hand.steps.contains(named),
            "the README's steps no longer say {named}:\n{}",
            by_hand.steps
        );
    }

    assert_eq!(lxd, "scripts/lxd", "README: {lxd}");
    let out = Command::new(repo().join(lxd)).output().unwrap();
    assert!(out.status.success(), "{lxd}:\n{}", output_text(&out));
    phase(lxd);

    let work = tempfile::tempdir().unwrap();
    // byo up keeps `./.byo` in the directory it runs in, and finds the agent beside itself.
    let up = start_up(up, work.path());
    let data = work.path().join(".byo");
    // Its relays are containers that outlive it (as VMs would); the walk removes its own.
    let _relays = RemoveRelays(byo::local_relay::prefix_for(&data.canonicalize().unwrap()));
    assert!(
        up.printed.contains("booted by its own first-boot script"),
        "byo up runs real relays here:\n{}",
        up.printed
    );
    assert!(
        up.printed.contains("list v1 is published"),
        "byo up says the operator-key list is published:\n{}",
        up.printed
    );
    phase("byo up is running");
    let spark = simulated_spark(spark, &format!("byo-walk-{}", std::process::id() % 100_000));
    phase(&format!("{} is up at {}", spark.name, spark.address));

    let person = Person {
        browser: Browser::start(chromium, chromedriver).await,
        base: up.url.clone(),
        shots: std::cell::Cell::new(0),
    };
    let c = person.c();

    // 1. Sign in as the admin; the operator-key list is already published.
    c.goto(&up.url).await.unwrap();
    person.shot("start").await;
    person.sign_in(&up.email, &up.password).await;
    // Staff reach the operations pages through "Operations" and its own navigation.
    person.follow("Operations").await;
    person.follow("Operator keys").await;
    person
        .wait_text(
            "main",
            |t| t.contains("Version 1"),
            Duration::from_secs(5),
            false,
            "list v1 is published",
        )
        .await;
    person.shot("signed-in-list-v1-published").await;
    phase("1. signed in; list v1 is published");

    // 2. Your GPUs: add a linux-test GPU, copy the one-liner.
    person.follow("Your GPUs").await;
    c.find(Locator::Css("select[name=profile_id]"))
        .await
        .unwrap()
        .select_by_value("linux-test")
        .await
        .unwrap();
    person
        .click("form[action='/hosts'] button[type=submit]")
        .await;
    person
        .wait_text(
            "#one-liner",
            |t| t.contains("install.sh"),
            Duration::from_secs(30),
            false,
            "the one-liner",
        )
        .await;
    person.shot("one-liner").await;
    let one_liner = person.copy("one-liner").await;
    assert!(
        one_liner.starts_with(&format!("curl -fsSL {}/install.sh", up.url)),
        "{one_liner}"
    );
    phase("2. a linux-test GPU added; the one-liner copied");

    // 3. Paste it into the simulated Spark as its owner, as the line it printed says.
    assert!(!one_liner.contains('\''), "pastes inside '…': {one_liner}");
    let line = spark.exec_line.replace("<the one-liner>", &one_liner);
    let ran = Command::new("bash").args(["-c", &line]).output().unwrap();
    let terminal = output_text(&ran);
    eprintln!("--- {line}\n{terminal}");
    assert!(ran.status.success(), "the one-liner failed:\n{terminal}");
    phase("3. the one-liner ran on the simulated Spark");
    person.goto("/hosts").await;
    person.shot("preparing").await;
    // Your GPUs follows preparation live (the page polls; no reload).
    person
        .wait_text(
            ".progress span.state",
            |t| t.starts_with("prepared"),
            Duration::from_secs(420),
            false,
            "preparation to finish on Your GPUs",
        )
        .await;
    person.shot("prepared").await;
    phase("3. prepared, followed live on Your GPUs");
    // byo up's operator key logs in to the host as spark, as it printed.
    let operator_key = data.join("operator-key");
    assert!(
        up.printed.contains(&format!(
            "ssh -i {} spark@<host address>",
            Path::new(".byo").join("operator-key").display()
        )) || up.printed.contains(&format!(
            "ssh -i {} spark@<host address>",
            operator_key.display()
        )),
        "{}",
        up.printed
    );
    let spark_login = run_ssh_line(
        &format!("ssh spark@{}", spark.address),
        &operator_key,
        "sudo -n whoami",
    );
    assert_eq!(
        spark_login,
        Ok("root".to_owned()),
        "the operator key logs in"
    );

    // 4. /admin/hosts: activate.
    person.follow("Operations").await;
    person.follow("Hosts").await;
    person.shot("admin-hosts").await;
    // Until its agent has beaten (serving does as it starts) activation is refused and
    // says why; the person tries again, as the refusal says.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        person
            .click("form[action$='/activate'] button[type=submit]")
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let page = person.text("main").await.unwrap_or_default();
        if !page.contains("cannot go into service yet") {
            break;
        }
        assert!(Instant::now() < deadline, "never activated:\n{page}");
        tokio::time::sleep(Duration::from_secs(1)).await;
        person.goto("/admin/hosts").await;
    }
    person
        .wait_text(
            "table.hosts td.state",
            |t| t.starts_with("active"),
            // Activation walks the customer's path first (issue #38, 4): a scratch instance
            // made, logged in to through the relay, deleted.
            Duration::from_secs(120),
            true,
            "the host to be active",
        )
        .await;
    person.shot("activated").await;
    phase("4. activated at /admin/hosts");

    // 5. /instances: add an SSH key, create an instance.
    let (key, public) = keygen(work.path(), "id_ed25519");
    person.add_key("laptop", &public, "key-added").await;
    let (name, row_id, vm_id) = person.create_linux_test("instance-running").await;
    phase(&format!("5. key added; {name} created"));

    // 6. The ssh command the row shows, copied with its button and run.
    let shown = person
        .text(&format!("#ssh-{vm_id}"))
        .await
        .expect("the row shows a connect line");
    let relay = person
        .text(&format!("#{row_id} small.relay"))
        .await
        .expect("the row shows the relay");
    let copied = person.copy(&format!("ssh-{vm_id}")).await;
    assert_eq!(copied, shown, "the Copy button hands over what is shown");
    assert_eq!(
        copied,
        format!(
            "ssh -o HostKeyAlias=byo-{vm_id} root@{}",
            relay.trim_start_matches("relay ")
        ),
        "under byo up the connect line is the relay's address, under the instance's own \
         host-key name"
    );
    // Host keys are kept as a customer's ssh keeps them: the terminal's instance below, on
    // the same relay address with its own key, must not read as this one changed.
    let known_hosts = work.path().join("known_hosts");
    ssh_until(&copied, &key, &known_hosts, &name, Duration::from_secs(60)).await;
    phase(&format!("6. `{copied}` reached {name}"));

    // Stop, start, delete, from the row's buttons.
    person.click(&format!("#{row_id} button[value=stop]")).await;
    person
        .wait_text(
            &format!("#{row_id} td.status"),
            |t| t == "stopped",
            Duration::from_secs(60),
            true,
            "the instance to stop",
        )
        .await;
    person.shot("stopped").await;
    assert!(
        run_ssh_line(&copied, &key, "hostname").is_err(),
        "a stopped instance answers no ssh"
    );
    person
        .click(&format!("#{row_id} button[value=start]"))
        .await;
    person
        .wait_text(
            &format!("#{row_id} td.status"),
            |t| t == "running",
            Duration::from_secs(60),
            true,
            "the instance to start",
        )
        .await;
    person.shot("started").await;
    ssh_until(&copied, &key, &known_hosts, &name, Duration::from_secs(60)).await;
    phase("stopped and started again; ssh works again");

    person.delete(&row_id, ["confirm-delete", "deleted"]).await;
    assert!(
        run_ssh_line(&copied, &key, "hostname").is_err(),
        "a deleted instance answers no ssh"
    );
    phase("deleted; ssh goes nowhere");

    // Steps 5 and 6 from a terminal, as the README's terminal lines go (issue #43, 5): a
    // token of scope `instances` made on /account, `byo login`, create --wait, ssh, delete.
    person.follow(&up.email).await;
    person
        .type_into("#new-token-form input[name=name]", "terminal")
        .await;
    person
        .click("#new-token-form input[name=scope][value=instances]")
        .await;
    person.click("#new-token-form button[type=submit]").await;
    let secret = person
        .wait_text(
            "#new-token-secret",
            |t| t.starts_with("byo_api_"),
            Duration::from_secs(10),
            false,
            "the token, shown once",
        )
        .await;
    person.shot("api-token").await;
    // The scope's radio buttons sit beside their words, not stretched across the form
    // above them (issue #42).
    let radio = person
        .c()
        .execute(
            "return document.querySelector('#new-token-form input[name=scope]').getBoundingClientRect().width",
            vec![],
        )
        .await
        .unwrap()
        .as_f64()
        .unwrap();
    assert!(
        radio < 40.0,
        "a scope's radio button is {radio} px wide: stretched above its words, not beside them"
    );
    // The command line's login as the page words it, run as written.
    let login = person
        .text("#try-cli")
        .await
        .expect("the page shows the login line");
    let words: Vec<&str> = login.split_whitespace().collect();
    assert_eq!(words[..3], ["byo", "login", "--server"], "{login}");
    let config = work.path().join("config");
    let cli = |args: &[&str], stdin: &str| -> Output {
        let out = support::byo_cli(&config, args, stdin);
        assert!(
            out.status.success(),
            "byo {}:\n{}",
            args.join(" "),
            output_text(&out)
        );
        out
    };
    cli(&words[1..], &secret);
    let created = cli(
        &[
            "instances",
            "create",
            "--gpu",
            "linux-test",
            "--key",
            "laptop",
            "--wait",
        ],
        "",
    );
    let said = String::from_utf8_lossy(&created.stdout).into_owned();
    let line = said
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ssh ") && l.contains(" root@"))
        .unwrap_or_else(|| panic!("create --wait ends with the ssh line:\n{said}"))
        .to_owned();
    let cli_name = said
        .split_whitespace()
        .next()
        .expect("it names the instance")
        .to_owned();
    // The page's form, the same relay (one per host), under this instance's own alias.
    let (alias, at) = line
        .strip_prefix("ssh -o HostKeyAlias=")
        .and_then(|rest| rest.split_once(' '))
        .unwrap_or_else(|| panic!("the terminal's line: {line}"));
    assert!(copied.ends_with(&format!(" {at}")), "{line} / {copied}");
    assert!(
        alias.starts_with("byo-") && alias != format!("byo-{vm_id}"),
        "{line}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let keeping = keeping_host_keys(&key, &known_hosts);
        let mut args = vec!["instances", "ssh", &cli_name, "--"];
        args.extend(keeping.iter().map(String::as_str));
        args.push("hostname");
        let out = support::byo_cli(&config, &args, "");
        if out.status.success() {
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), cli_name);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "byo instances ssh did not reach {cli_name}: {}",
            output_text(&out)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let deleted = cli(&["instances", "delete", &cli_name, "--json"], "");
    let deleted: serde_json::Value = serde_json::from_slice(&deleted.stdout).unwrap();
    assert_eq!(deleted["state"], "deleted", "{deleted}");
    assert!(
        run_ssh_line(&line, &key, "hostname").is_err(),
        "a deleted instance answers no ssh"
    );
    phase(&format!(
        "the terminal: {cli_name} created, reached and deleted with byo"
    ));

    // A customer of their own (issue #42): signed up on /signup as docs/for-customers.md has
    // it, not made by the admin, renting byo up's test host as that guide's four steps go.
    person
        .click("form[action='/logout'] button[type=submit]")
        .await;
    person.follow("Create an account").await;
    person
        .type_into("input[name=email]", "carol@example.com")
        .await;
    person.type_into("input[name=display_name]", "Carol").await;
    person
        .type_into("input[name=password]", "carol-walks-the-guide")
        .await;
    person
        .click("form[action='/signup'] button[type=submit]")
        .await;
    person
        .wait_text(
            "main",
            |t| t.contains("Signed up"),
            Duration::from_secs(10),
            false,
            "the sign-up to be taken without mail under byo up",
        )
        .await;
    person.shot("customer-signed-up").await;
    person
        .sign_in("carol@example.com", "carol-walks-the-guide")
        .await;
    assert!(
        c.find(Locator::LinkText("Operations")).await.is_err(),
        "a customer is shown no Operations"
    );
    let (carol_key, carol_public) = keygen(work.path(), "carol_ed25519");
    person
        .add_key("carol's laptop", &carol_public, "customer-key-added")
        .await;
    let (carol_name, carol_row, carol_vm) =
        person.create_linux_test("customer-instance-running").await;
    let carol_line = person.copy(&format!("ssh-{carol_vm}")).await;
    ssh_until(
        &carol_line,
        &carol_key,
        &known_hosts,
        &carol_name,
        Duration::from_secs(60),
    )
    .await;
    assert!(
        run_ssh_line(&carol_line, &key, "hostname").is_err(),
        "the admin's key does not open the customer's instance"
    );
    person
        .delete(&carol_row, ["customer-confirm-delete", "customer-deleted"])
        .await;
    phase(&format!(
        "a signed-up customer rented {carol_name}, reached it and deleted it"
    ));
    person.browser.client.clone().close().await.unwrap();
    drop(spark);
    drop(up);
}
