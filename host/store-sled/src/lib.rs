//! The embedded store: one sled tree in a local folder, behind a write-ahead file. A commit
//! appends one record to the write-ahead file (`wal_file`) and joins the overlay; `sync` is an
//! fdatasync of that file. The materializer writes the overlay into sled later, coalesced, and
//! readers see the overlay first. Syncing sled (the materializer's and the policy catalog's) is
//! its flush, then an fdatasync of its data file (on Linux sled's flush is only
//! `sync_file_range`), then an fsync of any blob file sled wrote since the last sync: sled puts
//! pages over a quarter segment (a leaf of large payloads, say) in separate blob files and never
//! syncs them.
//!
//! The event log is a sequence of blocks, one per commit, each holding that commit's events
//! (consecutive `seq`s); a task record lists the `seq`s of its own events, and holds its payload
//! when that is small. A submission thus writes three keys (task, idempotency key, state index)
//! and a share of one block: sled's cost is per key.

mod access;
mod format;
mod keys;
mod listing;
mod materializer;
mod overlay;
mod policy_catalog;
mod record;
mod retention;
mod segment;
mod shared;
mod space;
mod util;
mod wal;
mod wal_file;

use overlay::Overlay;
use shared::Shared;
use sluice_model::{
    Change, Event, KeyRecord, QueueEntry, Recovery, State, Task, TaskId, TaskIdMap, WorkerEvent,
};
use sluice_store::{ListPage, ListQuery, Store, StoreError};
use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use util::{corrupt, lock};
use wal::Entry;
use wal_file::WalFile;

/// A sled failure is an I/O failure when it is one (so a full disk stays recognisable), and
/// otherwise the backend's own.
pub(crate) fn sled_error(error: sled::Error) -> StoreError {
    match error {
        sled::Error::Io(io) => StoreError::Io(io),
        other => StoreError::Backend(Box::new(other)),
    }
}

#[derive(Clone, Debug)]
pub struct SledOptions {
    pub cache_capacity_bytes: u64,
    /// fdatasync after each flush, so acknowledged work survives power loss and not only a crash.
    pub fdatasync: bool,
    /// Free space kept on the data directory's filesystem: below it commits are refused
    /// (`StoreError::Full`) until space is freed, so sled, which cannot survive ENOSPC, always
    /// has room to write in place what the log holds.
    pub min_free_disk_bytes: u64,
}

impl Default for SledOptions {
    fn default() -> Self {
        SledOptions {
            cache_capacity_bytes: 512 << 20,
            fdatasync: true,
            min_free_disk_bytes: sluice_store::DEFAULT_MIN_FREE_DISK_BYTES,
        }
    }
}

const TREE_NAME: &str = "tasks";
const POLICY_TREE_NAME: &str = "policies";
const ACCESS_TREE_NAME: &str = "access";

pub struct SledStore {
    shared: Arc<Shared>,
    pub(crate) policies: sled::Tree,
    pub(crate) access: sled::Tree,
    /// Held while an audited write picks its seq and applies.
    access_writes: Mutex<()>,
    materializer: Option<std::thread::JoinHandle<()>>,
}

impl SledStore {
    pub fn open(dir: &Path, options: &SledOptions) -> Result<Self, StoreError> {
        Self::open_with(dir, options, true)
    }

    /// A store whose commits stay in the write-ahead log and the overlay: dropping it is a
    /// crash as far as sled is concerned.
    #[cfg(test)]
    pub(crate) fn open_without_materializer(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, &SledOptions::default(), false)
    }

    fn open_with(dir: &Path, options: &SledOptions, materialize: bool) -> Result<Self, StoreError> {
        let open_error = |source: sled::Error| StoreError::Open {
            path: dir.display().to_string(),
            source: Box::new(source),
        };
        std::fs::create_dir_all(dir)?;
        let segment_bytes = segment::segment_bytes(dir);
        if segment_bytes != segment::NEW_SEGMENT_BYTES {
            tracing::info!(
                segment_bytes,
                "this data directory keeps the sled segment size it was made with; new ones use 1 MiB, which shortens the stalls behind sled's log writes"
            );
        }
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(options.cache_capacity_bytes)
            .segment_size(segment_bytes)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(open_error)?;
        let tree = db.open_tree(TREE_NAME).map_err(sled_error)?;
        let policies = db.open_tree(POLICY_TREE_NAME).map_err(sled_error)?;
        let access = db.open_tree(ACCESS_TREE_NAME).map_err(sled_error)?;
        let data_file = if options.fdatasync {
            Some(File::open(dir.join("db"))?)
        } else {
            None
        };
        let floor = match tree.get(keys::WAL_FLOOR).map_err(sled_error)? {
            Some(bytes) => keys::seq_at(&bytes, 0)
                .ok_or_else(|| corrupt("write-ahead floor", "short value"))?,
            None => 0,
        };
        let space = Arc::new(space::DiskSpace::new(dir, options.min_free_disk_bytes));
        let (wal, logged) = WalFile::open(&dir.join("wal"), floor, space.clone())?;
        let next_commit = wal.next_commit();
        let shared = Arc::new(Shared {
            db,
            tree,
            data_file,
            blobs_dir: dir.join("blobs"),
            synced_blobs: Mutex::new(HashSet::new()),
            overlay: Mutex::new(Overlay::default()),
            wake: Condvar::new(),
            settled: Condvar::new(),
            rounds: Mutex::new(0),
            stop: AtomicBool::new(false),
            next_commit: Mutex::new(next_commit),
            wal,
            fdatasync: options.fdatasync,
            failure: Mutex::new(None),
            space,
        });
        replay(&shared, logged, floor)?;
        format::open(&shared.tree, dir)?;
        let materializer = if materialize {
            let shared = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("sluice-materializer".into())
                    .spawn(move || materializer::run(&shared))?,
            )
        } else {
            None
        };
        Ok(SledStore {
            shared,
            policies,
            access,
            access_writes: Mutex::new(()),
            materializer,
        })
    }
}

