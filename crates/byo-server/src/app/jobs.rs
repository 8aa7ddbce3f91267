//! The background-job driver (issue #13, deliverable 1): every scheduled job is registered
//! once in [`registry`] with a name, a period and an on-demand [`JobTrigger`]. A job takes
//! no input: it reads the database for its work and answers a one-line summary.
//!
//! One replica at a time: before each run the driver takes the job's lock from the store
//! (`pg_try_advisory_lock` on PostgreSQL, held on one connection for the run; nothing on
//! SQLite, one process). A replica that does not get the lock skips that tick and records
//! nothing — the replica that holds it records the run. Inside one process a job never
//! overlaps itself either (a per-job guard), whatever the backend.
//!
//! And once a period across the replicas: a scheduled tick that finds the job's last run
//! (by any replica) started less than half a period ago skips too, so N replicas ticking
//! at the same second run a job once, not N times in a row (found running two replicas as
//! docs/for-operators.md has it). A nudge ([`JobTrigger`]) or a direct [`JobDriver::tick`]
//! always runs: someone asked for it now.
//!
//! Each run that happened is recorded in `job_runs`: start, duration, outcome (`ok` or
//! `failed`), the summary or the error (both bounded to [`MAX_TEXT`] characters). A panic
//! in a job is recorded as a failure; the next tick runs it again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use byo_wire::api::{JobRunView, JobView};
use futures::FutureExt;
use futures::future::BoxFuture;

use crate::error::AppResult;
use crate::state::AppState;

/// The longest summary or error kept for a run.
pub const MAX_TEXT: usize = 1000;

/// A job's work: no input but the state, a summary out.
pub type JobFn =
    Arc<dyn for<'a> Fn(&'a AppState) -> BoxFuture<'a, AppResult<String>> + Send + Sync>;

pub use crate::job_trigger::JobTrigger;

/// One registered job.
#[derive(Clone)]
pub struct Job {
    pub name: String,
    pub every: Duration,
    pub run: JobFn,
}

impl Job {
    pub fn new<F>(name: &str, every: Duration, run: F) -> Job
    where
        F: for<'a> Fn(&'a AppState) -> BoxFuture<'a, AppResult<String>> + Send + Sync + 'static,
    {
        Job {
            name: name.to_owned(),
            every,
            run: Arc::new(run),
        }
    }
}

