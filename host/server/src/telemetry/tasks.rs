//! Task metrics: what the writer commits, counted as it commits it — arrivals, transitions,
//! waits, execution times, failures, retries, preemptions and deaths.

use super::labels::{LabelBudget, failure_reason};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sluice_model::{Change, State, Task, TaskIdMap};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ArrivalLabels {
    pub device: String,
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BucketLabels {
    pub bucket: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TaskKindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `true` for the one refusal per attempt written on the timeline, `false` for the rest.
    pub logged: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    pub class: String,
    pub reason: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Submit → first claim: from milliseconds to the aging horizon and past it.
const WAIT_BUCKETS_S: [f64; 14] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
];
/// Start → complete: a vector shard's milliseconds to an OCT volume's minutes.
const EXEC_BUCKETS_S: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS_S)
}

fn exec_histogram() -> Histogram {
    Histogram::new(EXEC_BUCKETS_S)
}

#[derive(Debug)]
pub struct TaskMetrics {
    arrivals: Family<ArrivalLabels, Counter>,
    transitions: Family<TransitionLabels, Counter>,
    wait: HistogramFamily<BucketLabels>,
    exec: HistogramFamily<TaskKindLabels>,
    failures: Family<FailureLabels, Counter>,
    retries: Counter,
    preemptions: Counter,
    dead: Counter,
    refused_reports: Family<RefusedLabels, Counter>,
    /// The status page's last 15 minutes: waits go in here too.
    pub history: std::sync::Arc<super::History>,
    devices: LabelBudget,
    kinds: LabelBudget,
    classes: LabelBudget,
    reasons: LabelBudget,
}

impl Default for TaskMetrics {
    fn default() -> Self {
        TaskMetrics {
            arrivals: Family::default(),
            transitions: Family::default(),
            wait: Family::new_with_constructor(wait_histogram),
            exec: Family::new_with_constructor(exec_histogram),
            failures: Family::default(),
            retries: Counter::default(),
            preemptions: Counter::default(),
            dead: Counter::default(),
            refused_reports: Family::default(),
            history: std::sync::Arc::default(),
            devices: LabelBudget::new(500),
            kinds: LabelBudget::new(50),
            classes: LabelBudget::new(16),
            reasons: LabelBudget::new(20),
        }
    }
}

impl TaskMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "task_arrivals",
            "Tasks submitted, by device and kind (past 500 devices or 50 kinds: `other`)",
            self.arrivals.clone(),
        );
        registry.register(
            "task_transitions",
            "State changes of tasks, by the state left (`none` on creation) and entered",
            self.transitions.clone(),
        );
        registry.register(
            "task_wait_seconds",
            "Time from submission to a task's first claim, by the bucket it was claimed from",
            self.wait.clone(),
        );
        registry.register(
            "task_execution_seconds",
            "Time from an attempt's start (its claim when no start was reported) to completion, by kind",
            self.exec.clone(),
        );
        registry.register(
            "task_failures",
            "Failed attempts and failed ends, by class and reason (the first 20 reasons by name, later ones `other`)",
            self.failures.clone(),
        );
        registry.register(
            "task_retries",
            "Attempts sent to retry wait by the retry policy",
            self.retries.clone(),
        );
        registry.register(
            "task_preemptions",
            "Attempts stopped for urgent work and queued again, not counted as failures or retries",
            self.preemptions.clone(),
        );
        registry.register(
            "task_dead",
            "Tasks given up on by the retry policy",
            self.dead.clone(),
        );
        registry.register(
            "reports_refused",
            "Workers' reports refused as stale or as carrying a token that never held the task; `logged` says whether the refusal was written on the timeline (once per attempt)",
            self.refused_reports.clone(),
        );
    }

    /// Counts a refused report; `logged` when it was written on the task's timeline.
    pub fn refused_report(&self, logged: bool) {
        let logged = if logged { "true" } else { "false" };
        self.refused_reports
            .get_or_create(&RefusedLabels { logged })
            .inc();
    }

    /// Counts what `change` did. Called once per committed change, on the writer thread.
    pub fn observe(&self, change: &Change) {
        if change.events.is_empty() {
            return;
        }
        // A task written twice in one change is read as its last write.
        let tasks: TaskIdMap<&Task> = change
            .writes
            .iter()
            .map(|write| (write.task.id, &write.task))
            .collect();
        for event in &change.events {
            self.transitions
                .get_or_create(&TransitionLabels {
                    from: event.from.map_or("none", State::as_str),
                    to: event.to.as_str(),
                })
                .inc();
            let Some(task) = tasks.get(&event.task_id) else {
                continue;
            };
            self.observe_event(event.from, event.to, event.at_ms, task);
        }
    }

    fn observe_event(&self, from: Option<State>, to: State, at_ms: u64, task: &Task) {
        match (from, to) {
            (None, _) => {
                self.arrivals
                    .get_or_create(&ArrivalLabels {
                        device: self.devices.label(&task.device),
                        kind: self.kinds.label(&task.kind),
                    })
                    .inc();
            }
            (_, State::Claimed) if task.attempt == 1 => {
                let waited_ms = at_ms.saturating_sub(task.created_at_ms);
                self.wait
                    .get_or_create(&BucketLabels {
                        bucket: task.bucket.as_str(),
                    })
                    .observe(seconds(waited_ms));
                self.history.record_wait(task.bucket, waited_ms);
            }
            (Some(State::Running | State::Claimed), State::Completed) => {
                if let Some(lease) = &task.lease {
                    let began_ms = lease.started_at_ms.unwrap_or(lease.claimed_at_ms);
                    self.exec
                        .get_or_create(&TaskKindLabels {
                            kind: self.kinds.label(&task.kind),
                        })
                        .observe(seconds(at_ms.saturating_sub(began_ms)));
                }
            }
            _ => {}
        }
        // A preempted attempt goes through RetryWait too, but it neither failed nor retries.
        let preempted = to == State::RetryWait
            && task.lease.as_ref().is_some_and(|lease| {
                lease.revoked_at_ms.is_some() && lease.stopped_at_ms == Some(at_ms)
            });
        if preempted {
            self.preemptions.inc();
            return;
        }
        let failed = matches!(to, State::RetryWait | State::Dead | State::Failed);
        if let Some(error) = task.error.as_ref().filter(|_| failed) {
            self.failures
                .get_or_create(&FailureLabels {
                    class: self.classes.label(&error.class),
                    reason: self.reasons.label(&failure_reason(&error.message)),
                })
                .inc();
        }
        match to {
            State::RetryWait => {
                self.retries.inc();
            }
            State::Dead => {
                self.dead.inc();
            }
            _ => {}
        }
    }
}

fn seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}
