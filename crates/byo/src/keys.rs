//! `byo keys sign`: sign the waiting operator-key list on the operator's own machine (M.7).
//!
//! What the operator reads is decoded from the very bytes that will be signed, with
//! control characters escaped, so a tampered page cannot show one list and get another
//! signed. The private half of the signing key is loaded from standard input or the
//! clipboard into an ssh-agent this command starts and stops itself; it is never written
//! to disk, and there is no fallback to a key file. The signature is checked against the
//! displayed bytes before it is uploaded.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use byo_core::break_glass;
use byo_core::keylist::{self, KeyList, NAMESPACE, check_key, escape_control};
use byo_wire::api::{OperatorKeysView, PushOutcome, SignatureUpload};
use ssh_key::{Certificate, PublicKey};

#[derive(Debug, clap::Args)]
pub struct SignArgs {
    /// The control plane's URL: the one `byo up` printed (with `--listen 10.231.0.1:8080`,
    /// http://10.231.0.1:8080).
    #[arg(long, env = "BYO_SERVER", default_value = "http://localhost:8080")]
    pub server: String,
    /// Your account (a superadmin: publishing takes a superadmin session and the signing key).
    /// Its password comes from BYO_PASSWORD, else it is asked on the terminal.
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
/// `names`: the operators' emails by account id, as the server gave them (the list binds
/// the account id, which is shown beside the name).
pub fn describe(
    body: &str,
    published: Option<&KeyList>,
    names: &HashMap<String, String>,
) -> anyhow::Result<(KeyList, String)> {
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
    let operator = |sub: &str| match names.get(sub) {
        Some(email) => format!("{} ({})", escape_control(email), escape_control(sub)),
        None => escape_control(sub),
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
            operator(&k.key.user_sub),
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
                    operator(&k.user_sub),
                    escape_control(&k.label)
                ));
            }
        }
    }
    Ok((list, out))
}

/// The published list, trusted only once verified (issue #16): its envelope must parse, be
/// canonical, pass every list check and carry enough valid signatures from the keys the
/// operator holds right now. A server that sends another list gets no diff shown against
/// it. Expiry is not held against it: renewing a list that lapsed is exactly when this runs.
pub fn verified_published(envelope: &str, held: &[PublicKey]) -> anyhow::Result<KeyList> {
    let signed = keylist::SignedList::from_bytes(envelope.as_bytes())
        .map_err(|e| anyhow::anyhow!("the published list is not a signed list: {e}"))?;
    let list = KeyList::from_canonical(&signed.body)
        .map_err(|e| anyhow::anyhow!("the published list does not parse: {e}"))?;
    list.check()
        .map_err(|e| anyhow::anyhow!("the published list is not a valid list: {e}"))?;
    let valid = keylist::valid_signers(&signed.body, &signed.signatures, held);
    if valid < list.threshold.max(1) as usize {
        bail!(
            "the published list (version {}) is not signed by the key(s) you hold ({valid} of {} \
             signatures); refusing to compare a draft with a list nobody verified",
            list.version,
            list.threshold.max(1)
        );
    }
    Ok(list)
}

/// A draft only moves forward from the verified published list: a higher version, and an
/// expiry that does not move back.
pub fn moves_forward(draft: &KeyList, published: Option<&KeyList>) -> anyhow::Result<()> {
    let Some(p) = published else {
        return Ok(());
    };
    if draft.version <= p.version {
        bail!(
            "the draft's version {} does not follow the published version {}",
            draft.version,
            p.version
        );
    }
    if draft.expires < p.expires {
        bail!(
            "the draft expires {} — before the published list ({}); refusing to shorten it",
            draft.expires,
            p.expires
        );
    }
    Ok(())
}

