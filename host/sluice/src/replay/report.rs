//! What `sluice sim` tells: each variant's figures as a table, the second against the first,
//! and `report.json`. Everything here is computed from the runs alone (no wall clock, no
//! paths of the scratch files), so one seed gives the same bytes.

use super::{RunOutcome, Trace, Variant};
use serde::Serialize;
use sluice_model::{Priority, State};
pub use sluice_stats::compare::{
    Difference, WaitFigures, difference_line, duration, round3, verdict, wait_differences,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Clone, Debug, Serialize)]
pub struct PolicyFaults {
    pub faults: u64,
    pub fallbacks: u64,
    pub deactivations: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct QueueDepth {
    pub interval_ms: u64,
    pub urgent: Vec<u32>,
    pub normal: Vec<u32>,
    pub low: Vec<u32>,
}

#[derive(Clone, Debug, Serialize)]
pub struct VariantReport {
    pub name: String,
    pub policies: String,
    pub tasks: u64,
    pub completed: u64,
    pub dead: u64,
    /// Tasks that ended otherwise (failed, timed out, cancelled).
    pub other_ended: u64,
    pub retries: u64,
    pub promotions: u64,
    pub attempts_per_task: f64,
    pub throughput_per_s: f64,
    /// Busy GPU slot time over the fleet's slot time in the makespan.
    pub utilisation: f64,
    /// Completed tasks per second of busy GPU slot time (a GPU batch's time counted once).
    pub tasks_per_gpu_s: f64,
    /// How its workers claimed GPU batches (none: one task per GPU slot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    pub makespan_ms: u64,
    pub stranded: u64,
    pub unfinished: u64,
    pub crashes: u64,
    /// Attempts that loaded their model first (tasks naming a model, `--model-load-ms`).
    pub model_loads: u64,
    pub drained: bool,
    /// Per submitted priority.
    pub wait_ms: BTreeMap<Priority, WaitFigures>,
    pub policy_faults: BTreeMap<String, PolicyFaults>,
    pub queue_depth: QueueDepth,
    /// Each bucket's waits, sorted, for the intervals of the comparison; not in the report.
    #[serde(skip)]
    pub sorted_waits_ms: [Vec<u64>; 3],
}

impl VariantReport {
    pub fn new(variant: &Variant, trace: &Trace, mut outcome: RunOutcome) -> VariantReport {
        let ended = |state| outcome.tally.ended.get(&state).copied().unwrap_or(0);
        let completed = ended(State::Completed);
        let dead = ended(State::Dead);
        let all_ended: u64 = outcome.tally.ended.values().sum();
        let wait_ms = Priority::ALL
            .into_iter()
            .zip(outcome.tally.waits_ms.iter_mut())
            .map(|(bucket, waits)| (bucket, WaitFigures::of(waits)))
            .collect();
        let seconds = outcome.makespan_ms.max(1) as f64 / 1_000.0;
        let [urgent, normal, low] = outcome.depth;
        VariantReport {
            name: variant.name.clone(),
            policies: variant.label(),
            tasks: trace.len() as u64,
            completed,
            dead,
            other_ended: all_ended - completed - dead,
            retries: outcome.tally.retries,
            promotions: outcome.tally.promotions,
            attempts_per_task: match all_ended {
                0 => 0.0,
                n => round3(outcome.tally.attempts_of_ended as f64 / n as f64),
            },
            throughput_per_s: round3(completed as f64 / seconds),
            utilisation: round3(outcome.busy_slot_ms as f64 / outcome.slot_ms.max(1) as f64),
            tasks_per_gpu_s: round3(
                completed as f64 * 1_000.0 / outcome.busy_slot_ms.max(1) as f64,
            ),
            batch: None,
            makespan_ms: outcome.makespan_ms,
            stranded: outcome.stranded,
            unfinished: outcome.unfinished,
            crashes: outcome.crashes,
            model_loads: outcome.model_loads,
            drained: outcome.drained,
            wait_ms,
            policy_faults: outcome
                .policy_faults
                .into_iter()
                .map(|(kind, (faults, fallbacks, deactivations))| {
                    let faults = PolicyFaults {
                        faults,
                        fallbacks,
                        deactivations,
                    };
                    (kind, faults)
                })
                .collect(),
            queue_depth: QueueDepth {
                interval_ms: outcome.depth_interval_ms,
                urgent,
                normal,
                low,
            },
            sorted_waits_ms: outcome.tally.waits_ms,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    pub trace_tasks: u64,
    pub trace_span_ms: u64,
    pub seed: u64,
    pub workers: String,
    /// `trace`, or the distribution the service times were drawn from.
    pub service: String,
    pub variants: Vec<VariantReport>,
    pub differences: Vec<Difference>,
    pub verdict: Option<String>,
}

impl SimReport {
    pub fn new(
        trace: &Trace,
        seed: u64,
        workers: String,
        variants: Vec<VariantReport>,
    ) -> SimReport {
        let differences = match variants.as_slice() {
            [first, second, ..] => differences(first, second, seed),
            _ => Vec::new(),
        };
        let verdict = (variants.len() > 1).then(|| verdict(&variants[1].name, &differences));
        SimReport {
            trace_tasks: trace.len() as u64,
            trace_span_ms: trace.span_ms(),
            seed,
            workers,
            service: trace.service().to_string(),
            variants,
            differences,
            verdict,
        }
    }

    /// The tables people read: one per variant, then the comparison.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "trace: {} tasks over {}; workers {}; seed {}{}",
            self.trace_tasks,
            duration(self.trace_span_ms),
            self.workers,
            self.seed,
            match self.service.as_str() {
                "trace" => String::new(),
                drawn => format!("; service times drawn from {drawn}"),
            }
        );
        for variant in &self.variants {
            let batch = variant
                .batch
                .as_ref()
                .map_or_else(String::new, |batch| format!("; {batch}"));
            let _ = writeln!(
                out,
                "\nvariant {}: {}{batch}",
                variant.name, variant.policies
            );
            let _ = writeln!(
                out,
                "  {:<8} {:>9} {:>10} {:>10} {:>10} {:>10}",
                "bucket", "claimed", "wait p50", "wait p99", "wait max", "wait mean"
            );
            for (bucket, wait) in &variant.wait_ms {
                let _ = writeln!(
                    out,
                    "  {:<8} {:>9} {:>10} {:>10} {:>10} {:>10}",
                    bucket.as_str(),
                    wait.claimed,
                    duration(wait.p50_ms),
                    duration(wait.p99_ms),
                    duration(wait.max_ms),
                    duration(wait.mean_ms as u64)
                );
            }
            let _ = writeln!(
                out,
                "  completed {}, dead {}, other ends {}, retries {}, promotions {}, attempts/task {:.3}",
                variant.completed,
                variant.dead,
                variant.other_ended,
                variant.retries,
                variant.promotions,
                variant.attempts_per_task
            );
            let _ = writeln!(
                out,
                "  throughput {:.1}/s, utilisation {:.1} %, {:.2} tasks per GPU-second, makespan {}, crashes {}{}{}{}",
                variant.throughput_per_s,
                variant.utilisation * 100.0,
                variant.tasks_per_gpu_s,
                duration(variant.makespan_ms),
                variant.crashes,
                match variant.model_loads {
                    0 => String::new(),
                    n => format!(", {n} model loads"),
                },
                match variant.stranded {
                    0 => String::new(),
                    n => format!(", {n} never placed (no worker fits them)"),
                },
                match (variant.drained, variant.unfinished) {
                    (true, _) | (_, 0) => String::new(),
                    (false, n) => format!(", stopped with {n} unfinished"),
                }
            );
            let faulted: Vec<String> = variant
                .policy_faults
                .iter()
                .filter(|(_, f)| f.faults > 0)
                .map(|(kind, f)| {
                    format!(
                        "{kind}: {} faults, {} fallbacks, {} deactivations",
                        f.faults, f.fallbacks, f.deactivations
                    )
                })
                .collect();
            if !faulted.is_empty() {
                let _ = writeln!(out, "  policy faults: {}", faulted.join("; "));
            }
        }
        if let [first, second, ..] = self.variants.as_slice() {
            let _ = writeln!(out, "\n{} against {}:", second.name, first.name);
            for difference in &self.differences {
                let _ = writeln!(out, "{}", difference_line(difference));
            }
        }
        if let Some(verdict) = &self.verdict {
            let _ = writeln!(out, "\nverdict: {verdict}");
        }
        out
    }
}

fn differences(first: &VariantReport, second: &VariantReport, seed: u64) -> Vec<Difference> {
    wait_differences(&first.sorted_waits_ms, &second.sorted_waits_ms, seed)
}
