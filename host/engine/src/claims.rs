//! Claims: which waiting tasks a worker gets. Buckets are served by smooth weighted round
//! robin over the buckets that hold a task this worker can run; inside a bucket, tenants by
//! fair share (`queues`), first in line first inside a tenant; each grant becomes a lease.

use super::breaker::{Allowance, BreakerState};
use super::concurrency::Picked;
use super::{Engine, Waiting};
use sluice_model::{Actor, Change, Lease, Priority, State, Task, TaskId, WorkerEvent};
use std::collections::BTreeSet;

/// A task picked for a worker, and the GPU it will occupy there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pick {
    pub task: TaskId,
    pub gpu: Option<u32>,
}

/// Why a claim gets nothing at all.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoClaim {
    #[error("unknown worker: send a heartbeat first")]
    UnknownWorker,
    #[error("the worker's last heartbeat is older than {stale_after_ms} ms")]
    Stale { stale_after_ms: u64 },
    #[error("the worker's circuit breaker is open until {until_ms} ms")]
    BreakerOpen { until_ms: u64 },
    #[error("the worker's circuit breaker is half-open and its probe task is still out")]
    ProbeOut,
    #[error("the worker holds as many leases as its max_concurrency")]
    Full,
    #[error("the scheduler is draining: no new claims")]
    Draining,
}

impl NoClaim {
    /// A short machine-readable code, for the API's `reason` field.
    pub fn code(&self) -> &'static str {
        match self {
            NoClaim::UnknownWorker => "unknown-worker",
            NoClaim::Stale { .. } => "stale-heartbeat",
            NoClaim::BreakerOpen { .. } => "breaker-open",
            NoClaim::ProbeOut => "probe-out",
            NoClaim::Full => "at-capacity",
            NoClaim::Draining => "draining",
        }
    }
}

/// A claim for GPU batches: tasks of one kind, model and batch key (`Waiting::batches_with`),
/// on one GPU, handed out together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchClaim {
    /// The most tasks of one batch.
    pub max_size: usize,
    /// How long a batch short of `max_size` may wait for more, counted from when its oldest
    /// task joined its bucket; each bucket's `EngineOptions::batch_wait_ms` caps it.
    pub max_wait_ms: u64,
    /// Only tasks of these models (any model when empty).
    pub models: Vec<String>,
    /// False hands out whatever there is at once: the claim cannot wait any longer.
    pub may_hold: bool,
}

/// At most this many models in one batch claim's `models`.
pub const MAX_BATCH_MODELS: usize = 16;

/// Whether a batch claim takes `waiting`: one of its models, and batched with its `first`.
fn batch_takes(
    queues: &super::BucketQueues,
    batch: Option<&BatchClaim>,
    first: Option<TaskId>,
    waiting: &Waiting,
) -> bool {
    let Some(batch) = batch else {
        return true;
    };
    let model_wanted = batch.models.is_empty()
        || waiting
            .model()
            .is_some_and(|model| batch.models.iter().any(|m| m == model));
    let with_first = first.is_none_or(|id| {
        queues
            .get(id)
            .is_some_and(|first| first.batches_with(waiting))
    });
    model_wanted && with_first
}

/// What a claim gets: its picks, or a batch still filling.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Picks {
    pub picks: Vec<Pick>,
    /// A batch short of its size that may wait for more: nothing is picked, and the claim is
    /// worth asking again at this time (or when work arrives).
    pub hold_until_ms: Option<u64>,
}

