//! The writer thread: the only owner of the engine and the only caller of `Store::commit`.

use super::flusher::Delivery;
use super::{Clock, Command, SchedulerError, SubmitResult, Submitted};
use crate::engine::{Engine, KeyVerdict, judge_key};
use crate::model::{Actor, State, Submission, Task, TaskId};
use crate::store::{Change, Store};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;
use std::sync::mpsc::SyncSender;
use tokio::sync::{mpsc, oneshot};

pub(crate) struct Writer {
    engine: Engine,
    store: Arc<dyn Store>,
    clock: Box<dyn Clock>,
    random: SmallRng,
    flusher: SyncSender<Delivery>,
}

impl Writer {
    pub(crate) fn new(
        engine: Engine,
        store: Arc<dyn Store>,
        clock: Box<dyn Clock>,
        flusher: SyncSender<Delivery>,
    ) -> Self {
        Writer {
            engine,
            store,
            clock,
            random: SmallRng::from_os_rng(),
            flusher,
        }
    }

    pub(crate) fn run(mut self, mut inbox: mpsc::Receiver<Command>) {
        while let Some(command) = inbox.blocking_recv() {
            match command {
                Command::Submit { submissions, reply } => {
                    let results: Vec<SubmitResult> =
                        submissions.into_iter().map(|s| self.submit(s)).collect();
                    self.after_sync(reply, results);
                }
                Command::Cancel { id, actor, reply } => {
                    let result = self.cancel(id, actor);
                    self.after_sync(reply, result);
                }
                Command::Shutdown => break,
            }
        }
        // Dropping the inbox answers every command still queued with `ShuttingDown`.
        inbox.close();
    }

    /// Tasks that were durable but not admitted when the last process stopped.
    pub(crate) fn admit_recovered(&mut self, ids: &[TaskId]) -> Result<(), SchedulerError> {
        for &id in ids {
            let task = self.store.task(id)?.ok_or(SchedulerError::NotFound(id))?;
            let now_ms = self.clock.now_ms();
            if let Ok(change) =
                self.engine
                    .plan_transition(now_ms, &task, State::Queued, Actor::scheduler(), None)
            {
                self.commit(&change)?;
            }
        }
        self.store.sync()?;
        Ok(())
    }

    fn submit(&mut self, submission: Submission) -> SubmitResult {
        let existing = match &submission.spec.key {
            Some(key) => self.store.key(key)?,
            None => None,
        };
        match judge_key(existing.as_ref(), &submission.fingerprint) {
            KeyVerdict::Replay(id) => {
                let task = self.store.task(id)?.ok_or(SchedulerError::NotFound(id))?;
                Ok(Submitted {
                    task,
                    replayed: true,
                })
            }
            KeyVerdict::Conflict(task_id) => Err(SchedulerError::KeyConflict {
                key: submission.spec.key.unwrap_or_default(),
                task_id,
            }),
            KeyVerdict::New => {
                let now_ms = self.clock.now_ms();
                let change = self
                    .engine
                    .plan_create(now_ms, self.random.random(), &submission);
                self.commit(&change)?;
                Ok(Submitted {
                    task: first_task(change),
                    replayed: false,
                })
            }
        }
    }

    fn cancel(&mut self, id: TaskId, actor: Actor) -> Result<Task, SchedulerError> {
        let task = self.store.task(id)?.ok_or(SchedulerError::NotFound(id))?;
        let now_ms = self.clock.now_ms();
        let change = self
            .engine
            .plan_transition(now_ms, &task, State::Cancelled, actor, None)
            .map_err(|source| SchedulerError::Illegal {
                task_id: id,
                state: task.state,
                source,
            })?;
        self.commit(&change)?;
        Ok(first_task(change))
    }

    fn commit(&mut self, change: &Change) -> Result<(), SchedulerError> {
        self.store.commit(change)?;
        self.engine.apply(change);
        Ok(())
    }

    /// Hands the answer to the flusher: it is sent once a sync covers what this command wrote
    /// (or, for a replay, the write it replays).
    fn after_sync<T: Durable + Send + 'static>(&self, reply: oneshot::Sender<T>, answer: T) {
        let delivery: Delivery = Box::new(move |synced| {
            let _ = reply.send(match synced {
                Ok(()) => answer,
                Err(error) => answer.failed(error),
            });
        });
        if let Err(unsent) = self.flusher.send(delivery) {
            (unsent.0)(Err(Arc::new(crate::store::StoreError::Io(
                std::io::Error::other("the flusher has stopped"),
            ))));
        }
    }
}

fn first_task(change: Change) -> Task {
    change
        .writes
        .into_iter()
        .next()
        .map(|write| write.task)
        .unwrap_or_else(|| unreachable!("every planned change writes its task"))
}

/// An answer that becomes an error when the sync it waits for fails.
pub(crate) trait Durable {
    fn failed(self, error: Arc<crate::store::StoreError>) -> Self;
}

impl<T> Durable for Result<T, SchedulerError> {
    fn failed(self, error: Arc<crate::store::StoreError>) -> Self {
        self.and(Err(SchedulerError::Store(error)))
    }
}

impl Durable for Vec<SubmitResult> {
    fn failed(self, error: Arc<crate::store::StoreError>) -> Self {
        self.into_iter()
            .map(|item| item.failed(error.clone()))
            .collect()
    }
}
