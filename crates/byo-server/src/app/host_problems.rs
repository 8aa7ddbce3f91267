//! What is wrong with a host, by name, from what its agent reported and what the backend
//! recorded ("knowing is what the agent reports and /admin renders"): no SSH, no guessing.
//! A pure judge over rows already read, with time passed in, so each failure has one
//! spelling and the page and any later alert read the same list.

use byo_db::hosts::{HostRow, HostStatusRow};
use byo_db::operator_keys::{HostKeyPushRow, KeyListRow};
use byo_db::vms::{HostBenchRow, VmRow};
use byo_wire::vm::RelayMapCheck;
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
    /// The published list's expiry, read once by [`list_expiry`] (not once per host).
    pub published_expires: Option<DateTime<Utc>>,
    pub vms: &'a [VmRow],
    pub bench: Option<&'a HostBenchRow>,
}

/// When the published list expires (`None`: no list, or one that does not parse).
pub fn list_expiry(published: Option<&KeyListRow>) -> Option<DateTime<Utc>> {
    published
        .and_then(|p| byo_core::keylist::KeyList::from_canonical(&p.body).ok())
        .map(|l| l.expires)
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
        && p.0.failed()
    {
        let step = p.0.step.as_str();
        if serving {
            // A failed step on a host that completed preparation is the deliberate run's
            // (L): reported and left, the host still serving, nothing rolled back.
            add(
                "re-prepare failed",
                format!(
                    "at {step}: {}",
                    p.0.error.as_deref().unwrap_or("no reason given")
                ),
            );
        } else {
            add("prepare stopped", format!("at step {step}"));
        }
    }
    if let Some(s) = seen.status {
        let details = &s.details.0;
        match details.relay_map {
            Some(RelayMapCheck::DriftRewritten) => add(
                "relay map drift",
                "the relay's SSH map differed from what the host runs; the agent rewrote it"
                    .to_owned(),
            ),
            Some(RelayMapCheck::Unreachable) => add(
                "relay map drift",
                "the agent could not read the relay's SSH map".to_owned(),
            ),
            Some(RelayMapCheck::InSync | RelayMapCheck::Unchecked) | None => {}
        }
        if let Some(k) = &details.operator_keys
            && k.expires <= now
        {
            add(
                "key list expired",
                format!(
                    "the list this host holds (version {}) expired {}: sshd refuses every operator until a newer list reaches it",
                    k.version,
                    k.expires.format("%Y-%m-%d %H:%M UTC")
                ),
            );
        }
        // L3.3: half a pair, named; de-pooling stays the operator's decision.
        if let Some(half) = details.half_a_pair.as_ref().filter(|h| !h.is_empty()) {
            add("half a pair", half.join("; ").chars().take(300).collect());
        }
        if let Some(r) = &details.rollback {
            add(
                "rollback fired",
                format!(
                    "the agent restored its previous build at {}",
                    r.at.as_deref().unwrap_or("?")
                ),
            );
        }
    }
    for v in seen.vms {
        if v.phase() == byo_wire::states::InstancePhase::Deleting {
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
        && let Some(expires) = seen.published_expires
        && let Some(step) = expiry_warning(expires, now)
    {
        add(
            "key list expiring",
            format!(
                "version {} {} {}",
                p.version,
                if step == 0 { "expired" } else { "expires" },
                expires.format("%Y-%m-%d %H:%M UTC")
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

#[cfg(test)]
mod tests {
    use byo_db::Json;
    use byo_wire::states::{KeyListState, VmStatus};
    use chrono::TimeDelta;
    use serde_json::{Value, json};

    use super::*;

    fn at(minutes: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + TimeDelta::days(20_000) + TimeDelta::minutes(minutes)
    }

    fn host(prepared: bool) -> HostRow {
        HostRow {
            id: "h1".into(),
            slug: "spark-1".into(),
            owner_sub: "owner".into(),
            profile_id: "gb10".into(),
            gpu_type: "gb10".into(),
            active: true,
            dedicated: false,
            dedicated_to: None,
            placement: None,
            prepare_state: None,
            prepared_at: prepared.then(|| at(0)),
            pubkey: None,
            lockout_owner: true,
            relay_name: None,
            relay_ip: None,
            created_at: at(0),
            activated_at: None,
            retired_at: None,
        }
    }

    fn status(seen_at: DateTime<Utc>, details: Value) -> HostStatusRow {
        HostStatusRow {
            host_id: "h1".into(),
            seen_at,
            agent_version: None,
            lxd: None,
            relay: None,
            tunnel: None,
            gpu: None,
            storage: None,
            instances: None,
            details: Json(serde_json::from_value(details).unwrap()),
        }
    }

    fn push(version: Option<i32>) -> HostKeyPushRow {
        HostKeyPushRow {
            host_id: "h1".into(),
            slug: "spark-1".into(),
            version,
            attempted_at: None,
            error: None,
        }
    }

    fn published(version: i32) -> KeyListRow {
        KeyListRow {
            version,
            state: KeyListState::Published,
            // Not a key list: no "expiring" problem to read past.
            body: String::new(),
            envelope: None,
            created_at: at(0),
            created_by: None,
            published_at: None,
            published_by: None,
        }
    }

    /// The judge's problems for one host at minute 12, heard from since minute 10.
    fn judged(
        host: &HostRow,
        status: Option<&HostStatusRow>,
        push: Option<&HostKeyPushRow>,
        published: Option<&KeyListRow>,
        vms: &[VmRow],
    ) -> Vec<Problem> {
        let seen = Seen {
            host,
            status,
            heard_since: at(10),
            push,
            published,
            published_expires: list_expiry(published),
            vms,
            bench: None,
        };
        problems(&seen, at(12))
    }

    fn names(
        host: &HostRow,
        status: Option<&HostStatusRow>,
        push: Option<&HostKeyPushRow>,
        published: Option<&KeyListRow>,
    ) -> Vec<&'static str> {
        judged(host, status, push, published, &[])
            .iter()
            .map(|p| p.name)
            .collect()
    }

    #[test]
    fn a_serving_host_never_heard_from_is_unreachable_and_one_still_preparing_is_not() {
        assert_eq!(names(&host(true), None, None, None), ["agent unreachable"]);
        assert!(names(&host(false), None, None, None).is_empty());
    }

    #[test]
    fn a_heartbeat_at_the_oldest_allowed_instant_is_in_time_and_one_before_it_is_not() {
        let h = host(true);
        assert!(names(&h, Some(&status(at(10), json!({}))), None, None).is_empty());
        let late = status(at(10) - TimeDelta::seconds(1), json!({}));
        assert_eq!(names(&h, Some(&late), None, None), ["agent unreachable"]);
    }

    #[test]
    fn a_relay_map_the_agent_could_not_read_is_drift_by_its_own_words() {
        let s = status(at(11), json!({"relay_map": "unreachable"}));
        assert_eq!(
            judged(&host(true), Some(&s), None, None, &[]),
            [Problem {
                name: "relay map drift",
                detail: "the agent could not read the relay's SSH map".into()
            }]
        );
        let s = status(at(11), json!({"relay_map": "in_sync"}));
        assert!(names(&host(true), Some(&s), None, None).is_empty());
    }

    #[test]
    fn a_serving_host_behind_the_published_list_lags_and_one_at_it_or_preparing_does_not() {
        let s = status(at(11), json!({}));
        let (h, list) = (host(true), published(3));
        assert_eq!(
            names(&h, Some(&s), Some(&push(Some(2))), Some(&list)),
            ["key list lagging"]
        );
        assert_eq!(
            names(&h, Some(&s), Some(&push(None)), Some(&list)),
            ["key list lagging"]
        );
        assert!(names(&h, Some(&s), Some(&push(Some(3))), Some(&list)).is_empty());
        assert!(names(&h, Some(&s), Some(&push(Some(4))), Some(&list)).is_empty());
        // A host still preparing has not been sent a list yet: nothing lags.
        assert!(names(&host(false), Some(&s), Some(&push(Some(2))), Some(&list)).is_empty());
    }

    fn vm(name: &str, delete_requested: bool, deleted: bool) -> VmRow {
        VmRow {
            id: name.into(),
            user_sub: "customer".into(),
            host_id: Some("h1".into()),
            name: name.into(),
            gpu_type: "gb10".into(),
            ssh_hostname: None,
            ssh_port: None,
            status: if deleted {
                VmStatus::Deleted
            } else {
                VmStatus::Running
            },
            created_at: at(0),
            creation_failed_at: None,
            delete_requested_at: delete_requested.then(|| at(5)),
            deleted_at: deleted.then(|| at(6)),
        }
    }

    #[test]
    fn only_a_delete_asked_for_and_never_confirmed_is_stuck() {
        let s = status(at(11), json!({}));
        let vms = [
            vm("live", false, false),
            vm("gone", true, true),
            vm("stuck", true, false),
        ];
        assert_eq!(
            judged(&host(true), Some(&s), None, None, &vms),
            [Problem {
                name: "stuck delete",
                detail: "stuck was asked to go and the host has not confirmed it".into()
            }]
        );
    }
}
