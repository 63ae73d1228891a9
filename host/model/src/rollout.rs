//! Guarded rollouts: a policy version given a growing share of new tasks in steps. Each step
//! is a live experiment of the active version (the baseline) against the new one, and its
//! guards are judged on the step's own tasks; a failed guard rolls the version back at once.
//! This module owns the request, the guards' grammar, the record each step's experiment
//! carries, and the rollout as the experiments' records tell it.

use super::{AssignBy, Experiment, ExperimentEnd, PolicyKind, Priority};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Steps one rollout may have, the last (100) included.
pub const MAX_ROLLOUT_STEPS: usize = 10;
/// Guards one rollout may have.
pub const MAX_GUARDS: usize = 16;
/// The longest guard's text.
pub const MAX_GUARD_BYTES: usize = 128;
/// The shortest step: a guard judged on less says little.
pub const MIN_STEP_MS: u64 = 500;
/// The longest step: a week.
pub const MAX_STEP_MS: u64 = 7 * 24 * 3_600_000;
pub const DEFAULT_STEPS: [u32; 4] = [5, 25, 50, 100];
pub const DEFAULT_STEP_MS: u64 = 600_000;
/// The new version's tasks a step waits for before it is judged.
pub const DEFAULT_MIN_TASKS: u32 = 20;
pub const MAX_MIN_TASKS: u32 = 100_000;
/// A step short of its least tasks is judged on what it has after this many step lengths.
pub const STEP_WAIT_FACTOR: u64 = 10;

/// `POST /v1/rollouts`'s body.
#[derive(Clone, Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    pub kind: PolicyKind,
    /// The stored version to roll out; the kind's active version is the baseline.
    pub version: u32,
    /// The new version's share of new tasks at each step, in percent, rising, ending at 100
    /// (reaching it makes the version active). Default 5, 25, 50, 100.
    #[serde(default = "default_steps")]
    pub steps: Vec<u32>,
    /// How long each step runs before it is judged. Default 600,000 (10 minutes).
    #[serde(default = "default_step_ms")]
    pub step_ms: u64,
    /// Each step passes only if every guard holds (see `Guard`); none: every step passes.
    #[serde(default)]
    pub guards: Vec<String>,
    /// The new version's tasks a step waits for (up to 10 step lengths) before it is judged.
    #[serde(default = "default_min_tasks")]
    pub min_tasks: u32,
    #[serde(default)]
    pub assign_by: AssignBy,
}

fn default_steps() -> Vec<u32> {
    DEFAULT_STEPS.to_vec()
}

fn default_step_ms() -> u64 {
    DEFAULT_STEP_MS
}

fn default_min_tasks() -> u32 {
    DEFAULT_MIN_TASKS
}

impl RolloutSpec {
    /// Everything judged without the registry; the guards parsed.
    pub fn check(&self) -> Result<Vec<Guard>, String> {
        if !matches!(
            self.kind,
            PolicyKind::Priority | PolicyKind::Aging | PolicyKind::Retry
        ) {
            return Err(format!(
                "a rollout of the {} policy is not supported; rollouts run on priority, aging and retry",
                self.kind
            ));
        }
        check_steps(&self.steps)?;
        if !(MIN_STEP_MS..=MAX_STEP_MS).contains(&self.step_ms) {
            return Err(format!(
                "step_ms is {MIN_STEP_MS} to {MAX_STEP_MS}; got {}",
                self.step_ms
            ));
        }
        if !(1..=MAX_MIN_TASKS).contains(&self.min_tasks) {
            return Err(format!(
                "min_tasks is 1 to {MAX_MIN_TASKS}; got {}",
                self.min_tasks
            ));
        }
        if self.guards.len() > MAX_GUARDS {
            return Err(format!(
                "a rollout has at most {MAX_GUARDS} guards; this one has {}",
                self.guards.len()
            ));
        }
        self.guards.iter().map(|text| text.parse()).collect()
    }
}

