//! `byo release sign|publish|check` (issue #14, 1; J "publishing is not delivery").
//!
//! - `sign` runs where the release key is: it reads the private half from standard input,
//!   signs the build (`byo_core::release::sign`) and writes `<build>.sig`. Nothing is sent.
//! - `publish` uploads the build and its signature; the server verifies the signature against
//!   its own `release_key` before it records anything, and from then on the installer's path
//!   serves it. No host changes build until the one-liner runs there (`byo fleet upgrade`).
//! - `check` fetches exactly what an owner's one-liner fetches, through the public URL:
//!   install.sh, then the URLs install.sh itself names (read out of it, not re-derived),
//!   checks the digest, the signature against the key install.sh carries (or the one pinned
//!   with `--key`), and runs `byo-agent --version`; every broken link is named and the exit
//!   is non-zero. The lesson it exists for: a config pointing the installer at a blob base that
//!   served nothing went unnoticed while every one-liner was broken.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use byo_core::release;
use byo_wire::fleet::{ReleaseView, SIGNATURE_HEADER};
use sha2::{Digest, Sha256};

#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Run it on the machine that holds the release key, never on a server. The private half is read
from standard input and used in this process only; the signature is written beside the build.

Example:
  byo release sign --build target/release/byo-agent < ~/secrets/release-key
  # then: byo release publish --server https://app.enverge.ai --email me@enverge.ai \\
  #         --build target/release/byo-agent")]
pub struct SignArgs {
    /// The agent build to sign.
    #[arg(long)]
    pub build: PathBuf,
    /// Where to write the signature (default: the build's path with .sig appended).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Uploads the build and its signature (made by `byo release sign`) as a superadmin. The server
verifies the signature against its configured release key and refuses, changing nothing, a
signature by any other key, a build that is not an executable of the arch it is published for,
or a build already published. From then on https://<server>/install.sh fetches it for that
arch; no host changes build until the one-liner runs there (byo fleet upgrade).

Example:
  BYO_PASSWORD=… byo release publish --server https://app.enverge.ai --email me@enverge.ai \\
      --build target/aarch64-unknown-linux-gnu/release/byo-agent")]
pub struct PublishArgs {
    /// The control plane's URL.
    #[arg(long, env = "BYO_SERVER", default_value = "http://localhost:8080")]
    pub server: String,
    /// Your account (a superadmin). The password comes from BYO_PASSWORD or the terminal.
    #[arg(long, env = "BYO_EMAIL")]
    pub email: String,
    /// The agent build.
    #[arg(long)]
    pub build: PathBuf,
    /// Its signature (default: the build's path with .sig appended).
    #[arg(long)]
    pub sig: Option<PathBuf>,
    /// The architecture it is for, as uname -m prints it (default: read from the ELF header).
    #[arg(long)]
    pub arch: Option<String>,
    /// Its version (default: what `<build> --version` prints, when it runs here).
    #[arg(long)]
    pub version: Option<String>,
}

#[derive(Debug, clap::Args)]
#[command(after_long_help = "\
Follows the path an owner's installer follows, through the public URL, and says which link is
broken: install.sh itself; the build, its .sha256 and its .sig at the URLs install.sh names;
the digest; the signature, against the release key install.sh carries (and, with --key, the
key you pinned); and the build running (`byo-agent --version`, for this machine's arch).
Exits non-zero when any link is broken.

Examples:
  byo release check --server https://app.enverge.ai
  byo release check --server https://app.enverge.ai --arch aarch64 --arch x86_64 \\
      --key \"$(cat release-key.pub)\"")]
pub struct CheckArgs {
    /// The public URL owners' one-liners use.
    #[arg(long, env = "BYO_SERVER")]
    pub server: String,
    /// The architectures to check (default: this machine's).
    #[arg(long)]
    pub arch: Vec<String>,
    /// The release key the builds must be signed by (an OpenSSH public key line); without it,
    /// the key install.sh carries.
    #[arg(long)]
    pub key: Option<String>,
}

fn sig_path(build: &Path) -> PathBuf {
    let mut p = build.as_os_str().to_owned();
    p.push(".sig");
    PathBuf::from(p)
}

