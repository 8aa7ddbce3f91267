//! What is wrong with a host, by name, from what its agent reported and what the backend
//! recorded ("knowing is what the agent reports and /admin renders"): no SSH, no guessing.
//! A pure judge over rows already read, with time passed in, so each failure has one
//! spelling and the page and any later alert read the same list.

use byo_db::hosts::{HostRow, HostStatusRow};
use byo_db::operator_keys::{HostKeyPushRow, KeyListRow};
use byo_db::vms::{HostBenchRow, VmRow};
use chrono::{DateTime, Utc};

pub use byo_core::keylist::{KEY_LIST_EXPIRY_WARNING_DAYS, expiry_warning};

/// One thing wrong, by the name the design gives it, and what was seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub name: &'static str,
    pub detail: String,
}

/// Everything the judge reads about one host.
pub struct Seen<'a> {
    pub host: &'a HostRow,
    pub status: Option<&'a HostStatusRow>,
    /// The oldest heartbeat a host in service may have (placement's age).
    pub heard_since: DateTime<Utc>,
    pub push: Option<&'a HostKeyPushRow>,
    pub published: Option<&'a KeyListRow>,
    pub vms: &'a [VmRow],
    pub bench: Option<&'a HostBenchRow>,
}

/// The problems of one host now, in a fixed order.
pub fn problems(seen: &Seen<'_>, now: DateTime<Utc>) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut add = |name, detail: String| out.push(Problem { name, detail });
    let host = seen.host;
    if host.retired_at.is_some() {
        return Vec::new();
    }
    let serving = host.prepared_at.is_some();
    match seen.status {
        None if serving => add("agent unreachable", "no heartbeat ever arrived".to_owned()),
        Some(s) if s.seen_at < seen.heard_since => add(
            "agent unreachable",
            format!(
                "last heartbeat {}",
                s.seen_at.format("%Y-%m-%d %H:%M:%S UTC")
            ),
        ),
        _ => {}
    }
    if let Some(p) = &host.prepare_state
        && p.0["state"].as_str() == Some("failed")
    {
        let step = p.0["step"].as_str().unwrap_or("?");
        if serving {
            // A failed step on a host that completed preparation is the deliberate run's
            // (L): reported and left, the host still serving, nothing rolled back.
            add(
                "re-prepare failed",
                format!(
                    "at {step}: {}",
                    p.0["error"].as_str().unwrap_or("no reason given")
                ),
            );
        } else {
            add("prepare stopped", format!("at step {step}"));
        }
    }
    if let Some(s) = seen.status {
        match s.details.0["relay_map"].as_str() {
            Some("drift_rewritten") => add(
                "relay map drift",
                "the relay's SSH map differed from what the host runs; the agent rewrote it"
                    .to_owned(),
            ),
            Some("unreachable") => add(
                "relay map drift",
                "the agent could not read the relay's SSH map".to_owned(),
            ),
            _ => {}
        }
        if let Some(k) = s.details.0.get("operator_keys").filter(|k| !k.is_null())
            && let Some(expires) = k["expires"]
                .as_str()
                .and_then(|e| e.parse::<DateTime<Utc>>().ok())
            && expires <= now
        {
            add(
                "key list expired",
                format!(
                    "the list this host holds (version {}) expired {}: sshd refuses every operator until a newer list reaches it",
                    k["version"],
                    expires.format("%Y-%m-%d %H:%M UTC")
                ),
            );
        }
        // L3.3: half a pair, named; de-pooling stays the operator's decision.
        if let Some(half) = s.details.0["half_a_pair"]
            .as_array()
            .filter(|h| !h.is_empty())
        {
            let why: Vec<&str> = half.iter().filter_map(|w| w.as_str()).collect();
            add("half a pair", why.join("; ").chars().take(300).collect());
        }
        if let Some(r) = s.details.0.get("rollback").filter(|r| !r.is_null()) {
            add(
                "rollback fired",
                format!(
                    "the agent restored its previous build at {}",
                    r["at"].as_str().unwrap_or("?")
                ),
            );
        }
    }
    for v in seen.vms {
        if v.deleted_at.is_none() && v.delete_requested_at.is_some() {
            add(
                "stuck delete",
                format!(
                    "{} was asked to go and the host has not confirmed it",
                    v.name
                ),
            );
        }
    }
    if let Some(k) = seen.push {
        if let Some(e) = &k.error {
            add("failed push", e.chars().take(200).collect());
        }
        if let Some(p) = seen.published
            && serving
            && k.version.is_none_or(|held| held < p.version)
        {
            add(
                "key list lagging",
                format!(
                    "holds version {} of published {}",
                    k.version.map_or("none".to_owned(), |v| v.to_string()),
                    p.version
                ),
            );
        }
    }
    if let Some(p) = seen.published
        && let Ok(list) = byo_core::keylist::KeyList::from_canonical(&p.body)
        && let Some(step) = expiry_warning(list.expires, now)
    {
        add(
            "key list expiring",
            format!(
                "version {} {} {}",
                p.version,
                if step == 0 { "expired" } else { "expires" },
                list.expires.format("%Y-%m-%d %H:%M UTC")
            ),
        );
    }
    if let Some(b) = seen.bench
        && b.in_effect()
    {
        add(
            "benched",
            format!(
                "{} creates failed in a row; last: {}",
                b.consecutive_failures,
                b.last_failure.as_deref().unwrap_or("—")
            ),
        );
    }
    out
}
