//! The storage API: the `Store` and `PolicyCatalog` traits, a backend-neutral `StoreError`, and
//! the page queries. The data a commit carries (`Change` and its parts) and what a store hands
//! back at start (`Recovery`) are the model's (`sluice-model`, `change.rs`). Backends are crates
//! of their own that implement these traits: `sluice-store-sled` is the embedded default,
//! `sluice-store-postgres` the shared one for several replicas; this crate names neither.
//! `memory` is a policy catalog in memory, for registries that live for one run.

mod memory;
pub mod record;

pub use memory::MemoryCatalog;

use std::collections::HashMap;

use sluice_model::{
    AuditEvent, Change, Collection, ConcurrencyLimit, Event, Experiment, KeyRecord, PolicyEvent,
    PolicyKind, PolicyVersion, Recovery, State, Task, TaskId, TokenRecord, WorkerEvent,
};

/// The free space a store keeps on its disk by default, refusing writes below it: several times
/// what the embedded store writes in place in one round under a steady load, and room for an
/// operator's shell to work in.
pub const DEFAULT_MIN_FREE_DISK_BYTES: u64 = 128 << 20;

/// Audit entries a store keeps; each append past it removes the oldest. Admin actions are rare
/// (a few a day), so this is years of them, in a few tens of MB at most.
pub const MAX_AUDIT_EVENTS: u64 = 100_000;

/// Why a store could not do what it was asked. A backend maps its own errors here: I/O failures
/// stay `Io` (so a full disk is still recognisable), and the rest travel as `Backend`.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store at {path}: {source}")]
    Open {
        path: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("storage I/O failure: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt record under {what}: {detail}")]
    Corrupt { what: &'static str, detail: String },
    #[error("storage backend failure: {0}")]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// A sync failed earlier: what the disk holds is no longer known, so the store takes no
    /// more writes until a restart replays the log from disk (after a failed fsync the page
    /// cache cannot be trusted).
    #[error("storage failed and takes no more writes until a restart: {0}")]
    Failed(String),
    /// The disk is too full to take the write: `free_bytes` left, `min_free_bytes` kept in
    /// reserve. Nothing was written; the same write succeeds once space is freed.
    #[error(
        "the data directory's filesystem is full: {free_bytes} bytes free, {min_free_bytes} kept in reserve; writes resume once space is freed"
    )]
    Full {
        free_bytes: u64,
        min_free_bytes: u64,
    },
}

impl StoreError {
    /// Whether the write failed for want of disk space (and may succeed later as it is).
    pub fn is_full(&self) -> bool {
        match self {
            StoreError::Full { .. } => true,
            StoreError::Io(error) => error.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }
}

/// What one pass of retention removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compacted {
    /// Ended tasks removed (with their payloads and idempotency keys), by state code.
    pub tasks_by_state: [u64; 12],
    pub tasks: usize,
    /// Blocks of the event log removed, and worker log entries.
    pub event_blocks: usize,
    pub worker_events: usize,
    /// Whether the pass stopped at its bound with more to remove.
    pub more: bool,
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

/// A commit a store across the network has encoded ahead of sending it
/// (`Store::prepare_commit`), opaque to everyone but that store.
pub struct PreparedCommit(Box<dyn std::any::Any + Send>);

impl PreparedCommit {
    pub fn new<T: std::any::Any + Send>(encoded: T) -> Self {
        PreparedCommit(Box::new(encoded))
    }