pub fn sign(args: SignArgs) -> anyhow::Result<()> {
    let bytes = std::fs::read(&args.build)
        .with_context(|| format!("reading the build {}", args.build.display()))?;
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading the release key from standard input")?;
    if !text.contains("PRIVATE KEY-----") {
        bail!("no private key on standard input: pipe the release key's private half in");
    }
    let key = ssh_key::PrivateKey::from_openssh(text.trim())
        .context("the release key on standard input does not parse")?;
    drop(text);
    if key.is_encrypted() {
        bail!(
            "the release key is passphrase-protected: pipe in a decrypted copy (it stays in this process)"
        );
    }
    let signature = release::sign(&key, &bytes).map_err(anyhow::Error::msg)?;
    // What was signed must verify, before anyone uploads it.
    release::verify(key.public_key(), &bytes, &signature).map_err(anyhow::Error::msg)?;
    let out = args.out.unwrap_or_else(|| sig_path(&args.build));
    std::fs::write(&out, &signature).with_context(|| format!("writing {}", out.display()))?;
    let sha = hex::encode(Sha256::digest(&bytes));
    println!(
        "signed {} (sha256 {sha}, build {}) with {}",
        args.build.display(),
        release::build_id(&sha),
        key.public_key().fingerprint(ssh_key::HashAlg::Sha256)
    );
    println!("signature: {}", out.display());
    Ok(())
}

/// A client signed in as `email` (password from BYO_PASSWORD or the terminal).
pub async fn signed_in(base: &str, email: &str) -> anyhow::Result<reqwest::Client> {
    let client = reqwest::Client::builder().cookie_store(true).build()?;
    let password = match std::env::var("BYO_PASSWORD") {
        Ok(p) => p,
        Err(_) => rpassword::prompt_password(format!("Password for {email}: ")).context(
            "asking for the password on the terminal; where there is none, set BYO_PASSWORD",
        )?,
    };
    let login = client
        .post(format!("{base}/api/auth/login"))
        .json(&serde_json::json!({"email": email, "password": password}))
        .send()
        .await
        .with_context(|| format!("reaching {base}"))?;
    if !login.status().is_success() {
        bail!(
            "signing in failed: {}",
            login.text().await.unwrap_or_default()
        );
    }
    Ok(client)
}

/// The server's refusal, in its own words.
pub async fn refusal(what: &str, resp: reqwest::Response) -> anyhow::Error {
    let status = resp.status();
    let body = resp.text().await.unwrap_or_default();
    let message = serde_json::from_str::<byo_wire::api::ErrorBody>(&body)
        .map(|e| e.message)
        .unwrap_or(body);
    anyhow::anyhow!("{what}: the server answered {status}: {message}")
}

