//! Where the writer's planned groups are committed. The embedded store's commit is an append
//! to its log, made on the writer's thread. A store across the network (PostgreSQL) takes a
//! round trip for each, during which the writer would sit idle; there a thread of its own
//! commits one group while the writer plans the next (`Pipeline`), and the writer reads what
//! is still on its way to the store from `InFlight`.

use super::Command;
use super::flusher::Delivery;
use crate::telemetry::TaskMetrics;
use arc_swap::ArcSwap;
use sluice_engine::Snapshot;
use sluice_model::{Change, KeyRecord, Task, TaskId, TaskIdMap};
use sluice_store::{PreparedCommit, Store, StoreError};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;
use tokio::sync::mpsc::WeakSender;

/// Groups committed or waiting to be, at most: one in the store's hands and one ready behind
/// it. More would only lengthen the wait of the answers in the last one.
pub(super) const MAX_IN_FLIGHT: usize = 2;

/// A planned group on its way to the store.
pub(super) struct Job {
    pub number: u64,
    pub change: Change,
    /// `change` as the store encoded it ahead, on the writer's thread, while the group before
    /// it was being committed.
    pub prepared: Option<PreparedCommit>,
    /// What the engine holds with this group planned: published once the commit is written,
    /// so readers never see what the store may yet refuse, and before any answer goes out, so
    /// a client that reads after its answer sees what its request changed.
    pub snapshot: Arc<Snapshot>,
    /// Answered once the commit is written, before a sync covers it.
    pub written: Vec<Delivery>,
    /// Sent to the flusher once committed (the answers, callbacks and signals that wait for
    /// the sync); called with the error instead when the commit fails.
    pub after_sync: Delivery,
}

/// Commits `job`'s change and passes it on: its snapshot to `published`, its written answers
/// at once, the rest to the flusher. When the commit fails the job comes back with the error,
/// unanswered, and the snapshot is not published (the writer rebuilds and publishes its own).
pub(super) fn commit(
    store: &dyn Store,
    flusher: &SyncSender<Delivery>,
    metrics: &TaskMetrics,
    published: &ArcSwap<Snapshot>,
    mut job: Job,
) -> Result<(), Refused> {
    let committed = match job.prepared.take() {
        _ if job.change.is_empty() => Ok(()),
        Some(prepared) => store.commit_prepared(&job.change, prepared),
        None => store.commit(&job.change),
    };
    match committed {
        Ok(()) => {
            metrics.observe(&job.change);
            published.store(job.snapshot.clone());
            for delivery in job.written {
                delivery(Ok(()));
            }
            if let Err(unsent) = flusher.send(job.after_sync) {
                (unsent.0)(Err(Arc::new(StoreError::Io(std::io::Error::other(
                    "the flusher has stopped",
                )))));
            }
            Ok(())
        }
        Err(error) => {
            tracing::error!(%error, "commit failed; answering its requests with an error");
            Err(Refused {
                job: Box::new(job),
                error: Arc::new(error),
            })
        }
    }
}

/// A group that will not be committed, and why.
pub(super) struct Refused {
    pub job: Box<Job>,
    pub error: Arc<StoreError>,
}

impl Refused {
    /// Answers every request of the group with the error.
    pub(super) fn answer(self) {
        let Job {
            written,
            after_sync,
            ..
        } = *self.job;
        for delivery in written {
            delivery(Err(self.error.clone()));
        }
        after_sync(Err(self.error));
    }
}

enum Message {
    Commit(Job),
    /// The writer has rebuilt its engine from the store after a failed commit: groups sent
    /// from now on were planned on what the store holds, and are committed again.
    Reset,
}

/// A group the committer has finished with: committed, or refused and handed back to the
/// writer to answer once it has rebuilt its engine (so no one hears of the failure while the
/// engine still holds what failed).
pub(super) struct Done {
    pub number: u64,
    pub refused: Option<Refused>,
}

/// The committer thread and the writer's end of it.
pub(super) struct Pipeline {
    messages: Option<SyncSender<Message>>,
    done: Receiver<Done>,
    thread: Option<JoinHandle<()>>,
    /// Groups sent and not yet reported done.
    in_flight: usize,
}

impl Pipeline {
    /// `wake` reaches the writer's inbox: a failed commit wakes a writer waiting for work, so
    /// it rebuilds its engine and answers at once.
    pub(super) fn start(
        store: Arc<dyn Store>,
        flusher: SyncSender<Delivery>,
        metrics: Arc<TaskMetrics>,
        published: Arc<ArcSwap<Snapshot>>,
        wake: Option<WeakSender<Command>>,
    ) -> std::io::Result<Pipeline> {
        // Room for every group in flight and a reset behind them, so sending never blocks.
        let (messages, inbox) = std::sync::mpsc::sync_channel(MAX_IN_FLIGHT + 1);
        let (done_tx, done) = std::sync::mpsc::channel();
        let committer = Committer {
            store,
            flusher,
            metrics,
            published,
            done: done_tx,
            wake,
        };
        let thread = std::thread::Builder::new()
            .name("sluice-committer".into())
            .spawn(move || committer.run(inbox))?;
        Ok(Pipeline {
            messages: Some(messages),
            done,
            thread: Some(thread),
            in_flight: 0,
        })
    }

    pub(super) fn is_full(&self) -> bool {
        self.in_flight >= MAX_IN_FLIGHT
    }

