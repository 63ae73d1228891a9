//! The writer thread: the only owner of the engine, and the only one that plans a change;
//! each planned group is committed by `committer::commit`, on this thread or the committer's.
//! It takes the requests waiting in its inbox as one group, runs each through the engine's
//! step (which reads what the group has planned so far before the store), commits the group as
//! one change, and hands the group's answers to the flusher. It decides nothing itself.

use super::committer::{self, InFlight, Job, Pipeline};
use super::flusher::Delivery;
use super::keys_ahead::{KeyReader, Keys, PendingKeys};
use super::{Answer, ClaimAnswer, Clock, Command, SchedulerError};
use arc_swap::ArcSwap;
use rand::SeedableRng;
use rand::rngs::StdRng;
use sluice_engine::{Decide, Engine, Input, Read, Reply, Snapshot, Step, StepError};
use sluice_model::{Change, KeyRecord, State, Task, TaskId, TaskIdMap};
use sluice_store::{Store, StoreError};
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
/// On a store across the network a commit costs a round trip and the database's own work per
/// statement whatever its size, and the next group is planned while it runs: larger groups
/// carry more for each. `bench e2e --store postgres://...`: 64 → 8.5–8.7k tasks/s, 256 →
/// 9.7–10.0k, 1,024 → 9.3–10.1k.
const MAX_REMOTE_GROUP_TASKS: usize = 256;

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
        match &command {
            Command::Step { input, .. } if input.is_worker_traffic() => {
                self.workers.push_back(command)
            }
            _ => self.others.push_back(command),
        }
    }

    fn pop(&mut self) -> Option<Command> {
        self.workers.pop_front().or_else(|| self.others.pop_front())
    }

    /// The next command, worker traffic first, but no submission once `submissions` is spent:
    /// those wait for a group whose keys were read for them.
    fn pop_within(&mut self, submissions: &mut usize) -> Option<Command> {
        if let Some(command) = self.workers.pop_front() {
            return Some(command);
        }
        if let Some(Command::Step {
            input: Input::Submit(_),
            ..
        }) = self.others.front()
        {
            *submissions = submissions.checked_sub(1)?;
        }
        self.others.pop_front()
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
    latest_write: TaskIdMap<usize>,
    payload_bytes: usize,
    deliveries: Vec<Delivery>,
    /// Answers sent once the group's commit is written, before a sync covers it.
    written: Vec<Delivery>,
    /// Callbacks the group planned, handed to the deliverer once its commit is synced.
    callbacks: Vec<sluice_engine::CallbackJob>,
}

impl Group {
    fn is_full(&self, max_writes: usize) -> bool {
        self.change.writes.len() >= max_writes || self.payload_bytes >= MAX_GROUP_PAYLOAD_BYTES
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

/// The store as a step in this group sees it: the group's planned writes and keys first, then
/// the writer's cache of recent records, then the store.
struct GroupRead<'a> {
    group: &'a Group,
    /// What groups still being committed wrote (empty on a store committed inline).
    in_flight: &'a InFlight,
    cache: &'a super::task_cache::TaskCache,
    /// Keys read ahead for this group's submissions (`Keys`), when the store is remote.
    keys: &'a Keys,
    store: &'a dyn Store,
}

impl Read for GroupRead<'_> {
    fn task(&self, id: TaskId) -> Result<Option<Task>, StoreError> {
        if let Some(&index) = self.group.latest_write.get(&id) {
            return Ok(Some(self.group.change.writes[index].task.clone()));
        }
        if let Some(task) = self.in_flight.task(id) {
            return Ok(Some(task.clone()));
        }
        if let Some(task) = self.cache.get(id) {
            return Ok(Some(task.clone()));
        }
        self.store.task(id)
    }

    fn key(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        if let Some(record) = self.group.keys.get(key) {
            return Ok(Some(*record));
        }
        if let Some(record) = self.in_flight.key(key) {
            return Ok(Some(record));
        }
        match self.keys.lookup(key) {
            Some(known) => Ok(known),
            None => self.store.key(key),
        }
    }
}

