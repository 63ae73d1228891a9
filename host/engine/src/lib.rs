//! The deterministic scheduling core: it owns the in-memory indexes (bucket queues, tasks by
//! state, workers, timers) and turns every input into a `Change` for the store and a reply,
//! through one entry, `Engine::step` (`step/`). Time, random bits, the policies (`Decide`) and
//! the store's read side (`Read`) are arguments; it never reads a clock, sleeps, spawns or
//! writes the store, so any run can be replayed from its inputs and seed.
//!
//! Inside a step the core plans, then learns: `plan_*` build a `Change` without altering the
//! engine, and `apply` advances the indexes (queues, leases, timers, counts, event numbers) by
//! that change, reading everything it needs from the task records it writes. A shell commits
//! the changes of a group of steps as one; if that commit fails, it rebuilds the engine from
//! the store, so memory never runs ahead of disk.
//!
//! `plan_*` and `apply` are the crate's own; other crates' tests reach four of them through
//! `testing` (the `test-support` feature).
//!
//! `sim` is the virtual-time driver: the same engine fed a simulated clock, workers and store,
//! for simulations, replays and the tests of scheduling behaviour.

mod aging;
pub use aging::AgingView;
mod breaker;
mod callbacks;
mod claims;
mod collections;
mod concurrency;
mod decide;
mod family;
mod placement;
mod preempt;
mod queues;
mod reaper;
mod reports;
pub mod sim;
mod step;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
mod timers;
mod views;
mod workers;
mod wrr;

pub use breaker::{BreakerOptions, BreakerState};
pub use callbacks::{CALLBACK_ATTEMPT_TIMEOUT_MS, CallbackOutcome, MAX_CALLBACK_ATTEMPTS};
pub use claims::{BatchClaim, MAX_BATCH_MODELS, NoClaim, Pick, Picks};
pub use collections::{CollectionView, HeartbeatRefused, ShardView};
pub use decide::{
    Decide, Decided, NativeDecider, SplitAnswer, SplitInput, native_merge, to_retry_decision,
};
pub use family::{COLLECTION_LABEL, ChildPlan, SHARD_LABEL, ready_to_merge};
pub use queues::{BucketQueues, NamedWeights, TenantWeights, Waiting};
pub use reaper::Due;
pub use reports::{Report, RetryDecision, Verdict, judge_report};
pub use sluice_model::{from_bucket, task_view, to_bucket};
pub use step::{CallbackJob, Claimed, Input, Read, Reply, Step, StepError, Submitted};
pub use views::failure as failure_view;
pub use workers::WorkerView;

use sluice_model::{
    Actor, Admission, Change, Event, IdGenerator, IllegalTransition, KeyRecord, NewTask, Recovery,
    State, Submission, Task, TaskId, TaskWrite, WorkerEvent,
};
use workers::Workers;

/// How a submission's idempotency key relates to what is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyVerdict {
    /// No task holds this key (or there is no key): create one.
    New,
    /// The same body was submitted before: answer with that task.
    Replay(TaskId),
    /// Another body holds this key.
    Conflict(TaskId),
}

pub fn judge_key(existing: Option<&KeyRecord>, fingerprint: &[u8; 32]) -> KeyVerdict {
    match existing {
        None => KeyVerdict::New,
        Some(record) if record.fingerprint == *fingerprint => KeyVerdict::Replay(record.task_id),
        Some(record) => KeyVerdict::Conflict(record.task_id),
    }
}

/// What the engine knows about the whole system at one moment, for status and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Snapshot {
    pub tasks_by_state: std::collections::BTreeMap<State, u64>,
    pub queued_by_bucket: std::collections::BTreeMap<sluice_model::Priority, usize>,
    /// When the task first in line of each non-empty bucket was submitted: with FIFO ranks,
    /// the one that has waited longest.
    pub first_in_line_created_at_ms: std::collections::BTreeMap<sluice_model::Priority, u64>,
    pub illegal_transitions_total: u64,
    pub last_event_seq: u64,
    pub workers: usize,
    pub bucket_weights: [u32; 3],
    /// Leased tasks per concurrency key, for the keys that have any.
    pub keys_running: std::collections::BTreeMap<String, u32>,
    /// The most memory one GPU of any known worker has; none while no worker has a GPU.
    pub largest_gpu_memory_mb: Option<u64>,
}

