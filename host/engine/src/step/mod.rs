//! The engine's one entry: `Engine::step` takes an input (a submission, a claim, a report, a
//! heartbeat, a tick of time, ...) with the time, random bits, the policies (`Decide`) and the
//! read side of the store (`Read`), decides everything the input implies — what a claim gets,
//! what a failure becomes, when a family merges, what ages — and returns the `Change` to
//! commit, the reply for whoever sent the input, and the callbacks to deliver. The server's
//! writer thread and the virtual-time driver are two shells around this function; neither
//! decides anything itself.

mod dispatch;
mod split;

use super::{CallbackOutcome, Decide, Engine, KeyVerdict, NoClaim, Report, WorkerView, judge_key};
use rand::{Rng, RngCore};
use sluice_model::{
    Actor, Admission, Change, Heartbeat, IllegalTransition, KeyRecord, State, Submission, Task,
    TaskId, TaskIdMap, TaskSpec, ValidationError,
};
use sluice_store::StoreError;
use std::collections::HashMap;
use std::sync::Arc;

/// What a step reads of the store: the latest record of a task, and an idempotency key. The
/// server's shell answers from what its current group has planned, then its cache, then the
/// store; the driver from its in-memory store.
pub trait Read {
    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError>;
    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError>;
}

/// Everything that can happen to the scheduler, one variant per kind of request or event.
#[derive(Clone, Debug)]
pub enum Input {
    /// New tasks, one admission decision for them all; one answer each, in order.
    Submit(Vec<Submission>),
    Cancel {
        id: TaskId,
        actor: Actor,
    },
    /// Registers or refreshes a worker. Changes only memory: the worker table is not durable.
    Heartbeat {
        worker: String,
        heartbeat: Heartbeat,
    },
    Claim {
        worker: String,
        max: usize,
        /// The worker's name for this claim: sent again, it is answered with the leases it
        /// granted while they are still unstarted, rather than with new ones.
        claim_id: Option<String>,
        /// A claim for one GPU batch rather than any tasks.
        batch: Option<crate::BatchClaim>,
    },
    /// A worker's reports on attempts it holds, each judged by its lease token on its own.
    Reports(Vec<(TaskId, String, Report)>),
    ResetWorker {
        worker: String,
        actor: Actor,
    },
    /// The worker table as it stands; changes nothing.
    Workers,
    /// Time has passed: run what is due, and age the queues once their interval has passed.
    /// `callback_slots` is how many completion callbacks the shell can take for delivery now,
    /// and `callback_bytes` how many bytes of their bodies; the rest stay due for a later tick.
    Tick {
        callback_slots: usize,
        callback_bytes: usize,
    },
    /// How a completion callback's delivery attempt went.
    CallbackDone {
        id: TaskId,
        attempt: u32,
        outcome: CallbackOutcome,
    },
    /// Tasks that were durable but not admitted when the last process stopped.
    Admit(Vec<TaskId>),
    /// A policy version was activated or rolled back: take the priority policy's bucket
    /// weights again now rather than at the next aging tick.
    PoliciesChanged,
    /// The concurrency limits in force from now on (the whole set). Changes only memory: the
    /// set is kept in the catalog by whoever changed it.
    SetConcurrencyLimits(Vec<sluice_model::ConcurrencyLimit>),
    /// The declared vector collections from now on (the whole set). Changes only memory, like
    /// the concurrency limits.
    SetCollections(Vec<sluice_model::Collection>),
    /// The collections known (declared or announced) and their live shards; changes nothing.
    Collections,
    /// The server drains: claims are refused from now on, so no attempt is preempted either
    /// (it would stop work for an urgent task that cannot start). Changes only memory.
    Drain,
    /// Retention removed these ended tasks from the store (counts by state code): they leave
    /// the engine's counts. Changes nothing else.
    Forgotten {
        tasks_by_state: [u64; 12],
    },
}

impl Input {
    /// Worker traffic (claims, reports, heartbeats) goes before submissions that arrived
    /// earlier: workers then wait less, and stay busy.
    pub fn is_worker_traffic(&self) -> bool {
        matches!(
            self,
            Input::Claim { .. } | Input::Reports(_) | Input::Heartbeat { .. } | Input::Workers
        )
    }
}