pub(crate) struct Writer {
    engine: Engine,
    store: Arc<dyn Store>,
    clock: Box<dyn Clock>,
    decider: Arc<dyn Decide>,
    /// Lease tokens and ids are drawn here: a CSPRNG (ChaCha), so no one can predict the
    /// next token from the ones they have seen.
    random: StdRng,
    flusher: SyncSender<Delivery>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    work_queued: Arc<super::WorkSignal>,
    callbacks: super::callbacks::Outbox,
    cache: super::task_cache::TaskCache,
    /// The payloads of the tasks created lately, handed out with the claims that lease them.
    payloads: super::payload_cache::PayloadCache,
    /// The keys read ahead for the group being planned.
    keys: Keys,
    /// On a store across the network: the thread that reads keys ahead, and the read it is
    /// making for the next group of submissions.
    key_reader: Option<KeyReader>,
    pending_keys: Option<PendingKeys>,
    /// On a store across the network: the thread that commits one group while this one
    /// plans the next, and what the groups it has not yet committed wrote.
    pipeline: Option<Pipeline>,
    in_flight: InFlight,
    /// Groups handed over for commit so far, numbering them.
    groups_planned: u64,
    /// Task writes a group takes at most (a batch goes whole).
    max_group_writes: usize,
    /// Groups in flight that failed to commit (or were refused behind one that did): the
    /// engine is rebuilt before the next group, then they are answered.
    refused: Vec<committer::Refused>,
    /// Reaches this writer's inbox without keeping it open: a failed commit wakes it.
    pub(super) wake: Option<mpsc::WeakSender<Command>>,
    /// See `SchedulerOptions::sync_claims`.
    pub(super) sync_claims: bool,
    pub(super) metrics: Arc<crate::telemetry::TaskMetrics>,
    /// Told the last event `seq` each sync covers.
    pub(super) durable_event_seq: Option<watch::Sender<u64>>,
    /// Told why, once the store has failed a sync.
    pub(super) storage_failed: Option<watch::Sender<Option<String>>>,
    /// Tasks durable but not admitted at start, held back by a full disk: admitted with the
    /// first group once there is room.
    unadmitted: Vec<TaskId>,
    /// The last group was refused for want of disk space (for logging the change only).
    disk_full: bool,
}

