//! The writer's cache of the task records it wrote lately. A task is claimed soon after it is
//! submitted and reported soon after it is claimed, so most reads the writer makes hit here
//! instead of decoding the record from the store. Only the writer writes tasks, and it updates this
//! cache as it plans, so an entry is never older than the store; a failed commit clears it.

use sluice_model::{Task, TaskId, TaskIdMap};
use std::collections::VecDeque;

/// Records kept at most: oldest first out.
pub(crate) const CAPACITY: usize = 65_536;

#[derive(Default)]
pub(crate) struct TaskCache {
    tasks: TaskIdMap<Task>,
    /// Ids in the order they were first cached, for eviction.
    order: VecDeque<TaskId>,
}

impl TaskCache {
    pub fn get(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id)
    }

    /// Keeps `task` as written; an ended task is dropped instead. It is rarely read again (its
    /// callback, if any, once per attempt), and its record carries its result, up to
    /// `max_result_bytes`: kept, a stalled callback receiver would have the cache hold that
    /// much for each of its entries.
    pub fn put(&mut self, task: &Task) {
        if task.state.is_terminal() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_engine::testing::EngineTestSupport;
    use sluice_model::{Limits, State, TaskSpec};

    fn task(n: u128, state: State) -> Task {
        let spec: TaskSpec = serde_json::from_value(serde_json::json!({"kind": "k"})).unwrap();
        let submission = spec.into_submission(None, &Limits::default()).unwrap();
        let engine = sluice_engine::Engine::default();
        let admission = submission.native_admission(0);
        let mut task = engine
            .test_plan_create(1, n, &submission, &admission)
            .writes
            .remove(0)
            .task;
        task.state = state;
        task
    }

    #[test]
    fn ended_tasks_are_not_kept_and_the_oldest_go_first() {
        let mut cache = TaskCache::default();
        let running = task(1, State::Running);
        cache.put(&running);
        assert!(cache.get(running.id).is_some());
        let mut ended = running.clone();
        ended.state = State::Completed;
        ended.callback_url = Some("http://example.test/done".into());
        ended.callback = Some(sluice_model::Callback {
            attempts: 0,
            next_at_ms: 0,
            delivered_at_ms: None,
            gave_up: false,
        });
        assert!(ended.callback_pending());
        cache.put(&ended);
        assert!(
            cache.get(running.id).is_none(),
            "an ended task is dropped, callback or not"
        );
        for n in 0..(CAPACITY as u128 + 10) {
            cache.put(&task(1_000 + n, State::Queued));
        }
        assert_eq!(cache.tasks.len(), CAPACITY);
        assert!(cache.get(task(1_000, State::Queued).id).is_none());
    }
}
