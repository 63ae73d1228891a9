//! The scheduler shell: the handle the API calls and the threads around the engine. The writer
//! owns the engine and plans every change; the flusher makes them durable in groups; the ticker
//! moves time (timers, aging); the callback deliverer and retention run beside them. On a store
//! across the network two more help the writer: the committer (`committer::Pipeline`) commits a
//! group while the next is planned, and `keys_ahead` reads the next group's idempotency keys.
//!
//! Every mutation goes through one writer thread, so idempotency checks and transitions need no
//! locks and no compare-and-swap; the writer reads the clock and draws random bits and hands
//! them to the deterministic engine. A request is answered only after the flusher's next
//! `sync` (flush + fdatasync) covers its write, and one `sync` covers every write before it.
//! Claims are the exception (unless `sync_claims`): answered once their leases are written to
//! the log, so the disk's slowest syncs stay out of a worker's path. A lease lost to a power
//! loss only makes its task run again.

mod callbacks;
mod clock;
mod committer;
mod flusher;
mod keys_ahead;
mod payload_cache;
mod retention;
mod task_cache;
mod work_signal;
mod writer;

pub use clock::{Clock, SystemClock};
pub use sluice_engine::{Claimed, Submitted};
pub use work_signal::WorkSignal;

use arc_swap::ArcSwap;
use sluice_engine::{
    Decide, Engine, EngineOptions, Input, Report, Snapshot, StepError, WorkerView,
};
use sluice_model::{Actor, Heartbeat, Submission, Task, TaskId, WorkerEvent};
use sluice_store::{ListPage, ListQuery, Store, StoreError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot, watch};

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("the scheduler's queue is full; retry shortly")]
    Overloaded,
    #[error("the scheduler is shutting down")]
    ShuttingDown,
    /// The events asked for were removed by retention; the log now starts at `first_seq`.
    #[error("events before {first_seq} were removed by retention; read on from after={}", first_seq - 1)]
    EventsGone { first_seq: u64 },
    /// The engine refused the request, or could not finish it.
    #[error(transparent)]
    Step(#[from] StepError),
}

impl From<StoreError> for SchedulerError {
    fn from(error: StoreError) -> Self {
        SchedulerError::Step(StepError::from(error))
    }
}

impl From<Arc<StoreError>> for SchedulerError {
    fn from(error: Arc<StoreError>) -> Self {
        SchedulerError::Step(StepError::Store(error))
    }
}

pub type SubmitResult = Result<Submitted, SchedulerError>;

#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Requests waiting for the writer at most; past it, submissions are refused as overloaded.
    pub queue_capacity: usize,
    pub engine: EngineOptions,
    /// How often the reaper looks at the timers.
    pub tick_ms: u64,
    /// Answer claims once a sync covers their leases. Otherwise once the leases are written
    /// to the log: they then survive a crash of the process but not a power loss, which only
    /// re-runs the attempt (the task is queued again, and the worker's reports get 409).
    pub sync_claims: bool,
    /// Private destinations callbacks may reach all the same (see `model::CallbackAllow`).
    pub callback_allow: sluice_model::CallbackAllow,
    /// Certificates of CAs an https callback's server may be signed by, beside the system's.
    pub callback_roots: Vec<reqwest::Certificate>,
    /// Ended tasks are removed this long after their last change (by the wall clock).
    pub retention_ms: u64,
    /// Where committed changes are counted.
    pub metrics: Arc<crate::telemetry::TaskMetrics>,
    /// Where each sync's time is recorded.
    pub pipeline_metrics: Arc<crate::telemetry::PipelineMetrics>,
}

/// How often a ticker waiting out a long tick looks whether the writer has stopped.
const TICKER_WAKE: std::time::Duration = std::time::Duration::from_millis(100);

