//! Reports of workers about their attempts (start, lease heartbeat, complete, fail), judged by
//! the lease token they carry, and the failure path through the retry decision.

use super::Engine;
use crate::model::{
    Actor, Change, FailureClass, IllegalTransition, State, Task, TaskError, WorkerEvent,
};

#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    Start,
    Heartbeat,
    Complete {
        result: serde_json::Value,
    },
    Fail {
        class: FailureClass,
        message: String,
    },
}

impl Report {
    pub fn name(&self) -> &'static str {
        match self {
            Report::Start => "start",
            Report::Heartbeat => "heartbeat",
            Report::Complete { .. } => "complete",
            Report::Fail { .. } => "fail",
        }
    }
}

/// How a report relates to the task as it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The current attempt's report: act on it.
    Fresh,
    /// The current (or just ended) attempt said this already: answer as before, change nothing.
    Replay,
    /// Not the current attempt's, or its lease is over: refuse, and log the attempt.
    Stale(String),
}

/// Judges `report` carrying `token` against `task` at `now_ms`.
pub fn judge_report(now_ms: u64, task: &Task, token: &str, report: &Report) -> Verdict {
    let Some(lease) = &task.lease else {
        return Verdict::Stale("the task has never been leased".into());
    };
    if lease.token != token {
        return Verdict::Stale(format!(
            "the token is not that of the current attempt ({})",
            lease.attempt
        ));
    }
    let leased = matches!(task.state, State::Claimed | State::Running);
    if leased && now_ms >= lease.expires_at_ms {
        return Verdict::Stale("the lease has expired".into());
    }
    match (task.state, report) {
        (State::Claimed, _) => Verdict::Fresh,
        (State::Running, Report::Start) => Verdict::Replay,
        (State::Running, _) => Verdict::Fresh,
        (State::Completed, Report::Complete { .. }) => Verdict::Replay,
        // A failure already recorded, even if its retry has since been released to the queue.
        (State::RetryWait | State::Queued | State::Dead | State::Failed, Report::Fail { .. })
            if task.attempt == lease.attempt =>
        {
            Verdict::Replay
        }
        (state, _) => Verdict::Stale(format!("the attempt is over: the task is {state}")),
    }
}

/// The retry policy's answer to one failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RetryDecision {
    RetryAfterMs(u64),
    Dead(String),
}

impl Engine {
    /// Claimed → Running.
    pub fn plan_start(&mut self, now_ms: u64, task: &Task) -> Result<Change, IllegalTransition> {
        let actor = lease_actor(task);
        self.plan_with(now_ms, task, &[State::Running], actor, None, |after| {
            if let Some(lease) = &mut after.lease {
                lease.started_at_ms = Some(now_ms);
            }
        })
    }

    /// Pushes the lease back by the lease length, never past the attempt's end. Not a
    /// transition: the task record changes, the log does not.
    pub fn plan_lease_heartbeat(&self, now_ms: u64, task: &Task) -> Change {
        let mut after = task.clone();
        if let Some(lease) = &mut after.lease {
            lease.expires_at_ms = now_ms
                .saturating_add(self.options.lease_ms)
                .min(lease.attempt_ends_at_ms.max(lease.expires_at_ms));
        }
        Change {
            writes: vec![crate::model::TaskWrite {
                previous: Some(task.state),
                task: after,
            }],
            ..Change::default()
        }
    }

    /// → Completed with `result` (through Running if the worker never reported a start).
    pub fn plan_complete(
        &mut self,
        now_ms: u64,
        task: &Task,
        result: serde_json::Value,
    ) -> Result<Change, IllegalTransition> {
        let path: &[State] = if task.state == State::Claimed {
            &[State::Running, State::Completed]
        } else {
            &[State::Completed]
        };
        let actor = lease_actor(task);
        self.plan_with(now_ms, task, path, actor, None, |after| {
            after.result = Some(result);
            after.error = None;
        })
    }

    /// A failed attempt → RetryWait until `now + delay`, or Dead, as `decision` says. The
    /// host's own bounds come first: a hopeless class or spent attempts are dead whatever the
    /// policy answered. `version` names the retry policy version that decided.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_failure(
        &mut self,
        now_ms: u64,
        task: &Task,
        class: FailureClass,
        message: String,
        decision: RetryDecision,
        version: Option<u32>,
        actor: Actor,
    ) -> Result<Change, IllegalTransition> {
        let by = version.map_or("the host's rule".to_owned(), |v| {
            format!("retry policy v{v}")
        });
        let decision = if !class.blames_worker() {
            RetryDecision::Dead(format!("{class} failure"))
        } else if task.attempt >= task.max_attempts {
            RetryDecision::Dead(format!("attempts spent ({})", task.attempt))
        } else {
            decision
        };
        let error = TaskError {
            class: class.as_str().to_owned(),
            message,
        };
        match decision {
            RetryDecision::RetryAfterMs(delay_ms) => {
                let not_before_ms = now_ms.saturating_add(delay_ms);
                let detail = format!(
                    "attempt {} failed ({class}); retry after {delay_ms} ms, by {by}",
                    task.attempt
                );
                self.plan_with(
                    now_ms,
                    task,
                    &[State::RetryWait],
                    actor,
                    Some(detail),
                    |t| {
                        t.not_before_ms = Some(not_before_ms);
                        t.error = Some(error);
                    },
                )
            }
            RetryDecision::Dead(reason) => {
                let detail = format!(
                    "attempt {} failed ({class}); dead: {reason}, by {by}",
                    task.attempt
                );
                self.plan_with(now_ms, task, &[State::Dead], actor, Some(detail), |t| {
                    t.not_before_ms = None;
                    t.error = Some(TaskError {
                        message: format!("{}: {reason}", error.message),
                        ..error
                    });
                })
            }
        }
    }

    /// Logs a refused report on the task's timeline; the task is otherwise unchanged.
    pub fn plan_refused_report(
        &self,
        now_ms: u64,
        task: &Task,
        worker: &str,
        report: &Report,
        reason: &str,
    ) -> Change {
        let detail = format!("{} report refused: {reason}", report.name());
        self.plan_note(now_ms, task, Actor::worker(worker), detail, |_| {})
    }

    /// Records an attempt's outcome against its worker's breaker. `failure` is the class of a
    /// failed attempt, none for a success; failures that blame the task, not the worker, are
    /// not counted. Returns the breaker's change as a worker event, if it changed.
    pub fn record_outcome(
        &mut self,
        now_ms: u64,
        task: &Task,
        failure: Option<FailureClass>,
    ) -> Option<WorkerEvent> {
        let lease = task.lease.as_ref()?;
        if failure.is_some_and(|class| !class.blames_worker()) {
            return None;
        }
        let options = self.options.breaker.clone();
        let worker = self.workers.get_mut(&lease.worker)?;
        let change = worker
            .breaker
            .record(now_ms, task.id, failure.is_some(), &options)?;
        let worker = lease.worker.clone();
        Some(self.log_worker_event(now_ms, &worker, Actor::scheduler(), change))
    }
}

fn lease_actor(task: &Task) -> Actor {
    task.lease
        .as_ref()
        .map_or_else(Actor::scheduler, |lease| Actor::worker(&lease.worker))
}
