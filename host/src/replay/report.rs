//! What `sluice sim` tells: each variant's figures as a table, the second against the first,
//! and `report.json`. Everything here is computed from the runs alone (no wall clock, no
//! paths of the scratch files), so one seed gives the same bytes.

use super::{RunOutcome, Trace, Variant};
use crate::model::{Priority, State};
use crate::stats::{CONFIDENCE_PERCENT, change_interval_percent, quantile};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One bucket's waits (submission to first claim).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WaitFigures {
    /// Tasks of the bucket that were claimed.
    pub claimed: u64,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub max_ms: u64,
    pub mean_ms: f64,
    /// The 1st to the 100th percentile, for plotting.
    pub percentiles_ms: Vec<u64>,
}

impl WaitFigures {
    /// From the waits, sorted here.
    pub fn of(waits_ms: &mut [u64]) -> WaitFigures {
        waits_ms.sort_unstable();
        let sum: u128 = waits_ms.iter().map(|&w| u128::from(w)).sum();
        WaitFigures {
            claimed: waits_ms.len() as u64,
            p50_ms: quantile(waits_ms, 0.50),
            p99_ms: quantile(waits_ms, 0.99),
            max_ms: waits_ms.last().copied().unwrap_or(0),
            mean_ms: match waits_ms.len() {
                0 => 0.0,
                n => round3(sum as f64 / n as f64),
            },
            percentiles_ms: (1..=100)
                .map(|p| quantile(waits_ms, f64::from(p) / 100.0))
                .collect(),
        }
    }
}

fn round3(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
}

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

/// One figure of the second variant against the first.
#[derive(Clone, Debug, Serialize)]
pub struct Difference {
    pub bucket: Priority,
    pub figure: &'static str,
    pub first_ms: u64,
    pub second_ms: u64,
    /// (second − first) / first, in percent; none when the first is 0.
    pub change_percent: Option<f64>,
    /// Its 95 % percentile-bootstrap interval (p50 and p99 only; none where a change from 0
    /// is possible).
    pub interval_percent: Option<[f64; 2]>,
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
            let _ = writeln!(out, "\nvariant {}: {}", variant.name, variant.policies);
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
                "  throughput {:.1}/s, utilisation {:.1} %, makespan {}, crashes {}{}{}{}",
                variant.throughput_per_s,
                variant.utilisation * 100.0,
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

/// The second sample's wait p50, p99 and max against the first's, per bucket (urgent, normal,
/// low), with bootstrap intervals from `seed` (none for a bucket empty in either).
pub fn wait_differences(
    first: &[Vec<u64>; 3],
    second: &[Vec<u64>; 3],
    seed: u64,
) -> Vec<Difference> {
    let mut out = Vec::new();
    for bucket in Priority::ALL {
        let [a, b] = [first, second].map(|v| v[bucket.index()].as_slice());
        // Each figure its own stream of draws, so adding one changes none of the others.
        let interval = |q: f64, stream: u64| {
            let seed =
                seed ^ (bucket.index() as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ stream;
            change_interval_percent(a, b, q, seed)
        };
        let max = |v: &[u64]| v.last().copied().unwrap_or(0);
        for (figure, first_ms, second_ms, interval_percent) in [
            (
                "p50",
                quantile(a, 0.50),
                quantile(b, 0.50),
                interval(0.50, 50),
            ),
            (
                "p99",
                quantile(a, 0.99),
                quantile(b, 0.99),
                interval(0.99, 99),
            ),
            ("max", max(a), max(b), None),
        ] {
            out.push(Difference {
                interval_percent,
                bucket,
                figure,
                first_ms,
                second_ms,
                change_percent: (first_ms > 0).then(|| {
                    round3((second_ms as f64 - first_ms as f64) / first_ms as f64 * 100.0)
                }),
            });
        }
    }
    out
}

/// A plain line on the p99 waits: what the second variant does to each bucket, with the
/// interval. A change is called one when its interval leaves out 0 and it is at least 1 %;
/// a smaller one, however sure, is called unchanged.
pub fn verdict(name: &str, differences: &[Difference]) -> String {
    let parts: Vec<String> = differences
        .iter()
        .filter(|d| d.figure == "p99")
        .map(|d| {
            let bucket = d.bucket.as_str();
            let interval = d.interval_percent.map_or(String::new(), |[low, high]| {
                format!(" [{} %, {} %]", signed_percent(low), signed_percent(high))
            });
            let sure = d
                .interval_percent
                .is_none_or(|[low, high]| low > 0.0 || high < 0.0);
            match d.change_percent {
                Some(p) if sure && p <= -1.0 => {
                    format!("lowers {bucket} p99 wait by {} %{interval}", percent(-p))
                }
                Some(p) if sure && p >= 1.0 => {
                    format!("raises {bucket} p99 wait by {} %{interval}", percent(p))
                }
                Some(_) => format!("leaves {bucket} p99 wait unchanged{interval}"),
                None if d.second_ms == 0 => format!("leaves {bucket} p99 wait at 0"),
                None => format!(
                    "raises {bucket} p99 wait from 0 to {}",
                    duration(d.second_ms)
                ),
            }
        })
        .collect();
    format!(
        "{name} {} ({CONFIDENCE_PERCENT:.0} % bootstrap intervals)",
        parts.join("; ")
    )
}

/// A percentage as people read it: whole from 100 up, one decimal below.
fn percent(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

fn signed_percent(value: f64) -> String {
    let sign = if value >= 0.0 { "+" } else { "−" };
    format!("{sign}{}", percent(value.abs()))
}

/// One difference as the tables print it: bucket, figure, both values, change, interval.
pub fn difference_line(d: &Difference) -> String {
    format!(
        "  {:<8} {:<4} {:>10} → {:>10}  {}{}",
        d.bucket.as_str(),
        d.figure,
        duration(d.first_ms),
        duration(d.second_ms),
        change(d.change_percent),
        d.interval_percent
            .map_or(String::new(), |[low, high]| format!(
                "  [{low:+.1} %, {high:+.1} %]"
            ))
    )
}

fn change(percent: Option<f64>) -> String {
    match percent {
        Some(p) => format!("{p:+.1} %"),
        None => "—".into(),
    }
}

/// A duration as people read it: ms, s, min or h.
pub fn duration(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1_000.0),
        60_000..3_600_000 => format!("{:.1} min", ms as f64 / 60_000.0),
        _ => format!("{:.1} h", ms as f64 / 3_600_000.0),
    }
}