/// `EngineOptions::batch_wait_ms` by default: urgent never waits for a batch; normal and
/// low wait as long as a claim asks, up to `MAX_BATCH_WAIT_MS`.
pub const DEFAULT_BATCH_WAIT_MS: [u64; 3] = [0, MAX_BATCH_WAIT_MS, MAX_BATCH_WAIT_MS];

/// The longest a batch may wait to fill, for a claim's `max_wait_ms` and a bucket's cap.
pub const MAX_BATCH_WAIT_MS: u64 = 10_000;

/// The engine's settings: bounds and durations, all in ms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// How long a claim or a lease heartbeat holds a task.
    pub lease_ms: u64,
    /// A worker whose last heartbeat is older than this gets no tasks.
    pub worker_stale_ms: u64,
    /// A worker silent this long and holding no lease is forgotten.
    pub forget_worker_ms: u64,
    /// Tasks looked at per bucket to find one that fits a worker, so a claim never scans a
    /// whole queue of tasks that need another kind of worker.
    pub fit_scan_limit: usize,
    /// Tasks one claim may take.
    pub max_claim: usize,
    /// Workers known at once.
    pub max_workers: usize,
    pub breaker: BreakerOptions,
    /// How often the aging policy sees the waiting tasks, and bucket weights are refreshed.
    pub aging_interval_ms: u64,
    /// Task kinds split on admission by the split policy (and merged by the merge policy).
    pub split_kinds: Vec<String>,
    /// Concurrency limits at start (the configuration's and those set through the API).
    pub concurrency_limits: Vec<sluice_model::ConcurrencyLimit>,
    /// Vector collections declared at start.
    pub collections: Vec<sluice_model::Collection>,
    /// Preemption, when on: how long an urgent task waits with no worker free before the
    /// attempt of a lower bucket is stopped for it (and how often one worker may be asked to).
    pub preempt_after_ms: Option<u64>,
    /// How long a task naming a model waits for a worker with that model loaded before it
    /// may go to one that must load it.
    pub affinity_wait_ms: u64,
    /// Per bucket (urgent, normal, low), the longest a task waits in its bucket for a GPU
    /// batch to fill (a batch claim's own `max_wait_ms` may be shorter): 0 hands a batch
    /// holding such a task out at once, so urgent work never waits for a batch.
    pub batch_wait_ms: [u64; 3],
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            lease_ms: 30_000,
            worker_stale_ms: 30_000,
            forget_worker_ms: 3_600_000,
            fit_scan_limit: 256,
            max_claim: 64,
            max_workers: 10_000,
            breaker: BreakerOptions::default(),
            aging_interval_ms: 1_000,
            split_kinds: vec!["vector.search".to_owned()],
            concurrency_limits: Vec::new(),
            collections: Vec::new(),
            preempt_after_ms: None,
            affinity_wait_ms: 10_000,
            batch_wait_ms: DEFAULT_BATCH_WAIT_MS,
        }
    }
}

/// The priority policy's default bucket weights: urgent, normal, low.
pub const DEFAULT_BUCKET_WEIGHTS: [u32; 3] = [60, 35, 5];

#[derive(Debug)]
pub struct Engine {
    options: EngineOptions,
    ids: IdGenerator,
    /// Events are numbered from 1, so `after = 0` reads the log from its start.
    next_event_seq: u64,
    next_worker_event_seq: u64,
    queues: BucketQueues,
    workers: Workers,
    timers: timers::Timers,
    wrr: wrr::SmoothWrr,
    bucket_weights: [u32; 3],
    /// Fair share inside a bucket, as the priority policy last gave it.
    tenant_weights: TenantWeights,
    concurrency_limits: sluice_model::ConcurrencyLimits,
    /// Which leased tasks hold which concurrency key.
    key_use: concurrency::KeyUse,
    /// Urgent tasks for which a preempted attempt's place is being freed, and where.
    reserved: std::collections::BTreeMap<TaskId, preempt::Reservation>,
    /// Which workers have which models loaded.
    warm_models: placement::WarmModels,
    /// Vector collections declared by an admin.
    collections: collections::Declared,
    tasks_by_state: [u64; 12],
    illegal_transitions: u64,
    /// When the next tick ages the queues.
    next_aging_ms: u64,
    /// The server is draining: claims are refused, so an attempt stopped now could not be
    /// replaced by the urgent task it made room for; no more are preempted.
    draining: bool,
}