/// Split what was pasted into its private keys: a rotation is signed by the current key and
/// by its successor, pasted one after the other.
fn private_keys(text: &[u8]) -> Vec<Vec<u8>> {
    const END: &str = "PRIVATE KEY-----";
    let text = String::from_utf8_lossy(text);
    let mut out = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        current.push_str(line);
        current.push('\n');
        if line.starts_with("-----END") && line.ends_with(END) {
            out.push(std::mem::take(&mut current).into_bytes());
        }
    }
    out
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

    fn public_keys(&self) -> anyhow::Result<Vec<PublicKey>> {
        let out = self.command("ssh-add").arg("-L").output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let keys = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| PublicKey::from_openssh(l).context("the agent's key does not parse"))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if keys.is_empty() {
            bail!("the agent holds no key");
        }
        Ok(keys)
    }

    /// Sign `body` with the agent's key. ssh-keygen reads the body from a file it is
    /// given only the public key for, so the private half stays in the agent.
    fn sign(&self, public: &PublicKey, body: &[u8]) -> anyhow::Result<String> {
        let pub_path = self.dir.path().join("signing.pub");
        std::fs::write(&pub_path, public.to_openssh()?)?;
        let body_path = self.dir.path().join("list.json");
        std::fs::write(&body_path, body)?;
        self.keygen(
            |c| {
                c.args(["-Y", "sign", "-n", NAMESPACE, "-f"])
                    .arg(&pub_path)
                    .arg(&body_path);
            },
            "sign",
        )?;
        Ok(std::fs::read_to_string(sig_path(&body_path))?)
    }
}

