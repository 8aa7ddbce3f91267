//! The fleet's gauges on `/metrics` (issue #38): hosts by state, the oldest heartbeat, stuck
//! deletes, the queue, open creates, unpaid bookings, each job's last success and whether its
//! last run failed, when the published operator-key list expires, failed key pushes and
//! halted fleet upgrades. Read from the database
//! at each scrape (one statement for the fleet, one for the jobs), with the same bounds the
//! pages judge by, so an alert and /admin never disagree. `docs/alerts.yml` alerts on them.

use chrono::{DateTime, TimeDelta, Utc};

use crate::error::AppResult;
use crate::metrics::{FleetMetrics, JobLabels, StateLabels};
use crate::state::AppState;

fn seconds(t: DateTime<Utc>) -> f64 {
    t.timestamp_millis() as f64 / 1000.0
}

fn age(now: DateTime<Utc>, t: Option<DateTime<Utc>>) -> f64 {
    t.map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1000.0)
}

/// Read the fleet and set the gauges. On a database error the gauges keep their last values
/// and `byo_fleet_read_ok` says 0, so an alert on it fires rather than the figures lying.
pub async fn refresh(state: &AppState) {
    let m = &state.metrics.fleet;
    match read(state, m).await {
        Ok(()) => m.read_ok.set(1),
        Err(e) => {
            tracing::warn!(error = %e, "the fleet's metrics could not be read");
            m.read_ok.set(0)
        }
    };
}

async fn read(state: &AppState, m: &FleetMetrics) -> AppResult<()> {
    let now = state.clock.now();
    let heard_since = state.config.placement.seen_since(now);
    let stuck_since =
        now - TimeDelta::minutes(crate::app::notify_stuck_deletes::STUCK_AFTER_MINUTES);
    let g = state.store.fleet_gauges(heard_since, stuck_since).await?;
    for (name, n) in [
        ("active", g.hosts_active),
        ("depooled", g.hosts_depooled),
        ("preparing", g.hosts_preparing),
        ("unreachable", g.hosts_unreachable),
    ] {
        m.hosts.get_or_create(&StateLabels { state: name }).set(n);
    }
    m.heartbeat_oldest_age.set(age(now, g.oldest_heartbeat));
    m.stuck_deletes.set(g.stuck_deletes);
    m.delete_oldest_age.set(age(now, g.oldest_delete));
    m.queue_open.set(g.queue_open);
    m.queue_oldest_age.set(age(now, g.oldest_queued));
    m.creates_open.set(g.creates_open);
    m.bookings_unpaid.set(g.bookings_unpaid);
    m.key_pushes_failed.set(g.key_pushes_failed);
    m.fleet_upgrades_halted.set(g.fleet_upgrades_halted);
    for j in state.store.job_health().await? {
        let labels = JobLabels { job: j.job };
        m.job_last_success
            .get_or_create(&labels)
            .set(j.last_success.map_or(0.0, seconds));
        m.job_last_failed
            .get_or_create(&labels)
            .set(i64::from(j.last_failed));
    }
    let expires = crate::app::operator_keys::published_expiry(state).await?;
    m.key_list_expiry.set(expires.map_or(0.0, seconds));
    Ok(())
}
