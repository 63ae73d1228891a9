//! `sluice sim --trace`: a trace replayed on the virtual-time driver, once per variant, with
//! the real policy components deciding (loaded and checked as an upload would be), simulated
//! GPU workers running each attempt for the trace's service time (failing as the trace
//! scripts, at a drawn rate, or by crashing), and the figures a comparison needs. Time jumps
//! from one thing due to the next; nothing sleeps, and the seed fixes every draw.

pub mod merges;
pub mod report;
mod service;
mod sim_worker;
pub mod svg;
mod tally;
pub mod variant;

pub use service::ServiceModel;
pub use tally::{ReplayStore, Tally};
pub use variant::{PolicyChoice, Variant};

use crate::trace::{TraceError, TraceReader, TraceTask};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sim_worker::GpuWorker;
use sluice_engine::sim::{Driver, START_MS};
use sluice_engine::{EngineOptions, Input, Report};
use sluice_model::{
    FailureClass, Gpu, Heartbeat, Limits, Priority, Resources, State, TaskId, TaskIdMap, TaskSpec,
};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::io::BufRead;
use std::path::PathBuf;
use std::str::FromStr;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("`{choice}`: {detail}")]
    Choice { choice: String, detail: String },
    #[error("cannot read the component {path}: {source}")]
    Component {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{choice}` cannot be loaded: {detail}")]
    Load { choice: String, detail: String },
    #[error("--workers `{spec}`: {detail}")]
    Workers { spec: String, detail: String },
    #[error("--service `{spec}`: {detail}")]
    Service { spec: String, detail: String },
    #[error("the trace: {0}")]
    Trace(#[from] TraceError),
    #[error("the trace has more than {0} tasks")]
    TraceTooLong(usize),
    #[error("the trace has no tasks")]
    EmptyTrace,
    #[error(transparent)]
    Registry(#[from] sluice_policy_runtime::RegistryError),
    #[error(transparent)]
    Policy(#[from] sluice_policy_runtime::PolicyError),
    #[error(transparent)]
    Store(#[from] sluice_store::StoreError),
}

/// Workers of one shape: `COUNTxGPUS[:MEMORY_MB]`, one attempt per GPU at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerGroup {
    pub count: u32,
    pub gpus: u32,
    pub gpu_memory_mb: u64,
}

/// The simulated fleet: groups separated by commas, e.g. `16x4:40000,4x1:80000`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    pub groups: Vec<WorkerGroup>,
}

/// The most simulated workers, and GPUs one may have.
pub const MAX_WORKERS: u32 = 10_000;
pub const MAX_GPUS_PER_WORKER: u32 = 64;
const DEFAULT_GPU_MEMORY_MB: u64 = 40_000;

impl FromStr for WorkerSpec {
    type Err = ReplayError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let invalid = |detail: &str| ReplayError::Workers {
            spec: spec.chars().take(200).collect(),
            detail: detail.to_owned(),
        };
        let mut groups = Vec::new();
        for group in spec.split(',') {
            let (shape, memory) = match group.split_once(':') {
                Some((shape, memory)) => (shape, Some(memory)),
                None => (group, None),
            };
            let (count, gpus) = shape
                .split_once('x')
                .ok_or_else(|| invalid("each group is COUNTxGPUS[:MEMORY_MB], e.g. 16x4:40000"))?;
            let count: u32 = count
                .trim()
                .parse()
                .map_err(|_| invalid("a worker count is a whole number"))?;
            let gpus: u32 = gpus
                .trim()
                .parse()
                .map_err(|_| invalid("a GPU count is a whole number"))?;
            let gpu_memory_mb = match memory {
                Some(memory) => memory
                    .trim()
                    .parse()
                    .map_err(|_| invalid("GPU memory is a whole number of MB"))?,
                None => DEFAULT_GPU_MEMORY_MB,
            };
            if count == 0 || gpus == 0 || gpus > MAX_GPUS_PER_WORKER {
                return Err(invalid(&format!(
                    "a group has at least one worker, with 1 to {MAX_GPUS_PER_WORKER} GPUs"
                )));
            }
            groups.push(WorkerGroup {
                count,
                gpus,
                gpu_memory_mb,
            });
        }
        let total: u64 = groups.iter().map(|g| u64::from(g.count)).sum();
        if total > u64::from(MAX_WORKERS) {
            return Err(invalid(&format!("at most {MAX_WORKERS} workers")));
        }
        Ok(WorkerSpec { groups })
    }
}

/// How a replay runs, apart from its trace and its variant.
#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub workers: WorkerSpec,
    /// The engine's draws (retry jitter), the workers' failures and crashes.
    pub seed: u64,
    /// Attempts that fail (transiently) beyond those the trace scripts, per thousand.
    pub fail_per_mille: u32,
    /// Mean virtual time between one worker's crashes (none when absent): a crashed worker
    /// goes silent holding its leases, which expire, and comes back after `restart_ms`.
    pub mean_ms_between_crashes: Option<u64>,
    pub restart_ms: u64,
    /// Each task's `max_attempts`.
    pub max_attempts: u32,
    /// What an attempt of a task naming a model takes on top of its service time when its
    /// GPU holds another model (or none): the load. Each GPU holds the last model it ran.
    pub model_load_ms: u64,
    /// How often the engine ticks while tasks are live (the server's writer ticks as often).
    pub tick_ms: u64,
    pub heartbeat_ms: u64,
    pub engine: EngineOptions,
    /// The run stops this long after the trace's last submission even if work is left (its
    /// report says so).
    pub max_virtual_ms: u64,
    /// A run whose only live tasks are queued and that has placed nothing for this long ends
    /// with them stranded (no worker fits them).
    pub stall_ms: u64,
    /// Queue depth is sampled this often, the interval doubling to keep at most
    /// `MAX_DEPTH_SAMPLES` samples.
    pub depth_interval_ms: u64,
    /// GPU batches: each GPU runs one batch at a time, claimed as a batch claim does.
    pub batch: Option<SimBatch>,
}

/// How simulated workers claim and run GPU batches: `SIZE[:WAIT_MS]` on the command line.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SimBatch {
    /// The most tasks of one batch (a claim's `batch.max_size`).
    pub max_size: usize,
    /// How long a batch short of its size waits for more (a claim's `batch.max_wait_ms`).
    pub max_wait_ms: u64,
    /// What each task past the first adds to a batch's time, as a share of the longest task's
    /// service time: a batch of n takes `service × (1 + alpha × (n − 1))`.
    pub alpha: f64,
}

impl SimBatch {
    /// How long a batch whose longest task takes `service_ms` alone runs with `tasks` tasks.
    pub fn batch_ms(&self, service_ms: u64, tasks: usize) -> u64 {
        let extra = self.alpha.max(0.0) * tasks.saturating_sub(1) as f64;
        (service_ms as f64 * (1.0 + extra)).round() as u64
    }

    /// `SIZE[:WAIT_MS]`, with `alpha`.
    pub fn parse(text: &str, alpha: f64) -> Result<SimBatch, String> {
        let (size, wait) = match text.split_once(':') {
            Some((size, wait)) => (size, Some(wait)),
            None => (text, None),
        };
        let max_size: usize = size
            .trim()
            .parse()
            .map_err(|_| format!("`{text}`: a batch is SIZE[:WAIT_MS], e.g. 8:20"))?;
        let max_wait_ms: u64 = match wait {
            Some(wait) => wait.trim().parse().map_err(|_| {
                format!("`{text}`: a batch is SIZE[:WAIT_MS], WAIT_MS a whole number of ms")
            })?,
            None => 0,
        };
        if !(1..=sluice_wire::MAX_CLAIM).contains(&max_size) {
            return Err(format!(
                "`{text}`: a batch holds 1 to {} tasks",
                sluice_wire::MAX_CLAIM
            ));
        }
        if max_wait_ms > sluice_engine::MAX_BATCH_WAIT_MS {
            return Err(format!(
                "`{text}`: WAIT_MS is at most {}",
                sluice_engine::MAX_BATCH_WAIT_MS
            ));
        }
        if !(0.0..=10.0).contains(&alpha) {
            return Err("the batch alpha is 0 to 10".into());
        }
        Ok(SimBatch {
            max_size,
            max_wait_ms,
            alpha,
        })
    }
}

impl std::fmt::Display for SimBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.max_size == 1 {
            return write!(f, "one task per GPU at a time (batches of 1)");
        }
        write!(
            f,
            "GPU batches of up to {} within {} ms (alpha {})",
            self.max_size, self.max_wait_ms, self.alpha
        )
    }
}

pub const MAX_DEPTH_SAMPLES: usize = 2_048;

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            workers: WorkerSpec {
                groups: vec![WorkerGroup {
                    count: 64,
                    gpus: 4,
                    gpu_memory_mb: DEFAULT_GPU_MEMORY_MB,
                }],
            },
            seed: 1,
            fail_per_mille: 0,
            mean_ms_between_crashes: None,
            restart_ms: 60_000,
            max_attempts: 3,
            model_load_ms: 0,
            tick_ms: 100,
            heartbeat_ms: 5_000,
            engine: EngineOptions::default(),
            max_virtual_ms: 30 * 24 * 3_600_000,
            stall_ms: 600_000,
            depth_interval_ms: 1_000,
            batch: None,
        }
    }
}

/// One task of a trace as a replay holds it: names interned, so a million tasks fit in tens
/// of MB.
#[derive(Clone, Debug)]
struct Arrival {
    submit_ms: u64,
    service_ms: u64,
    est_exec_ms: u64,
    gpu_memory_mb: u64,
    kind: u32,
    tenant: u32,
    device: u32,
    /// The model's name code, `NO_MODEL` when it names none.
    model: u32,
    /// The batch key's name code, `NO_MODEL` when it names none.
    batch_key: u32,
    priority: Priority,
    failures: Box<[FailureClass]>,
}

/// An arrival's model (or batch key) code when it names none.
const NO_MODEL: u32 = u32::MAX;

/// A trace loaded for replay, shared by every variant's run.
#[derive(Debug, Default)]
pub struct Trace {
    arrivals: Vec<Arrival>,
    names: Vec<String>,
    service: ServiceModel,
}

impl Trace {
    /// Reads a JSONL trace (docs/traces.md), refusing one of more than `max_tasks` tasks.
    pub fn read(input: impl BufRead, max_tasks: usize) -> Result<Trace, ReplayError> {
        let mut builder = TraceBuilder::default();
        for task in TraceReader::new(input) {
            if builder.trace.arrivals.len() == max_tasks {
                return Err(ReplayError::TraceTooLong(max_tasks));
            }
            builder.push(task?);
        }
        builder.finish()
    }

    /// A trace of `tasks`, in order (their times must not go back; the reader checks that for
    /// a file).
    pub fn from_tasks(tasks: impl IntoIterator<Item = TraceTask>) -> Result<Trace, ReplayError> {
        let mut builder = TraceBuilder::default();
        for task in tasks {
            builder.push(task);
        }
        builder.finish()
    }

    pub fn len(&self) -> usize {
        self.arrivals.len()
    }

    pub fn is_empty(&self) -> bool {
        self.arrivals.is_empty()
    }

    /// Tasks per submitted priority: urgent, normal, low.
    pub fn tasks_per_bucket(&self) -> [u64; 3] {
        let mut counts = [0; 3];
        for arrival in &self.arrivals {
            counts[arrival.priority.index()] += 1;
        }
        counts
    }

    /// When the last task is submitted, ms from the start.
    pub fn span_ms(&self) -> u64 {
        self.arrivals.last().map_or(0, |a| a.submit_ms)
    }

    fn spec(&self, arrival: &Arrival, max_attempts: u32) -> TaskSpec {
        TaskSpec {
            key: None,
            kind: self.names[arrival.kind as usize].clone(),
            priority: arrival.priority,
            device: self.names[arrival.device as usize].clone(),
            tenant: self.names[arrival.tenant as usize].clone(),
            labels: BTreeMap::new(),
            est_exec_ms: arrival.est_exec_ms,
            deadline_ms: None,
            max_attempts,
            payload: serde_json::Value::Null,
            callback_url: None,
            resources: Resources {
                gpu_memory_mb: arrival.gpu_memory_mb,
                model: (arrival.model != NO_MODEL)
                    .then(|| self.names[arrival.model as usize].clone()),
                batch_key: (arrival.batch_key != NO_MODEL)
                    .then(|| self.names[arrival.batch_key as usize].clone()),
            },
            concurrency_key: None,
            preemptible: true,
        }
    }
}

#[derive(Default)]
struct TraceBuilder {
    trace: Trace,
    codes: HashMap<String, u32>,
}

impl TraceBuilder {
    fn code(&mut self, name: String) -> u32 {
        if let Some(&code) = self.codes.get(&name) {
            return code;
        }
        let code = self.trace.names.len() as u32;
        self.trace.names.push(name.clone());
        self.codes.insert(name, code);
        code
    }

    fn push(&mut self, task: TraceTask) {
        let arrival = Arrival {
            submit_ms: task.submit_ms,
            service_ms: task.service_ms,
            est_exec_ms: task.est_exec_ms.unwrap_or(task.service_ms).max(1),
            gpu_memory_mb: task.gpu_memory_mb,
            kind: self.code(task.kind),
            tenant: self.code(task.tenant),
            device: self.code(task.device),
            model: task.model.map_or(NO_MODEL, |model| self.code(model)),
            batch_key: task.batch_key.map_or(NO_MODEL, |key| self.code(key)),
            priority: task.priority,
            failures: task.failures.into_boxed_slice(),
        };
        self.trace.arrivals.push(arrival);
    }

    fn finish(self) -> Result<Trace, ReplayError> {
        if self.trace.arrivals.is_empty() {
            return Err(ReplayError::EmptyTrace);
        }
        debug_assert!(
            self.trace
                .arrivals
                .windows(2)
                .all(|w| w[0].submit_ms <= w[1].submit_ms),
            "a trace is in submission order"
        );
        Ok(self.trace)
    }
}

/// What one variant's run did.
#[derive(Debug)]
pub struct RunOutcome {
    pub tally: Tally,
    /// From the first submission to the last task's end (or the stop), ms.
    pub makespan_ms: u64,
    /// Slot-ms spent running attempts (a GPU batch counts once), and slot-ms the fleet had
    /// over the makespan.
    pub busy_slot_ms: u64,
    pub slot_ms: u64,
    /// Tasks never claimed when the run ended: no worker fitted them, or time ran out.
    pub stranded: u64,
    /// Tasks still live when the run ended.
    pub unfinished: u64,
    pub crashes: u64,
    /// Attempts that had to load their model first.
    pub model_loads: u64,
    /// Whether every task ended.
    pub drained: bool,
    /// Queued tasks per bucket (urgent, normal, low), every `depth_interval_ms`.
    pub depth_interval_ms: u64,
    pub depth: [Vec<u32>; 3],
    /// Faults, fallbacks and deactivations of each kind's policy during the run.
    pub policy_faults: BTreeMap<String, (u64, u64, u64)>,
}

/// An attempt a simulated worker runs.
struct Attempt {
    worker: usize,
    epoch: u32,
    task: TaskId,
    token: String,
    arrival: u32,
    attempt: u32,
    started_ms: u64,
    ends_ms: u64,
    /// Whether it holds its worker's slot: every attempt does, but of a GPU batch only the
    /// first (the others ride along, ending with it).
    holds_slot: bool,
}

/// Replays `trace` with `variant`'s policies, loaded into a registry held in memory.
pub fn run(
    trace: &Trace,
    variant: &Variant,
    options: &ReplayOptions,
) -> Result<RunOutcome, ReplayError> {
    let loaded = variant.decider(START_MS)?;
    let engine = EngineOptions {
        // A trace's tasks are run whole: no searches fan out to shards here.
        split_kinds: Vec::new(),
        ..options.engine.clone()
    };
    let driver = Driver::with_store(
        options.seed,
        engine,
        Box::new(loaded.decider),
        ReplayStore::default(),
        false,
    );
    let mut replay = Replay::new(trace, options, driver);
    replay.run();
    let mut outcome = replay.finish();
    for kind in sluice_model::PolicyKind::ALL {
        let counters = loaded.registry.status(kind).counters;
        outcome.policy_faults.insert(
            kind.to_string(),
            (
                counters.faults_total,
                counters.fallbacks_total,
                counters.deactivations_total,
            ),
        );
    }
    Ok(outcome)
}

/// Submissions, and reports, one step takes at most.
const MAX_BATCH: usize = 1_024;

struct Replay<'a> {
    trace: &'a Trace,
    options: &'a ReplayOptions,
    driver: Driver<ReplayStore>,
    chance: SmallRng,
    workers: Vec<GpuWorker>,
    /// Workers up with a slot free, by index.
    free: BTreeSet<usize>,
    /// Crashes and restarts due: (when, worker).
    worker_timers: BTreeSet<(u64, usize)>,
    /// Attempts' next report (a lease heartbeat, or the end), by (when, attempt number).
    due: BinaryHeap<Reverse<(u64, u64)>>,
    attempts: HashMap<u64, Attempt>,
    next_attempt: u64,
    arrival_of: TaskIdMap<u32>,
    next_arrival: usize,
    next_tick_ms: u64,
    next_heartbeat_ms: u64,
    last_progress_ms: u64,
    claim_cursor: usize,
    busy_slot_ms: u64,
    crashes: u64,
    model_loads: u64,
    next_depth_ms: u64,
    depth_interval_ms: u64,
    depth: [Vec<u32>; 3],
    drained: bool,
    /// When a batch held to fill is worth claiming again.
    batch_wake_ms: Option<u64>,
}

impl<'a> Replay<'a> {
    fn new(trace: &'a Trace, options: &'a ReplayOptions, driver: Driver<ReplayStore>) -> Self {
        let mut workers = Vec::new();
        for group in &options.workers.groups {
            for _ in 0..group.count {
                let n = workers.len();
                workers.push(GpuWorker {
                    name: format!("sim-{n}"),
                    heartbeat: Heartbeat {
                        gpus: (0..group.gpus)
                            .map(|_| Gpu {
                                model: "sim".into(),
                                memory_mb: group.gpu_memory_mb,
                                free: true,
                            })
                            .collect(),
                        labels: BTreeMap::new(),
                        kinds: Vec::new(),
                        // A GPU takes a whole batch's tasks at once.
                        max_concurrency: group
                            .gpus
                            .saturating_mul(options.batch.map_or(1, |b| b.max_size as u32)),
                        queue_depth: 0,
                        loaded_models: Vec::new(),
                        vectors: None,
                    },
                    slots: group.gpus as usize,
                    busy: 0,
                    up: true,
                    epoch: 0,
                    loaded: vec![(NO_MODEL, 0); group.gpus as usize],
                });
            }
        }
        let now_ms = driver.now_ms();
        let mut replay = Replay {
            trace,
            options,
            driver,
            // Its own generator, so the engine's draws stay the engine's.
            chance: SmallRng::seed_from_u64(options.seed ^ 0x7ace_5eed),
            free: (0..workers.len()).collect(),
            workers,
            worker_timers: BTreeSet::new(),
            due: BinaryHeap::new(),
            attempts: HashMap::new(),
            next_attempt: 0,
            arrival_of: TaskIdMap::default(),
            next_arrival: 0,
            next_tick_ms: now_ms,
            next_heartbeat_ms: now_ms,
            last_progress_ms: now_ms,
            claim_cursor: 0,
            busy_slot_ms: 0,
            crashes: 0,
            model_loads: 0,
            next_depth_ms: now_ms,
            depth_interval_ms: options.depth_interval_ms.max(1),
            depth: Default::default(),
            drained: false,
            batch_wake_ms: None,
        };
        for worker in 0..replay.workers.len() {
            replay.schedule_crash(worker, now_ms);
        }
        replay
    }

    fn schedule_crash(&mut self, worker: usize, now_ms: u64) {
        if let Some(mean_ms) = self.options.mean_ms_between_crashes {
            // Exponential gaps: crashes come at random, at the mean rate.
            let draw: f64 = self.chance.random_range(f64::EPSILON..1.0);
            let gap_ms = (-(draw.ln()) * mean_ms.max(1) as f64) as u64;
            self.worker_timers
                .insert((now_ms.saturating_add(gap_ms.max(1)), worker));
        }
    }

    fn start_ms(&self) -> u64 {
        START_MS
    }

    fn live_tasks(&self) -> u64 {
        State::ALL
            .into_iter()
            .filter(|state| !state.is_terminal())
            .map(|state| self.driver.engine().tasks_in(state))
            .sum()
    }

    fn run(&mut self) {
        loop {
            let live = self.live_tasks();
            let arrivals_left = self.next_arrival < self.trace.arrivals.len();
            if live == 0 && !arrivals_left {
                self.drained = true;
                return;
            }
            let mut next = arrivals_left
                .then(|| self.start_ms() + self.trace.arrivals[self.next_arrival].submit_ms);
            let mut consider = |at: Option<u64>| {
                if let Some(at) = at {
                    next = Some(next.map_or(at, |n: u64| n.min(at)));
                }
            };
            consider(self.due.peek().map(|Reverse((at, _))| *at));
            consider(self.worker_timers.first().map(|(at, _)| *at));
            consider(self.batch_wake_ms);
            if live > 0 {
                // Ticks age and preempt queued work; with nothing queued a tick has only the
                // engine's timers to run, so the clock jumps to the next one (a trace of pods
                // that run for days would otherwise tick every 100 ms through them).
                let queued = !self.driver.engine().queues().is_empty();
                let next_tick_ms = if queued {
                    Some(self.next_tick_ms)
                } else {
                    self.driver
                        .engine()
                        .next_due_ms()
                        .map(|due_ms| due_ms.max(self.next_tick_ms))
                };
                consider(next_tick_ms);
            }
            let Some(at) = next else {
                self.drained = live == 0;
                return;
            };
            let at = at.max(self.driver.now_ms());
            if at - self.start_ms()
                > self
                    .trace
                    .span_ms()
                    .saturating_add(self.options.max_virtual_ms)
            {
                return;
            }
            if self.stalled(at) {
                return;
            }
            self.driver.advance_to(at);
            self.moment(at);
        }
    }

    /// Whether only queued tasks are left, none placed for `stall_ms`: nothing fits them.
    fn stalled(&self, at_ms: u64) -> bool {
        let engine = self.driver.engine();
        let queued = engine.tasks_in(State::Queued);
        self.next_arrival == self.trace.arrivals.len()
            && self.attempts.is_empty()
            && queued == self.live_tasks()
            && at_ms.saturating_sub(self.last_progress_ms) > self.options.stall_ms
    }

    /// Everything due at `now_ms`, worker traffic first (as the server's writer orders it).
    fn moment(&mut self, now_ms: u64) {
        while let Some(&(at, worker)) = self.worker_timers.first() {
            if at > now_ms {
                break;
            }
            self.worker_timers.pop_first();
            if self.workers[worker].up {
                self.crash(worker, now_ms);
            } else {
                self.workers[worker].up = true;
                self.heartbeat(worker);
                self.free.insert(worker);
                self.schedule_crash(worker, now_ms);
            }
        }
        if now_ms >= self.next_heartbeat_ms {
            for worker in 0..self.workers.len() {
                if self.workers[worker].up {
                    self.heartbeat(worker);
                }
            }
            self.next_heartbeat_ms = now_ms + self.options.heartbeat_ms.max(1);
        }
        if now_ms >= self.next_tick_ms {
            self.driver.step(Input::Tick {
                callback_slots: usize::MAX,
                callback_bytes: usize::MAX,
            });
            self.next_tick_ms = now_ms + self.options.tick_ms.max(1);
        }
        while now_ms >= self.next_depth_ms {
            self.sample_depth();
            self.next_depth_ms += self.depth_interval_ms;
        }
        self.reports(now_ms);
        self.arrivals(now_ms);
        self.claims(now_ms);
    }

    fn heartbeat(&mut self, worker: usize) {
        let heartbeat = self.workers[worker].heartbeat.clone();
        let name = self.workers[worker].name.clone();
        let _ = self.driver.step(Input::Heartbeat {
            worker: name,
            heartbeat,
        });
    }

    fn crash(&mut self, worker: usize, now_ms: u64) {
        self.crashes += 1;
        let epoch = self.workers[worker].epoch;
        let abandoned: Vec<u64> = self
            .attempts
            .iter()
            .filter(|(_, a)| a.worker == worker && a.epoch == epoch)
            .map(|(&n, _)| n)
            .collect();
        for n in abandoned {
            if let Some(attempt) = self.attempts.remove(&n)
                && attempt.holds_slot
            {
                self.busy_slot_ms += now_ms.saturating_sub(attempt.started_ms);
            }
        }
        let state = &mut self.workers[worker];
        state.up = false;
        state.busy = 0;
        state.epoch += 1;
        state.unload_all();
        self.free.remove(&worker);
        self.worker_timers
            .insert((now_ms.saturating_add(self.options.restart_ms), worker));
    }

    fn sample_depth(&mut self) {
        let queues = self.driver.engine().queues();
        for (bucket, samples) in Priority::ALL.into_iter().zip(self.depth.iter_mut()) {
            samples.push(u32::try_from(queues.len(bucket)).unwrap_or(u32::MAX));
        }
        if self.depth[0].len() >= MAX_DEPTH_SAMPLES {
            // Every other sample, at twice the interval: bounded, and still even in time.
            for samples in &mut self.depth {
                let kept: Vec<u32> = samples.iter().copied().step_by(2).collect();
                *samples = kept;
            }
            self.next_depth_ms += self.depth_interval_ms;
            self.depth_interval_ms *= 2;
        }
    }

    fn reports(&mut self, now_ms: u64) {
        let lease_beat_ms = (self.options.engine.lease_ms / 3).max(1);
        let mut batch = Vec::new();
        // The attempt each lease heartbeat in `batch` is for: one may be answered
        // `attempt-revoked` (preempted), and the worker then stops it.
        let mut beats: Vec<Option<u64>> = Vec::new();
        while let Some(&Reverse((at, n))) = self.due.peek() {
            if at > now_ms || batch.len() == MAX_BATCH {
                break;
            }
            self.due.pop();
            let Some(attempt) = self.attempts.get(&n) else {
                continue; // abandoned by a crash
            };
            if attempt.ends_ms > now_ms {
                batch.push((attempt.task, attempt.token.clone(), Report::Heartbeat));
                beats.push(Some(n));
                let next = (now_ms + lease_beat_ms).min(attempt.ends_ms);
                self.due.push(Reverse((next, n)));
                continue;
            }
            let Some(attempt) = self.attempts.remove(&n) else {
                continue;
            };
            self.slot_freed(&attempt, attempt.ends_ms);
            let arrival = &self.trace.arrivals[attempt.arrival as usize];
            let scripted = (attempt.attempt as usize)
                .checked_sub(1)
                .and_then(|i| arrival.failures.get(i).copied());
            let report = match scripted {
                Some(class) => Report::Fail {
                    class,
                    message: "scripted by the trace".into(),
                },
                None if self.chance.random_range(0..1_000) < self.options.fail_per_mille => {
                    Report::Fail {
                        class: FailureClass::Transient,
                        message: "drawn at --fail-per-mille".into(),
                    }
                }
                None => Report::Complete {
                    result: serde_json::Value::Null,
                },
            };
            batch.push((attempt.task, attempt.token, report));
            beats.push(None);
        }
        if batch.is_empty() {
            return;
        }
        self.last_progress_ms = now_ms;
        let sluice_engine::Reply::Reports(answers) = self.driver.step(Input::Reports(batch)) else {
            return;
        };
        let stopped: Vec<_> = answers
            .iter()
            .zip(beats)
            .filter_map(|(answer, beat)| match answer {
                Err(sluice_engine::StepError::AttemptRevoked { .. }) => beat,
                _ => None,
            })
            .filter_map(|n| self.stop(now_ms, n))
            .collect();
        if !stopped.is_empty() {
            self.driver.step(Input::Reports(stopped));
        }
    }

    /// A preempted attempt stops at once: its worker's place is free, and it says `stopped`.
    fn stop(&mut self, now_ms: u64, n: u64) -> Option<(TaskId, String, Report)> {
        let attempt = self.attempts.remove(&n)?;
        self.slot_freed(&attempt, now_ms);
        Some((attempt.task, attempt.token, Report::Stopped))
    }

    /// An attempt ended at `end_ms`: if it held its worker's slot, the slot is free again.
    fn slot_freed(&mut self, attempt: &Attempt, end_ms: u64) {
        if !attempt.holds_slot {
            return;
        }
        self.busy_slot_ms += end_ms.saturating_sub(attempt.started_ms);
        let worker = &mut self.workers[attempt.worker];
        debug_assert!(worker.busy > 0, "a slot freed that was not taken");
        worker.busy = worker.busy.saturating_sub(1);
        self.free.insert(attempt.worker);
    }

    fn arrivals(&mut self, now_ms: u64) {
        let limits = Limits::default();
        loop {
            let mut batch = Vec::new();
            let mut indices = Vec::new();
            while let Some(arrival) = self.trace.arrivals.get(self.next_arrival) {
                if self.start_ms() + arrival.submit_ms > now_ms || batch.len() == MAX_BATCH {
                    break;
                }
                let spec = self.trace.spec(arrival, self.options.max_attempts);
                match spec.into_submission(None, &limits) {
                    Ok(submission) => {
                        batch.push(submission);
                        indices.push(self.next_arrival as u32);
                    }
                    Err(error) => {
                        tracing::warn!(%error, task = self.next_arrival, "a trace task was refused")
                    }
                }
                self.next_arrival += 1;
            }
            if batch.is_empty() {
                return;
            }
            self.last_progress_ms = now_ms;
            if let sluice_engine::Reply::Submitted(results) = self.driver.step(Input::Submit(batch))
            {
                for (result, index) in results.into_iter().zip(indices) {
                    if let Ok(submitted) = result {
                        self.arrival_of.insert(submitted.task.id, index);
                    }
                }
            }
        }
    }

    fn claims(&mut self, now_ms: u64) {
        if self.batch_wake_ms.is_some_and(|at| at <= now_ms) {
            self.batch_wake_ms = None;
        }
        if self.driver.engine().queues().is_empty() || self.free.is_empty() {
            return;
        }
        // From a cursor that moves on each round, so no worker is always asked first.
        let order: Vec<usize> = self
            .free
            .range(self.claim_cursor..)
            .chain(self.free.range(..self.claim_cursor))
            .copied()
            .collect();
        self.claim_cursor = (self.claim_cursor + 1) % self.workers.len().max(1);
        for worker in order {
            if self.driver.engine().queues().is_empty() {
                break;
            }
            let loaded_changed = match self.options.batch {
                Some(batch) => self.claim_batches(now_ms, worker, batch),
                None => self.claim_tasks(now_ms, worker),
            };
            if self.workers[worker].busy >= self.workers[worker].slots {
                self.free.remove(&worker);
            }
            if loaded_changed {
                self.heartbeat(worker);
            }
        }
    }

    /// One claim for as many tasks as `worker` has free slots; whether a GPU loaded a model.
    fn claim_tasks(&mut self, now_ms: u64, worker: usize) -> bool {
        let room = self.workers[worker].slots - self.workers[worker].busy;
        let name = self.workers[worker].name.clone();
        let Ok(claimed) = self.driver.claim(&name, room) else {
            return false;
        };
        let mut loaded_changed = false;
        for task in claimed.leases {
            if let Some((service_ms, loaded)) = self.service_of(worker, &task) {
                loaded_changed |= loaded;
                self.start_attempts(now_ms, worker, vec![task], service_ms);
            }
        }
        loaded_changed
    }

    /// A batch claim for each free GPU slot of `worker`, until one gets nothing (a batch held
    /// to fill sets the time to ask again); whether a GPU loaded a model.
    fn claim_batches(&mut self, now_ms: u64, worker: usize, batch: SimBatch) -> bool {
        let name = self.workers[worker].name.clone();
        let mut loaded_changed = false;
        while self.workers[worker].busy < self.workers[worker].slots {
            let claim = sluice_engine::BatchClaim {
                max_size: batch.max_size,
                max_wait_ms: batch.max_wait_ms,
                models: Vec::new(),
                may_hold: true,
            };
            let Ok(claimed) = self.driver.claim_batch(&name, batch.max_size, Some(claim)) else {
                break;
            };
            if let Some(hold_ms) = claimed.hold_ms {
                let at = now_ms.saturating_add(hold_ms);
                self.batch_wake_ms = Some(self.batch_wake_ms.map_or(at, |t| t.min(at)));
            }
            if claimed.leases.is_empty() {
                break;
            }
            let mut service_ms = 0;
            let mut tasks = Vec::with_capacity(claimed.leases.len());
            for task in claimed.leases {
                if let Some((task_ms, loaded)) = self.service_of(worker, &task) {
                    loaded_changed |= loaded;
                    service_ms = service_ms.max(task_ms);
                    tasks.push(task);
                }
            }
            if tasks.is_empty() {
                break;
            }
            let batch_ms = batch.batch_ms(service_ms, tasks.len());
            self.start_attempts(now_ms, worker, tasks, batch_ms);
        }
        loaded_changed
    }

    /// How long `task`'s attempt on `worker` takes alone (its load included), and whether its
    /// GPU loaded its model for it; none for a task the trace does not know.
    fn service_of(&mut self, worker: usize, task: &sluice_model::Task) -> Option<(u64, bool)> {
        let lease = task.lease.as_ref()?;
        let arrival = *self.arrival_of.get(&task.id)?;
        let of = &self.trace.arrivals[arrival as usize];
        let mut service_ms = of.service_ms;
        let gpu = lease.gpu.unwrap_or(0) as usize;
        let loaded = of.model != NO_MODEL
            && self.workers[worker].load(gpu, of.model, &self.trace.names, of.gpu_memory_mb);
        if loaded {
            // Loading takes its time on the attempt; the engine hears of the model at once,
            // as a live worker's `LoadedModels` heartbeats on a change.
            service_ms += self.options.model_load_ms;
            self.model_loads += 1;
        }
        Some((service_ms, loaded))
    }

    /// Starts `tasks`' attempts on `worker`, all ending after `service_ms`: one slot for them
    /// all (a GPU batch, or a single task).
    fn start_attempts(
        &mut self,
        now_ms: u64,
        worker: usize,
        tasks: Vec<sluice_model::Task>,
        service_ms: u64,
    ) {
        let ends_ms = now_ms + service_ms;
        let lease_beat_ms = (self.options.engine.lease_ms / 3).max(1);
        let mut holds_slot = true;
        for task in tasks {
            let (Some(lease), Some(&arrival)) = (task.lease, self.arrival_of.get(&task.id)) else {
                continue;
            };
            let n = self.next_attempt;
            self.next_attempt += 1;
            self.due
                .push(Reverse(((now_ms + lease_beat_ms).min(ends_ms), n)));
            self.attempts.insert(
                n,
                Attempt {
                    worker,
                    epoch: self.workers[worker].epoch,
                    task: task.id,
                    token: lease.token,
                    arrival,
                    attempt: task.attempt,
                    started_ms: now_ms,
                    ends_ms,
                    holds_slot,
                },
            );
            if holds_slot {
                self.workers[worker].busy += 1;
                holds_slot = false;
            }
            self.last_progress_ms = now_ms;
        }
    }

    fn finish(mut self) -> RunOutcome {
        let end_ms = self.driver.now_ms();
        // Attempts still running when the run stopped count up to the stop.
        for attempt in self.attempts.values().filter(|a| a.holds_slot) {
            self.busy_slot_ms += end_ms.saturating_sub(attempt.started_ms);
        }
        let makespan_ms = end_ms - self.start_ms();
        let slots: u64 = self.workers.iter().map(|w| w.slots as u64).sum();
        let unfinished = self.live_tasks();
        let stranded = self.driver.store().unclaimed() as u64;
        let tally = std::mem::take(&mut self.driver.store_mut().tally);
        RunOutcome {
            tally,
            makespan_ms,
            busy_slot_ms: self.busy_slot_ms,
            slot_ms: slots * makespan_ms,
            stranded,
            unfinished,
            crashes: self.crashes,
            model_loads: self.model_loads,
            drained: self.drained,
            depth_interval_ms: self.depth_interval_ms,
            depth: self.depth,
            policy_faults: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests;
