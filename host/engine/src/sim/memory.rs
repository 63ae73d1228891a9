//! The driver's store: every task record, payload, key and event in memory, committed whole
//! with each step. What the engine reads through `Read`, and what a run's checks look at.

use crate::Read;
use sluice_model::{Change, Event, KeyRecord, State, Task, TaskId, TaskIdMap, WorkerEvent};
use sluice_store::StoreError;
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Default)]
pub struct MemoryStore {
    /// In id order, so a walk over the tasks is the same in every run.
    tasks: BTreeMap<TaskId, Task>,
    payloads: TaskIdMap<Vec<u8>>,
    keys: HashMap<String, KeyRecord>,
    events: Vec<Event>,
    worker_events: Vec<WorkerEvent>,
}

impl super::SimStore for MemoryStore {
    fn commit(&mut self, change: Change) {
        for new in change.new_tasks {
            if let Some((key, record)) = new.key {
                self.keys.insert(key, record);
            }
            self.payloads.insert(new.id, new.payload_json);
        }
        for write in change.writes {
            self.tasks.insert(write.task.id, write.task);
        }
        debug_assert!(
            change
                .events
                .first()
                .is_none_or(|e| e.seq == self.events.len() as u64 + 1),
            "the event log is gap-free"
        );
        self.events.extend(change.events);
        self.worker_events.extend(change.worker_events);
    }
}

impl MemoryStore {
    pub fn get(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id)
    }

    pub fn payload(&self, id: TaskId) -> Option<&[u8]> {
        self.payloads.get(&id).map(Vec::as_slice)
    }

    /// Every task, in id order.
    pub fn tasks(&self) -> impl Iterator<Item = &Task> {
        self.tasks.values()
    }

    /// The whole event log, oldest first.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    pub fn worker_events(&self) -> &[WorkerEvent] {
        &self.worker_events
    }

    /// Tasks per state.
    pub fn states(&self) -> BTreeMap<State, usize> {
        let mut counts = BTreeMap::new();
        for task in self.tasks.values() {
            *counts.entry(task.state).or_default() += 1;
        }
        counts
    }
}

impl Read for MemoryStore {
    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        Ok(self.tasks.get(&id).cloned())
    }

    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        Ok(self.keys.get(key).copied())
    }
}
