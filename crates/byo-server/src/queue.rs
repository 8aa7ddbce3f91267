//! The queue (E2) as instances see it: step 84, told when a confirmed delete freed a host.
//! Only the hook exists; there is no queue yet.

use futures::future::BoxFuture;

/// Step 84: what runs when a confirmed delete freed a host — the queue drain (E2). It is
/// called only after `deleted_at` is written, so the host it is told about is pickable.
pub trait QueueDrain: Send + Sync {
    fn capacity_freed<'a>(&'a self, gpu_type: &'a str, host_id: &'a str) -> BoxFuture<'a, ()>;
}

/// No queue yet (E2 is not built): nothing to drain.
pub struct NoQueue;

impl QueueDrain for NoQueue {
    fn capacity_freed<'a>(&'a self, gpu_type: &'a str, host_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            tracing::debug!(%gpu_type, host = %host_id, "capacity freed; no queue to drain");
        })
    }
}