    /// The encoded commit, if it is a `T`.
    pub fn into_inner<T: std::any::Any>(self) -> Option<T> {
        self.0.downcast::<T>().ok().map(|encoded| *encoded)
    }
}

/// The operations the scheduler needs, named for what they do rather than how a backend does them,
/// so that another backend (PostgreSQL, for several replicas) can stand behind the same trait.
pub trait Store: Send + Sync + 'static {
    /// Applies `change` atomically. It is visible to readers at once and durable after the
    /// next `sync`.
    fn commit(&self, change: &Change) -> Result<(), StoreError>;
    /// Encodes `change` for `commit_prepared`, with no I/O, so that a group can be encoded on
    /// one thread while another group is on its way to the store. `None`: this store encodes
    /// as it commits.
    fn prepare_commit(&self, _change: &Change) -> Result<Option<PreparedCommit>, StoreError> {
        Ok(None)
    }
    /// Commits `change` as `commit` does, sending what `prepare_commit` encoded from it.
    fn commit_prepared(
        &self,
        change: &Change,
        _prepared: PreparedCommit,
    ) -> Result<(), StoreError> {
        self.commit(change)
    }
    /// Makes every change committed before this call durable on disk.
    fn sync(&self) -> Result<(), StoreError>;
    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError>;
    fn payload(&self, id: TaskId) -> Result<Option<Vec<u8>>, StoreError>;
    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError>;
    /// The payloads of `ids`, in their order: one read for a claim's leases, which a store
    /// across the network answers in one round trip instead of one per task.
    fn payloads(&self, ids: &[TaskId]) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        ids.iter().map(|&id| self.payload(id)).collect()
    }
    /// The records of `keys` that exist, by key: read once for a group's submissions before
    /// they are planned, by a store whose reads are round trips (`is_remote`).
    fn keys(&self, keys: &[&str]) -> Result<HashMap<String, KeyRecord>, StoreError> {
        let mut found = HashMap::new();
        for &key in keys {
            if let Some(record) = self.key(key)? {
                found.insert(key.to_owned(), record);
            }
        }
        Ok(found)
    }
    /// Whether each call is a round trip to another process (a database server), so that
    /// callers should read in batches ahead and keep a commit in flight while they plan the
    /// next (the embedded store's reads cost microseconds and its commit is a log append).
    fn is_remote(&self) -> bool {
        false
    }
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
    /// The `seq` of the oldest event the log still holds (1 when nothing was ever removed):
    /// events before it were removed by retention.
    fn first_event_seq(&self) -> Result<u64, StoreError> {
        Ok(1)
    }
    /// Retention: removes up to `max_tasks` ended tasks last changed before `cutoff_ms` (with
    /// their payloads and keys, but never one whose callback is still due or whose worker has
    /// not stopped), and the event and worker log entries from before it, always keeping the
    /// newest of each. Runs beside the writer, never holding it up for long.
    fn compact(&self, cutoff_ms: u64, max_tasks: usize) -> Result<Compacted, StoreError> {
        let _ = (cutoff_ms, max_tasks);
        Ok(Compacted::default())
    }
    /// `Full` while the disk is too full for a commit to be taken, so a caller can refuse work
    /// before planning it; a commit checks again itself.
    fn check_space(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// Why the store takes no more writes, once a sync has failed; `None` while it is sound.
    fn failed(&self) -> Option<String> {
        None
    }
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
    /// Stores blob `name` of `version` (replacing one of that name) with the version's record
    /// as it is now (its `data` list naming the blob), as one durable write.
    fn put_data(&self, version: &PolicyVersion, name: &str, bytes: &[u8])
    -> Result<(), StoreError>;
    /// Every data blob of a version, by name.
    fn data(&self, kind: PolicyKind, version: u32) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// Compiled code cached under `cache_key`; a cache, so losing it costs only a recompile.
    fn compiled(&self, cache_key: &str) -> Result<Option<Vec<u8>>, StoreError>;
    fn put_compiled(&self, cache_key: &str, code: &[u8]) -> Result<(), StoreError>;
    /// Every experiment's record, in id order.
    fn experiments(&self) -> Result<Vec<Experiment>, StoreError>;
    /// The concurrency limits set through the API, by key (the configuration's are not
    /// stored).
    fn concurrency_limits(&self) -> Result<Vec<ConcurrencyLimit>, StoreError>;
    /// Replaces the stored concurrency limits, as one durable write.
    fn put_concurrency_limits(&self, limits: &[ConcurrencyLimit]) -> Result<(), StoreError>;
    /// The vector collections declared through the API, by name.
    fn collections(&self) -> Result<Vec<Collection>, StoreError>;
    /// Replaces the declared collections, as one durable write.
    fn put_collections(&self, collections: &[Collection]) -> Result<(), StoreError>;
    /// Stores (or replaces) an experiment's record and logs why, as one write. The event's
    /// `seq` is assigned here.
    fn put_experiment(
        &self,
        experiment: &Experiment,
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError>;
}

/// Tokens (by id, holding only their hashes) and the audit log of admin actions. Every write
/// is atomic and durable when it returns, so an issued token survives a crash and a revoked
/// one stays revoked.
pub trait AccessCatalog: Send + Sync + 'static {
    /// Every token ever issued, revoked ones included, in id order.
    fn tokens(&self) -> Result<Vec<TokenRecord>, StoreError>;
    /// Stores (or replaces) a token's record and logs why, as one write. The event's `seq` is
    /// assigned here.
    fn put_token(&self, token: &TokenRecord, event: AuditEvent) -> Result<AuditEvent, StoreError>;
    /// Logs an admin action that changed something elsewhere (a policy, a worker).
    fn append_audit(&self, event: AuditEvent) -> Result<AuditEvent, StoreError>;
    /// The audit log after `after_seq`, oldest first, at most `limit`.
    fn audit_after(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEvent>, StoreError>;
}
