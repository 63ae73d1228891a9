//! Retention: removes ended tasks older than the cutoff from sled, with their payloads, keys and
//! index entries, and the event and worker log entries from before it.
//!
//! It runs on its own thread in short passes. Each pass holds the materializer's round lock, so
//! no round writes in place meanwhile, and skips any task the overlay still holds a write for
//! (it is written in place later, and removed by a later pass). The writer never waits on it:
//! commits take only the overlay's lock, which a pass takes for a lookup at a time.

use super::keys;
use super::shared::Shared;
use super::util::lock;
use crate::sled_error;
use sluice_model::{Event, State, TaskId, WorkerEvent};
use sluice_store::{Compacted, StoreError};

/// Log entries a pass looks at, at most, beside its tasks.
const MAX_LOG_ENTRIES: usize = 1_024;
/// sled writes a tombstone for each removal: a pass needs a little room too.
const PASS_BYTES: u64 = 4 << 20;

const ENDED: [State; 5] = [
    State::Completed,
    State::Failed,
    State::Dead,
    State::Cancelled,
    State::TimedOut,
];

pub(super) fn compact(
    shared: &Shared,
    cutoff_ms: u64,
    max_tasks: usize,
) -> Result<Compacted, StoreError> {
    shared.refuse_if_failed()?;
    let mut compacted = Compacted::default();
    if !shared.space.room_for_sled(PASS_BYTES)? {
        return Ok(compacted);
    }
    let _round = lock(&shared.rounds);
    // Ids start with their creation time: a task created after the cutoff ended after it too.
    let id_bound = TaskId::from_u128(u128::from(cutoff_ms) << 80);
    for state in ENDED {
        let range = keys::state(state, TaskId::MIN)..keys::state(state, id_bound);
        for (examined, entry) in shared.tree.range(range).enumerate() {
            // Only removals ask for another pass at once: entries kept for now (ended after the
            // cutoff though created before it) are looked at again at the next wake.
            if compacted.tasks >= max_tasks {
                compacted.more = true;
                break;
            }
            if examined >= max_tasks.saturating_mul(4) {
                break;
            }
            let (key, _) = entry.map_err(sled_error)?;
            let Some(id) = keys::id_at(&key, 2) else {
                continue;
            };
            if remove_task(shared, state, id, cutoff_ms)? {
                compacted.tasks += 1;
                compacted.tasks_by_state[usize::from(state.code())] += 1;
            }
        }
    }
    compacted.event_blocks = remove_blocks(shared, cutoff_ms)?;
    compacted.worker_events = remove_worker_events(shared, cutoff_ms)?;
    // Removals are made durable like a round's writes, so a crash does not bring them back.
    if compacted.tasks + compacted.event_blocks + compacted.worker_events > 0 {
        shared.sync_sled()?;
    }
    compacted.more |=
        compacted.event_blocks >= MAX_LOG_ENTRIES || compacted.worker_events >= MAX_LOG_ENTRIES;
    Ok(compacted)
}

/// Removes task `id` if it is still as the index says and old enough; whether it did.
fn remove_task(
    shared: &Shared,
    state: State,
    id: TaskId,
    cutoff_ms: u64,
) -> Result<bool, StoreError> {
    if lock(&shared.overlay).task(&id).is_some() {
        return Ok(false);
    }
    let tree = &shared.tree;
    let Some(bytes) = tree.get(keys::task(id)).map_err(sled_error)? else {
        // An index entry without its record: only the entry is left to remove.
        tree.remove(keys::state(state, id)).map_err(sled_error)?;
        return Ok(false);
    };
    let task = Shared::decode_task(&bytes)?;
    let holding = task
        .lease
        .as_ref()
        .is_some_and(|l| l.holds_place_after_end());
    if task.state != state || task.updated_at_ms >= cutoff_ms || task.callback_pending() || holding
    {
        return Ok(false);
    }
    if let Some(key) = &task.key {
        let names_this = tree
            .get(keys::idempotency(key))
            .map_err(sled_error)?
            .is_some_and(|record| keys::id_at(&record, 0) == Some(id));
        if names_this {
            tree.remove(keys::idempotency(key)).map_err(sled_error)?;
        }
    }
    tree.remove(keys::payload(id)).map_err(sled_error)?;
    tree.remove(keys::callback(id)).map_err(sled_error)?;
    tree.remove(keys::state(state, id)).map_err(sled_error)?;
    tree.remove(keys::task(id)).map_err(sled_error)?;
    Ok(true)
}

/// Removes the oldest entries under `prefix` whose time (`last_at_ms` of the decoded entry:
/// for a block, its last event's) is before the cutoff, always keeping the newest entry.
fn remove_log_prefix<T>(
    shared: &Shared,
    prefix: u8,
    decode: impl Fn(&[u8]) -> Result<T, StoreError>,
    cutoff_ms: u64,
    last_at_ms: impl Fn(&T) -> Option<u64>,
) -> Result<usize, StoreError> {
    let tree = &shared.tree;
    let newest = match tree.scan_prefix([prefix]).next_back() {
        Some(entry) => entry.map_err(sled_error)?.0,
        None => return Ok(0),
    };
    let mut removed = 0;
    for entry in tree.scan_prefix([prefix]).take(MAX_LOG_ENTRIES) {
        let (key, bytes) = entry.map_err(sled_error)?;
        if key == newest {
            break;
        }
        let decoded = decode(&bytes)?;
        if last_at_ms(&decoded).is_some_and(|at_ms| at_ms >= cutoff_ms) {
            break;
        }
        tree.remove(key).map_err(sled_error)?;
        removed += 1;
    }
    Ok(removed)
}

fn remove_blocks(shared: &Shared, cutoff_ms: u64) -> Result<usize, StoreError> {
    remove_log_prefix(
        shared,
        keys::BLOCK,
        sluice_store::record::event::decode_block,
        cutoff_ms,
        |block: &Vec<Event>| block.last().map(|event| event.at_ms),
    )
}

fn remove_worker_events(shared: &Shared, cutoff_ms: u64) -> Result<usize, StoreError> {
    remove_log_prefix(
        shared,
        keys::WORKER_EVENT,
        |bytes: &[u8]| {
            serde_json::from_slice(bytes).map_err(|e| super::util::corrupt("worker log", e))
        },
        cutoff_ms,
        |event: &WorkerEvent| Some(event.at_ms),
    )
}

/// The `seq` of the oldest event still held: that of the first block in sled, else of the
/// first block the overlay holds, else 1.
pub(super) fn first_event_seq(shared: &Shared) -> Result<u64, StoreError> {
    if let Some(entry) = shared.tree.scan_prefix([keys::BLOCK]).next() {
        let (key, _) = entry.map_err(sled_error)?;
        return keys::seq_at(&key, 1).ok_or_else(|| super::util::corrupt("event log", "short key"));
    }
    let overlay = lock(&shared.overlay);
    let first = overlay.blocks_after(0).next().cloned();
    drop(overlay);
    match first {
        Some(bytes) => {
            let block = sluice_store::record::event::decode_block(&bytes)?;
            Ok(block.first().map_or(1, |e| e.seq))
        }
        None => Ok(1),
    }
}