/// The one list of the server's jobs.
pub fn registry() -> Vec<Job> {
    vec![
        Job::new("reap", crate::REAP_EVERY, |state| {
            Box::pin(async move {
                // Now and then: forget rate-limit keys back to a full burst, and delete the
                // sessions past their expiry (issue #36, 8: they were refused but kept for
                // ever, a table of dead token hashes growing with every sign-in).
                let now = state.clock.now();
                state.rate_limits.tidy(now);
                let purged = state.store.purge_expired_sessions(now).await?;
                let signups = state.store.purge_expired_signups(now).await?;
                let r = super::reap::reap_once(state).await?;
                Ok(format!(
                    "released {}, failed {}, {purged} expired sessions and {signups} expired \
                     sign-ups purged",
                    r.released, r.failed
                ))
            })
        }),
        Job::new(
            "notify-stuck-deletes",
            super::notify_stuck_deletes::NOTIFY_EVERY,
            |state| {
                Box::pin(async move {
                    let found = super::notify_stuck_deletes::notify_once(state).await?;
                    Ok(format!("{} stuck deletes", found.len()))
                })
            },
        ),
        // Notices to people (issue #38, 3): judge the conditions, then deliver what is due.
        Job::new(
            super::notices::NOTICES,
            super::notices::NOTICES_EVERY,
            |state| {
                Box::pin(async move {
                    let s = super::notices::sweep_once(state).await?;
                    let d = super::notices::deliver_once(state).await?;
                    Ok(format!(
                        "{} conditions present, {} notices raised, {} cleared; {} delivered, {} to retry, {} given up",
                        s.present, s.raised, s.cleared, d.sent, d.retrying, d.given_up
                    ))
                })
            },
        ),
        Job::new(
            "settle-creates",
            super::settle_creates::SETTLE_EVERY,
            |state| {
                Box::pin(async move {
                    let n = super::settle_creates::settle_once(state).await?;
                    Ok(format!("{n} creates nobody answered settled as failed"))
                })
            },
        ),
        // Leaving gives everything back (issue #39, 3).
        Job::new(
            super::retire_stopped::RETIRE_STOPPED,
            super::retire_stopped::RETIRE_STOPPED_EVERY,
            |state| {
                Box::pin(async move {
                    Ok(super::retire_stopped::retire_stopped_once(state)
                        .await?
                        .to_string())
                })
            },
        ),
        Job::new(
            "renew-operator-keys",
            super::operator_keys::RENEW_EVERY,
            |state| {
                Box::pin(async move {
                    Ok(match super::operator_keys::renew_if_due(state).await? {
                        Some(v) => format!("drafted renewal version {v}"),
                        None => "not due".to_owned(),
                    })
                })
            },
        ),
        Job::new("bill-usage", super::billing::BILL_EVERY, |state| {
            Box::pin(async move {
                if state.stripe.is_none() {
                    return Ok("billing is off: nothing to charge".to_owned());
                }
                let r = super::billing::bill_usage_once(state).await?;
                Ok(format!(
                    "charged {} periods, refunded {}, closed {}, {} without a Stripe customer; invoiced {}, {} paid, {} declined; {} instances stopped unpaid, {} started paid",
                    r.charged,
                    r.refunded,
                    r.closed,
                    r.no_customer,
                    r.invoiced,
                    r.invoices_paid,
                    r.payments_failed,
                    r.unpaid_stopped,
                    r.unpaid_started
                ))
            })
        }),
        // Owners paid their share (issue #40, 6).
        Job::new(
            super::payouts::PAY_OWNERS,
            super::payouts::PAY_OWNERS_EVERY,
            |state| {
                Box::pin(async move {
                    if state.stripe.is_none() {
                        return Ok("billing is off: nothing to pay out".to_owned());
                    }
                    Ok(super::payouts::pay_owners_once(state).await?.to_string())
                })
            },
        ),
        Job::new(
            "launch-prebookings",
            super::prebookings::LAUNCH_EVERY,
            |state| {
                Box::pin(async move {
                    let s = super::prebookings::launch_once(state).await?;
                    Ok(format!(
                        "due {}, launched {}, live {}, waiting {}",
                        s.due, s.launched, s.live, s.waiting
                    ))
                })
            },
        ),
        Job::new(
            "expire-prebook",
            super::prebookings::EXPIRE_EVERY,
            |state| {
                Box::pin(async move {
                    let s = super::prebookings::expire_once(state).await?;
                    Ok(format!(
                        "closed {}, delete unconfirmed {}, deferred {}",
                        s.closed, s.unconfirmed, s.deferred
                    ))
                })
            },
        ),
        // The queue's end (issue #39, 2): a row no host took by its `expires_at` closes.
        Job::new(
            super::queue_drain::EXPIRE_QUEUE,
            super::queue_drain::EXPIRE_EVERY,
            |state| {
                Box::pin(async move {
                    let n = super::queue_drain::expire_once(state).await?;
                    Ok(format!("{n} queued creates expired"))
                })
            },
        ),
        // The queue (E2, issue #13): nudged by step 84's hook (`state.drain`).
        Job::new(
            super::queue_drain::QUEUE_DRAIN,
            super::queue_drain::DRAIN_EVERY,
            |state| {
                Box::pin(
                    async move { Ok(super::queue_drain::drain_once(state).await?.to_string()) },
                )
            },
        ),
    ]
}

/// What one tick of a job came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tick {
    /// It ran here; the run is recorded.
    Ran { ok: bool },
    /// Another replica (or this process) was running it: nothing recorded.
    Skipped,
}

struct Entry {
    job: Job,
    trigger: JobTrigger,
    running: tokio::sync::Mutex<()>,
}

/// The driver: the registered jobs, each with its trigger, over one state.
#[derive(Clone)]
pub struct JobDriver {
    state: AppState,
    entries: Arc<Vec<Entry>>,
}

impl JobDriver {
    pub fn new(state: AppState, jobs: Vec<Job>) -> JobDriver {
        // The queue drain runs on the trigger step 84's hook nudges (`state.drain`).
        let drain_trigger = state.drain.trigger();
        let entries = jobs
            .into_iter()
            .map(|job| Entry {
                trigger: match &drain_trigger {
                    Some(t) if job.name == super::queue_drain::QUEUE_DRAIN => t.clone(),
                    _ => JobTrigger::default(),
                },
                job,
                running: tokio::sync::Mutex::new(()),
            })
            .collect();
        JobDriver {
            state,
            entries: Arc::new(entries),
        }
    }

    /// The job named `name`'s trigger.
    pub fn trigger(&self, name: &str) -> Option<JobTrigger> {
        self.entry(name).map(|e| e.trigger.clone())
    }

    fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.job.name == name)
    }

    /// Run job `name` once now, if no one else is: the tick the schedule and the trigger
    /// both come to. `None` when no such job is registered.
    pub async fn tick(&self, name: &str) -> AppResult<Option<Tick>> {
        let Some(entry) = self.entry(name) else {
            return Ok(None);
        };
        Ok(Some(self.tick_entry(entry, Asked::Now).await?))
    }

    async fn tick_entry(&self, entry: &Entry, asked: Asked) -> AppResult<Tick> {
        let Ok(_running) = entry.running.try_lock() else {
            return Ok(Tick::Skipped);
        };
        let job = &entry.job;
        let Some(lock) = self.state.store.try_job_lock(&job.name).await? else {
            return Ok(Tick::Skipped);
        };
        if asked == Asked::Schedule && self.ran_this_period(job).await? {
            lock.release().await?;
            return Ok(Tick::Skipped);
        }
        let started_at = self.state.clock.now();
        let clock = Instant::now();
        let outcome = std::panic::AssertUnwindSafe((job.run)(&self.state))
            .catch_unwind()
            .await;
        let duration_ms = i32::try_from(clock.elapsed().as_millis()).unwrap_or(i32::MAX);
        let (ok, summary, error) = match outcome {
            Ok(Ok(summary)) => (true, Some(bounded(&summary)), None),
            Ok(Err(e)) => (false, None, Some(bounded(&e.to_string()))),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "the job panicked".into());
                (false, None, Some(bounded(&format!("panicked: {why}"))))
            }
        };
        let recorded = self
            .state
            .store
            .record_job_run(byo_db::jobs::NewJobRun {
                job: &job.name,
                started_at,
                duration_ms,
                outcome: if ok { "ok" } else { "failed" },
                summary: summary.as_deref(),
                error: error.as_deref(),
            })
            .await;
        let released = lock.release().await;
        match &error {
            Some(e) => tracing::error!(job = %job.name, error = %e, duration_ms, "job failed"),
            None => {
                tracing::debug!(job = %job.name, summary = summary.as_deref().unwrap_or(""), duration_ms, "job ran")
            }
        }
        recorded?;
        released?;
        Ok(Tick::Ran { ok })
    }

    /// Whether any replica started `job` less than half its period ago.
    async fn ran_this_period(&self, job: &Job) -> AppResult<bool> {
        let half = chrono::TimeDelta::from_std(job.every / 2).unwrap_or(chrono::TimeDelta::MAX);
        Ok(self
            .state
            .store
            .job_runs(&job.name, 1)
            .await?
            .first()
            .is_some_and(|last| self.state.clock.now() - last.started_at < half))
    }

    /// One task per job: run it every period and on each nudge, until `stop` says so. A
    /// tick missed while a run was in flight is delayed, not bunched.
    pub fn spawn(
        &self,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..self.entries.len())
            .map(|i| {
                let driver = self.clone();
                let mut stop = stop.clone();
                tokio::spawn(async move {
                    let entry = &driver.entries[i];
                    let mut every = tokio::time::interval(entry.job.every);
                    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                    loop {
                        let asked = tokio::select! {
                            _ = every.tick() => Asked::Schedule,
                            _ = entry.trigger.notified() => Asked::Now,
                            changed = stop.changed() => {
                                if changed.is_err() || *stop.borrow() {
                                    return;
                                }
                                continue;
                            }
                        };
                        if let Err(e) = driver.tick_entry(entry, asked).await {
                            tracing::error!(job = %entry.job.name, error = %e, "job not run: the driver could not lock or record it");
                        }
                    }
                })
            })
            .collect()
    }
}

/// Why a tick came: the period's schedule, or someone asking now (a nudge, a direct tick).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Asked {
    Schedule,
    Now,
}

/// How many runs of each job /admin/jobs and its API show.
pub const RECENT_RUNS: i64 = 10;

/// Each registered job with its newest [`RECENT_RUNS`] runs, for /admin/jobs and its API.
pub async fn overview(state: &AppState) -> AppResult<Vec<JobView>> {
    let mut out = Vec::new();
    for job in registry() {
        let runs = state.store.job_runs(&job.name, RECENT_RUNS).await?;
        out.push(JobView {
            name: job.name,
            every_secs: job.every.as_secs(),
            runs: runs
                .into_iter()
                .map(|r| JobRunView {
                    started_at: r.started_at,
                    duration_ms: r.duration_ms,
                    outcome: r.outcome,
                    summary: r.summary,
                    error: r.error,
                })
                .collect(),
        });
    }
    Ok(out)
}

fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_TEXT) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
