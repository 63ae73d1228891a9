//! Gauges of the present state — tasks by state, queues, workers, active policies — set from
//! the scheduler's snapshot at each scrape rather than tracked on every change.

use super::tasks::BucketLabels;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_engine::{Snapshot, WorkerView};
use sluice_model::State;
use sluice_policy_runtime::KindStatus;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a scrape reads: the engine's snapshot, the workers and the policies, at `now_ms`.
pub struct Present<'a> {
    pub now_ms: u64,
    pub snapshot: &'a Snapshot,
    pub workers: &'a [WorkerView],
    pub policies: &'a [KindStatus],
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    worker: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BreakerLabels {
    worker: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyKindLabels {
    kind: &'static str,
}

const BREAKER_STATES: [&str; 3] = ["closed", "open", "half_open"];

type SecondsGauge = Gauge<f64, AtomicU64>;

#[derive(Debug, Default)]
pub struct StateGauges {
    tasks: Family<StateLabels, Gauge>,
    queued: Family<BucketLabels, Gauge>,
    oldest_wait: Family<BucketLabels, SecondsGauge>,
    bucket_weight: Family<BucketLabels, Gauge>,
    illegal_transitions: Counter,
    workers_known: Gauge,
    heartbeat_age: Family<WorkerLabels, SecondsGauge>,
    healthy: Family<WorkerLabels, Gauge>,
    free_gpus: Family<WorkerLabels, Gauge>,
    free_gpu_memory: Family<WorkerLabels, Gauge>,
    queue_depth: Family<WorkerLabels, Gauge>,
    leases: Family<WorkerLabels, Gauge>,
    breaker: Family<BreakerLabels, Gauge>,
    claims_served: Family<WorkerLabels, Counter>,
    active_version: Family<PolicyKindLabels, Gauge>,
    fallbacks: Family<PolicyKindLabels, Counter>,
    deactivations: Family<PolicyKindLabels, Counter>,
}

impl StateGauges {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register("tasks", "Tasks in each state", self.tasks.clone());
        registry.register(
            "queued_tasks",
            "Tasks waiting in each bucket's queue",
            self.queued.clone(),
        );
        registry.register(
            "queue_oldest_wait_seconds",
            "How long the task first in line of each bucket has waited since submission (0 when empty)",
            self.oldest_wait.clone(),
        );
        registry.register(
            "bucket_weight",
            "Each bucket's share of claims, from the priority policy",
            self.bucket_weight.clone(),
        );
        registry.register(
            "illegal_transitions",
            "Transitions refused because the task's state does not allow them",
            self.illegal_transitions.clone(),
        );
        registry.register("workers", "Workers known", self.workers_known.clone());
        registry.register(
            "worker_heartbeat_age_seconds",
            "Time since each worker's last heartbeat",
            self.heartbeat_age.clone(),
        );
        registry.register(
            "worker_healthy",
            "1 when a worker's heartbeat is fresh and its breaker lets it claim",
            self.healthy.clone(),
        );
        registry.register(
            "worker_free_gpus",
            "GPUs of each worker with no lease on them",
            self.free_gpus.clone(),
        );
        registry.register(
            "worker_free_gpu_memory_bytes",
            "GPU memory of each worker's free GPUs",
            self.free_gpu_memory.clone(),
        );
        registry.register(
            "worker_queue_depth",
            "Work each worker holds locally, as its heartbeat reports it",
            self.queue_depth.clone(),
        );
        registry.register(
            "worker_leases",
            "Leases each worker holds",
            self.leases.clone(),
        );
        registry.register(
            "worker_breaker_state",
            "Each worker's circuit breaker: 1 for its present state, 0 for the others",
            self.breaker.clone(),
        );
        registry.register(
            "worker_claims_served",
            "Tasks leased to each worker",
            self.claims_served.clone(),
        );
        registry.register(
            "policy_active_version",
            "The version of each policy kind that decides (0 is the built-in one)",
            self.active_version.clone(),
        );
        registry.register(
            "policy_fallbacks",
            "Decisions taken by a stand-in version because the one before it faulted",
            self.fallbacks.clone(),
        );
        registry.register(
            "policy_deactivations",
            "Versions taken out of service after too many faults",
            self.deactivations.clone(),
        );
    }

    /// Sets every gauge to `present`. Families are cleared first, so a forgotten worker's
    /// series disappear with it.
    pub(super) fn set(&self, present: &Present<'_>) {
        let snapshot = present.snapshot;
        for state in State::ALL {
            let count = snapshot.tasks_by_state.get(&state).copied().unwrap_or(0);
            self.tasks
                .get_or_create(&StateLabels {
                    state: state.as_str(),
                })
                .set(clamp(count));
        }
        for (index, bucket) in sluice_model::Priority::ALL.into_iter().enumerate() {
            let labels = BucketLabels {
                bucket: bucket.as_str(),
            };
            let queued = snapshot.queued_by_bucket.get(&bucket).copied().unwrap_or(0);
            self.queued.get_or_create(&labels).set(clamp(queued as u64));
            let waited_ms = snapshot
                .first_in_line_created_at_ms
                .get(&bucket)
                .map_or(0, |&created_ms| present.now_ms.saturating_sub(created_ms));
            self.oldest_wait
                .get_or_create(&labels)
                .set(waited_ms as f64 / 1000.0);
            let weight = snapshot.bucket_weights.get(index).copied().unwrap_or(0);
            self.bucket_weight
                .get_or_create(&labels)
                .set(i64::from(weight));
        }
        self.illegal_transitions
            .inner()
            .store(snapshot.illegal_transitions_total, Ordering::Relaxed);
        self.workers_known.set(clamp(present.workers.len() as u64));
        self.set_workers(present.workers);
        self.set_policies(present.policies);
    }

    fn set_workers(&self, workers: &[WorkerView]) {
        for family in [
            &self.healthy,
            &self.free_gpus,
            &self.free_gpu_memory,
            &self.queue_depth,
            &self.leases,
        ] {
            family.clear();
        }
        self.heartbeat_age.clear();
        self.breaker.clear();
        self.claims_served.clear();
        for worker in workers {
            let labels = WorkerLabels {
                worker: worker.id.clone(),
            };
            if let Some(age_ms) = worker.heartbeat_age_ms {
                self.heartbeat_age
                    .get_or_create(&labels)
                    .set(age_ms as f64 / 1000.0);
            }
            self.healthy
                .get_or_create(&labels)
                .set(i64::from(worker.healthy));
            self.free_gpus
                .get_or_create(&labels)
                .set(clamp(worker.free_gpus as u64));
            self.free_gpu_memory
                .get_or_create(&labels)
                .set(clamp(worker.free_gpu_memory_mb.saturating_mul(1 << 20)));
            self.queue_depth
                .get_or_create(&labels)
                .set(i64::from(worker.heartbeat.queue_depth));
            self.leases
                .get_or_create(&labels)
                .set(clamp(worker.leases as u64));
            self.claims_served
                .get_or_create(&labels)
                .inner()
                .store(worker.claims_served, Ordering::Relaxed);
            let present = worker.breaker.name();
            for state in BREAKER_STATES {
                self.breaker
                    .get_or_create(&BreakerLabels {
                        worker: worker.id.clone(),
                        state,
                    })
                    .set(i64::from(state == present));
            }
        }
    }

    fn set_policies(&self, policies: &[KindStatus]) {
        for status in policies {
            let labels = PolicyKindLabels {
                kind: status.kind.as_str(),
            };
            self.active_version
                .get_or_create(&labels)
                .set(i64::from(status.active_version));
            self.fallbacks
                .get_or_create(&labels)
                .inner()
                .store(status.counters.fallbacks_total, Ordering::Relaxed);
            self.deactivations
                .get_or_create(&labels)
                .inner()
                .store(status.counters.deactivations_total, Ordering::Relaxed);
        }
    }
}

fn clamp(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
