//! `byo release sign|publish|check` as an operator runs them (issue #14, 1; J "publishing is
//! not delivery", note 2), against `byo up` on loopback: the real server, its real
//! install.sh, the real agent build. `check` follows the path an owner's one-liner follows
//! and names each broken link: install.sh missing, the build, its digest or its signature
//! missing, a signature by another key, a digest that does not match, a build that cannot
//! run. The links are broken where a misconfigured server breaks them: in the release
//! directory the server serves from.

use crate::support;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::ByoUp;

const ARCH: &str = std::env::consts::ARCH;

fn byo(args: &[&str], password: Option<&str>, stdin: Option<&[u8]>) -> Output {
    let mut cmd = Command::new(support::sibling("byo"));
    cmd.args(args)
        .env_remove("BYO_SERVER")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(p) = password {
        cmd.env("BYO_PASSWORD", p);
    }
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `byo release check` fails, naming `link`.
fn broken(url: &str, link: &str) -> String {
    let out = byo(&["release", "check", "--server", url], None, None);
    let text = said(&out);
    assert!(
        !out.status.success(),
        "a broken link must fail the check:\n{text}"
    );
    assert!(text.contains(link), "the check names {link:?}:\n{text}");
    text
}

fn sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// What the server serves at `url` (as the installer's curl fetches it).
fn fetch(url: &str) -> String {
    let out = Command::new("curl").args(["-fsS", url]).output().unwrap();
    assert!(
        out.status.success(),
        "{url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Put a release directory's file back as it was.
struct Restore<'a>(&'a Path, Vec<u8>);
impl Drop for Restore<'_> {
    fn drop(&mut self) {
        std::fs::write(self.0, &self.1).unwrap();
    }
}

#[test]
fn j_release_check_follows_the_installers_path_and_names_each_broken_link() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = ByoUp::on_loopback(&data, dir.path());
    let url = up.url.clone();
    let releases = data.join("releases");
    let file = |suffix: &str| releases.join(format!("byo-agent-{ARCH}{suffix}"));

    // byo up serves the agent beside it, signed by its release key: every link works.
    let started = std::time::Instant::now();
    let out = byo(&["release", "check", "--server", &url], None, None);
    let good_check = started.elapsed();
    assert!(out.status.success(), "{}", said(&out));
    let text = said(&out);
    for line in [
        "ok    install.sh",
        "digest matches",
        "signed by the release key",
        "runs: byo-agent --version says \"byo-agent ",
    ] {
        assert!(text.contains(line), "{line}:\n{text}");
    }

    // install.sh missing (a public URL that serves something else).
    broken(
        &format!("{url}/nowhere"),
        &format!("install.sh: {url}/nowhere/install.sh answered 404"),
    );
    // The signature missing, then by another key.
    {
        let _back = Restore(&file(".sig"), std::fs::read(file(".sig")).unwrap());
        std::fs::remove_file(file(".sig")).unwrap();
        broken(
            &url,
            &format!("signature: {url}/agent/byo-agent-{ARCH}.sig answered 404"),
        );
        let other = byo_core::keylist_testing::private_key();
        let agent = std::fs::read(file("")).unwrap();
        std::fs::write(
            file(".sig"),
            byo_core::release::sign(&other, &agent).unwrap(),
        )
        .unwrap();
        broken(&url, "signature: not the release key's");
    }
    // A digest that does not match.
    {
        let _back = Restore(&file(".sha256"), std::fs::read(file(".sha256")).unwrap());
        std::fs::write(
            file(".sha256"),
            format!("{}  byo-agent-{ARCH}\n", "0".repeat(64)),
        )
        .unwrap();
        broken(&url, "digest mismatch");
    }
    // A build that cannot run here, with its own digest and a good signature.
    {
        let key = ssh_key::PrivateKey::from_openssh(
            std::fs::read_to_string(data.join("release-signing-key")).unwrap(),
        )
        .unwrap();
        let _sig = Restore(&file(".sig"), std::fs::read(file(".sig")).unwrap());
        let _sha = Restore(&file(".sha256"), std::fs::read(file(".sha256")).unwrap());
        let _bin = Restore(&file(""), std::fs::read(file("")).unwrap());
        let not_a_program = b"\x7fELF but not really a program".to_vec();
        std::fs::write(file(""), &not_a_program).unwrap();
        std::fs::write(
            file(".sha256"),
            format!("{}  byo-agent-{ARCH}\n", sha(&not_a_program)),
        )
        .unwrap();
        std::fs::write(
            file(".sig"),
            byo_core::release::sign(&key, &not_a_program).unwrap(),
        )
        .unwrap();
        broken(&url, "the build does not run: does not start here");
    }
    // The build missing.
    {
        let _back = Restore(&file(""), std::fs::read(file("")).unwrap());
        std::fs::remove_file(file("")).unwrap();
        broken(
            &url,
            &format!("build: {url}/agent/byo-agent-{ARCH} answered 404"),
        );
    }
    let out = byo(&["release", "check", "--server", &url], None, None);
    assert!(out.status.success(), "restored: {}", said(&out));
    println!(
        "figure: byo release check, every link good, {:.2} s",
        good_check.as_secs_f64()
    );
}

