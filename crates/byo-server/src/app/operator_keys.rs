//! admin-operator-keys (M): changes collected in one draft, signatures checked with the
//! agent's own verifier before anything is published, and every host sent the exact
//! signed bytes, rented or not. A host still preparing is not serving, so no push reaches
//! it: it asks for the published list itself ([`published_for_host`]) at every attempt.

use byo_core::keylist::{self, Change, ChangeRefusal, KeyList, SignedList, check_key};
use byo_core::tokens::SecretToken;
use byo_db::operator_keys::{KeyChange, KeyListRow, PublishedKey};
use byo_db::{DbError, GuardedWrite};
use byo_wire::api::{
    HostKeyStatus, KeyChangeRequest, KeyChangeView, KeyListView, KeyOwner, OperatorKeyView,
    OperatorKeysView, PushOutcome, SignatureUpload,
};
use byo_wire::states::KeyListState;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::json;
use ssh_key::PublicKey;
use std::collections::HashMap;

use crate::auth::{CurrentUser, Operator};
use crate::error::{AppError, AppResult};
use crate::state::AppState;
use byo_wire::Role;

/// The signing keys the configuration names (validated at load): what hosts pinned
/// before any rotation.
pub fn configured_signing_keys(state: &AppState) -> Vec<PublicKey> {
    state
        .config
        .operator_keys
        .signing_keys
        .iter()
        .filter_map(|k| PublicKey::from_openssh(k.trim()).ok())
        .collect()
}

/// The keys the next list must be signed by — what every host holding the published list
/// trusts (M.13): the successors the published list names, else the configured keys. A new
/// host pins these at enrolment, so it accepts the published list it then fetches.
pub async fn signing_trust(state: &AppState) -> AppResult<Vec<PublicKey>> {
    let published = match state.store.published_key_list().await? {
        Some(row) => Some(parse_stored(&row.body)?),
        None => None,
    };
    Ok(keylist::trusted_after(
        &configured_signing_keys(state),
        published.as_ref(),
    ))
}

fn parse_stored(body: &str) -> AppResult<KeyList> {
    // Stored bodies were built by with_change; one that no longer parses is corruption.
    KeyList::from_canonical(body)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("stored list: {e}")))
}

/// The addresses of the operators `rows` list, by account id, in one read.
async fn emails_listed(
    state: &AppState,
    rows: &[&KeyListRow],
) -> AppResult<HashMap<String, String>> {
    let mut subs: Vec<String> = Vec::new();
    for row in rows {
        subs.extend(
            parse_stored(&row.body)?
                .keys
                .into_iter()
                .map(|k| k.user_sub),
        );
    }
    subs.sort();
    subs.dedup();
    let subs: Vec<&str> = subs.iter().map(String::as_str).collect();
    Ok(state.store.emails_of(&subs).await?.into_iter().collect())
}

/// `emails`: the listed operators' addresses (`Store::emails_of`), to name them by.
fn list_view(row: &KeyListRow, emails: &HashMap<String, String>) -> AppResult<KeyListView> {
    let list = parse_stored(&row.body)?;
    Ok(KeyListView {
        version: row.version,
        state: row.state,
        issued_at: list.issued_at,
        expires: list.expires,
        keys: list
            .keys
            .iter()
            .map(|k| OperatorKeyView {
                user_sub: k.user_sub.clone(),
                email: emails.get(&k.user_sub).cloned(),
                label: k.label.clone(),
                fingerprint: check_key(k).map(|c| c.fingerprint).unwrap_or_default(),
                public_key: k.public_key.clone(),
            })
            .collect(),
        body: row.body.clone(),
    })
}