fn version_of(build: &Path) -> anyhow::Result<String> {
    let out = Command::new(build)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} --version", build.display()))?;
    if !out.status.success() {
        bail!("{} --version exited {}", build.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

pub async fn publish(args: PublishArgs) -> anyhow::Result<()> {
    let base = args.server.trim_end_matches('/').to_owned();
    let bytes = std::fs::read(&args.build)
        .with_context(|| format!("reading the build {}", args.build.display()))?;
    let sig = args.sig.clone().unwrap_or_else(|| sig_path(&args.build));
    let signature = std::fs::read_to_string(&sig).with_context(|| {
        format!(
            "reading the signature {} (make it with byo release sign, where the release key is)",
            sig.display()
        )
    })?;
    let arch = match args
        .arch
        .clone()
        .or_else(|| release::elf_arch(&bytes).map(str::to_owned))
    {
        Some(a) => a,
        None => bail!(
            "{} is not an ELF executable this command can read the arch of: pass --arch",
            args.build.display()
        ),
    };
    let version = match args.version.clone() {
        Some(v) => v,
        None if arch == std::env::consts::ARCH => version_of(&args.build)?,
        None => bail!("the build is for {arch}, which cannot run here: pass --version"),
    };
    let client = signed_in(&base, &args.email).await?;
    let resp = client
        .post(format!("{base}/api/admin/releases/{arch}"))
        .query(&[("version", version.as_str())])
        .header(
            SIGNATURE_HEADER,
            base64::engine::general_purpose::STANDARD.encode(signature.as_bytes()),
        )
        .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
        .body(bytes)
        .send()
        .await
        .with_context(|| format!("uploading to {base}"))?;
    if !resp.status().is_success() {
        return Err(refusal("publishing refused", resp).await);
    }
    let r: ReleaseView = resp.json().await?;
    println!(
        "published byo-agent-{} {} — build {} (sha256 {}, {} bytes)",
        r.arch, r.version, r.build, r.sha256, r.size_bytes
    );
    println!("{base}/install.sh now installs it on {} hosts.", r.arch);
    println!(
        "No host changed build. Check the path owners follow: byo release check --server {base} --arch {}",
        r.arch
    );
    println!(
        "Deliver it: byo fleet upgrade --server {base} --build {}",
        r.build
    );
    Ok(())
}

/// The URLs install.sh fetches the agent from, read out of the script as served: the
/// server it names, and the three `fetch` templates with `$server` and `$arch` filled in.
#[derive(Debug, PartialEq, Eq)]
pub struct InstallerPath {
    pub server: String,
    pub release_key: String,
    pub build: String,
    pub digest: String,
    pub signature: String,
}

fn quoted_assignment(script: &str, name: &str) -> Option<String> {
    script.lines().find_map(|l| {
        l.strip_prefix(&format!("{name}='"))
            .and_then(|rest| rest.strip_suffix('\''))
            .map(str::to_owned)
    })
}

/// Read the installer's path for `arch` out of `script`.
pub fn installer_path(script: &str, arch: &str) -> Result<InstallerPath, String> {
    if !script.starts_with("#!") || !script.contains("byo host installer") {
        return Err("it is not the byo installer (no shebang and installer banner)".into());
    }
    let server =
        quoted_assignment(script, "server").ok_or("it names no server (no server='…' line)")?;
    let release_key = quoted_assignment(script, "release_key").unwrap_or_default();
    let mut build = None;
    let mut digest = None;
    let mut signature = None;
    for line in script.lines() {
        let Some(rest) = line.split("fetch \"").nth(1) else {
            continue;
        };
        let Some(template) = rest.split('"').next() else {
            continue;
        };
        if !template.contains("byo-agent-$arch") {
            continue;
        }
        let url = template.replace("$server", &server).replace("$arch", arch);
        let slot = if template.ends_with(".sha256") {
            &mut digest
        } else if template.ends_with(".sig") {
            &mut signature
        } else {
            &mut build
        };
        slot.get_or_insert(url);
    }
    Ok(InstallerPath {
        build: build.ok_or("it fetches no byo-agent-$arch build")?,
        digest: digest.ok_or("it fetches no byo-agent-$arch.sha256")?,
        signature: signature.ok_or("it fetches no byo-agent-$arch.sig")?,
        server,
        release_key,
    })
}

/// One link's outcome, as printed.
struct Links {
    broken: Vec<String>,
}

impl Links {
    fn ok(&self, what: &str) {
        println!("  ok    {what}");
    }
    fn broken(&mut self, what: String) {
        println!("  FAIL  {what}");
        self.broken.push(what);
    }
}

async fn fetch(client: &reqwest::Client, url: &str) -> Result<Vec<u8>, String> {
    let resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("could not be fetched: {e}"))?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!("answered {status}"));
    }
    resp.bytes()
        .await
        .map(|b| b.to_vec())
        .map_err(|e| format!("broke off: {e}"))
}

/// Run `bytes` as a program with `--version`, with a deadline.
fn runs(bytes: &[u8]) -> Result<String, String> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("byo-agent");
    std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    let mut child = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("does not start here: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("did not answer --version within 10 s".into());
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(said.trim().to_owned())
    } else {
        Err(format!(
            "--version exited {}: {}",
            out.status,
            said.trim().chars().take(300).collect::<String>()
        ))
    }
}