impl Agent {
    /// Run `ssh-keygen` against this agent with the arguments `args` sets; its own words when
    /// it could not `what`.
    fn keygen(&self, args: impl FnOnce(&mut Command), what: &str) -> anyhow::Result<()> {
        let mut command = self.command("ssh-keygen");
        args(&mut command);
        let out = command
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running ssh-keygen to {what}"))?;
        if !out.status.success() {
            bail!(
                "ssh-keygen could not {what}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Certify `subject` with the agent's `signer` (`ssh-keygen -s … -U`): the private half
    /// stays in the agent here too.
    fn certify(
        &self,
        signer: &PublicKey,
        subject: &PublicKey,
        request: &break_glass::Request,
    ) -> anyhow::Result<Certificate> {
        let ca_path = self.dir.path().join("signing.pub");
        std::fs::write(&ca_path, signer.to_openssh()?)?;
        let subject_path = self.dir.path().join("operator.pub");
        std::fs::write(&subject_path, subject.to_openssh()?)?;
        self.keygen(
            |c| {
                c.arg("-s")
                    .arg(&ca_path)
                    .arg("-U")
                    .args(request.keygen_args())
                    .arg(&subject_path);
            },
            "sign the certificate",
        )?;
        let text = std::fs::read_to_string(self.dir.path().join("operator-cert.pub"))?;
        Certificate::from_openssh(text.trim()).context("the certificate ssh-keygen wrote")
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
    let client = crate::release::signed_in(&base, &args.email).await?;
    let view: OperatorKeysView = client
        .get(format!("{base}/api/admin/operator-keys"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let names: HashMap<String, String> = view
        .draft
        .iter()
        .chain(view.published.iter())
        .flat_map(|l| l.keys.iter())
        .filter_map(|k| Some((k.user_sub.clone(), k.email.clone()?)))
        .collect();
    let draft = view
        .draft
        .context("there is no draft waiting for a signature")?;
    // The keys come first: the published list is shown only once they verified it.
    let pasted = read_private_key(args.from_clipboard)?;
    let agent = Agent::start()?;
    let mut added = Ok(());
    for key in private_keys(&pasted) {
        added = added.and_then(|()| agent.add(&key));
    }
    drop(pasted);
    if args.from_clipboard {
        clipboard(false).context("clearing the clipboard")?;
    }
    added?;
    let held = agent.public_keys()?;
    let published = view
        .published_envelope
        .as_deref()
        .map(|e| verified_published(e, &held))
        .transpose()?;
    // Everything below uses these bytes, not anything else the server sent.
    let body = draft.body;
    let (list, text) = describe(&body, published.as_ref(), &names)?;
    moves_forward(&list, published.as_ref())?;
    if let Some(p) = &published
        && let Some(step) = keylist::expiry_warning(p.expires, chrono::Utc::now())
    {
        println!(
            "  ! the published list (version {}) {} {} — {}",
            p.version,
            if step == 0 { "expired" } else { "expires" },
            p.expires,
            if step == 0 {
                "every host refuses operators until this is signed".to_owned()
            } else {
                format!("within {step} day(s)")
            }
        );
    }
    print!("{text}");
    if let Some(next) = &list.next_signing_keys {
        println!(
            "  ! this list hands signing to: {}\n    every later list must be signed by it; the keys signing now sign nothing after",
            next.iter()
                .filter_map(|k| PublicKey::from_openssh(k).ok())
                .map(|k| k.fingerprint(ssh_key::HashAlg::Sha256).to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    std::io::stdout().flush()?;
    if !args.yes && !confirm(&format!("Sign version {}?", list.version))? {
        bail!("not signed");
    }
    // Sign with every key held that the list needs: the trusted ones, and a rotation's
    // successors.
    let successors = list.successors().ok().flatten().unwrap_or_default();
    let fingerprint = |k: &PublicKey| k.fingerprint(ssh_key::HashAlg::Sha256).to_string();
    let signers: Vec<&PublicKey> = held
        .iter()
        .filter(|k| {
            view.signing_keys.contains(&fingerprint(k))
                || successors.iter().any(|s| s.key_data() == k.key_data())
        })
        .collect();
    if !held
        .iter()
        .any(|k| view.signing_keys.contains(&fingerprint(k)))
    {
        bail!(
            "{} is not the signing key hosts trust ({})",
            held.iter().map(fingerprint).collect::<Vec<_>>().join(", "),
            view.signing_keys.join(", ")
        );
    }
    let mut signatures = Vec::new();
    for public in &signers {
        let signature = agent.sign(public, body.as_bytes())?;
        // What was signed must be what was shown, whatever happened to the file meanwhile.
        if keylist::valid_signers(
            &body,
            std::slice::from_ref(&signature),
            std::slice::from_ref(*public),
        ) == 0
        {
            bail!("the signature does not cover the list shown; nothing was uploaded");
        }
        signatures.push(signature);
    }
    drop(agent);
    let signature = signatures.remove(0);
    let resp = client
        .post(format!(
            "{base}/api/admin/operator-keys/{}/signatures",
            list.version
        ))
        .json(&SignatureUpload {
            signature,
            more_signatures: signatures,
        })
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

#[derive(Debug, clap::Args)]
pub struct BreakGlassArgs {
    /// The host to open, by its name (spark-7); repeat for several. The certificate opens
    /// the hosts it names and no other.
    #[arg(long = "host", required = true)]
    pub hosts: Vec<String>,
    /// Your own public key, the one you log in with. The certificate is written beside it as
    /// KEY-cert.pub, where ssh finds it for that key.
    #[arg(long, default_value = "~/.ssh/id_ed25519.pub")]
    pub key: PathBuf,
    /// Who you are: written into the certificate's ID, which sshd logs with every login.
    #[arg(long, env = "BYO_EMAIL")]
    pub operator: String,
    /// How long the certificate is valid, in minutes (1 to 60).
    #[arg(long, default_value_t = break_glass::DEFAULT_MINUTES)]
    pub minutes: u32,
    /// Read the signing key's private half from the clipboard instead of standard input.
    #[arg(long)]
    pub from_clipboard: bool,
}

/// Where ssh looks for the certificate of the key whose public half is at `key`.
fn cert_path(key: &Path) -> PathBuf {
    let text = key.to_string_lossy();
    let stem = text.strip_suffix(".pub").unwrap_or(&text);
    PathBuf::from(format!("{stem}-cert.pub"))
}

fn expand_home(path: &Path) -> PathBuf {
    match (path.strip_prefix("~"), std::env::var_os("HOME")) {
        (Ok(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => path.to_path_buf(),
    }
}

/// Certify `subject` for `request` with the first signing key pasted (`pasted`, an OpenSSH
/// private key), held only by a throwaway ssh-agent; read back and checked before it is
/// returned. Returns the certificate and the signer.
pub fn issue(
    pasted: &[u8],
    subject: &PublicKey,
    request: &break_glass::Request,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<(Certificate, PublicKey)> {
    request.check()?;
    let agent = Agent::start()?;
    let key = private_keys(pasted)
        .into_iter()
        .next()
        .context("no private key was pasted")?;
    agent.add(&key)?;
    let signer = agent
        .public_keys()?
        .into_iter()
        .next()
        .context("the agent holds no key")?;
    let cert = agent.certify(&signer, subject, request)?;
    request.verify(&cert, subject, &signer, now)?;
    Ok((cert, signer))
}

/// `byo keys break-glass`: the last resort once the operator-key list has expired
/// (docs/operator-keys.md, "At expiry"). Needs no server: the host checks the certificate
/// against the signing keys it already trusts.
pub fn break_glass(args: BreakGlassArgs) -> anyhow::Result<()> {
    let request = break_glass::Request {
        hosts: args.hosts.clone(),
        operator: args.operator.clone(),
        minutes: args.minutes,
        serial: rand::random(),
    };
    request.check()?;
    let key_path = expand_home(&args.key);
    let text = std::fs::read_to_string(&key_path)
        .with_context(|| format!("reading your public key {}", key_path.display()))?;
    let subject = PublicKey::from_openssh(text.trim())
        .with_context(|| format!("{} is not an OpenSSH public key", key_path.display()))?;
    let out = cert_path(&key_path);
    let pasted = read_private_key(args.from_clipboard)?;
    let now = chrono::Utc::now();
    let (cert, signer) = issue(&pasted, &subject, &request, now)?;
    drop(pasted);
    if args.from_clipboard {
        clipboard(false).context("clearing the clipboard")?;
    }
    std::fs::write(&out, format!("{}\n", cert.to_openssh()?))
        .with_context(|| format!("writing {}", out.display()))?;
    let until = chrono::DateTime::from_timestamp(cert.valid_before() as i64, 0)
        .map(|t| t.to_rfc3339())
        .unwrap_or_default();
    println!("break-glass certificate written to {}", out.display());
    println!("  ID        {} (serial {})", cert.key_id(), cert.serial());
    println!("  hosts     {}", request.hosts.join(", "));
    println!("  valid     until {until} ({} minutes)", request.minutes);
    println!("  signed by {}", signer.fingerprint(Default::default()));
    println!(
        "A host admits it only while the operator-key list it holds has expired, and only from its relay:"
    );
    for host in &request.hosts {
        println!("  byo host ssh {host} --via relay --project <project> --zone <zone>");
    }
    println!(
        "sshd logs every login with this ID and serial; it reaches the owner's page and /admin with the next heartbeat. Sign the waiting renewal (byo keys sign) to end it."
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
            next_signing_keys: None,
        };
        let added = key("new laptop");
        let draft = KeyList {
            version: 2,
            keys: vec![kept.clone(), added],
            ..published.clone()
        };
        // Operators are named by the email the server gave, beside the account the list
        // binds; a name carrying control characters is shown escaped.
        let names = HashMap::from([("op-1".to_owned(), "ann@example.com\u{1b}[2J".to_owned())]);
        let (_, text) = describe(&draft.to_canonical(), Some(&published), &names).unwrap();
        assert!(
            text.contains("version 2") && text.contains("machine new laptop"),
            "{text}"
        );
        assert!(
            text.lines()
                .filter(|l| l.contains("operator "))
                .all(|l| l.contains("operator ann@example.com\\u{1b}[2J (op-1)")),
            "{text}"
        );
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        let (_, unnamed) =
            describe(&draft.to_canonical(), Some(&published), &HashMap::new()).unwrap();
        assert!(unnamed.contains("operator op-1  machine"), "{unnamed}");
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
        let err = describe(&hostile.to_canonical(), None, &names)
            .unwrap_err()
            .to_string();
        assert!(!err.chars().any(char::is_control), "{err:?}");
        assert!(err.contains("\\u{1b}[2J"), "{err}");
        // Bytes that are not the canonical form are not shown at all.
        assert!(describe(&draft.to_canonical().replacen(':', ": ", 1), None, &names).is_err());
    }

    /// Issue #16: the published list is trusted only once the keys the operator holds
    /// verify it, and a draft only moves forward from it.
    #[test]
    fn the_published_list_is_verified_before_a_diff_and_a_draft_only_moves_forward() {
        use byo_core::keylist_testing as t;
        let now = Utc::now();
        let signing = t::private_key();
        let stranger = t::private_key();
        let published = t::list("production", 4, vec![key("laptop")], now);
        let envelope = String::from_utf8(t::envelope(&published, &[&signing])).unwrap();
        let held = [signing.public_key().clone()];
        let mut sorted = published.clone();
        sorted.keys.sort();
        assert_eq!(verified_published(&envelope, &held).unwrap(), sorted);
        // Signed by someone else, or not signed: refused.
        let forged = String::from_utf8(t::envelope(&published, &[&stranger])).unwrap();
        let err = verified_published(&forged, &held).unwrap_err().to_string();
        assert!(err.contains("not signed by the key(s) you hold"), "{err}");
        let unsigned = String::from_utf8(t::envelope(&published, &[])).unwrap();
        assert!(verified_published(&unsigned, &held).is_err());
        // A version that does not increase, or an expiry that moves back: refused.
        let same = t::list("production", 4, vec![key("laptop")], now);
        assert!(moves_forward(&same, Some(&published)).is_err());
        let mut shorter = t::list("production", 5, vec![key("laptop")], now);
        shorter.expires = published.expires - Duration::days(1);
        let err = moves_forward(&shorter, Some(&published))
            .unwrap_err()
            .to_string();
        assert!(err.contains("refusing to shorten"), "{err}");
        let next = t::list(
            "production",
            5,
            vec![key("laptop")],
            now + Duration::hours(1),
        );
        assert!(moves_forward(&next, Some(&published)).is_ok());
        assert!(moves_forward(&next, None).is_ok());
    }

    #[test]
    fn a_rotation_pastes_two_private_keys_one_after_the_other() {
        use byo_core::keylist_testing as t;
        let pem =
            |k: &ssh_key::PrivateKey| k.to_openssh(ssh_key::LineEnding::LF).unwrap().to_string();
        let (a, b) = (t::private_key(), t::private_key());
        let pasted = format!("{}{}", pem(&a), pem(&b));
        let split = private_keys(pasted.as_bytes());
        assert_eq!(split.len(), 2);
        assert_eq!(String::from_utf8(split[1].clone()).unwrap(), pem(&b));
    }

    /// #39, 5: the certificate is issued by ssh-keygen with the pasted key held only in a
    /// throwaway agent, for exactly the hosts asked, bound to the relay, for the minutes asked;
    /// ssh-keygen itself reads it back; and what must be refused is refused before anything
    /// is signed. (That a host's sshd admits it only at expiry: byo-relay's ssh_path.)
    #[test]
    fn break_glass_certifies_the_operators_key_for_the_hosts_asked_from_the_relay_only() {
        use byo_core::keylist_testing as t;
        let signer = t::private_key();
        let subject = t::private_key().public_key().clone();
        let pasted = signer.to_openssh(ssh_key::LineEnding::LF).unwrap();
        let request = break_glass::Request {
            hosts: vec!["spark-7".into(), "spark-8".into()],
            operator: "op@enverge.ai".into(),
            minutes: 15,
            serial: 42,
        };
        let now = Utc::now();
        let (cert, by) = issue(pasted.as_bytes(), &subject, &request, now).unwrap();
        assert_eq!(by.key_data(), signer.public_key().key_data());
        assert_eq!(cert.valid_principals(), ["spark-7", "spark-8"]);
        assert_eq!(cert.key_id(), "break-glass:op@enverge.ai:spark-7,spark-8");
        assert_eq!(cert.serial(), 42);
        let left = cert.valid_before() as i64 - now.timestamp();
        assert!((14 * 60..=15 * 60 + 5).contains(&left), "{left} s left");
        assert!(cert.extensions().contains_key("permit-pty"));
        assert!(!cert.extensions().contains_key("permit-agent-forwarding"));

        // The real validator reads it as we do.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("id-cert.pub");
        std::fs::write(&file, cert.to_openssh().unwrap()).unwrap();
        let out = Command::new("ssh-keygen")
            .arg("-L")
            .arg("-f")
            .arg(&file)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{listing}");
        for want in [
            "user certificate",
            "source-address 10.8.0.1/32",
            "spark-7",
            "Serial: 42",
        ] {
            assert!(listing.contains(want), "{want} in {listing}");
        }

        // Another signer's certificate does not pass for this one.
        let other = t::private_key();
        assert!(
            request
                .verify(&cert, &subject, other.public_key(), now)
                .is_err()
        );
        assert!(
            request
                .verify(
                    &cert,
                    &subject,
                    signer.public_key(),
                    now + Duration::minutes(16)
                )
                .is_err()
        );
        // Refused before anything is signed.
        for (bad, why) in [
            (
                break_glass::Request {
                    minutes: 61,
                    ..request.clone()
                },
                "minutes",
            ),
            (
                break_glass::Request {
                    minutes: 0,
                    ..request.clone()
                },
                "minutes",
            ),
            (
                break_glass::Request {
                    hosts: vec![],
                    ..request.clone()
                },
                "host",
            ),
            (
                break_glass::Request {
                    hosts: vec!["spark-7\",from=\"*".into()],
                    ..request.clone()
                },
                "host",
            ),
            (
                break_glass::Request {
                    hosts: vec!["Spark 7".into()],
                    ..request.clone()
                },
                "host",
            ),
            (
                break_glass::Request {
                    operator: "op two".into(),
                    ..request.clone()
                },
                "operator",
            ),
        ] {
            let err = issue(pasted.as_bytes(), &subject, &bad, now)
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{why}: {err}");
        }
        assert_eq!(
            cert_path(Path::new("/home/op/.ssh/id_ed25519.pub")),
            PathBuf::from("/home/op/.ssh/id_ed25519-cert.pub")
        );
    }
}