/// 30 days.
pub const DEFAULT_RETENTION_MS: u64 = 30 * 24 * 3_600_000;

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            queue_capacity: 4096,
            engine: EngineOptions::default(),
            tick_ms: 100,
            sync_claims: false,
            callback_allow: sluice_model::CallbackAllow::default(),
            callback_roots: Vec::new(),
            retention_ms: DEFAULT_RETENTION_MS,
            metrics: Arc::default(),
            pipeline_metrics: Arc::default(),
        }
    }
}

pub(crate) enum Command {
    /// An input for the engine's step, and where its answer goes.
    Step {
        input: Input,
        answer: Answer,
    },
    /// Time has passed: the writer runs a tick step, telling it how many callbacks the
    /// deliverer has room for. A caller that asks is answered once the tick is durable.
    Tick {
        reply: Option<oneshot::Sender<Result<(), SchedulerError>>>,
    },
    Shutdown,
}

/// Where a step's reply goes, and when: once a sync covers the step's change, once it is
/// written (claims, unless `sync_claims`), or at once (heartbeats: they change only memory).
pub(crate) enum Answer {
    Submitted(oneshot::Sender<Vec<SubmitResult>>),
    Task(oneshot::Sender<Result<Task, SchedulerError>>),
    Reports(oneshot::Sender<Vec<Result<Task, SchedulerError>>>),
    Claimed(oneshot::Sender<Result<ClaimAnswer, SchedulerError>>),
    Workers(oneshot::Sender<Result<Vec<WorkerView>, SchedulerError>>),
    WorkersNow(oneshot::Sender<Result<Vec<WorkerView>, SchedulerError>>),
    Collections(oneshot::Sender<Result<Vec<sluice_engine::CollectionView>, SchedulerError>>),
    Done(Option<oneshot::Sender<Result<(), SchedulerError>>>),
}

/// A claim's answer: the engine's, with the payloads of its leases where the writer still
/// held them, so that most grants need no read of the store (`Scheduler::lease_payloads`).
#[derive(Debug)]
pub struct ClaimAnswer {
    pub claimed: Claimed,
    /// One for each lease, in order: `None` where the payload is to be read from the store.
    pub payloads: Vec<Option<Vec<u8>>>,
}