impl Default for Engine {
    fn default() -> Self {
        Engine::new(EngineOptions::default())
    }
}

impl Engine {
    pub fn new(options: EngineOptions) -> Self {
        let concurrency_limits = sluice_model::ConcurrencyLimits::new(&options.concurrency_limits);
        Engine {
            concurrency_limits,
            key_use: concurrency::KeyUse::default(),
            reserved: std::collections::BTreeMap::new(),
            warm_models: placement::WarmModels::default(),
            collections: collections::Declared::new(&options.collections),
            options,
            ids: IdGenerator::default(),
            next_event_seq: 1,
            next_worker_event_seq: 1,
            queues: BucketQueues::default(),
            workers: Workers::default(),
            timers: timers::Timers::default(),
            wrr: wrr::SmoothWrr::default(),
            bucket_weights: DEFAULT_BUCKET_WEIGHTS,
            tenant_weights: TenantWeights::default(),
            tasks_by_state: [0; 12],
            illegal_transitions: 0,
            next_aging_ms: 0,
            draining: false,
        }
    }

    /// Rebuilds the in-memory indexes from what the store holds. Returns the engine and the
    /// tasks that were durable but not yet admitted when the last process stopped.
    pub fn recover(recovery: Recovery, options: EngineOptions) -> (Engine, Vec<TaskId>) {
        let mut engine = Engine {
            ids: recovery
                .last_task_id
                .map(IdGenerator::resume_after)
                .unwrap_or_default(),
            next_event_seq: recovery.last_event_seq + 1,
            next_worker_event_seq: recovery.last_worker_event_seq + 1,
            tasks_by_state: recovery.tasks_by_state,
            ..Engine::new(options)
        };
        for entry in &recovery.queued {
            engine.timers.set(entry.id, entry.deadline_at_ms);
        }
        engine.queues.extend(recovery.queued);
        let mut unadmitted = Vec::new();
        for task in &recovery.live {
            if task.state == State::Created {
                unadmitted.push(task.id);
            } else {
                engine.index(task, None);
            }
        }
        (engine, unadmitted)
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The weights the buckets are served by, as the priority policy last gave them.
    pub fn set_bucket_weights(&mut self, weights: [u32; 3]) {
        self.bucket_weights = weights;
    }

    /// The concurrency limits in force from now on (the whole set).
    pub fn set_concurrency_limits(&mut self, limits: &[sluice_model::ConcurrencyLimit]) {
        self.concurrency_limits = sluice_model::ConcurrencyLimits::new(limits);
    }

    pub fn concurrency_limits(&self) -> &sluice_model::ConcurrencyLimits {
        &self.concurrency_limits
    }

    /// Takes the settings that change while it runs (the policy's bucket and tenant weights,
    /// the concurrency limits, draining) from the engine this one replaces.
    pub fn inherit_settings(&mut self, from: &Engine) {
        self.bucket_weights = from.bucket_weights;
        self.tenant_weights = from.tenant_weights.clone();
        self.concurrency_limits = from.concurrency_limits.clone();
        self.draining = from.draining;
    }

    /// The server has begun to drain: from now on nothing is preempted. There is no way back;
    /// a drained server stops.
    pub fn drain(&mut self) {
        self.draining = true;
        self.reserved.clear();
    }

    /// The tenants' weights for fair share inside each bucket, as the priority policy last
    /// gave them (by name; a tenant not named weighs 1).
    pub fn set_tenant_weights(&mut self, weights: &[(String, u32)]) {
        self.tenant_weights = TenantWeights::from_names(weights);
    }

    /// Whether tasks of `kind` are split on admission.
    pub fn splits(&self, kind: &str) -> bool {
        self.options.split_kinds.iter().any(|k| k == kind)
    }

    pub fn queues(&self) -> &BucketQueues {
        &self.queues
    }

    pub fn tasks_in(&self, state: State) -> u64 {
        self.tasks_by_state[usize::from(state.code())]
    }

    /// Takes tasks that retention removed out of the counts.
    pub fn forget(&mut self, tasks_by_state: &[u64; 12]) {
        for (count, removed) in self.tasks_by_state.iter_mut().zip(tasks_by_state) {
            debug_assert!(*count >= *removed, "retention removed more than there were");
            *count = count.saturating_sub(*removed);
        }
    }

    /// The `seq` the next event will get: a number that only grows, for arrival order.
    pub fn next_event_seq(&self) -> u64 {
        self.next_event_seq
    }

    pub fn illegal_transitions(&self) -> u64 {
        self.illegal_transitions
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            tasks_by_state: State::ALL
                .into_iter()
                .map(|s| (s, self.tasks_in(s)))
                .collect(),
            queued_by_bucket: sluice_model::Priority::ALL
                .into_iter()
                .map(|b| (b, self.queues.len(b)))
                .collect(),
            first_in_line_created_at_ms: sluice_model::Priority::ALL
                .into_iter()
                .filter_map(|b| {
                    let id = self.queues.front(b)?;
                    Some((b, self.queues.get(id)?.view.created_ms))
                })
                .collect(),
            illegal_transitions_total: self.illegal_transitions,
            last_event_seq: self.next_event_seq - 1,
            workers: self.workers.len(),
            bucket_weights: self.bucket_weights,
            largest_gpu_memory_mb: self.largest_gpu_memory_mb(),
            keys_running: self
                .key_use
                .all()
                .map(|(key, count)| (key.to_owned(), count))
                .collect(),
        }
    }

