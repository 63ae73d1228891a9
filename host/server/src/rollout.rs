//! Guarded rollouts in the server: each step's guards judged on the step's own tasks against
//! the baseline's, and the loop that moves a running rollout a step on, finishes it, or rolls
//! it back — audited, and logged as policy events by the registry.

use crate::experiment::{scan, variant_of};
use sluice_model::{
    AuditEvent, Experiment, ExperimentEnd, Guard, GuardLimit, GuardMetric, GuardOp, Priority, Role,
    STEP_WAIT_FACTOR, State, Task,
};
use sluice_policy_runtime::PolicyRegistry;
use sluice_stats::{change_interval_percent, quantile};
use sluice_store::{ListPage, ListQuery};
use std::time::Duration;

/// How often running rollouts are looked at.
pub const ROLLOUT_TICK_MS: u64 = 250;
/// The audit log's actor for what the server does by itself.
pub const SERVER_ACTOR: &str = "scheduler";

/// One variant's tasks in one step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepTally {
    pub tasks: u64,
    pub ended: u64,
    pub dead: u64,
    pub retries: u64,
    /// Submission to first claim by submitted bucket; a task not claimed yet counts with its
    /// wait so far (at least what its wait will be, so a cap it breaks is truly broken).
    pub waits_ms: [Vec<u64>; 3],
}

impl StepTally {
    fn add(&mut self, task: &Task, now_ms: u64) {
        self.tasks += 1;
        self.retries += u64::from(task.attempt.saturating_sub(1));
        let wait_ms = match task.first_claimed_at_ms {
            Some(claimed_ms) => Some(claimed_ms.saturating_sub(task.created_at_ms)),
            None if !task.state.is_terminal() => Some(now_ms.saturating_sub(task.created_at_ms)),
            None => None,
        };
        if let Some(wait_ms) = wait_ms {
            self.waits_ms[task.priority.index()].push(wait_ms);
        }
        if task.state.is_terminal() {
            self.ended += 1;
            if task.state == State::Dead {
                self.dead += 1;
            }
        }
    }

    fn waits(&self, bucket: Option<Priority>) -> Vec<u64> {
        let mut waits: Vec<u64> = match bucket {
            Some(bucket) => self.waits_ms[bucket.index()].clone(),
            None => self.waits_ms.concat(),
        };
        waits.sort_unstable();
        waits
    }
}

/// The baseline's and the candidate's tasks of a step, read from their records.
pub fn tally<E>(
    experiment: &Experiment,
    now_ms: u64,
    list: impl FnMut(&ListQuery) -> Result<ListPage, E>,
) -> Result<[StepTally; 2], E> {
    let mut tallies = [StepTally::default(), StepTally::default()];
    scan(experiment, list, |task| {
        tallies
            .get_mut(usize::from(variant_of(experiment, task)?))?
            .add(task, now_ms);
        Some(())
    })?;
    Ok(tallies)
}

/// A guard as judged at a step's end.
#[derive(Clone, Debug, PartialEq)]
pub struct Judgement {
    pub guard: String,
    pub held: bool,
    /// False when the step had nothing to judge it on (no tasks of its bucket from both
    /// versions): it then holds, but the step waits for evidence while it may.
    pub judged: bool,
    /// e.g. `low.wait_p99_ms <= 2000 failed: the new version's 4812 (the baseline's 310), 2812 over`.
    pub line: String,
}

