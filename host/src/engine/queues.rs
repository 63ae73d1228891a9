//! Bucket queues: the tasks waiting in each priority bucket, in arrival order.

use crate::model::{Priority, TaskId};
use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub struct BucketQueues {
    buckets: [BTreeSet<TaskId>; 3],
    bucket_of: HashMap<TaskId, Priority>,
}

impl BucketQueues {
    pub fn push(&mut self, bucket: Priority, id: TaskId) {
        if let Some(old) = self.bucket_of.insert(id, bucket) {
            self.buckets[old.index()].remove(&id);
        }
        self.buckets[bucket.index()].insert(id);
    }

    pub fn remove(&mut self, id: TaskId) -> Option<Priority> {
        let bucket = self.bucket_of.remove(&id)?;
        self.buckets[bucket.index()].remove(&id);
        Some(bucket)
    }

    pub fn len(&self, bucket: Priority) -> usize {
        self.buckets[bucket.index()].len()
    }

    pub fn total(&self) -> usize {
        self.bucket_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bucket_of.is_empty()
    }

    /// The oldest task waiting in `bucket`.
    pub fn front(&self, bucket: Priority) -> Option<TaskId> {
        self.buckets[bucket.index()].first().copied()
    }
}
