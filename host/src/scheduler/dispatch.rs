//! The writer's dispatch work: claims, workers' reports, and the tick that runs the reaper
//! (expired leases, timed-out attempts, retries to release, deadlines) and aging. Each asks
//! the decider what a policy must decide, then has the engine plan it.

use super::writer::{Group, Writer};
use super::{Claimed, SchedulerError};
use crate::engine::{Due, Report, Verdict, WorkerView, failure_view, judge_report};
use crate::model::{Actor, FailureClass, Task, TaskId};
use rand::Rng;

/// Timers handled per tick at most; the rest wait for the next tick.
const DUE_PER_TICK: usize = 1_024;
/// Waiting tasks per bucket shown to the aging policy per aging tick.
const AGING_PER_BUCKET: usize = 4_096;

impl Writer {
    pub(super) fn claim(
        &mut self,
        worker: &str,
        max: usize,
        group: &mut Group,
    ) -> Result<Claimed, SchedulerError> {
        let now_ms = self.clock.now_ms();
        let (picked, event) = self.engine.pick(now_ms, worker, max);
        group.change.worker_events.extend(event);
        let picks = match picked {
            Ok(picks) => picks,
            Err(refused) => {
                return Ok(Claimed {
                    leases: Vec::new(),
                    refused: Some(refused),
                });
            }
        };
        let mut leases = Vec::with_capacity(picks.len());
        for pick in picks {
            let task = self.task(pick.task, group)?;
            let _claim = tracing::debug_span!(
                target: crate::telemetry::TASK_SPANS,
                "claim",
                task_id = %task.id,
                worker,
                attempt = task.attempt.saturating_add(1),
                bucket = task.bucket.as_str(),
            )
            .entered();
            let random: u128 = self.random.random();
            match self
                .engine
                .plan_claim(now_ms, random, &task, worker, pick.gpu)
            {
                Ok(change) => leases.push(self.plan(change, group)),
                Err(illegal) => {
                    tracing::error!(task_id = %task.id, %illegal, "a queued task could not be claimed")
                }
            }
        }
        Ok(Claimed {
            leases,
            refused: None,
        })
    }

    pub(super) fn report(
        &mut self,
        id: TaskId,
        token: &str,
        report: Report,
        group: &mut Group,
    ) -> Result<Task, SchedulerError> {
        let _span = report_span(id, &report).entered();
        let task = self.task(id, group)?;
        let now_ms = self.clock.now_ms();
        let illegal = |source| SchedulerError::Illegal {
            task_id: id,
            state: task.state,
            source,
        };
        match judge_report(now_ms, &task, token, &report) {
            Verdict::Replay => Ok(task),
            Verdict::Stale(reason) => {
                let worker = task
                    .lease
                    .as_ref()
                    .map_or("unknown", |lease| lease.worker.as_str())
                    .to_owned();
                let change = self
                    .engine
                    .plan_refused_report(now_ms, &task, &worker, &report, &reason);
                self.plan(change, group);
                Err(SchedulerError::StaleLease {
                    task_id: id,
                    reason,
                })
            }
            Verdict::Fresh => match report {
                Report::Start => {
                    let change = self.engine.plan_start(now_ms, &task).map_err(illegal)?;
                    Ok(self.plan(change, group))
                }
                Report::Heartbeat => {
                    let change = self.engine.plan_lease_heartbeat(now_ms, &task);
                    Ok(self.plan(change, group))
                }
                Report::Complete { result } => {
                    let change = self
                        .engine
                        .plan_complete(now_ms, &task, result)
                        .map_err(illegal)?;
                    let event = self.engine.record_outcome(now_ms, &task, None);
                    group.change.worker_events.extend(event);
                    Ok(self.plan(change, group))
                }
                Report::Fail { class, message } => {
                    let actor = task
                        .lease
                        .as_ref()
                        .map_or_else(Actor::scheduler, |l| Actor::worker(&l.worker));
                    self.fail(now_ms, &task, class, message, actor, group)
                }
            },
        }
    }

    /// Plans a failed attempt through the retry decision, and counts it against its worker.
    fn fail(
        &mut self,
        now_ms: u64,
        task: &Task,
        class: FailureClass,
        message: String,
        actor: Actor,
        group: &mut Group,
    ) -> Result<Task, SchedulerError> {
        let mut planned = self.fail_all(now_ms, vec![(task.clone(), class, message)], actor, group);
        planned
            .pop()
            .unwrap_or(Err(SchedulerError::NotFound(task.id)))
    }

    /// Plans failed attempts with one retry decision for them all; one answer each, in order.
    fn fail_all(
        &mut self,
        now_ms: u64,
        failed: Vec<(Task, FailureClass, String)>,
        actor: Actor,
        group: &mut Group,
    ) -> Vec<Result<Task, SchedulerError>> {
        if failed.is_empty() {
            return Vec::new();
        }
        let views: Vec<_> = failed
            .iter()
            .map(|(task, class, _)| failure_view(task, *class, self.random.random()))
            .collect();
        let decided = self.decider.retry(now_ms, &views);
        let mut decisions = decided.answer.into_iter();
        failed
            .into_iter()
            .map(|(task, class, message)| {
                let decision = decisions
                    .next()
                    .unwrap_or(crate::engine::RetryDecision::Dead(
                        "the retry policy gave no answer".into(),
                    ));
                let change = self
                    .engine
                    .plan_failure(
                        now_ms,
                        &task,
                        class,
                        message,
                        decision,
                        decided.version,
                        actor.clone(),
                    )
                    .map_err(|source| SchedulerError::Illegal {
                        task_id: task.id,
                        state: task.state,
                        source,
                    })?;
                let event = self.engine.record_outcome(now_ms, &task, Some(class));
                group.change.worker_events.extend(event);
                Ok(self.plan(change, group))
            })
            .collect()
    }

