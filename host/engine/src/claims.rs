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

impl Engine {
    /// Picks up to `max` tasks for `worker`. Nothing changes but the round robin's position
    /// and the breaker (which may turn half-open here: that change is returned as an event for
    /// the caller's change). Grant each pick with `plan_claim`.
    pub fn pick(
        &mut self,
        now_ms: u64,
        worker_id: &str,
        max: usize,
    ) -> (Result<Vec<Pick>, NoClaim>, Option<WorkerEvent>) {
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
        let want = max.min(allowed).min(slots);
        let mut free_gpus = worker.free_gpus();
        if free_gpus.is_empty() && !worker.heartbeat.gpus.is_empty() {
            // Every place on its GPUs is taken: nothing can fit until a lease ends.
            return (Err(NoClaim::Full), event);
        }
        let mut chosen: BTreeSet<TaskId> = BTreeSet::new();
        // Tasks of each concurrency key this claim has picked so far.
        let mut picked_keys = Picked::default();
        let mut picks = Vec::with_capacity(want);
        // Urgent tasks whose place a preemption freed here go first.
        for task in self.reserved_for(worker_id) {
            if picks.len() >= want {
                break;
            }
            let Some(waiting) = self.queues.get(task) else {
                continue;
            };
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
            self.queues.charge(bucket, tenant, &self.tenant_weights);
            if let Some(room) = gpu.and_then(|gpu| free_gpus.get_mut(&gpu)) {
                let memory_mb = self.queues.get(task).map_or(0, |w| w.gpu_memory_mb);
                room.take(memory_mb);
                if room.places == 0 {
                    free_gpus.retain(|_, room| room.places > 0);
                }
            }
            picked_keys.add(self.queues.get(task).and_then(|w| w.concurrency_key()));
            chosen.insert(task);
            picks.push(Pick { task, gpu });
        }
        // A claim never takes more than the worker has room for.
        debug_assert!(
            picks.len() <= slots,
            "{} picks for {slots} free slots",
            picks.len()
        );
        (Ok(picks), event)
    }

    /// Plans the grant of `pick` to `worker`: Queued → Claimed, the next attempt, a lease
    /// whose token is drawn from `random`.
    pub(crate) fn plan_claim(
        &mut self,
        now_ms: u64,
        random: u128,
        task: &Task,
        worker: &str,
        gpu: Option<u32>,
        claim_id: Option<&str>,
    ) -> Result<Change, sluice_model::IllegalTransition> {
        let lease_ms = self.options.lease_ms;
        let attempt = task.attempt.saturating_add(1);
        let lease = Lease {
            worker: worker.to_owned(),
            token: format!("{random:032x}"),
            attempt,
            expires_at_ms: now_ms.saturating_add(lease_ms),
            attempt_ends_at_ms: now_ms.saturating_add(task.attempt_timeout_ms.max(1)),
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
