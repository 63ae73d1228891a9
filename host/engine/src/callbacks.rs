//! Completion callbacks: a terminal task with a `callback_url` is delivered at least once.
//! Each attempt is planned here (the shell does the HTTP), each outcome is an event on the
//! task's timeline, and failures are retried with capped exponential backoff up to a bound.

use super::Engine;
use sluice_model::{Actor, Change, Task, TaskWrite};

/// Attempts at most; then the delivery is given up, with an event.
pub const MAX_CALLBACK_ATTEMPTS: u32 = 12;
/// How long one attempt may take before it is counted lost and tried again.
pub const CALLBACK_ATTEMPT_TIMEOUT_MS: u64 = 30_000;
const FIRST_RETRY_MS: u64 = 1_000;
const MAX_RETRY_MS: u64 = 600_000;

/// What one delivery attempt came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallbackOutcome {
    Delivered { status: u16 },
    Failed { reason: String },
}

impl Engine {
    /// Marks a due callback as in flight: the next attempt is pushed past the attempt timeout,
    /// so a lost answer (or a crash) is retried, never dropped. Returns the attempt number.
    pub(crate) fn plan_callback_attempt(&self, now_ms: u64, task: &Task) -> Option<(u32, Change)> {
        let mut after = task.clone();
        let callback = after.callback.as_mut()?;
        callback.attempts = callback.attempts.saturating_add(1);
        callback.next_at_ms = now_ms.saturating_add(CALLBACK_ATTEMPT_TIMEOUT_MS);
        let attempt = callback.attempts;
        let change = Change {
            writes: vec![TaskWrite {
                previous: Some(task.state),
                task: after,
            }],
            ..Change::default()
        };
        Some((attempt, change))
    }

    /// Records attempt `attempt`'s outcome as an event; a failure schedules the next attempt,
    /// or gives up after `MAX_CALLBACK_ATTEMPTS`. An outcome of an attempt that is no longer
    /// the latest one (it timed out and was tried again) is ignored.
    pub(crate) fn plan_callback_outcome(
        &self,
        now_ms: u64,
        task: &Task,
        attempt: u32,
        outcome: &CallbackOutcome,
    ) -> Option<Change> {
        let callback = task.callback.as_ref()?;
        if callback.attempts != attempt || !task.callback_pending() {
            return None;
        }
        let url = task.callback_url.as_deref().unwrap_or("");
        let (detail, delivered, gave_up, next_at_ms) = match outcome {
            CallbackOutcome::Delivered { status } => (
                format!("callback attempt {attempt} delivered to {url} (HTTP {status})"),
                Some(now_ms),
                false,
                now_ms,
            ),
            CallbackOutcome::Failed { reason } if attempt >= MAX_CALLBACK_ATTEMPTS => (
                format!("callback attempt {attempt} failed ({reason}); given up"),
                None,
                true,
                now_ms,
            ),
            CallbackOutcome::Failed { reason } => {
                let delay_ms = FIRST_RETRY_MS
                    .saturating_mul(1 << (attempt - 1).min(20))
                    .min(MAX_RETRY_MS);
                (
                    format!("callback attempt {attempt} failed ({reason}); next in {delay_ms} ms"),
                    None,
                    false,
                    now_ms.saturating_add(delay_ms),
                )
            }
        };
        Some(
            self.plan_note(now_ms, task, Actor::scheduler(), detail, |after| {
                if let Some(callback) = after.callback.as_mut() {
                    callback.delivered_at_ms = delivered;
                    callback.gave_up = gave_up;
                    callback.next_at_ms = next_at_ms;
                }
            }),
        )
    }
}
