//! Concurrency keys in the engine: which leased tasks hold each key (counted while a task holds
//! its worker's place), and the limits claims respect.

use crate::model::{ConcurrencyLimits, TaskId};
use std::collections::HashMap;

/// The leased tasks that hold a concurrency key, and how many per key.
#[derive(Debug, Default)]
pub struct KeyUse {
    holders: HashMap<TaskId, String>,
    running: HashMap<String, u32>,
}

impl KeyUse {
    /// `task` holds `key` (again: counted once).
    pub fn hold(&mut self, task: TaskId, key: &str) {
        if self.holders.contains_key(&task) {
            return;
        }
        self.holders.insert(task, key.to_owned());
        *self.running.entry(key.to_owned()).or_default() += 1;
    }

    /// `task` holds its key no more.
    pub fn release(&mut self, task: TaskId) {
        let Some(key) = self.holders.remove(&task) else {
            return;
        };
        if let Some(count) = self.running.get_mut(&key) {
            debug_assert!(*count > 0, "a key released more often than held");
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.running.remove(&key);
            }
        }
    }

    /// Leased tasks holding `key`.
    pub fn running(&self, key: &str) -> u32 {
        self.running.get(key).copied().unwrap_or(0)
    }

    /// Each key held now, with how many.
    pub fn all(&self) -> impl Iterator<Item = (&str, u32)> {
        self.running
            .iter()
            .map(|(key, &count)| (key.as_str(), count))
    }
}

/// Whether one more task of `key` may be leased, with `picked` more of it already chosen by
/// the claim being planned.
pub fn has_room(limits: &ConcurrencyLimits, used: &KeyUse, key: &str, picked: u32) -> bool {
    limits
        .limit(key)
        .is_none_or(|limit| used.running(key).saturating_add(picked) < limit)
}
