//! `byo keys sign`: sign the waiting operator-key list on the operator's own machine (M.7).
//!
//! What the operator reads is decoded from the very bytes that will be signed, with
//! control characters escaped, so a tampered page cannot show one list and get another
//! signed. The private half of the signing key is loaded from standard input or the
//! clipboard into an ssh-agent this command starts and stops itself; it is never written
//! to disk, and there is no fallback to a key file. The signature is checked against the
//! displayed bytes before it is uploaded.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use byo_core::keylist::{self, KeyList, NAMESPACE, check_key, escape_control};
use byo_wire::api::{OperatorKeysView, PushOutcome, SignatureUpload};
use ssh_key::PublicKey;

#[derive(Debug, clap::Args)]
pub struct SignArgs {
    /// The control plane's URL.
    #[arg(long, env = "BYO_SERVER", default_value = "http://localhost:8080")]
    pub server: String,
    /// Your account (a superadmin: publishing takes a superadmin session and the signing key).
    #[arg(long, env = "BYO_EMAIL")]
    pub email: String,
    /// Read the signing key's private half from the clipboard (wl-paste, xclip or xsel)
    /// and clear the clipboard once the agent holds it. Without this flag it is read from
    /// standard input.
    #[arg(long)]
    pub from_clipboard: bool,
    /// Sign without asking for confirmation (the list is still printed).
    #[arg(long)]
    pub yes: bool,
}

/// What the operator is shown: the list decoded from `body`, each key with its
/// fingerprint, marked against the published list.
pub fn describe(body: &str, published: Option<&KeyList>) -> anyhow::Result<(KeyList, String)> {
    let list = KeyList::from_canonical(body)
        .map_err(|e| anyhow::anyhow!("the draft is not a valid list: {e}"))?;
    let checked = list
        .check()
        .map_err(|e| anyhow::anyhow!("the draft would be refused by every host: {e}"))?;
    let mut out = format!(
        "Operator-key list version {} for environment {}\n  issued {}, expires {}, {} signature(s) needed\n",
        list.version,
        escape_control(&list.environment),
        list.issued_at,
        list.expires,
        list.threshold
    );
    let was_listed = |fp: &str| {
        published.is_some_and(|p| {
            p.keys
                .iter()
                .any(|k| check_key(k).is_ok_and(|c| c.fingerprint == fp))
        })
    };
    for k in &checked {
        let mark = if published.is_none() || was_listed(&k.fingerprint) {
            " "
        } else {
            "+"
        };
        out.push_str(&format!(
            "  {mark} {}  operator {}  machine {}\n",
            k.fingerprint,
            escape_control(&k.key.user_sub),
            escape_control(&k.key.label)
        ));
    }
    if let Some(p) = published {
        for k in &p.keys {
            if let Ok(c) = check_key(k)
                && !checked.iter().any(|n| n.fingerprint == c.fingerprint)
            {
                out.push_str(&format!(
                    "  - {}  operator {}  machine {}  (removed)\n",
                    c.fingerprint,
                    escape_control(&k.user_sub),
                    escape_control(&k.label)
                ));
            }
        }
    }
    Ok((list, out))
}

