//! The deterministic scheduling core: it owns the in-memory indexes (bucket queues, tasks by
//! state) and turns requests into `Change`s for the store. Time and random bits are arguments;
//! it never reads a clock, sleeps, spawns or touches the store, so any run can be replayed.
//!
//! The core plans, then learns: `plan_*` build a `Change` without altering the engine, and
//! `apply` advances the indexes (queues, counts, event numbers) by that change. The shell
//! applies each plan at once, so the next plan in the same group of requests sees it, and
//! commits the group as one change; if that commit fails, the shell rebuilds the engine from
//! the store, so memory never runs ahead of disk.

mod queues;

pub use queues::BucketQueues;

use crate::model::{
    Actor, Admission, Event, IdGenerator, IllegalTransition, State, Submission, Task, TaskId,
};
use crate::store::{Change, KeyRecord, NewTask, Recovery, TaskWrite};

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
    pub queued_by_bucket: std::collections::BTreeMap<crate::model::Priority, usize>,
    pub illegal_transitions_total: u64,
    pub last_event_seq: u64,
}

#[derive(Debug)]
pub struct Engine {
    ids: IdGenerator,
    /// Events are numbered from 1, so `after = 0` reads the log from its start.
    next_event_seq: u64,
    queues: BucketQueues,
    tasks_by_state: [u64; 12],
    illegal_transitions: u64,
}

impl Default for Engine {
    fn default() -> Self {
        Engine {
            ids: IdGenerator::default(),
            next_event_seq: 1,
            queues: BucketQueues::default(),
            tasks_by_state: [0; 12],
            illegal_transitions: 0,
        }
    }
}

impl Engine {
    /// Rebuilds the in-memory indexes from what the store holds. Returns the engine and the
    /// tasks that were durable but not yet admitted when the last process stopped.
    pub fn recover(recovery: &Recovery) -> (Engine, Vec<TaskId>) {
        let mut engine = Engine {
            ids: recovery
                .last_task_id
                .map(IdGenerator::resume_after)
                .unwrap_or_default(),
            next_event_seq: recovery.last_event_seq + 1,
            tasks_by_state: recovery.tasks_by_state,
            ..Engine::default()
        };
        let mut unadmitted = Vec::new();
        for entry in &recovery.live {
            match entry.state {
                State::Queued => engine.queues.push(entry.bucket, entry.id),
                State::Created => unadmitted.push(entry.id),
                _ => {}
            }
        }
        (engine, unadmitted)
    }

    pub fn queues(&self) -> &BucketQueues {
        &self.queues
    }

    pub fn tasks_in(&self, state: State) -> u64 {
        self.tasks_by_state[usize::from(state.code())]
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
            queued_by_bucket: crate::model::Priority::ALL
                .into_iter()
                .map(|b| (b, self.queues.len(b)))
                .collect(),
            illegal_transitions_total: self.illegal_transitions,
            last_event_seq: self.next_event_seq - 1,
        }
    }

    /// Plans a new task: created, then admitted as `admission` says, as one atomic change with
    /// one event per step. The task as stored is `change.writes[0].task`.
    pub fn plan_create(
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
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            attempt: 0,
            state: State::Created,
            result: None,
            error: None,
            event_seqs: Vec::new(),
        };
        let created = self.event(
            0,
            id,
            None,
            State::Created,
            Actor::device(&spec.device),
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
            admission
                .policy_version
                .map(|version| format!("admitted by priority policy v{version}")),
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
        }
    }

    /// Plans a change of `task` to state `to`. An illegal transition is refused, counted and
    /// logged, and plans nothing.
    pub fn plan_transition(
        &mut self,
        now_ms: u64,
        task: &Task,
        to: State,
        actor: Actor,
        detail: Option<String>,
    ) -> Result<Change, IllegalTransition> {
        if let Err(illegal) = task.state.check(to) {
            self.illegal_transitions += 1;
            tracing::warn!(task_id = %task.id, from = %illegal.from, to = %illegal.to, %actor, "illegal transition refused");
            return Err(illegal);
        }
        let mut after = task.clone();
        after.state = to;
        after.updated_at_ms = now_ms;
        let event = self.event(0, task.id, Some(task.state), to, actor, now_ms, detail);
        after.event_seqs.push(event.seq);
        Ok(Change {
            new_tasks: Vec::new(),
            writes: vec![TaskWrite {
                previous: Some(task.state),
                task: after,
            }],
            events: vec![event],
        })
    }

    /// Learns a planned change: the next plan builds on it.
    pub fn apply(&mut self, change: &Change) {
        if let Some(last) = change.events.last() {
            self.next_event_seq = last.seq + 1;
        }
        for new in &change.new_tasks {
            self.ids = IdGenerator::resume_after(new.id.max(self.ids.last()));
        }
        for write in &change.writes {
            let task = &write.task;
            if let Some(previous) = write.previous {
                self.tasks_by_state[usize::from(previous.code())] -= 1;
                if previous == State::Queued {
                    self.queues.remove(task.id);
                }
            }
            self.tasks_by_state[usize::from(task.state.code())] += 1;
            if task.state == State::Queued {
                self.queues.push(task.bucket, task.id);
            }
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
