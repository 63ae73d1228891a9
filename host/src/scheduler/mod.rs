//! The scheduler shell: the handle the API calls, the writer thread that owns the engine and
//! the store's writes, and the flusher thread that makes them durable in groups.
//!
//! Every mutation goes through one writer thread, so idempotency checks and transitions need no
//! locks and no compare-and-swap; the writer reads the clock and draws random bits and hands
//! them to the deterministic engine. A request is answered only after the flusher's next
//! `sync` (flush + fdatasync) covers its write, and one `sync` covers every write before it.

mod admission;
mod clock;
mod flusher;
mod writer;

pub use admission::{Admitter, NativeAdmitter};
pub use clock::{Clock, SystemClock};

use crate::engine::{Engine, Snapshot};
use crate::model::{Actor, IllegalTransition, State, Submission, Task, TaskId};
use crate::store::{ListPage, ListQuery, Store, StoreError};
use arc_swap::ArcSwap;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    #[error("the scheduler's queue is full; retry shortly")]
    Overloaded,
    #[error("the scheduler is shutting down")]
    ShuttingDown,
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
    #[error(transparent)]
    Store(#[from] Arc<StoreError>),
}

impl From<StoreError> for SchedulerError {
    fn from(error: StoreError) -> Self {
        SchedulerError::Store(Arc::new(error))
    }
}

/// A submission's answer: the task, and whether it already existed under the same key.
#[derive(Clone, Debug)]
pub struct Submitted {
    pub task: Task,
    pub replayed: bool,
}

pub type SubmitResult = Result<Submitted, SchedulerError>;

#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// Requests waiting for the writer at most; past it, submissions are refused as overloaded.
    pub queue_capacity: usize,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            queue_capacity: 4096,
        }
    }
}

pub(crate) enum Command {
    Submit {
        submissions: Vec<Submission>,
        reply: oneshot::Sender<Vec<SubmitResult>>,
    },
    Cancel {
        id: TaskId,
        actor: Actor,
        reply: oneshot::Sender<Result<Task, SchedulerError>>,
    },
    Shutdown,
}

pub struct Scheduler {
    commands: mpsc::Sender<Command>,
    store: Arc<dyn Store>,
    /// The engine's state as of the writer's last group.
    snapshot: Arc<ArcSwap<Snapshot>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Scheduler {
    /// Rebuilds the engine from the store, admits what was left unadmitted, and starts the
    /// writer and flusher threads.
    pub fn start(
        store: Arc<dyn Store>,
        clock: Box<dyn Clock>,
        admitter: Arc<dyn Admitter>,
        options: &SchedulerOptions,
    ) -> Result<Scheduler, SchedulerError> {
        let recovery = store.recover()?;
        let (engine, unadmitted) = Engine::recover(&recovery);
        tracing::info!(
            tasks = recovery.tasks_by_state.iter().sum::<u64>(),
            queued = engine.queues().total(),
            unadmitted = unadmitted.len(),
            last_event_seq = recovery.last_event_seq,
            "recovered state from the store"
        );
        let (commands, inbox) = mpsc::channel(options.queue_capacity.max(1));
        let (flush_tx, flush_rx) = std::sync::mpsc::sync_channel(options.queue_capacity.max(1));
        let snapshot = Arc::new(ArcSwap::from_pointee(engine.snapshot()));
        let mut writer = writer::Writer::new(
            engine,
            store.clone(),
            clock,
            admitter,
            flush_tx,
            snapshot.clone(),
        );
        writer.admit_recovered(&unadmitted)?;
        let flusher_store = store.clone();
        let flusher = std::thread::Builder::new()
            .name("sluice-flusher".into())
            .spawn(move || flusher::run(flusher_store.as_ref(), flush_rx))?;
        let writer = std::thread::Builder::new()
            .name("sluice-writer".into())
            .spawn(move || writer.run(inbox))?;
        Ok(Scheduler {
            commands,
            store,
            snapshot,
            threads: Mutex::new(vec![writer, flusher]),
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
        self.send(Command::Submit { submissions, reply })?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)
    }

    pub async fn cancel(&self, id: TaskId, actor: Actor) -> Result<Task, SchedulerError> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Cancel { id, actor, reply })?;
        answer.await.map_err(|_| SchedulerError::ShuttingDown)?
    }

    /// Counts by state and bucket, illegal transitions refused, the last event number.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    pub fn task(&self, id: TaskId) -> Result<Task, SchedulerError> {
        self.store.task(id)?.ok_or(SchedulerError::NotFound(id))
    }

    pub fn payload(&self, id: TaskId) -> Result<Option<Vec<u8>>, SchedulerError> {
        Ok(self.store.payload(id)?)
    }

    pub fn events(
        &self,
        id: TaskId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<crate::model::Event>, SchedulerError> {
        self.store
            .events_of(id, after_seq, limit)?
            .ok_or(SchedulerError::NotFound(id))
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
        SchedulerError::Store(Arc::new(StoreError::Io(error)))
    }
}

#[cfg(test)]
mod tests;
