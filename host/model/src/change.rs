//! What one step of the engine asks the store to make durable, and what a store hands back at
//! start: the storage API's data, defined apart from any backend so the engine never imports one.

use super::{Event, QueueEntry, State, Task, TaskId, WorkerEvent};

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