impl Writer {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        engine: Engine,
        store: Arc<dyn Store>,
        clock: Box<dyn Clock>,
        decider: Arc<dyn Decide>,
        flusher: SyncSender<Delivery>,
        snapshot: Arc<ArcSwap<Snapshot>>,
        work_queued: Arc<super::WorkSignal>,
        callbacks: super::callbacks::Outbox,
    ) -> Self {
        Writer {
            engine,
            store,
            clock,
            decider,
            random: StdRng::from_os_rng(),
            flusher,
            snapshot,
            work_queued,
            callbacks,
            cache: super::task_cache::TaskCache::default(),
            payloads: super::payload_cache::PayloadCache::default(),
            keys: Keys::none(),
            key_reader: None,
            pending_keys: None,
            pipeline: None,
            in_flight: InFlight::default(),
            groups_planned: 0,
            refused: Vec::new(),
            wake: None,
            max_group_writes: MAX_GROUP_TASKS,
            sync_claims: false,
            metrics: Arc::default(),
            durable_event_seq: None,
            storage_failed: None,
            unadmitted: Vec::new(),
            disk_full: false,
        }
    }

    pub(crate) fn run(mut self, mut inbox: mpsc::Receiver<Command>) {
        if self.store.is_remote() {
            let (store, flusher) = (self.store.clone(), self.flusher.clone());
            let wake = self.wake.clone();
            let published = self.snapshot.clone();
            match Pipeline::start(store, flusher, self.metrics.clone(), published, wake) {
                Ok(pipeline) => {
                    self.pipeline = Some(pipeline);
                    self.max_group_writes = MAX_REMOTE_GROUP_TASKS;
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot start the committer thread; committing inline")
                }
            }
            match KeyReader::start(self.store.clone()) {
                Ok(reader) => self.key_reader = Some(reader),
                Err(error) => {
                    tracing::warn!(%error, "cannot start the key reader thread; reading inline")
                }
            }
        }
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
            self.settle();
            if let Some(reason) = self.store.failed() {
                self.announce_failure(&reason);
                self.pending_keys = None;
                if !self.refuse_all(&mut waiting, Arc::new(StoreError::Failed(reason))) {
                    break;
                }
                continue;
            }
            // On a disk too full to take a commit, the group is refused before it is planned:
            // the engine never runs ahead of the store, and nothing needs undoing. The check
            // is made again for every group, so writes resume as soon as space is freed.
            if let Err(full) = self.store.check_space() {
                if !self.disk_full {
                    tracing::warn!(error = %full, "writes are refused until the disk has room");
                    self.disk_full = true;
                }
                self.pending_keys = None;
                if !self.refuse_all(&mut waiting, Arc::new(full)) {
                    break;
                }
                continue;
            }
            if std::mem::take(&mut self.disk_full) {
                tracing::info!("the disk has room again: writes are taken");
            }
            let mut group = Group::default();
            if !self.unadmitted.is_empty() {
                let unadmitted = std::mem::take(&mut self.unadmitted);
                tracing::info!(
                    tasks = unadmitted.len(),
                    "admitting the tasks a full disk held back at start"
                );
                self.step(Input::Admit(unadmitted), &mut group);
            }
            let mut open = true;
            // A group of worker traffic takes no submissions: those go in the next group, so a
            // claim's answer does not wait for a batch of them to be planned and logged. When
            // both wait, the two kinds of group take turns, so neither starves.
            // While the keys of the submissions in line are being read, the worker traffic
            // waiting is planned instead.
            if let (None, Some(reader)) = (&self.pending_keys, &self.key_reader) {
                self.pending_keys = reader.read_ahead(&waiting.others, self.max_group_writes);
            }
            let others_turn = last_was_workers_only && !waiting.others.is_empty();
            let reading = self
                .pending_keys
                .as_ref()
                .is_some_and(PendingKeys::is_waiting);
            let workers_only = !waiting.workers.is_empty() && (!others_turn || reading);
            last_was_workers_only = workers_only;
            self.keys = match (&self.key_reader, workers_only) {
                (None, _) => Keys::none(),
                (Some(_), true) => Keys::default(),
                (Some(_), false) => self
                    .pending_keys
                    .take()
                    .map(PendingKeys::take)
                    .unwrap_or_default(),
            };
            let mut submissions = self.keys.covered_submissions;
            while open && !group.is_full(self.max_group_writes) {
                let next = if workers_only {
                    waiting.workers.pop_front()
                } else {
                    waiting.pop_within(&mut submissions)
                };
                let Some(command) = next else {
                    break;
                };
                open = self.handle(command, &mut group);
            }
            self.finish(group);
            if !open {
                break;
            }
        }
        // Dropping the commands still waiting answers each with `ShuttingDown`.
        drop(waiting);
        inbox.close();
        if let Some(pipeline) = self.pipeline.take() {
            pipeline.finish();
        }
        if let Some(reader) = self.key_reader.take() {
            reader.finish();
        }
    }

    /// Tells the server, once, that the store has failed a sync.
    fn announce_failure(&self, reason: &str) {
        if let Some(failed) = &self.storage_failed {
            failed.send_if_modified(|known| {
                let first = known.is_none();
                if first {
                    *known = Some(reason.to_owned());
                }
                first
            });
        }
    }

    /// When the store cannot take a commit (a failed sync, a full disk): answers every waiting
    /// command with `error`, except heartbeats and reads of the worker table, which change
    /// nothing durable; nothing else is stepped, so no task whose submission was answered with
    /// an error is ever handed to a worker. False once told to shut down.
    fn refuse_all(&mut self, waiting: &mut Waiting, error: Arc<StoreError>) -> bool {
        let failed = || SchedulerError::from(error.clone());
        while let Some(command) = waiting.pop() {
            match command {
                Command::Shutdown => return false,
                Command::Tick { reply } => {
                    if let Some(reply) = reply {
                        let _ = reply.send(Err(failed()));
                    }
                }
                Command::Step {
                    input: input @ (Input::Heartbeat { .. } | Input::Workers),
                    answer,
                } => {
                    let mut group = Group::default();
                    self.handle(Command::Step { input, answer }, &mut group);
                }
                Command::Step { input, answer } => {
                    let count = match &input {
                        Input::Submit(submissions) => submissions.len(),
                        Input::Reports(reports) => reports.len(),
                        _ => 1,
                    };
                    match answer {
                        Answer::Submitted(reply) => {
                            let _ = reply.send((0..count).map(|_| Err(failed())).collect());
                        }
                        Answer::Reports(reply) => {
                            let _ = reply.send((0..count).map(|_| Err(failed())).collect());
                        }
                        Answer::Task(reply) => drop(reply.send(Err(failed()))),
                        Answer::Claimed(reply) => drop(reply.send(Err(failed()))),
                        Answer::Workers(reply) | Answer::WorkersNow(reply) => {
                            drop(reply.send(Err(failed())))
                        }
                        Answer::Collections(reply) => drop(reply.send(Err(failed()))),
                        Answer::Done(Some(reply)) => drop(reply.send(Err(failed()))),
                        Answer::Done(None) => {}
                    }
                }
            }
        }
        true
    }

    /// Runs one command's step into the group and queues its answer; false once told to shut
    /// down.
    fn handle(&mut self, command: Command, group: &mut Group) -> bool {
        let (input, answer) = match command {
            Command::Step { input, answer } => (input, answer),
            Command::Tick { reply } => {
                let (callback_slots, callback_bytes) = self.callbacks.room();
                let input = Input::Tick {
                    callback_slots,
                    callback_bytes,
                };
                (input, Answer::Done(reply))
            }
            Command::Shutdown => return false,
        };
        let reply = self.step(input, group);
        if let Reply::Reports(results) = &reply {
            for result in results {
                if let Err(StepError::StaleLease { logged, .. }) = result {
                    self.metrics.refused_report(*logged);
                }
            }
        }
        match (answer, reply) {
            (Answer::Submitted(reply), Reply::Submitted(results)) => {
                group.answer(
                    reply,
                    results.into_iter().map(|r| r.map_err(Into::into)).collect(),
                );
            }
            (Answer::Task(reply), Reply::Task(result)) => {
                group.answer(reply, result.map_err(Into::into))
            }
            (Answer::Task(reply), Reply::Reports(mut results)) => {
                let result = results
                    .pop()
                    .unwrap_or_else(|| Err(StepError::Internal("a report got no answer".into())));
                group.answer(reply, result.map_err(Into::into));
            }
            (Answer::Reports(reply), Reply::Reports(results)) => {
                group.answer(
                    reply,
                    results.into_iter().map(|r| r.map_err(Into::into)).collect(),
                );
            }
            (Answer::Claimed(reply), Reply::Claimed(result)) => {
                // Answered once written only when every task it leases was already queued on
                // disk: a task whose submission (or release) is not yet synced could still be
                // answered with an error, and must not reach a worker before that is known.
                let durable = self.durable_event_seq.as_ref().map(|seq| *seq.borrow());
                let queued_durably = |task: &Task| {
                    let queued_at = task.event_seqs.iter().rev().nth(1);
                    queued_at
                        .zip(durable)
                        .is_some_and(|(at, durable)| *at <= durable)
                };
                let on_disk = result
                    .as_ref()
                    .is_ok_and(|claimed| claimed.leases.iter().all(queued_durably));
                let result = result
                    .map(|claimed| {
                        let payloads = claimed
                            .leases
                            .iter()
                            .map(|task| self.payloads.take(task.id))
                            .collect();
                        ClaimAnswer { claimed, payloads }
                    })
                    .map_err(Into::into);
                if self.sync_claims || !on_disk {
                    group.answer(reply, result);
                } else {
                    group.answer_written(reply, result);
                }
            }
            // Heartbeats and the worker table change only memory: answered at once.
            (Answer::WorkersNow(reply), Reply::Workers(result)) => {
                let _ = reply.send(result.map_err(Into::into));
            }
            (Answer::Workers(reply), Reply::Workers(result)) => {
                group.answer(reply, result.map_err(Into::into));
            }
            (Answer::Collections(reply), Reply::Collections(collections)) => {
                let _ = reply.send(Ok(collections));
            }
            (Answer::Done(Some(reply)), _) => group.answer(reply, Ok(())),
            (Answer::Done(None), _) => {}
            (_, reply) => {
                tracing::error!(?reply, "a step answered with a reply of another kind");
            }
        }
        true
    }

    /// Runs `input` through the engine against the group, and adds what it planned.
    fn step(&mut self, input: Input, group: &mut Group) -> Reply {
        let read = GroupRead {
            group,
            in_flight: &self.in_flight,
            cache: &self.cache,
            keys: &self.keys,
            store: self.store.as_ref(),
        };
        let Step {
            change,
            reply,
            callbacks,
        } = self.engine.step(
            input,
            self.clock.now_ms(),
            &mut self.random,
            self.decider.as_ref(),
            &read,
        );
        let first_write = group.change.writes.len();
        for (offset, write) in change.writes.iter().enumerate() {
            group
                .latest_write
                .insert(write.task.id, first_write + offset);
            self.cache.put(&write.task);
        }
        for new in &change.new_tasks {
            group.payload_bytes += new.payload_json.len();
            self.payloads.put(new.id, &new.payload_json);
            if let Some((key, record)) = &new.key {
                group.keys.insert(key.clone(), *record);
            }
        }
        group.change.merge(change);
        for job in callbacks {
            self.callbacks.plan(&job);
            group.callbacks.push(job);
        }
        reply
    }

    fn finish(&mut self, group: Group) {
        // Claims that wait are woken when work joins a queue, and when a lease ends: its
        // worker has room again, and may be waiting with a claim for the work already queued.
        // They are woken once the group is on disk, so the work they find is durable and
        // their answers need not wait for a sync of their own (see `handle`).
        let leased = |state: Option<State>| matches!(state, Some(State::Claimed | State::Running));
        let woken = group.change.writes.iter().any(|write| {
            write.task.state == State::Queued
                || (leased(write.previous) && !leased(Some(write.task.state)))
        });
        let deliveries = group.deliveries;
        let durable = self
            .durable_event_seq
            .clone()
            .zip(group.change.events.last().map(|event| event.seq));
        let work_queued = woken.then(|| self.work_queued.clone());
        let callbacks = (self.callbacks.clone(), group.callbacks);
        let after_sync: Delivery = Box::new(move |synced| {
            let (outbox, jobs) = callbacks;
            for job in jobs {
                outbox.hand_over(job, synced.is_ok());
            }
            if let (Some((sender, seq)), Ok(())) = (&durable, &synced) {
                // Syncs run in commit order, so the number only grows.
                sender.send_if_modified(|last| {
                    let newer = seq > last;
                    *last = (*last).max(*seq);
                    newer
                });
            }
            if let (Some(signal), Ok(())) = (&work_queued, &synced) {
                signal.send();
            }
            for delivery in deliveries {
                delivery(synced.clone());
            }
        });
        self.groups_planned += 1;
        let mut job = Job {
            number: self.groups_planned,
            change: group.change,
            prepared: None,
            // Taken now, with the group planned; the commit publishes it (see `Job::snapshot`).
            snapshot: Arc::new(self.engine.snapshot()),
            written: group.written,
            after_sync,
        };
        let Some(pipeline) = &mut self.pipeline else {
            if let Err(refused) = committer::commit(
                self.store.as_ref(),
                &self.flusher,
                &self.metrics,
                &self.snapshot,
                job,
            ) {
                self.resync();
                refused.answer();
            }
            return;
        };
        // Encoded here, while the committer still sends the group before: one less step on
        // the committer's thread, which every group passes through one after another.
        job.prepared = match self.store.prepare_commit(&job.change) {
            Ok(prepared) => prepared,
            Err(error) => {
                tracing::warn!(%error, "cannot encode a group ahead; the committer will");
                None
            }
        };
        while pipeline.is_full() {
            // A failure is acted on by `settle` before the next group; this one, planned on
            // top of the failed group, is refused by the committer meanwhile.
            let Some(done) = pipeline.next_done(true) else {
                break;
            };
            landed(&mut self.in_flight, &mut self.pending_keys, &done);
            self.refused.extend(done.refused);
        }
        self.in_flight.add(job.number, &job.change);
        if let Err(refused) = pipeline.send(job) {
            self.refused.push(refused);
        }
    }

    /// Takes in what the committer has finished since the last group. After a failed commit,
    /// waits for the rest in flight (refused behind it), rebuilds the engine from the store,
    /// and only then answers the refused groups' requests, as the inline path does.
    fn settle(&mut self) {
        let Some(pipeline) = &mut self.pipeline else {
            return;
        };
        while let Some(done) = pipeline.next_done(false) {
            landed(&mut self.in_flight, &mut self.pending_keys, &done);
            self.refused.extend(done.refused);
        }
        if self.refused.is_empty() {
            return;
        }
        while let Some(done) = pipeline.next_done(true) {
            self.refused.extend(done.refused);
        }
        pipeline.reset();
        self.resync();
        for refused in std::mem::take(&mut self.refused) {
            refused.answer();
        }
    }

    /// After a failed commit the engine is ahead of the store: rebuild it from the store.
    fn resync(&mut self) {
        self.cache.clear();
        self.payloads.clear();
        self.pending_keys = None;
        self.in_flight.clear();
        match self.store.recover() {
            Ok(recovery) => {
                let options = self.engine.options().clone();
                let mut engine = Engine::recover(recovery, options).0;
                engine.inherit_settings(&self.engine);
                self.engine = engine;
            }
            Err(error) => tracing::error!(%error, "cannot re-read the store after a failed commit"),
        }
        self.publish_snapshot();
    }

    /// What the engine holds now, for readers outside this thread (status, metrics, a queued
    /// task's waiting reason).
    fn publish_snapshot(&self) {
        self.snapshot.store(Arc::new(self.engine.snapshot()));
    }

    /// Takes the policies' bucket weights and admits the tasks that were durable but not
    /// admitted when the last process stopped, durably, before any request is served (on a
    /// disk too full for it, with the first group that finds room).
    pub(crate) fn start(&mut self, unadmitted: Vec<TaskId>) -> Result<(), SchedulerError> {
        let mut group = Group::default();
        self.step(Input::PoliciesChanged, &mut group);
        if !unadmitted.is_empty() {
            match self.store.check_space() {
                Ok(()) => {
                    self.step(Input::Admit(unadmitted), &mut group);
                }
                // A server started on a full disk still comes up and serves reads.
                Err(full) => {
                    tracing::warn!(error = %full, tasks = unadmitted.len(), "tasks wait for admission until the disk has room");
                    self.unadmitted = unadmitted;
                }
            }
        }
        if !group.change.is_empty() {
            self.store.commit(&group.change)?;
            self.store.sync()?;
            self.metrics.observe(&group.change);
            for job in std::mem::take(&mut group.callbacks) {
                self.callbacks.hand_over(job, true);
            }
            if let (Some(sender), Some(last)) =
                (&self.durable_event_seq, group.change.events.last())
            {
                sender.send_replace(last.seq);
            }
        }
        self.publish_snapshot();
        Ok(())
    }
}

/// Group `done` has left the committer: what it wrote is read from the store from now on, and
/// a read of keys begun before it landed learns the keys it added. (A refused group's keys
/// were never added; the engine is rebuilt and the read dropped before the next group.)
fn landed(
    in_flight: &mut InFlight,
    pending_keys: &mut Option<PendingKeys>,
    done: &committer::Done,
) {
    let keys = in_flight.landed(done.number);
    if let (Some(pending), None) = (pending_keys, &done.refused) {
        pending.landed(keys);
    }
}

/// An answer that becomes an error when the sync it waits for fails.
pub(crate) trait Durable {
    fn failed(self, error: Arc<StoreError>) -> Self;
}

impl<T> Durable for Result<T, SchedulerError> {
    fn failed(self, error: Arc<StoreError>) -> Self {
        self.and(Err(SchedulerError::from(error)))
    }
}

impl<T> Durable for Vec<Result<T, SchedulerError>> {
    fn failed(self, error: Arc<StoreError>) -> Self {
        self.into_iter()
            .map(|item| item.failed(error.clone()))
            .collect()
    }
}
