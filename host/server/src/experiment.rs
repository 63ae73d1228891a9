//! An experiment's report: each variant's figures taken from the records of the tasks it was
//! assigned (so a restart loses none of them), the others against the first with bootstrap
//! intervals, a verdict line per variant, and what the variants' versions did at run time.

use serde::Serialize;
use sluice_model::{
    AssignBy, Experiment, ExperimentMode, PolicyKind, Priority, State, Task, TaskId,
};
use sluice_policy_runtime::{ArmFigures, MergeFigures};
use sluice_stats::compare::{
    Difference, ShareCheck, WaitFigures, difference_line, duration, share_check, verdict,
    wait_differences,
};
use sluice_store::{ListPage, ListQuery};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Task records one report reads at most; past it the report says it is partial.
pub const MAX_REPORT_TASKS: usize = 200_000;
/// Records read per page of the scan.
const PAGE_TASKS: usize = 2_000;

/// One variant's tasks, as their records tell.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct VariantFigures {
    pub name: String,
    pub version: u32,
    pub tasks: u64,
    /// Not claimed yet.
    pub waiting: u64,
    pub completed: u64,
    pub dead: u64,
    /// Ended otherwise: failed, timed out, cancelled.
    pub other_ended: u64,
    /// Attempts after the first, together.
    pub retries: u64,
    /// Tasks that wait (or waited) in a higher bucket than they were submitted to.
    pub promoted: u64,
    /// Split searches among its tasks (a merge experiment's), and those answered partial.
    pub searches: u64,
    pub partial_searches: u64,
    /// Attempts per ended task.
    pub attempts_per_task: f64,
    /// Submission to first claim, per submitted priority.
    #[schema(value_type = Object)]
    pub wait_ms: BTreeMap<Priority, WaitFigures>,
    /// What its version did at run time, since this server started; none once forgotten.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<ArmFigures>,
}

/// One variant against the first.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Comparison {
    pub variant: String,
    #[schema(value_type = Vec<Object>)]
    pub differences: Vec<Difference>,
    pub verdict: String,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ExperimentReport {
    pub experiment: Experiment,
    /// Task records read for it.
    pub tasks_examined: u64,
    /// False when the scan stopped at `MAX_REPORT_TASKS` records: the figures are of the
    /// experiment's first tasks only.
    pub complete: bool,
    pub variants: Vec<VariantFigures>,
    /// Live experiments only; a shadow one's variants decide for no task.
    pub comparisons: Vec<Comparison>,
    /// Live experiments only: each variant's share of the tasks beside its weight's.
    #[schema(value_type = Vec<Object>)]
    pub shares: Vec<ShareCheck>,
    /// Set when a variant's share is far from its weight's (`sluice_stats::compare::share_check`).
    pub shares_warning: Option<String>,
    /// The report as `sluice experiment report` prints it.
    pub text: String,
}

#[derive(Default)]
struct VariantTally {
    tasks: u64,
    waiting: u64,
    ended: BTreeMap<State, u64>,
    attempts_of_ended: u64,
    retries: u64,
    promoted: u64,
    searches: u64,
    partial_searches: u64,
    waits_ms: [Vec<u64>; 3],
}

impl VariantTally {
    fn add(&mut self, task: &Task) {
        self.tasks += 1;
        self.retries += u64::from(task.attempt.saturating_sub(1));
        if task.bucket < task.priority {
            self.promoted += 1;
        }
        if task.family.is_some() {
            self.searches += 1;
            if task.result.as_ref().is_some_and(|r| r["partial"] == true) {
                self.partial_searches += 1;
            }
        }
        match task.first_claimed_at_ms {
            Some(claimed_ms) => self.waits_ms[task.priority.index()]
                .push(claimed_ms.saturating_sub(task.created_at_ms)),
            None if !task.state.is_terminal() => self.waiting += 1,
            None => {}
        }
        if task.state.is_terminal() {
            *self.ended.entry(task.state).or_default() += 1;
            self.attempts_of_ended += u64::from(task.attempt);
        }
    }
}

/// The variant of `experiment` that `task` was assigned, if any.
pub fn variant_of(experiment: &Experiment, task: &Task) -> Option<u8> {
    task.variant(experiment.kind)
        .filter(|tag| tag.experiment == experiment.id)
        .map(|tag| tag.variant)
}

