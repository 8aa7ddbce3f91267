//! What the platform tests in this crate share: the binaries `cargo test --workspace` built
//! beside them, and a release directory holding the agent the installer fetches.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

pub mod platform;

/// A sibling binary of this test, built by `cargo test --workspace`.
/// A failed preparation attempt the real unit retries on its own, 30 s later: relay-peer
/// while the relay has no public address yet, and a base image whose build found no egress
/// (the bed reaches the Debian mirror through this machine's uplink, which is not ours and
/// has dropped connections for half a minute under another lane's installs). Anything else
/// fails the test at once.
pub fn retried_prepare_failure(error: &str) -> bool {
    let retried = error.contains("the relay has no public address yet")
        || error.contains("build-base-image: no egress:");
    if retried && error.contains("no egress") {
        eprintln!("preparation attempt failed outside the bed, the unit retries it: {error}");
    }
    retried
}

pub fn sibling(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(
        bin.exists(),
        "{} is not built: run the workspace's tests (cargo test --workspace)",
        bin.display()
    );
    bin
}

/// The release key this test process signs agent builds with (install.sh carries its public
/// half: `Config::release_key`).
pub fn release_key() -> &'static ssh_key::PrivateKey {
    static KEY: std::sync::OnceLock<ssh_key::PrivateKey> = std::sync::OnceLock::new();
    KEY.get_or_init(byo_core::keylist_testing::private_key)
}

/// `Config::release_key` for [`release_key`].
pub fn release_public() -> String {
    release_key().public_key().to_openssh().unwrap()
}

/// `bytes` in `dir` as the agent build for `arch`: the binary, its `.sha256` and its `.sig`
/// by `key`.
pub fn publish_agent(dir: &Path, arch: &str, bytes: &[u8], key: &ssh_key::PrivateKey) {
    use sha2::Digest;
    std::fs::write(dir.join(format!("byo-agent-{arch}")), bytes).unwrap();
    std::fs::write(
        dir.join(format!("byo-agent-{arch}.sha256")),
        format!(
            "{}  byo-agent-{arch}\n",
            hex::encode(sha2::Sha256::digest(bytes))
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join(format!("byo-agent-{arch}.sig")),
        byo_core::release::sign(key, bytes).unwrap(),
    )
    .unwrap();
}

/// A release directory holding the agent for `arches`, and the relay daemon
/// (`byo-relay-<arch>`, what a relay's first-boot script fetches).
pub fn release(dir: &Path, arches: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let relay = std::fs::read(sibling("byo-relay")).unwrap();
    std::fs::write(
        dir.join(format!("byo-relay-{}", std::env::consts::ARCH)),
        relay,
    )
    .unwrap();
    let agent = std::fs::read(sibling("byo-agent")).unwrap();
    for arch in arches {
        publish_agent(dir, arch, &agent, release_key());
    }
    dir.to_owned()
}

/// The relay daemon's sha256 (hex), as a relay's first-boot script checks it.
pub fn relay_sha256() -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(
        std::fs::read(sibling("byo-relay")).unwrap(),
    ))
}

/// How the tests' ssh runs, beside `-i <key>`: no config, no host-key prompt, that key only,
/// a bounded connect, errors only.
pub const SSH_OPTIONS: [&str; 14] = [
    "-F",
    "/dev/null",
    "-o",
    "StrictHostKeyChecking=no",
    "-o",
    "UserKnownHostsFile=/dev/null",
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=3",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "IdentitiesOnly=yes",
];

/// `ssh <args…>` as a person runs it, with `key` only, no config, no host-key prompt and
/// a bounded connect: the remote command's output when the login worked, else what ssh
/// said.
pub fn ssh(key: &Path, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("ssh")
        .args(["-i"])
        .arg(key)
        .args(SSH_OPTIONS)
        .args(args)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The built `byo` with its config (the token `byo login` keeps) in `config`, as a customer
/// runs it: `stdin` fed to it, its output kept.
pub fn byo_cli(config: &Path, args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = byo_command(config, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("byo runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// [`byo_cli`]'s command, to start it another way.
pub fn byo_command(config: &Path, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(sibling("byo"));
    command
        .args(args)
        .env("BYO_CONFIG_DIR", config)
        .env_remove("BYO_SERVER");
    command
}

/// `byo up <args…>` started in `cwd` as a person starts it, with what its banner printed.
/// Dropping it is Ctrl-C (and, if that does not stop it, a kill).
pub struct ByoUp {
    pub child: std::process::Child,
    pub url: String,
    pub email: String,
    pub password: String,
    pub printed: String,
}

impl ByoUp {
    /// `byo up` on a free loopback port over `data_dir`, run from `cwd`.
    pub fn on_loopback(data_dir: &Path, cwd: &Path) -> ByoUp {
        ByoUp::start(
            &[
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                &data_dir.to_string_lossy(),
            ],
            cwd,
        )
    }

    pub fn start(args: &[&str], cwd: &Path) -> ByoUp {
        use std::io::BufRead;
        let mut child = std::process::Command::new(sibling("byo"))
            .arg("up")
            .args(args)
            .current_dir(cwd)
            .env_remove("BYO_DATA_DIR")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("byo up starts");
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut url, mut email, mut password, mut printed) = (None, None, None, String::new());
        while !printed.contains("Ctrl-C stops it") {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("byo up stopped before its banner:\n{printed}"))
                .unwrap();
            printed.push_str(&line);
            printed.push('\n');
            if let Some(u) = line.strip_prefix("byo is running at ") {
                url = Some(u.trim().to_owned());
            } else if let Some(e) = line.trim().strip_prefix("sign in as") {
                email = Some(e.trim().to_owned());
            } else if let Some(p) = line.trim().strip_prefix("password") {
                password = Some(p.trim().to_owned());
            }
        }
        // Keep reading, as a terminal would, so later lines never hit a closed pipe.
        std::thread::spawn(move || lines.for_each(drop));
        ByoUp {
            child,
            url: url.expect("byo up printed its URL"),
            email: email.expect("byo up printed the admin's email"),
            password: password.expect("byo up printed the admin's password"),
            printed,
        }
    }

    /// Ctrl-C, and its exit status once it stopped (within 20 s).
    pub fn interrupt(&mut self) -> Option<std::process::ExitStatus> {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            if let Some(exit) = self.child.try_wait().ok().flatten() {
                return Some(exit);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for ByoUp {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() && self.interrupt().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