pub async fn overview(state: &AppState) -> AppResult<OperatorKeysView> {
    let published = state.store.published_key_list().await?;
    let newest = state.store.newest_key_list().await?;
    let draft = newest.filter(|r| r.state == KeyListState::Draft);
    let draft_changes = match &draft {
        Some(d) => state
            .store
            .key_changes(d.version)
            .await?
            .into_iter()
            .map(|c| KeyChangeView {
                user_sub: c.user_sub,
                action: c.action,
                fingerprint: c.fingerprint,
                label: c.label,
                at: c.at,
            })
            .collect(),
        None => Vec::new(),
    };
    let hosts = state
        .store
        .key_push_status()
        .await?
        .into_iter()
        .map(|h| HostKeyStatus {
            host_id: h.host_id,
            slug: h.slug,
            version: h.version,
            attempted_at: h.attempted_at,
            error: h.error,
        })
        .collect();
    let rows: Vec<&KeyListRow> = published.iter().chain(draft.iter()).collect();
    let emails = emails_listed(state, &rows).await?;
    Ok(OperatorKeysView {
        environment: state.config.environment.clone(),
        published_envelope: published.as_ref().and_then(|p| p.envelope.clone()),
        signing_keys: signing_trust(state)
            .await?
            .iter()
            .map(|k| k.fingerprint(ssh_key::HashAlg::Sha256).to_string())
            .collect(),
        published: published
            .as_ref()
            .map(|r| list_view(r, &emails))
            .transpose()?,
        draft: draft.as_ref().map(|r| list_view(r, &emails)).transpose()?,
        draft_changes,
        hosts,
    })
}

fn change_refused(r: ChangeRefusal) -> AppError {
    match r {
        ChangeRefusal::Key(k) => AppError::bad_request("key_refused", k.to_string()),
        ChangeRefusal::AlreadyListed(_) => AppError::conflict("already_listed", r.to_string()),
        ChangeRefusal::NotFound(_) => AppError::bad_request("not_listed", r.to_string()),
        ChangeRefusal::NotYours(_) => AppError::Forbidden("that key belongs to another operator"),
        ChangeRefusal::NoOperatorLeft => AppError::conflict("no_operator_left", r.to_string()),
    }
}

/// A key as people paste it.
struct PastedKey {
    /// `<type> <base64>`: what the signed list carries.
    key: String,
    comment: Option<String>,
}

/// Split a pasted `.pub` line, `<type> <base64> [comment]`, into the bare key and its
/// comment. The signed list carries bare keys only — every host's authorized_keys line ends
/// with our own attribution comment, and the agent refuses anything else in the key — so
/// the comment is taken off here, before the list's check. Options in front of the key are
/// refused: what a key may do on a host is the list's business, not the pasted line's.
fn split_pasted_key(text: &str) -> AppResult<PastedKey> {
    let text = text.trim();
    let fields: Vec<&str> = text.split(' ').filter(|f| !f.is_empty()).collect();
    // Control characters are the list's own refusal (check_key names them); pass them on.
    if text.chars().any(char::is_control) || fields.len() < 2 {
        return Ok(PastedKey {
            key: text.to_owned(),
            comment: None,
        });
    }
    // Key types all start so (ssh-ed25519, sk-ssh-ed25519@openssh.com, ssh-rsa, ecdsa-…);
    // no authorized_keys option does.
    let is_type = |f: &str| ["ssh-", "sk-", "ecdsa-"].iter().any(|p| f.starts_with(p));
    if !is_type(fields[0]) {
        return Err(AppError::bad_request(
            "key_refused",
            "the key must start with its type: options in front of it (such as no-pty or \
             from=\"…\") are not accepted. Paste the line of your .pub file as it is: \
             ssh-ed25519 AAAA… you@laptop",
        ));
    }
    let comment = fields[2..].join(" ");
    Ok(PastedKey {
        key: format!("{} {}", fields[0], fields[1]),
        comment: (!comment.is_empty()).then_some(comment),
    })
}