/// Hands `each` the records of the tasks created while `experiment` ran, read with `list` in
/// pages in id order; at most `MAX_REPORT_TASKS`. Answers how many were read and whether
/// that was all of them.
pub fn scan<E>(
    experiment: &Experiment,
    mut list: impl FnMut(&ListQuery) -> Result<ListPage, E>,
    mut each: impl FnMut(&Task) -> Option<()>,
) -> Result<(usize, bool), E> {
    // Ids begin with their creation ms: the first task of the experiment comes after this.
    let mut after = Some(TaskId::from_u128(
        (u128::from(experiment.started_at_ms) << 80).saturating_sub(1),
    ));
    let mut examined = 0usize;
    while let Some(from) = after {
        if examined >= MAX_REPORT_TASKS {
            return Ok((examined, false));
        }
        let limit = PAGE_TASKS.min(MAX_REPORT_TASKS - examined);
        let page = list(&ListQuery {
            state: None,
            kind: None,
            device: None,
            after: Some(from),
            limit,
            scan_budget: limit,
        })?;
        if page.tasks.is_empty() {
            // Nothing past `from` (a page that examined nothing cannot move the scan on).
            break;
        }
        examined += page.tasks.len();
        for task in &page.tasks {
            let _ = each(task);
        }
        let past_end = experiment
            .ended_at_ms
            .zip(page.tasks.last())
            .is_some_and(|(end_ms, last)| last.id.created_ms() > end_ms);
        after = if past_end { None } else { page.next_after };
    }
    Ok((examined, true))
}

/// Reads the experiment's tasks with `list` (pages in id order, from its start) and reports.
pub fn report<E>(
    experiment: &Experiment,
    runtime: Option<Vec<ArmFigures>>,
    list: impl FnMut(&ListQuery) -> Result<ListPage, E>,
) -> Result<ExperimentReport, E> {
    let mut tallies: Vec<VariantTally> = experiment
        .variants
        .iter()
        .map(|_| VariantTally::default())
        .collect();
    let (examined, complete) = match experiment.mode {
        ExperimentMode::Live => scan(experiment, list, |task| {
            // A merge experiment counts searches: not their children (which carry their
            // tags), nor the other tasks admitted while it ran.
            if experiment.kind == PolicyKind::Merge && task.family.is_none() {
                return None;
            }
            tallies
                .get_mut(usize::from(variant_of(experiment, task)?))?
                .add(task);
            Some(())
        })?,
        ExperimentMode::Shadow => (0, true),
    };
    let mut runtime = runtime.unwrap_or_default().into_iter();
    let variants: Vec<VariantFigures> = experiment
        .variants
        .iter()
        .zip(tallies.iter_mut())
        .map(|(variant, tally)| figures(variant, tally, runtime.next()))
        .collect();
    let comparisons = match experiment.mode {
        // A merge changes no wait: its variants are compared by what their merges scored.
        _ if experiment.kind == PolicyKind::Merge => variants
            .iter()
            .skip(1)
            .filter_map(|variant| {
                let merge = variant.runtime.as_ref()?.merge.as_ref()?;
                Some(Comparison {
                    variant: variant.name.clone(),
                    differences: Vec::new(),
                    verdict: merge.verdict.clone()?,
                })
            })
            .collect(),
        ExperimentMode::Live => tallies
            .iter()
            .zip(&experiment.variants)
            .skip(1)
            .enumerate()
            .map(|(i, (tally, variant))| {
                let seed = u64::from(experiment.id) << 8 | (i as u64 + 1);
                let mut differences = wait_differences(&tallies[0].waits_ms, &tally.waits_ms, seed);
                // A bucket neither variant's tasks waited in says nothing.
                differences.retain(|d| {
                    let b = d.bucket.index();
                    !tallies[0].waits_ms[b].is_empty() && !tally.waits_ms[b].is_empty()
                });
                let verdict = verdict(&variant.name, &differences);
                Comparison {
                    variant: variant.name.clone(),
                    differences,
                    verdict,
                }
            })
            .collect(),
        ExperimentMode::Shadow => Vec::new(),
    };
    let (shares, shares_warning) = match experiment.mode {
        ExperimentMode::Live => {
            let counts: Vec<(String, u64, u32)> = experiment
                .variants
                .iter()
                .zip(&variants)
                .map(|(spec, figures)| (spec.name.clone(), figures.tasks, spec.weight))
                .collect();
            let unit = match experiment.assign_by {
                AssignBy::Task => "task",
                AssignBy::Device => "device",
                AssignBy::Tenant => "tenant",
            };
            share_check(&counts, unit)
        }
        ExperimentMode::Shadow => (Vec::new(), None),
    };
    let mut report = ExperimentReport {
        experiment: experiment.clone(),
        tasks_examined: examined as u64,
        complete,
        variants,
        comparisons,
        shares,
        shares_warning,
        text: String::new(),
    };
    report.text = text(&report);
    Ok(report)
}

