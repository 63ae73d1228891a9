//! Concurrency keys in the engine: which leased tasks hold each key (counted while a task holds
//! its worker's place), and the limits claims respect.

use sluice_model::{ConcurrencyLimits, TaskId, TaskIdMap};
use std::collections::HashMap;

/// The leased tasks that hold a concurrency key, and how many per key.
#[derive(Debug, Default)]
pub struct KeyUse {
    holders: TaskIdMap<String>,
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

/// The tasks of each concurrency key a claim being planned has chosen so far.
#[derive(Debug, Default)]
pub struct Picked(HashMap<String, u32>);

impl Picked {
    /// Whether one more task of `key` (none: no key) may be leased, beside those leased and
    /// those this claim chose.
    pub fn has_room(&self, limits: &ConcurrencyLimits, used: &KeyUse, key: Option<&str>) -> bool {
        key.is_none_or(|key| {
            let picked = self.0.get(key).copied().unwrap_or(0);
            limits
                .limit(key)
                .is_none_or(|limit| used.running(key).saturating_add(picked) < limit)
        })
    }

    /// The claim chose a task of `key`.
    pub fn add(&mut self, key: Option<&str>) {
        if let Some(key) = key {
            *self.0.entry(key.to_owned()).or_default() += 1;
        }
    }
}
