//! The writer thread: the only owner of the engine and the only caller of `Store::commit`.
//! It takes the requests waiting in its inbox as one group, plans each one against the engine
//! and against what the group has planned so far, commits the group as one change, and hands
//! the group's answers to the flusher.

use super::flusher::Delivery;
use super::{Clock, Command, Decider, SchedulerError, SubmitResult, Submitted};
use crate::engine::{Engine, KeyVerdict, Snapshot, judge_key};
use crate::model::{Actor, Admission, State, Submission, Task, TaskId, TaskSpec};
use crate::store::{Change, KeyRecord, Store, StoreError};
use arc_swap::ArcSwap;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::SyncSender;
use tokio::sync::{mpsc, oneshot, watch};

/// Bounds on one group. Small groups let the writer plan the next group while the flusher
/// syncs the last (the flusher still covers every group waiting with one sync); with 256
/// clients, caps of 64 / 256 / 2048 measured 11.1k / 10.4k / 10.1k submissions/s. The payload
/// bound keeps one batch's bytes in check when payloads are large. Both are checked between
/// requests, so one batch request of up to 1,000 tasks always goes whole into one group.
const MAX_GROUP_TASKS: usize = 64;
const MAX_GROUP_PAYLOAD_BYTES: usize = 8 << 20;

/// Commands taken from the inbox but not yet planned, at most. Taking a few ahead lets worker
/// traffic (claims, reports, heartbeats) go before submissions that arrived earlier: workers
/// then wait less, and stay busy. `sluice bench e2e`: 9.0–10.1k → 10.4–11.9k tasks/s.
const MAX_WAITING_COMMANDS: usize = 256;

/// Commands taken from the inbox, worker traffic first, each kind in arrival order.
#[derive(Default)]
struct Waiting {
    workers: std::collections::VecDeque<Command>,
    others: std::collections::VecDeque<Command>,
}

impl Waiting {
    fn push(&mut self, command: Command) {
        match command {
            Command::Claim { .. }
            | Command::Report { .. }
            | Command::ReportMany { .. }
            | Command::Heartbeat { .. }
            | Command::Workers { .. } => self.workers.push_back(command),
            _ => self.others.push_back(command),
        }
    }

    fn pop(&mut self) -> Option<Command> {
        self.workers.pop_front().or_else(|| self.others.pop_front())
    }

    fn len(&self) -> usize {
        self.workers.len() + self.others.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a group has planned but not yet committed, and the answers waiting on it.
#[derive(Default)]
pub(super) struct Group {
    pub(super) change: Change,
    keys: HashMap<String, KeyRecord>,
    /// Where each task's latest write sits in `change.writes`.
    latest_write: HashMap<TaskId, usize>,
    payload_bytes: usize,
    deliveries: Vec<Delivery>,
    /// Answers sent once the group's commit is written, before a sync covers it.
    written: Vec<Delivery>,
}

impl Group {
    fn is_full(&self) -> bool {
        self.change.writes.len() >= MAX_GROUP_TASKS || self.payload_bytes >= MAX_GROUP_PAYLOAD_BYTES
    }

    /// Queues an answer, to be sent once a sync covers this group's commit.
    pub(super) fn answer<T: Durable + Send + 'static>(
        &mut self,
        reply: oneshot::Sender<T>,
        answer: T,
    ) {
        self.deliveries.push(delivery(reply, answer));
    }

    /// Queues an answer, to be sent once this group's commit is written to the log (it then
    /// survives the process, not yet a power loss).
    pub(super) fn answer_written<T: Durable + Send + 'static>(
        &mut self,
        reply: oneshot::Sender<T>,
        answer: T,
    ) {
        self.written.push(delivery(reply, answer));
    }
}

/// Sends `answer` once what it waits for is done, or the error that stopped it.
fn delivery<T: Durable + Send + 'static>(reply: oneshot::Sender<T>, answer: T) -> Delivery {
    Box::new(move |outcome| {
        let _ = reply.send(match outcome {
            Ok(()) => answer,
            Err(error) => answer.failed(error),
        });
    })
}