fn figures(
    variant: &sluice_model::VariantSpec,
    tally: &mut VariantTally,
    runtime: Option<ArmFigures>,
) -> VariantFigures {
    let ended = |state| tally.ended.get(&state).copied().unwrap_or(0);
    let all_ended: u64 = tally.ended.values().sum();
    let (completed, dead) = (ended(State::Completed), ended(State::Dead));
    for waits in &mut tally.waits_ms {
        waits.sort_unstable();
    }
    VariantFigures {
        name: variant.name.clone(),
        version: variant.version,
        tasks: tally.tasks,
        waiting: tally.waiting,
        completed,
        dead,
        other_ended: all_ended - completed - dead,
        retries: tally.retries,
        promoted: tally.promoted,
        searches: tally.searches,
        partial_searches: tally.partial_searches,
        attempts_per_task: match all_ended {
            0 => 0.0,
            n => (tally.attempts_of_ended as f64 / n as f64 * 1_000.0).round() / 1_000.0,
        },
        wait_ms: Priority::ALL
            .into_iter()
            .map(|bucket| {
                let mut waits = tally.waits_ms[bucket.index()].clone();
                (bucket, WaitFigures::of(&mut waits))
            })
            .collect(),
        runtime,
    }
}

/// A variant's merges as the report prints them.
fn merge_line(merge: &MergeFigures, variant: &VariantFigures) -> String {
    let partial = match variant.searches {
        0 => String::new(),
        n => format!(
            "; its searches {n}, partial {:.3}",
            variant.partial_searches as f64 / n as f64
        ),
    };
    format!("  {}{partial}", merge.line())
}

fn text(report: &ExperimentReport) -> String {
    let experiment = &report.experiment;
    let mut out = String::new();
    let state = match (&experiment.end, experiment.ended_at_ms) {
        (None, _) => "running".to_owned(),
        (Some(sluice_model::ExperimentEnd::Stopped), _) => "stopped".to_owned(),
        (
            Some(sluice_model::ExperimentEnd::Promoted {
                variant, version, ..
            }),
            _,
        ) => {
            format!("ended: {variant} (v{version}) promoted")
        }
        (Some(sluice_model::ExperimentEnd::Advanced { .. }), _) => {
            "ended: its rollout step passed".to_owned()
        }
        (Some(sluice_model::ExperimentEnd::RolledBack { reason, .. }), _) => {
            format!("ended: rolled back ({reason})")
        }
    };
    let _ = writeln!(out, "{} — {state}", experiment.describe());
    if !report.complete {
        let _ = writeln!(
            out,
            "partial: the figures are of its first {} task records",
            report.tasks_examined
        );
    }
    for variant in &report.variants {
        let _ = writeln!(out, "\nvariant {} (v{}):", variant.name, variant.version);
        if experiment.mode == ExperimentMode::Live {
            let _ = writeln!(
                out,
                "  tasks {}, waiting {}, completed {}, dead {}, other ends {}, retries {}, promoted {}, attempts/task {:.3}",
                variant.tasks,
                variant.waiting,
                variant.completed,
                variant.dead,
                variant.other_ended,
                variant.retries,
                variant.promoted,
                variant.attempts_per_task
            );
            let _ = writeln!(
                out,
                "  {:<8} {:>9} {:>10} {:>10} {:>10}",
                "bucket", "claimed", "wait p50", "wait p99", "wait max"
            );
            for (bucket, wait) in variant.wait_ms.iter().filter(|(_, w)| w.claimed > 0) {
                let _ = writeln!(
                    out,
                    "  {:<8} {:>9} {:>10} {:>10} {:>10}",
                    bucket.as_str(),
                    wait.claimed,
                    duration(wait.p50_ms),
                    duration(wait.p99_ms),
                    duration(wait.max_ms)
                );
            }
        }
        if let Some(runtime) = &variant.runtime {
            let _ = writeln!(
                out,
                "  decisions {}, faults {}{}",
                runtime.decisions_total,
                runtime.faults_total,
                match experiment.mode {
                    ExperimentMode::Shadow => format!(
                        ", compared {}, disagreements {}",
                        runtime.compared_total, runtime.disagreements_total
                    ),
                    ExperimentMode::Live if runtime.faults_total > 0 => {
                        " (the active version decided instead)".to_owned()
                    }
                    ExperimentMode::Live => String::new(),
                }
            );
            if let Some(merge) = &runtime.merge {
                let _ = writeln!(out, "{}", merge_line(merge, variant));
            }
            for sample in &runtime.disagreement_samples {
                let _ = writeln!(out, "    {sample}");
            }
        }
    }
    for comparison in &report.comparisons {
        let _ = writeln!(
            out,
            "\n{} against {}:",
            comparison.variant, report.variants[0].name
        );
        for d in comparison
            .differences
            .iter()
            .filter(|d| d.first_ms > 0 || d.second_ms > 0)
        {
            let _ = writeln!(out, "{}", difference_line(d));
        }
        let _ = writeln!(out, "verdict: {}", comparison.verdict);
    }
    if let Some(warning) = &report.shares_warning {
        let _ = writeln!(out, "\nnote: {warning}");
    }
    out
}
