//! `byo-agent upgrade` (issue #36, 2; J note 9): an upgrade verified by what the host already
//! trusts, never by a script the server serves.
//!
//! The installed agent — root-owned, itself verified when it was installed — fetches the
//! build the server serves for this machine's arch and its SSHSIG, verifies the signature
//! against the release key **pinned on this machine** (`/etc/enverge/release-key`) with
//! `byo_core::release::verify`, checks it is the build the operator named (`--build`), runs
//! it (`--version`), and only then hands the swap to the verified build's own finish script
//! (`byo-agent finish-script`: its units, its rollback script), detached as the transient
//! unit `enverge-agent-install` as install.sh does, so a dropped SSH session cannot cut it
//! short. `byo fleet upgrade` runs this over ssh; a compromised server can refuse to serve
//! a build, but cannot make a host run anything the release key did not sign.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use byo_core::release;
use byo_core::render::units;
use sha2::{Digest, Sha256};

use crate::host::{Host, LocalHost};

pub use crate::names::{CREDENTIALS, SERVER_FILE};
/// The most of a build this fetches: the server's own limit on a published build.
pub const MAX_BUILD: u64 = 512 * 1024 * 1024;

/// Exit statuses, install.sh's where the failure is the same one.
pub const EXIT_OTHER: u8 = 1;
pub const EXIT_UNREACHABLE: u8 = 6;
pub const EXIT_NO_BUILD: u8 = 7;
pub const EXIT_NOT_SIGNED: u8 = 8;
pub const EXIT_OTHER_BUILD: u8 = 10;

/// Why nothing was installed, with the exit status that says which.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct UpgradeError {
    pub code: u8,
    pub message: String,
}

impl UpgradeError {
    fn new(code: u8, message: impl Into<String>) -> Self {
        UpgradeError {
            code,
            message: message.into(),
        }
    }
    pub fn exit_code(&self) -> u8 {
        self.code
    }
}

/// The pure judgement of a fetched build: signed by the pinned key, and the build asked for
/// (a 12–64 hex prefix of its sha256) when one was. Its sha256 (hex) when it may be installed.
pub fn judge(
    pinned: &str,
    build: &[u8],
    signature: &str,
    want: Option<&str>,
    server: &str,
) -> Result<String, UpgradeError> {
    let not_signed = |why: String| {
        UpgradeError::new(
            EXIT_NOT_SIGNED,
            format!(
                "the agent from {server} is not signed by the release key pinned on this machine ({}): {why}; nothing was installed",
                release::PINNED
            ),
        )
    };
    let key = ssh_key::PublicKey::from_openssh(pinned.trim())
        .map_err(|e| not_signed(format!("the pinned key is not an OpenSSH public key ({e})")))?;
    release::verify(&key, build, signature).map_err(not_signed)?;
    let sha = hex::encode(Sha256::digest(build));
    if let Some(want) = want {
        let want = want.trim().to_ascii_lowercase();
        let named = (release::BUILD_ID_HEX..=64).contains(&want.len())
            && want.bytes().all(|b| b.is_ascii_hexdigit());
        if !named {
            return Err(UpgradeError::new(
                EXIT_OTHER,
                format!(
                    "--build {want:?} is not a build: 12 to 64 hex digits of its sha256; nothing was installed"
                ),
            ));
        }
        if !sha.starts_with(&want) {
            return Err(UpgradeError::new(
                EXIT_OTHER_BUILD,
                format!(
                    "{server} serves build {} for {}, not {want}; nothing was installed",
                    release::build_id(&sha),
                    std::env::consts::ARCH
                ),
            ));
        }
    }
    Ok(sha)
}

/// `url`'s body, `None` on a 404; anything else but a 200 is a refusal.
fn fetch(
    client: &reqwest::blocking::Client,
    server: &str,
    url: &str,
) -> Result<Option<Vec<u8>>, UpgradeError> {
    let resp = client.get(url).send().map_err(|e| {
        UpgradeError::new(
            EXIT_UNREACHABLE,
            format!(
                "could not reach {server} (fetching {url}): {}; nothing was installed",
                crate::report::chain(&e.without_url())
            ),
        )
    })?;
    match resp.status().as_u16() {
        200 => {}
        404 => return Ok(None),
        code => {
            return Err(UpgradeError::new(
                EXIT_OTHER,
                format!("{server} answered {code} for {url}; nothing was installed"),
            ));
        }
    }
    let mut body = Vec::new();
    resp.take(MAX_BUILD + 1)
        .read_to_end(&mut body)
        .map_err(|e| {
            UpgradeError::new(
                EXIT_UNREACHABLE,
                format!("reading {url} from {server}: {e}; nothing was installed"),
            )
        })?;
    if body.len() as u64 > MAX_BUILD {
        return Err(UpgradeError::new(
            EXIT_OTHER,
            format!("{url} is larger than {MAX_BUILD} bytes; nothing was installed"),
        ));
    }
    Ok(Some(body))
}