fn check_steps(steps: &[u32]) -> Result<(), String> {
    let listed = || {
        steps
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    if steps.len() < 2 || steps.len() > MAX_ROLLOUT_STEPS {
        return Err(format!(
            "a rollout has 2 to {MAX_ROLLOUT_STEPS} steps, the last 100 (e.g. 5,25,50,100); got {}",
            listed()
        ));
    }
    let rising = steps.windows(2).all(|pair| pair[0] < pair[1]);
    if !rising || steps[0] == 0 || steps.last() != Some(&100) {
        return Err(format!(
            "steps are percentages rising from 1 to 100, the last 100 (e.g. 5,25,50,100); got {}",
            listed()
        ));
    }
    Ok(())
}

/// What a guard reads of a variant's tasks in one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardMetric {
    /// Submission to first claim of the tasks submitted at `bucket` (all: any bucket); a task
    /// still waiting counts with its wait so far.
    Wait {
        bucket: Option<Priority>,
        figure: WaitFigure,
    },
    /// The version's calls that trapped, ran out of fuel or answered what the host refuses.
    Faults,
    /// Tasks that ended dead.
    Dead,
    /// Dead tasks per 100 of those that ended.
    DeadPercent,
    /// Attempts after the first, per task.
    RetriesPerTask,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFigure {
    P50,
    P99,
    Max,
}

impl WaitFigure {
    /// The quantile it is, none for the maximum.
    pub fn quantile(self) -> Option<f64> {
        match self {
            WaitFigure::P50 => Some(0.50),
            WaitFigure::P99 => Some(0.99),
            WaitFigure::Max => None,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardOp {
    AtMost,
    Below,
    AtLeast,
    Above,
    Equal,
}

impl GuardOp {
    pub fn holds(self, value: f64, limit: f64) -> bool {
        match self {
            GuardOp::AtMost => value <= limit,
            GuardOp::Below => value < limit,
            GuardOp::AtLeast => value >= limit,
            GuardOp::Above => value > limit,
            GuardOp::Equal => value == limit,
        }
    }

    /// Whether a larger figure is the worse one under this guard.
    pub fn caps(self) -> bool {
        matches!(self, GuardOp::AtMost | GuardOp::Below)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            GuardOp::AtMost => "<=",
            GuardOp::Below => "<",
            GuardOp::AtLeast => ">=",
            GuardOp::Above => ">",
            GuardOp::Equal => "==",
        }
    }
}

/// What a figure is held to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GuardLimit {
    Value(f64),
    /// The baseline's figure in the same step, moved by `margin_percent` (`baseline + 20%`).
    Baseline {
        margin_percent: f64,
    },
}

/// One guard: `METRIC OP LIMIT`, e.g. `urgent.wait_p99_ms <= 2000`, `faults == 0`,
/// `low.wait_p99_ms <= baseline + 20%`. Metrics: `{urgent,normal,low,all}.wait_{p50,p99,max}_ms`,
/// `faults`, `dead`, `dead_percent`, `retries_per_task`; operators `<=`, `<`, `>=`, `>`, `==`;
/// a limit is a number, `baseline`, or `baseline + N%`.
#[derive(Clone, Debug, PartialEq)]
pub struct Guard {
    pub metric: GuardMetric,
    pub op: GuardOp,
    pub limit: GuardLimit,
    /// As written.
    pub text: String,
}

/// The metrics a guard may read, for error messages and docs.
pub const GUARD_METRICS: &str = "BUCKET.wait_p50_ms, BUCKET.wait_p99_ms, BUCKET.wait_max_ms (BUCKET: urgent, normal, low or all), faults, dead, dead_percent, retries_per_task";

impl std::str::FromStr for Guard {
    type Err = String;

    fn from_str(text: &str) -> Result<Guard, String> {
        let shown: String = text.chars().take(MAX_GUARD_BYTES).collect();
        let refuse = |why: String| format!("guard `{shown}`: {why}");
        if text.len() > MAX_GUARD_BYTES {
            return Err(refuse(format!(
                "a guard is at most {MAX_GUARD_BYTES} bytes"
            )));
        }
        // The longest operator first, so `<=` is not read as `<`.
        let Some((at, op)) = ["<=", ">=", "==", "<", ">"].iter().find_map(|op| {
            text.find(op).map(|at| {
                let op = match *op {
                    "<=" => GuardOp::AtMost,
                    ">=" => GuardOp::AtLeast,
                    "==" => GuardOp::Equal,
                    "<" => GuardOp::Below,
                    _ => GuardOp::Above,
                };
                (at, op)
            })
        }) else {
            return Err(refuse(
                "write METRIC OP LIMIT, e.g. `low.wait_p99_ms <= 2000` (OP: <=, <, >=, >, ==)"
                    .into(),
            ));
        };
        let metric_text = text[..at].trim();
        let limit_text = text[at + op.as_str().len()..].trim();
        let metric = parse_metric(metric_text).ok_or_else(|| {
            refuse(format!(
                "no metric `{metric_text}`; the metrics are {GUARD_METRICS}"
            ))
        })?;
        let limit = parse_limit(limit_text).ok_or_else(|| {
            refuse(format!(
                "a limit is a number, `baseline` or `baseline + N%`; got `{limit_text}`"
            ))
        })?;
        if matches!(limit, GuardLimit::Baseline { .. }) && op == GuardOp::Equal {
            return Err(refuse(
                "`==` takes a number; against the baseline use <=, <, >= or >".into(),
            ));
        }
        Ok(Guard {
            metric,
            op,
            limit,
            text: format!("{metric_text} {} {limit_text}", op.as_str()),
        })
    }
}

fn parse_metric(text: &str) -> Option<GuardMetric> {
    match text {
        "faults" => return Some(GuardMetric::Faults),
        "dead" => return Some(GuardMetric::Dead),
        "dead_percent" => return Some(GuardMetric::DeadPercent),
        "retries_per_task" => return Some(GuardMetric::RetriesPerTask),
        _ => {}
    }
    let (bucket, figure) = text.split_once('.')?;
    let bucket = match bucket {
        "all" => None,
        other => Some(Priority::ALL.into_iter().find(|p| p.as_str() == other)?),
    };
    let figure = match figure {
        "wait_p50_ms" => WaitFigure::P50,
        "wait_p99_ms" => WaitFigure::P99,
        "wait_max_ms" => WaitFigure::Max,
        _ => return None,
    };
    Some(GuardMetric::Wait { bucket, figure })
}

fn parse_limit(text: &str) -> Option<GuardLimit> {
    let number = |t: &str| t.trim().parse::<f64>().ok().filter(|v| v.is_finite());
    let Some(rest) = text.strip_prefix("baseline") else {
        return number(text).map(GuardLimit::Value);
    };
    let rest = rest.trim();
    if rest.is_empty() {
        return Some(GuardLimit::Baseline {
            margin_percent: 0.0,
        });
    }
    let margin = rest.strip_prefix('+')?.trim().strip_suffix('%')?;
    Some(GuardLimit::Baseline {
        margin_percent: number(margin).filter(|m| *m >= 0.0)?,
    })
}

impl fmt::Display for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// What each step's experiment carries of its rollout, so that the rollout is whole in the
/// experiments' records (no record of its own to keep in step with them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutStep {
    /// The rollout's id: its first step's experiment id.
    pub rollout: u32,
    /// This step's index in `steps`.
    pub step: u32,
    pub steps: Vec<u32>,
    pub step_ms: u64,
    pub min_tasks: u32,
    pub guards: Vec<String>,
}

impl RolloutStep {
    /// The new version's share of new tasks in this step, in percent.
    pub fn share_percent(&self) -> u32 {
        self.steps.get(self.step as usize).copied().unwrap_or(100)
    }

    /// The share of the step after this one (100: the version becomes active).
    pub fn next_share_percent(&self) -> u32 {
        self.steps
            .get(self.step as usize + 1)
            .copied()
            .unwrap_or(100)
    }

    pub fn guards(&self) -> Vec<Guard> {
        // Checked when the rollout started; a guard that no longer parses is left out.
        self.guards.iter().filter_map(|g| g.parse().ok()).collect()
    }
}

/// Where a rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    Running,
    /// Every step passed: the version is active.
    Completed,
    /// A guard failed: the baseline decides for every task again.
    RolledBack,
    /// Stopped by an admin: the baseline decides for every task again.
    Stopped,
}

