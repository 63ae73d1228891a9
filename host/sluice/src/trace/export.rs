//! A trace from what a server recorded (`sluice trace export`): each ended task's submission
//! from its record, its service time and failed attempts from its events. The event log is the
//! truth of when things happened; the task record says what was submitted. With hits, a split
//! search also carries what each of its children answered, from the children's records.

use super::{MAX_FAILURES, MAX_SERVICE_MS, RecordedChild, RecordedSearch, TraceTask};
use sluice_model::{Event, FailureClass, Family, ShardAnswer, State, Task, TaskIdMap};

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
    /// Searches exported without their hits: past the byte cap, or a child's record gone.
    pub searches_without_hits: u64,
}

/// The bytes of hits an export writes at most (about 40 per hit, as JSON), so a server's
/// whole history cannot make a trace of unbounded size.
pub const DEFAULT_MAX_HITS_BYTES: usize = 64 << 20;

/// What one hit takes in a trace line, about: `{"id":123456,"distance":12.345678},`.
const HIT_BYTES: usize = 40;

/// The hits a search's children answered, if every child's record is at hand.
fn recorded(family: Option<&Family>, children: &TaskIdMap<ShardAnswer>) -> Option<RecordedSearch> {
    let family = family?;
    let mut recorded = Vec::with_capacity(family.parts.len());
    for part in &family.parts {
        recorded.push(RecordedChild {
            weight: part.weight,
            hits: children.get(&part.task)?.hits.clone(),
        });
    }
    Some(RecordedSearch {
        k: family.k,
        children: recorded,
    })
}

/// The trace of `tasks` (in any order) as `fold` saw them: the ended ones that ran, sorted by
/// creation, times relative to the first. With `max_hits_bytes`, each completed split search
/// carries its children's hits (a child that did not answer, none), until about that many
/// bytes of hits are written.
pub fn export(
    tasks: Vec<Task>,
    fold: &EventFold,
    max_hits_bytes: Option<usize>,
) -> (Vec<TraceTask>, Skipped) {
    let mut skipped = Skipped::default();
    let mut rows = Vec::new();
    // Each child's answer (empty for one that did not complete), by its id.
    let mut answers: TaskIdMap<ShardAnswer> = TaskIdMap::default();
    let mut hits_budget = max_hits_bytes.unwrap_or(0);
    let (parents, children): (Vec<Task>, Vec<Task>) =
        tasks.into_iter().partition(|t| t.parent.is_none());
    skipped.split_children = children.len() as u64;
    if max_hits_bytes.is_some() {
        for child in children {
            let answer = match (&child.state, child.result) {
                (State::Completed, Some(result)) => {
                    serde_json::from_value(result).unwrap_or_default()
                }
                _ => ShardAnswer::default(),
            };
            answers.insert(child.id, answer);
        }
    }
    for task in parents {
        let Some(attempts) = fold.tasks.get(&task.id) else {
            skipped.unfinished_or_never_ran += 1;
            continue;
        };
        // A split search is never claimed: its children are. Its service time runs from its
        // creation to its merge.
        let claimed_ms = match &task.family {
            Some(_) => attempts.created_ms,
            None => attempts.claimed_ms,
        };
        let (Some((ended_ms, end)), Some(claimed_ms)) = (attempts.ended, claimed_ms) else {
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
        let family = task.family;
        row.priority = task.priority;
        row.kind = task.kind;
        row.tenant = task.tenant;
        row.device = task.device;
        row.est_exec_ms = Some(task.est_exec_ms);
        row.gpu_memory_mb = task.resources.gpu_memory_mb;
        row.model = task.resources.model;
        row.batch_key = task.resources.batch_key;
        row.failures = attempts.failures.clone();
        if max_hits_bytes.is_some() && family.is_some() && end == State::Completed {
            row.search = recorded(family.as_ref(), &answers).filter(|search| {
                let bytes: usize = search
                    .children
                    .iter()
                    .map(|c| c.hits.len() * HIT_BYTES)
                    .sum();
                let fits = bytes <= hits_budget;
                if fits {
                    hits_budget -= bytes;
                }
                fits
            });
            if row.search.is_none() {
                skipped.searches_without_hits += 1;
            }
        }
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
