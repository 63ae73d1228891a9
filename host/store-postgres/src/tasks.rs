//! The engine's records in PostgreSQL: tasks, idempotency keys, the event and worker logs, the
//! start-up read and retention (the `Store` trait).

use super::events::{self, Block};
use super::leader::check_epoch;
use super::materializer::lock;
use super::wal::{self, Row};
use super::{PgStore, corrupt, fenced_call_error, int8, uint8};
use crate::backend;
use sluice_model::{
    Change, Event, KeyRecord, QueueEntry, Recovery, State, Task, TaskId, TaskIdMap, WorkerEvent,
};
use sluice_store::{Compacted, ListPage, ListQuery, PreparedCommit, Store, StoreError};
use sqlx::Row as _;
use std::collections::HashMap;
use std::sync::atomic::Ordering;

/// Worker log entries one retention pass removes at most, beside its tasks.
const MAX_LOG_ENTRIES: i64 = 1_024;

/// A queued task's row as recovery reads it: id, queue entry, record.
type QueuedRow = (Vec<u8>, Option<Vec<u8>>, Vec<u8>);

fn id_bytes(id: TaskId) -> Vec<u8> {
    id.to_bytes().to_vec()
}

fn task_id(bytes: &[u8]) -> Result<TaskId, StoreError> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| corrupt("task id", format!("{} bytes", bytes.len())))?;
    Ok(TaskId::from_bytes(bytes))
}

fn key_record(task: &[u8], fingerprint: &[u8]) -> Result<KeyRecord, StoreError> {
    Ok(KeyRecord {
        task_id: task_id(task)?,
        fingerprint: fingerprint
            .try_into()
            .map_err(|_| corrupt("idempotency key", "short fingerprint"))?,
    })
}

/// A row's record: format 3 as this release writes it, or format 2 or the JSON of format 1 in
/// a row an older release wrote and no change has rewritten since (`sluice_store::record`).
fn decode_task(bytes: &[u8]) -> Result<Task, StoreError> {
    sluice_store::record::decode(bytes)
}

fn state_code(state: State) -> i16 {
    i16::from(state.code())
}

/// The `live` column (migration 0004) is `state < 7`: the ended states are the codes from 7.
#[cfg(test)]
#[test]
fn the_ended_states_are_the_codes_from_seven() {
    const FIRST_ENDED_CODE: u8 = 7;
    for state in State::ALL {
        assert_eq!(
            state.is_terminal(),
            state.code() >= FIRST_ENDED_CODE,
            "{state}"
        );
    }
}

fn state_of(code: i16) -> Result<State, StoreError> {
    u8::try_from(code)
        .ok()
        .and_then(State::from_code)
        .ok_or_else(|| corrupt("task", format!("unknown state code {code}")))
}

fn codes(states: impl Iterator<Item = State>) -> Vec<i16> {
    states.map(state_code).collect()
}

/// A task's row as `task` leaves it; `payload` for a task the change creates.
fn row_of(task: &Task, payload: Option<&[u8]>) -> Result<Row, StoreError> {
    Ok(Row {
        state: state_code(task.state),
        record: sluice_store::record::encode(task)?,
        // A queued task's row carries its queue entry, so queues are rebuilt at start from
        // those alone.
        queue_entry: (task.state == State::Queued).then(|| QueueEntry::of(task).encode()),
        key: task.key.clone(),
        callback_pending: task.callback_pending(),
        holds_place: task
            .lease
            .as_ref()
            .is_some_and(|lease| lease.holds_place_after_end()),
        updated_at_ms: int8(task.updated_at_ms),
        payload: payload.map(<[u8]>::to_vec),
    })
}

/// A commit as it is sent, built before any connection is taken: its task rows (kept for the
/// overlay once the commit is in) and their write-ahead record, keys, events and worker log.
struct PlannedCommit {
    rows: Vec<(TaskId, Row)>,
    wal_record: Option<Vec<u8>>,
    key_names: Vec<String>,
    key_tasks: Vec<Vec<u8>>,
    key_fingerprints: Vec<Vec<u8>>,
    events: Block,
    worker_seqs: Vec<i64>,
    worker_times: Vec<i64>,
    worker_bytes: Vec<Vec<u8>>,
}

