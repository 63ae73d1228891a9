//! A replay's store: only the tasks still live (what the engine reads back), and the figures
//! taken from each committed change as it passes — waits per bucket, retries, promotions, ends
//! — so a million-task replay holds neither the event log nor the ended tasks.

use sluice_engine::Read;
use sluice_engine::sim::SimStore;
use sluice_model::{Change, KeyRecord, Priority, State, Task, TaskId, TaskIdMap};
use sluice_store::StoreError;
use std::collections::BTreeMap;

/// What a replay counted.
#[derive(Debug, Default)]
pub struct Tally {
    /// Submission to first claim, ms, per submitted priority (urgent, normal, low), in the
    /// order the claims happened.
    pub waits_ms: [Vec<u64>; 3],
    /// Moves into RetryWait.
    pub retries: u64,
    /// Aging promotions.
    pub promotions: u64,
    /// Tasks that ended, per end state.
    pub ended: BTreeMap<State, u64>,
    /// Attempts of the tasks that ended, together.
    pub attempts_of_ended: u64,
}

#[derive(Debug, Default)]
pub struct ReplayStore {
    live: TaskIdMap<Task>,
    /// Tasks not claimed yet: when each was created, and its submitted priority.
    unclaimed: TaskIdMap<(u64, Priority)>,
    pub tally: Tally,
}

impl ReplayStore {
    /// Tasks submitted and never claimed (still queued, or ended without running).
    pub fn unclaimed(&self) -> usize {
        self.unclaimed.len()
    }
}

impl SimStore for ReplayStore {
    fn commit(&mut self, change: Change) {
        for write in change.writes {
            let task = write.task;
            // Claims count attempts from 1: a task at attempt 0 has never been claimed.
            if task.attempt == 0 && !task.state.is_terminal() {
                self.unclaimed
                    .entry(task.id)
                    .or_insert((task.created_at_ms, task.priority));
            }
            if task.state.is_terminal() {
                if self.live.remove(&task.id).is_some() {
                    *self.tally.ended.entry(task.state).or_default() += 1;
                    self.tally.attempts_of_ended += u64::from(task.attempt);
                }
                self.unclaimed.remove(&task.id);
            } else {
                self.live.insert(task.id, task);
            }
        }
        for event in change.events {
            match event.to {
                State::Claimed => {
                    if let Some((created_ms, priority)) = self.unclaimed.remove(&event.task_id) {
                        debug_assert!(event.at_ms >= created_ms, "time never goes back");
                        self.tally.waits_ms[priority.index()]
                            .push(event.at_ms.saturating_sub(created_ms));
                    }
                }
                State::RetryWait if event.from != Some(State::RetryWait) => self.tally.retries += 1,
                _ => {}
            }
            if event
                .detail
                .as_deref()
                .is_some_and(|d| d.starts_with("promoted "))
            {
                self.tally.promotions += 1;
            }
        }
    }
}

impl Read for ReplayStore {
    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        Ok(self.live.get(&id).cloned())
    }

    /// A replay submits no idempotency keys.
    fn key(&self, _key: &str) -> Result<Option<KeyRecord>, StoreError> {
        Ok(None)
    }
}