pub async fn check(args: CheckArgs) -> anyhow::Result<()> {
    let base = args.server.trim_end_matches('/').to_owned();
    let arches = if args.arch.is_empty() {
        vec![std::env::consts::ARCH.to_owned()]
    } else {
        args.arch.clone()
    };
    let pinned = args
        .key
        .as_deref()
        .map(|k| {
            ssh_key::PublicKey::from_openssh(k.trim()).context("--key is not an OpenSSH public key")
        })
        .transpose()?;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let started = Instant::now();
    let mut links = Links { broken: Vec::new() };
    let installer = format!("{base}/install.sh");
    println!("Checking the path an owner's one-liner follows: curl -fsSL {installer} | sudo bash");
    let script = match fetch(&client, &installer).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => {
            links.broken(format!("install.sh: {installer} {e}"));
            return finish(links, started);
        }
    };
    for arch in &arches {
        let path = match installer_path(&script, arch) {
            Ok(p) => p,
            Err(e) => {
                links.broken(format!("install.sh: {installer} {e}"));
                return finish(links, started);
            }
        };
        if path.server.trim_end_matches('/') != base {
            links.broken(format!(
                "install.sh sends the installer to {} for its builds, not to {base} where it was served (the server's public_url)",
                path.server
            ));
        } else {
            links.ok(&format!("install.sh from {installer}"));
        }
        let carried = ssh_key::PublicKey::from_openssh(path.release_key.trim()).ok();
        let key = match (&pinned, &carried) {
            (Some(p), Some(c)) if p.key_data() != c.key_data() => {
                links.broken(format!(
                    "install.sh carries release key {}, not the pinned {}: a first install would trust the wrong key",
                    c.fingerprint(ssh_key::HashAlg::Sha256),
                    p.fingerprint(ssh_key::HashAlg::Sha256)
                ));
                Some(p.clone())
            }
            (Some(p), _) => Some(p.clone()),
            (None, Some(c)) => Some(c.clone()),
            (None, None) => {
                links.broken("install.sh carries no release key (the server's release_key is not set): a first install cannot verify any build".into());
                None
            }
        };
        println!("{arch}:");
        let build = fetch(&client, &path.build).await;
        let digest = fetch(&client, &path.digest).await;
        let signature = fetch(&client, &path.signature).await;
        match &build {
            Ok(b) => links.ok(&format!("build {} ({} bytes)", path.build, b.len())),
            Err(e) => links.broken(format!("build: {} {e}", path.build)),
        }
        match &digest {
            Ok(_) => links.ok(&format!("digest {}", path.digest)),
            Err(e) => links.broken(format!("digest: {} {e}", path.digest)),
        }
        match &signature {
            Ok(_) => links.ok(&format!("signature {}", path.signature)),
            Err(e) => links.broken(format!("signature: {} {e}", path.signature)),
        }
        let Ok(build) = build else { continue };
        let actual = hex::encode(Sha256::digest(&build));
        if let Ok(d) = &digest {
            let expected = String::from_utf8_lossy(d)
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_ascii_lowercase();
            if expected == actual {
                links.ok(&format!(
                    "digest matches (sha256 {actual}, build {})",
                    release::build_id(&actual)
                ));
            } else {
                links.broken(format!(
                    "digest mismatch: {} says {expected:?}, the build is {actual}; install.sh refuses it",
                    path.digest
                ));
            }
        }
        if let (Ok(s), Some(key)) = (&signature, &key) {
            match release::verify(key, &build, &String::from_utf8_lossy(s)) {
                Ok(()) => links.ok(&format!(
                    "signed by the release key {}",
                    key.fingerprint(ssh_key::HashAlg::Sha256)
                )),
                Err(e) => links.broken(format!(
                    "signature: not the release key's {} over this build ({e}); install.sh refuses it",
                    key.fingerprint(ssh_key::HashAlg::Sha256)
                )),
            }
        }
        if arch == std::env::consts::ARCH {
            match tokio::task::spawn_blocking(move || runs(&build)).await? {
                Ok(said) => links.ok(&format!("runs: byo-agent --version says {said:?}")),
                Err(e) => links.broken(format!(
                    "the build does not run: {e}; install.sh refuses it"
                )),
            }
        } else {
            println!(
                "  --    not run: it is for {arch}, this machine is {}",
                std::env::consts::ARCH
            );
        }
    }
    finish(links, started)
}

fn finish(links: Links, started: Instant) -> anyhow::Result<()> {
    let took = started.elapsed().as_secs_f64();
    if links.broken.is_empty() {
        println!("Every link of the installer's path works ({took:.1} s).");
        Ok(())
    } else {
        bail!(
            "{} link(s) of the installer's path are broken ({took:.1} s): {}",
            links.broken.len(),
            links.broken.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_installer_path_is_read_out_of_the_served_script() {
        let script = byo_server::pages::install::install_script(
            "https://app.example.com/",
            Some("ssh-ed25519 AAAAkey release"),
        );
        let p = installer_path(&script, "aarch64").unwrap();
        assert_eq!(
            p,
            InstallerPath {
                server: "https://app.example.com".into(),
                release_key: "ssh-ed25519 AAAAkey release".into(),
                build: "https://app.example.com/agent/byo-agent-aarch64".into(),
                digest: "https://app.example.com/agent/byo-agent-aarch64.sha256".into(),
                signature: "https://app.example.com/agent/byo-agent-aarch64.sig".into(),
            }
        );
        // A blob base elsewhere is followed, as the one-liner would follow it.
        let moved = script.replace("\"$server/agent/", "\"https://blobs.example.net/agent/");
        let p = installer_path(&moved, "x86_64").unwrap();
        assert_eq!(p.build, "https://blobs.example.net/agent/byo-agent-x86_64");
        assert!(
            installer_path("<html>404</html>", "x86_64")
                .unwrap_err()
                .contains("not the byo installer")
        );
        let no_sig = script.replace("byo-agent-$arch.sig", "byo-agent.sig");
        assert!(
            installer_path(&no_sig, "x86_64")
                .unwrap_err()
                .contains(".sig")
        );
    }
}
