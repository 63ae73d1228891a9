//! Warm-model placement: which workers hold which model loaded (from their heartbeats), and
//! whether a task naming a model should wait for one of them rather than go to a worker that
//! would have to load it — for at most `affinity_wait_ms` after it entered its bucket.

use super::workers::WorkerState;
use super::{Engine, Waiting};
use std::collections::{BTreeMap, BTreeSet};

/// Model name → the workers whose last heartbeat lists it loaded.
#[derive(Debug, Default)]
pub struct WarmModels {
    by_model: BTreeMap<String, BTreeSet<String>>,
}

impl WarmModels {
    /// `worker`'s loaded models are now `models` (its earlier list is forgotten).
    pub fn update<'a>(
        &mut self,
        worker: &str,
        before: impl IntoIterator<Item = &'a str>,
        now: impl IntoIterator<Item = &'a str>,
    ) {
        for model in before {
            if let Some(workers) = self.by_model.get_mut(model) {
                workers.remove(worker);
                if workers.is_empty() {
                    self.by_model.remove(model);
                }
            }
        }
        for model in now {
            self.by_model
                .entry(model.to_owned())
                .or_default()
                .insert(worker.to_owned());
        }
    }

    /// Forgets the workers `known` says are gone.
    pub fn retain_workers(&mut self, known: impl Fn(&str) -> bool) {
        self.by_model.retain(|_, workers| {
            workers.retain(|worker| known(worker));
            !workers.is_empty()
        });
    }

    pub fn holders(&self, model: &str) -> impl Iterator<Item = &String> {
        self.by_model.get(model).into_iter().flatten()
    }
}

impl Engine {
    /// Whether `task` should be left for a fresh worker that has its model loaded rather than
    /// be placed on `worker` (`worker_id`), which has not: only while it has waited less than
    /// `affinity_wait_ms` in its bucket.
    pub(super) fn waits_for_warm(
        &self,
        now_ms: u64,
        worker_id: &str,
        worker: &WorkerState,
        task: &Waiting,
    ) -> bool {
        let Some(model) = task.model() else {
            return false;
        };
        if worker.heartbeat.gpu_with(model).is_some()
            || now_ms.saturating_sub(task.view.bucket_since_ms) >= self.options.affinity_wait_ms
        {
            return false;
        }
        let stale_after_ms = self.options.worker_stale_ms;
        self.warm_models.holders(model).any(|other| {
            other != worker_id
                && self
                    .workers
                    .get(other)
                    .is_some_and(|state| state.is_fresh(now_ms, stale_after_ms))
        })
    }

    /// The most GPU memory any known worker has on one GPU: a task that needs more can run
    /// nowhere yet.
    pub fn largest_gpu_memory_mb(&self) -> Option<u64> {
        self.workers
            .iter()
            .flat_map(|(_, state)| state.heartbeat.gpus.iter().map(|gpu| gpu.memory_mb))
            .max()
    }
}
