//! The embedded store: one sled tree in a local folder. `sync` is sled's flush, then an
//! fdatasync of its data file (on Linux sled's flush is only `sync_file_range`), then an fsync of
//! any blob file sled wrote since the last sync: sled puts pages over a quarter segment (a leaf
//! of large payloads, say) in separate blob files and never syncs them.

use super::keys;
use super::record;
use super::{Change, KeyRecord, ListPage, ListQuery, Recovery, Store, StoreError};
use crate::model::{Event, QueueEntry, State, Task, TaskId, WorkerEvent};
use std::collections::HashMap;
use std::collections::HashSet;
use std::collections::hash_map::Entry;
use std::ffi::OsString;
use std::fs::File;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

#[derive(Clone, Debug)]
pub struct SledOptions {
    pub cache_capacity_bytes: u64,
    /// fdatasync after each flush, so acknowledged work survives power loss and not only a crash.
    pub fdatasync: bool,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            cache_capacity_bytes: 512 << 20,
            fdatasync: true,
        }
    }
}

/// sled writes any page larger than a quarter segment to a separate blob file that it never
/// syncs. 8 MiB segments keep pages holding a 1 MiB payload inside the synced log.
const SEGMENT_SIZE_BYTES: usize = 8 << 20;
const TREE_NAME: &str = "tasks";
const POLICY_TREE_NAME: &str = "policies";

pub struct SledStore {
    db: sled::Db,
    tree: sled::Tree,
    pub(super) policies: sled::Tree,
    data_file: Option<File>,
    blobs_dir: PathBuf,
    /// Blob files already synced. The flusher calls `sync`, and the policy registry now and
    /// then, so the lock is rarely contended.
    synced_blobs: Mutex<HashSet<OsString>>,
}

impl SledStore {
    pub fn open(dir: &Path, options: &SledOptions) -> Result<Self, StoreError> {
        let open_error = |source| StoreError::Open {
            path: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir)?;
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_capacity_bytes)
            .segment_size(SEGMENT_SIZE_BYTES)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(open_error)?;
        let tree = db.open_tree(TREE_NAME)?;
        let policies = db.open_tree(POLICY_TREE_NAME)?;
        let data_file = if options.fdatasync {
            Some(File::open(dir.join("db"))?)
        } else {
            None
        };
        Ok(SledStore {
            db,
            tree,
            policies,
            data_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: Mutex::new(HashSet::new()),
        })
    }

    /// fsyncs the blob files written since the last call, then their directory.
    fn sync_new_blobs(&self) -> Result<(), StoreError> {
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

    /// Opens a store that this process had open a moment ago, for tests that reopen one.
    /// sled's background flusher can still hold the file lock briefly after the last handle
    /// is dropped, so the lock is polled for, up to 10 s; any other error returns at once.
    #[cfg(test)]
    pub(crate) fn reopen(dir: &Path, options: &SledOptions) -> Result<Self, StoreError> {
        let started = std::time::Instant::now();
        loop {
            match Self::open(dir, options) {
                Err(StoreError::Open { source, .. })
                    if source.to_string().contains("could not acquire lock")
                        && started.elapsed() < std::time::Duration::from_secs(10) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                opened => return opened,
            }
        }
    }

    #[cfg(test)]
    pub(super) fn synced_blob_count(&self) -> usize {
        self.synced_blobs.lock().map(|s| s.len()).unwrap_or(0)
    }

    fn decode_task(bytes: &[u8]) -> Result<Task, StoreError> {
        let parts = record::split(bytes)?;
        serde_json::from_slice(parts.task_json).map_err(|e| corrupt("task", e))
    }

    /// The block of the log that holds event `seq`: the last block starting at or before it.
    fn block_holding(&self, seq: u64) -> Result<Vec<Event>, StoreError> {
        let missing = || corrupt("event log", format!("no block holds event {seq}"));
        let (_, bytes) = self
            .tree
            .range(keys::block(0)..=keys::block(seq))
            .next_back()
            .ok_or_else(missing)??;
        let block: Vec<Event> =
            serde_json::from_slice(&bytes).map_err(|e| corrupt("event log", e))?;
        match (block.first(), block.last()) {
            (Some(first), Some(last)) if first.seq <= seq && seq <= last.seq => Ok(block),
            _ => Err(missing()),
        }
    }
}

pub(super) fn corrupt(what: &'static str, detail: impl ToString) -> StoreError {
    StoreError::Corrupt {
        what,
        detail: detail.to_string(),
    }
}

fn encode_key_record(record: &KeyRecord) -> [u8; 48] {
    let mut out = [0; 48];
    out[..16].copy_from_slice(&record.task_id.to_bytes());
    out[16..].copy_from_slice(&record.fingerprint);
    out
}

