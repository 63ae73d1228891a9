//! The materializer: writes what the overlay holds into sled (task records, state and callback
//! index entries, idempotency keys, payloads, event blocks, worker log entries) and the floor,
//! syncs sled, and then lets go of the write-ahead segments that covered it. Its own thread runs a round once enough is pending or the oldest write has
//! waited `COALESCE`, so a task that is submitted, claimed and completed within one round is
//! written in place once, not three times.

use super::keys;
use super::shared::Shared;
use super::util::lock;
use super::wal::{CallbackMark, states_in};
use crate::sled_error;
use sluice_store::StoreError;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a pending write may wait for others to join its round.
const COALESCE: Duration = Duration::from_millis(200);
/// A round starts at once when this many tasks and keys are pending.
pub const ROUND_TASKS: usize = 8_192;

/// Writes everything pending in place. Returns how many tasks and keys it wrote.
pub(super) fn round(shared: &Shared) -> Result<usize, StoreError> {
    // After a failed sync nothing more goes into sled: a later sync that succeeded could make
    // the floor durable over pages the failed one lost, and the log segments would go.
    shared.refuse_if_failed()?;
    let mut floor = lock(&shared.rounds);
    let round = lock(&shared.overlay).take_round();
    if round.through_commit <= *floor {
        return Ok(0);
    }
    let writes = &*round.writes;
    // Each kind in key order: sled then writes neighbouring keys one after another, rather
    // than a leaf here and a leaf there. (Blocks and worker events are in order already.)
    let mut tasks: Vec<_> = writes.tasks.iter().collect();
    tasks.sort_unstable_by_key(|(id, _)| **id);
    let mut idempotency: Vec<_> = writes.keys.iter().collect();
    idempotency.sort_unstable();
    let mut payloads: Vec<_> = writes.payloads.iter().collect();
    payloads.sort_unstable_by_key(|(id, _)| **id);
    // One key at a time: `apply_batch` would hold sled's global write lock for the whole batch,
    // stalling every reader (measured: claim p99 from 40 to 115 ms), and was no faster.
    let tree = &shared.tree;
    for (id, pending) in tasks {
        for stale in states_in(pending.stale_index).filter(|&s| s != pending.state) {
            tree.remove(keys::state(stale, *id)).map_err(sled_error)?;
        }
        tree.insert(
            keys::state(pending.state, *id),
            pending.index_value.as_slice(),
        )
        .map_err(sled_error)?;
        tree.insert(keys::task(*id), &pending.record[..])
            .map_err(sled_error)?;
        match pending.callback {
            CallbackMark::Set => {
                tree.insert(keys::callback(*id), &[][..])
                    .map_err(sled_error)?;
            }
            CallbackMark::Clear => {
                tree.remove(keys::callback(*id)).map_err(sled_error)?;
            }
            CallbackMark::Keep => {}
        }
    }
    for (key, record) in idempotency {
        tree.insert(keys::idempotency(key), &record[..])
            .map_err(sled_error)?;
    }
    for (id, payload) in payloads {
        tree.insert(keys::payload(*id), &payload[..])
            .map_err(sled_error)?;
    }
    for (seq, block) in &writes.blocks {
        tree.insert(keys::block(*seq), &block[..])
            .map_err(sled_error)?;
    }
    for (seq, event) in &writes.worker_events {
        tree.insert(keys::worker_event(*seq), &event[..])
            .map_err(sled_error)?;
    }
    // The floor names the last commit in sled; replay skips the commits under it, so the
    // segments holding them may go.
    tree.insert(keys::WAL_FLOOR, &round.through_commit.to_be_bytes()[..])
        .map_err(sled_error)?;
    shared.sync_sled()?;
    *floor = round.through_commit;
    let written = writes.len();
    {
        let mut overlay = lock(&shared.overlay);
        overlay.settle(&round);
        shared.settled.notify_all();
    }
    // The generation is freed here, with the lock let go.
    drop(round);
    shared.wal.release(*floor)?;
    Ok(written)
}

/// The materializer thread: rounds until told to stop, then one last round.
pub(super) fn run(shared: &Shared) {
    super::util::lower_priority();
    let mut waiting_for_space = false;
    loop {
        let stopping = wait_for_work(shared);
        if shared.failure().is_some() {
            // A sync failed: the pending rounds stay in the log, for the restart to replay.
            return;
        }
        // sled cannot survive ENOSPC: on a disk too full for the round, the pending writes
        // stay in the log and the overlay (which serve every read) until space is freed.
        let pending_bytes = lock(&shared.overlay).byte_count() as u64;
        match shared.space.room_for_sled(pending_bytes) {
            Ok(true) => waiting_for_space = false,
            Ok(false) | Err(_) if !stopping => {
                if !waiting_for_space {
                    tracing::warn!(
                        pending_bytes,
                        "the disk is too full to write pending tasks into sled; they stay in the write-ahead log until space is freed"
                    );
                    waiting_for_space = true;
                }
                let overlay = lock(&shared.overlay);
                if !shared.stop.load(Ordering::Acquire) {
                    let _ = shared.wake.wait_timeout(overlay, Duration::from_secs(1));
                }
                continue;
            }
            Ok(false) | Err(_) => return,
        }
        if let Err(error) = round(shared) {
            tracing::error!(%error, "writing pending tasks into sled failed; they stay in the write-ahead log");
            // sled keeps its first I/O error for good: the open database is lost to this
            // process, as after a failed sync, and a restart replays the log.
            if matches!(error, StoreError::Io(_)) {
                shared.fail("writing into sled", &error);
                return;
            }
            if !stopping {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if stopping {
            return;
        }
    }
}

/// Blocks until a round is due; true when the store is closing.
fn wait_for_work(shared: &Shared) -> bool {
    let mut overlay = lock(&shared.overlay);
    loop {
        if shared.stop.load(Ordering::Acquire) {
            return true;
        }
        // A round that failed is written again (after its pause) whether or not more came.
        if overlay.round_due() {
            return false;
        }
        let waited = overlay.pending_since.map(|since| since.elapsed());
        overlay = match waited {
            Some(waited) if waited >= COALESCE || overlay.len() >= ROUND_TASKS => return false,
            Some(waited) => shared.wake.wait_timeout(overlay, COALESCE - waited),
            None => shared.wake.wait_timeout(overlay, Duration::from_secs(1)),
        }
        .unwrap_or_else(|p| p.into_inner())
        .0;
    }
}
