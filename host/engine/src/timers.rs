//! The deadline index: for each task with something due (a lease to expire, an attempt to
//! time out, a retry to release, a split parent's merge deadline, an overall deadline), the
//! earliest such time. The reaper
//! reads what is due from here, never by scanning tasks.

use sluice_model::{State, Task, TaskId, TaskIdMap};
use std::collections::BTreeSet;

#[derive(Debug, Default)]
pub struct Timers {
    by_time: BTreeSet<(u64, TaskId)>,
    at: TaskIdMap<u64>,
}

/// The earliest moment something is due for `task` in its state.
pub fn due_at(task: &Task) -> Option<u64> {
    let own = match task.state {
        State::Claimed | State::Running => task
            .lease
            .as_ref()
            .map(|lease| lease.expires_at_ms.min(lease.attempt_ends_at_ms)),
        State::RetryWait => task.not_before_ms,
        State::Split => task.family.as_ref().and_then(|f| f.merge_at_ms),
        _ => {
            // A place held after the task ended is freed when the lease runs out.
            let held = task
                .lease
                .as_ref()
                .filter(|lease| lease.holds_place_after_end())
                .map(|lease| lease.expires_at_ms);
            let callback = task
                .callback
                .as_ref()
                .filter(|_| task.callback_pending())
                .map(|c| c.next_at_ms);
            earliest(held, callback)
        }
    };
    let deadline = if task.state.check(State::TimedOut).is_ok() {
        task.deadline_at_ms
    } else {
        None
    };
    earliest(own, deadline)
}

fn earliest(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

impl Timers {
    pub fn set(&mut self, id: TaskId, at_ms: Option<u64>) {
        if let Some(old) = self.at.remove(&id) {
            self.by_time.remove(&(old, id));
        }
        if let Some(at_ms) = at_ms {
            self.at.insert(id, at_ms);
            self.by_time.insert((at_ms, id));
        }
    }

    /// Tasks due at or before `now_ms`, earliest first, at most `limit`.
    pub fn due(&self, now_ms: u64, limit: usize) -> Vec<TaskId> {
        self.by_time
            .iter()
            .take_while(|(at, _)| *at <= now_ms)
            .take(limit)
            .map(|&(_, id)| id)
            .collect()
    }

    pub fn next_at(&self) -> Option<u64> {
        self.by_time.first().map(|&(at, _)| at)
    }
}