fn decode_key_record(bytes: &[u8]) -> Result<KeyRecord, StoreError> {
    let task_id =
        keys::id_at(bytes, 0).ok_or_else(|| corrupt("idempotency key", "short record"))?;
    let fingerprint: [u8; 32] = bytes
        .get(16..48)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("idempotency key", "short record"))?;
    Ok(KeyRecord {
        task_id,
        fingerprint,
    })
}

/// The first key after every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

impl Store for SledStore {
    fn commit(&self, change: &Change) -> Result<(), StoreError> {
        let mut batch = sled::Batch::default();
        // The part of each record that state changes carry over: where the payload lives, and
        // the payload itself when inline.
        let mut tails: HashMap<TaskId, Vec<u8>> = HashMap::new();
        for new in &change.new_tasks {
            let tail = record::tail_for(&new.payload_json);
            if tail[0] == record::PAYLOAD_SEPARATE {
                batch.insert(&keys::payload(new.id)[..], new.payload_json.as_slice());
            }
            tails.insert(new.id, tail);
            if let Some((key, record)) = &new.key {
                batch.insert(keys::idempotency(key), &encode_key_record(record)[..]);
            }
        }
        for write in &change.writes {
            let task = &write.task;
            if let Some(previous) = write.previous
                && previous != task.state
            {
                batch.remove(&keys::state(previous, task.id)[..]);
            }
            // A queued task's index entry carries its queue entry, so queues are rebuilt at
            // start from the index alone.
            let index_value = if task.state == State::Queued {
                QueueEntry::of(task).encode()
            } else {
                vec![task.bucket.index() as u8]
            };
            batch.insert(&keys::state(task.state, task.id)[..], index_value);
            let tail = match tails.entry(task.id) {
                Entry::Occupied(entry) => entry.into_mut(),
                Entry::Vacant(entry) => {
                    let old = self.tree.get(keys::task(task.id))?.ok_or_else(|| {
                        corrupt(
                            "task",
                            format!("{} changes state but has no record", task.id),
                        )
                    })?;
                    entry.insert(record::split(&old)?.tail())
                }
            };
            if task.callback_pending() {
                batch.insert(&keys::callback(task.id)[..], &[][..]);
            } else if task.callback.is_some() {
                batch.remove(&keys::callback(task.id)[..]);
            }
            let task_json = serde_json::to_vec(task).map_err(|e| corrupt("task", e))?;
            batch.insert(&keys::task(task.id)[..], record::encode(&task_json, tail)?);
        }
        if let Some(first) = change.events.first() {
            let block = serde_json::to_vec(&change.events).map_err(|e| corrupt("event", e))?;
            batch.insert(&keys::block(first.seq)[..], block);
        }
        for event in &change.worker_events {
            let bytes = serde_json::to_vec(event).map_err(|e| corrupt("worker event", e))?;
            batch.insert(&keys::worker_event(event.seq)[..], bytes);
        }
        self.tree.apply_batch(batch)?;
        Ok(())
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        if let Some(file) = &self.data_file {
            file.sync_data()?;
            self.sync_new_blobs()?;
        }
        Ok(())
    }

    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        self.tree
            .get(keys::task(id))?
            .map(|bytes| Self::decode_task(&bytes))
            .transpose()
    }

    fn payload(&self, id: TaskId) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(bytes) = self.tree.get(keys::task(id))? else {
            return Ok(None);
        };
        match record::split(&bytes)?.inline_payload {
            Some(inline) => Ok(Some(inline.to_vec())),
            None => Ok(self.tree.get(keys::payload(id))?.map(|b| b.to_vec())),
        }
    }

    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        self.tree
            .get(keys::idempotency(key))?
            .map(|bytes| decode_key_record(&bytes))
            .transpose()
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
        let mut events = Vec::new();
        // Consecutive events of a task often share a block: keep the last one read.
        let mut block: Vec<Event> = Vec::new();
        for &seq in task
            .event_seqs
            .iter()
            .filter(|&&s| s > after_seq)
            .take(limit)
        {
            let held = block.first().is_some_and(|e| e.seq <= seq)
                && block.last().is_some_and(|e| seq <= e.seq);
            if !held {
                block = self.block_holding(seq)?;
            }
            let event = block
                .iter()
                .find(|e| e.seq == seq && e.task_id == id)
                .ok_or_else(|| corrupt("event log", format!("event {seq} of {id} is missing")))?;
            events.push(event.clone());
        }
        Ok(Some(events))
    }

    fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let (prefix, id_offset): (Vec<u8>, usize) = match query.state {
            Some(state) => (keys::state_prefix(state).to_vec(), 2),
            None => (vec![keys::TASK], 1),
        };
        let start = match query.after {
            Some(after) => {
                let mut key = prefix.clone();
                key.extend_from_slice(&after.to_bytes());
                Bound::Excluded(key)
            }
            None => Bound::Included(prefix.clone()),
        };
        let mut iter = self
            .tree
            .range::<Vec<u8>, _>((start, Bound::Excluded(prefix_end(&prefix))));
        let mut page = ListPage::default();
        let mut examined = 0;
        while let Some(entry) = iter.next() {
            let (key, value) = entry?;
            let id =
                keys::id_at(&key, id_offset).ok_or_else(|| corrupt("task index", "short key"))?;
            let task = if query.state.is_some() {
                match self.task(id)? {
                    Some(task) => task,
                    None => return Err(corrupt("state index", format!("{id} has no record"))),
                }
            } else {
                Self::decode_task(&value)?
            };
            examined += 1;
            let wanted = query.kind.as_ref().is_none_or(|k| *k == task.kind)
                && query.device.as_ref().is_none_or(|d| *d == task.device);
            if wanted {
                page.tasks.push(task);
            }
            if page.tasks.len() >= query.limit {
                if iter.next().is_some() {
                    page.next_after = Some(id);
                }
                break;
            }
            if examined >= query.scan_budget {
                page.next_after = Some(id);
                break;
            }
        }
        Ok(page)
    }

    fn events_after(&self, after_seq: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let first = after_seq.saturating_add(1);
        // The block holding `first` starts at or before it; the blocks after it follow.
        let start = match self
            .tree
            .range(keys::block(0)..=keys::block(first))
            .next_back()
        {
            Some(entry) => entry?.0,
            None => keys::block(first).to_vec().into(),
        };
        let mut events = Vec::new();
        for entry in self
            .tree
            .range(start..=keys::block(u64::MAX).to_vec().into())
        {
            let (_, bytes) = entry?;
            let block: Vec<Event> =
                serde_json::from_slice(&bytes).map_err(|e| corrupt("event log", e))?;
            for event in block {
                if events.len() >= limit {
                    return Ok(events);
                }
                if event.seq >= first {
                    events.push(event);
                }
            }
        }
        Ok(events)
    }

    fn worker_events(&self, after_seq: u64, limit: usize) -> Result<Vec<WorkerEvent>, StoreError> {
        let start = keys::worker_event(after_seq.saturating_add(1));
        let end = keys::worker_event(u64::MAX);
        let mut events = Vec::new();
        for entry in self.tree.range(start..=end).take(limit) {
            let (_, bytes) = entry?;
            events.push(serde_json::from_slice(&bytes).map_err(|e| corrupt("worker event", e))?);
        }
        Ok(events)
    }

    fn recover(&self) -> Result<Recovery, StoreError> {
        let mut recovery = Recovery::default();
        if let Some(entry) = self.tree.scan_prefix([keys::BLOCK]).next_back() {
            let (key, _) = entry?;
            let first = keys::seq_at(&key, 1).ok_or_else(|| corrupt("event log", "short key"))?;
            let block = self.block_holding(first)?;
            recovery.last_event_seq = block.last().map_or(first, |e| e.seq);
        }
        if let Some(entry) = self.tree.scan_prefix([keys::WORKER_EVENT]).next_back() {
            let (key, _) = entry?;
            recovery.last_worker_event_seq =
                keys::seq_at(&key, 1).ok_or_else(|| corrupt("worker log", "short key"))?;
        }
        if let Some(entry) = self.tree.scan_prefix([keys::TASK]).next_back() {
            let (key, _) = entry?;
            recovery.last_task_id = keys::id_at(&key, 1);
        }
        for entry in self.tree.scan_prefix([keys::STATE]) {
            let (key, value) = entry?;
            let state = key
                .get(1)
                .and_then(|&code| State::from_code(code))
                .ok_or_else(|| corrupt("state index", "unknown state code"))?;
            let id = keys::id_at(&key, 2).ok_or_else(|| corrupt("state index", "short key"))?;
            recovery.tasks_by_state[usize::from(state.code())] += 1;
            if state == State::Queued
                && let Some(queued) = QueueEntry::decode(id, &value)
            {
                recovery.queued.push(queued);
            } else if !state.is_terminal() {
                let task = self
                    .task(id)?
                    .ok_or_else(|| corrupt("state index", format!("{id} has no record")))?;
                recovery.live.push(task);
            }
        }
        for entry in self.tree.scan_prefix([keys::CALLBACK]) {
            let (key, _) = entry?;
            let id = keys::id_at(&key, 1).ok_or_else(|| corrupt("callback index", "short key"))?;
            let task = self
                .task(id)?
                .ok_or_else(|| corrupt("callback index", format!("{id} has no record")))?;
            recovery.live.push(task);
        }
        Ok(recovery)
    }
}