    /// Plans a new task: created, then admitted as `admission` says, as one atomic change with
    /// one event per step. The task as stored is `change.writes[0].task`.
    pub(crate) fn plan_create(
        &self,
        now_ms: u64,
        random: u128,
        submission: &Submission,
        admission: &Admission,
    ) -> Change {
        let id = self.ids.clone().next(now_ms, random);
        let spec = &submission.spec;
        let mut task = Task {
            id,
            key: spec.key.clone(),
            kind: spec.kind.clone(),
            priority: spec.priority,
            bucket: admission.bucket,
            rank: admission.rank,
            attempt_timeout_ms: admission.attempt_timeout_ms,
            device: spec.device.clone(),
            tenant: spec.tenant.clone(),
            labels: spec.labels.clone(),
            est_exec_ms: spec.est_exec_ms,
            deadline_ms: spec.deadline_ms,
            deadline_at_ms: spec.deadline_ms.map(|d| now_ms.saturating_add(d)),
            max_attempts: spec.max_attempts,
            callback_url: spec.callback_url.clone(),
            resources: spec.resources.clone(),
            concurrency_key: spec.concurrency_key.clone(),
            preemptible: spec.preemptible,
            preemptions: 0,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            attempt: 0,
            state: State::Created,
            bucket_since_ms: now_ms,
            lease: None,
            not_before_ms: None,
            callback: None,
            result: None,
            error: None,
            event_seqs: Vec::new(),
            parent: None,
            family: None,
            retired_leases: Vec::new(),
            variants: admission.variants.tags().collect(),
            first_claimed_at_ms: None,
        };
        let created = self.event(
            0,
            id,
            None,
            State::Created,
            submission
                .submitted_by
                .clone()
                .unwrap_or_else(|| Actor::device(&spec.device)),
            now_ms,
            None,
        );
        task.state = State::Queued;
        let admitted = self.event(
            1,
            id,
            Some(State::Created),
            State::Queued,
            Actor::scheduler(),
            now_ms,
            admission_detail(admission),
        );
        task.event_seqs = vec![created.seq, admitted.seq];
        let key = spec.key.clone().map(|key| {
            (
                key,
                KeyRecord {
                    task_id: id,
                    fingerprint: submission.fingerprint,
                },
            )
        });
        Change {
            new_tasks: vec![NewTask {
                id,
                payload_json: submission.payload_json.clone(),
                key,
            }],
            writes: vec![TaskWrite {
                previous: None,
                task,
            }],
            events: vec![created, admitted],
            worker_events: Vec::new(),
        }
    }