impl Engine {
    /// Picks up to `max` tasks for `worker` (with `batch`, one batch of at most its size).
    /// Nothing changes but the round robin's position and the breaker (which may turn
    /// half-open here: that change is returned as an event for the caller's change). Grant
    /// each pick with `plan_claim`.
    pub fn pick(
        &mut self,
        now_ms: u64,
        worker_id: &str,
        max: usize,
        batch: Option<&BatchClaim>,
    ) -> (Result<Picks, NoClaim>, Option<WorkerEvent>) {
        let stale_after_ms = self.options.worker_stale_ms;
        let Some(worker) = self.workers.get_mut(worker_id) else {
            return (Err(NoClaim::UnknownWorker), None);
        };
        if !worker.is_fresh(now_ms, stale_after_ms) {
            return (Err(NoClaim::Stale { stale_after_ms }), None);
        }
        if let BreakerState::HalfOpen { probe: Some(probe) } = worker.breaker.state()
            && !worker.leases.contains_key(&probe)
        {
            worker.breaker.probe_ended(probe);
        }
        let (allowance, change) = worker.breaker.allowance(now_ms);
        let event = change
            .map(|change| self.log_worker_event(now_ms, worker_id, Actor::scheduler(), change));
        let Some(worker) = self.workers.get(worker_id) else {
            return (Err(NoClaim::UnknownWorker), event);
        };
        let allowed = match allowance {
            Allowance::Any => self.options.max_claim,
            Allowance::Probe => 1,
            Allowance::None {
                until_ms: Some(until_ms),
            } => return (Err(NoClaim::BreakerOpen { until_ms }), event),
            Allowance::None { until_ms: None } => return (Err(NoClaim::ProbeOut), event),
        };
        let slots = worker.free_slots();
        if slots == 0 {
            return (Err(NoClaim::Full), event);
        }
        let batch_size = batch.map_or(usize::MAX, |b| b.max_size.max(1));
        let want = max.min(allowed).min(slots).min(batch_size);
        let mut free_gpus = worker.free_gpus();
        if free_gpus.is_empty() && !worker.heartbeat.gpus.is_empty() {
            // Every place on its GPUs is taken: nothing can fit until a lease ends.
            return (Err(NoClaim::Full), event);
        }
        let wrr_before = self.wrr.clone();
        let mut charges = Vec::new();
        let mut chosen: BTreeSet<TaskId> = BTreeSet::new();
        // Tasks of each concurrency key this claim has picked so far.
        let mut picked_keys = Picked::default();
        let mut picks = Vec::with_capacity(want);
        // A batch's first task: the others must batch with it and go to its GPU.
        let mut first: Option<TaskId> = None;
        // Urgent tasks whose place a preemption freed here go first.
        for task in self.reserved_for(worker_id) {
            if picks.len() >= want {
                break;
            }
            let Some(waiting) = self.queues.get(task) else {
                continue;
            };
            if !batch_takes(&self.queues, batch, first, waiting) {
                continue;
            }
            let key_has_room = picked_keys.has_room(
                &self.concurrency_limits,
                &self.key_use,
                waiting.concurrency_key(),
            );
            let Some(gpu) = worker.fit(waiting, &free_gpus).filter(|_| key_has_room) else {
                continue;
            };
            if let Some(room) = gpu.and_then(|gpu| free_gpus.get_mut(&gpu)) {
                room.take(waiting.gpu_memory_mb);
            }
            free_gpus.retain(|_, room| room.places > 0);
            if batch.is_some() && first.is_none() {
                first = Some(task);
                // The rest of the batch runs on the same GPU.
                free_gpus.retain(|&index, _| Some(index) == gpu);
            }
            picked_keys.add(waiting.concurrency_key());
            chosen.insert(task);
            picks.push(Pick { task, gpu });
        }
        while picks.len() < want {
            let candidates: [Option<(TaskId, Option<u32>, u32)>; 3] = Priority::ALL.map(|bucket| {
                self.queues
                    .fair_iter(bucket)
                    .take(self.options.fit_scan_limit)
                    .filter(|w: &&Waiting| !chosen.contains(&w.id))
                    .filter(|w: &&Waiting| batch_takes(&self.queues, batch, first, w))
                    .filter(|w: &&Waiting| !self.waits_for_warm(now_ms, worker_id, worker, w))
                    .filter(|w: &&Waiting| {
                        // A key at its limit holds its own tasks back, not those behind them.
                        picked_keys.has_room(
                            &self.concurrency_limits,
                            &self.key_use,
                            w.concurrency_key(),
                        )
                    })
                    .find_map(|w| {
                        let gpu = worker.fit(w, &free_gpus)?;
                        Some((w.id, gpu, w.view.tenant))
                    })
            });
            let eligible = candidates.map(|c| c.is_some());
            let Some(bucket) = self.wrr.pick(self.bucket_weights, eligible) else {
                break;
            };
            let Some((task, gpu, tenant)) = candidates[bucket.index()] else {
                break;
            };
            let charged = self.queues.charge(bucket, tenant, &self.tenant_weights);
            if batch.is_some() {
                // Only a batch claim may be held and need its charges taken back.
                charges.push(charged);
            }
            if let Some(room) = gpu.and_then(|gpu| free_gpus.get_mut(&gpu)) {
                let memory_mb = self.queues.get(task).map_or(0, |w| w.gpu_memory_mb);
                room.take(memory_mb);
                if room.places == 0 {
                    free_gpus.retain(|_, room| room.places > 0);
                }
            }
            if batch.is_some() && first.is_none() {
                first = Some(task);
                free_gpus.retain(|&index, _| Some(index) == gpu);
            }
            picked_keys.add(self.queues.get(task).and_then(|w| w.concurrency_key()));
            chosen.insert(task);
            picks.push(Pick { task, gpu });
        }
        // A claim never takes more than the worker has room for, nor a batch more than its size.
        debug_assert!(
            picks.len() <= slots && picks.len() <= batch_size,
            "{} picks for {slots} free slots and batches of {batch_size}",
            picks.len()
        );
        let hold_until_ms = batch
            .filter(|_| picks.len() < want)
            .and_then(|batch| self.batch_hold_until(now_ms, batch, &picks));
        if hold_until_ms.is_some() {
            // Nothing is leased: the round robin and fair share stand as they were.
            self.wrr = wrr_before;
            self.queues.uncharge(charges);
            picks.clear();
        }
        (
            Ok(Picks {
                picks,
                hold_until_ms,
            }),
            event,
        )
    }

