//! The materializer: writes the task rows the write-ahead log holds into `sluice_tasks`, in
//! rounds on a thread of its own, and removes the log records it has written (one transaction
//! each, fenced by the leader's epoch). A round runs once the oldest pending row has waited
//! `COALESCE`, or sooner when much is pending, so a task submitted, claimed and completed
//! within one is written once instead of three times. The replay writes what the log still
//! holds after a crash, a takeover or a failed commit, before the tables are read.

use super::overlay::{Generation, Overlay};
use super::wal::{self, Row};
use super::{Leadership, corrupt, fail_with, fenced_call_error, int8, run_on};
use crate::backend;
use sluice_model::TaskId;
use sluice_store::StoreError;
use sqlx::PgPool;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a pending row may wait for others to join its round.
const COALESCE: Duration = Duration::from_millis(500);
/// A round starts at once when this many tasks are pending, or this many bytes.
const ROUND_TASKS: usize = 16_384;
const ROUND_BYTES: usize = 8 << 20;
/// Commits wait for a round to make room past these: the bound on the overlay's memory, and on
/// what a new leader must replay before it serves (about a second's work at full load).
const MAX_PENDING_TASKS: usize = 100_000;
const MAX_PENDING_BYTES: usize = 32 << 20;
/// How long a commit waits for room before it fails.
const BEHIND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a failed round waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(250);
/// Log records a replay reads in one query, and the bytes of rows it writes in one call.
const REPLAY_RECORDS_A_READ: i64 = 64;
const REPLAY_BYTES_A_CALL: usize = 16 << 20;

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the store, its readers and the materializer thread share.
#[derive(Default)]
pub(super) struct WriteBehind {
    pub overlay: Mutex<Overlay>,
    /// Wakes the materializer: rows arrived, room is wanted, or the store is closing.
    wake: Condvar,
    /// Wakes commits waiting for room.
    settled: Condvar,
    /// Held by a round, a replay and a retention pass, so none of them runs beside another.
    pub rounds: Mutex<()>,
    stop: AtomicBool,
    /// A commit failed, and may or may not have reached the log: nothing more is committed,
    /// and no round runs, until a replay has read the log back (`Store::recover`).
    pub needs_replay: AtomicBool,
}

impl WriteBehind {
    /// Takes in a committed record's rows and wakes the materializer when a round is due.
    pub fn absorb(&self, wal_id: i64, rows: Vec<(TaskId, Row)>) {
        let mut overlay = lock(&self.overlay);
        let was_idle = overlay.pending_since.is_none();
        overlay.absorb(wal_id, rows);
        if was_idle || overlay.current_len() >= ROUND_TASKS || overlay.byte_count() >= ROUND_BYTES {
            self.wake.notify_one();
        }
    }