pub struct Scheduler {
    commands: mpsc::Sender<Command>,
    store: Arc<dyn Store>,
    /// The engine's state as of the writer's last group.
    snapshot: Arc<ArcSwap<Snapshot>>,
    /// Woken whenever tasks join a queue, for claims that wait for work.
    work_queued: Arc<WorkSignal>,
    /// The last event `seq` on disk: readers of the log follow it, so they never show an
    /// event a crash could still take back.
    durable_event_seq: watch::Receiver<u64>,
    /// Why the store failed, once it has: the server stops, and a restart replays the log.
    storage_failed: watch::Receiver<Option<String>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Scheduler {
    /// Rebuilds the engine from the store, admits what was left unadmitted, and starts the
    /// writer and flusher threads.
    pub fn start(
        store: Arc<dyn Store>,
        clock: Box<dyn Clock>,
        decider: Arc<dyn Decide>,
        options: &SchedulerOptions,
    ) -> Result<Scheduler, SchedulerError> {
        let reading = std::time::Instant::now();
        let recovery = store.recover()?;
        let read_ms = reading.elapsed().as_millis() as u64;
        let indexing = std::time::Instant::now();
        let tasks = recovery.tasks_by_state.iter().sum::<u64>();
        let last_event_seq = recovery.last_event_seq;
        let (engine, unadmitted) = Engine::recover(recovery, options.engine.clone());
        let index_ms = indexing.elapsed().as_millis() as u64;
        tracing::info!(
            tasks,
            queued = engine.queues().total(),
            unadmitted = unadmitted.len(),
            last_event_seq,
            read_ms,
            index_ms,
            "recovered state from the store"
        );
        let (commands, inbox) = mpsc::channel(options.queue_capacity.max(1));
        let (flush_tx, flush_rx) = std::sync::mpsc::sync_channel(options.queue_capacity.max(1));
        let snapshot = Arc::new(ArcSwap::from_pointee(engine.snapshot()));
        let callback_jobs = callbacks::spawn(
            commands.clone(),
            options.callback_allow.clone(),
            &options.callback_roots,
        )?;
        let work_queued = Arc::new(WorkSignal::default());
        let (durable_tx, durable_event_seq) = watch::channel(last_event_seq);
        let mut writer = writer::Writer::new(
            engine,
            store.clone(),
            clock,
            decider,
            flush_tx,
            snapshot.clone(),
            work_queued.clone(),
            callback_jobs,
        );
        writer.sync_claims = options.sync_claims;
        writer.wake = Some(commands.downgrade());
        writer.metrics = options.metrics.clone();
        writer.durable_event_seq = Some(durable_tx);
        let (failed_tx, storage_failed) = watch::channel(None);
        writer.storage_failed = Some(failed_tx);
        writer.start(unadmitted)?;
        let flusher_store = store.clone();
        let sync_metrics = options.pipeline_metrics.clone();
        let flusher = std::thread::Builder::new()
            .name("sluice-flusher".into())
            .spawn(move || flusher::run(flusher_store.as_ref(), flush_rx, &sync_metrics))?;
        let writer = std::thread::Builder::new()
            .name("sluice-writer".into())
            .spawn(move || writer.run(inbox))?;
        let ticks = commands.clone();
        let tick = std::time::Duration::from_millis(options.tick_ms.max(1));
        let ticker = std::thread::Builder::new()
            .name("sluice-ticker".into())
            .spawn(move || {
                // A full queue skips a tick (the next one catches up); a closed one ends it,
                // looked at every `TICKER_WAKE` so that a long tick does not hold up shutdown.
                loop {
                    let mut waited = std::time::Duration::ZERO;
                    while waited < tick {
                        let nap = TICKER_WAKE.min(tick - waited);
                        std::thread::sleep(nap);
                        waited += nap;
                        if ticks.is_closed() {
                            return;
                        }
                    }
                    if let Err(mpsc::error::TrySendError::Closed(_)) =
                        ticks.try_send(Command::Tick { reply: None })
                    {
                        break;
                    }
                }
            })?;
        let retention = {
            let (store, commands) = (store.clone(), commands.clone());
            let retention_ms = options.retention_ms;
            std::thread::Builder::new()
                .name("sluice-retention".into())
                .spawn(move || {
                    retention::run(store, Box::new(SystemClock), retention_ms, commands)
                })?
        };
        Ok(Scheduler {
            commands,
            store,
            snapshot,
            work_queued,
            durable_event_seq,
            storage_failed,
            threads: Mutex::new(vec![writer, flusher, ticker, retention]),
        })
    }

    /// Creates a task, or answers with the task its key already names.
    pub async fn submit(&self, submission: Submission) -> SubmitResult {
        let mut results = self.submit_many(vec![submission]).await?;
        results.pop().ok_or(SchedulerError::ShuttingDown)?
    }

    /// Submits several tasks in one request; each gets its own answer, in order.
    pub async fn submit_many(
        &self,
        submissions: Vec<Submission>,
    ) -> Result<Vec<SubmitResult>, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(Input::Submit(submissions), Answer::Submitted(reply))?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)
    }

    pub async fn cancel(&self, id: TaskId, actor: Actor) -> Result<Task, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(Input::Cancel { id, actor }, Answer::Task(reply))?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Registers or refreshes a worker; answers with its view.
    pub async fn heartbeat(
        &self,
        worker: String,
        heartbeat: Heartbeat,
    ) -> Result<Vec<WorkerView>, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(
            Input::Heartbeat { worker, heartbeat },
            Answer::WorkersNow(reply),
        )?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Leases up to `max` tasks to `worker` at once (with `batch`, one GPU batch), or says why
    /// it gets none, or that a batch is still filling; `claim_id` names the claim so that
    /// sending it again returns what it granted.
    pub async fn claim(
        &self,
        worker: String,
        max: usize,
        claim_id: Option<String>,
        batch: Option<sluice_engine::BatchClaim>,
    ) -> Result<ClaimAnswer, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(
            Input::Claim {
                worker,
                max,
                claim_id,
                batch,
            },
            Answer::Claimed(reply),
        )?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Runs a tick now (the ticker runs one every `tick_ms` anyway); answers once its
    /// changes are durable. For tests and tools that move a clock of their own.
    pub async fn tick(&self) -> Result<(), SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Tick { reply: Some(reply) })?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Tells the engine that a policy version was activated or rolled back, so it takes the
    /// priority policy's bucket weights now. A full queue skips it: the next aging tick takes
    /// them anyway.
    pub fn policies_changed(&self) {
        if let Err(error) = self.step(Input::PoliciesChanged, Answer::Done(None)) {
            tracing::debug!(%error, "the bucket weights wait for the next aging tick");
        }
    }

    /// Puts `limits` (the whole set) in force for the claims planned from now on; answered
    /// once the engine has them.
    pub async fn set_concurrency_limits(
        &self,
        limits: Vec<sluice_model::ConcurrencyLimit>,
    ) -> Result<(), SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(
            Input::SetConcurrencyLimits(limits),
            Answer::Done(Some(reply)),
        )?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Puts the declared vector `collections` (the whole set) in force for the splits and
    /// heartbeats from now on; answered once the engine has them.
    pub async fn set_collections(
        &self,
        collections: Vec<sluice_model::Collection>,
    ) -> Result<(), SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(
            Input::SetCollections(collections),
            Answer::Done(Some(reply)),
        )?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// The vector collections known, declared or announced, with their live shards.
    pub async fn collections(&self) -> Result<Vec<sluice_engine::CollectionView>, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(Input::Collections, Answer::Collections(reply))?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Tells the engine the server drains (no attempt is preempted from now on); answered
    /// once the engine knows.
    pub async fn drain(&self) -> Result<(), SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(Input::Drain, Answer::Done(Some(reply)))?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Signalled when tasks join a queue. Arm a wait on it before a claim that may come back
    /// empty, so a task queued in between is not missed.
    pub fn work_queued(&self) -> Arc<WorkSignal> {
        self.work_queued.clone()
    }

    /// A worker's report on the attempt whose lease `token` names.
    pub async fn report(
        &self,
        id: TaskId,
        token: String,
        report: Report,
    ) -> Result<Task, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(
            Input::Reports(vec![(id, token, report)]),
            Answer::Task(reply),
        )?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Several reports at once: one command, one durable write, one answer each, in order.
    pub async fn report_many(
        &self,
        reports: Vec<(TaskId, String, Report)>,
    ) -> Result<Vec<Result<Task, SchedulerError>>, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(Input::Reports(reports), Answer::Reports(reply))?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)
    }

    pub async fn reset_worker(
        &self,
        worker: String,
        actor: Actor,
    ) -> Result<Vec<WorkerView>, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(Input::ResetWorker { worker, actor }, Answer::Workers(reply))?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    pub async fn workers(&self) -> Result<Vec<WorkerView>, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.step(Input::Workers, Answer::WorkersNow(reply))?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Follows why the store failed: `None` while it is sound. The writer notices a failed sync
    /// at its next group (a tick comes every `tick_ms`).
    pub fn storage_failed(&self) -> watch::Receiver<Option<String>> {
        self.storage_failed.clone()
    }

    /// Follows the last event `seq` made durable.
    pub fn durable_event_seq(&self) -> watch::Receiver<u64> {
        self.durable_event_seq.clone()
    }

    /// The global event log after `after_seq`, oldest first, at most `limit`, never past what
    /// is durable.
    /// The oldest event the log still holds (see `Store::first_event_seq`).
    pub fn first_event_seq(&self) -> Result<u64, SchedulerError> {
        Ok(self.store.first_event_seq()?)
    }

    pub fn log(
        &self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<sluice_model::Event>, SchedulerError> {
        let durable = *self.durable_event_seq.borrow();
        if after_seq >= durable {
            return Ok(Vec::new());
        }
        let first_seq = self.first_event_seq()?;
        if after_seq.saturating_add(1) < first_seq {
            return Err(SchedulerError::EventsGone { first_seq });
        }
        let limit = limit.min(usize::try_from(durable - after_seq).unwrap_or(usize::MAX));
        Ok(self.store.events_after(after_seq, limit)?)
    }

    pub fn worker_events(
        &self,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<WorkerEvent>, SchedulerError> {
        Ok(self.store.worker_events(after_seq, limit)?)
    }

    /// Counts by state and bucket, illegal transitions refused, the last event number.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    pub fn task(&self, id: TaskId) -> Result<Task, SchedulerError> {
        self.store
            .task(id)?
            .ok_or(SchedulerError::Step(StepError::NotFound(id)))
    }

    pub fn payload(&self, id: TaskId) -> Result<Option<Vec<u8>>, SchedulerError> {
        Ok(self.store.payload(id)?)
    }

    /// The payloads of a claim's leases, in order: those the writer handed over with it, the
    /// rest read from the store in one go.
    pub fn lease_payloads(
        &self,
        answer: &mut ClaimAnswer,
    ) -> Result<Vec<Option<Vec<u8>>>, SchedulerError> {
        debug_assert_eq!(answer.payloads.len(), answer.claimed.leases.len());
        let missing: Vec<TaskId> = answer
            .claimed
            .leases
            .iter()
            .zip(&answer.payloads)
            .filter(|(_, payload)| payload.is_none())
            .map(|(task, _)| task.id)
            .collect();
        let mut read = match missing.is_empty() {
            true => Vec::new(),
            false => self.store.payloads(&missing)?,
        }
        .into_iter();
        Ok(std::mem::take(&mut answer.payloads)
            .into_iter()
            .map(|held| held.or_else(|| read.next().flatten()))
            .collect())
    }

    pub fn events(
        &self,
        id: TaskId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<sluice_model::Event>, SchedulerError> {
        self.store
            .events_of(id, after_seq, limit)?
            .ok_or(SchedulerError::Step(StepError::NotFound(id)))
    }

    pub fn list(&self, query: &ListQuery) -> Result<ListPage, SchedulerError> {
        Ok(self.store.list(query)?)
    }

    /// Stops taking commands, lets the writer finish the one in hand, makes everything
    /// durable, and joins both threads. Commands still queued are answered `ShuttingDown`.
    pub async fn shutdown(&self) {
        // A full queue only delays the marker; the writer keeps draining it.
        let _ = self.commands.send(Command::Shutdown).await;
        let threads = match self.threads.lock() {
            Ok(mut threads) => std::mem::take(&mut *threads),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        let joined = tokio::task::spawn_blocking(move || {
            for thread in threads {
                if thread.join().is_err() {
                    tracing::error!("a scheduler thread panicked");
                }
            }
        })
        .await;
        if joined.is_err() {
            tracing::error!("could not join the scheduler threads");
        }
    }

    fn step(&self, input: Input, answer: Answer) -> Result<(), SchedulerError> {
        self.send(Command::Step { input, answer })
    }

    fn send(&self, command: Command) -> Result<(), SchedulerError> {
        self.commands
            .try_send(command)
            .map_err(|error| match error {
                mpsc::error::TrySendError::Full(_) => SchedulerError::Overloaded,
                mpsc::error::TrySendError::Closed(_) => SchedulerError::ShuttingDown,
            })
    }
}

impl From<std::io::Error> for SchedulerError {
    fn from(error: std::io::Error) -> Self {
        SchedulerError::from(StoreError::Io(error))
    }
}

#[cfg(test)]
mod family_tests;
#[cfg(test)]
mod tests;
