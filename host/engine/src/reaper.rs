//! What falls due with time: expired leases, attempts past their timeout, retries whose wait is
//! over, overall deadlines. Read from the timer index, never from a scan of all tasks.

use super::{Engine, timers};
use sluice_model::{Actor, Change, FailureClass, IllegalTransition, State, Task, TaskId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// The task's overall deadline has passed: TimedOut.
    Deadline,
    /// A failure of the current attempt, through the retry decision.
    Failed(FailureClass),
    /// RetryWait is over: back to its queue.
    Release,
    /// A preempted attempt's lease ran out: back to its queue, no attempt spent.
    Preempted,
    /// A completion callback is due for delivery.
    Callback,
    /// A split parent's merge deadline has passed: merge what its children answered.
    Merge,
    /// The task ended under a lease whose worker never said it stopped, and the lease has run
    /// out: its place is free.
    PlaceFreed,
}

impl Engine {
    /// Tasks whose timer has come, earliest first, at most `limit`.
    pub fn due(&self, now_ms: u64, limit: usize) -> Vec<TaskId> {
        self.timers.due(now_ms, limit)
    }

    /// The earliest timer, for a shell that sleeps until then.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.timers.next_at()
    }

    /// What is due for `task` at `now_ms`; none when its timer was stale (it is re-armed).
    pub fn due_action(&mut self, now_ms: u64, task: &Task) -> Option<Due> {
        let action = if task.deadline_at_ms.is_some_and(|at| at <= now_ms)
            && task.state.check(State::TimedOut).is_ok()
        {
            Some(Due::Deadline)
        } else {
            match (task.state, &task.lease, task.not_before_ms) {
                // A preempted attempt whose worker never said it stopped: it is over all the
                // same, and still not counted.
                (State::Claimed | State::Running, Some(lease), _)
                    if lease.revoked_at_ms.is_some()
                        && lease.expires_at_ms.min(lease.attempt_ends_at_ms) <= now_ms =>
                {
                    Some(Due::Preempted)
                }
                (State::Claimed | State::Running, Some(lease), _)
                    if lease.attempt_ends_at_ms <= now_ms =>
                {
                    Some(Due::Failed(FailureClass::Timeout))
                }
                (State::Claimed | State::Running, Some(lease), _)
                    if lease.expires_at_ms <= now_ms =>
                {
                    Some(Due::Failed(FailureClass::LeaseExpired))
                }
                (State::RetryWait, _, Some(at)) if at <= now_ms => Some(Due::Release),
                (State::Split, _, _) if super::family::ready_to_merge(task, now_ms) => {
                    Some(Due::Merge)
                }
                (state, Some(lease), _)
                    if state.is_terminal()
                        && lease.holds_place_after_end()
                        && lease.expires_at_ms <= now_ms =>
                {
                    Some(Due::PlaceFreed)
                }
                (state, _, _)
                    if state.is_terminal()
                        && task.callback_pending()
                        && task
                            .callback
                            .as_ref()
                            .is_some_and(|c| c.next_at_ms <= now_ms) =>
                {
                    Some(Due::Callback)
                }
                _ => None,
            }
        };
        if action.is_none() {
            self.timers.set(task.id, timers::due_at(task));
        }
        action
    }

    /// Frees the place a lease held after its task ended: the worker said it stopped, or
    /// (`by_worker` false) the lease ran out first. One event on the timeline, either way.
    pub(crate) fn plan_place_freed(&self, now_ms: u64, task: &Task, by_worker: bool) -> Change {
        let (actor, detail) = match &task.lease {
            Some(lease) if by_worker => (
                Actor::worker(&lease.worker),
                format!(
                    "attempt {} stopped on worker {}",
                    lease.attempt, lease.worker
                ),
            ),
            Some(lease) => (
                Actor::scheduler(),
                format!(
                    "the lease of attempt {} ran out before worker {} said it stopped",
                    lease.attempt, lease.worker
                ),
            ),
            None => (Actor::scheduler(), "no lease".to_owned()),
        };
        self.plan_note(now_ms, task, actor, detail, |after| {
            if let Some(lease) = &mut after.lease {
                lease.stopped_at_ms = Some(now_ms);
            }
        })
    }

    /// RetryWait → Queued, in the bucket it waited in before, behind nobody it was ahead of
    /// (its rank is kept).
    pub(crate) fn plan_release(
        &mut self,
        now_ms: u64,
        task: &Task,
    ) -> Result<Change, IllegalTransition> {
        self.plan_with(
            now_ms,
            task,
            &[State::Queued],
            Actor::scheduler(),
            Some("retry wait over".into()),
            |after| after.not_before_ms = None,
        )
    }

    /// → TimedOut: the overall deadline has passed.
    pub(crate) fn plan_timed_out(
        &mut self,
        now_ms: u64,
        task: &Task,
    ) -> Result<Change, IllegalTransition> {
        let detail = task
            .deadline_ms
            .map(|d| format!("deadline of {d} ms passed"));
        self.plan_with(
            now_ms,
            task,
            &[State::TimedOut],
            Actor::scheduler(),
            detail,
            |_| {},
        )
    }
}
