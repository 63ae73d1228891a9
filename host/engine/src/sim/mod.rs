//! The virtual-time driver: the engine's `step` on a clock it moves itself, over an in-memory
//! store, with completion callbacks answered at once. It never sleeps, spawns or reads a
//! clock, and every random bit comes from its seed, so the same seed and inputs give a
//! byte-identical transcript. The server's writer thread is the other shell around the same
//! step; `workload` runs simulated devices and workers on this one.

mod memory;
pub mod workload;

pub use memory::MemoryStore;

use crate::{
    CallbackOutcome, Claimed, Decide, Engine, EngineOptions, Input, NativeDecider, Read, Reply,
    Report, Step, StepError, Submitted, WorkerView,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use sluice_model::{Actor, Change, Heartbeat, Submission, Task, TaskId};
use std::fmt::Write as _;

/// How the driver's callback receivers answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallbackReceiver {
    /// Every delivery succeeds with HTTP 200.
    Accept,
    /// Every delivery fails with this reason.
    Refuse(String),
}

/// Where the first virtual moment of a run is: a round number, so transcripts are easy to read.
pub const START_MS: u64 = 1_000_000;

/// Where a driver commits what each step planned: the whole history (`MemoryStore`), or only
/// what a long replay needs (`sluice::replay::ReplayStore`).
pub trait SimStore: Read {
    fn commit(&mut self, change: Change);
}

pub struct Driver<S = MemoryStore> {
    engine: Engine,
    store: S,
    decide: Box<dyn Decide>,
    random: SmallRng,
    now_ms: u64,
    callbacks: CallbackReceiver,
    /// One line per event and per worker event, in order: the run's transcript, when kept.
    transcript: Option<String>,
}

impl Driver {
    /// A driver with the host's own policies (`NativeDecider`) at `START_MS`.
    pub fn new(seed: u64, options: EngineOptions) -> Driver {
        Driver::with_decide(seed, options, Box::new(NativeDecider::default()))
    }

    /// A driver over a `MemoryStore` that keeps a transcript.
    pub fn with_decide(seed: u64, options: EngineOptions, decide: Box<dyn Decide>) -> Driver {
        Driver::with_store(seed, options, decide, MemoryStore::default(), true)
    }

    /// The latest record of task `id`.
    pub fn task(&self, id: TaskId) -> Option<&Task> {
        self.store.get(id)
    }
}

impl<S: SimStore> Driver<S> {
    /// A driver committing into `store`, keeping a transcript if `transcript` says so.
    pub fn with_store(
        seed: u64,
        options: EngineOptions,
        decide: Box<dyn Decide>,
        store: S,
        transcript: bool,
    ) -> Driver<S> {
        let mut driver = Driver {
            engine: Engine::new(options),
            store,
            decide,
            random: SmallRng::seed_from_u64(seed),
            now_ms: START_MS,
            callbacks: CallbackReceiver::Accept,
            transcript: transcript.then(String::new),
        };
        driver.step(Input::PoliciesChanged);
        driver
    }

