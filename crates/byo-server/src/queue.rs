//! The queue (E2) as instances see it: step 84, told when a confirmed delete freed a host.
//! The drain itself is `app::queue_drain`, a job on the driver; this hook nudges it.

use futures::future::BoxFuture;

use crate::job_trigger::JobTrigger;

/// Step 84: what runs when a confirmed delete freed a host — the queue drain (E2). It is
/// called only after `deleted_at` is written, so the host it is told about is pickable.
pub trait QueueDrain: Send + Sync {
    fn capacity_freed<'a>(&'a self, gpu_type: &'a str, host_id: &'a str) -> BoxFuture<'a, ()>;
    /// The drain job's trigger, when this hook has one: the job driver runs `queue-drain`
    /// on it, and a new queued row nudges it too.
    fn trigger(&self) -> Option<JobTrigger> {
        None
    }
}

/// Nothing to drain (a test that records step 84 instead).
pub struct NoQueue;

impl QueueDrain for NoQueue {
    fn capacity_freed<'a>(&'a self, gpu_type: &'a str, host_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            tracing::debug!(%gpu_type, host = %host_id, "capacity freed; no queue to drain");
        })
    }
}

/// The server's hook: "capacity freed" nudges the `queue-drain` job, which runs at once
/// (or once more, if a run is in flight) on whichever replica holds its lock.
#[derive(Default)]
pub struct NudgeDrain {
    trigger: JobTrigger,
}

impl QueueDrain for NudgeDrain {
    fn capacity_freed<'a>(&'a self, gpu_type: &'a str, host_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            tracing::debug!(%gpu_type, host = %host_id, "capacity freed; nudging the queue drain");
            self.trigger.nudge();
        })
    }
    fn trigger(&self) -> Option<JobTrigger> {
        Some(self.trigger.clone())
    }
}
