//! A seeded workload on the driver: devices submitting OCT tasks in three priorities and vector
//! searches that split into shard families, and simulated GPU workers that heartbeat, claim,
//! run for a drawn time and report — some flaky, some killed mid-run (they go silent holding
//! their leases, which then expire). Time moves in fixed virtual steps; nothing sleeps.

use super::Driver;
use crate::{EngineOptions, NativeDecider, Report};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_model::{
    DEFAULT_COLLECTION, FailureClass, Gpu, Heartbeat, Limits, Priority, ShardAnnouncement,
    ShardFilter, State, TaskId, TaskSpec,
};
use std::collections::BTreeMap;

/// One simulated worker.
#[derive(Clone, Debug)]
pub struct SimWorker {
    pub id: String,
    /// Attempts it runs at once.
    pub slots: u32,
    /// How long an attempt runs, drawn uniformly from this range.
    pub exec_ms: (u64, u64),
    /// Attempts that fail (transiently), per thousand.
    pub fail_per_mille: u32,
    /// From this moment on (ms after the start) it is gone: no heartbeats, no reports.
    pub killed_after_ms: Option<u64>,
    /// The vector shard it holds: it then runs only that shard's children.
    pub shard: Option<u32>,
}

impl SimWorker {
    pub fn gpu(id: &str, slots: u32) -> SimWorker {
        SimWorker {
            id: id.to_owned(),
            slots,
            exec_ms: (200, 2_000),
            fail_per_mille: 0,
            killed_after_ms: None,
            shard: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Workload {
    pub seed: u64,
    /// Submissions in all; a vector search counts once, whatever its children.
    pub tasks: usize,
    pub arrivals_per_s: u64,
    /// Submissions that are vector searches, per thousand.
    pub searches_per_mille: u32,
    /// Shards a search splits into (one child each).
    pub shards: u32,
    pub workers: Vec<SimWorker>,
    /// The virtual time one step of the loop moves on.
    pub step_ms: u64,
    /// The run stops here even if work is left.
    pub max_virtual_ms: u64,
    pub engine: EngineOptions,
}

impl Workload {
    /// The mix the tests and `sluice sim` start from: three priorities, a share of searches
    /// over `shards` shards, reliable workers, two flaky ones, one killed a third of the way.
    pub fn mixed(seed: u64, tasks: usize) -> Workload {
        let shards = 2;
        let mut workers: Vec<SimWorker> = (0..6)
            .map(|n| SimWorker::gpu(&format!("gpu-{n}"), 16))
            .collect();
        for n in 0..2 {
            workers.push(SimWorker {
                fail_per_mille: 300,
                ..SimWorker::gpu(&format!("flaky-{n}"), 4)
            });
        }
        let arrivals_per_s = 100;
        let expected_ms = tasks as u64 * 1_000 / arrivals_per_s;
        workers.push(SimWorker {
            killed_after_ms: Some(expected_ms / 3),
            ..SimWorker::gpu("doomed", 8)
        });
        for shard in 0..shards {
            workers.push(SimWorker {
                shard: Some(shard),
                exec_ms: (20, 200),
                ..SimWorker::gpu(&format!("shard-{shard}"), 8)
            });
        }
        Workload {
            seed,
            tasks,
            arrivals_per_s,
            searches_per_mille: 50,
            shards,
            workers,
            step_ms: 100,
            max_virtual_ms: expected_ms * 20 + 3_600_000,
            engine: EngineOptions {
                lease_ms: 10_000,
                worker_stale_ms: 10_000,
                ..EngineOptions::default()
            },
        }
    }
}

/// What a run did.
#[derive(Debug)]
pub struct WorkloadRun {
    pub transcript: String,
    pub states: BTreeMap<State, usize>,
    pub virtual_ms: u64,
    /// Whether every task ended before `max_virtual_ms`.
    pub drained: bool,
}

/// An attempt a simulated worker is running.
struct Running {
    id: TaskId,
    token: String,
    ends_at_ms: u64,
    shard_child: bool,
}

/// Runs `workload` to its end: every submission made and every task ended, or the time bound.
pub fn run(workload: &Workload) -> WorkloadRun {
    let decide = NativeDecider {
        shards: workload.shards.max(1),
        ..NativeDecider::default()
    };
    let mut driver = Driver::with_decide(workload.seed, workload.engine.clone(), Box::new(decide));
    // The workload draws from its own generator, so the engine's draws stay the engine's.
    let mut chance = SmallRng::seed_from_u64(workload.seed ^ 0x5eed_f00d);
    let started_ms = driver.now_ms();
    let mut running: Vec<Vec<Running>> = workload.workers.iter().map(|_| Vec::new()).collect();
    let mut submitted = 0usize;
    // Arrivals owed, in thousandths of a task.
    let mut credit = 0u64;
    let mut last_heartbeat_ms: Option<u64> = None;
    loop {
        let elapsed_ms = driver.now_ms() - started_ms;
        // Arrivals for this step.
        credit += workload.step_ms * workload.arrivals_per_s;
        let mut batch = Vec::new();
        while submitted < workload.tasks && credit >= 1_000 {
            credit -= 1_000;
            batch.extend(submission(workload, &mut chance, submitted));
            submitted += 1;
        }
        if !batch.is_empty() {
            driver.step(crate::Input::Submit(batch));
        }
        let heartbeat_due = last_heartbeat_ms.is_none_or(|at| driver.now_ms() >= at + 1_000);
        if heartbeat_due {
            last_heartbeat_ms = Some(driver.now_ms());
        }
        for (worker, attempts) in workload.workers.iter().zip(running.iter_mut()) {
            if worker.killed_after_ms.is_some_and(|at| elapsed_ms >= at) {
                continue;
            }
            if heartbeat_due {
                let _ = driver.heartbeat(&worker.id, heartbeat(worker, workload.shards.max(1)));
            }
            let now_ms = driver.now_ms();
            let (done, still): (Vec<Running>, Vec<Running>) =
                attempts.drain(..).partition(|a| a.ends_at_ms <= now_ms);
            *attempts = still;
            for attempt in done {
                let report = if chance.random_range(0..1_000) < worker.fail_per_mille {
                    Report::Fail {
                        class: FailureClass::Transient,
                        message: "injected".into(),
                    }
                } else if attempt.shard_child {
                    let id = chance.random_range(0..1_000_000u64);
                    Report::Complete {
                        result: serde_json::json!({"hits": [{"id": id, "distance": 0.5}]}),
                    }
                } else {
                    Report::Complete {
                        result: serde_json::json!({"ok": true}),
                    }
                };
                let _ = driver.report(attempt.id, &attempt.token, report);
            }
            let free = (worker.slots as usize).saturating_sub(attempts.len());
            if free == 0 {
                continue;
            }
            if let Ok(claimed) = driver.claim(&worker.id, free) {
                for task in claimed.leases {
                    let Some(lease) = task.lease else { continue };
                    let (low, high) = worker.exec_ms;
                    attempts.push(Running {
                        id: task.id,
                        token: lease.token,
                        ends_at_ms: now_ms + chance.random_range(low..=high.max(low)),
                        shard_child: task.parent.is_some(),
                    });
                }
            }
        }
        let live = State::ALL
            .into_iter()
            .filter(|state| !state.is_terminal())
            .map(|state| driver.engine().tasks_in(state))
            .sum::<u64>();
        let ended = submitted == workload.tasks && live == 0;
        if ended || elapsed_ms >= workload.max_virtual_ms {
            return WorkloadRun {
                states: driver.store().states(),
                virtual_ms: elapsed_ms,
                drained: ended,
                transcript: driver.take_transcript(),
            };
        }
        driver.tick(workload.step_ms);
    }
}

/// A worker's heartbeat; a shard worker's announces shard `shard` of `shards` of the default
/// collection (3 dimensions, as the searches).
fn heartbeat(worker: &SimWorker, shards: u32) -> Heartbeat {
    let mut labels = BTreeMap::new();
    if let Some(shard) = worker.shard {
        let routing = ShardFilter::Shard(shard).routing(shards);
        labels.insert(crate::SHARD_LABEL.to_owned(), routing);
        labels.insert(
            crate::COLLECTION_LABEL.to_owned(),
            DEFAULT_COLLECTION.to_owned(),
        );
    }
    Heartbeat {
        gpus: (0..worker.slots)
            .map(|_| Gpu {
                model: "A100".into(),
                memory_mb: 40_000,
                free: true,
            })
            .collect(),
        labels,
        kinds: if worker.shard.is_some() {
            vec!["vector.search".to_owned()]
        } else {
            vec!["oct.scan".to_owned()]
        },
        max_concurrency: worker.slots,
        queue_depth: 0,
        loaded_models: Vec::new(),
        vectors: worker.shard.map(|shard| ShardAnnouncement {
            collection: DEFAULT_COLLECTION.to_owned(),
            shard,
            shards,
            dim: 3,
            vectors: 0,
        }),
    }
}

fn submission(
    workload: &Workload,
    chance: &mut SmallRng,
    n: usize,
) -> Option<sluice_model::Submission> {
    let priority = Priority::ALL[chance.random_range(0..3)];
    let search = chance.random_range(0..1_000) < workload.searches_per_mille;
    let spec = TaskSpec {
        key: chance.random_bool(0.5).then(|| format!("exam-{n}")),
        kind: if search { "vector.search" } else { "oct.scan" }.to_owned(),
        priority,
        device: format!("scanner-{}", chance.random_range(0..16)),
        tenant: format!("site-{}", chance.random_range(0..4)),
        labels: BTreeMap::new(),
        // Attempts time out at twice this, past the lease: a silent worker's leases expire.
        est_exec_ms: 10_000,
        deadline_ms: chance.random_bool(0.05).then_some(30_000),
        max_attempts: 3,
        payload: if search {
            serde_json::json!({"vector": [0.25, 0.5, 0.75], "k": 4, "allow_partial": true})
        } else {
            serde_json::json!({"exam": n})
        },
        callback_url: None,
        resources: Default::default(),
        concurrency_key: None,
        preemptible: true,
    };
    // Built here from valid parts: a refusal is a bug in this generator, and is logged.
    spec.into_submission(None, &Limits::default())
        .inspect_err(|error| tracing::error!(%error, "the workload made an invalid task"))
        .ok()
}
