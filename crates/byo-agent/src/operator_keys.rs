//! Operator keys on the host (M): accept a signed list, keep it, and write `spark`'s
//! authorized_keys from it.
//!
//! Root does the keeping and the writing (issue #36, where the design's M.4 had serving do
//! it as spark): a login as spark has sudo, and serving's `NoNewPrivileges` does not follow
//! a key it could add itself, so serving's sandbox keeps `/home` read-only. Serving verifies
//! a push for its answer ([`OperatorKeys::accept`]), passes it on
//! ([`OperatorKeys::receive_through_root`]) and hears whether root applied it; root's
//! `enverge-operator-keys` ([`OperatorKeys::apply_requested`]) verifies it again against its
//! own trust and kept list — the only ones that count — and writes. A rented host is still
//! changed at once (M.3), and nothing else reaches root that way: the request is a list that
//! must verify, or nothing.
//!
//! The list is persisted before authorized_keys is written, both by atomic rename, so a
//! process killed at any point leaves authorized_keys whole — the last list applied — and
//! the next request ([`OperatorKeys::reconcile`]) brings it to the persisted one.
//! Preparation reads the same persisted copy, so preparing again cannot put back an
//! operator removed since (M.5).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use byo_core::break_glass;
use byo_core::keylist::{self, Held, KeyList, Refusal, SignedList};
use chrono::{DateTime, Utc};
use ssh_key::PublicKey;

#[derive(Clone, Debug)]
pub struct Paths {
    /// The signing key(s) pinned at enrolment, one OpenSSH public key per line. Root-owned;
    /// serving only reads it.
    pub trusted: PathBuf,
    /// The signed list as received, exactly.
    pub held: PathBuf,
    /// `spark`'s authorized_keys.
    pub authorized_keys: PathBuf,
    /// Where serving leaves a list (or nothing) for root's helper
    /// (`byo_core::render::units::OPERATOR_KEYS_FLAG`).
    pub request: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error("refused: {0}")]
    Refused(#[from] Refusal),
    #[error("{context}: {source}")]
    Io { context: String, source: io::Error },
}

fn io_err(context: impl Into<String>) -> impl FnOnce(io::Error) -> ReceiveError {
    let context = context.into();
    move |source| ReceiveError::Io { context, source }
}

/// What a successful receive did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub version: u64,
    pub keys: usize,
}

#[derive(Clone, Debug)]
pub struct OperatorKeys {
    pub paths: Paths,
    pub environment: String,
    /// This host's slug, the name a break-glass certificate must carry
    /// (`byo_core::break_glass`): known once preparation handed over. Without it an expired
    /// list admits no certificate.
    pub host: Option<String>,
}

pub use crate::host::write_atomic;