fn plan(change: &Change) -> Result<PlannedCommit, StoreError> {
    // One row per task, as the change leaves it.
    let mut order: Vec<TaskId> = Vec::new();
    let mut latest: TaskIdMap<&Task> = TaskIdMap::default();
    for write in &change.writes {
        if latest.insert(write.task.id, &write.task).is_none() {
            order.push(write.task.id);
        }
    }
    let payloads: TaskIdMap<&[u8]> = change
        .new_tasks
        .iter()
        .map(|new| (new.id, new.payload_json.as_slice()))
        .collect();
    let mut rows = Vec::with_capacity(order.len());
    for id in order {
        let Some(task) = latest.get(&id) else {
            continue;
        };
        rows.push((id, row_of(task, payloads.get(&id).copied())?));
    }
    let mut planned = PlannedCommit {
        wal_record: None,
        key_names: Vec::new(),
        key_tasks: Vec::new(),
        key_fingerprints: Vec::new(),
        events: Block::of(&change.events)?,
        worker_seqs: Vec::new(),
        worker_times: Vec::new(),
        worker_bytes: Vec::new(),
        rows,
    };
    if !planned.rows.is_empty() {
        let bytes: usize = planned.rows.iter().map(|(_, row)| row.bytes()).sum();
        let mut record = Vec::with_capacity(bytes);
        wal::encode(planned.rows.iter().map(|(id, row)| (*id, row)), &mut record)?;
        planned.wal_record = Some(record);
    }
    for new in &change.new_tasks {
        if !latest.contains_key(&new.id) {
            return Err(corrupt(
                "commit",
                format!("new task {} comes without its record", new.id),
            ));
        }
        if let Some((key, record)) = &new.key {
            planned.key_names.push(key.clone());
            planned.key_tasks.push(id_bytes(record.task_id));
            planned.key_fingerprints.push(record.fingerprint.to_vec());
        }
    }
    for event in &change.worker_events {
        planned.worker_seqs.push(int8(event.seq));
        planned.worker_times.push(int8(event.at_ms));
        planned
            .worker_bytes
            .push(serde_json::to_vec(event).map_err(|e| corrupt("worker event", e))?);
    }
    Ok(planned)
}

/// Sends one planned commit through `sluice_log_commit` (migration 0007): the fencing check,
/// the write-ahead record, keys, events and worker log in one round trip, as one
/// asynchronously committed transaction. Returns the record's id (0 when it had no rows) and
/// the rows, for the overlay.
async fn write(
    pool: &sqlx::PgPool,
    epoch: u64,
    planned: PlannedCommit,
) -> Result<(i64, Vec<(TaskId, Row)>), StoreError> {
    let wal_id: i64 = sqlx::query_scalar(
        "SELECT sluice_log_commit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
    )
    .bind(int8(epoch))
    .bind(&planned.wal_record)
    .bind(&planned.key_names)
    .bind(&planned.key_tasks)
    .bind(&planned.key_fingerprints)
    .bind(planned.events.first_seq)
    .bind(planned.events.last_seq)
    .bind(planned.events.last_at_ms)
    .bind(&planned.events.offsets)
    .bind(&planned.events.events)
    .bind(&planned.worker_seqs)
    .bind(&planned.worker_times)
    .bind(&planned.worker_bytes)
    .fetch_one(pool)
    .await
    .map_err(fenced_call_error)?;
    Ok((wal_id, planned.rows))
}