    /// Plans a change of `task` to state `to`. An illegal transition is refused, counted and
    /// logged, and plans nothing.
    pub(crate) fn plan_transition(
        &mut self,
        now_ms: u64,
        task: &Task,
        to: State,
        actor: Actor,
        detail: Option<String>,
    ) -> Result<Change, IllegalTransition> {
        self.plan_with(now_ms, task, &[to], actor, detail, |_| {})
    }

    /// Plans `task` through each state of `path` in turn, one event a step, after `edit`
    /// (applied once, before the first step). The detail goes on the last step.
    fn plan_with(
        &mut self,
        now_ms: u64,
        task: &Task,
        path: &[State],
        actor: Actor,
        detail: Option<String>,
        edit: impl FnOnce(&mut Task),
    ) -> Result<Change, IllegalTransition> {
        let mut after = task.clone();
        edit(&mut after);
        after.updated_at_ms = now_ms;
        let mut events = Vec::with_capacity(path.len());
        let mut from = task.state;
        for (offset, &to) in (0u64..).zip(path) {
            if let Err(illegal) = from.check(to) {
                self.illegal_transitions += 1;
                tracing::warn!(task_id = %task.id, from = %illegal.from, to = %illegal.to, %actor, "illegal transition refused");
                return Err(illegal);
            }
            let last = offset + 1 == path.len() as u64;
            let step_detail = if last { detail.clone() } else { None };
            events.push(self.event(
                offset,
                task.id,
                Some(from),
                to,
                actor.clone(),
                now_ms,
                step_detail,
            ));
            from = to;
        }
        after.state = from;
        after.event_seqs.extend(events.iter().map(|e| e.seq));
        // Ended while a worker holds it (cancelled, or past its deadline): the worker is still
        // computing until it hears of it, so its place stays held (see `Lease::ended_at_ms`).
        let leased = matches!(task.state, State::Claimed | State::Running);
        if leased && matches!(after.state, State::Cancelled | State::TimedOut) {
            if let Some(lease) = &mut after.lease {
                lease.ended_at_ms = Some(now_ms);
            }
        }
        if after.state.is_terminal() && after.callback_url.is_some() && after.callback.is_none() {
            after.callback = Some(sluice_model::Callback {
                attempts: 0,
                next_at_ms: now_ms,
                delivered_at_ms: None,
                gave_up: false,
            });
        }
        Ok(Change {
            new_tasks: Vec::new(),
            writes: vec![TaskWrite {
                previous: Some(task.state),
                task: after,
            }],
            events,
            worker_events: Vec::new(),
        })
    }

    /// Plans a record of something that happened to `task` without changing its state: a
    /// promotion, a refused report. The event goes from the state to itself.
    fn plan_note(
        &self,
        now_ms: u64,
        task: &Task,
        actor: Actor,
        detail: String,
        edit: impl FnOnce(&mut Task),
    ) -> Change {
        let mut after = task.clone();
        edit(&mut after);
        after.updated_at_ms = now_ms;
        let event = self.event(
            0,
            task.id,
            Some(task.state),
            task.state,
            actor,
            now_ms,
            Some(detail),
        );
        after.event_seqs.push(event.seq);
        Change {
            new_tasks: Vec::new(),
            writes: vec![TaskWrite {
                previous: Some(task.state),
                task: after,
            }],
            events: vec![event],
            worker_events: Vec::new(),
        }
    }