impl OperatorKeys {
    /// The pinned signing keys; none when the file is absent (a host enrolled before
    /// signed lists, which refuses every list until an operator sets one).
    pub fn trusted(&self) -> Result<Vec<PublicKey>, ReceiveError> {
        let text = match fs::read_to_string(&self.paths.trusted) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("reading the trusted signing keys")(e)),
        };
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| {
                PublicKey::from_openssh(l).map_err(|e| ReceiveError::Io {
                    context: format!(
                        "{} holds a key that does not parse",
                        self.paths.trusted.display()
                    ),
                    source: io::Error::other(e.to_string()),
                })
            })
            .collect()
    }

    /// The list applied last, if any.
    pub fn held(&self) -> Result<Option<(SignedList, KeyList)>, ReceiveError> {
        let bytes = match fs::read(&self.paths.held) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err("reading the held list")(e)),
        };
        let signed = SignedList::from_bytes(&bytes)?;
        let list = KeyList::from_canonical(&signed.body)?;
        Ok(Some((signed, list)))
    }

    /// Verify `envelope` and, only if every rule passes, persist it and write
    /// authorized_keys. A refusal changes nothing.
    pub fn receive(&self, envelope: &[u8], now: DateTime<Utc>) -> Result<Applied, ReceiveError> {
        let list = self.accept(envelope, now)?;
        self.persist(envelope)?;
        self.apply(&list, now)?;
        Ok(Applied {
            version: list.version,
            keys: list.keys.len(),
        })
    }

    /// Keep a list that verifies exactly as [`Self::receive`] would, without writing
    /// authorized_keys: preparation (root) fetches the list, and its operator-access step
    /// writes authorized_keys owned by spark — one written here would be root's, and sshd
    /// reads it as spark.
    pub fn keep(&self, envelope: &[u8], now: DateTime<Utc>) -> Result<Applied, ReceiveError> {
        let list = self.accept(envelope, now)?;
        self.persist(envelope)?;
        Ok(Applied {
            version: list.version,
            keys: list.keys.len(),
        })
    }

    /// The verification half of [`Self::receive`]: pure with respect to the host.
    /// The trust is the pin, or the successor the kept list names (M.13): rotation
    /// happens only through a list the current trust signed, never by editing the pin.
    pub fn accept(&self, envelope: &[u8], now: DateTime<Utc>) -> Result<KeyList, ReceiveError> {
        let held = self.held()?.map(|(_, l)| l);
        let trusted = keylist::trusted_after(&self.trusted()?, held.as_ref());
        let held = held.as_ref().map(Held::from);
        Ok(keylist::verify(envelope, &trusted, &self.environment, held.as_ref(), now)?.list)
    }

    /// The signing keys the next list must be signed by.
    pub fn signing_trust(&self) -> Result<Vec<PublicKey>, ReceiveError> {
        let held = self.held()?.map(|(_, l)| l);
        Ok(keylist::trusted_after(&self.trusted()?, held.as_ref()))
    }

    /// Keep the exact signed bytes where preparation reads them.
    pub fn persist(&self, envelope: &[u8]) -> Result<(), ReceiveError> {
        write_atomic(&self.paths.held, envelope, 0o644).map_err(io_err("persisting the list"))
    }

    /// authorized_keys for `list` at `now`: its keys, and the break-glass CA lines for this
    /// host once the list has expired, one per key trusted to sign the next list.
    pub fn authorized_keys(
        &self,
        list: &KeyList,
        now: DateTime<Utc>,
    ) -> Result<String, ReceiveError> {
        let signers = match &self.host {
            Some(_) if now >= list.expires => self.signing_trust()?,
            _ => Vec::new(),
        };
        let trust = self.host.as_deref().map(|host| break_glass::Trust {
            host,
            signers: &signers,
        });
        Ok(list.authorized_keys_at(now, trust))
    }

    /// Write authorized_keys from a verified list: whole, never empty (a list with no keys
    /// never verifies), mode 0600, owned as its directory is (spark's `.ssh`: sshd reads
    /// the file as spark, and root writes it).
    pub fn apply(&self, list: &KeyList, now: DateTime<Utc>) -> Result<(), ReceiveError> {
        use std::os::unix::fs::MetadataExt as _;
        let path = &self.paths.authorized_keys;
        write_atomic(path, self.authorized_keys(list, now)?.as_bytes(), 0o600)
            .map_err(io_err("writing authorized_keys"))?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        let (dir, file) = (
            fs::metadata(dir).map_err(io_err("reading authorized_keys' directory"))?,
            fs::metadata(path).map_err(io_err("reading authorized_keys"))?,
        );
        // lchown: the directory is spark's, so what stands at the path is not root's to trust.
        if (dir.uid(), dir.gid()) != (file.uid(), file.gid()) {
            std::os::unix::fs::lchown(path, Some(dir.uid()), Some(dir.gid()))
                .map_err(io_err("giving authorized_keys to its directory's owner"))?;
        }
        Ok(())
    }

    /// Serving's half of a push: verified here for the answer, then passed to root, whose
    /// verdict is whether it now keeps these very bytes. Waits at most `within` for root's
    /// helper; a refusal here changes nothing and asks root nothing.
    pub fn receive_through_root(
        &self,
        envelope: &[u8],
        now: DateTime<Utc>,
        within: std::time::Duration,
    ) -> Result<Applied, ReceiveError> {
        let list = self.accept(envelope, now)?;
        write_atomic(&self.paths.request, envelope, 0o644)
            .map_err(io_err("passing the list to root"))?;
        let started = std::time::Instant::now();
        // Root renames the request while it works and removes it when done.
        while self.paths.request.exists() || self.taken().exists() {
            if started.elapsed() > within {
                return Err(ReceiveError::Io {
                    context: format!(
                        "root's enverge-operator-keys did not take the list within {} s",
                        within.as_secs()
                    ),
                    source: io::Error::from(io::ErrorKind::TimedOut),
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        match fs::read(&self.paths.held) {
            Ok(kept) if kept == envelope => Ok(Applied {
                version: list.version,
                keys: list.keys.len(),
            }),
            _ => Err(ReceiveError::Io {
                context:
                    "root did not apply the list (enverge-operator-keys.service's journal says why)"
                        .into(),
                source: io::Error::other("refused by root"),
            }),
        }
    }

    /// Serving's half of [`Self::reconcile`]: when authorized_keys is not what the kept list
    /// makes at `now` (its expiry passed: break glass), root is asked to write it. Returns
    /// whether it asked.
    pub fn reconcile_through_root(&self, now: DateTime<Utc>) -> Result<bool, ReceiveError> {
        let Some((_, list)) = self.held()? else {
            return Ok(false);
        };
        let want = self.authorized_keys(&list, now)?;
        let have = fs::read_to_string(&self.paths.authorized_keys).ok();
        if have.as_deref() == Some(want.as_str()) || self.paths.request.exists() {
            return Ok(false);
        }
        write_atomic(&self.paths.request, b"", 0o644).map_err(io_err("asking root"))?;
        Ok(true)
    }

    /// Root's half (`byo-agent operator-keys apply-requested`, the unit
    /// `enverge-operator-keys`): take serving's request — renamed first, so a request made
    /// meanwhile asks again — and, when it holds a list, verify and apply it as
    /// [`Self::receive`] does; then bring authorized_keys to the kept list at `now`. The
    /// request is serving's file: only a plain file, read up to a list's largest size.
    pub fn apply_requested(&self, now: DateTime<Utc>) -> Result<Option<Applied>, ReceiveError> {
        use std::io::Read as _;
        use std::os::unix::fs::MetadataExt as _;
        let taken = self.taken();
        let bytes = match fs::rename(&self.paths.request, &taken) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("taking serving's request")(e)),
            Ok(()) => {
                let read = (|| {
                    let seen = fs::symlink_metadata(&taken)?;
                    if !seen.file_type().is_file() {
                        return Err(io::Error::other("the request is not a plain file"));
                    }
                    let f = fs::File::open(&taken)?;
                    let opened = f.metadata()?;
                    if (opened.dev(), opened.ino()) != (seen.dev(), seen.ino()) {
                        return Err(io::Error::other("the request changed while it was read"));
                    }
                    let mut bytes = Vec::new();
                    f.take(keylist::MAX_ENVELOPE_BYTES as u64 + 1)
                        .read_to_end(&mut bytes)?;
                    Ok(bytes)
                })();
                if read.is_err() {
                    let _ = fs::remove_file(&taken);
                }
                Some(read.map_err(io_err("reading serving's request"))?)
            }
        };
        let applied = match bytes {
            Some(b) if !b.is_empty() => Some(self.receive(&b, now)),
            _ => None,
        };
        let reconciled = self.reconcile(now);
        // Last: serving waits for the taken request to go before it reads the verdict.
        let _ = fs::remove_file(&taken);
        reconciled?;
        applied.transpose()
    }

    /// Where root holds a request while it works on it.
    fn taken(&self) -> PathBuf {
        let mut taken = self.paths.request.clone().into_os_string();
        taken.push(".taken");
        PathBuf::from(taken)
    }

    /// Make authorized_keys match the persisted list at `now`: at start (after a crash
    /// between persisting and applying), and on every heartbeat, so the break-glass lines
    /// appear within a beat of the list's expiry. Returns whether it had to write.
    pub fn reconcile(&self, now: DateTime<Utc>) -> Result<bool, ReceiveError> {
        let Some((_, list)) = self.held()? else {
            return Ok(false);
        };
        let want = self.authorized_keys(&list, now)?;
        if fs::read_to_string(&self.paths.authorized_keys)
            .ok()
            .as_deref()
            == Some(want.as_str())
        {
            return Ok(false);
        }
        self.apply(&list, now)?;
        Ok(true)
    }

    /// Pin a signing key on a host that trusts none (M.11): the one way it is set after
    /// enrolment, by an operator, as root, over the tunnel. Refused when one is already
    /// pinned: changing it is a deliberate edit of the file, not a call.
    pub fn trust(&self, key: &str) -> Result<(), ReceiveError> {
        if !self.trusted()?.is_empty() {
            return Err(ReceiveError::Io {
                context: format!(
                    "{} already pins a signing key",
                    self.paths.trusted.display()
                ),
                source: io::Error::from(io::ErrorKind::AlreadyExists),
            });
        }
        let mut parsed = PublicKey::from_openssh(key.trim()).map_err(|e| ReceiveError::Io {
            context: "the signing key does not parse".into(),
            source: io::Error::other(e.to_string()),
        })?;
        parsed.set_comment("");
        let line = parsed.to_openssh().map_err(|e| ReceiveError::Io {
            context: "encoding the signing key".into(),
            source: io::Error::other(e.to_string()),
        })?;
        write_atomic(
            &self.paths.trusted,
            format!("{}\n", line.trim()).as_bytes(),
            0o644,
        )
        .map_err(io_err("writing the trusted signing key"))
    }
}

/// `byo-agent operator-keys apply`: verify the signed list in `file` (`-` for standard input)
/// and apply it.
pub fn apply_command(keys: &OperatorKeys, file: &Path) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Read;
    let mut bytes = Vec::new();
    if file.as_os_str() == "-" {
        io::stdin().read_to_end(&mut bytes)?;
    } else {
        bytes = fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    }
    let applied = keys.receive(&bytes, Utc::now())?;
    println!(
        "applied operator-key list version {} ({} keys)",
        applied.version, applied.keys
    );
    Ok(())
}

