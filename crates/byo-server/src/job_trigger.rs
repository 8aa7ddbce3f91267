//! A job's on-demand trigger, beside `state` (which holds the queue's through
//! `queue::NudgeDrain`) so that neither `state` nor `queue` imports `app`: the driver
//! (`app::jobs`) waits on it, any code may nudge it.

use std::sync::Arc;

/// A handle any code can `nudge()` to run a job now rather than at its next period (the
/// queue drain's "capacity freed"). Nudges while a run is in flight coalesce into one more
/// run.
#[derive(Clone, Default, Debug)]
pub struct JobTrigger(Arc<tokio::sync::Notify>);

impl JobTrigger {
    pub fn nudge(&self) {
        self.0.notify_one();
    }

    /// Wait for the next nudge (the driver's loop).
    pub async fn notified(&self) {
        self.0.notified().await
    }
}
