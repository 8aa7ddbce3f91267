//! H.3 over the host adapter: "restore the owner before removing ourselves". When the
//! owner's access cannot be restored and proved, the uninstall stops at its first step with
//! exit status 3, and nothing of ours is removed — no file written or removed, no unit
//! stopped, no LXD call that changes anything. And the step list is the one
//! `docs/uninstall.md` documents. (The whole uninstall on a real host: `crates/byo/tests/it/uninstall.rs`.)

use std::collections::BTreeMap;

use byo_agent::host::{Fallible, Host, LxdBody, LxdReply, Output};
use byo_agent::uninstall::{self, OWNER_RESTORE, Plan, STEP_NAMES, UninstallError};
use byo_wire::prepare::StepState;

/// A prepared host as the adapter sees it, with the owner locked out: files, users, and
/// the answers of the commands the owner check reads with. Anything that would change the
/// host is recorded.
struct Prepared {
    files: BTreeMap<String, String>,
    /// passwd lines, by user.
    passwd: BTreeMap<String, String>,
    /// shadow lines, by user.
    shadow: BTreeMap<String, String>,
    sshd_t: String,
    changes: Vec<String>,
}

const READ_ONLY: &[&str] = &[
    "test",
    "getent",
    "id",
    "sshd",
    "sudo",
    "ip",
    "nft",
    "ufw",
    "dpkg-query",
    "snap",
];

