//! What the sled store and its materializer thread share: the tree, the overlay of commits
//! not yet written in place, the write-ahead file, and the reads and syncs both need.

use super::overlay::Overlay;
use super::util::{corrupt, lock};
use super::wal::{self, CallbackMark, PendingWrite};
use super::wal_file::WalFile;
use super::{keys, record};
use crate::sled_error;
use sluice_model::{Change, Event, QueueEntry, State, Task, TaskId, TaskIdMap};
use sluice_store::StoreError;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};

/// Tasks logged but not yet written into sled, at most; a commit past it waits for the materializer
/// (up to `BEHIND_TIMEOUT`, then fails) so memory stays bounded.
const MAX_PENDING_TASKS: usize = 100_000;
/// Bytes logged but not yet written into sled, at most, records and payloads together: with
/// results and payloads of a mebibyte, the task count alone would allow a hundred gibibytes.
pub(super) const MAX_PENDING_BYTES: usize = 256 << 20;
const BEHIND_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// What the store and its materializer thread share.
pub(super) struct Shared {
    pub(super) db: sled::Db,
    pub(super) tree: sled::Tree,
    pub(super) data_file: Option<File>,
    pub(super) blobs_dir: PathBuf,
    /// Blob files already synced. The flusher, the materializer and the policy registry call
    /// `sync`, so the lock is rarely contended.
    pub(super) synced_blobs: Mutex<HashSet<OsString>>,
    pub(super) overlay: Mutex<Overlay>,
    /// Wakes the materializer.
    pub(super) wake: Condvar,
    /// Told after each round, for commits waiting on a full overlay.
    pub(super) settled: Condvar,
    /// Held for a whole round; holds the last commit written in place.
    pub(super) rounds: Mutex<u64>,
    pub(super) stop: AtomicBool,
    /// Held for a whole commit; holds the next commit's number.
    pub(super) next_commit: Mutex<u64>,
    pub(super) wal: WalFile,
    pub(super) fdatasync: bool,
    /// Set by the first failed sync: from then on nothing is written or synced.
    pub(super) failure: Mutex<Option<String>>,
    pub(super) space: Arc<super::space::DiskSpace>,
}