/// A root-only staging directory under /run, as install.sh's `mktemp -d`.
fn stage_dir() -> Result<PathBuf, UpgradeError> {
    use std::os::unix::fs::DirBuilderExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = PathBuf::from(format!(
        "/run/enverge-install.{}-{nanos:09}",
        std::process::id()
    ));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| {
            UpgradeError::new(
                EXIT_OTHER,
                format!("creating {}: {e}; nothing was installed", dir.display()),
            )
        })?;
    Ok(dir)
}

/// Removes the staging directory however the upgrade ends.
struct Staged(PathBuf);
impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_trimmed(host: &mut LocalHost, path: &str) -> Result<Option<String>, UpgradeError> {
    let bytes = host
        .read(path)
        .map_err(|e| UpgradeError::new(EXIT_OTHER, format!("reading {path}: {e}")))?;
    Ok(bytes
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .filter(|s| !s.is_empty()))
}

/// `byo-agent upgrade [--build B]`, as root on an enrolled host.
pub fn run(want: Option<&str>) -> Result<(), UpgradeError> {
    let mut host = LocalHost::default();
    let uid = host
        .run(&["id", "-u"], None)
        .map(|o| o.stdout.trim().to_owned())
        .unwrap_or_default();
    if uid != "0" {
        return Err(UpgradeError::new(
            EXIT_OTHER,
            "run as root: sudo byo-agent upgrade",
        ));
    }
    if read_trimmed(&mut host, CREDENTIALS)?.is_none() {
        return Err(UpgradeError::new(
            EXIT_OTHER,
            format!(
                "this machine is not enrolled ({CREDENTIALS} is missing): the owner's one-liner with a token installs and enrols it; nothing was installed"
            ),
        ));
    }
    let Some(server) = read_trimmed(&mut host, SERVER_FILE)? else {
        return Err(UpgradeError::new(
            EXIT_OTHER,
            format!(
                "{SERVER_FILE} is missing: this machine does not know its server; the owner's one-liner records it; nothing was installed"
            ),
        ));
    };
    let server = server.trim_end_matches('/').to_owned();
    let Some(pinned) = read_trimmed(&mut host, release::PINNED)? else {
        return Err(UpgradeError::new(
            EXIT_NOT_SIGNED,
            format!(
                "no release key is pinned on this machine ({}), so no build can be verified here: the owner's one-liner run once pins the key its server names; nothing was installed",
                release::PINNED
            ),
        ));
    };

    let arch = std::env::consts::ARCH;
    let client = reqwest::blocking::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(600))
        .build()
        .map_err(|e| UpgradeError::new(EXIT_OTHER, e.to_string()))?;
    let url = format!("{server}/agent/byo-agent-{arch}");
    let Some(build) = fetch(&client, &server, &url)? else {
        return Err(UpgradeError::new(
            EXIT_NO_BUILD,
            format!(
                "no agent build for {arch}: {server} offers no byo-agent-{arch}; nothing was installed"
            ),
        ));
    };
    let Some(signature) = fetch(&client, &server, &format!("{url}.sig"))? else {
        return Err(UpgradeError::new(
            EXIT_NOT_SIGNED,
            format!(
                "{server} offers byo-agent-{arch} without its signature (.sig); nothing was installed"
            ),
        ));
    };
    let sha = judge(
        &pinned,
        &build,
        &String::from_utf8_lossy(&signature),
        want,
        &server,
    )?;
    println!(
        "Fetched build {} for {arch} from {server} ({:.1} MB), signed by the release key pinned on this machine.",
        release::build_id(&sha),
        build.len() as f64 / 1e6
    );

    let stage = Staged(stage_dir()?);
    let staged = stage.0.join("byo-agent");
    write_executable(&staged, &build)?;
    let path = staged.to_string_lossy().into_owned();
    // A build that cannot run here (another arch, another libc) stops before anything is
    // replaced: the rollback could not save a host from it.
    let version = ran(&mut host, &[&path, "--version"]).map_err(|said| {
        UpgradeError::new(
            EXIT_OTHER,
            format!("the agent from {server} does not run on this machine (byo-agent --version: {said}); nothing was installed"),
        )
    })?;
    // The new build installs itself: its units and rollback script, not this build's.
    let finish = ran(&mut host, &[&path, "finish-script"]).map_err(|said| {
        UpgradeError::new(
            EXIT_OTHER,
            format!("the agent from {server} cannot say how it is installed (byo-agent finish-script: {said}); nothing was installed"),
        )
    })?;
    let finish_path = stage.0.join("finish.sh");
    write_executable(&finish_path, finish.as_bytes())?;
    println!("It runs here ({}); installing it.", version.trim());
    let log = stage.0.join("log");
    let out = host
        .run(
            &[
                "systemd-run",
                &format!("--unit={}", units::INSTALL_UNIT),
                "--collect",
                "--quiet",
                "--wait",
                "-p",
                &format!("StandardOutput=append:{}", log.display()),
                "-p",
                &format!("StandardError=append:{}", log.display()),
                "/bin/bash",
                &finish_path.to_string_lossy(),
                &stage.0.to_string_lossy(),
            ],
            None,
        )
        .map_err(|e| UpgradeError::new(EXIT_OTHER, format!("running systemd-run: {e}")))?;
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    if !out.ok() {
        eprint!("{said}");
        return Err(UpgradeError::new(
            EXIT_OTHER,
            format!(
                "the detached install ({unit}) failed or another install is running: {}; see journalctl -u {unit}",
                crate::host::last_lines(&out.stderr, &out.stdout),
                unit = units::INSTALL_UNIT
            ),
        ));
    }
    print!("{said}");
    println!("Upgraded to build {}.", release::build_id(&sha));
    Ok(())
}