/// An ssh-agent of our own, on a socket in a private temporary directory, killed on drop.
struct Agent {
    child: Child,
    dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> anyhow::Result<Agent> {
        let dir = tempfile::Builder::new().prefix("byo-sign-").tempdir()?;
        let socket = dir.path().join("agent.sock");
        let child = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting ssh-agent (is openssh-client installed?)")?;
        let deadline = Instant::now() + Duration::from_secs(5);
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!("ssh-agent did not open its socket");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Agent { child, dir })
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("agent.sock")
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SSH_AUTH_SOCK", self.socket())
            .env_remove("SSH_AGENT_PID");
        c
    }

    /// Hand the private key to the agent through a pipe.
    fn add(&self, private_key: &[u8]) -> anyhow::Result<()> {
        let mut child = self
            .command("ssh-add")
            .arg("-q")
            .arg("-")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("running ssh-add")?;
        child.stdin.take().expect("piped").write_all(private_key)?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "the agent did not accept the key: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn public_key(&self) -> anyhow::Result<PublicKey> {
        let out = self.command("ssh-add").arg("-L").output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().next().context("the agent holds no key")?;
        PublicKey::from_openssh(line).context("the agent's key does not parse")
    }

    /// Sign `body` with the agent's key. ssh-keygen reads the body from a file it is
    /// given only the public key for, so the private half stays in the agent.
    fn sign(&self, public: &PublicKey, body: &[u8]) -> anyhow::Result<String> {
        let pub_path = self.dir.path().join("signing.pub");
        std::fs::write(&pub_path, public.to_openssh()?)?;
        let body_path = self.dir.path().join("list.json");
        std::fs::write(&body_path, body)?;
        let out = self
            .command("ssh-keygen")
            .args(["-Y", "sign", "-n", NAMESPACE, "-f"])
            .arg(&pub_path)
            .arg(&body_path)
            .stdin(Stdio::null())
            .output()
            .context("running ssh-keygen -Y sign")?;
        if !out.status.success() {
            bail!(
                "ssh-keygen could not sign: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(std::fs::read_to_string(sig_path(&body_path))?)
    }
}

fn sig_path(body: &Path) -> PathBuf {
    let mut p = body.as_os_str().to_owned();
    p.push(".sig");
    PathBuf::from(p)
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Run the first clipboard tool that works.
fn clipboard(read: bool) -> anyhow::Result<Vec<u8>> {
    let tools: &[(&str, &[&str], &[&str])] = &[
        ("wl-paste", &["--no-newline"], &[]),
        (
            "xclip",
            &["-o", "-selection", "clipboard"],
            &["-i", "-selection", "clipboard"],
        ),
        (
            "xsel",
            &["--clipboard", "--output"],
            &["--clipboard", "--clear"],
        ),
    ];
    for (tool, read_args, clear_args) in tools {
        let result = if read {
            Command::new(tool)
                .args(*read_args)
                .stderr(Stdio::null())
                .output()
        } else if *tool == "wl-paste" {
            Command::new("wl-copy").arg("--clear").output()
        } else {
            Command::new(tool)
                .args(*clear_args)
                .stdin(Stdio::null())
                .output()
        };
        if let Ok(out) = result
            && out.status.success()
        {
            return Ok(out.stdout);
        }
    }
    bail!("no clipboard tool worked (wl-paste, xclip or xsel)")
}

fn read_private_key(from_clipboard: bool) -> anyhow::Result<Vec<u8>> {
    let key = if from_clipboard {
        clipboard(true)?
    } else {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading the private key from standard input")?;
        buf
    };
    if !String::from_utf8_lossy(&key).contains("PRIVATE KEY-----") {
        bail!(
            "no private key on {}: paste the signing key's private half from the password manager",
            if from_clipboard {
                "the clipboard"
            } else {
                "standard input"
            }
        );
    }
    Ok(key)
}

fn confirm(question: &str) -> anyhow::Result<bool> {
    // Standard input carries the key, so ask on the terminal itself.
    let answer = rpassword::prompt_password(format!("{question} [y/N] "))
        .context("asking for confirmation on the terminal (use --yes to skip)")?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

pub async fn sign(args: SignArgs) -> anyhow::Result<()> {
    let base = args.server.trim_end_matches('/').to_owned();
    let client = reqwest::Client::builder().cookie_store(true).build()?;
    let password = match std::env::var("BYO_PASSWORD") {
        Ok(p) => p,
        Err(_) => rpassword::prompt_password(format!("Password for {}: ", args.email))?,
    };
    let login = client
        .post(format!("{base}/api/auth/login"))
        .json(&serde_json::json!({"email": args.email, "password": password}))
        .send()
        .await
        .with_context(|| format!("reaching {base}"))?;
    if !login.status().is_success() {
        bail!(
            "signing in failed: {}",
            login.text().await.unwrap_or_default()
        );
    }
    let view: OperatorKeysView = client
        .get(format!("{base}/api/admin/operator-keys"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let draft = view
        .draft
        .context("there is no draft waiting for a signature")?;
    let published = view
        .published
        .as_ref()
        .map(|p| KeyList::from_canonical(&p.body))
        .transpose()
        .ok()
        .flatten();
    // Everything below uses these bytes, not anything else the server sent.
    let body = draft.body;
    let (list, text) = describe(&body, published.as_ref())?;
    print!("{text}");
    std::io::stdout().flush()?;
    if !args.yes && !confirm(&format!("Sign version {}?", list.version))? {
        bail!("not signed");
    }

    let key = read_private_key(args.from_clipboard)?;
    let agent = Agent::start()?;
    let added = agent.add(&key);
    drop(key);
    if args.from_clipboard {
        clipboard(false).context("clearing the clipboard")?;
    }
    added?;
    let public = agent.public_key()?;
    let fingerprint = public.fingerprint(ssh_key::HashAlg::Sha256).to_string();
    if !view.signing_keys.contains(&fingerprint) {
        bail!(
            "{fingerprint} is not the signing key hosts trust ({})",
            view.signing_keys.join(", ")
        );
    }
    let signature = agent.sign(&public, body.as_bytes())?;
    drop(agent);

    // What was signed must be what was shown, whatever happened to the file meanwhile.
    if keylist::valid_signers(
        &body,
        std::slice::from_ref(&signature),
        std::slice::from_ref(&public),
    ) == 0
    {
        bail!("the signature does not cover the list shown; nothing was uploaded");
    }
    let resp = client
        .post(format!(
            "{base}/api/admin/operator-keys/{}/signatures",
            list.version
        ))
        .json(&SignatureUpload { signature })
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!(
            "the server refused the signature: {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let outcome: PushOutcome = resp.json().await?;
    println!(
        "published version {}: delivered to {} host(s), {} failed (see /admin/operator-keys)",
        outcome.version, outcome.delivered, outcome.failed
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use byo_core::keylist::OperatorKey;
    use chrono::{Duration, Utc};

    fn key(label: &str) -> OperatorKey {
        byo_core::keylist_testing::login_key("op-1", label)
    }

    #[test]
    fn the_display_comes_from_the_bytes_with_control_characters_escaped() {
        let now = Utc::now();
        let old = key("old");
        let kept = key("kept");
        let published = KeyList {
            kind: keylist::KIND.into(),
            environment: "production".into(),
            version: 1,
            issued_at: now,
            expires: now + Duration::days(1),
            threshold: 1,
            keys: vec![old.clone(), kept.clone()],
        };
        let added = key("new laptop");
        let draft = KeyList {
            version: 2,
            keys: vec![kept.clone(), added],
            ..published.clone()
        };
        let (_, text) = describe(&draft.to_canonical(), Some(&published)).unwrap();
        assert!(
            text.contains("version 2") && text.contains("machine new laptop"),
            "{text}"
        );
        let added_fp = check_key(&draft.keys[1]).unwrap().fingerprint;
        let old_fp = check_key(&old).unwrap().fingerprint;
        assert!(
            text.lines()
                .any(|l| l.contains(&added_fp) && l.trim_start().starts_with('+')),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.contains(&old_fp) && l.contains("(removed)")),
            "{text}"
        );
        // A list carrying control characters is never offered for signing, and the
        // refusal itself prints them escaped, so the terminal cannot be driven by them.
        let hostile = KeyList {
            keys: vec![
                kept,
                OperatorKey {
                    user_sub: "op\u{1b}[2J".into(),
                    ..key("x")
                },
            ],
            ..draft.clone()
        };
        let err = describe(&hostile.to_canonical(), None)
            .unwrap_err()
            .to_string();
        assert!(!err.chars().any(char::is_control), "{err:?}");
        assert!(err.contains("\\u{1b}[2J"), "{err}");
        // Bytes that are not the canonical form are not shown at all.
        assert!(describe(&draft.to_canonical().replacen(':', ": ", 1), None).is_err());
    }
}
