//! Releases (issue #14, 1; J "publishing is not delivery"): a superadmin publishes an agent
//! build that was signed where the release key is (`byo release sign`, never on a server);
//! this server verifies the signature against its configured `release_key` before anything
//! is kept, keeps the bytes in `release_dir/agent-builds/<sha256>` and the row, and the
//! installer's path serves the newest build of each arch. Publishing changes nothing on any
//! host: a host changes build only when someone runs the one-liner there.

use std::path::PathBuf;

use byo_core::release;
use byo_db::releases::{NewRelease, ReleaseRow};
use byo_wire::fleet::ReleaseView;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::auth::Superadmin;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// The largest build a publish accepts (a release agent is ~10 MiB; a debug one ~200 MiB).
pub const MAX_BUILD_BYTES: usize = 512 * 1024 * 1024;
/// Where published builds are kept, under `release_dir`.
pub const BUILDS_DIR: &str = "agent-builds";

/// Where a published build's bytes are kept.
pub fn build_path(dir: &std::path::Path, sha256: &str) -> PathBuf {
    dir.join(BUILDS_DIR).join(sha256)
}

fn refused(code: &'static str, message: impl Into<String>) -> AppError {
    AppError::bad_request(code, format!("{}; nothing was published", message.into()))
}

/// A version as `byo-agent --version` prints it: 1–128 printable ASCII characters.
fn check_version(version: &str) -> AppResult<()> {
    if version.is_empty()
        || version.len() > 128
        || !version.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
    {
        return Err(refused(
            "bad_version",
            "the version must be 1–128 printable ASCII characters (what byo-agent --version prints)",
        ));
    }
    Ok(())
}

/// Publish `bytes` as the agent build for `arch`, signed (`signature`, armored SSHSIG) by
/// the release key. Every refusal leaves the table and the release directory as they were.
pub async fn publish(
    state: &AppState,
    by: &Superadmin,
    arch: &str,
    version: &str,
    signature: &str,
    bytes: axum::body::Bytes,
) -> AppResult<ReleaseView> {
    let Some(key) = state.config.release_key.as_deref() else {
        return Err(AppError::conflict(
            "no_release_key",
            "this server has no release_key configured, so it cannot verify a build; nothing was published",
        ));
    };
    let Some(dir) = state.config.release_dir.clone() else {
        return Err(AppError::conflict(
            "no_release_dir",
            "this server has no release_dir configured to keep builds in; nothing was published",
        ));
    };
    if !release::is_arch(arch) {
        return Err(refused(
            "bad_arch",
            "the arch must be 1–32 letters, digits or underscores, as uname -m prints it",
        ));
    }
    check_version(version)?;
    if bytes.is_empty() {
        return Err(refused("empty_build", "the build is empty"));
    }
    let key = ssh_key::PublicKey::from_openssh(key.trim())
        .map_err(|e| AppError::Internal(anyhow::anyhow!("release_key does not parse: {e}")))?;
    let armored = signature.to_owned();
    let checked = bytes.clone();
    // Hashing and verifying a large build is CPU work: off the async workers.
    let (sha256, verdict, found_arch) = tokio::task::spawn_blocking(move || {
        let sha256 = hex::encode(Sha256::digest(&checked));
        let verdict = release::verify(&key, &checked, &armored);
        (sha256, verdict, release::elf_arch(&checked))
    })
    .await
    .map_err(|e| AppError::Internal(e.into()))?;
    if let Err(why) = verdict {
        return Err(refused(
            "bad_signature",
            format!("the build is not signed by this server's release key: {why}"),
        ));
    }
    if found_arch != Some(arch) {
        return Err(refused(
            "wrong_arch",
            format!(
                "the build is {}, not an {arch} executable",
                found_arch.map_or_else(
                    || "not a 64-bit little-endian ELF executable of a known architecture"
                        .to_owned(),
                    |a| format!("an {a} executable")
                )
            ),
        ));
    }
    let path = build_path(&dir, &sha256);
    if !path.exists() {
        let tmp = dir.join(BUILDS_DIR).join(format!(".{sha256}.tmp"));
        let write = async {
            tokio::fs::create_dir_all(dir.join(BUILDS_DIR)).await?;
            tokio::fs::write(&tmp, &bytes).await?;
            tokio::fs::rename(&tmp, &path).await
        };
        write.await.map_err(|e| {
            AppError::Internal(anyhow::anyhow!(
                "keeping the build in {}: {e}",
                dir.display()
            ))
        })?;
    }
    let now = state.clock.now();
    let row = state
        .store
        .insert_release(
            NewRelease {
                arch,
                version,
                sha256: &sha256,
                signature,
                size_bytes: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
                published_by: &by.0.user.sub,
            },
            now,
        )
        .await
        .map_err(|e| {
            // The table's one unique rule, `agent_releases_once`: the same bytes for the same
            // arch (SQLite names it by its columns, so the kind is what is read). Already
            // kept bytes are not written again above, so a refusal here changes nothing.
            if matches!(e, byo_db::DbError::Conflict(_)) {
                AppError::conflict(
                    "already_published",
                    format!(
                        "build {sha256} is already published for {arch}; nothing was published"
                    ),
                )
            } else {
                e.into()
            }
        })?;
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "release.published",
            Some(&row.id),
            json!({"arch": arch, "version": version, "sha256": sha256}),
            now,
        )
        .await?;
    Ok(view(row, true))
}