/// Apply one change to the newest list: an operator's own key added or removed; a
/// superadmin's removal of anyone's key (I) or naming of the next signing keys (M.13).
pub async fn change_keys(
    state: &AppState,
    by: &Operator,
    req: KeyChangeRequest,
) -> AppResult<KeyListView> {
    // The API's extractor checked this already; the pages come through here too.
    byo_wire::limits::Bounded::check_bounds(&req).map_err(AppError::out_of_bounds)?;
    let sub = by.0.user.sub.clone();
    let superadmin = by.0.has(Role::Superadmin);
    let (change, action, fingerprint, label) = match req {
        KeyChangeRequest::Add { public_key, label } => {
            let pasted = split_pasted_key(&public_key)?;
            let label = match (label.trim(), pasted.comment) {
                ("", Some(comment)) => comment,
                ("", None) => {
                    return Err(AppError::bad_request(
                        "key_refused",
                        "name the machine this key is on, or paste the key with its comment \
                         (which becomes the name)",
                    ));
                }
                (given, _) => given.to_owned(),
            };
            // A label taken from the key's comment is held to the label's bound too.
            byo_wire::limits::chars("label", &label, byo_wire::limits::NAME_CHARS)
                .map_err(AppError::out_of_bounds)?;
            let candidate = keylist::OperatorKey {
                user_sub: sub.clone(),
                label,
                public_key: pasted.key,
            };
            let checked =
                check_key(&candidate).map_err(|e| change_refused(ChangeRefusal::Key(e)))?;
            let change = Change::Add {
                user_sub: sub.clone(),
                label: candidate.label.clone(),
                public_key: candidate.public_key,
            };
            (change, "add", checked.fingerprint, candidate.label)
        }
        // A superadmin removes any operator's key: leaving must not depend on the one
        // who leaves.
        KeyChangeRequest::Remove { fingerprint } if superadmin => (
            Change::RemoveAny {
                fingerprint: fingerprint.clone(),
            },
            "remove",
            fingerprint,
            String::new(),
        ),
        KeyChangeRequest::Remove { fingerprint } => (
            Change::Remove {
                user_sub: sub.clone(),
                fingerprint: fingerprint.clone(),
            },
            "remove",
            fingerprint,
            String::new(),
        ),
        KeyChangeRequest::RotateSigningKeys { .. } if !superadmin => {
            return Err(AppError::Forbidden(
                "only a superadmin names the next signing keys",
            ));
        }
        KeyChangeRequest::RotateSigningKeys { signing_keys } => {
            let parsed: Vec<PublicKey> = signing_keys
                .iter()
                .map(|k| PublicKey::from_openssh(k.trim()))
                .collect::<Result<_, _>>()
                .map_err(|e| {
                    AppError::bad_request(
                        "key_refused",
                        format!("a signing key does not parse: {e}"),
                    )
                })?;
            if parsed.is_empty() {
                return Err(AppError::bad_request(
                    "key_refused",
                    "name at least one signing key",
                ));
            }
            let fingerprints = parsed
                .iter()
                .map(|k| k.fingerprint(ssh_key::HashAlg::Sha256).to_string())
                .collect::<Vec<_>>()
                .join(" ");
            (
                Change::RotateSigningKeys {
                    successors: signing_keys,
                },
                "rotate",
                fingerprints,
                "signing keys".to_owned(),
            )
        }
    };
    let row = draft_change(state, &sub, &change, action, &fingerprint, &label)
        .await?
        .map_err(change_refused)?;
    list_view(&row, &emails_listed(state, &[&row]).await?)
}

/// I: "leaving is one action". Revoking someone's operator role drafts the removal of
/// every key of theirs in the same step; the next signed list leaves them out and its push
/// takes them off every host. `None` when they had no key on the list.
pub async fn depart(state: &AppState, by_sub: &str, leaving_sub: &str) -> AppResult<Option<i32>> {
    let change = Change::Depart {
        user_sub: leaving_sub.to_owned(),
    };
    match draft_change(state, by_sub, &change, "depart", "all", leaving_sub).await? {
        Ok(row) => Ok(Some(row.version)),
        Err(ChangeRefusal::NotFound(_)) => Ok(None),
        Err(refused) => Err(change_refused(refused)),
    }
}