    pub fn set_callback_receiver(&mut self, receiver: CallbackReceiver) {
        self.callbacks = receiver;
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Moves the clock to `at_ms` without a tick; time never goes back.
    pub fn advance_to(&mut self, at_ms: u64) {
        self.now_ms = self.now_ms.max(at_ms);
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// The transcript so far; empty when the driver keeps none.
    pub fn transcript(&self) -> &str {
        self.transcript.as_deref().unwrap_or("")
    }

    /// The transcript, handed over; empty when the driver keeps none.
    pub fn take_transcript(&mut self) -> String {
        self.transcript
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Runs one input through the engine at the current time and commits what it planned.
    /// Callbacks it hands out are answered at once, each as a step of its own.
    pub fn step(&mut self, input: Input) -> Reply {
        let Step {
            change,
            reply,
            callbacks,
        } = self.engine.step(
            input,
            self.now_ms,
            &mut self.random,
            self.decide.as_ref(),
            &self.store,
        );
        self.commit(change);
        for job in callbacks {
            let outcome = match &self.callbacks {
                CallbackReceiver::Accept => CallbackOutcome::Delivered { status: 200 },
                CallbackReceiver::Refuse(reason) => CallbackOutcome::Failed {
                    reason: reason.clone(),
                },
            };
            self.step(Input::CallbackDone {
                id: job.id,
                attempt: job.attempt,
                outcome,
            });
        }
        reply
    }

    fn commit(&mut self, change: Change) {
        if let Some(transcript) = self.transcript.as_mut() {
            write_transcript(transcript, &change);
        }
        self.store.commit(change);
    }

    /// Submits one task; its answer.
    pub fn submit(&mut self, submission: Submission) -> Result<Submitted, StepError> {
        match self.step(Input::Submit(vec![submission])) {
            Reply::Submitted(mut results) => results
                .pop()
                .unwrap_or_else(|| Err(StepError::Internal("no answer".into()))),
            other => Err(unexpected(other)),
        }
    }

    pub fn heartbeat(
        &mut self,
        worker: &str,
        heartbeat: Heartbeat,
    ) -> Result<Vec<WorkerView>, StepError> {
        match self.step(Input::Heartbeat {
            worker: worker.to_owned(),
            heartbeat,
        }) {
            Reply::Workers(result) => result,
            other => Err(unexpected(other)),
        }
    }

    pub fn claim(&mut self, worker: &str, max: usize) -> Result<Claimed, StepError> {
        self.claim_batch(worker, max, None)
    }

    /// A claim for one GPU batch (`batch`), or for any tasks (none).
    pub fn claim_batch(
        &mut self,
        worker: &str,
        max: usize,
        batch: Option<crate::BatchClaim>,
    ) -> Result<Claimed, StepError> {
        match self.step(Input::Claim {
            worker: worker.to_owned(),
            max,
            claim_id: None,
            batch,
        }) {
            Reply::Claimed(result) => result,
            other => Err(unexpected(other)),
        }
    }

    pub fn report(&mut self, id: TaskId, token: &str, report: Report) -> Result<Task, StepError> {
        match self.step(Input::Reports(vec![(id, token.to_owned(), report)])) {
            Reply::Reports(mut results) => results
                .pop()
                .unwrap_or_else(|| Err(StepError::Internal("no answer".into()))),
            other => Err(unexpected(other)),
        }
    }

    pub fn cancel(&mut self, id: TaskId, actor: Actor) -> Result<Task, StepError> {
        match self.step(Input::Cancel { id, actor }) {
            Reply::Task(result) => result,
            other => Err(unexpected(other)),
        }
    }

    /// Moves the clock on by `step_ms` and runs a tick there.
    pub fn tick(&mut self, step_ms: u64) {
        self.now_ms = self.now_ms.saturating_add(step_ms);
        self.step(Input::Tick {
            callback_slots: usize::MAX,
            callback_bytes: usize::MAX,
        });
    }
}

/// One line per event and per worker event of `change`.
fn write_transcript(transcript: &mut String, change: &Change) {
    for event in &change.events {
        let _ = writeln!(
            transcript,
            "{} {} {} {}->{} {} {}",
            event.seq,
            event.at_ms,
            event.task_id,
            event.from.map_or("none", |s| s.as_str()),
            event.to,
            event.actor,
            event.detail.as_deref().unwrap_or("")
        );
    }
    for event in &change.worker_events {
        let _ = writeln!(
            transcript,
            "w{} {} {} {}->{} {}",
            event.seq, event.at_ms, event.worker, event.from, event.to, event.reason
        );
    }
}

fn unexpected(reply: Reply) -> StepError {
    StepError::Internal(format!(
        "a step answered with a reply of another kind: {reply:?}"
    ))
}

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod callback_room_tests;
#[cfg(test)]
mod cancel_tests;
#[cfg(test)]
mod concurrency_tests;
#[cfg(test)]
mod fairness_tests;
#[cfg(test)]
mod placement_tests;
#[cfg(test)]
mod preempt_tests;
#[cfg(test)]
mod tests;
