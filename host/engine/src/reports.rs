//! Reports of workers about their attempts (start, lease heartbeat, complete, fail), judged by
//! the lease token they carry, and the failure path through the retry decision.

use super::Engine;
use sluice_model::{
    Actor, Change, FailureClass, IllegalTransition, State, Task, TaskError, TaskId, WorkerEvent,
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
    /// The worker stopped the attempt after being told its task ended (`attempt-cancelled`).
    Stopped,
}

impl Report {
    pub fn name(&self) -> &'static str {
        match self {
            Report::Start => "start",
            Report::Heartbeat => "heartbeat",
            Report::Complete { .. } => "complete",
            Report::Fail { .. } => "fail",
            Report::Stopped => "stopped",
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
    /// From a genuine holder of this task's lease, the current one or an earlier one, whose
    /// lease is over: refuse. `log` says whether to record it on the timeline: once per
    /// attempt, so a holder that keeps reporting grows nothing.
    Stale {
        reason: String,
        worker: String,
        attempt: u32,
        log: bool,
    },
    /// The token never held this task's lease: refuse, and write nothing.
    Unknown,
    /// The task ended (cancelled, past its deadline) while this attempt ran, and the worker
    /// does not know yet: tell it to stop, and change nothing.
    Ended { state: State },
    /// The worker's attempt is over after its task ended (it says `stopped`, or reports the
    /// end it came to anyway): free its place.
    StoppedAfterEnd { state: State },
    /// An urgent task preempted this attempt, and the worker does not know yet: tell it to
    /// stop, and change nothing.
    Revoked { urgent: Option<TaskId> },
    /// The worker stopped the preempted attempt: free its place, and queue the task again.
    StoppedAfterRevoke,
}

/// Judges `report` carrying `token` against `task` at `now_ms`.
pub fn judge_report(now_ms: u64, task: &Task, token: &str, report: &Report) -> Verdict {
    let Some(lease) = &task.lease else {
        return Verdict::Unknown;
    };
    if lease.token != token {
        let digest = sluice_model::token_digest(token);
        return match task
            .retired_leases
            .iter()
            .find(|r| r.token_sha256 == digest)
        {
            Some(retired) => Verdict::Stale {
                reason: format!(
                    "the token is that of attempt {}, not of the current attempt ({})",
                    retired.attempt, lease.attempt
                ),
                worker: retired.worker.clone(),
                attempt: retired.attempt,
                log: !retired.refusal_logged,
            },
            None => Verdict::Unknown,
        };
    }
    let stale = |reason: String| Verdict::Stale {
        reason,
        worker: lease.worker.clone(),
        attempt: lease.attempt,
        log: !lease.refusal_logged,
    };
    if lease.holds_place_after_end() {
        return match report {
            Report::Start | Report::Heartbeat => Verdict::Ended { state: task.state },
            Report::Complete { .. } | Report::Fail { .. } | Report::Stopped => {
                Verdict::StoppedAfterEnd { state: task.state }
            }
        };
    }
    let leased = matches!(task.state, State::Claimed | State::Running);
    if leased && now_ms >= lease.expires_at_ms {
        return stale("the lease has expired".into());
    }
    if leased && lease.revoked_at_ms.is_some() {
        // An outcome that came first is kept (the work is done, or failed on its own); only
        // the attempt's continuing is refused.
        return match report {
            Report::Start | Report::Heartbeat => Verdict::Revoked {
                urgent: lease.revoked_for,
            },
            Report::Stopped => Verdict::StoppedAfterRevoke,
            Report::Complete { .. } | Report::Fail { .. } => Verdict::Fresh,
        };
    }
    match (task.state, report) {
        // A preempted attempt's `stopped`, said again once the task is waiting again.
        (_, Report::Stopped) if lease.revoked_at_ms.is_some() && lease.stopped_at_ms.is_some() => {
            Verdict::Replay
        }
        // Said again after the place was freed, or by a worker whose lease ran out first.
        (_, Report::Stopped) if lease.ended_at_ms.is_some() => Verdict::Replay,
        // Only an attempt told to stop may say it stopped; a running one ends by its outcome.
        (State::Claimed | State::Running, Report::Stopped) => Verdict::Stale {
            reason: "`stopped` answers `attempt-cancelled`; this attempt was not cancelled".into(),
            worker: lease.worker.clone(),
            attempt: lease.attempt,
            log: false,
        },
        (State::Claimed, _) => Verdict::Fresh,
        (State::Running, Report::Start) => Verdict::Replay,
        (State::Running, _) => Verdict::Fresh,
        (State::Completed, Report::Complete { .. }) => Verdict::Replay,
        // The failure this worker reported, even if its retry has since been released to the
        // queue. A failure the scheduler recorded (the lease expired, the attempt timed out)
        // is not the worker's: its late report is stale like any other.
        (
            State::RetryWait | State::Queued | State::Dead | State::Failed,
            Report::Fail { class, .. },
        ) if task.attempt == lease.attempt
            && task
                .error
                .as_ref()
                .is_some_and(|error| error.class == class.as_str()) =>
        {
            Verdict::Replay
        }
        (state, _) => stale(format!("the attempt is over: the task is {state}")),
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
    pub(crate) fn plan_start(
        &mut self,
        now_ms: u64,
        task: &Task,
    ) -> Result<Change, IllegalTransition> {
        let actor = lease_actor(task);
        self.plan_with(now_ms, task, &[State::Running], actor, None, |after| {
            if let Some(lease) = &mut after.lease {
                lease.started_at_ms = Some(now_ms);
            }
        })
    }

    /// Pushes the lease back by the lease length, never past the attempt's end. Not a
    /// transition: the task record changes, the log does not.
    pub(crate) fn plan_lease_heartbeat(&self, now_ms: u64, task: &Task) -> Change {
        let mut after = task.clone();
        if let Some(lease) = &mut after.lease {
            lease.expires_at_ms = now_ms
                .saturating_add(self.options.lease_ms)
                .min(lease.attempt_ends_at_ms.max(lease.expires_at_ms));
        }
        Change {
            writes: vec![sluice_model::TaskWrite {
                previous: Some(task.state),
                task: after,
            }],
            ..Change::default()
        }
    }

    /// → Completed with `result` (through Running if the worker never reported a start).
    pub(crate) fn plan_complete(
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
    pub(crate) fn plan_failure(
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
        } else if task.attempts_spent() >= task.max_attempts {
            RetryDecision::Dead(format!("attempts spent ({})", task.attempts_spent()))
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

    /// Logs a refused report of `attempt`'s holder `worker` on the task's timeline, and marks
    /// that attempt's lease as logged, so its further refusals write nothing.
    pub(crate) fn plan_refused_report(
        &self,
        now_ms: u64,
        task: &Task,
        worker: &str,
        attempt: u32,
        report: &Report,
        reason: &str,
    ) -> Change {
        let detail = format!(
            "{} report of attempt {attempt} refused: {reason}",
            report.name()
        );
        self.plan_note(
            now_ms,
            task,
            Actor::worker(worker),
            detail,
            |after| match &mut after.lease {
                Some(lease) if lease.attempt == attempt => lease.refusal_logged = true,
                _ => {
                    for retired in &mut after.retired_leases {
                        if retired.attempt == attempt {
                            retired.refusal_logged = true;
                        }
                    }
                }
            },
        )
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