    /// Waits until the overlay is under its bounds, for `BEHIND_TIMEOUT` at most.
    pub fn wait_for_room(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        let mut overlay = lock(&self.overlay);
        while overlay.task_count() >= MAX_PENDING_TASKS || overlay.byte_count() >= MAX_PENDING_BYTES
        {
            if started.elapsed() >= BEHIND_TIMEOUT {
                return Err(StoreError::Io(std::io::Error::other(
                    "task rows are not being written into PostgreSQL: the write-ahead log is full",
                )));
            }
            self.wake.notify_one();
            overlay = self
                .settled
                .wait_timeout(overlay, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// Tells the thread to make its last round and stop.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _overlay = lock(&self.overlay);
        self.wake.notify_all();
    }
}

/// The task rows of a round (or a replay's call) as the arrays `sluice_apply` takes: the rows
/// the table does not have yet (with their payloads), and the rest.
#[derive(Default)]
struct Columns {
    ids: Vec<Vec<u8>>,
    states: Vec<i16>,
    records: Vec<Vec<u8>>,
    queue_entries: Vec<Option<Vec<u8>>>,
    keys: Vec<Option<String>>,
    callbacks_pending: Vec<bool>,
    holding: Vec<bool>,
    updated_at_ms: Vec<i64>,
    payloads: Vec<Vec<u8>>,
}

impl Columns {
    fn push(&mut self, id: TaskId, row: &Row) {
        self.ids.push(id.to_bytes().to_vec());
        self.states.push(row.state);
        self.records.push(row.record.clone());
        self.queue_entries.push(row.queue_entry.clone());
        self.keys.push(row.key.clone());
        self.callbacks_pending.push(row.callback_pending);
        self.holding.push(row.holds_place);
        self.updated_at_ms.push(row.updated_at_ms);
        if let Some(payload) = &row.payload {
            self.payloads.push(payload.clone());
        }
    }
}

/// Writes `generation`'s rows and removes the log records up to its `through_wal_id`.
pub(super) async fn apply(
    pool: &PgPool,
    epoch: u64,
    generation: &Generation,
) -> Result<(), StoreError> {
    let (mut inserts, mut updates) = (Columns::default(), Columns::default());
    // In id order: neighbouring rows of the table and its index are written one after another.
    let mut rows: Vec<(&TaskId, &Row)> = generation.rows.iter().collect();
    rows.sort_unstable_by_key(|(id, _)| **id);
    for (id, row) in rows {
        match row.payload {
            Some(_) => inserts.push(*id, row),
            None => updates.push(*id, row),
        }
    }
    sqlx::query(
        "SELECT sluice_apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
         $15, $16, $17, $18)",
    )
    .bind(int8(epoch))
    .bind(generation.through_wal_id)
    .bind(&inserts.ids)
    .bind(&inserts.states)
    .bind(&inserts.records)
    .bind(&inserts.payloads)
    .bind(&inserts.queue_entries)
    .bind(&inserts.keys)
    .bind(&inserts.callbacks_pending)
    .bind(&inserts.holding)
    .bind(&inserts.updated_at_ms)
    .bind(&updates.ids)
    .bind(&updates.states)
    .bind(&updates.records)
    .bind(&updates.queue_entries)
    .bind(&updates.callbacks_pending)
    .bind(&updates.holding)
    .bind(&updates.updated_at_ms)
    .execute(pool)
    .await
    .map_err(fenced_call_error)?;
    Ok(())
}

/// What the materializer's rounds need of the store.
#[derive(Clone)]
pub(super) struct Materializer {
    pub pending: Arc<WriteBehind>,
    pub pool: PgPool,
    pub handle: tokio::runtime::Handle,
    pub leadership: Arc<Leadership>,
    pub failure: Arc<Mutex<Option<String>>>,
}

impl Materializer {
    fn epoch(&self) -> Result<u64, StoreError> {
        match self.leadership.epoch() {
            0 => Err(StoreError::Failed(
                "this replica does not hold the leader lease".into(),
            )),
            epoch => Ok(epoch),
        }
    }

    /// Writes one generation of pending rows (the one a failed round left, or everything
    /// pending). Returns how many rows it wrote.
    pub fn round(&self) -> Result<usize, StoreError> {
        let _round = lock(&self.pending.rounds);
        self.round_held()
    }

    fn round_held(&self) -> Result<usize, StoreError> {
        if self.pending.needs_replay.load(Ordering::Acquire) {
            return Ok(0);
        }
        let Some(generation) = lock(&self.pending.overlay).take_round() else {
            return Ok(0);
        };
        let epoch = self.epoch()?;
        let pool = self.pool.clone();
        let writing = generation.clone();
        run_on(
            &self.handle,
            async move { apply(&pool, epoch, &writing).await },
        )?;
        let written = generation.rows.len();
        lock(&self.pending.overlay).settle(&generation);
        self.pending.settled.notify_all();
        // The generation is freed here, with the lock let go.
        drop(generation);
        Ok(written)
    }

    /// Writes everything pending now: at most two rounds (a failed one's, then the rest).
    pub fn flush(&self) -> Result<(), StoreError> {
        let _round = lock(&self.pending.rounds);
        for _ in 0..2 {
            if lock(&self.pending.overlay).is_empty() {
                break;
            }
            self.round_held()?;
        }
        Ok(())
    }