/// Judges `guard` on the step's tallies (`[baseline, candidate]`) and the versions' faults.
/// Against the baseline, a p50 or p99 wait is judged with the bootstrap interval of the change
/// (seeded with `seed`): a cap fails only when the whole interval lies past the margin.
pub fn judge(guard: &Guard, tallies: &[StepTally; 2], faults: [u64; 2], seed: u64) -> Judgement {
    let text = &guard.text;
    let values = [0, 1].map(|i| figure(guard.metric, &tallies[i], faults[i]));
    let [Some(baseline), Some(candidate)] = values else {
        let what = match guard.metric {
            GuardMetric::Wait {
                bucket: Some(bucket),
                ..
            } => format!("{} tasks", bucket.as_str()),
            _ => "tasks".into(),
        };
        // Nothing to judge on is no evidence of harm: the guard holds, and says why.
        return Judgement {
            guard: text.clone(),
            held: true,
            judged: false,
            line: format!("{text} not judged: no {what} of both versions in this step"),
        };
    };
    let shown = format!(
        "the new version's {} (the baseline's {})",
        number(candidate),
        number(baseline)
    );
    let (held, limit_shown, interval) = match guard.limit {
        GuardLimit::Value(limit) => (guard.op.holds(candidate, limit), limit, None),
        GuardLimit::Baseline { margin_percent } => {
            let limit = if guard.op.caps() {
                baseline * (1.0 + margin_percent / 100.0)
            } else {
                baseline * (1.0 - margin_percent / 100.0)
            };
            match wait_interval(guard, tallies, seed) {
                Some([low, high]) => {
                    let held = if guard.op.caps() {
                        low <= margin_percent
                    } else {
                        high >= -margin_percent
                    };
                    (held, limit, Some([low, high]))
                }
                None => (guard.op.holds(candidate, limit), limit, None),
            }
        }
    };
    let interval_shown = interval.map_or(String::new(), |[low, high]| {
        format!(", change [{low:+.1} %, {high:+.1} %] at 95 %")
    });
    let line = if held {
        format!("{text} held: {shown}{interval_shown}")
    } else {
        let by = (candidate - limit_shown).abs();
        let side = match guard.op {
            GuardOp::AtMost | GuardOp::Below => "over",
            GuardOp::AtLeast | GuardOp::Above => "under",
            GuardOp::Equal => "away from",
        };
        format!(
            "{text} failed: {shown}{interval_shown}, {} {side} the limit of {}",
            number(by),
            number(limit_shown)
        )
    };
    Judgement {
        judged: true,
        guard: text.clone(),
        held,
        line,
    }
}

fn figure(metric: GuardMetric, tally: &StepTally, faults: u64) -> Option<f64> {
    match metric {
        GuardMetric::Wait { bucket, figure } => {
            let waits = tally.waits(bucket);
            if waits.is_empty() {
                return None;
            }
            let value = match figure.quantile() {
                Some(q) => quantile(&waits, q),
                None => waits.last().copied().unwrap_or(0),
            };
            Some(value as f64)
        }
        GuardMetric::Faults => Some(faults as f64),
        GuardMetric::Dead => Some(tally.dead as f64),
        GuardMetric::DeadPercent => {
            (tally.ended > 0).then(|| tally.dead as f64 * 100.0 / tally.ended as f64)
        }
        GuardMetric::RetriesPerTask => {
            (tally.tasks > 0).then(|| tally.retries as f64 / tally.tasks as f64)
        }
    }
}

/// The bootstrap interval, in percent, of the candidate's wait quantile against the
/// baseline's; none for other metrics or where a change from 0 is possible.
fn wait_interval(guard: &Guard, tallies: &[StepTally; 2], seed: u64) -> Option<[f64; 2]> {
    let GuardMetric::Wait { bucket, figure } = guard.metric else {
        return None;
    };
    let q = figure.quantile()?;
    let [baseline, candidate] = [0, 1].map(|i| tallies[i].waits(bucket));
    change_interval_percent(&baseline, &candidate, q, seed)
}

fn number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value:.3}")
    }
}

/// What one look at a running step found to do.
#[derive(Clone, Debug, PartialEq)]
pub enum StepVerdict {
    /// Not yet: the step's time or its least tasks are not there.
    Wait,
    Advance(Vec<String>),
    RollBack {
        guard: String,
        reason: String,
        judged: Vec<String>,
    },
}

/// Judges a running step at `now_ms`: due once its time is up, the new version has its least
/// tasks and every guard has tasks of both versions to be judged on (or `STEP_WAIT_FACTOR`
/// step lengths went by: then a guard with nothing to judge holds); every guard holds, or the
/// first that fails rolls it back.
pub fn verdict<E>(
    experiment: &Experiment,
    faults: [u64; 2],
    now_ms: u64,
    list: impl FnMut(&ListQuery) -> Result<ListPage, E>,
) -> Result<StepVerdict, E> {
    let Some(step) = &experiment.rollout else {
        return Ok(StepVerdict::Wait);
    };
    let elapsed_ms = now_ms.saturating_sub(experiment.started_at_ms);
    if elapsed_ms < step.step_ms {
        return Ok(StepVerdict::Wait);
    }
    let tallies = tally(experiment, now_ms, list)?;
    let waited_long = elapsed_ms >= step.step_ms.saturating_mul(STEP_WAIT_FACTOR);
    if tallies[1].tasks < u64::from(step.min_tasks) && !waited_long {
        return Ok(StepVerdict::Wait);
    }
    let judgements: Vec<Judgement> = step
        .guards()
        .iter()
        .map(|guard| judge(guard, &tallies, faults, u64::from(experiment.id)))
        .collect();
    let judged: Vec<String> = judgements.iter().map(|j| j.line.clone()).collect();
    let failed = judgements.iter().find(|j| !j.held);
    // A step is not passed on no evidence while it may still gather some; a failure is final.
    if failed.is_none() && !waited_long && judgements.iter().any(|j| !j.judged) {
        return Ok(StepVerdict::Wait);
    }
    Ok(match failed {
        Some(failed) => StepVerdict::RollBack {
            guard: failed.guard.clone(),
            reason: failed.line.clone(),
            judged,
        },
        None => StepVerdict::Advance(judged),
    })
}