impl Shared {
    /// fsyncs the blob files written since the last call, then their directory.
    pub(super) fn sync_new_blobs(&self) -> Result<(), StoreError> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error.into()),
        };
        let mut synced = self.synced_blobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut present = HashSet::new();
        let mut new_files = false;
        for entry in entries {
            let name = entry?.file_name();
            if !synced.contains(&name) {
                // A blob sled has already collected again is simply gone: nothing to sync.
                match File::open(self.blobs_dir.join(&name)) {
                    Ok(file) => file.sync_all()?,
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(error) => return Err(error.into()),
                }
                new_files = true;
            }
            present.insert(name);
        }
        if new_files {
            File::open(&self.blobs_dir)?.sync_all()?;
        }
        *synced = present;
        Ok(())
    }

    pub(super) fn sync_sled(&self) -> Result<(), StoreError> {
        self.refuse_if_failed()?;
        let synced = (|| {
            fail::fail_point!("sled-sync", |_| Err(StoreError::Io(std::io::Error::other(
                "injected failure of sled's sync"
            ))));
            self.db.flush().map_err(sled_error)?;
            if let Some(file) = &self.data_file {
                file.sync_data()?;
                self.sync_new_blobs()?;
            }
            Ok(())
        })();
        synced.inspect_err(|error| self.fail("syncing sled", error))
    }

    /// Marks the store failed after a sync that did not succeed; the first reason is kept.
    pub(super) fn fail(&self, what: &str, error: &StoreError) {
        let mut failure = lock(&self.failure);
        if failure.is_none() {
            tracing::error!(%error, what, "a sync failed: the store takes no more writes; restart to replay the log");
            *failure = Some(format!("{what}: {error}"));
        }
    }

    pub(super) fn failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }

    pub(super) fn refuse_if_failed(&self) -> Result<(), StoreError> {
        match self.failure() {
            Some(reason) => Err(StoreError::Failed(reason)),
            None => Ok(()),
        }
    }

    /// The record of a task the overlay holds.
    pub(super) fn pending_record(&self, id: TaskId) -> Option<Arc<[u8]>> {
        lock(&self.overlay)
            .task(&id)
            .map(|pending| pending.record.clone())
    }

    /// The part of a task's record that a state change carries over.
    pub(super) fn tail_of(&self, id: TaskId) -> Result<Vec<u8>, StoreError> {
        if let Some(record) = self.pending_record(id) {
            return Ok(record::split(&record)?.tail());
        }
        let old = self
            .tree
            .get(keys::task(id))
            .map_err(sled_error)?
            .ok_or_else(|| corrupt("task", format!("{id} changes state but has no record")))?;
        Ok(record::split(&old)?.tail())
    }

    /// Waits while the overlay is full; an error once the materializer has made no room for
    /// `BEHIND_TIMEOUT`.
    pub(super) fn wait_for_room(&self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let mut overlay = lock(&self.overlay);
        while overlay.task_count() >= MAX_PENDING_TASKS || overlay.byte_count() >= MAX_PENDING_BYTES
        {
            if started.elapsed() >= BEHIND_TIMEOUT {
                return Err(StoreError::Io(std::io::Error::other(
                    "tasks are not being written in place: the write-ahead log is full",
                )));
            }
            self.wake.notify_one();
            overlay = self
                .settled
                .wait_timeout(overlay, std::time::Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    /// The commit's writes, one per task as the commit leaves it.
    pub(super) fn pending_writes(
        &self,
        change: &Change,
        tails: &TaskIdMap<Vec<u8>>,
    ) -> Result<Vec<PendingWrite>, StoreError> {
        let mut order: Vec<TaskId> = Vec::new();
        let mut coalesced: TaskIdMap<(Option<State>, u16, &Task)> = TaskIdMap::default();
        for write in &change.writes {
            let task = &write.task;
            coalesced
                .entry(task.id)
                .and_modify(|(_, touched, last)| {
                    *touched |= wal::state_bit(task.state);
                    *last = task;
                })
                .or_insert_with(|| {
                    order.push(task.id);
                    (write.previous, wal::state_bit(task.state), task)
                });
        }
        let mut writes = Vec::with_capacity(order.len());
        for id in order {
            let Some(&(previous, touched, task)) = coalesced.get(&id) else {
                continue;
            };
            let tail = match tails.get(&id) {
                Some(tail) => std::borrow::Cow::Borrowed(tail),
                None => std::borrow::Cow::Owned(self.tail_of(id)?),
            };
            // A queued task's index entry carries its queue entry, so queues are rebuilt at
            // start from the index alone.
            let index_value = if task.state == State::Queued {
                QueueEntry::of(task).encode()
            } else {
                vec![task.bucket.index() as u8]
            };
            let callback = if task.callback_pending() {
                CallbackMark::Set
            } else if task.callback.is_some() {
                CallbackMark::Clear
            } else {
                CallbackMark::Keep
            };
            let task_bytes = sluice_store::record::encode(task)?;
            writes.push(PendingWrite {
                id,
                previous,
                touched,
                state: task.state,
                callback,
                index_value,
                record: Arc::from(record::encode(&task_bytes, &tail)?),
            });
        }
        Ok(writes)
    }

    pub(super) fn decode_task(bytes: &[u8]) -> Result<Task, StoreError> {
        sluice_store::record::decode(record::split(bytes)?.task)
    }

    /// The block of the log that holds event `seq`: the last block starting at or before it.
    pub(super) fn block_holding(&self, seq: u64) -> Result<Vec<Event>, StoreError> {
        let missing = || corrupt("event log", format!("no block holds event {seq}"));
        let pending = lock(&self.overlay).block_holding(seq).cloned();
        let block = match pending {
            Some(bytes) => sluice_store::record::event::decode_block(&bytes)?,
            None => {
                let (_, bytes) = self
                    .tree
                    .range(keys::block(0)..=keys::block(seq))
                    .next_back()
                    .ok_or_else(missing)?
                    .map_err(sled_error)?;
                sluice_store::record::event::decode_block(&bytes)?
            }
        };
        match (block.first(), block.last()) {
            (Some(first), Some(last)) if first.seq <= seq && seq <= last.seq => Ok(block),
            _ => Err(missing()),
        }
    }
}