/// `byo-agent operator-keys reconcile`.
pub fn reconcile_command(keys: &OperatorKeys) -> anyhow::Result<()> {
    if keys.reconcile(Utc::now())? {
        println!("authorized_keys rewritten from the kept list");
    }
    Ok(())
}

/// `byo-agent operator-keys apply-requested`.
/// A list refused here is this unit's answer, not its failure: it is said, serving reads the
/// verdict from what root keeps, and the path unit goes on watching.
pub fn apply_requested_command(keys: &OperatorKeys) -> anyhow::Result<()> {
    match keys.apply_requested(Utc::now()) {
        Ok(Some(applied)) => println!(
            "applied operator-key list version {} ({} keys) that serving passed on",
            applied.version, applied.keys
        ),
        Ok(None) => println!("authorized_keys is the kept list's"),
        Err(ReceiveError::Refused(why)) => {
            eprintln!("byo-agent: the list serving passed on was refused: {why}; nothing changed")
        }
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// `byo-agent operator-keys trust`.
pub fn trust_command(keys: &OperatorKeys, key: &str) -> anyhow::Result<()> {
    keys.trust(key)?;
    println!("signing key pinned; send the list again from /admin");
    Ok(())
}

/// `byo-agent operator-keys show`: the kept list's version, expiry and every key with its
/// fingerprint, control characters escaped.
pub fn show_command(keys: &OperatorKeys) -> anyhow::Result<()> {
    use byo_core::keylist::{check_key, escape_control};
    match keys.held()? {
        None => println!("no list is kept on this host"),
        Some((_, list)) => {
            println!(
                "version {} for {}, expires {}",
                list.version,
                escape_control(&list.environment),
                list.expires
            );
            for k in &list.keys {
                let fp = check_key(k)
                    .map(|c| c.fingerprint)
                    .unwrap_or_else(|e| format!("invalid: {e}"));
                println!(
                    "  {fp}  {} ({})",
                    escape_control(&k.user_sub),
                    escape_control(&k.label)
                );
            }
        }
    }
    Ok(())
}
