//! Durable storage behind the `Store` trait: tasks, payloads, the append-only event log,
//! idempotency keys and the state index. Nothing outside this module touches sled.
//!
//! The event log is a sequence of blocks, one per commit, each holding that commit's events
//! (consecutive `seq`s); a task record lists the `seq`s of its own events, and holds its payload
//! when that is small. A submission thus writes three keys (task, idempotency key, state index)
//! and a share of one block: sled's cost is per key, and a key per event, per payload and per
//! index entry cost well over twice as much.

mod keys;
mod listing;
mod materializer;
mod overlay;
mod policy_catalog;
mod record;
mod segment;
mod sled_store;
mod wal;
mod wal_file;

pub use sled_store::{SledOptions, SledStore};

use crate::model::{
    Event, PolicyEvent, PolicyKind, PolicyVersion, QueueEntry, State, Task, TaskId, WorkerEvent,
};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the data directory {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error("storage failure: {0}")]
    Sled(#[from] sled::Error),
    #[error("storage I/O failure: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt record under {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
}

/// What an idempotency key points at: the task it created and the fingerprint of the body that
/// created it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    pub task_id: TaskId,
    pub fingerprint: [u8; 32],
}

/// The records written once, when a task is created.
#[derive(Clone, Debug)]
pub struct NewTask {
    pub id: TaskId,
    pub payload_json: Vec<u8>,
    pub key: Option<(String, KeyRecord)>,
}

/// A task record as it is after a change, with the state it had before (none when new), so a
/// store can move its index entry and, with several writers, refuse a stale `previous`.
#[derive(Clone, Debug)]
pub struct TaskWrite {
    pub previous: Option<State>,
    pub task: Task,
}

/// One atomic unit of storage: either all of it is applied or none of it. The writer merges
/// the changes of many requests into one, so that one batch and one sync serve them all.
#[derive(Clone, Debug, Default)]
pub struct Change {
    pub new_tasks: Vec<NewTask>,
    /// In order; a later write of the same task supersedes an earlier one.
    pub writes: Vec<TaskWrite>,
    /// Consecutive `seq`s, in order.
    pub events: Vec<Event>,
    /// The worker log's entries, consecutive `seq`s of their own, in order.
    pub worker_events: Vec<WorkerEvent>,
}

impl Change {
    pub fn is_empty(&self) -> bool {
        self.new_tasks.is_empty()
            && self.writes.is_empty()
            && self.events.is_empty()
            && self.worker_events.is_empty()
    }

    /// Appends `later`, which was planned after everything already here.
    pub fn merge(&mut self, later: Change) {
        self.new_tasks.extend(later.new_tasks);
        self.writes.extend(later.writes);
        self.events.extend(later.events);
        self.worker_events.extend(later.worker_events);
    }
}

/// What a store knows at start.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    pub last_event_seq: u64,
    pub last_worker_event_seq: u64,
    pub last_task_id: Option<TaskId>,
    pub tasks_by_state: [u64; 12],
    /// The queued tasks, from the state index alone.
    pub queued: Vec<QueueEntry>,
    /// Every other task not yet terminal, in id order, then the terminal ones whose completion
    /// callback is still to be delivered: the engine rebuilds its leases and timers from them.
    pub live: Vec<Task>,
}

/// A page request over tasks, in id order (so, arrival order).
#[derive(Clone, Debug)]
pub struct ListQuery {
    pub state: Option<State>,
    pub kind: Option<String>,
    pub device: Option<String>,
    pub after: Option<TaskId>,
    pub limit: usize,
    /// Records examined at most, so a rare filter cannot scan the whole store in one request.
    pub scan_budget: usize,
}

#[derive(Clone, Debug, Default)]
pub struct ListPage {
    pub tasks: Vec<Task>,
    /// Where the next page starts; absent when the scan reached the end.
    pub next_after: Option<TaskId>,
}

/// The operations the scheduler needs, named for what they do rather than how sled does them,
/// so that another backend (PostgreSQL, for several replicas) can stand behind the same trait.
pub trait Store: Send + Sync + 'static {
    /// Applies `change` atomically. It is visible to readers at once and durable after the
    /// next `sync`.
    fn commit(&self, change: &Change) -> Result<(), StoreError>;
    /// Makes every change committed before this call durable on disk.
    fn sync(&self) -> Result<(), StoreError>;
    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError>;
    fn payload(&self, id: TaskId) -> Result<Option<Vec<u8>>, StoreError>;
    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError>;
    /// The task's events, oldest first, after `after_seq`, at most `limit`; `None` when there
    /// is no such task.
    fn events_of(
        &self,
        id: TaskId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Option<Vec<Event>>, StoreError>;
    fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError>;
    /// The global event log after `after_seq`, oldest first, at most `limit`.
    fn events_after(&self, after_seq: u64, limit: usize) -> Result<Vec<Event>, StoreError>;
    /// The worker log after `after_seq`, oldest first, at most `limit`.
    fn worker_events(&self, after_seq: u64, limit: usize) -> Result<Vec<WorkerEvent>, StoreError>;
    fn recover(&self) -> Result<Recovery, StoreError>;
}

/// The policy registry's records: uploaded components by content hash, their versions, each
/// kind's activation stack, the policy log, and a cache of compiled code. Every write except
/// the cache is atomic and durable when it returns.
pub trait PolicyCatalog: Send + Sync + 'static {
    fn versions(&self, kind: PolicyKind) -> Result<Vec<PolicyVersion>, StoreError>;
    fn module(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Stores a new version, its component (once per hash) and its `Uploaded` event.
    fn add_version(
        &self,
        version: &PolicyVersion,
        module: &[u8],
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError>;
    /// The versions activated in turn, the active one last; empty means the built-in one.
    fn stack(&self, kind: PolicyKind) -> Result<Vec<u32>, StoreError>;
    /// Replaces a kind's stack and logs why, as one write. The event's `seq` is assigned here.
    fn set_stack(
        &self,
        kind: PolicyKind,
        stack: &[u32],
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError>;
    /// The newest `limit` events of a kind, oldest first.
    fn events(&self, kind: PolicyKind, limit: usize) -> Result<Vec<PolicyEvent>, StoreError>;
    /// Compiled code cached under `cache_key`; a cache, so losing it costs only a recompile.
    fn compiled(&self, cache_key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    fn put_compiled(&self, cache_key: &str, code: &[u8]) -> Result<(), StoreError>;
}

#[cfg(test)]
mod tests;