fn revoked_detail(task_id: TaskId, urgent: Option<TaskId>) -> String {
    let by = urgent.map_or_else(String::new, |id| format!(" by urgent task {id}"));
    format!(
        "task {task_id}'s attempt was preempted{by}: stop it and report `stopped`; \
         the task waits again with no attempt spent"
    )
}

/// Why a step refused an input, or could not finish it.
#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("no task {0}")]
    NotFound(TaskId),
    #[error(
        "idempotency key `{key}` already belongs to task {task_id}, submitted with another body"
    )]
    KeyConflict { key: String, task_id: TaskId },
    #[error("task {task_id} is {state}: {source}")]
    Illegal {
        task_id: TaskId,
        state: State,
        source: IllegalTransition,
    },
    /// A report whose token is not the current attempt's, or whose lease is over. `logged`
    /// says whether this refusal was written on the task's timeline (the first of its attempt).
    #[error("report refused for task {task_id}: {reason}")]
    StaleLease {
        task_id: TaskId,
        reason: String,
        logged: bool,
    },
    /// The task ended while this attempt ran: the worker must stop it and report `stopped`.
    #[error(
        "task {task_id} is {state}: stop the attempt and report `stopped`; its outcome is not kept"
    )]
    AttemptCancelled { task_id: TaskId, state: State },
    /// An urgent task preempted this attempt: the worker must stop it and report `stopped`;
    /// the task waits again with no attempt spent.
    #[error("{}", revoked_detail(*task_id, *urgent))]
    AttemptRevoked {
        task_id: TaskId,
        urgent: Option<TaskId>,
    },
    #[error("no worker {0}: it has never sent a heartbeat, or was forgotten")]
    UnknownWorker(String),
    #[error(transparent)]
    HeartbeatRefused(#[from] crate::HeartbeatRefused),
    #[error("the split policy refused the task: {0}")]
    SplitRefused(String),
    #[error(transparent)]
    InvalidTask(ValidationError),
    /// A bug, not bad input: something the scheduler itself wrote could not be read back.
    #[error("{0}")]
    Internal(String),
    #[error("{0}")]
    PolicyUnavailable(String),
    #[error(transparent)]
    Store(#[from] Arc<StoreError>),
}

impl From<StoreError> for StepError {
    fn from(error: StoreError) -> Self {
        StepError::Store(Arc::new(error))
    }
}

/// A submission's answer: the task, and whether it already existed under the same key.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub task: Task,
    pub replayed: bool,
}

/// A claim's answer: the leased tasks (their records carry the leases), or why there are none.
#[derive(Clone, Debug, Default)]
pub struct Claimed {
    pub leases: Vec<Task>,
    pub refused: Option<NoClaim>,
    /// A batch still filling: no leases, and the claim is worth sending again after this
    /// many ms, or when work arrives.
    pub hold_ms: Option<u64>,
}

/// The answer to one input, of the input's own kind. Built once per step and moved straight
/// to its sender, so the size of a task record inline costs less than a box would.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    Submitted(Vec<Result<Submitted, StepError>>),
    /// A cancel's answer.
    Task(Result<Task, StepError>),
    Reports(Vec<Result<Task, StepError>>),
    Claimed(Result<Claimed, StepError>),
    Workers(Result<Vec<WorkerView>, StepError>),
    Collections(Vec<crate::CollectionView>),
    /// Inputs nobody waits on for a value (ticks, callback outcomes, admissions).
    Done,
}

/// A completion callback to POST: the shell delivers it and answers with `CallbackDone`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallbackJob {
    pub id: TaskId,
    pub attempt: u32,
    pub url: String,
    pub body: Vec<u8>,
}

/// What one step decided.
#[derive(Debug)]
pub struct Step {
    /// What to commit, atomically; its writes are in the order they were planned.
    pub change: Change,
    pub reply: Reply,
    pub callbacks: Vec<CallbackJob>,
}