pub(crate) struct Writer {
    pub(super) engine: Engine,
    store: Arc<dyn Store>,
    pub(super) clock: Box<dyn Clock>,
    pub(super) decider: Arc<dyn Decider>,
    pub(super) random: SmallRng,
    flusher: SyncSender<Delivery>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    work_queued: Arc<super::WorkSignal>,
    pub(super) callback_jobs: mpsc::Sender<super::callbacks::Job>,
    pub(super) aging_interval_ms: u64,
    pub(super) next_aging_ms: u64,
    cache: super::task_cache::TaskCache,
    /// Task kinds split on admission by the split policy.
    pub(super) split_kinds: Vec<String>,
    /// See `SchedulerOptions::sync_claims`.
    pub(super) sync_claims: bool,
    pub(super) metrics: Arc<crate::telemetry::TaskMetrics>,
    /// Told the last event `seq` each sync covers.
    pub(super) durable_event_seq: Option<watch::Sender<u64>>,
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        engine: Engine,
        store: Arc<dyn Store>,
        clock: Box<dyn Clock>,
        decider: Arc<dyn Decider>,
        flusher: SyncSender<Delivery>,
        snapshot: Arc<ArcSwap<Snapshot>>,
        work_queued: Arc<super::WorkSignal>,
        callback_jobs: mpsc::Sender<super::callbacks::Job>,
        aging_interval_ms: u64,
    ) -> Self {
        Writer {
            engine,
            store,
            clock,
            decider,
            random: SmallRng::from_os_rng(),
            flusher,
            snapshot,
            work_queued,
            callback_jobs,
            aging_interval_ms,
            next_aging_ms: 0,
            cache: super::task_cache::TaskCache::default(),
            split_kinds: Vec::new(),
            sync_claims: false,
            metrics: Arc::default(),
            durable_event_seq: None,
        }
    }

    pub(crate) fn run(mut self, mut inbox: mpsc::Receiver<Command>) {
        let mut waiting = Waiting::default();
        let mut last_was_workers_only = false;
        loop {
            if waiting.is_empty() {
                let Some(first) = inbox.blocking_recv() else {
                    break;
                };
                waiting.push(first);
            }
            while waiting.len() < MAX_WAITING_COMMANDS {
                match inbox.try_recv() {
                    Ok(command) => waiting.push(command),
                    Err(_) => break,
                }
            }
            let mut group = Group::default();
            let mut open = true;
            // A group of worker traffic takes no submissions: those go in the next group, so a
            // claim's answer does not wait for a batch of them to be planned and logged. When
            // both wait, the two kinds of group take turns, so neither starves.
            let others_turn = last_was_workers_only && !waiting.others.is_empty();
            let workers_only = !waiting.workers.is_empty() && !others_turn;
            last_was_workers_only = workers_only;
            while open && !group.is_full() {
                let next = if workers_only {
                    waiting.workers.pop_front()
                } else {
                    waiting.pop()
                };
                let Some(command) = next else {
                    break;
                };
                open = self.handle(command, &mut group);
            }
            self.finish(group);
            self.snapshot.store(Arc::new(self.engine.snapshot()));
            if !open {
                break;
            }
        }
        // Dropping the commands still waiting answers each with `ShuttingDown`.
        drop(waiting);
        inbox.close();
    }

    /// Plans one command into the group; false once told to shut down.
    fn handle(&mut self, command: Command, group: &mut Group) -> bool {
        match command {
            Command::Submit { submissions, reply } => {
                // One policy call for the whole command; a replayed submission's admission
                // is simply not used.
                let specs: Vec<&TaskSpec> = submissions.iter().map(|s| &s.spec).collect();
                let admissions =
                    self.decider
                        .admit(self.clock.now_ms(), self.engine.next_event_seq(), &specs);
                let results: Vec<SubmitResult> = submissions
                    .into_iter()
                    .enumerate()
                    .map(|(i, submission)| {
                        let admission = admissions.get(i).copied().unwrap_or_else(|| {
                            let spec = &submission.spec;
                            Admission::native(spec.priority, spec.est_exec_ms, 0)
                        });
                        self.submit(submission, &admission, group)
                    })
                    .collect();
                group.answer(reply, results);
                true
            }
            Command::Cancel { id, actor, reply } => {
                let result = self.cancel(id, actor, group);
                group.answer(reply, result);
                true
            }
            Command::Heartbeat {
                worker,
                heartbeat,
                reply,
            } => {
                let now_ms = self.clock.now_ms();
                let answer = self
                    .engine
                    .heartbeat(now_ms, &worker, heartbeat)
                    .map(|()| self.engine.worker(now_ms, &worker).into_iter().collect())
                    .map_err(SchedulerError::from);
                let _ = reply.send(answer);
                true
            }
            Command::Claim { worker, max, reply } => {
                let answer = self.claim(&worker, max, group);
                if self.sync_claims {
                    group.answer(reply, answer);
                } else {
                    group.answer_written(reply, answer);
                }
                true
            }
            Command::Report {
                id,
                token,
                report,
                reply,
            } => {
                let answer = self.report(id, &token, report, group);
                group.answer(reply, answer);
                true
            }
            Command::ReportMany { reports, reply } => {
                let answers = reports
                    .into_iter()
                    .map(|(id, token, report)| self.report(id, &token, report, group))
                    .collect();
                group.answer(reply, answers);
                true
            }
            Command::ResetWorker {
                worker,
                actor,
                reply,
            } => {
                let answer = self.reset_worker(&worker, actor, group);
                group.answer(reply, answer);
                true
            }
            Command::Workers { reply } => {
                let _ = reply.send(self.engine.workers(self.clock.now_ms()));
                true
            }
            Command::Tick { reply } => {
                self.tick(group);
                if let Some(reply) = reply {
                    group.answer(reply, Ok(()));
                }
                true
            }
            Command::CallbackDone {
                id,
                attempt,
                outcome,
            } => {
                self.callback_done(id, attempt, &outcome, group);
                true
            }
            Command::Shutdown => false,
        }
    }

    fn finish(&mut self, group: Group) {
        let queued = group
            .change
            .writes
            .iter()
            .any(|write| write.task.state == State::Queued);
        if queued {
            self.work_queued.send();
        }
        let committed = if group.change.is_empty() {
            Ok(())
        } else {
            self.store.commit(&group.change)
        };
        match committed {
            Ok(()) => {
                self.metrics.observe(&group.change);
                for delivery in group.written {
                    delivery(Ok(()));
                }
                let deliveries = group.deliveries;
                let durable = self
                    .durable_event_seq
                    .clone()
                    .zip(group.change.events.last().map(|event| event.seq));
                let all: Delivery = Box::new(move |synced| {
                    if let (Some((sender, seq)), Ok(())) = (&durable, &synced) {
                        // Syncs run in commit order, so the number only grows.
                        sender.send_if_modified(|last| {
                            let newer = seq > last;
                            *last = (*last).max(*seq);
                            newer
                        });
                    }
                    for delivery in deliveries {
                        delivery(synced.clone());
                    }
                });
                if let Err(unsent) = self.flusher.send(all) {
                    (unsent.0)(Err(Arc::new(StoreError::Io(std::io::Error::other(
                        "the flusher has stopped",
                    )))));
                }
            }
            Err(error) => {
                tracing::error!(%error, "commit failed; answering its requests with an error");
                let error = Arc::new(error);
                for delivery in group.written.into_iter().chain(group.deliveries) {
                    delivery(Err(error.clone()));
                }
                self.resync();
            }
        }
    }

    /// After a failed commit the engine is ahead of the store: rebuild it from the store.
    fn resync(&mut self) {
        self.cache.clear();
        match self.store.recover() {
            Ok(recovery) => {
                let options = self.engine.options().clone();
                let mut engine = Engine::recover(recovery, options).0;
                engine.set_bucket_weights(self.engine.snapshot().bucket_weights);
                self.engine = engine;
            }
            Err(error) => tracing::error!(%error, "cannot re-read the store after a failed commit"),
        }
    }

    /// Tasks that were durable but not admitted when the last process stopped.
    pub(crate) fn admit_recovered(&mut self, ids: &[TaskId]) -> Result<(), SchedulerError> {
        let mut group = Group::default();
        for &id in ids {
            let task = self.task(id, &group)?;
            let now_ms = self.clock.now_ms();
            if let Ok(change) =
                self.engine
                    .plan_transition(now_ms, &task, State::Queued, Actor::scheduler(), None)
            {
                self.plan(change, &mut group);
            }
        }
        if !group.change.is_empty() {
            self.store.commit(&group.change)?;
            self.store.sync()?;
            self.metrics.observe(&group.change);
            if let (Some(sender), Some(last)) =
                (&self.durable_event_seq, group.change.events.last())
            {
                sender.send_replace(last.seq);
            }
        }
        self.snapshot.store(Arc::new(self.engine.snapshot()));
        Ok(())
    }

    fn submit(
        &mut self,
        submission: Submission,
        admission: &Admission,
        group: &mut Group,
    ) -> SubmitResult {
        let existing = match &submission.spec.key {
            Some(key) => match group.keys.get(key) {
                Some(record) => Some(*record),
                None => self.store.key(key)?,
            },
            None => None,
        };
        match judge_key(existing.as_ref(), &submission.fingerprint) {
            KeyVerdict::Replay(id) => Ok(Submitted {
                task: self.task(id, group)?,
                replayed: true,
            }),
            KeyVerdict::Conflict(task_id) => Err(SchedulerError::KeyConflict {
                key: submission.spec.key.unwrap_or_default(),
                task_id,
            }),
            KeyVerdict::New if self.splits(&submission.spec.kind) => Ok(Submitted {
                task: self.create_split(&submission, admission, group)?,
                replayed: false,
            }),
            KeyVerdict::New => {
                let now_ms = self.clock.now_ms();
                let change =
                    self.engine
                        .plan_create(now_ms, self.random.random(), &submission, admission);
                let _admit = tracing::debug_span!(
                    target: crate::telemetry::TASK_SPANS,
                    "admit",
                    task_id = %change.writes[0].task.id,
                    bucket = admission.bucket.as_str(),
                    rank = admission.rank,
                    attempt_timeout_ms = admission.attempt_timeout_ms,
                    policy_version = admission.policy_version,
                )
                .entered();
                Ok(Submitted {
                    task: self.plan(change, group),
                    replayed: false,
                })
            }
        }
    }

    fn cancel(
        &mut self,
        id: TaskId,
        actor: Actor,
        group: &mut Group,
    ) -> Result<Task, SchedulerError> {
        let task = self.task(id, group)?;
        let now_ms = self.clock.now_ms();
        let change = self
            .engine
            .plan_transition(now_ms, &task, State::Cancelled, actor, None)
            .map_err(|source| SchedulerError::Illegal {
                task_id: id,
                state: task.state,
                source,
            })?;
        Ok(self.plan(change, group))
    }

    /// The task as the group sees it: its latest planned write, or else the store's record.
    pub(super) fn task(&self, id: TaskId, group: &Group) -> Result<Task, SchedulerError> {
        if let Some(&index) = group.latest_write.get(&id) {
            return Ok(group.change.writes[index].task.clone());
        }
        if let Some(task) = self.cache.get(id) {
            return Ok(task.clone());
        }
        self.store.task(id)?.ok_or(SchedulerError::NotFound(id))
    }

    /// Adds a planned change to the group and teaches it to the engine; returns the task the
    /// change writes first (the one a request asked about).
    pub(super) fn plan(&mut self, change: Change, group: &mut Group) -> Task {
        self.engine.apply(&change);
        let first_write = group.change.writes.len();
        for (offset, write) in change.writes.iter().enumerate() {
            group
                .latest_write
                .insert(write.task.id, first_write + offset);
            self.cache.put(&write.task);
        }
        for new in &change.new_tasks {
            group.payload_bytes += new.payload_json.len();
            if let Some((key, record)) = &new.key {
                group.keys.insert(key.clone(), *record);
            }
        }
        let first = change.writes[0].task.clone();
        let families: Vec<(Option<State>, Task)> = change
            .writes
            .iter()
            .filter(|write| write.task.parent.is_some() || write.task.family.is_some())
            .map(|write| (write.previous, write.task.clone()))
            .collect();
        group.change.merge(change);
        if !families.is_empty() {
            self.follow_families(&families, group);
        }
        first
    }
}

/// An answer that becomes an error when the sync it waits for fails.
pub(crate) trait Durable {
    fn failed(self, error: Arc<StoreError>) -> Self;
}

impl<T> Durable for Result<T, SchedulerError> {
    fn failed(self, error: Arc<StoreError>) -> Self {
        self.and(Err(SchedulerError::Store(error)))
    }
}

impl<T> Durable for Vec<Result<T, SchedulerError>> {
    fn failed(self, error: Arc<StoreError>) -> Self {
        self.into_iter()
            .map(|item| item.failed(error.clone()))
            .collect()
    }
}