impl PgStore {
    /// Commits `change`, from `planned` when it was encoded ahead (`prepare_commit`).
    fn commit_planned(
        &self,
        change: &Change,
        planned: Option<PlannedCommit>,
    ) -> Result<(), StoreError> {
        self.refuse_if_failed()?;
        if change.is_empty() {
            return Ok(());
        }
        if self.pending.needs_replay.load(Ordering::Acquire) {
            return Err(StoreError::Backend(
                "an earlier commit failed: the store must be read back (recovered) first".into(),
            ));
        }
        let epoch = self.epoch()?;
        let planned = match planned {
            Some(planned) => planned,
            None => plan(change)?,
        };
        self.pending.wait_for_room()?;
        let pool = self.engine_pool();
        // Durable at the next `sync`, whose own synchronous commit flushes the WAL past this
        // one.
        match self.block(async move { write(&pool, epoch, planned).await }) {
            Ok((wal_id, rows)) => {
                self.pending.absorb(wal_id, rows);
                Ok(())
            }
            Err(error) => {
                // Whether the record reached the log is not known: until the log is read back,
                // nothing more is committed on top of what this process believes.
                self.pending.needs_replay.store(true, Ordering::Release);
                if let StoreError::Failed(reason) = &error {
                    self.fail(reason.clone());
                }
                Err(error)
            }
        }
    }

    /// Writes every pending task row into the table now (tests, and before a clean stop).
    #[cfg(test)]
    pub(super) fn materialize(&self) -> Result<(), StoreError> {
        self.materializer().flush()
    }
}

impl Store for PgStore {
    fn commit(&self, change: &Change) -> Result<(), StoreError> {
        self.commit_planned(change, None)
    }

    fn prepare_commit(&self, change: &Change) -> Result<Option<PreparedCommit>, StoreError> {
        plan(change).map(|planned| Some(PreparedCommit::new(planned)))
    }

    fn commit_prepared(&self, change: &Change, prepared: PreparedCommit) -> Result<(), StoreError> {
        self.commit_planned(change, prepared.into_inner::<PlannedCommit>())
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.refuse_if_failed()?;
        let epoch = self.epoch()?;
        let pool = self.engine_pool();
        let synced = self.block(async move {
            let held: Option<i32> = sqlx::query_scalar(
                "UPDATE sluice_syncs SET synced_at = now() WHERE id = 1 AND EXISTS \
                 (SELECT 1 FROM sluice_leader WHERE id = 1 AND epoch = $1) RETURNING 1",
            )
            .bind(int8(epoch))
            .fetch_optional(&pool)
            .await
            .map_err(backend)?;
            match held {
                Some(_) => Ok(()),
                None => Err(StoreError::Failed(format!(
                    "deposed: another replica took the leader lease after epoch {epoch}"
                ))),
            }
        });
        // As in the embedded store, a sync that did not succeed leaves what is durable unknown:
        // the store stops, and a restart (or another replica) rebuilds from the database.
        if let Err(error) = &synced {
            self.fail(format!("syncing to PostgreSQL: {error}"));
        }
        synced
    }

