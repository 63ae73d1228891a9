//! The writer's cache of the task records it wrote lately. A task is claimed soon after it is
//! submitted and reported soon after it is claimed, so most reads the writer makes hit here
//! instead of decoding the record from the store. Only the writer writes tasks, and it updates this
//! cache as it plans, so an entry is never older than the store; a failed commit clears it.

use crate::model::{Task, TaskId};
use std::collections::{HashMap, VecDeque};

/// Records kept at most: oldest first out.
pub(crate) const CAPACITY: usize = 65_536;

#[derive(Default)]
pub(crate) struct TaskCache {
    tasks: HashMap<TaskId, Task>,
    /// Ids in the order they were first cached, for eviction.
    order: VecDeque<TaskId>,
}

impl TaskCache {
    pub fn get(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id)
    }

    /// Keeps `task` as written; a task that will not be read again (ended, nothing left to
    /// deliver) is dropped instead.
    pub fn put(&mut self, task: &Task) {
        if task.state.is_terminal() && !task.callback_pending() {
            self.tasks.remove(&task.id);
            return;
        }
        if self.tasks.insert(task.id, task.clone()).is_none() {
            self.order.push_back(task.id);
        }
        while self.order.len() > CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.tasks.remove(&old);
            }
        }
    }

    pub fn clear(&mut self) {
        self.tasks.clear();
        self.order.clear();
    }
}