/// A due step still short of its least tasks is looked at again after this (its scan reads
/// every task record of the step, so not every tick).
const SHORT_STEP_RELOOK_MS: u64 = 2_000;

/// Looks at every running rollout every `ROLLOUT_TICK_MS` until the server stops; the first
/// look also reads the catalog for a rollout whose next step never started.
pub async fn drive(state: crate::api::AppState) {
    let mut ticks = tokio::time::interval(Duration::from_millis(ROLLOUT_TICK_MS));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut looker = Looker {
        resumed: false,
        relook_at_ms: std::collections::HashMap::new(),
    };
    loop {
        ticks.tick().await;
        if state.draining.load(std::sync::atomic::Ordering::Acquire) {
            continue;
        }
        let looked = state.clone();
        let done = tokio::task::spawn_blocking(move || {
            let result = looker.look(&looked);
            (looker, result)
        })
        .await;
        match done {
            Ok((back, result)) => {
                looker = back;
                if let Err(error) = result {
                    tracing::warn!(%error, "rollouts not looked at this time");
                }
            }
            Err(error) => {
                tracing::error!(%error, "the rollout look panicked");
                looker = Looker {
                    resumed: false,
                    relook_at_ms: std::collections::HashMap::new(),
                };
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum LookError {
    #[error(transparent)]
    Registry(#[from] sluice_policy_runtime::RegistryError),
    #[error(transparent)]
    Scheduler(#[from] crate::scheduler::SchedulerError),
    #[error(transparent)]
    Audit(#[from] crate::auth::AuthError),
}

/// What the looks remember: whether the catalog was read for unstarted steps, and when each
/// step short of its least tasks is to be looked at again.
struct Looker {
    resumed: bool,
    relook_at_ms: std::collections::HashMap<u32, u64>,
}

impl Looker {
    /// One look: judges each due step of the running experiments (kept in memory), and, the
    /// first time, starts the next step of a rollout whose step passed but whose successor
    /// never started (the server stopped between the two writes).
    fn look(&mut self, state: &crate::api::AppState) -> Result<(), LookError> {
        let registry: &PolicyRegistry = &state.policies;
        let now_ms = crate::scheduler::Clock::now_ms(&crate::scheduler::SystemClock);
        if !self.resumed {
            resume_unstarted(registry, now_ms)?;
            self.resumed = true;
        }
        let live = registry.live_experiments();
        self.relook_at_ms
            .retain(|id, _| live.iter().any(|e| e.id == *id));
        for experiment in live.iter().filter(|e| e.rollout.is_some()) {
            if self
                .relook_at_ms
                .get(&experiment.id)
                .is_some_and(|&at_ms| now_ms < at_ms)
            {
                continue;
            }
            let waited = judge_step(state, experiment, now_ms)?;
            if waited {
                self.relook_at_ms
                    .insert(experiment.id, now_ms + SHORT_STEP_RELOOK_MS);
            }
        }
        Ok(())
    }
}

fn resume_unstarted(registry: &PolicyRegistry, now_ms: u64) -> Result<(), LookError> {
    let experiments = registry.experiments()?;
    for experiment in &experiments {
        let Some(step) = &experiment.rollout else {
            continue;
        };
        let last_of_its_rollout = !experiments.iter().any(|e| {
            e.id > experiment.id
                && e.rollout
                    .as_ref()
                    .is_some_and(|r| r.rollout == step.rollout)
        });
        if last_of_its_rollout && matches!(experiment.end, Some(ExperimentEnd::Advanced { .. })) {
            registry.resume_rollout(experiment, now_ms)?;
        }
    }
    Ok(())
}

/// Judges one running step and acts on the verdict; true when the step was due but short of
/// its least tasks.
fn judge_step(
    state: &crate::api::AppState,
    experiment: &Experiment,
    now_ms: u64,
) -> Result<bool, LookError> {
    let registry: &PolicyRegistry = &state.policies;
    let Some(step) = &experiment.rollout else {
        return Ok(false);
    };
    let faults = registry
        .variant_figures(experiment)
        .map(|arms| [0, 1].map(|i| arms.get(i).map_or(0, |arm| arm.faults_total)))
        .unwrap_or_default();
    let scheduler = state.scheduler.clone();
    let verdict = verdict(experiment, faults, now_ms, |query| scheduler.list(query))?;
    let target = format!("rollout {}", step.rollout);
    let (action, detail) = match verdict {
        StepVerdict::Wait => {
            let due = now_ms.saturating_sub(experiment.started_at_ms) >= step.step_ms;
            return Ok(due);
        }
        StepVerdict::Advance(judged) => {
            let ended = registry.advance_rollout(experiment.id, judged.clone(), now_ms)?;
            let action = if ended.is_running() {
                "rollout.advance"
            } else {
                state.scheduler.policies_changed();
                "rollout.complete"
            };
            (action, judged.join("; "))
        }
        StepVerdict::RollBack {
            guard,
            reason,
            judged,
        } => {
            registry.roll_back_rollout(experiment.id, guard, reason.clone(), judged, now_ms)?;
            ("rollout.rollback", reason)
        }
    };
    state.gate.audit(AuditEvent {
        seq: 0,
        at_ms: now_ms,
        token_id: SERVER_ACTOR.into(),
        role: Role::Admin,
        action: action.into(),
        target,
        detail: Some(format!(
            "step {} ({} %): {detail}",
            step.step + 1,
            step.share_percent()
        )),
    })?;
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally_of(low_waits_ms: &[u64]) -> StepTally {
        StepTally {
            tasks: low_waits_ms.len() as u64,
            waits_ms: [Vec::new(), Vec::new(), low_waits_ms.to_vec()],
            ..StepTally::default()
        }
    }

    #[test]
    fn a_cap_fails_by_how_much_and_an_empty_bucket_holds() {
        let guard: Guard = "low.wait_p99_ms <= 2000".parse().unwrap();
        let fast = tally_of(&[100, 200, 300]);
        let slow = tally_of(&[100, 4_000, 4_812]);
        let failed = judge(&guard, &[fast.clone(), slow.clone()], [0, 0], 1);
        assert!(!failed.held);
        assert_eq!(
            failed.line,
            "low.wait_p99_ms <= 2000 failed: the new version's 4812 (the baseline's 300), 2812 over the limit of 2000"
        );
        let held = judge(&guard, &[slow, fast.clone()], [0, 0], 1);
        assert!(held.held, "{}", held.line);
        let urgent: Guard = "urgent.wait_p99_ms <= 10".parse().unwrap();
        let empty = judge(&urgent, &[fast.clone(), fast], [0, 0], 1);
        assert!(empty.held && !empty.judged);
        assert!(held.judged && failed.judged);
        assert!(
            empty.line.contains("not judged: no urgent tasks"),
            "{}",
            empty.line
        );
    }

    #[test]
    fn against_the_baseline_a_wait_fails_only_when_its_interval_lies_past_the_margin() {
        let guard: Guard = "low.wait_p99_ms <= baseline + 20%".parse().unwrap();
        let baseline = tally_of(&(0..200).map(|i| 1_000 + i).collect::<Vec<_>>());
        let same = tally_of(&(0..200).map(|i| 1_000 + (i * 7) % 200).collect::<Vec<_>>());
        let worse = tally_of(&(0..200).map(|i| 3_000 + i).collect::<Vec<_>>());
        let held = judge(&guard, &[baseline.clone(), same], [0, 0], 7);
        assert!(held.held, "{}", held.line);
        assert!(held.line.contains("at 95 %"), "{}", held.line);
        let failed = judge(&guard, &[baseline, worse], [0, 0], 7);
        assert!(!failed.held, "{}", failed.line);
        let faults: Guard = "faults == 0".parse().unwrap();
        let tallies = [tally_of(&[1]), tally_of(&[1])];
        assert!(judge(&faults, &tallies, [5, 0], 1).held);
        let faulted = judge(&faults, &tallies, [0, 3], 1);
        assert!(!faulted.held);
        assert!(
            faulted.line.contains("the new version's 3"),
            "{}",
            faulted.line
        );
    }
}
