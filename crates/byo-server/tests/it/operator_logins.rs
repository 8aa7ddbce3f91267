//! Attributable logins (I, "What the operator gets"; issue #16, 5) on both backends: the
//! logins a host's agent reads from sshd ride on its heartbeat, the backend keeps each once,
//! and the owner's page and /admin/hosts/{id} show who of the operators logged in, when and
//! from where; nobody else sees them. One scenario runs a real sshd, logs in to it with an
//! operator's key from a signed list's authorized_keys, and feeds its log through the agent's
//! own reader.

use crate::support;
use crate::with_world;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use byo_agent::host::{Fallible, Host, LxdBody, LxdReply, Output};
use byo_core::keylist::check_key;
use byo_core::keylist_testing as keys;
use byo_wire::vm::OperatorLogin;
use serde_json::{Value, json};
use support::{TestApp, User};

struct World {
    app: TestApp,
    owner: User,
    other_owner: User,
    op: User,
    customer: User,
    host_id: String,
    slug: String,
    token: String,
}

async fn world(backend: byo_db::Backend) -> Option<World> {
    let app = TestApp::new(backend).await?;
    app.publish_operator_keys().await;
    let owner = app.community_host("owner@example.com").await;
    let other_owner = app.community_host("other-owner@example.com").await;
    let op = app.operator("op@example.com").await;
    let customer = app.customer("customer@example.com").await;
    let p = owner
        .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
        .await;
    assert_eq!(p.status, StatusCode::CREATED, "{}", p.text());
    let p = p.json();
    let spark = json!({
        "gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
        "os_id": "ubuntu", "os_version": "24.04", "driver_version": "580.65.06",
        "machine_id": "3f2a", "hardware_id": "b41c", "node_index": 0, "rails": []
    });
    let enrolled = app
        .send(
            Request::post("/api/enroll")
                .header(
                    header::AUTHORIZATION,
                    format!("Bearer {}", p["token"].as_str().unwrap()),
                )
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(spark.to_string()))
                .unwrap(),
        )
        .await;
    assert_eq!(enrolled.status, StatusCode::OK, "{}", enrolled.text());
    // The other owner has a host of their own, with no logins.
    other_owner
        .post("/api/hosts", json!({"profile_id": "gb10-spark-1"}))
        .await;
    Some(World {
        host_id: p["host_id"].as_str().unwrap().to_owned(),
        slug: p["slug"].as_str().unwrap().to_owned(),
        token: enrolled.json()["host_token"].as_str().unwrap().to_owned(),
        app,
        owner,
        other_owner,
        op,
        customer,
    })
}

with_world!(
    i_logins_on_the_beat_are_kept_once_and_shown_to_the_owner_and_admin_only,
    i_a_beat_whose_logins_do_not_read_is_refused_and_changes_nothing,
    i_a_real_sshd_login_with_an_operator_key_reaches_the_owners_page,
);

impl World {
    /// One heartbeat carrying `logins` in its details.
    async fn beat(&self, logins: Value) -> support::Reply {
        self.app
            .send(
                Request::post("/api/host/heartbeat")
                    .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(
                        json!({"agent_version": "0.7.3", "lxd": "ok", "relay": "ok", "tunnel": "down",
                               "gpu": "ok", "storage": "ok", "instances": 0,
                               "details": {"tunnel": "cloudflared: failed", "operator_logins": logins}})
                        .to_string(),
                    ))
                    .unwrap(),
            )
            .await
    }

    async fn kept(&self) -> usize {
        self.app
            .db
            .operator_logins(&self.host_id, 1000)
            .await
            .unwrap()
            .len()
    }
}

fn login(at: &str, port: u16, user_sub: Option<&str>) -> Value {
    json!({"at": at, "source": "10.8.0.1", "source_port": port,
           "fingerprint": "SHA256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU", "user_sub": user_sub})
}

/// The part of `page` from `id`'s element to the end of its table.
fn table<'a>(page: &'a str, id: &str) -> &'a str {
    let start = page
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in {page}"));
    let end = start + page[start..].find("</table>").unwrap_or(page.len() - start);
    &page[start..end]
}