/// At open: takes the logged commits past the floor back into the overlay (with every
/// index entry they may have left behind) and writes them into sled.
fn replay(shared: &Shared, logged: Vec<(u64, Entry)>, floor: u64) -> Result<(), StoreError> {
    *lock(&shared.rounds) = floor;
    let mut overlay = Overlay::default();
    for (commit, entry) in logged {
        if commit > floor {
            overlay.absorb(commit, entry, true);
        }
    }
    let replayed = overlay.len();
    let bytes = overlay.byte_count() as u64;
    *lock(&shared.overlay) = overlay;
    if replayed > 0 {
        // On a disk too full for it the materializer writes them later; the overlay serves
        // them meanwhile.
        if shared.space.room_for_sled(bytes)? {
            materializer::round(shared)?;
            tracing::info!(records = replayed, "replayed the write-ahead log into sled");
        } else {
            tracing::warn!(
                records = replayed,
                "the disk is too full to write the replayed log into sled yet"
            );
        }
    }
    Ok(())
}

impl SledStore {
    /// Makes everything written into sled durable (the policy catalog writes there directly).
    pub(crate) fn sync_sled(&self) -> Result<(), StoreError> {
        self.shared.sync_sled()
    }

    /// Opens a store that this process had open a moment ago, for tests that reopen one.
    /// sled's background flusher can still hold the file lock briefly after the last handle
    /// is dropped, so the lock is polled for, up to 10 s; any other error returns at once.
    #[cfg(any(test, feature = "test-support"))]
    pub fn reopen(dir: &Path, options: &SledOptions) -> Result<Self, StoreError> {
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
    pub(crate) fn synced_blob_count(&self) -> usize {
        self.shared
            .synced_blobs
            .lock()
            .map(|s| s.len())
            .unwrap_or(0)
    }

    /// Writes everything pending in place now (tests that look at the tree itself).
    #[cfg(test)]
    pub(crate) fn materialize(&self) -> Result<usize, StoreError> {
        materializer::round(&self.shared)
    }
}

/// What `SledStore::repair` did.
#[derive(Debug)]
pub struct Repair {
    /// Where the log was copied before anything was cut.
    pub copy: PathBuf,
    /// Each cut, with the file and offset; empty when the log was sound.
    pub cuts: Vec<String>,
}

impl SledStore {
    /// For a data directory whose write-ahead log is damaged (the server refuses to start and
    /// names the file and offset): copies the log to `wal.salvaged-<unix ms>` beside it, then
    /// cuts it at the first damage so that it opens again. Commits past the cut are lost from
    /// the store; the copy keeps them for inspection. The server must not be running.
    pub fn repair(dir: &Path) -> Result<Repair, StoreError> {
        let wal_dir = dir.join("wal");
        if !wal_dir.is_dir() {
            return Err(StoreError::Open {
                path: dir.display().to_string(),
                source: "no write-ahead log here: is this a Sluice data directory?".into(),
            });
        }
        let floor = {
            let db = sled::Config::new()
                .path(dir)
                .segment_size(segment::segment_bytes(dir))
                .open()
                .map_err(|source| StoreError::Open {
                    path: dir.display().to_string(),
                    source: Box::new(source),
                })?;
            let tree = db.open_tree(TREE_NAME).map_err(sled_error)?;
            match tree.get(keys::WAL_FLOOR).map_err(sled_error)? {
                Some(bytes) => keys::seq_at(&bytes, 0)
                    .ok_or_else(|| corrupt("write-ahead floor", "short value"))?,
                None => 0,
            }
        };
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let copy = dir.join(format!("wal.salvaged-{stamp}"));
        std::fs::create_dir(&copy)?;
        for entry in std::fs::read_dir(&wal_dir)? {
            let path = entry?.path();
            if let Some(name) = path.file_name() {
                std::fs::copy(&path, copy.join(name))?;
            }
        }
        let cuts = WalFile::salvage(&wal_dir, floor)?;
        Ok(Repair { copy, cuts })
    }
}

impl Drop for SledStore {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        if let Some(materializer) = self.materializer.take() {
            let _ = materializer.join();
        }
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

impl Store for SledStore {
    fn commit(&self, change: &Change) -> Result<(), StoreError> {
        self.shared.refuse_if_failed()?;
        let shared = &*self.shared;
        let mut next_commit = lock(&shared.next_commit);
        let mut entry = Entry::default();
        // The part of each record that state changes carry over: where the payload lives, and
        // the payload itself when inline.
        let mut tails: TaskIdMap<Vec<u8>> = TaskIdMap::default();
        for new in &change.new_tasks {
            let tail = record::tail_for(&new.payload_json);
            if tail[0] == record::PAYLOAD_SEPARATE {
                entry
                    .payloads
                    .push((new.id, Arc::from(new.payload_json.as_slice())));
            }
            tails.insert(new.id, tail);
            if let Some((key, record)) = &new.key {
                entry.keys.push((key.clone(), encode_key_record(record)));
            }
        }
        entry.writes = shared.pending_writes(change, &tails)?;
        if let Some(first) = change.events.first() {
            let block = sluice_store::record::event::encode_block(&change.events)?;
            entry.blocks.push((first.seq, Arc::from(block)));
        }
        for event in &change.worker_events {
            let bytes = serde_json::to_vec(event).map_err(|e| corrupt("worker event", e))?;
            entry.worker_events.push((event.seq, Arc::from(bytes)));
        }
        if entry.is_empty() {
            return Ok(());
        }
        shared.space.check(0)?;
        shared.wait_for_room()?;
        let commit = *next_commit;
        let written = shared.wal.append(commit, &entry).map_err(|error| {
            if error.is_full() {
                shared
                    .space
                    .full(shared.space.free_bytes_now().unwrap_or(0))
            } else {
                error
            }
        })?;
        shared.space.wrote(written);
        *next_commit += 1;
        let mut overlay = lock(&shared.overlay);
        let was_idle = overlay.pending_since.is_none();
        overlay.absorb(commit, entry, false);
        if was_idle || overlay.len() >= materializer::ROUND_TASKS {
            shared.wake.notify_one();
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), StoreError> {
        self.shared.refuse_if_failed()?;
        if self.shared.fdatasync {
            self.shared
                .wal
                .sync()
                .inspect_err(|error| self.shared.fail("syncing the write-ahead log", error))?;
        }
        Ok(())
    }

    fn check_space(&self) -> Result<(), StoreError> {
        self.shared.space.check(0)
    }

    fn first_event_seq(&self) -> Result<u64, StoreError> {
        retention::first_event_seq(&self.shared)
    }

    fn compact(
        &self,
        cutoff_ms: u64,
        max_tasks: usize,
    ) -> Result<sluice_store::Compacted, StoreError> {
        retention::compact(&self.shared, cutoff_ms, max_tasks)
    }

    fn failed(&self) -> Option<String> {
        self.shared.failure()
    }

    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        if let Some(record) = self.shared.pending_record(id) {
            return Shared::decode_task(&record).map(Some);
        }
        self.shared
            .tree
            .get(keys::task(id))
            .map_err(sled_error)?
            .map(|bytes| Shared::decode_task(&bytes))
            .transpose()
    }