#[test]
fn j_a_build_signed_off_server_is_published_and_served_and_refusals_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = ByoUp::on_loopback(&data, dir.path());
    let url = up.url.clone();
    // A new build: the real agent with a marker appended (an ELF ignores trailing bytes).
    let mut bytes = std::fs::read(support::sibling("byo-agent")).unwrap();
    bytes.extend_from_slice(b"\nbuild marker: releases test\n");
    let build = dir.path().join("byo-agent");
    std::fs::write(&build, &bytes).unwrap();
    std::fs::set_permissions(&build, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let build_arg = build.to_string_lossy().into_owned();

    // Signed on "the operator's machine", with the release key on standard input.
    let key = std::fs::read(data.join("release-signing-key")).unwrap();
    let out = byo(
        &["release", "sign", "--build", &build_arg],
        None,
        Some(&key),
    );
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains(&sha(&bytes)), "{}", said(&out));
    let no_key = byo(
        &["release", "sign", "--build", &build_arg],
        None,
        Some(b"nothing"),
    );
    assert!(!no_key.status.success());
    assert!(said(&no_key).contains("no private key on standard input"));

    let publish = |sig: Option<&str>| {
        let mut args = vec![
            "release", "publish", "--server", &url, "--email", &up.email, "--build", &build_arg,
        ];
        if let Some(s) = sig {
            args.extend(["--sig", s]);
        }
        byo(&args, Some(&up.password), None)
    };
    // Signed by another key: refused, and the installer still serves byo up's build.
    let other = byo_core::keylist_testing::private_key();
    let forged = dir.path().join("forged.sig");
    std::fs::write(&forged, byo_core::release::sign(&other, &bytes).unwrap()).unwrap();
    let served = || fetch(&format!("{url}/agent/byo-agent-{ARCH}.sha256"));
    let before = served();
    let out = publish(Some(&forged.to_string_lossy()));
    assert!(!out.status.success());
    assert!(
        said(&out).contains("not signed by this server's release key")
            && said(&out).contains("nothing was published"),
        "{}",
        said(&out)
    );
    assert_eq!(served(), before, "a refused publish changes nothing served");

    let started = std::time::Instant::now();
    let out = publish(None);
    let took = started.elapsed();
    assert!(out.status.success(), "{}", said(&out));
    let text = said(&out);
    assert!(
        text.contains(&format!("published byo-agent-{ARCH} byo-agent ")),
        "{text}"
    );
    assert!(text.contains("No host changed build"), "{text}");
    assert_eq!(
        served(),
        format!("{}  byo-agent-{ARCH}\n", sha(&bytes)),
        "the installer serves it"
    );
    let out = byo(&["release", "check", "--server", &url], None, None);
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains(&sha(&bytes)),
        "the check saw the published build: {}",
        said(&out)
    );
    // The same build again: refused.
    let out = publish(None);
    assert!(!out.status.success());
    assert!(said(&out).contains("already published"), "{}", said(&out));
    println!(
        "figure: byo release publish of a {} MiB build over loopback: {:.2} s",
        bytes.len() / 1024 / 1024,
        took.as_secs_f64()
    );
}