/// One step in progress: the engine, what the step has planned so far (read before the store),
/// and the step's inputs of time, chance and policy.
pub(super) struct Stepper<'a> {
    engine: &'a mut Engine,
    read: &'a dyn Read,
    decide: &'a dyn Decide,
    random: &'a mut dyn RngCore,
    now_ms: u64,
    change: Change,
    /// Where each task's latest write sits in `change.writes`.
    latest_write: TaskIdMap<usize>,
    /// Keys this step created, for a batch that names one key twice.
    keys: HashMap<String, KeyRecord>,
    callbacks: Vec<CallbackJob>,
}

impl Engine {
    /// Decides what `input` does at `now_ms`. Nothing is read but through `read` and the
    /// engine itself, and nothing is drawn but from `random`, so a run replays from its inputs
    /// and seed. The engine's indexes already include the returned change, so the next step
    /// builds on it; if the shell cannot commit it, the shell rebuilds the engine from the
    /// store (`Engine::recover`), so memory never runs ahead of disk.
    pub fn step(
        &mut self,
        input: Input,
        now_ms: u64,
        random: &mut dyn RngCore,
        decide: &dyn Decide,
        read: &dyn Read,
    ) -> Step {
        let mut stepper = Stepper {
            engine: self,
            read,
            decide,
            random,
            now_ms,
            change: Change::default(),
            latest_write: TaskIdMap::default(),
            keys: HashMap::new(),
            callbacks: Vec::new(),
        };
        let reply = stepper.run(input);
        Step {
            change: stepper.change,
            reply,
            callbacks: stepper.callbacks,
        }
    }
}