impl Prepared {
    fn new() -> Prepared {
        let files = [
            (
                "/etc/ssh/sshd_config.d/00-enverge-lockout.conf",
                "AllowUsers spark\n",
            ),
            ("/etc/enverge/owner", "owner\n"),
            ("/etc/enverge/owner-groups", "sudo\n"),
            ("/etc/enverge/spark-created", "spark\n"),
            ("/etc/enverge/credentials.json", "{}"),
            (
                "/etc/sudoers.d/enverge-spark",
                "spark ALL=(ALL) NOPASSWD:ALL\n",
            ),
            ("/home/spark/.ssh/authorized_keys", "ssh-ed25519 AAAA op\n"),
            ("/etc/systemd/system/enverge-agent.service", "[Unit]\n"),
            (
                "/etc/systemd/system/enverge-agent-prepare.service",
                "[Unit]\n",
            ),
            ("/etc/wireguard/wg0.conf", "[Interface]\n"),
            ("/usr/local/bin/byo-agent", "ELF"),
            ("/etc/shells", "/bin/sh\n/bin/bash\n"),
            ("/bin/bash", "ELF"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let user = |name: &str, id: u32, shell: &str| {
            (
                name.to_owned(),
                format!("{name}:x:{id}:{id}::/home/{name}:{shell}"),
            )
        };
        Prepared {
            files,
            passwd: [
                user("owner", 1000, "/bin/bash"),
                user("spark", 1001, "/bin/bash"),
            ]
            .into_iter()
            .collect(),
            shadow: [
                (
                    "owner".to_owned(),
                    "owner:!$y$j9T$hash:19000:0:99999:7:::".to_owned(),
                ),
                ("spark".to_owned(), "spark:!:19000:0:99999:7:::".to_owned()),
            ]
            .into_iter()
            .collect(),
            sshd_t: "passwordauthentication yes\npubkeyauthentication yes\nusepam yes\n".into(),
            changes: Vec::new(),
        }
    }
}

impl Host for Prepared {
    fn run(&mut self, argv: &[&str], _stdin: Option<&[u8]>) -> Fallible<Output> {
        let ok = |s: &str| Ok(Output::success(s));
        let no = || Ok(Output::failure(2, ""));
        match argv {
            ["test", "-e", p] => {
                if self.files.contains_key(*p) {
                    ok("")
                } else {
                    no()
                }
            }
            ["getent", "passwd", u] => self.passwd.get(*u).map_or_else(no, |l| ok(l)),
            ["getent", "shadow", u] => self.shadow.get(*u).map_or_else(no, |l| ok(l)),
            ["getent", "group", g] => ok(&format!("{g}:x:27:")),
            ["id", "-nG", u] => ok(if *u == "owner" {
                "owner"
            } else {
                "spark sudo lxd"
            }),
            ["id", "-u"] => ok("0"),
            ["sudo", "-l", "-U", u] => ok(&format!("User {u} is not allowed to run sudo on host.")),
            ["sshd", "-T", ..] => ok(&self.sshd_t.clone()),
            ["sshd", "-t"] => ok(""),
            ["systemctl", "is-active", ..] | ["systemctl", "is-enabled", ..] => ok(""),
            [program, ..] if READ_ONLY.contains(program) => no(),
            _ => {
                self.changes.push(argv.join(" "));
                ok("")
            }
        }
    }
    fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>> {
        Ok(self.files.get(path).map(|s| s.clone().into_bytes()))
    }
    fn write(&mut self, path: &str, _: &[u8], _: u32, _: &str) -> Fallible<()> {
        self.changes.push(format!("write {path}"));
        Ok(())
    }
    fn remove(&mut self, path: &str) -> Fallible<()> {
        self.changes.push(format!("remove {path}"));
        Ok(())
    }
    fn lxd(&mut self, method: &str, path: &str, _: LxdBody<'_>) -> Fallible<LxdReply> {
        if method != "GET" {
            self.changes.push(format!("LXD {method} {path}"));
        }
        Ok(LxdReply {
            status: 404,
            body: b"{}".to_vec(),
        })
    }
    fn describe(&self) -> String {
        "node0".into()
    }
}

/// Runs the whole uninstall on `host`: the refusal, and every step that reported.
fn refused(host: &mut Prepared, plan: &Plan) -> (String, Vec<String>) {
    let mut reported = Vec::new();
    let before = host.files.clone();
    let err = uninstall::uninstall(host, plan, |p| {
        reported.push(format!("{} {:?}", p.state.step, p.state.state));
        if p.state.state == StepState::Failed {
            assert_eq!(p.state.step, OWNER_RESTORE);
        }
    })
    .expect_err("the uninstall went on");
    assert_eq!(err.exit_code(), 3, "{err}");
    let UninstallError::OwnerNotRestored(why) = &err else {
        panic!("{err:?}")
    };
    assert!(
        err.to_string().contains("nothing of byo's was removed"),
        "{err}"
    );
    // Nothing changed: no write, no removal, no unit touched, no LXD change.
    assert_eq!(host.changes, Vec::<String>::new(), "{why}");
    assert_eq!(host.files, before);
    assert!(
        reported.iter().all(|r| r.starts_with(OWNER_RESTORE)),
        "a step after owner-restore ran: {reported:?}"
    );
    (why.clone(), reported)
}

#[test]
fn h3_an_owner_whose_login_cannot_be_proved_stops_the_uninstall_before_anything_is_removed() {
    let plan = |owner: Option<&str>| Plan {
        owner: owner.map(str::to_owned),
        ..Plan::default()
    };

    // Whose machine is it? Not recorded, not given, not run through sudo.
    let mut host = Prepared::new();
    let (why, _) = refused(&mut host, &plan(None));
    assert!(why.contains("--owner LOGIN"), "{why}");

    // spark (or root) is never the owner.
    let mut host = Prepared::new();
    let (why, _) = refused(&mut host, &plan(Some("spark")));
    assert!(why.contains("not an owner's login"), "{why}");

    // An owner's sshd that refuses passwords: with spark gone nobody could get in. (The
    // lockout drop-in is gone already: an uninstall run again.)
    let mut host = Prepared::new();
    host.files
        .remove("/etc/ssh/sshd_config.d/00-enverge-lockout.conf");
    host.sshd_t = "passwordauthentication no\nkbdinteractiveauthentication no\nusepam yes\n".into();
    let (why, _) = refused(&mut host, &plan(Some("owner")));
    assert!(why.contains("PasswordAuthentication no"), "{why}");

    // The same host, with sshd admitting only spark by the owner's own configuration.
    let mut host = Prepared::new();
    host.files
        .remove("/etc/ssh/sshd_config.d/00-enverge-lockout.conf");
    host.sshd_t = "passwordauthentication yes\nallowusers spark admin\n".into();
    let (why, _) = refused(&mut host, &plan(Some("owner")));
    assert!(why.contains("AllowUsers"), "{why}");

    // No password to unlock.
    let mut host = Prepared::new();
    host.shadow
        .insert("owner".into(), "owner:!:19000:0:99999:7:::".into());
    let (why, _) = refused(&mut host, &plan(Some("owner")));
    assert!(why.contains("has no password"), "{why}");

    // A shell nobody logs in with.
    let mut host = Prepared::new();
    host.passwd.insert(
        "owner".into(),
        "owner:x:1000:1000::/home/owner:/usr/sbin/nologin".into(),
    );
    let (why, _) = refused(&mut host, &plan(Some("owner")));
    assert!(why.contains("not a login shell"), "{why}");

    // The owner's login recorded, but no such account here.
    let mut host = Prepared::new();
    let (why, _) = refused(&mut host, &plan(Some("someone")));
    assert!(why.contains("does not exist"), "{why}");
}

#[test]
fn h3_a_restorable_owner_is_restored_first_and_only_then_do_removals_begin() {
    // The same locked-out owner, restorable: the first change is owner-restore's (preparation
    // stopped so it cannot lock them out again, then the drop-in), and every removal comes
    // after it. (The fake does not change state, so the re-check fails the step: that
    // failure too stops everything after it.)
    let mut host = Prepared::new();
    let plan = Plan {
        owner: Some("owner".into()),
        ..Plan::default()
    };
    let err = uninstall::uninstall(&mut host, &plan, |_| {}).unwrap_err();
    assert!(
        matches!(&err, UninstallError::OwnerNotRestored(e) if e.contains("apply reported success but the check still fails")),
        "{err}"
    );
    assert_eq!(
        host.changes.first().map(String::as_str),
        Some("systemctl stop enverge-agent-prepare.service"),
        "{:?}",
        host.changes
    );
    assert!(
        host.changes
            .iter()
            .any(|c| c == "remove /etc/ssh/sshd_config.d/00-enverge-lockout.conf"),
        "{:?}",
        host.changes
    );
    for removal in [
        "remove /etc/sudoers.d/enverge-spark",
        "rm -rf /etc/enverge",
        "userdel --force --remove spark",
    ] {
        assert!(
            !host.changes.iter().any(|c| c.contains(removal)),
            "{removal} ran before the owner was proved: {:?}",
            host.changes
        );
    }
}

#[test]
fn the_docs_list_exactly_the_uninstall_steps_in_order() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/uninstall.md"
    ))
    .unwrap();
    let listed: Vec<&str> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .collect();
    assert_eq!(listed, STEP_NAMES);
}