    fn failed(&self) -> Option<String> {
        self.failure()
    }

    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        if let Some(record) = lock(&self.pending.overlay)
            .row(&id)
            .map(|row| row.record.clone())
        {
            return decode_task(&record).map(Some);
        }
        let pool = self.pool();
        let record: Option<Vec<u8>> = self.block(async move {
            sqlx::query_scalar("SELECT record FROM sluice_tasks WHERE id = $1")
                .bind(id_bytes(id))
                .fetch_optional(&pool)
                .await
                .map_err(backend)
        })?;
        record.map(|bytes| decode_task(&bytes)).transpose()
    }

    fn payload(&self, id: TaskId) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(payload) = lock(&self.pending.overlay).payload(&id) {
            return Ok(Some(payload.to_vec()));
        }
        let pool = self.pool();
        self.block(async move {
            sqlx::query_scalar("SELECT payload FROM sluice_tasks WHERE id = $1")
                .bind(id_bytes(id))
                .fetch_optional(&pool)
                .await
                .map_err(backend)
        })
    }

    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let pool = self.pool();
        let key = key.to_owned();
        let row: Option<(Vec<u8>, Vec<u8>)> = self.block(async move {
            sqlx::query_as("SELECT task_id, fingerprint FROM sluice_keys WHERE key = $1")
                .bind(key)
                .fetch_optional(&pool)
                .await
                .map_err(backend)
        })?;
        row.map(|(task, fingerprint)| key_record(&task, &fingerprint))
            .transpose()
    }

    fn payloads(&self, ids: &[TaskId]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut held: TaskIdMap<Vec<u8>> = TaskIdMap::default();
        {
            let overlay = lock(&self.pending.overlay);
            for id in ids {
                if let Some(payload) = overlay.payload(id) {
                    held.insert(*id, payload.to_vec());
                }
            }
        }
        if held.len() == ids.len() {
            return Ok(ids.iter().map(|id| held.remove(id)).collect());
        }
        let pool = self.pool();
        let wanted: Vec<Vec<u8>> = ids
            .iter()
            .filter(|id| !held.contains_key(id))
            .map(|&id| id_bytes(id))
            .collect();
        let rows: Vec<(Vec<u8>, Vec<u8>)> = self.block(async move {
            sqlx::query_as("SELECT id, payload FROM sluice_tasks WHERE id = ANY($1)")
                .bind(wanted)
                .fetch_all(&pool)
                .await
                .map_err(backend)
        })?;
        let mut found: HashMap<Vec<u8>, Vec<u8>> = rows.into_iter().collect();
        Ok(ids
            .iter()
            .map(|&id| {
                held.remove(&id)
                    .or_else(|| found.remove(id_bytes(id).as_slice()))
            })
            .collect())
    }

    fn keys(&self, keys: &[&str]) -> Result<HashMap<String, KeyRecord>, StoreError> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let pool = self.engine_pool();
        let wanted: Vec<String> = keys.iter().map(|&key| key.to_owned()).collect();
        let rows: Vec<(String, Vec<u8>, Vec<u8>)> = self.block(async move {
            // Through the function of migration 0008: an index probe a key at any table size.
            sqlx::query_as("SELECT key, task_id, fingerprint FROM sluice_read_keys($1)")
                .bind(wanted)
                .fetch_all(&pool)
                .await
                .map_err(backend)
        })?;
        rows.into_iter()
            .map(|(key, task, fingerprint)| Ok((key, key_record(&task, &fingerprint)?)))
            .collect()
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn events_of(
        &self,
        id: TaskId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<Event>>, StoreError> {
        let Some(task) = self.task(id)? else {
            return Ok(None);
        };
        // The task lists its own events; those retention removed are simply not found.
        let seqs: Vec<i64> = task
            .event_seqs
            .iter()
            .filter(|&&seq| seq > after_seq)
            .take(limit)
            .map(|&seq| int8(seq))
            .collect();
        if seqs.is_empty() {
            return Ok(Some(Vec::new()));
        }
        self.events_numbered(seqs).map(Some)
    }

    fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let filtered = query.kind.is_some() || query.device.is_some() || query.state.is_some();
        // Without a filter, the page is the first `limit` rows; with one, up to the scan
        // budget is examined, as in the embedded store.
        let rows_wanted = if filtered {
            query.scan_budget
        } else {
            query.limit.min(query.scan_budget)
        }
        .max(1);
        // The overlay is read before the table: a row a round moves into the table meanwhile
        // is then found in one or both, never in neither.
        let held = self.held_rows(query, rows_wanted.saturating_add(1));
        let after = query.after.map_or_else(Vec::new, id_bytes);
        let state = query.state.map(state_code);
        // A live state's tasks are found through the index of live tasks; an ended state's in
        // id order among all. Only the records of rows in the state asked for are read.
        let sql = if query.state.is_some_and(|s| !s.is_terminal()) {
            "SELECT id, CASE WHEN state = $1 THEN record END FROM sluice_tasks \
             WHERE live AND id > $2 ORDER BY id LIMIT $3"
        } else {
            "SELECT id, CASE WHEN $1::int2 IS NULL OR state = $1 THEN record END \
             FROM sluice_tasks WHERE id > $2 ORDER BY id LIMIT $3"
        };
        let pool = self.pool();
        let fetch = i64::try_from(rows_wanted.saturating_add(1)).unwrap_or(i64::MAX);
        let rows: Vec<(Vec<u8>, Option<Vec<u8>>)> = self.block(async move {
            sqlx::query_as(sql)
                .bind(state)
                .bind(after)
                .bind(fetch)
                .fetch_all(&pool)
                .await
                .map_err(backend)
        })?;
        let stored = rows
            .into_iter()
            .map(|(id, record)| Ok((task_id(&id)?, record)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        // When the table has more rows than were read, the overlay's rows past the last one
        // read belong to a later page; none is reached here: the loop below examines at most
        // `rows_wanted`, and the table gave one more than that, all before them in id order.
        let table_ends = stored.len() < rows_wanted.saturating_add(1);
        let mut merged = merge(stored, held).peekable();
        let mut page = ListPage::default();
        let mut examined = 0;
        while let Some((id, record)) = merged.next() {
            examined += 1;
            if let Some(record) = record {
                let task = decode_task(&record)?;
                let wanted = query.kind.as_ref().is_none_or(|k| *k == task.kind)
                    && query.device.as_ref().is_none_or(|d| *d == task.device);
                if wanted {
                    page.tasks.push(task);
                }
            }
            if page.tasks.len() >= query.limit || examined >= rows_wanted {
                if merged.peek().is_some() || !table_ends {
                    page.next_after = Some(id);
                }
                break;
            }
        }
        Ok(page)
    }

    fn events_after(&self, after_seq: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        self.events_since(after_seq, limit)
    }

    fn worker_events(&self, after_seq: u64, limit: usize) -> Result<Vec<WorkerEvent>, StoreError> {
        let pool = self.pool();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<Vec<u8>> = self.block(async move {
            sqlx::query_scalar(
                "SELECT event FROM sluice_worker_events WHERE seq > $1 ORDER BY seq LIMIT $2",
            )
            .bind(int8(after_seq))
            .bind(limit)
            .fetch_all(&pool)
            .await
            .map_err(backend)
        })?;
        rows.iter()
            .map(|bytes| serde_json::from_slice(bytes).map_err(|e| corrupt("worker log", e)))
            .collect()
    }

    fn recover(&self) -> Result<Recovery, StoreError> {
        // The rows the log still holds go into the table first: a leader's (this one's, or the
        // one before's) commits whose rows were not yet written when it failed or stopped.
        if self.is_leading() {
            self.materializer().replay()?;
        } else if self.wal_holds_records()? {
            return Err(StoreError::Failed(
                "the write-ahead log holds rows only the leader may write: take the lease first"
                    .into(),
            ));
        }
        let pool = self.pool();
        let terminal = codes(State::ALL.into_iter().filter(|s| s.is_terminal()));
        let queued = state_code(State::Queued);
        let (heads, counts, queued_rows, live_rows) = self.block(async move {
            let mut tx = pool.begin().await.map_err(backend)?;
            // One snapshot for all of it, so the counts agree with the rows.
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            let heads: (i64, i64, Option<Vec<u8>>) = sqlx::query_as(
                "SELECT (SELECT coalesce(max(last_seq), 0) FROM sluice_event_blocks), \
                 (SELECT coalesce(max(seq), 0) FROM sluice_worker_events), \
                 (SELECT id FROM sluice_tasks ORDER BY id DESC LIMIT 1)",
            )
            .fetch_one(&mut *tx)
            .await
            .map_err(backend)?;
            let counts: Vec<(i16, i64)> =
                sqlx::query_as("SELECT state, count(*) FROM sluice_tasks GROUP BY state")
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(backend)?;
            let queued_rows: Vec<QueuedRow> = sqlx::query_as(
                "SELECT id, queue_entry, record FROM sluice_tasks WHERE live AND state = $1 \
                 ORDER BY id",
            )
            .bind(queued)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
            let live_rows: Vec<Vec<u8>> = sqlx::query_scalar(
                "SELECT record FROM sluice_tasks WHERE live AND state <> $1 ORDER BY id",
            )
            .bind(queued)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
            let callbacks: Vec<Vec<u8>> = sqlx::query_scalar(
                "SELECT record FROM sluice_tasks WHERE callback_pending AND state = ANY($1) \
                 ORDER BY id",
            )
            .bind(&terminal)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            Ok((heads, counts, queued_rows, [live_rows, callbacks]))
        })?;
        let mut recovery = Recovery {
            last_event_seq: uint8(heads.0, "event log")?,
            last_worker_event_seq: uint8(heads.1, "worker log")?,
            last_task_id: heads.2.as_deref().map(task_id).transpose()?,
            ..Recovery::default()
        };
        for (code, count) in counts {
            recovery.tasks_by_state[usize::from(state_of(code)?.code())] =
                uint8(count, "task count")?;
        }
        for (id, entry, record) in queued_rows {
            let id = task_id(&id)?;
            // An entry of another layout: the record says the same, at more cost.
            match entry.and_then(|bytes| QueueEntry::decode(id, &bytes)) {
                Some(entry) => recovery.queued.push(entry),
                None => recovery.live.push(decode_task(&record)?),
            }
        }
        for record in live_rows.iter().flatten() {
            recovery.live.push(decode_task(record)?);
        }
        Ok(recovery)
    }

    fn first_event_seq(&self) -> Result<u64, StoreError> {
        self.first_event_seq_held()
    }

    fn compact(&self, cutoff_ms: u64, max_tasks: usize) -> Result<Compacted, StoreError> {
        self.refuse_if_failed()?;
        let epoch = self.epoch()?;
        let ended = codes(
            [
                State::Completed,
                State::Failed,
                State::Dead,
                State::Cancelled,
                State::TimedOut,
            ]
            .into_iter(),
        );
        // Ids start with their creation time: a task created after the cutoff ended after it.
        let id_bound = id_bytes(TaskId::from_u128(u128::from(cutoff_ms) << 80));
        let max = i64::try_from(max_tasks).unwrap_or(i64::MAX);
        let pool = self.pool();
        // No round writes meanwhile, and a task the overlay holds a newer row for is passed
        // over: the table's row is not the task as it is (a later pass removes it).
        let _round = lock(&self.pending.rounds);
        let pending = self.pending.clone();
        let (removed, event_blocks, worker_rows) = self.block(async move {
            let mut tx = pool.begin().await.map_err(backend)?;
            check_epoch(&mut tx, epoch).await?;
            let candidates: Vec<Vec<u8>> = sqlx::query_scalar(
                "SELECT id FROM sluice_tasks \
                 WHERE state = ANY($1) AND id < $2 AND updated_at_ms < $3 \
                 AND NOT callback_pending AND NOT holds_place ORDER BY id LIMIT $4",
            )
            .bind(&ended)
            .bind(&id_bound)
            .bind(int8(cutoff_ms))
            .bind(max)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
            let unheld: Vec<Vec<u8>> = {
                let overlay = lock(&pending.overlay);
                candidates
                    .into_iter()
                    .filter(|id| task_id(id).is_ok_and(|id| !overlay.contains(&id)))
                    .collect()
            };
            let removed: Vec<(i16, Option<String>, Vec<u8>)> = sqlx::query_as(
                "DELETE FROM sluice_tasks WHERE id = ANY($1) \
                 RETURNING state, idempotency_key, id",
            )
            .bind(&unheld)
            .fetch_all(&mut *tx)
            .await
            .map_err(backend)?;
            let (keys, key_tasks): (Vec<String>, Vec<Vec<u8>>) = removed
                .iter()
                .filter_map(|(_, key, id)| key.clone().map(|key| (key, id.clone())))
                .unzip();
            if !keys.is_empty() {
                // Only a key that still names the removed task goes with it.
                sqlx::query(
                    "DELETE FROM sluice_keys AS k USING UNNEST($1::text[], $2::bytea[]) \
                     AS u(key, task_id) WHERE k.key = u.key AND k.task_id = u.task_id",
                )
                .bind(&keys)
                .bind(&key_tasks)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            }
            let event_blocks = events::trim(&mut tx, cutoff_ms).await?;
            let worker_rows = trim_log(&mut tx, "sluice_worker_events", cutoff_ms).await?;
            tx.commit().await.map_err(backend)?;
            Ok((removed, event_blocks, worker_rows))
        })?;
        let mut compacted = Compacted {
            tasks: removed.len(),
            event_blocks,
            worker_events: worker_rows,
            ..Compacted::default()
        };
        for (code, _, _) in &removed {
            compacted.tasks_by_state[usize::from(state_of(*code)?.code())] += 1;
        }
        compacted.more = removed.len() >= max_tasks
            || event_blocks >= events::MAX_BLOCKS_A_PASS as usize
            || worker_rows >= MAX_LOG_ENTRIES as usize;
        Ok(compacted)
    }
}

impl PgStore {
    /// Whether the write-ahead log holds records not yet written into the tables.
    fn wal_holds_records(&self) -> Result<bool, StoreError> {
        let pool = self.pool();
        self.block(async move {
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sluice_wal)")
                .fetch_one(&pool)
                .await
                .map_err(backend)
        })
    }

    /// The first `count` of the overlay's tasks past `query.after`, in id order, each with its
    /// record when it is in the state asked for (and without, so the table's older row for it
    /// is passed over). A page examines at most `count - 1` rows and peeks at one more, so
    /// later ones are never needed; only the records kept are copied, whatever the overlay
    /// holds.
    fn held_rows(&self, query: &ListQuery, count: usize) -> Vec<(TaskId, Option<Vec<u8>>)> {
        let wanted_state = query.state.map(state_code);
        let overlay = lock(&self.pending.overlay);
        let mut held: Vec<(&TaskId, &wal::Row)> = overlay
            .rows()
            .filter(|(id, _)| query.after.is_none_or(|after| **id > after))
            .collect();
        if held.len() > count {
            held.select_nth_unstable_by_key(count, |(id, _)| **id);
            held.truncate(count);
        }
        held.sort_unstable_by_key(|(id, _)| **id);
        held.into_iter()
            .map(|(id, row)| {
                let wanted = wanted_state.is_none_or(|state| state == row.state);
                (*id, wanted.then(|| row.record.clone()))
            })
            .collect()
    }
}

