//! The workers the engine knows: what each last said in a heartbeat, the leases it holds (and
//! on which GPU), and its circuit breaker. Held in memory only: workers heartbeat again after
//! a restart, and the leases they held are rebuilt from the tasks.

use super::breaker::{Breaker, BreakerState};
use super::queues::Waiting;
use crate::model::{Actor, Heartbeat, TaskId, WorkerEvent};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerState {
    pub heartbeat: Heartbeat,
    /// None for a worker known only from leases recovered at start.
    pub last_heartbeat_ms: Option<u64>,
    /// Each lease it holds, with the GPU it occupies.
    pub leases: BTreeMap<TaskId, Option<u32>>,
    pub breaker: Breaker,
    pub claims_served: u64,
}

impl WorkerState {
    fn new() -> Self {
        WorkerState {
            heartbeat: Heartbeat::default(),
            last_heartbeat_ms: None,
            leases: BTreeMap::new(),
            breaker: Breaker::default(),
            claims_served: 0,
        }
    }

    pub fn is_fresh(&self, now_ms: u64, stale_after_ms: u64) -> bool {
        self.last_heartbeat_ms
            .is_some_and(|at| now_ms.saturating_sub(at) <= stale_after_ms)
    }

    /// Leases it may still take, by its own `max_concurrency`.
    pub fn free_slots(&self) -> usize {
        (self.heartbeat.max_concurrency as usize).saturating_sub(self.leases.len())
    }

    /// GPUs Sluice may use and no lease of this worker occupies.
    pub fn free_gpus(&self) -> BTreeSet<u32> {
        let taken: BTreeSet<u32> = self.leases.values().flatten().copied().collect();
        (0u32..)
            .zip(&self.heartbeat.gpus)
            .filter(|(index, gpu)| gpu.free && !taken.contains(index))
            .map(|(index, _)| index)
            .collect()
    }

    /// Whether `task` may run here with the GPUs in `free_gpus` (its labels and kind must
    /// match): `Some(gpu)` says where
    /// (the smallest GPU that fits, so large ones stay for large tasks), `Some(None)` that
    /// it needs no GPU.
    pub fn fit(&self, task: &Waiting, free_gpus: &BTreeSet<u32>) -> Option<Option<u32>> {
        let labels_match = task
            .labels
            .iter()
            .all(|(name, value)| self.heartbeat.labels.get(name) == Some(value));
        let kind_served = self.heartbeat.kinds.is_empty()
            || self
                .heartbeat
                .kinds
                .iter()
                .any(|kind| policy_packed::name_code(kind) == task.view.kind);
        if !labels_match || !kind_served {
            return None;
        }
        if self.heartbeat.gpus.is_empty() {
            return (task.gpu_memory_mb == 0).then_some(None);
        }
        free_gpus
            .iter()
            .filter_map(|&index| {
                let gpu = self.heartbeat.gpus.get(index as usize)?;
                (gpu.memory_mb >= task.gpu_memory_mb).then_some((gpu.memory_mb, index))
            })
            .min()
            .map(|(_, index)| Some(index))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the scheduler already knows {max} workers; silent ones are forgotten after a while")]
pub struct TooManyWorkers {
    pub max: usize,
}

/// A worker as `GET /v1/workers` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WorkerView {
    pub id: String,
    pub healthy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_age_ms: Option<u64>,
    pub breaker: BreakerState,
    pub leases: usize,
    pub claims_served: u64,
    pub free_gpus: usize,
    pub free_gpu_memory_mb: u64,
    #[serde(flatten)]
    pub heartbeat: Heartbeat,
}

#[derive(Debug, Default)]
pub struct Workers {
    by_id: BTreeMap<String, WorkerState>,
}

impl Workers {
    pub fn get(&self, id: &str) -> Option<&WorkerState> {
        self.by_id.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut WorkerState> {
        self.by_id.get_mut(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn entry(&mut self, id: &str) -> &mut WorkerState {
        self.by_id
            .entry(id.to_owned())
            .or_insert_with(WorkerState::new)
    }

    pub fn hold(&mut self, worker: &str, task: TaskId, gpu: Option<u32>) {
        self.entry(worker).leases.insert(task, gpu);
    }

    pub fn release(&mut self, worker: &str, task: TaskId) {
        if let Some(state) = self.by_id.get_mut(worker) {
            state.leases.remove(&task);
        }
    }

    /// Forgets workers silent for `forget_after_ms` that hold no lease.
    pub fn forget_silent(&mut self, now_ms: u64, forget_after_ms: u64) {
        self.by_id.retain(|_, w| {
            !w.leases.is_empty()
                || w.last_heartbeat_ms
                    .is_some_and(|at| now_ms.saturating_sub(at) <= forget_after_ms)
        });
    }

    pub fn views(&self, now_ms: u64, stale_after_ms: u64) -> Vec<WorkerView> {
        self.by_id
            .iter()
            .map(|(id, w)| w.view(id, now_ms, stale_after_ms))
            .collect()
    }
}

impl WorkerState {
    fn view(&self, id: &str, now_ms: u64, stale_after_ms: u64) -> WorkerView {
        let free = self.free_gpus();
        WorkerView {
            id: id.to_owned(),
            healthy: self.is_fresh(now_ms, stale_after_ms),
            heartbeat_age_ms: self.last_heartbeat_ms.map(|at| now_ms.saturating_sub(at)),
            breaker: self.breaker.state(),
            leases: self.leases.len(),
            claims_served: self.claims_served,
            free_gpus: free.len(),
            free_gpu_memory_mb: free
                .iter()
                .filter_map(|&i| self.heartbeat.gpus.get(i as usize))
                .map(|g| g.memory_mb)
                .sum(),
            heartbeat: self.heartbeat.clone(),
        }
    }
}

impl super::Engine {
    /// Registers or refreshes a worker. A new worker past `max_workers` is refused, so the
    /// table stays bounded whatever ids callers send.
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        worker: &str,
        heartbeat: Heartbeat,
    ) -> Result<(), TooManyWorkers> {
        if self.workers.get(worker).is_none() && self.workers.len() >= self.options.max_workers {
            return Err(TooManyWorkers {
                max: self.options.max_workers,
            });
        }
        let state = self.workers.entry(worker);
        state.heartbeat = heartbeat;
        state.last_heartbeat_ms = Some(now_ms);
        Ok(())
    }

    /// Forgets long-silent workers that hold nothing, so the table stays bounded.
    pub fn forget_silent_workers(&mut self, now_ms: u64) {
        self.workers
            .forget_silent(now_ms, self.options.forget_worker_ms);
    }

    pub fn workers(&self, now_ms: u64) -> Vec<WorkerView> {
        self.workers.views(now_ms, self.options.worker_stale_ms)
    }

    pub fn worker(&self, now_ms: u64, worker: &str) -> Option<WorkerView> {
        self.workers
            .get(worker)
            .map(|state| state.view(worker, now_ms, self.options.worker_stale_ms))
    }

    pub fn knows_worker(&self, worker: &str) -> bool {
        self.workers.get(worker).is_some()
    }

    /// Closes a worker's breaker by hand; the change, if any, as a worker event.
    pub fn reset_worker(&mut self, now_ms: u64, worker: &str, actor: Actor) -> Option<WorkerEvent> {
        let change = self.workers.get_mut(worker)?.breaker.reset()?;
        Some(self.log_worker_event(now_ms, worker, actor, change))
    }
}
