//! The workers the engine knows: what each last said in a heartbeat, the leases it holds (and
//! on which GPU), and its circuit breaker. Held in memory only: workers heartbeat again after
//! a restart, and the leases they held are rebuilt from the tasks.

use super::breaker::{Breaker, BreakerState};
use super::collections::HeartbeatRefused;
use super::queues::Waiting;
use serde::Serialize;
use sluice_model::{Actor, Heartbeat, TaskId, WorkerEvent};
use std::collections::BTreeMap;

/// The part of one GPU a lease occupies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuShare {
    pub gpu: u32,
    pub memory_mb: u64,
}

/// One lease a worker holds, as far as placement and preemption need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub share: Option<GpuShare>,
    /// The bucket it was claimed from, and whether an urgent task may stop it.
    pub bucket: sluice_model::Priority,
    pub preemptible: bool,
    /// When it was claimed: of two equal candidates, the younger attempt is preempted.
    pub claimed_at_ms: u64,
    pub revoked: bool,
}

/// What is left of one GPU for more leases: places (tasks it may still take) and memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuRoom {
    pub places: u32,
    pub memory_mb: u64,
    /// Its whole memory, so the smallest GPU that fits is taken and large ones stay free.
    pub total_memory_mb: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerState {
    pub heartbeat: Heartbeat,
    /// None for a worker known only from leases recovered at start.
    pub last_heartbeat_ms: Option<u64>,
    /// Each lease it holds, with the GPU it occupies and how much of that GPU's memory.
    pub leases: BTreeMap<TaskId, Held>,
    pub breaker: Breaker,
    pub claims_served: u64,
    /// When an urgent task last preempted one of its attempts: at most one a preemption
    /// interval.
    pub last_preempted_ms: Option<u64>,
}

impl WorkerState {
    fn new() -> Self {
        WorkerState {
            heartbeat: Heartbeat::default(),
            last_heartbeat_ms: None,
            leases: BTreeMap::new(),
            breaker: Breaker::default(),
            claims_served: 0,
            last_preempted_ms: None,
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

    /// Tasks one GPU runs at once: `max_concurrency` spread over the GPUs, rounded up (so a
    /// worker with one GPU and `max_concurrency` 4 runs four tasks on it).
    pub fn places_per_gpu(&self) -> u32 {
        let gpus = self.heartbeat.gpus.len().max(1) as u32;
        self.heartbeat.max_concurrency.max(1).div_ceil(gpus)
    }

    /// Each GPU Sluice may use that has a place and memory left, by index in the heartbeat.
    pub fn free_gpus(&self) -> BTreeMap<u32, GpuRoom> {
        self.free_gpus_without(None)
    }

    /// `free_gpus` as it would be were the lease of `freed` over.
    pub fn free_gpus_without(&self, freed: Option<TaskId>) -> BTreeMap<u32, GpuRoom> {
        let places = self.places_per_gpu();
        let mut rooms: BTreeMap<u32, GpuRoom> = (0u32..)
            .zip(&self.heartbeat.gpus)
            .filter(|(_, gpu)| gpu.free)
            .map(|(index, gpu)| {
                let room = GpuRoom {
                    places,
                    memory_mb: gpu.memory_mb,
                    total_memory_mb: gpu.memory_mb,
                };
                (index, room)
            })
            .collect();
        let shares = self
            .leases
            .iter()
            .filter(|(id, _)| Some(**id) != freed)
            .filter_map(|(_, held)| held.share);
        for share in shares {
            if let Some(room) = rooms.get_mut(&share.gpu) {
                room.take(share.memory_mb);
            }
        }
        rooms.retain(|_, room| room.places > 0);
        rooms
    }

    /// Whether `task` may run here with the room in `free_gpus` (its labels and kind must
    /// match): `Some(gpu)` says where — the smallest GPU whose memory left fits it, the less
    /// loaded of equal ones — and `Some(None)` that it needs no GPU.
    pub fn fit(&self, task: &Waiting, free_gpus: &BTreeMap<u32, GpuRoom>) -> Option<Option<u32>> {
        let labels_match = task
            .labels()
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
        // The GPU that has its model loaded, when it has the room.
        let warm = task
            .model()
            .and_then(|model| self.heartbeat.gpu_with(model))
            .filter(|gpu| {
                free_gpus
                    .get(gpu)
                    .is_some_and(|room| room.memory_mb >= task.gpu_memory_mb)
            });
        if warm.is_some() {
            return Some(warm);
        }
        free_gpus
            .iter()
            .filter(|(_, room)| room.memory_mb >= task.gpu_memory_mb)
            .min_by_key(|&(&index, room)| (room.total_memory_mb, u32::MAX - room.places, index))
            .map(|(&index, _)| Some(index))
    }
}

impl GpuRoom {
    /// Takes one place and `memory_mb` of memory for a lease.
    pub fn take(&mut self, memory_mb: u64) {
        self.places = self.places.saturating_sub(1);
        self.memory_mb = self.memory_mb.saturating_sub(memory_mb);
    }
}

/// A worker as `GET /v1/workers` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

    pub fn iter(&self) -> impl Iterator<Item = (&String, &WorkerState)> {
        self.by_id.iter()
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

    pub fn hold(&mut self, worker: &str, task: TaskId, held: Held) {
        self.entry(worker).leases.insert(task, held);
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
            // A heartbeat may say any memory per GPU: the sum saturates rather than wraps.
            free_gpu_memory_mb: free
                .values()
                .fold(0u64, |sum, room| sum.saturating_add(room.memory_mb)),
            heartbeat: self.heartbeat.clone(),
        }
    }
}

impl super::Engine {
    /// Registers or refreshes a worker. A new worker past `max_workers` is refused, so the
    /// table stays bounded whatever ids callers send; so is a shard worker whose vectors do
    /// not fit the collection it names (the worker keeps its last accepted heartbeat).
    pub fn heartbeat(
        &mut self,
        now_ms: u64,
        worker: &str,
        heartbeat: Heartbeat,
    ) -> Result<(), HeartbeatRefused> {
        if self.workers.get(worker).is_none() && self.workers.len() >= self.options.max_workers {
            return Err(HeartbeatRefused::TooManyWorkers {
                max: self.options.max_workers,
            });
        }
        if let Some(announced) = &heartbeat.vectors
            && let Some(why) = self.announcement_refused(now_ms, worker, announced)
        {
            return Err(HeartbeatRefused::CollectionMismatch(why));
        }
        let state = self.workers.entry(worker);
        if state.heartbeat.loaded_models != heartbeat.loaded_models {
            self.warm_models.update(
                worker,
                state
                    .heartbeat
                    .loaded_models
                    .iter()
                    .map(|m| m.name.as_str()),
                heartbeat.loaded_models.iter().map(|m| m.name.as_str()),
            );
        }
        state.heartbeat = heartbeat;
        state.last_heartbeat_ms = Some(now_ms);
        Ok(())
    }

    /// Forgets long-silent workers that hold nothing, so the table stays bounded.
    pub fn forget_silent_workers(&mut self, now_ms: u64) {
        self.workers
            .forget_silent(now_ms, self.options.forget_worker_ms);
        let workers = &self.workers;
        self.warm_models
            .retain_workers(|worker| workers.get(worker).is_some());
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
