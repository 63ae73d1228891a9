//! Bucket queues: the tasks waiting in each priority bucket in (rank, id) order, each with
//! what a claim needs to match it to a worker and what the aging policy reads of it
//! (`Waiting`, the model's `QueueEntry`).

pub use crate::model::QueueEntry as Waiting;
use crate::model::{Priority, TaskId};
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub struct BucketQueues {
    order: [BTreeSet<(u64, TaskId)>; 3],
    waiting: HashMap<TaskId, Waiting>,
}

impl BucketQueues {
    /// Makes room for `additional` more tasks at once (at start, before a million pushes).
    pub fn reserve(&mut self, additional: usize) {
        self.waiting.reserve(additional);
    }

    /// Queues `entry`, replacing the same task's entry if it was already waiting.
    pub fn push(&mut self, entry: Waiting) {
        self.remove(entry.id);
        self.order[entry.bucket.index()].insert((entry.rank, entry.id));
        self.waiting.insert(entry.id, entry);
    }

    pub fn remove(&mut self, id: TaskId) -> Option<Waiting> {
        let entry = self.waiting.remove(&id)?;
        self.order[entry.bucket.index()].remove(&(entry.rank, entry.id));
        Some(entry)
    }

    pub fn get(&self, id: TaskId) -> Option<&Waiting> {
        self.waiting.get(&id)
    }

    pub fn len(&self, bucket: Priority) -> usize {
        self.order[bucket.index()].len()
    }

    pub fn total(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// The first task waiting in `bucket`.
    pub fn front(&self, bucket: Priority) -> Option<TaskId> {
        self.order[bucket.index()].first().map(|&(_, id)| id)
    }

    /// The tasks of `bucket`, first in line first.
    pub fn iter(&self, bucket: Priority) -> impl Iterator<Item = &Waiting> {
        self.order[bucket.index()]
            .iter()
            .filter_map(|(_, id)| self.waiting.get(id))
    }
}