    /// Writes every record the log holds into the tables, oldest first, and removes them; then
    /// forgets the overlay, whose rows are all in the tables now. Run before the tables are
    /// read at start, at a takeover and after a failed commit: the log is the truth about
    /// what was committed, whatever this process heard back.
    pub fn replay(&self) -> Result<usize, StoreError> {
        let _round = lock(&self.pending.rounds);
        let pool = self.pool.clone();
        let mut replayed = 0;
        let mut after_id = 0i64;
        loop {
            let read_pool = pool.clone();
            let records: Vec<(i64, Vec<u8>)> = run_on(&self.handle, async move {
                sqlx::query_as("SELECT id, rows FROM sluice_wal WHERE id > $1 ORDER BY id LIMIT $2")
                    .bind(after_id)
                    .bind(REPLAY_RECORDS_A_READ)
                    .fetch_all(&read_pool)
                    .await
                    .map_err(backend)
            })?;
            if records.is_empty() {
                break;
            }
            let mut generation = Generation::default();
            for (id, bytes) in &records {
                if *id <= after_id {
                    return Err(corrupt("write-ahead log", "records out of order"));
                }
                generation.absorb(*id, wal::decode(bytes)?);
                after_id = *id;
                replayed += 1;
                if generation.bytes >= REPLAY_BYTES_A_CALL {
                    self.apply_replayed(std::mem::take(&mut generation))?;
                }
            }
            if generation.through_wal_id > 0 {
                self.apply_replayed(generation)?;
            }
        }
        lock(&self.pending.overlay).clear();
        self.pending.needs_replay.store(false, Ordering::Release);
        self.pending.settled.notify_all();
        if replayed > 0 {
            tracing::info!(
                records = replayed,
                "wrote the write-ahead log's task rows into the tables"
            );
        }
        Ok(replayed)
    }

    fn apply_replayed(&self, generation: Generation) -> Result<(), StoreError> {
        let through = generation.through_wal_id;
        let epoch = self.epoch()?;
        let pool = self.pool.clone();
        run_on(&self.handle, async move {
            apply(&pool, epoch, &generation).await
        })?;
        // The next generation starts past what this call removed.
        debug_assert!(through > 0);
        Ok(())
    }

    /// The thread: rounds until told to stop, then writes what is left.
    pub fn run(self) {
        loop {
            let stopping = self.wait_for_work();
            if lock(&self.failure).is_some() {
                // The store stopped: what is pending stays in the log, for the next leader.
                return;
            }
            let written = if stopping {
                self.flush().map(|()| 0)
            } else {
                self.round()
            };
            match written {
                Ok(_) => {}
                Err(StoreError::Failed(reason)) => {
                    fail_with(&self.failure, reason);
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, "writing task rows into PostgreSQL failed; they stay in the write-ahead log and the round is tried again");
                    if !stopping {
                        std::thread::sleep(RETRY_AFTER);
                    }
                }
            }
            if stopping {
                return;
            }
        }
    }

    /// Blocks until a round is due; true when the store is closing. None is due while a replay
    /// is awaited: the rows held may not be what the log holds.
    fn wait_for_work(&self) -> bool {
        let pending = &self.pending;
        let mut overlay = lock(&pending.overlay);
        loop {
            if pending.stop.load(Ordering::Acquire) {
                return true;
            }
            let waited = overlay.pending_since.map(|since| since.elapsed());
            if !pending.needs_replay.load(Ordering::Acquire) {
                let due = overlay.round_due()
                    || waited.is_some_and(|waited| waited >= COALESCE)
                    || overlay.current_len() >= ROUND_TASKS
                    || overlay.byte_count() >= ROUND_BYTES;
                if due {
                    return false;
                }
            }
            let timeout = waited.map_or(Duration::from_secs(1), |waited| {
                COALESCE
                    .saturating_sub(waited)
                    .max(Duration::from_millis(10))
            });
            overlay = pending
                .wake
                .wait_timeout(overlay, timeout)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
