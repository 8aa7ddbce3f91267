//! Group commit for the heartbeat (issue #41, 2): beats that arrive while earlier ones are
//! being written are written together, in one statement, and each caller is answered only
//! once the statement holding its row has returned (committed). There is no timer: under
//! light load a beat is written alone at once; under load a batch is what queued during the
//! write before it — the window is one write's time, and a batch is at most [`MAX_BATCH`]
//! beats, with at most `slots` batches in flight.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, oneshot};

use crate::{DbError, Json, Pool, Result, Store};

/// The most beats one statement writes.
const MAX_BATCH: usize = 256;

/// One beat as host_status keeps it.
#[derive(Debug)]
pub(crate) struct BeatRow {
    pub token_hash: String,
    pub seen_at: DateTime<Utc>,
    pub agent_version: String,
    pub lxd: &'static str,
    pub relay: &'static str,
    pub tunnel: &'static str,
    pub gpu: &'static str,
    pub storage: &'static str,
    pub instances: i32,
    pub details: byo_wire::vm::BeatDetails,
}

/// The one statement a beat writes: the token's host (not retired) gets its host_status row
/// upserted; the answer says whether the host holds a live row, so a beat from an idle host
/// with nothing to list needs no second round trip to reconcile.
const ONE: &str = "insert into host_status
       (host_id, seen_at, agent_version, lxd, relay, tunnel, gpu, storage, instances, details)
     select id, $2, $3, $4, $5, $6, $7, $8, $9, $10
     from hosts where token_hash = $1 and retired_at is null
     on conflict (host_id) do update set
       seen_at = excluded.seen_at, agent_version = excluded.agent_version,
       lxd = excluded.lxd, relay = excluded.relay, tunnel = excluded.tunnel,
       gpu = excluded.gpu, storage = excluded.storage, instances = excluded.instances,
       details = excluded.details
     returning host_id, exists (select 1 from vms v where v.host_id = host_status.host_id
                                 and v.deleted_at is null and v.creation_failed_at is null)";

/// [`ONE`] with `row` bound.
macro_rules! one {
    ($row:expr) => {
        sqlx::query_as::<_, (String, bool)>(ONE)
            .bind(&$row.token_hash)
            .bind($row.seen_at)
            .bind(&$row.agent_version)
            .bind($row.lxd)
            .bind($row.relay)
            .bind($row.tunnel)
            .bind($row.gpu)
            .bind($row.storage)
            .bind($row.instances)
            .bind(Json(&$row.details))
    };
}

impl BeatRow {
    pub(crate) fn of(
        token_hash: &byo_core::tokens::TokenHash,
        beat: &byo_wire::vm::Heartbeat,
        now: DateTime<Utc>,
    ) -> Self {
        BeatRow {
            token_hash: token_hash.as_str().to_owned(),
            seen_at: now,
            agent_version: beat.agent_version.clone(),
            lxd: beat.lxd.as_str(),
            relay: beat.relay.as_str(),
            tunnel: beat.tunnel.as_str(),
            gpu: beat.gpu.as_str(),
            storage: beat.storage.as_str(),
            instances: i32::try_from(beat.instances).unwrap_or(i32::MAX),
            details: beat.details.clone(),
        }
    }
}

/// The host's id and whether it holds a live row; `None`: no host holds the token.
type Written = Option<(String, bool)>;

struct Pending {
    row: Arc<BeatRow>,
    /// `Err`: the batch failed; the caller writes its beat alone and hears why.
    reply: oneshot::Sender<std::result::Result<Written, ()>>,
}

pub(crate) struct Beats {
    queue: std::sync::Mutex<Vec<Pending>>,
    slots: Arc<Semaphore>,
    /// Writes made (a batch or a beat alone): what tells a test that beats were written
    /// together, since a batch answers exactly as its beats alone would.
    writes: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Beats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Beats")
            .field("free_slots", &self.slots.available_permits())
            .finish_non_exhaustive()
    }
}

impl Beats {
    /// `slots` batches in flight at once: PostgreSQL writes several on its pool's
    /// connections; SQLite has one writer.
    pub(crate) fn new(slots: usize) -> Self {
        Beats {
            queue: Default::default(),
            slots: Arc::new(Semaphore::new(slots)),
            writes: Default::default(),
        }
    }

    /// The oldest queued beats, at most a batch.
    fn take(&self) -> Vec<Pending> {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let n = queue.len().min(MAX_BATCH);
        queue.drain(..n).collect()
    }
}