/// One step of a rollout, as its experiment's record tells it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RolloutStepRecord {
    pub experiment: u32,
    pub share_percent: u32,
    pub started_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// How each guard was judged at its end.
    pub judged: Vec<String>,
}

/// A rollout, from its steps' experiments.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rollout {
    pub id: u32,
    pub kind: PolicyKind,
    /// The version rolled out.
    pub version: u32,
    /// The version active when it started, which decides for the other tasks.
    pub baseline_version: u32,
    pub state: RolloutState,
    /// The current step's share (running), or the last step's.
    pub share_percent: u32,
    pub steps: Vec<u32>,
    pub step_ms: u64,
    pub min_tasks: u32,
    pub guards: Vec<String>,
    pub assign_by: AssignBy,
    pub started_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// Why it was rolled back or stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub history: Vec<RolloutStepRecord>,
}

/// Every rollout the experiments' records hold, oldest first.
pub fn rollouts(experiments: &[Experiment]) -> Vec<Rollout> {
    let mut out: Vec<Rollout> = Vec::new();
    for experiment in experiments {
        let Some(step) = &experiment.rollout else {
            continue;
        };
        let [baseline, candidate] = [0, 1].map(|i| {
            experiment
                .variants
                .get(i)
                .map_or(0, |variant| variant.version)
        });
        let judged = match &experiment.end {
            Some(ExperimentEnd::Advanced { judged }) => judged.clone(),
            Some(ExperimentEnd::RolledBack { judged, .. })
            | Some(ExperimentEnd::Promoted { judged, .. }) => judged.clone(),
            _ => Vec::new(),
        };
        let record = RolloutStepRecord {
            experiment: experiment.id,
            share_percent: step.share_percent(),
            started_at_ms: experiment.started_at_ms,
            ended_at_ms: experiment.ended_at_ms,
            judged,
        };
        let (state, reason) = match &experiment.end {
            None | Some(ExperimentEnd::Advanced { .. }) => (RolloutState::Running, None),
            Some(ExperimentEnd::Promoted { .. }) => (RolloutState::Completed, None),
            Some(ExperimentEnd::RolledBack { reason, .. }) => {
                (RolloutState::RolledBack, Some(reason.clone()))
            }
            Some(ExperimentEnd::Stopped) => (RolloutState::Stopped, Some("stopped".into())),
        };
        let ended_at_ms = match state {
            RolloutState::Running => None,
            _ => experiment.ended_at_ms,
        };
        match out.iter_mut().find(|r| r.id == step.rollout) {
            Some(rollout) => {
                rollout.history.push(record);
                rollout.state = state;
                rollout.share_percent = step.share_percent();
                rollout.ended_at_ms = ended_at_ms;
                rollout.reason = reason;
            }
            None => out.push(Rollout {
                id: step.rollout,
                kind: experiment.kind,
                version: candidate,
                baseline_version: baseline,
                state,
                share_percent: step.share_percent(),
                steps: step.steps.clone(),
                step_ms: step.step_ms,
                min_tasks: step.min_tasks,
                guards: step.guards.clone(),
                assign_by: experiment.assign_by,
                started_at_ms: experiment.started_at_ms,
                ended_at_ms,
                reason,
                history: vec![record],
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(text: &str) -> Result<Guard, String> {
        text.parse()
    }

    #[test]
    fn guards_parse_into_metric_operator_and_limit() {
        let low = guard("low.wait_p99_ms <= 2000").unwrap();
        assert_eq!(
            low.metric,
            GuardMetric::Wait {
                bucket: Some(Priority::Low),
                figure: WaitFigure::P99
            }
        );
        assert_eq!(low.op, GuardOp::AtMost);
        assert_eq!(low.limit, GuardLimit::Value(2000.0));
        let faults = guard("faults==0").unwrap();
        assert_eq!(
            (faults.metric, faults.op, faults.text.as_str()),
            (GuardMetric::Faults, GuardOp::Equal, "faults == 0")
        );
        assert_eq!(
            guard("all.wait_p50_ms < baseline + 20%").unwrap().limit,
            GuardLimit::Baseline {
                margin_percent: 20.0
            }
        );
        assert_eq!(
            guard("dead_percent >= baseline").unwrap().limit,
            GuardLimit::Baseline {
                margin_percent: 0.0
            }
        );
        assert_eq!(guard("retries_per_task > 0.5").unwrap().op, GuardOp::Above);
        for (bad, says) in [
            ("low.wait_p99 <= 2000", "no metric `low.wait_p99`"),
            ("slow.wait_p99_ms <= 2000", "no metric"),
            ("faults = 0", "METRIC OP LIMIT"),
            ("faults <= lots", "a limit is a number"),
            ("faults <= baseline - 5%", "a limit is a number"),
            ("faults == baseline", "`==` takes a number"),
            ("faults <= NaN", "a limit is a number"),
        ] {
            let error = guard(bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
            assert!(error.starts_with(&format!("guard `{bad}`")), "{error}");
        }
    }

    #[test]
    fn a_spec_is_checked_steps_first() {
        let spec = |steps: &[u32]| RolloutSpec {
            kind: PolicyKind::Aging,
            version: 2,
            steps: steps.to_vec(),
            step_ms: 1_000,
            guards: vec!["low.wait_p99_ms <= 2000".into()],
            min_tasks: 5,
            assign_by: AssignBy::Task,
        };
        assert_eq!(spec(&[5, 25, 50, 100]).check().unwrap().len(), 1);
        for steps in [
            &[100][..],
            &[5, 50],
            &[50, 25, 100],
            &[0, 100],
            &[5, 100, 100],
        ] {
            assert!(spec(steps).check().is_err(), "{steps:?}");
        }
        let merge = RolloutSpec {
            kind: PolicyKind::Merge,
            ..spec(&[5, 100])
        };
        assert!(
            merge
                .check()
                .unwrap_err()
                .contains("priority, aging and retry")
        );
        let quick = RolloutSpec {
            step_ms: 10,
            ..spec(&[5, 100])
        };
        assert!(quick.check().unwrap_err().contains("step_ms"));
    }
}
