//! A trace from what a server recorded (`sluice trace export`): each ended task's submission
//! from its record, its service time and failed attempts from its events. The event log is the
//! truth of when things happened; the task record says what was submitted.

use super::{MAX_FAILURES, MAX_SERVICE_MS, TraceTask};
use sluice_model::{Event, FailureClass, State, Task, TaskIdMap};

/// What the events say of one task's attempts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attempts {
    /// When it was created (its first event).
    pub created_ms: Option<u64>,
    /// When its latest attempt was claimed, and started if it was.
    pub claimed_ms: Option<u64>,
    pub started_ms: Option<u64>,
    /// When it ended, and how.
    pub ended: Option<(u64, State)>,
    /// Its failed attempts' classes, oldest first (a lease that ran out is the scheduler's,
    /// not the task's, and is left out).
    pub failures: Vec<FailureClass>,
}

/// Folds events, oldest first, into each task's attempts.
#[derive(Debug, Default)]
pub struct EventFold {
    pub tasks: TaskIdMap<Attempts>,
}

impl EventFold {
    pub fn add(&mut self, event: &Event) {
        let attempts = self.tasks.entry(event.task_id).or_default();
        if attempts.created_ms.is_none() {
            attempts.created_ms = Some(event.at_ms);
        }
        match event.to {
            State::Claimed => {
                attempts.claimed_ms = Some(event.at_ms);
                attempts.started_ms = None;
            }
            State::Running => attempts.started_ms = Some(event.at_ms),
            to if to.is_terminal() => {
                // A worker that never said it started passes through Running in the same
                // change that ends the attempt; its service time runs from the claim.
                if attempts.started_ms == Some(event.at_ms) {
                    attempts.started_ms = None;
                }
                attempts.ended = Some((event.at_ms, to));
            }
            _ => {}
        }
        if let Some(class) = event.detail.as_deref().and_then(failure_class)
            && class != FailureClass::LeaseExpired
            && attempts.failures.len() < MAX_FAILURES
        {
            attempts.failures.push(class);
        }
    }
}

/// The class in a failure event's detail: "attempt 2 failed (node-busy); ...".
pub fn failure_class(detail: &str) -> Option<FailureClass> {
    let rest = detail.strip_prefix("attempt ")?;
    let (_, rest) = rest.split_once(" failed (")?;
    let (class, _) = rest.split_once(')')?;
    serde_json::from_value(serde_json::Value::String(class.to_owned())).ok()
}

/// Why tasks were left out of an export.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Not ended yet, or cancelled or timed out without an attempt that ran.
    pub unfinished_or_never_ran: u64,
    /// Children of a split: their parent is the submission.
    pub split_children: u64,
}

/// The trace of `tasks` (in any order) as `fold` saw them: the ended ones that ran, sorted by
/// creation, times relative to the first.
pub fn export(tasks: Vec<Task>, fold: &EventFold) -> (Vec<TraceTask>, Skipped) {
    let mut skipped = Skipped::default();
    let mut rows = Vec::new();
    for task in tasks {
        if task.parent.is_some() {
            skipped.split_children += 1;
            continue;
        }
        let Some(attempts) = fold.tasks.get(&task.id) else {
            skipped.unfinished_or_never_ran += 1;
            continue;
        };
        let (Some((ended_ms, end)), Some(claimed_ms)) = (attempts.ended, attempts.claimed_ms)
        else {
            skipped.unfinished_or_never_ran += 1;
            continue;
        };
        if !matches!(end, State::Completed | State::Dead | State::Failed) {
            skipped.unfinished_or_never_ran += 1;
            continue;
        }
        let ran_from_ms = attempts.started_ms.unwrap_or(claimed_ms);
        let created_ms = attempts.created_ms.unwrap_or(task.created_at_ms);
        let mut row = TraceTask::at(
            created_ms,
            ended_ms.saturating_sub(ran_from_ms).min(MAX_SERVICE_MS),
        );
        row.priority = task.priority;
        row.kind = task.kind;
        row.tenant = task.tenant;
        row.device = task.device;
        row.est_exec_ms = Some(task.est_exec_ms);
        row.gpu_memory_mb = task.resources.gpu_memory_mb;
        row.model = task.resources.model;
        row.failures = attempts.failures.clone();
        rows.push((created_ms, task.id, row));
    }
    // Creation order, ids breaking ties (ids grow with arrival).
    rows.sort_by_key(|(created_ms, id, _)| (*created_ms, *id));
    let first_ms = rows.first().map_or(0, |(created_ms, _, _)| *created_ms);
    let trace = rows
        .into_iter()
        .map(|(created_ms, _, mut row)| {
            row.submit_ms = created_ms - first_ms;
            row
        })
        .collect();
    (trace, skipped)
}