/// The table's rows and the overlay's, both in id order, as one sequence in id order; where
/// both have a task, the overlay's row (the newer) stands for it.
fn merge(
    stored: Vec<(TaskId, Option<Vec<u8>>)>,
    held: Vec<(TaskId, Option<Vec<u8>>)>,
) -> impl Iterator<Item = (TaskId, Option<Vec<u8>>)> {
    let mut stored = stored.into_iter().peekable();
    let mut held = held.into_iter().peekable();
    std::iter::from_fn(move || {
        let from_held = match (held.peek(), stored.peek()) {
            (None, None) => return None,
            (Some((h, _)), Some((s, _))) => h <= s,
            (Some(_), None) => true,
            (None, Some(_)) => false,
        };
        if from_held {
            let next = held.next();
            if let (Some((h, _)), Some((s, _))) = (&next, stored.peek())
                && h == s
            {
                stored.next();
            }
            next
        } else {
            stored.next()
        }
    })
}

/// Removes the oldest entries of a log from before the cutoff (at most `MAX_LOG_ENTRIES`),
/// stopping at the first one after it and always keeping the newest.
async fn trim_log(
    tx: &mut sqlx::PgConnection,
    table: &'static str,
    cutoff_ms: u64,
) -> Result<usize, StoreError> {
    let oldest = sqlx::query(&format!(
        "SELECT seq, at_ms FROM {table} ORDER BY seq LIMIT {MAX_LOG_ENTRIES}"
    ))
    .fetch_all(&mut *tx)
    .await
    .map_err(backend)?;
    let newest: Option<i64> = sqlx::query_scalar(&format!("SELECT max(seq) FROM {table}"))
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
    let mut last_removed = None;
    let mut count = 0;
    for row in &oldest {
        let (seq, at_ms): (i64, i64) = (
            row.try_get(0).map_err(backend)?,
            row.try_get(1).map_err(backend)?,
        );
        if Some(seq) == newest || at_ms >= int8(cutoff_ms) {
            break;
        }
        last_removed = Some(seq);
        count += 1;
    }
    if let Some(last) = last_removed {
        sqlx::query(&format!("DELETE FROM {table} WHERE seq <= $1"))
            .bind(last)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
    }
    Ok(count)
}