fn view(row: ReleaseRow, served: bool) -> ReleaseView {
    ReleaseView {
        arch: row.arch,
        version: row.version,
        sha256: row.sha256,
        build: row.build,
        size_bytes: row.size_bytes,
        published_by: row.published_by,
        published_at: row.published_at,
        served,
    }
}

/// Every published build, newest first, each marked when the installer serves it.
pub async fn list(state: &AppState) -> AppResult<Vec<ReleaseView>> {
    let rows = state.store.releases(200).await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let served = state
            .store
            .newest_release(&row.arch)
            .await?
            .is_some_and(|n| n.id == row.id);
        out.push(view(row, served));
    }
    Ok(out)
}

/// What the installer's path serves for one of `byo-agent-<arch>`, `.sha256`, `.sig`
/// when a build of that arch is published: the newest one's build file (streamed from
/// disk by the page, never read whole: issue #36.4), digest line or signature. `None` when
/// none is published for the arch (the release directory's own files are served then, as
/// before releases were rows).
pub async fn served_file(state: &AppState, file: &str) -> AppResult<Option<Served>> {
    let Some(rest) = file.strip_prefix("byo-agent-") else {
        return Ok(None);
    };
    let (arch, part) = if let Some(a) = rest.strip_suffix(".sha256") {
        (a, Part::Digest)
    } else if let Some(a) = rest.strip_suffix(".sig") {
        (a, Part::Signature)
    } else {
        (rest, Part::Build)
    };
    if !release::is_arch(arch) {
        return Ok(None);
    }
    let (Some(row), Some(dir)) = (
        state.store.newest_release(arch).await?,
        state.config.release_dir.as_ref(),
    ) else {
        return Ok(None);
    };
    Ok(Some(match part {
        Part::Digest => Served::Bytes(format!("{}  byo-agent-{arch}\n", row.sha256).into_bytes()),
        Part::Signature => Served::Bytes(row.signature.into_bytes()),
        Part::Build => Served::File(build_path(dir, &row.sha256)),
    }))
}

/// One of a published release's files, as [`served_file`] finds it.
#[derive(Debug)]
pub enum Served {
    /// A short text: the digest line or the signature.
    Bytes(Vec<u8>),
    /// The build itself, on disk in the release directory.
    File(PathBuf),
}

enum Part {
    Build,
    Digest,
    Signature,
}