    /// Hands a group over; the caller waits for room first (`is_full`, `next_done`). The
    /// group comes back refused if the committer has stopped.
    pub(super) fn send(&mut self, job: Job) -> Result<(), Refused> {
        debug_assert!(!self.is_full(), "a group sent past the bound");
        let stopped = |job| Refused {
            job: Box::new(job),
            error: Arc::new(StoreError::Io(std::io::Error::other(
                "the committer has stopped",
            ))),
        };
        match &self.messages {
            Some(messages) => match messages.send(Message::Commit(job)) {
                Ok(()) => {
                    self.in_flight += 1;
                    Ok(())
                }
                Err(unsent) => match unsent.0 {
                    Message::Commit(job) => Err(stopped(job)),
                    Message::Reset => Ok(()),
                },
            },
            None => Err(stopped(job)),
        }
    }

    /// The next group finished, waiting for it if `wait`; `None` when none is (or none is in
    /// flight).
    pub(super) fn next_done(&mut self, wait: bool) -> Option<Done> {
        if self.in_flight == 0 {
            return None;
        }
        let done = if wait {
            self.done.recv().ok()
        } else {
            self.done.try_recv().ok()
        };
        match done {
            Some(done) => {
                self.in_flight -= 1;
                Some(done)
            }
            // The committer is gone: nothing more will be reported.
            None if wait => {
                self.in_flight = 0;
                None
            }
            None => None,
        }
    }

    /// Tells the committer that groups from now on are planned on the store's contents again.
    pub(super) fn reset(&mut self) {
        debug_assert_eq!(self.in_flight, 0, "reset with groups still in flight");
        if let Some(messages) = &self.messages {
            let _ = messages.send(Message::Reset);
        }
    }

    /// Lets the groups in flight be committed and stops the thread.
    pub(super) fn finish(mut self) {
        self.messages = None;
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the committer thread panicked");
        }
    }
}

struct Committer {
    store: Arc<dyn Store>,
    flusher: SyncSender<Delivery>,
    metrics: Arc<TaskMetrics>,
    published: Arc<ArcSwap<Snapshot>>,
    done: std::sync::mpsc::Sender<Done>,
    wake: Option<WeakSender<Command>>,
}

impl Committer {
    fn run(self, inbox: Receiver<Message>) {
        // Once a commit fails, every group behind it was planned on top of it: each is refused
        // with the same error until the writer, having rebuilt its engine, says so.
        let mut refusing: Option<Arc<StoreError>> = None;
        while let Ok(message) = inbox.recv() {
            let job = match message {
                Message::Commit(job) => job,
                Message::Reset => {
                    refusing = None;
                    continue;
                }
            };
            let number = job.number;
            let refused = match &refusing {
                Some(error) => Some(Refused {
                    job: Box::new(job),
                    error: error.clone(),
                }),
                None => commit(
                    self.store.as_ref(),
                    &self.flusher,
                    &self.metrics,
                    &self.published,
                    job,
                )
                .err(),
            };
            if let Some(refused) = &refused {
                refusing.get_or_insert_with(|| refused.error.clone());
            }
            let wake = refused.is_some();
            if self.done.send(Done { number, refused }).is_err() {
                // The writer is gone; what is still queued is answered as it is dropped.
                break;
            }
            if wake && let Some(inbox) = self.wake.as_ref().and_then(WeakSender::upgrade) {
                // A full inbox means the writer is busy and settles before its next group.
                let _ = inbox.try_send(Command::Tick { reply: None });
            }
        }
    }
}

/// What the groups in flight wrote, for the writer's reads while the store does not have it
/// yet: each task's latest record and each new key, with the group that wrote it.
#[derive(Default)]
pub(super) struct InFlight {
    tasks: TaskIdMap<(u64, Task)>,
    keys: HashMap<String, (u64, KeyRecord)>,
    /// The tasks and keys of each group in flight, oldest first.
    groups: VecDeque<(u64, Vec<TaskId>, Vec<String>)>,
}

impl InFlight {
    pub(super) fn add(&mut self, number: u64, change: &Change) {
        let mut ids = Vec::with_capacity(change.writes.len());
        for write in &change.writes {
            self.tasks
                .insert(write.task.id, (number, write.task.clone()));
            ids.push(write.task.id);
        }
        let mut keys = Vec::new();
        for new in &change.new_tasks {
            if let Some((key, record)) = &new.key {
                self.keys.insert(key.clone(), (number, *record));
                keys.push(key.clone());
            }
        }
        self.groups.push_back((number, ids, keys));
    }

    pub(super) fn task(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id).map(|(_, task)| task)
    }

    pub(super) fn key(&self, key: &str) -> Option<KeyRecord> {
        self.keys.get(key).map(|(_, record)| *record)
    }

    /// Group `number` is in the store (or refused): what it wrote is read from there now,
    /// unless a later group in flight wrote it again. Returns the keys no longer held here.
    pub(super) fn landed(&mut self, number: u64) -> Vec<(String, KeyRecord)> {
        let mut gone = Vec::new();
        while let Some((oldest, _, _)) = self.groups.front() {
            if *oldest > number {
                break;
            }
            let Some((oldest, ids, keys)) = self.groups.pop_front() else {
                break;
            };
            for id in ids {
                if self.tasks.get(&id).is_some_and(|(by, _)| *by == oldest) {
                    self.tasks.remove(&id);
                }
            }
            for key in keys {
                if self.keys.get(&key).is_some_and(|(by, _)| *by == oldest)
                    && let Some((_, record)) = self.keys.remove(&key)
                {
                    gone.push((key, record));
                }
            }
        }
        gone
    }

    pub(super) fn clear(&mut self) {
        self.tasks.clear();
        self.keys.clear();
        self.groups.clear();
    }
}