impl Store {
    /// Queue `row` and wait for the statement that writes it. Writers are tasks of their
    /// own, at most `slots` of them: one that finds beats queued after a write writes them
    /// next, so no caller hands a slot to another, and a caller that goes away takes no
    /// one else's answer with it. A batch that fails is written again beat by beat by each of
    /// its callers, so a beat the database refuses fails only its own caller.
    pub(crate) async fn beat_in_batch(&self, row: BeatRow) -> Result<Written> {
        let row = Arc::new(row);
        let (reply, answer) = oneshot::channel();
        self.beats
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Pending {
                row: row.clone(),
                reply,
            });
        // Queued before the slot is asked for: a writer that still holds every slot looks at
        // the queue again after it lets its slot go, and finds this beat.
        if let Ok(slot) = self.beats.slots.clone().try_acquire_owned() {
            let store = self.clone();
            tokio::spawn(async move { store.write_queued(slot).await });
        }
        self.answered(answer.await.ok(), &row).await
    }

    /// A writer: batches of what is queued until nothing is, then its slot let go — and the
    /// queue looked at once more, since a beat queued while the slot was held found no slot.
    async fn write_queued(&self, mut slot: tokio::sync::OwnedSemaphorePermit) {
        loop {
            loop {
                let batch = self.beats.take();
                if batch.is_empty() {
                    break;
                }
                self.write_batch(batch).await;
            }
            drop(slot);
            let queued = !self
                .beats
                .queue
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_empty();
            match queued {
                true => match self.beats.slots.clone().try_acquire_owned() {
                    Ok(again) => slot = again,
                    // Another writer took the slot, and the beats with it.
                    Err(_) => return,
                },
                false => return,
            }
        }
    }

    fn count_heartbeat_write(&self) {
        self.beats
            .writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many heartbeat writes this store has made, each a batch or a beat alone.
    pub fn heartbeat_writes(&self) -> u64 {
        self.beats.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What the batch said, or — the batch failed, or its task went away — the beat
    /// written alone.
    async fn answered(
        &self,
        got: Option<std::result::Result<Written, ()>>,
        row: &BeatRow,
    ) -> Result<Written> {
        match got {
            Some(Ok(written)) => Ok(written),
            _ => self.write_alone(row).await,
        }
    }

    async fn write_batch(&self, batch: Vec<Pending>) {
        // A host's beats in one batch are written once, its newest (the upsert may not touch
        // a row twice in one statement); each of them hears the answer.
        let mut newest: HashMap<&str, &BeatRow> = HashMap::new();
        for p in &batch {
            newest.insert(&p.row.token_hash, &p.row);
        }
        let rows: Vec<&BeatRow> = newest.into_values().collect();
        let written = match rows.as_slice() {
            [one] => self.write_alone(one).await.map(|w| {
                w.into_iter()
                    .map(|w| (one.token_hash.clone(), w))
                    .collect::<HashMap<_, _>>()
            }),
            _ => self.write_many(&rows).await,
        };
        match written {
            Ok(by_token) => {
                for p in batch {
                    let w = by_token.get(&p.row.token_hash).cloned();
                    let _ = p.reply.send(Ok(w));
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, beats = batch.len(), "a batch of heartbeats failed; each is written alone");
                for p in batch {
                    let _ = p.reply.send(Err(()));
                }
            }
        }
    }

    /// The beat alone, in its one statement: the database's own limit for a beat, which the
    /// bench reads the rest against.
    pub(crate) async fn write_alone(&self, row: &BeatRow) -> Result<Written> {
        self.count_heartbeat_write();
        let _turn = self.write_turn().await;
        on_pool!(self, |p| one!(row).fetch_optional(p).await).map_err(Into::into)
    }

    /// Several hosts' beats, one each: on PostgreSQL one statement over arrays; on SQLite
    /// (one writer, no arrays) one transaction of the single statement, committed once.
    async fn write_many(&self, rows: &[&BeatRow]) -> Result<HashMap<String, (String, bool)>> {
        self.count_heartbeat_write();
        match &self.pool {
            Pool::Postgres(p) => {
                let col = |f: fn(&BeatRow) -> String| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
                let found: Vec<(String, String, bool)> = sqlx::query_as(
                    "insert into host_status
                       (host_id, seen_at, agent_version, lxd, relay, tunnel, gpu, storage,
                        instances, details)
                     select id, seen_at, agent_version, lxd, relay, tunnel, gpu, storage,
                            instances, details::jsonb
                     from (select (select h.id from hosts h
                                   where h.token_hash = u.token_hash and h.retired_at is null)
                                  as id, u.*
                           from unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[],
                                       $5::text[], $6::text[], $7::text[], $8::text[],
                                       $9::int[], $10::text[])
                                as u(token_hash, seen_at, agent_version, lxd, relay, tunnel,
                                     gpu, storage, instances, details)) b
                     -- Each token looked up by its index, whatever the fleet's size.
                     where id is not null
                     on conflict (host_id) do update set
                       seen_at = excluded.seen_at, agent_version = excluded.agent_version,
                       lxd = excluded.lxd, relay = excluded.relay, tunnel = excluded.tunnel,
                       gpu = excluded.gpu, storage = excluded.storage,
                       instances = excluded.instances, details = excluded.details
                     returning (select token_hash from hosts where id = host_status.host_id),
                               host_id,
                               exists (select 1 from vms v where v.host_id = host_status.host_id
                                         and v.deleted_at is null and v.creation_failed_at is null)",
                )
                .bind(col(|r| r.token_hash.clone()))
                .bind(rows.iter().map(|r| r.seen_at).collect::<Vec<_>>())
                .bind(col(|r| r.agent_version.clone()))
                .bind(col(|r| r.lxd.to_owned()))
                .bind(col(|r| r.relay.to_owned()))
                .bind(col(|r| r.tunnel.to_owned()))
                .bind(col(|r| r.gpu.to_owned()))
                .bind(col(|r| r.storage.to_owned()))
                .bind(rows.iter().map(|r| r.instances).collect::<Vec<_>>())
                .bind(
                    rows.iter()
                        .map(|r| serde_json::to_string(&r.details))
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(|e| DbError::Config(format!("a beat's details: {e}")))?,
                )
                .fetch_all(p)
                .await?;
                Ok(found
                    .into_iter()
                    .map(|(token, host, live)| (token, (host, live)))
                    .collect())
            }
            Pool::Sqlite(p) => {
                let _turn = self.write_turn().await;
                let mut tx = p.begin().await?;
                let mut found = HashMap::new();
                for row in rows {
                    if let Some(w) = one!(row).fetch_optional(&mut *tx).await? {
                        found.insert(row.token_hash.clone(), w);
                    }
                }
                tx.commit().await?;
                Ok(found)
            }
        }
    }
}
