//! A step's dispatch work: claims, workers' reports, and the tick that runs the reaper
//! (expired leases, timed-out attempts, retries to release, deadlines, callbacks) and aging.
//! Each asks `Decide` what a policy must decide, then has the engine plan it.

use super::{CallbackJob, Claimed, StepError, Stepper};
use crate::{
    BatchClaim, CallbackOutcome, Due, Picks, Report, RetryDecision, Verdict, WorkerView,
    failure_view, judge_report,
};
use rand::Rng;
use sluice_model::{Actor, FailureClass, NamesRef, PolicyKind, State, Task, TaskId, VariantTag};

/// Timers handled per tick at most; the rest wait for the next tick.
const DUE_PER_TICK: usize = 1_024;
/// Waiting tasks per bucket shown to the aging policy per aging tick.
const AGING_PER_BUCKET: usize = 4_096;

impl Stepper<'_> {
    pub(super) fn claim(
        &mut self,
        worker: &str,
        max: usize,
        claim_id: Option<&str>,
        batch: Option<&BatchClaim>,
    ) -> Result<Claimed, StepError> {
        if let Some(claim_id) = claim_id {
            let granted = self.granted_by(worker, claim_id)?;
            if !granted.is_empty() {
                return Ok(Claimed {
                    leases: granted,
                    ..Claimed::default()
                });
            }
        }
        let now_ms = self.now_ms;
        let (picked, event) = self.engine.pick(now_ms, worker, max, batch);
        self.change.worker_events.extend(event);
        let picks = match picked {
            Ok(Picks {
                hold_until_ms: Some(until_ms),
                ..
            }) => {
                return Ok(Claimed {
                    hold_ms: Some(until_ms.saturating_sub(now_ms).max(1)),
                    ..Claimed::default()
                });
            }
            Ok(Picks { picks, .. }) => picks,
            Err(refused) => {
                return Ok(Claimed {
                    refused: Some(refused),
                    ..Claimed::default()
                });
            }
        };
        let tasks = picks
            .iter()
            .map(|pick| self.task(pick.task))
            .collect::<Result<Vec<Task>, StepError>>()?;
        // A GPU batch of n runs no longer than its n tasks one after another: each task of it
        // may take n times the batch's longest attempt timeout.
        let batch_timeout_ms = batch.filter(|_| tasks.len() > 1).map(|_| {
            let longest = tasks
                .iter()
                .map(|t| t.attempt_timeout_ms)
                .max()
                .unwrap_or(1);
            longest.saturating_mul(tasks.len() as u64)
        });
        let mut leases = Vec::with_capacity(picks.len());
        for (pick, task) in picks.into_iter().zip(tasks) {
            let _claim = tracing::debug_span!(
                target: sluice_model::TASK_SPANS,
                "claim",
                task_id = %task.id,
                worker,
                attempt = task.attempt.saturating_add(1),
                bucket = task.bucket.as_str(),
            )
            .entered();
            let random: u128 = self.random.random();
            let attempt_timeout_ms = batch_timeout_ms.unwrap_or(task.attempt_timeout_ms);
            match self.engine.plan_claim_within(
                now_ms,
                random,
                &task,
                (worker, pick.gpu, claim_id),
                attempt_timeout_ms,
            ) {
                Ok(change) => leases.push(self.plan(change)),
                Err(illegal) => {
                    tracing::error!(task_id = %task.id, %illegal, "a queued task could not be claimed")
                }
            }
        }
        Ok(Claimed {
            leases,
            ..Claimed::default()
        })
    }

    /// The tasks `worker`'s claim `claim_id` leased that are still claimed and not yet
    /// started: what that claim's answer carried, for the same claim sent again.
    fn granted_by(&self, worker: &str, claim_id: &str) -> Result<Vec<Task>, StepError> {
        let Some(state) = self.engine.workers.get(worker) else {
            return Ok(Vec::new());
        };
        let mut granted = Vec::new();
        for &id in state.leases.keys() {
            let task = self.task(id)?;
            let same_claim = task.lease.as_ref().is_some_and(|lease| {
                lease.worker == worker && lease.claim_id.as_deref() == Some(claim_id)
            });
            if task.state == State::Claimed && same_claim {
                granted.push(task);
            }
        }
        Ok(granted)
    }

    pub(super) fn report(
        &mut self,
        id: TaskId,
        token: &str,
        report: Report,
    ) -> Result<Task, StepError> {
        let _span = report_span(id, &report).entered();
        let task = self.task(id)?;
        let now_ms = self.now_ms;
        let illegal = |source| StepError::Illegal {
            task_id: id,
            state: task.state,
            source,
        };
        match judge_report(now_ms, &task, token, &report) {
            Verdict::Replay => Ok(task),
            Verdict::Unknown => Err(StepError::StaleLease {
                task_id: id,
                reason: "the token never held this task's lease".into(),
                logged: false,
            }),
            Verdict::Stale {
                reason,
                worker,
                attempt,
                log,
            } => {
                if log {
                    let change = self
                        .engine
                        .plan_refused_report(now_ms, &task, &worker, attempt, &report, &reason);
                    self.plan(change);
                }
                Err(StepError::StaleLease {
                    task_id: id,
                    reason,
                    logged: log,
                })
            }
            Verdict::Ended { state } => Err(StepError::AttemptCancelled { task_id: id, state }),
            Verdict::Revoked { urgent } => Err(StepError::AttemptRevoked {
                task_id: id,
                urgent,
            }),
            Verdict::StoppedAfterRevoke => {
                let change = self
                    .engine
                    .plan_preempted(now_ms, &task, true)
                    .map_err(illegal)?;
                Ok(self.plan(change))
            }
            Verdict::StoppedAfterEnd { state } => {
                let change = self.engine.plan_place_freed(now_ms, &task, true);
                let task = self.plan(change);
                match report {
                    Report::Stopped => Ok(task),
                    // The outcome came too late to count: the task stays as it ended.
                    _ => Err(StepError::AttemptCancelled { task_id: id, state }),
                }
            }
            Verdict::Fresh => match report {
                Report::Start => {
                    let change = self.engine.plan_start(now_ms, &task).map_err(illegal)?;
                    Ok(self.plan(change))
                }
                Report::Heartbeat => {
                    let change = self.engine.plan_lease_heartbeat(now_ms, &task);
                    Ok(self.plan(change))
                }
                Report::Complete { result } => {
                    let change = self
                        .engine
                        .plan_complete(now_ms, &task, result)
                        .map_err(illegal)?;
                    let event = self.engine.record_outcome(now_ms, &task, None);
                    self.change.worker_events.extend(event);
                    Ok(self.plan(change))
                }
                Report::Fail { class, message } => {
                    let actor = task
                        .lease
                        .as_ref()
                        .map_or_else(Actor::scheduler, |l| Actor::worker(&l.worker));
                    self.fail(now_ms, &task, class, message, actor)
                }
                // `judge_report` calls a `stopped` of a live attempt stale.
                Report::Stopped => Err(StepError::Internal("a stopped report judged fresh".into())),
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
    ) -> Result<Task, StepError> {
        let mut planned = self.fail_all(now_ms, vec![(task.clone(), class, message)], actor);
        planned.pop().unwrap_or(Err(StepError::NotFound(task.id)))
    }

    /// Plans failed attempts with one retry decision for them all; one answer each, in order.
    fn fail_all(
        &mut self,
        now_ms: u64,
        failed: Vec<(Task, FailureClass, String)>,
        actor: Actor,
    ) -> Vec<Result<Task, StepError>> {
        if failed.is_empty() {
            return Vec::new();
        }
        let views: Vec<_> = failed
            .iter()
            .map(|(task, class, _)| failure_view(task, *class, self.random.random()))
            .collect();
        let names: Vec<NamesRef> = failed.iter().map(|(task, _, _)| task.into()).collect();
        // One call per variant of a live retry experiment (one call in all without one), each
        // answer put back in the failures' order.
        let mut by_variant: Vec<(Option<VariantTag>, Vec<usize>)> = Vec::new();
        for (index, (task, _, _)) in failed.iter().enumerate() {
            let variant = task.variant(PolicyKind::Retry);
            match by_variant.iter_mut().find(|(v, _)| *v == variant) {
                Some((_, indexes)) => indexes.push(index),
                None => by_variant.push((variant, vec![index])),
            }
        }
        let mut decisions: Vec<Option<(RetryDecision, Option<u32>)>> = vec![None; failed.len()];
        for (variant, indexes) in &by_variant {
            let decided = if by_variant.len() == 1 {
                self.decide.retry(now_ms, *variant, &views, &names)
            } else {
                let (views, names): (Vec<_>, Vec<_>) =
                    indexes.iter().map(|&i| (views[i], names[i])).unzip();
                self.decide.retry(now_ms, *variant, &views, &names)
            };
            for (&index, decision) in indexes.iter().zip(decided.answer) {
                decisions[index] = Some((decision, decided.version));
            }
        }
        failed
            .into_iter()
            .zip(decisions)
            .map(|((task, class, message), decided)| {
                let (decision, version) = decided.unwrap_or((
                    RetryDecision::Dead("the retry policy gave no answer".into()),
                    None,
                ));
                let change = self
                    .engine
                    .plan_failure(
                        now_ms,
                        &task,
                        class,
                        message,
                        decision,
                        version,
                        actor.clone(),
                    )
                    .map_err(|source| StepError::Illegal {
                        task_id: task.id,
                        state: task.state,
                        source,
                    })?;
                let event = self.engine.record_outcome(now_ms, &task, Some(class));
                self.change.worker_events.extend(event);
                Ok(self.plan(change))
            })
            .collect()
    }

    pub(super) fn reset_worker(
        &mut self,
        worker: &str,
        actor: Actor,
    ) -> Result<Vec<WorkerView>, StepError> {
        let now_ms = self.now_ms;
        if !self.engine.knows_worker(worker) {
            return Err(StepError::UnknownWorker(worker.to_owned()));
        }
        let event = self.engine.reset_worker(now_ms, worker, actor);
        self.change.worker_events.extend(event);
        Ok(self.engine.worker(now_ms, worker).into_iter().collect())
    }

    /// Runs what is due, then ages the queues if their interval has passed. Attempts that
    /// failed by time (expired leases, timeouts) share one retry decision.
    pub(super) fn tick(&mut self, callback_slots: usize, callback_bytes: usize) {
        let mut room = CallbackRoom {
            slots: callback_slots,
            bytes: callback_bytes,
        };
        let now_ms = self.now_ms;
        let mut failed = Vec::new();
        for id in self.engine.due(now_ms, DUE_PER_TICK) {
            match self.run_due(now_ms, id, &mut room) {
                Ok(Some(failure)) => failed.push(failure),
                Ok(None) => {}
                Err(error) => tracing::error!(task_id = %id, %error, "could not run a due timer"),
            }
        }
        for planned in self.fail_all(now_ms, failed, Actor::scheduler()) {
            if let Err(error) = planned {
                tracing::error!(%error, "could not fail an expired attempt");
            }
        }
        self.preempt(now_ms);
        if now_ms >= self.engine.next_aging_ms {
            self.engine.next_aging_ms =
                now_ms.saturating_add(self.engine.options.aging_interval_ms);
            self.age(now_ms);
            self.refresh_weights(now_ms);
            self.engine.forget_silent_workers(now_ms);
        }
    }

    /// Revokes the attempts urgent tasks that waited too long preempt (when preemption is on).
    fn preempt(&mut self, now_ms: u64) {
        for preemption in self.engine.preemptions_due(now_ms) {
            let victim = match self.task(preemption.victim) {
                Ok(task) => task,
                Err(error) => {
                    tracing::error!(task_id = %preemption.victim, %error, "could not read a task to preempt");
                    continue;
                }
            };
            let held_there = victim.lease.as_ref().is_some_and(|lease| {
                lease.worker == preemption.worker && lease.revoked_at_ms.is_none()
            });
            debug_assert!(
                held_there,
                "the engine's worker table and the task disagree"
            );
            if !held_there || !matches!(victim.state, State::Claimed | State::Running) {
                continue;
            }
            tracing::info!(task_id = %victim.id, urgent = %preemption.urgent, worker = %preemption.worker, "preempting an attempt for an urgent task");
            let change = self.engine.plan_revoke(now_ms, &victim, preemption.urgent);
            self.plan(change);
        }
    }

    /// Plans what is due for task `id`, except a failure, which it returns for the batch.
    fn run_due(
        &mut self,
        now_ms: u64,
        id: TaskId,
        room: &mut CallbackRoom,
    ) -> Result<Option<(Task, FailureClass, String)>, StepError> {
        let task = self.task(id)?;
        let illegal = |source| StepError::Illegal {
            task_id: id,
            state: task.state,
            source,
        };
        match self.engine.due_action(now_ms, &task) {
            None => {}
            Some(Due::Deadline) => {
                let change = self.engine.plan_timed_out(now_ms, &task).map_err(illegal)?;
                self.plan(change);
            }
            Some(Due::Release) => {
                let change = self.engine.plan_release(now_ms, &task).map_err(illegal)?;
                self.plan(change);
            }
            Some(Due::Callback) if room.slots > 0 => {
                if let Some(bytes) = self.send_callback(now_ms, &task, room.bytes) {
                    room.slots -= 1;
                    room.bytes -= bytes;
                }
            }
            // No room at the deliverer: the callback stays due, for a later tick.
            Some(Due::Callback) => {}
            Some(Due::Merge) => self.merge_family(&task)?,
            Some(Due::Preempted) => {
                let change = self
                    .engine
                    .plan_preempted(now_ms, &task, false)
                    .map_err(illegal)?;
                self.plan(change);
            }
            Some(Due::PlaceFreed) => {
                let change = self.engine.plan_place_freed(now_ms, &task, false);
                self.plan(change);
            }
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

    /// Hands a due callback to the shell for delivery and marks it in flight, if its body fits
    /// in `room_bytes`; answers the body's size when it did.
    fn send_callback(&mut self, now_ms: u64, task: &Task, room_bytes: usize) -> Option<usize> {
        let url = task.callback_url.clone()?;
        let view = sluice_wire::TaskView::from(task.clone().without_token());
        let body = match serde_json::to_vec(&view) {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(task_id = %task.id, %error, "cannot encode a callback");
                return None;
            }
        };
        if body.len() > room_bytes {
            return None;
        }
        let (attempt, change) = self.engine.plan_callback_attempt(now_ms, task)?;
        let bytes = body.len();
        self.callbacks.push(CallbackJob {
            id: task.id,
            attempt,
            url,
            body,
        });
        self.plan(change);
        Some(bytes)
    }

    pub(super) fn callback_done(&mut self, id: TaskId, attempt: u32, outcome: &CallbackOutcome) {
        let now_ms = self.now_ms;
        match self.task(id) {
            Ok(task) => {
                if let Some(change) = self
                    .engine
                    .plan_callback_outcome(now_ms, &task, attempt, outcome)
                {
                    self.plan(change);
                }
            }
            Err(error) => tracing::error!(task_id = %id, %error, "cannot record a callback"),
        }
    }

    fn age(&mut self, now_ms: u64) {
        let waiting = self.engine.aging_views(AGING_PER_BUCKET);
        if waiting.is_empty() {
            return;
        }
        // One call per aging variant, as one call before experiments: almost always a single
        // group (no experiment), and at most one per variant of the running one besides
        // tasks of an ended experiment.
        let mut groups: std::collections::BTreeMap<_, Vec<usize>> = Default::default();
        for (index, shown) in waiting.iter().enumerate() {
            groups
                .entry(shown.variant.map(|tag| (tag.experiment, tag.variant)))
                .or_default()
                .push(index);
        }
        for indices in groups.into_values() {
            let variant = waiting[indices[0]].variant;
            let views: Vec<_> = indices.iter().map(|&i| waiting[i].view).collect();
            let names: Vec<NamesRef> = indices
                .iter()
                .map(|&i| waiting[i].names.borrowed())
                .collect();
            let decided = self.decide.age(now_ms, variant, &views, &names);
            for (index, to) in decided.answer {
                let Some(id) = indices.get(index as usize).map(|&i| waiting[i].id) else {
                    continue;
                };
                let promoted = self
                    .task(id)
                    .map(|task| self.engine.plan_promote(now_ms, &task, to, decided.version));
                match promoted {
                    Ok(Some(change)) => {
                        self.plan(change);
                    }
                    Ok(None) => {}
                    Err(error) => tracing::error!(task_id = %id, %error, "could not promote"),
                }
            }
        }
    }
}

/// What the callback deliverer can take in one tick.
struct CallbackRoom {
    slots: usize,
    bytes: usize,
}

/// The span of a worker's report, named for what it reports (span names are static).
fn report_span(id: TaskId, report: &Report) -> tracing::Span {
    use sluice_model::TASK_SPANS;
    match report {
        Report::Start => tracing::debug_span!(target: TASK_SPANS, "start", task_id = %id),
        Report::Complete { .. } => {
            tracing::debug_span!(target: TASK_SPANS, "complete", task_id = %id)
        }
        Report::Fail { class, .. } => {
            tracing::debug_span!(target: TASK_SPANS, "fail", task_id = %id, class = class.as_str())
        }
        Report::Stopped => tracing::debug_span!(target: TASK_SPANS, "stopped", task_id = %id),
        Report::Heartbeat => tracing::Span::none(),
    }
}