    pub(super) fn reset_worker(
        &mut self,
        worker: &str,
        actor: Actor,
        group: &mut Group,
    ) -> Result<Vec<WorkerView>, SchedulerError> {
        let now_ms = self.clock.now_ms();
        if !self.engine.knows_worker(worker) {
            return Err(SchedulerError::UnknownWorker(worker.to_owned()));
        }
        let event = self.engine.reset_worker(now_ms, worker, actor);
        group.change.worker_events.extend(event);
        Ok(self.engine.worker(now_ms, worker).into_iter().collect())
    }

    /// Runs what is due, then ages the queues if their interval has passed. Attempts that
    /// failed by time (expired leases, timeouts) share one retry decision.
    pub(super) fn tick(&mut self, group: &mut Group) {
        let now_ms = self.clock.now_ms();
        let mut failed = Vec::new();
        for id in self.engine.due(now_ms, DUE_PER_TICK) {
            match self.run_due(now_ms, id, group) {
                Ok(Some(failure)) => failed.push(failure),
                Ok(None) => {}
                Err(error) => tracing::error!(task_id = %id, %error, "could not run a due timer"),
            }
        }
        for planned in self.fail_all(now_ms, failed, Actor::scheduler(), group) {
            if let Err(error) = planned {
                tracing::error!(%error, "could not fail an expired attempt");
            }
        }
        if now_ms >= self.next_aging_ms {
            self.next_aging_ms = now_ms.saturating_add(self.aging_interval_ms);
            self.age(now_ms, group);
            let weights = self.decider.bucket_weights(now_ms);
            self.engine.set_bucket_weights(weights);
            self.engine.forget_silent_workers(now_ms);
        }
    }

    /// Plans what is due for task `id`, except a failure, which it returns for the batch.
    fn run_due(
        &mut self,
        now_ms: u64,
        id: TaskId,
        group: &mut Group,
    ) -> Result<Option<(Task, FailureClass, String)>, SchedulerError> {
        let task = self.task(id, group)?;
        let illegal = |source| SchedulerError::Illegal {
            task_id: id,
            state: task.state,
            source,
        };
        match self.engine.due_action(now_ms, &task) {
            None => {}
            Some(Due::Deadline) => {
                let change = self.engine.plan_timed_out(now_ms, &task).map_err(illegal)?;
                self.plan(change, group);
            }
            Some(Due::Release) => {
                let change = self.engine.plan_release(now_ms, &task).map_err(illegal)?;
                self.plan(change, group);
            }
            Some(Due::Callback) => self.send_callback(now_ms, &task, group),
            Some(Due::Merge) => self.merge_family(&task, group)?,
            Some(Due::Failed(class)) => {
                let message = match class {
                    FailureClass::Timeout => "the attempt ran past its timeout",
                    _ => "the lease expired without a report",
                };
                return Ok(Some((task, class, message.to_owned())));
            }
        }
        Ok(None)
    }

    /// Hands a due callback to the deliverer and marks it in flight. A full deliverer queue
    /// leaves the callback due, for the next tick.
    fn send_callback(&mut self, now_ms: u64, task: &Task, group: &mut Group) {
        let Some(url) = task.callback_url.clone() else {
            return;
        };
        let Some((attempt, change)) = self.engine.plan_callback_attempt(now_ms, task) else {
            return;
        };
        let body = match serde_json::to_vec(&task.clone().without_token()) {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(task_id = %task.id, %error, "cannot encode a callback");
                return;
            }
        };
        let job = super::callbacks::Job {
            id: task.id,
            attempt,
            url,
            body,
        };
        if self.callback_jobs.try_send(job).is_ok() {
            self.plan(change, group);
        }
    }

    pub(super) fn callback_done(
        &mut self,
        id: TaskId,
        attempt: u32,
        outcome: &crate::engine::CallbackOutcome,
        group: &mut Group,
    ) {
        let now_ms = self.clock.now_ms();
        match self.task(id, group) {
            Ok(task) => {
                if let Some(change) = self
                    .engine
                    .plan_callback_outcome(now_ms, &task, attempt, outcome)
                {
                    self.plan(change, group);
                }
            }
            Err(error) => tracing::error!(task_id = %id, %error, "cannot record a callback"),
        }
    }

    fn age(&mut self, now_ms: u64, group: &mut Group) {
        let waiting = self.engine.aging_views(AGING_PER_BUCKET);
        if waiting.is_empty() {
            return;
        }
        let views: Vec<_> = waiting.iter().map(|(_, view)| *view).collect();
        let decided = self.decider.age(now_ms, &views);
        for (index, to) in decided.answer {
            let Some(&(id, _)) = waiting.get(index as usize) else {
                continue;
            };
            let promoted = self
                .task(id, group)
                .map(|task| self.engine.plan_promote(now_ms, &task, to, decided.version));
            match promoted {
                Ok(Some(change)) => {
                    self.plan(change, group);
                }
                Ok(None) => {}
                Err(error) => tracing::error!(task_id = %id, %error, "could not promote"),
            }
        }
    }
}

/// The span of a worker's report, named for what it reports (span names are static).
fn report_span(id: TaskId, report: &Report) -> tracing::Span {
    use crate::telemetry::TASK_SPANS;
    match report {
        Report::Start => tracing::debug_span!(target: TASK_SPANS, "start", task_id = %id),
        Report::Complete { .. } => {
            tracing::debug_span!(target: TASK_SPANS, "complete", task_id = %id)
        }
        Report::Fail { class, .. } => {
            tracing::debug_span!(target: TASK_SPANS, "fail", task_id = %id, class = class.as_str())
        }
        Report::Heartbeat => tracing::Span::none(),
    }
}
