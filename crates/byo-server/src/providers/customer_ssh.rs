//! The customer's own way in (F), taken by the backend itself (issue #38, 4): OpenSSH's `ssh`,
//! as a customer runs it, to an instance's address on :22 — through DNS or the relay's
//! address, the relay's DNAT and the tunnel — with a key made for the one walk.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use ssh_key::PrivateKey;

/// One login, as a customer makes it.
#[derive(Clone, Copy, Debug)]
pub struct Login<'a> {
    /// The instance's DNS name, or its host's relay address (port 22 either way).
    pub address: &'a str,
    /// The name its host key is known under (a relay address is shared by every instance
    /// of a host: `instances::ssh_command`).
    pub host_key_alias: &'a str,
    pub key: &'a PrivateKey,
    pub command: &'a str,
    /// How long to keep trying: a fresh instance's sshd takes a moment to come up.
    pub within: Duration,
}

pub trait CustomerSsh: Send + Sync {
    /// Log in as root and run the command: its standard output, or why no login ran it.
    fn run<'a>(&'a self, login: Login<'a>) -> BoxFuture<'a, Result<String, String>>;
}

/// OpenSSH's client, as installed (`ssh` on PATH unless told otherwise).
#[derive(Clone, Debug)]
pub struct OpenSsh {
    pub program: PathBuf,
}

impl Default for OpenSsh {
    fn default() -> Self {
        OpenSsh {
            program: PathBuf::from("ssh"),
        }
    }
}

impl CustomerSsh for OpenSsh {
    fn run<'a>(&'a self, login: Login<'a>) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            // The key and a known_hosts of the walk's own, in a directory only we can read,
            // gone with the walk: nothing of it is left on the server.
            let dir = tempfile::Builder::new()
                .prefix("byo-path-walk-")
                .tempdir()
                .map_err(|e| format!("a directory for the walk's key: {e}"))?;
            let key_file = dir.path().join("key");
            let pem = login
                .key
                .to_openssh(ssh_key::LineEnding::LF)
                .map_err(|e| format!("encoding the walk's key: {e}"))?;
            write_private(&key_file, pem.as_bytes())
                .map_err(|e| format!("writing the walk's key: {e}"))?;
            let known_hosts = dir.path().join("known_hosts");
            let deadline = Instant::now() + login.within;
            let mut last = String::from("no attempt was made");
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(format!(
                        "no login within {} s; the last try: {last}",
                        login.within.as_secs()
                    ));
                }
                let connect = left.as_secs().clamp(1, 10);
                let mut cmd = tokio::process::Command::new(&self.program);
                cmd.arg("-F")
                    .arg("none")
                    .arg("-i")
                    .arg(&key_file)
                    .args(["-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"])
                    .args(["-o", "StrictHostKeyChecking=accept-new"])
                    .arg("-o")
                    .arg(format!("UserKnownHostsFile={}", known_hosts.display()))
                    .arg("-o")
                    .arg(format!("HostKeyAlias={}", login.host_key_alias))
                    .arg("-o")
                    .arg(format!("ConnectTimeout={connect}"))
                    .args(["-o", "LogLevel=ERROR", "-p", "22"])
                    .arg(format!("root@{}", login.address))
                    .arg(login.command)
                    .stdin(Stdio::null())
                    .kill_on_drop(true);
                let out = tokio::time::timeout(left + Duration::from_secs(1), cmd.output()).await;
                match out {
                    Ok(Ok(o)) if o.status.success() => {
                        return Ok(String::from_utf8_lossy(&o.stdout).into_owned());
                    }
                    Ok(Ok(o)) => {
                        let err = String::from_utf8_lossy(&o.stderr);
                        last = err
                            .lines()
                            .rfind(|l| !l.trim().is_empty())
                            .unwrap_or("ssh failed and said nothing")
                            .trim()
                            .to_owned();
                        // The agent answers a create once the key is in, so an sshd that
                        // refuses it is not the instance's, or not taking its key: trying
                        // again changes nothing. Anything short of that (no route, the
                        // connection refused or closed while sshd comes up) is tried again.
                        if last.contains("Permission denied") {
                            return Err(last);
                        }
                    }
                    Ok(Err(e)) => {
                        return Err(format!("running {}: {e}", self.program.display()));
                    }
                    Err(_) => last = "ssh did not finish in time".to_owned(),
                }
                tokio::time::sleep(Duration::from_secs(1).min(left)).await;
            }
        })
    }
}

fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}
