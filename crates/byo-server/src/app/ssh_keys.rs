//! Customers' SSH keys: what an instance is created with (E1). Each signed-in user manages
//! their own; another user's key is as absent as one that does not exist.

use byo_db::DbError;
use byo_db::ssh_keys::{NewSshKey as NewKeyRow, SshKeyRow};
use byo_wire::vm::{NewSshKey, SshKeyView};
use serde_json::json;
use ssh_key::{Algorithm, HashAlg, PublicKey};

use crate::auth::CurrentUser;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// RSA keys shorter than this are refused.
pub const MIN_RSA_BITS: usize = 2048;

fn view(row: SshKeyRow) -> SshKeyView {
    SshKeyView {
        id: row.id,
        name: row.name,
        public_key: row.public_key,
        fingerprint: row.fingerprint,
        created_at: row.created_at,
    }
}

/// A checked key: the line to store (re-encoded, so exactly one form) and its fingerprint.
pub fn check_public_key(line: &str) -> Result<(String, String), AppError> {
    let invalid = |why: String| AppError::bad_request("invalid_public_key", why);
    let line = line.trim();
    // Its length is bounded where the request is read (byo_wire::limits::PUBLIC_KEY).
    if line.is_empty() {
        return Err(invalid("paste one OpenSSH public key line".into()));
    }
    if line.chars().any(char::is_control) {
        return Err(invalid(
            "one key per line, with no control characters; paste a single public key".into(),
        ));
    }
    let key = PublicKey::from_openssh(line).map_err(|e| {
        invalid(format!(
            "that is not an OpenSSH public key ({e}); paste the contents of a .pub file, \
             without options in front"
        ))
    })?;
    match key.algorithm() {
        Algorithm::Ed25519
        | Algorithm::SkEd25519
        | Algorithm::Ecdsa { .. }
        | Algorithm::SkEcdsaSha2NistP256 => {}
        Algorithm::Rsa { .. } => {
            let bits = key
                .key_data()
                .rsa()
                .and_then(|k| k.n.as_positive_bytes())
                .map_or(0, |n| n.len() * 8);
            if bits < MIN_RSA_BITS {
                return Err(invalid(format!(
                    "RSA keys must be at least {MIN_RSA_BITS} bits; use an ed25519 key"
                )));
            }
        }
        other => {
            return Err(invalid(format!(
                "{other} keys are not accepted; use ed25519, ECDSA or RSA"
            )));
        }
    }
    let stored = key
        .to_openssh()
        .map_err(|e| invalid(format!("the key does not re-encode: {e}")))?;
    Ok((stored, key.fingerprint(HashAlg::Sha256).to_string()))
}

fn check_name(name: &str) -> Result<&str, AppError> {
    let name = name.trim();
    if name.is_empty() || name.chars().any(char::is_control) {
        return Err(AppError::bad_request(
            "invalid_name",
            "a key's name is 1 to 64 printable characters",
        ));
    }
    Ok(name)
}

/// Add a key to `user`'s account: checked, kept once, audited. The API and the pages call it.
pub async fn add(state: &AppState, user: &CurrentUser, req: &NewSshKey) -> AppResult<SshKeyView> {
    // The API's extractor checked this already; the pages come through here too.
    byo_wire::limits::Bounded::check_bounds(req).map_err(AppError::out_of_bounds)?;
    let name = check_name(&req.name)?;
    let (public_key, fingerprint) = check_public_key(&req.public_key)?;
    let now = state.clock.now();
    let row = state
        .store
        .insert_ssh_key(
            NewKeyRow {
                user_sub: &user.user.sub,
                name,
                public_key: &public_key,
                fingerprint: &fingerprint,
            },
            now,
        )
        .await
        .map_err(|e| match e {
            DbError::Conflict(_) => AppError::conflict(
                "duplicate_key",
                format!("you already have this key ({fingerprint})"),
            ),
            other => other.into(),
        })?;
    state
        .store
        .audit(
            Some(&user.user.sub),
            "ssh_key.add",
            Some(&row.id),
            json!({"fingerprint": row.fingerprint}),
            now,
        )
        .await?;
    Ok(view(row))
}

/// `user`'s keys.
pub async fn list(state: &AppState, user: &CurrentUser) -> AppResult<Vec<SshKeyView>> {
    let rows = state.store.ssh_keys_of(&user.user.sub).await?;
    Ok(rows.into_iter().map(view).collect())
}

/// Remove one of `user`'s keys; someone else's is as absent as one that does not exist.
pub async fn remove(state: &AppState, user: &CurrentUser, key_id: &str) -> AppResult<()> {
    if !state.store.delete_ssh_key(&user.user.sub, key_id).await? {
        return Err(AppError::NotFound);
    }
    state
        .store
        .audit(
            Some(&user.user.sub),
            "ssh_key.remove",
            Some(key_id),
            json!({}),
            state.clock.now(),
        )
        .await?;
    Ok(())
}