    /// Learns a planned change: the next plan builds on it.
    pub(crate) fn apply(&mut self, change: &Change) {
        // Event numbers are gap-free: a change numbers its events on from the engine's next.
        debug_assert!(
            change
                .events
                .iter()
                .zip(self.next_event_seq..)
                .all(|(event, seq)| event.seq == seq),
            "a change's events do not follow on from seq {}",
            self.next_event_seq
        );
        debug_assert!(
            change
                .worker_events
                .iter()
                .zip(self.next_worker_event_seq..)
                .all(|(event, seq)| event.seq == seq),
            "a change's worker events do not follow on from seq {}",
            self.next_worker_event_seq
        );
        if let Some(last) = change.events.last() {
            self.next_event_seq = last.seq + 1;
        }
        if let Some(last) = change.worker_events.last() {
            self.next_worker_event_seq = last.seq + 1;
        }
        for new in &change.new_tasks {
            self.ids = IdGenerator::resume_after(new.id.max(self.ids.last()));
        }
        for write in &change.writes {
            let task = &write.task;
            if let Some(previous) = write.previous {
                self.tasks_by_state[usize::from(previous.code())] -= 1;
            }
            self.tasks_by_state[usize::from(task.state.code())] += 1;
            self.index(task, write.previous);
        }
    }

    /// Moves `task` in the indexes: its queue entry, its worker's lease, its timer.
    fn index(&mut self, task: &Task, previous: Option<State>) {
        let leased = |state: Option<State>| matches!(state, Some(State::Claimed | State::Running));
        if task.state == State::Queued {
            self.queues.push(Waiting::of(task));
        } else if previous == Some(State::Queued) {
            self.queues.remove(task.id);
            self.reserved.remove(&task.id);
        }
        if let Some(lease) = &task.lease {
            if leased(Some(task.state)) || lease.holds_place_after_end() {
                let held = workers::Held {
                    share: lease.gpu.map(|gpu| workers::GpuShare {
                        gpu,
                        memory_mb: task.resources.gpu_memory_mb,
                    }),
                    bucket: task.bucket,
                    preemptible: task.preemptible
                        && task.priority != sluice_model::Priority::Urgent,
                    claimed_at_ms: lease.claimed_at_ms,
                    revoked: lease.revoked_at_ms.is_some(),
                };
                self.workers.hold(&lease.worker, task.id, held);
                if let Some(key) = &task.concurrency_key {
                    self.key_use.hold(task.id, key);
                }
                if previous == Some(State::Queued) {
                    let worker = self.workers.entry(&lease.worker);
                    worker.claims_served += 1;
                    worker.breaker.probing(task.id);
                }
            } else if leased(previous) || lease.stopped_at_ms.is_some() {
                self.workers.release(&lease.worker, task.id);
                self.key_use.release(task.id);
            }
        }
        self.timers.set(task.id, timers::due_at(task));
    }

    /// Numbers a breaker change as the next worker event. Breakers live only in memory, so
    /// their changes are made at once; the event must go into the change being planned.
    fn log_worker_event(
        &mut self,
        now_ms: u64,
        worker: &str,
        actor: Actor,
        change: breaker::BreakerChange,
    ) -> WorkerEvent {
        let seq = self.next_worker_event_seq;
        self.next_worker_event_seq += 1;
        WorkerEvent {
            seq,
            worker: worker.to_owned(),
            at_ms: now_ms,
            from: change.from.to_owned(),
            to: change.to.to_owned(),
            reason: change.reason,
            actor,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &self,
        offset: u64,
        task_id: TaskId,
        from: Option<State>,
        to: State,
        actor: Actor,
        at_ms: u64,
        detail: Option<String>,
    ) -> Event {
        Event {
            seq: self.next_event_seq + offset,
            task_id,
            from,
            to,
            actor,
            at_ms,
            detail,
        }
    }
}

#[cfg(test)]
mod tests;

/// What the admission event says: the priority version that decided, and the experiment
/// variants the task is in.
fn admission_detail(admission: &Admission) -> Option<String> {
    let mut parts: Vec<String> = admission
        .policy_version
        .map(|version| format!("admitted by priority policy v{version}"))
        .into_iter()
        .collect();
    parts.extend(admission.variants.tags().map(|tag| {
        format!(
            "in {} experiment {} as variant {}",
            tag.kind, tag.experiment, tag.variant
        )
    }));
    (!parts.is_empty()).then(|| parts.join("; "))
}