    /// When a batch of `picks`, short of its size, must be handed out: none when that is now
    /// (nothing picked, the claim may not wait, or a task of it has waited its bucket's
    /// `batch_wait_ms` or the claim's `max_wait_ms` since it joined its bucket).
    fn batch_hold_until(&self, now_ms: u64, batch: &BatchClaim, picks: &[Pick]) -> Option<u64> {
        if !batch.may_hold || picks.is_empty() {
            return None;
        }
        let mut until_ms = u64::MAX;
        for pick in picks {
            let waiting = self.queues.get(pick.task)?;
            let bucket_wait_ms = self.options.batch_wait_ms[waiting.bucket.index()];
            let wait_ms = batch.max_wait_ms.min(bucket_wait_ms);
            until_ms = until_ms.min(waiting.view.bucket_since_ms.saturating_add(wait_ms));
        }
        (until_ms > now_ms).then_some(until_ms)
    }

    /// Plans the grant of `pick` to `worker`: Queued → Claimed, the next attempt, a lease
    /// whose token is drawn from `random`.
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn plan_claim(
        &mut self,
        now_ms: u64,
        random: u128,
        task: &Task,
        worker: &str,
        gpu: Option<u32>,
        claim_id: Option<&str>,
    ) -> Result<Change, sluice_model::IllegalTransition> {
        let attempt_timeout_ms = task.attempt_timeout_ms;
        self.plan_claim_within(
            now_ms,
            random,
            task,
            (worker, gpu, claim_id),
            attempt_timeout_ms,
        )
    }

    /// `plan_claim`, with the attempt given `attempt_timeout_ms` to end (a GPU batch's tasks
    /// get the batch's time).
    pub(crate) fn plan_claim_within(
        &mut self,
        now_ms: u64,
        random: u128,
        task: &Task,
        (worker, gpu, claim_id): (&str, Option<u32>, Option<&str>),
        attempt_timeout_ms: u64,
    ) -> Result<Change, sluice_model::IllegalTransition> {
        let lease_ms = self.options.lease_ms;
        let attempt = task.attempt.saturating_add(1);
        let lease = Lease {
            worker: worker.to_owned(),
            token: format!("{random:032x}"),
            attempt,
            expires_at_ms: now_ms.saturating_add(lease_ms),
            attempt_ends_at_ms: now_ms.saturating_add(attempt_timeout_ms.max(1)),
            claimed_at_ms: now_ms,
            started_at_ms: None,
            gpu,
            refusal_logged: false,
            ended_at_ms: None,
            stopped_at_ms: None,
            claim_id: claim_id.map(str::to_owned),
            revoked_at_ms: None,
            revoked_for: None,
        };
        let detail = format!("attempt {attempt} leased to worker {worker}");
        self.plan_with(
            now_ms,
            task,
            &[State::Claimed],
            Actor::worker(worker),
            Some(detail),
            |after| {
                after.attempt = attempt;
                after.first_claimed_at_ms.get_or_insert(now_ms);
                if let Some(old) = after.lease.replace(lease) {
                    after.retired_leases.push(sluice_model::RetiredLease {
                        token_sha256: sluice_model::token_digest(&old.token),
                        attempt: old.attempt,
                        worker: old.worker,
                        refusal_logged: old.refusal_logged,
                    });
                    let excess = after
                        .retired_leases
                        .len()
                        .saturating_sub(sluice_model::MAX_RETIRED_LEASES);
                    after.retired_leases.drain(..excess);
                }
                after.not_before_ms = None;
            },
        )
    }
}