/// How often the renewal job looks.
pub const RENEW_EVERY: std::time::Duration = std::time::Duration::from_secs(3600);

/// When the published list expires (`None` before one is published): after it, hosts refuse
/// it and operators lose access (M).
pub async fn published_expiry(state: &AppState) -> AppResult<Option<DateTime<Utc>>> {
    match state.store.published_key_list().await? {
        Some(row) => Ok(Some(parse_stored(&row.body)?.expires)),
        None => Ok(None),
    }
}

/// Renewal (#16): once two thirds of the published list's validity have passed and no
/// draft is waiting, the same keys are drafted again with a fresh expiry, for a superadmin
/// to sign — well before hosts start refusing operators. Attributed to whoever published
/// the list being renewed. `Some(version)` when a renewal was drafted.
pub async fn renew_if_due(state: &AppState) -> AppResult<Option<i32>> {
    let Some(newest) = state.store.newest_key_list().await? else {
        return Ok(None);
    };
    if newest.state == KeyListState::Draft {
        return Ok(None);
    }
    let list = parse_stored(&newest.body)?;
    let due = list.issued_at + (list.expires - list.issued_at) * 2 / 3;
    let now = state.clock.now();
    if now < due {
        return Ok(None);
    }
    let Some(by) = newest.published_by.clone() else {
        return Ok(None);
    };
    let row = draft_change(
        state,
        &by,
        &Change::Renew,
        "renew",
        &format!("version {}", newest.version),
        "automatic renewal before expiry",
    )
    .await?
    .map_err(change_refused)?;
    tracing::warn!(version = row.version, expires = %list.expires, "the operator-key list is due for renewal: a draft waits for a signature");
    Ok(Some(row.version))
}

/// One change onto the draft, recorded and audited. Two changes racing to open the next
/// version collide on its key; the loser is applied again on top of the winner.
/// The list's refusal comes back as a value, for the caller to act on or answer with.
async fn draft_change(
    state: &AppState,
    by_sub: &str,
    change: &Change,
    action: &str,
    fingerprint: &str,
    label: &str,
) -> AppResult<Result<KeyListRow, ChangeRefusal>> {
    let validity = chrono::Duration::days(state.config.operator_keys.validity_days);
    for _ in 0..8 {
        let now = state.clock.now();
        let mut refusal = None;
        let result = state
            .store
            .apply_key_change(
                KeyChange {
                    user_sub: by_sub,
                    action,
                    fingerprint,
                    label,
                },
                now,
                |base, version| {
                    let base = base.map(KeyList::from_canonical).transpose().map_err(|e| {
                        DbError::Refused(format!("stored list does not parse: {e}"))
                    })?;
                    KeyList::with_change(
                        base.as_ref(),
                        change,
                        &state.config.environment,
                        version as u64,
                        now,
                        validity,
                    )
                    .map(|l| l.to_canonical())
                    .map_err(|r| {
                        refusal = Some(r);
                        DbError::Refused("operator_key_change".into())
                    })
                },
            )
            .await;
        match result {
            Ok(row) => {
                state
                    .store
                    .audit(Some(by_sub), "operator_keys.change", None, json!({"action": action, "fingerprint": fingerprint, "label": label, "version": row.version}), now)
                    .await?;
                return Ok(Ok(row));
            }
            Err(DbError::Conflict(_)) => continue,
            Err(e) => return refusal.map(Err).ok_or_else(|| e.into()),
        }
    }
    Err(AppError::conflict(
        "busy",
        "too many changes at once; try again",
    ))
}