async fn i_logins_on_the_beat_are_kept_once_and_shown_to_the_owner_and_admin_only(w: World) {
    // The third: break glass past the list's expiry (#39, 5), the certificate sshd named.
    let mut certified = login("2026-12-01T00:55:00Z", 40003, Some(&w.op.sub));
    certified["certificate"] = json!("break-glass:op@enverge.ai:spark-1 (serial 7311)");
    let beat = json!([
        login("2026-12-01T01:00:00Z", 40001, Some(&w.op.sub)),
        login("2026-12-01T01:05:00Z", 40002, None),
        certified,
    ]);
    assert_eq!(w.beat(beat.clone()).await.status, StatusCode::NO_CONTENT);
    // The agent sends a beat again when it did not hear the answer: nothing doubles.
    assert_eq!(w.beat(beat).await.status, StatusCode::NO_CONTENT);
    assert_eq!(w.kept().await, 3);
    // They are kept in their own table, not in the host's status details.
    let status = w.app.db.host_status(&w.host_id).await.unwrap().unwrap();
    assert!(
        status.details.0.operator_logins.is_none(),
        "{:?}",
        status.details.0
    );
    assert_eq!(
        status.details.0.tunnel.as_deref(),
        Some("cloudflared: failed")
    );

    // The owner's page: who, when, from where; a key on no list is named as such.
    let page = w.owner.page("/hosts").await;
    let rows = table(&page, &format!("logins-{}", w.host_id));
    assert!(page.contains("Operator logins"), "{page}");
    assert!(rows.contains("2026-12-01 01:00:00 UTC"), "{rows}");
    assert!(rows.contains("2026-12-01 01:05:00 UTC"), "{rows}");
    assert!(rows.contains("10.8.0.1"), "{rows}");
    assert!(
        rows.contains("an operator"),
        "the operator has no display name: {rows}"
    );
    assert!(
        !rows.contains("op@example.com"),
        "an operator's email is not the owner's to see: {rows}"
    );
    assert!(rows.contains("not an operator key"), "{rows}");
    assert!(
        rows.contains("break glass")
            && rows.contains("break-glass:op@enverge.ai:spark-1 (serial 7311)"),
        "{rows}"
    );
    assert_eq!(rows.matches("break glass<").count(), 1, "{rows}");
    // Newest first.
    assert!(
        rows.find("01:05:00").unwrap() < rows.find("01:00:00").unwrap(),
        "{rows}"
    );

    // /admin/hosts/{id}: the same, with the operator's sub and the key's fingerprint.
    let admin = w.op.page(&format!("/admin/hosts/{}", w.host_id)).await;
    let rows = table(&admin, "logins");
    assert!(
        rows.contains(&w.op.sub) && rows.contains("SHA256:47DEQpj8"),
        "{rows}"
    );
    assert!(
        rows.contains("not an operator key") && rows.contains("port 40002"),
        "{rows}"
    );
    assert!(
        rows.contains("break glass") && rows.contains("(serial 7311)"),
        "{rows}"
    );

    // Nobody else sees them: another owner's page lists their own host and no logins, a
    // customer has no hosts page of logins, and /admin is for operators.
    let other = w.other_owner.page("/hosts").await;
    assert!(
        !other.contains("Operator logins") && !other.contains(&format!("<td>{}</td>", w.slug)),
        "{other}"
    );
    assert!(!other.contains("10.8.0.1"), "{other}");
    let customer = w.customer.get("/hosts").await;
    assert!(!customer.text().contains("10.8.0.1"), "{}", customer.text());
    for who in [&w.customer, &w.owner, &w.other_owner] {
        let r = who.get(&format!("/admin/hosts/{}", w.host_id)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
        assert!(!r.text().contains("10.8.0.1"));
    }
    let anonymous = w
        .app
        .get(&format!("/admin/hosts/{}", w.host_id), None)
        .await;
    assert!(!anonymous.text().contains("10.8.0.1"));
}

async fn i_a_beat_whose_logins_do_not_read_is_refused_and_changes_nothing(w: World) {
    assert_eq!(
        w.beat(json!([login("2026-12-01T01:00:00Z", 40001, None)]))
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    let before = w.app.db.host_status(&w.host_id).await.unwrap().unwrap();
    let too_many: Vec<Value> = (0..=byo_wire::vm::MAX_LOGINS_PER_BEAT as u16)
        .map(|i| login("2026-12-01T02:00:00Z", 41000 + i, None))
        .collect();
    for (bad, why) in [
        (json!("spark logged in"), "not a list"),
        (
            json!([{"at": "2026-12-01T02:00:00Z"}]),
            "a login without its fields",
        ),
        (
            json!([{"at": "2026-12-01T02:00:00Z", "source": "10.8.0.1", "source_port": 1,
                    "fingerprint": "SHA256:abc", "extra": 1}]),
            "an unknown field",
        ),
        (json!(too_many), "more than a beat carries"),
        (
            json!([{"at": "2026-12-01T02:00:00Z", "source": "somewhere", "source_port": 1, "fingerprint": "SHA256:abc"}]),
            "a source that is no address",
        ),
        (
            json!([{"at": "2026-12-01T02:00:00Z", "source": "10.8.0.1", "source_port": 1, "fingerprint": "MD5:ab:cd"}]),
            "a fingerprint that is not SHA256",
        ),
        (
            json!([{"at": "2026-12-01T02:00:00Z", "source": "10.8.0.1", "source_port": 1, "fingerprint": "SHA256:abc", "user_sub": ""}]),
            "an empty user sub",
        ),
        (
            json!([{"at": "2026-12-01T02:00:00Z", "source": "10.8.0.1", "source_port": 1, "fingerprint": "SHA256:abc", "user_sub": "u".repeat(129)}]),
            "a user sub past the list's bound",
        ),
        (
            json!([{"at": "2026-12-01T02:00:00Z", "source": "10.8.0.1", "source_port": 1, "fingerprint": "SHA256:abc", "user_sub": "a\u{1b}[2Jb"}]),
            "a user sub with control characters",
        ),
        (
            json!([{"at": "2026-12-01T02:00:00Z", "source": "10.8.0.1", "source_port": 1, "fingerprint": "SHA256:abc", "certificate": "a\u{1b}[2Jb (serial 1)"}]),
            "a certificate name with control characters",
        ),
        (
            json!([{"at": "2026-12-01T02:00:00Z", "source": "10.8.0.1", "source_port": 1, "fingerprint": "SHA256:abc", "certificate": "c".repeat(201)}]),
            "a certificate name past its bound",
        ),
    ] {
        let r = w.beat(bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{why}: {}", r.text());
        assert_eq!(r.json()["error"], "invalid_heartbeat", "{why}");
        assert_eq!(w.kept().await, 1, "{why}: nothing kept");
        let after = w.app.db.host_status(&w.host_id).await.unwrap().unwrap();
        assert_eq!(
            after.seen_at, before.seen_at,
            "{why}: the beat was not recorded"
        );
    }
    // Exactly a beat's worth is taken, a user sub at its bound among them.
    let long_sub = "u".repeat(128);
    let full: Vec<Value> = (0..byo_wire::vm::MAX_LOGINS_PER_BEAT as u16)
        .map(|i| {
            login(
                "2026-12-01T02:00:00Z",
                41000 + i,
                (i == 0).then_some(long_sub.as_str()),
            )
        })
        .collect();
    assert_eq!(w.beat(json!(full)).await.status, StatusCode::NO_CONTENT);
    assert_eq!(w.kept().await, 1 + byo_wire::vm::MAX_LOGINS_PER_BEAT);
}

/// The journal as the agent reads it, fed by a real sshd's log: each line sshd wrote is
/// one entry (cursor `n`, the time it was read), and `--after-cursor` is honoured. Files the
/// agent keeps (its cursor) live in memory.
struct SshdJournal {
    lines: Arc<Mutex<Vec<(String, String)>>>,
    files: HashMap<String, Vec<u8>>,
    reads: usize,
}

impl Host for SshdJournal {
    fn run(&mut self, argv: &[&str], _: Option<&[u8]>) -> Fallible<Output> {
        if argv.first() != Some(&"journalctl") {
            return Err(format!("unexpected {argv:?}"));
        }
        self.reads += 1;
        let after: Option<usize> = argv
            .iter()
            .find_map(|a| a.strip_prefix("--after-cursor="))
            .map(|c| c.parse().unwrap());
        let lines = self.lines.lock().unwrap();
        let out: Vec<String> = lines
            .iter()
            .enumerate()
            .filter(|(i, _)| after.is_none_or(|a| *i > a))
            .map(|(i, (at, msg))| {
                json!({"__CURSOR": i.to_string(), "__REALTIME_TIMESTAMP": at, "MESSAGE": msg})
                    .to_string()
            })
            .collect();
        Ok(Output::success(out.join("\n")))
    }
    fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>> {
        Ok(self.files.get(path).cloned())
    }
    fn write(&mut self, path: &str, bytes: &[u8], _: u32, _: &str) -> Fallible<()> {
        self.files.insert(path.to_owned(), bytes.to_vec());
        Ok(())
    }
    fn remove(&mut self, path: &str) -> Fallible<()> {
        self.files.remove(path);
        Ok(())
    }
    fn lxd(&mut self, _: &str, _: &str, _: LxdBody<'_>) -> Fallible<LxdReply> {
        Err("no LXD here".into())
    }
    fn describe(&self) -> String {
        "a real sshd's log".into()
    }
}

struct Sshd(Child);

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ssh_login(key: &std::path::Path, user: &str, port: u16) -> bool {
    Command::new("ssh")
        .args(["-F", "/dev/null", "-i"])
        .arg(key)
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "ConnectTimeout=5",
            "-o",
            "LogLevel=ERROR",
            "-p",
            &port.to_string(),
            &format!("{user}@127.0.0.1"),
            "true",
        ])
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success()
}

/// A real sshd (`sshd -D -e`, loopback, a temporary host key) whose AuthorizedKeysFile is
/// the signed list's authorized_keys: the operator logs in with their key, a key on no list
/// is refused, and sshd's own log, read by the agent's reader, becomes a beat that the owner's
/// page and /admin show. Logins are to the account the test runs as (sshd needs a real
/// account; the agent reads spark's).
async fn i_a_real_sshd_login_with_an_operator_key_reaches_the_owners_page(w: World) {
    if !byo_core::testing::have_tools(&["sshd", "ssh", "ssh-keygen"]) {
        return;
    }
    let account = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let operator_key = dir.path().join("operator");
    let other_key = dir.path().join("other");
    for k in [&operator_key, &other_key, &dir.path().join("host-key")] {
        assert!(
            Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
                .arg(k)
                .status()
                .unwrap()
                .success()
        );
    }
    let public = std::fs::read_to_string(operator_key.with_extension("pub")).unwrap();
    let public = public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ");
    let entry = byo_core::keylist::OperatorKey {
        user_sub: w.op.sub.clone(),
        label: "laptop".into(),
        public_key: public,
    };
    let fingerprint = check_key(&entry).unwrap().fingerprint;
    let list = keys::list(
        &w.app.state.config.environment,
        2,
        vec![entry, keys::login_key("someone-else", "desktop")],
        chrono::Utc::now(),
    );
    let signed = keys::envelope(&list, &[support::signing_key()]);
    let authorized = dir.path().join("authorized_keys");
    std::fs::write(&authorized, list.authorized_keys()).unwrap();
    let port = free_port();
    let config = dir.path().join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "ListenAddress 127.0.0.1:{port}\nHostKey {hk}\nPidFile none\nAuthorizedKeysFile {ak}\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nStrictModes no\nLogLevel INFO\n",
            hk = dir.path().join("host-key").display(),
            ak = authorized.display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let mut child = Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-f"])
        .arg(&config)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _sshd = Sshd(child);
    // sshd's log, line by line, as the journal would hold it.
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (listening_tx, listening) = std::sync::mpsc::channel();
    let (accepted_tx, accepted) = std::sync::mpsc::channel();
    {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let now = chrono::Utc::now().timestamp_micros().to_string();
                if line.starts_with("Server listening") {
                    let _ = listening_tx.send(());
                }
                let accepted = line.starts_with("Accepted ");
                lines.lock().unwrap().push((now, line));
                if accepted {
                    let _ = accepted_tx.send(());
                }
            }
        });
    }
    listening
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("sshd listens");

    assert!(
        !ssh_login(&other_key, &account, port),
        "a key on no list is refused"
    );
    assert!(
        ssh_login(&operator_key, &account, port),
        "the operator's key logs in"
    );
    accepted
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("sshd logged the login");

    // The agent's reader: the applied list's keys, the journal after the kept cursor.
    let mut host = SshdJournal {
        lines: lines.clone(),
        files: HashMap::new(),
        reads: 0,
    };
    let applied = byo_agent::logins::applied_keys(Some(&signed));
    let read = byo_agent::logins::read_as(&mut host, &account, &applied);
    assert_eq!(read.error, None);
    assert_eq!(read.logins.len(), 1, "{:?}", lines.lock().unwrap());
    let seen: &OperatorLogin = &read.logins[0];
    assert_eq!(
        seen.fingerprint, fingerprint,
        "sshd logged the key the list names"
    );
    assert_eq!(seen.user_sub.as_deref(), Some(w.op.sub.as_str()));
    assert_eq!(seen.source, "127.0.0.1");

    // The beat reaches the backend; once it is delivered the cursor is kept and the next
    // read has nothing new (a restart would start from the same kept cursor).
    let r = w.beat(json!(read.logins)).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    byo_agent::logins::delivered(&mut host, read.cursor.as_deref().unwrap()).unwrap();
    let again = byo_agent::logins::read_as(&mut host, &account, &applied);
    assert!(again.logins.is_empty(), "{:?}", again.logins);

    let page = w.owner.page("/hosts").await;
    let rows = table(&page, &format!("logins-{}", w.host_id));
    assert!(
        rows.contains("an operator") && rows.contains("127.0.0.1"),
        "{rows}"
    );
    assert!(
        rows.contains(&seen.at.format("%Y-%m-%d %H:%M:%S UTC").to_string()),
        "{rows}"
    );
    let admin = w.op.page(&format!("/admin/hosts/{}", w.host_id)).await;
    let rows = table(&admin, "logins");
    assert!(
        rows.contains(&fingerprint) && rows.contains(&w.op.sub),
        "{rows}"
    );
}