fn write_executable(path: &Path, bytes: &[u8]) -> Result<(), UpgradeError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| {
            UpgradeError::new(
                EXIT_OTHER,
                format!("writing {}: {e}; nothing was installed", path.display()),
            )
        })
}

/// A program's standard output when it exits 0, else what it said.
fn ran(host: &mut LocalHost, argv: &[&str]) -> Result<String, String> {
    match host.run(argv, None) {
        Ok(out) if out.ok() => Ok(out.stdout),
        Ok(out) => Err(format!(
            "exit {}: {}",
            out.code,
            crate::host::last_lines(&out.stderr, &out.stdout)
        )),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SERVER: &str = "https://app.example.com";

    fn signed(build: &[u8], key: &ssh_key::PrivateKey) -> String {
        release::sign(key, build).unwrap()
    }

    /// The judge passes only a build the pinned key signed, and only the build asked for;
    /// every refusal says nothing was installed and carries its exit status.
    #[test]
    fn only_a_build_the_pinned_key_signed_and_the_one_asked_for_is_installed() {
        let key = byo_core::keylist_testing::private_key();
        let pinned = key.public_key().to_openssh().unwrap();
        let build = b"\x7fELF a build".to_vec();
        let sha = hex::encode(Sha256::digest(&build));
        let sig = signed(&build, &key);

        assert_eq!(judge(&pinned, &build, &sig, None, SERVER).unwrap(), sha);
        assert_eq!(
            judge(
                &pinned,
                &build,
                &sig,
                Some(&sha[..12].to_uppercase()),
                SERVER
            )
            .unwrap(),
            sha
        );
        assert_eq!(
            judge(&pinned, &build, &sig, Some(&sha), SERVER).unwrap(),
            sha
        );

        let refused = |r: Result<String, UpgradeError>, code: u8, says: &str| {
            let e = r.expect_err(says);
            assert_eq!(e.code, code, "{e}");
            assert!(e.message.contains(says), "{says:?} not in {e}");
            assert!(e.message.ends_with("nothing was installed"), "{e}");
        };
        let not_signed =
            "is not signed by the release key pinned on this machine (/etc/enverge/release-key)";
        // Another key's signature (a server naming its own key), other bytes, no signature.
        let other = byo_core::keylist_testing::private_key();
        refused(
            judge(&pinned, &build, &signed(&build, &other), None, SERVER),
            EXIT_NOT_SIGNED,
            not_signed,
        );
        refused(
            judge(&pinned, b"\x7fELF tampered", &sig, None, SERVER),
            EXIT_NOT_SIGNED,
            not_signed,
        );
        refused(
            judge(&pinned, &build, "not a signature", None, SERVER),
            EXIT_NOT_SIGNED,
            not_signed,
        );
        refused(
            judge("not a key", &build, &sig, None, SERVER),
            EXIT_NOT_SIGNED,
            "the pinned key is not an OpenSSH public key",
        );
        // Signed, but not what the operator named.
        refused(
            judge(&pinned, &build, &sig, Some("000000000000"), SERVER),
            EXIT_OTHER_BUILD,
            &format!("{SERVER} serves build {} for", &sha[..12]),
        );
        refused(
            judge(&pinned, &build, &sig, Some(&sha[..11]), SERVER),
            EXIT_OTHER,
            "is not a build",
        );
    }
}