    fn payload(&self, id: TaskId) -> Result<Option<Vec<u8>>, StoreError> {
        let tree = &self.shared.tree;
        let bytes: Arc<[u8]> = match self.shared.pending_record(id) {
            Some(record) => record,
            None => match tree.get(keys::task(id)).map_err(sled_error)? {
                Some(bytes) => Arc::from(&bytes[..]),
                None => return Ok(None),
            },
        };
        if let Some(inline) = record::split(&bytes)?.inline_payload {
            return Ok(Some(inline.to_vec()));
        }
        if let Some(payload) = lock(&self.shared.overlay).payload(&id) {
            return Ok(Some(payload.to_vec()));
        }
        Ok(tree
            .get(keys::payload(id))
            .map_err(sled_error)?
            .map(|b| b.to_vec()))
    }

    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        if let Some(record) = lock(&self.shared.overlay).key(key) {
            return decode_key_record(record).map(Some);
        }
        self.shared
            .tree
            .get(keys::idempotency(key))
            .map_err(sled_error)?
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
        // A task older than the retention may have outlived its first events.
        let floor = if task
            .event_seqs
            .first()
            .is_some_and(|&first| first > after_seq)
        {
            retention::first_event_seq(&self.shared)?
        } else {
            1
        };
        for &seq in task
            .event_seqs
            .iter()
            .filter(|&&s| s > after_seq && s >= floor)
            .take(limit)
        {
            let held = block.first().is_some_and(|e| e.seq <= seq)
                && block.last().is_some_and(|e| seq <= e.seq);
            if !held {
                block = self.shared.block_holding(seq)?;
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
        listing::list(&self.shared, query)
    }

    fn events_after(&self, after_seq: u64, limit: usize) -> Result<Vec<Event>, StoreError> {
        let first = after_seq.saturating_add(1);
        // The overlay is read before sled: a block written into sled meanwhile is then found in
        // one or the other, and the `seq` check below drops the copy.
        let pending: Vec<Arc<[u8]>> = {
            let overlay = lock(&self.shared.overlay);
            overlay
                .block_holding(first)
                .into_iter()
                .chain(overlay.blocks_after(first))
                .cloned()
                .collect()
        };
        let tree = &self.shared.tree;
        // The block holding `first` starts at or before it; the blocks after it follow.
        let start = match tree.range(keys::block(0)..=keys::block(first)).next_back() {
            Some(entry) => entry.map_err(sled_error)?.0,
            None => keys::block(first).to_vec().into(),
        };
        let stored = tree
            .range(start..=keys::block(u64::MAX).to_vec().into())
            .map(|entry| entry.map(|(_, bytes)| Arc::<[u8]>::from(&bytes[..])));
        let mut events: Vec<Event> = Vec::new();
        for bytes in stored.chain(pending.into_iter().map(Ok)) {
            let block = sluice_store::record::event::decode_block(&bytes.map_err(sled_error)?)?;
            for event in block {
                if events.len() >= limit {
                    return Ok(events);
                }
                let next = events.last().map_or(first, |last| last.seq + 1);
                if event.seq >= next {
                    events.push(event);
                }
            }
        }
        Ok(events)
    }

    fn worker_events(&self, after_seq: u64, limit: usize) -> Result<Vec<WorkerEvent>, StoreError> {
        let first = after_seq.saturating_add(1);
        let mut found: std::collections::BTreeMap<u64, Arc<[u8]>> = lock(&self.shared.overlay)
            .worker_events_from(first)
            .take(limit)
            .map(|(seq, bytes)| (*seq, bytes.clone()))
            .collect();
        let start = keys::worker_event(first);
        let end = keys::worker_event(u64::MAX);
        for entry in self.shared.tree.range(start..=end).take(limit) {
            let (key, bytes) = entry.map_err(sled_error)?;
            let seq = keys::seq_at(&key, 1).ok_or_else(|| corrupt("worker log", "short key"))?;
            found.entry(seq).or_insert_with(|| Arc::from(&bytes[..]));
        }
        found
            .values()
            .take(limit)
            .map(|bytes| serde_json::from_slice(bytes).map_err(|e| corrupt("worker event", e)))
            .collect()
    }

    fn recover(&self) -> Result<Recovery, StoreError> {
        // The index is read from the tree alone, so everything pending goes there first.
        materializer::round(&self.shared)?;
        let mut recovery = Recovery::default();
        if let Some(entry) = self.shared.tree.scan_prefix([keys::BLOCK]).next_back() {
            let (key, _) = entry.map_err(sled_error)?;
            let first = keys::seq_at(&key, 1).ok_or_else(|| corrupt("event log", "short key"))?;
            let block = self.shared.block_holding(first)?;
            recovery.last_event_seq = block.last().map_or(first, |e| e.seq);
        }
        if let Some(entry) = self
            .shared
            .tree
            .scan_prefix([keys::WORKER_EVENT])
            .next_back()
        {
            let (key, _) = entry.map_err(sled_error)?;
            recovery.last_worker_event_seq =
                keys::seq_at(&key, 1).ok_or_else(|| corrupt("worker log", "short key"))?;
        }
        if let Some(entry) = self.shared.tree.scan_prefix([keys::TASK]).next_back() {
            let (key, _) = entry.map_err(sled_error)?;
            recovery.last_task_id = keys::id_at(&key, 1);
        }
        for entry in self.shared.tree.scan_prefix([keys::STATE]) {
            let (key, value) = entry.map_err(sled_error)?;
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
        for entry in self.shared.tree.scan_prefix([keys::CALLBACK]) {
            let (key, _) = entry.map_err(sled_error)?;
            let id = keys::id_at(&key, 1).ok_or_else(|| corrupt("callback index", "short key"))?;
            let task = self
                .task(id)?
                .ok_or_else(|| corrupt("callback index", format!("{id} has no record")))?;
            recovery.live.push(task);
        }
        Ok(recovery)
    }
}

#[cfg(test)]
mod format_tests;
#[cfg(test)]
mod tests;