pub async fn withdraw(state: &AppState, by: &Operator) -> AppResult<()> {
    let n = state
        .store
        .withdraw_key_drafts()
        .await
        .map_err(|e| match e {
            DbError::NotFound => AppError::bad_request("no_draft", "there is no draft to withdraw"),
            other => other.into(),
        })?;
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "operator_keys.withdraw",
            None,
            json!({"drafts": n}),
            state.clock.now(),
        )
        .await?;
    Ok(())
}

/// Send the stored signed bytes to `targets` and record each outcome.
async fn deliver(
    state: &AppState,
    version: i32,
    envelope: &[u8],
    targets: Vec<byo_db::hosts::AgentTargetRow>,
) -> AppResult<(usize, usize)> {
    let outcomes: Vec<_> = futures::stream::iter(targets)
        .map(|t| async move {
            let r = state.agents.push_operator_keys(&t, envelope).await;
            (t, r)
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let (mut delivered, mut failed) = (0, 0);
    for (t, r) in outcomes {
        let now = state.clock.now();
        match &r {
            Ok(()) => delivered += 1,
            Err(e) => {
                failed += 1;
                tracing::warn!(host = %t.slug, version, error = %e, "operator-key push failed");
            }
        }
        state
            .store
            .record_key_push(
                &t.id,
                r.as_ref().map(|()| version).map_err(String::as_str),
                now,
            )
            .await?;
    }
    Ok((delivered, failed))
}

/// Publish the newest draft with a signature made on an operator's own machine, after
/// checking it with the agent's verifier; then push it to every host.
pub async fn publish(
    state: &AppState,
    by: &CurrentUser,
    version: i32,
    upload: SignatureUpload,
) -> AppResult<PushOutcome> {
    let trusted = signing_trust(state).await?;
    if trusted.is_empty() {
        return Err(AppError::conflict(
            "no_signing_key",
            "no signing key is configured (operator_keys.signing_keys)",
        ));
    }
    let newest = state.store.newest_key_list().await?;
    let draft = match newest {
        Some(row) if row.state == KeyListState::Draft && row.version == version => row,
        Some(row) if row.version == version => {
            return Err(AppError::conflict(
                "already_published",
                format!("version {version} is already published"),
            ));
        }
        _ => {
            return Err(AppError::conflict(
                "not_the_newest_draft",
                "only the newest draft can be signed",
            ));
        }
    };
    let envelope = SignedList {
        body: draft.body.clone(),
        signatures: std::iter::once(upload.signature)
            .chain(upload.more_signatures)
            .collect(),
    }
    .to_bytes();
    let now = state.clock.now();
    let verified = keylist::verify(&envelope, &trusted, &state.config.environment, None, now)
        .map_err(|r| AppError::bad_request("signature_refused", r.to_string()))?;
    let keys: Vec<PublishedKey> = verified
        .keys
        .iter()
        .map(|k| PublishedKey {
            user_sub: k.key.user_sub.clone(),
            label: k.key.label.clone(),
            public_key: k.key.public_key.clone(),
            fingerprint: k.fingerprint.clone(),
        })
        .collect();
    let envelope_text = String::from_utf8(envelope.clone()).expect("the envelope is JSON text");
    match state
        .store
        .publish_key_list(version, &envelope_text, &keys, &by.user.sub, now)
        .await?
    {
        GuardedWrite::Written => {}
        GuardedWrite::AlreadySet => {
            return Err(AppError::conflict(
                "already_published",
                format!("version {version} was published meanwhile"),
            ));
        }
    }
    state
        .store
        .audit(
            Some(&by.user.sub),
            "operator_keys.publish",
            None,
            json!({"version": version}),
            now,
        )
        .await?;
    let targets = state.store.agent_targets().await?;
    let (delivered, failed) = deliver(state, version, &envelope, targets).await?;
    Ok(PushOutcome {
        version,
        delivered,
        failed,
    })
}

pub async fn send_again(state: &AppState, by: &Operator, host_id: &str) -> AppResult<PushOutcome> {
    let target = state
        .store
        .agent_target(host_id)
        .await?
        .ok_or(AppError::NotFound)?;
    let (version, envelope) = published_envelope(state).await?;
    state
        .store
        .audit(
            Some(&by.0.user.sub),
            "operator_keys.send_again",
            Some(host_id),
            json!({"version": version}),
            state.clock.now(),
        )
        .await?;
    let (delivered, failed) = deliver(state, version, envelope.as_bytes(), vec![target]).await?;
    Ok(PushOutcome {
        version,
        delivered,
        failed,
    })
}

/// The published list's version and signed envelope; 409 while none is published.
async fn published_envelope(state: &AppState) -> AppResult<(i32, String)> {
    let published =
        state.store.published_key_list().await?.ok_or_else(|| {
            AppError::conflict("nothing_published", "no list has been published yet")
        })?;
    let envelope = published
        .envelope
        .expect("a published list has its envelope (operator_key_lists_signed)");
    Ok((published.version, envelope))
}

/// What a host asking for the published list is answered.
#[derive(Debug, PartialEq, Eq)]
pub enum HostFetch {
    /// The signed envelope, exactly as published and pushed.
    Published(String),
    /// The token is no live host's: the one answer for that (as host-report's).
    InvalidToken,
}

/// The published list for the host whose token this is: what a push would send it. A host
/// still preparing asks at every attempt, so a list published or renewed after its
/// enrolment reaches it; the host verifies it exactly as a push (M.7), so the server
/// decides nothing here but who is asking. Refused with 409 while none is published.
pub async fn published_for_host(state: &AppState, token: &SecretToken) -> AppResult<HostFetch> {
    let Some(host_id) = state.store.host_id_by_token(&token.hash()).await? else {
        return Ok(HostFetch::InvalidToken);
    };
    let (version, envelope) = published_envelope(state).await?;
    // As at enrolment: the answer carries the list, so from here the host holds that
    // version; recorded where pushes are, or the operators' page keeps showing the failed
    // push to a host that was not serving yet.
    state
        .store
        .record_key_push(&host_id, Ok(version), state.clock.now())
        .await?;
    Ok(HostFetch::Published(envelope))
}

/// Whose key this is: every listing of `fingerprint`, with its operator (I.1).
pub async fn owners(state: &AppState, fingerprint: &str) -> AppResult<Vec<KeyOwner>> {
    let rows = state
        .store
        .operator_key_by_fingerprint(fingerprint.trim())
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let email = state.store.user(&r.user_sub).await?.map(|u| u.email);
        out.push(KeyOwner {
            user_sub: r.user_sub,
            email,
            label: r.label,
            fingerprint: r.fingerprint,
            listed_at: r.created_at,
            removed_at: r.removed_at,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGXbBkKhxRqtwdtBr1JRFsuK7mWzsKEHvLjOT8tNYKd3";

    fn key_of(text: &str) -> String {
        split_pasted_key(text)
            .map(|k| k.key)
            .unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    #[test]
    fn a_pasted_line_loses_its_comment_and_its_extra_spaces() {
        assert_eq!(key_of(&format!("{KEY} ana@laptop")), KEY);
        let spaced = KEY.replace(' ', "   ");
        assert_eq!(key_of(&spaced), KEY);
        assert_eq!(key_of(&format!("  {spaced}  ")), KEY);
    }

    #[test]
    fn what_is_not_a_type_and_a_key_is_passed_whole_to_the_lists_own_check() {
        // One field, or a control character anywhere (the comment too): the list's check
        // refuses it by name, so it must reach that check as it was pasted.
        assert_eq!(key_of("AAAAC3NzaC1lZDI1NTE5"), "AAAAC3NzaC1lZDI1NTE5");
        let bell = format!("{KEY} ana\u{7}laptop");
        assert_eq!(key_of(&bell), bell);
        assert!(split_pasted_key(&format!("no-pty {KEY}")).is_err());
    }
}