impl Stepper<'_> {
    fn run(&mut self, input: Input) -> Reply {
        let now_ms = self.now_ms;
        match input {
            Input::Submit(submissions) => Reply::Submitted(self.submit_all(submissions)),
            Input::Cancel { id, actor } => Reply::Task(self.cancel(id, actor)),
            Input::Heartbeat { worker, heartbeat } => Reply::Workers(
                self.engine
                    .heartbeat(now_ms, &worker, heartbeat)
                    .map(|()| self.engine.worker(now_ms, &worker).into_iter().collect())
                    .map_err(StepError::from),
            ),
            Input::Claim {
                worker,
                max,
                claim_id,
                batch,
            } => Reply::Claimed(self.claim(&worker, max, claim_id.as_deref(), batch.as_ref())),
            Input::Reports(reports) => Reply::Reports(
                reports
                    .into_iter()
                    .map(|(id, token, report)| self.report(id, &token, report))
                    .collect(),
            ),
            Input::ResetWorker { worker, actor } => {
                Reply::Workers(self.reset_worker(&worker, actor))
            }
            Input::Workers => Reply::Workers(Ok(self.engine.workers(now_ms))),
            Input::Tick {
                callback_slots,
                callback_bytes,
            } => {
                self.tick(callback_slots, callback_bytes);
                Reply::Done
            }
            Input::CallbackDone {
                id,
                attempt,
                outcome,
            } => {
                self.callback_done(id, attempt, &outcome);
                Reply::Done
            }
            Input::Admit(ids) => {
                self.admit(&ids);
                Reply::Done
            }
            Input::Forgotten { tasks_by_state } => {
                self.engine.forget(&tasks_by_state);
                Reply::Done
            }
            Input::PoliciesChanged => {
                self.refresh_weights(now_ms);
                Reply::Done
            }
            Input::SetConcurrencyLimits(limits) => {
                self.engine.set_concurrency_limits(&limits);
                Reply::Done
            }
            Input::SetCollections(collections) => {
                self.engine.set_collections(collections);
                Reply::Done
            }
            Input::Collections => Reply::Collections(self.engine.collections(now_ms)),
            Input::Drain => {
                self.engine.drain();
                Reply::Done
            }
        }
    }

    /// Asks the priority policy for the buckets' and the tenants' weights again.
    fn refresh_weights(&mut self, now_ms: u64) {
        let weights = self.decide.bucket_weights(now_ms);
        self.engine.set_bucket_weights(weights);
        let tenants = self.decide.tenant_weights(now_ms);
        self.engine.set_tenant_weights(&tenants);
    }

    fn submit_all(&mut self, submissions: Vec<Submission>) -> Vec<Result<Submitted, StepError>> {
        // One policy call for the whole input; a replayed submission's admission is simply
        // not used.
        let specs: Vec<&TaskSpec> = submissions.iter().map(|s| &s.spec).collect();
        let admissions = self
            .decide
            .admit(self.now_ms, self.engine.next_event_seq(), &specs);
        submissions
            .into_iter()
            .enumerate()
            .map(|(i, submission)| {
                let admission = admissions.get(i).copied().unwrap_or_else(|| {
                    let spec = &submission.spec;
                    Admission::native(spec.priority, spec.est_exec_ms, 0)
                });
                self.submit(submission, &admission)
            })
            .collect()
    }

    fn submit(
        &mut self,
        submission: Submission,
        admission: &Admission,
    ) -> Result<Submitted, StepError> {
        let existing = match &submission.spec.key {
            Some(key) => match self.keys.get(key) {
                Some(record) => Some(*record),
                None => self.read.key(key)?,
            },
            None => None,
        };
        match judge_key(existing.as_ref(), &submission.fingerprint) {
            KeyVerdict::Replay(id) => Ok(Submitted {
                task: self.task(id)?,
                replayed: true,
            }),
            KeyVerdict::Conflict(task_id) => Err(StepError::KeyConflict {
                key: submission.spec.key.unwrap_or_default(),
                task_id,
            }),
            KeyVerdict::New if self.engine.splits(&submission.spec.kind) => Ok(Submitted {
                task: self.create_split(&submission, admission)?,
                replayed: false,
            }),
            KeyVerdict::New => {
                let random = self.random.random();
                let change = self
                    .engine
                    .plan_create(self.now_ms, random, &submission, admission);
                let _admit = tracing::debug_span!(
                    target: sluice_model::TASK_SPANS,
                    "admit",
                    task_id = %change.writes[0].task.id,
                    bucket = admission.bucket.as_str(),
                    rank = admission.rank,
                    attempt_timeout_ms = admission.attempt_timeout_ms,
                    policy_version = admission.policy_version,
                )
                .entered();
                Ok(Submitted {
                    task: self.plan(change),
                    replayed: false,
                })
            }
        }
    }

    fn cancel(&mut self, id: TaskId, actor: Actor) -> Result<Task, StepError> {
        let task = self.task(id)?;
        let change = self
            .engine
            .plan_transition(self.now_ms, &task, State::Cancelled, actor, None)
            .map_err(|source| StepError::Illegal {
                task_id: id,
                state: task.state,
                source,
            })?;
        Ok(self.plan(change))
    }

    fn admit(&mut self, ids: &[TaskId]) {
        for &id in ids {
            let task = match self.task(id) {
                Ok(task) => task,
                Err(error) => {
                    tracing::error!(task_id = %id, %error, "cannot read a task to admit");
                    continue;
                }
            };
            if let Ok(change) = self.engine.plan_transition(
                self.now_ms,
                &task,
                State::Queued,
                Actor::scheduler(),
                None,
            ) {
                self.plan(change);
            }
        }
    }

    /// The task as this step sees it: its latest planned write, or else the store's record.
    fn task(&self, id: TaskId) -> Result<Task, StepError> {
        if let Some(&index) = self.latest_write.get(&id) {
            return Ok(self.change.writes[index].task.clone());
        }
        self.read.task(id)?.ok_or(StepError::NotFound(id))
    }

    /// Adds a planned change to the step and teaches it to the engine, then follows what it
    /// means for families; returns the task the change writes first (the one asked about).
    fn plan(&mut self, change: Change) -> Task {
        debug_assert!(!change.writes.is_empty(), "a plan writes at least one task");
        self.engine.apply(&change);
        let first_write = self.change.writes.len();
        for (offset, write) in change.writes.iter().enumerate() {
            self.latest_write
                .insert(write.task.id, first_write + offset);
        }
        for new in &change.new_tasks {
            if let Some((key, record)) = &new.key {
                self.keys.insert(key.clone(), *record);
            }
        }
        let first = change.writes[0].task.clone();
        let families: Vec<(Option<State>, Task)> = change
            .writes
            .iter()
            .filter(|write| write.task.parent.is_some() || write.task.family.is_some())
            .map(|write| (write.previous, write.task.clone()))
            .collect();
        self.change.merge(change);
        if !families.is_empty() {
            self.follow_families(&families);
        }
        first
    }
}
