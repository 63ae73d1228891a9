//! Wait figures per bucket, and one sample's against another's: p50, p99 and max with
//! bootstrap intervals of the change, the lines the tables print and a plain verdict. Both
//! `sluice sim`'s report and a live experiment's use these, so the two read alike.

use crate::{CONFIDENCE_PERCENT, change_interval_percent, quantile};
use serde::Serialize;
use sluice_model::Priority;

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

/// Rounded to three decimals, so a report's figures print and compare stably.
pub fn round3(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
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

/// A change is called one when its interval leaves out 0 and it is at least this, in percent.
pub const CHANGE_CALLED_PERCENT: f64 = 1.0;
/// A figure is called unchanged when its whole interval lies within ± this, in percent; an
/// interval that neither leaves out 0 nor lies this close is inconclusive: the samples are too
/// small, or too spread, to tell a change from none.
pub const UNCHANGED_WITHIN_PERCENT: f64 = 5.0;

/// A plain line on the p99 waits: what the second variant does to each bucket, with the
/// interval, and the thresholds it was judged by: lowers or raises (the interval leaves out 0
/// and the change is `CHANGE_CALLED_PERCENT` or more), unchanged (the interval lies within
/// ±`UNCHANGED_WITHIN_PERCENT`), or inconclusive (neither).
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
            let close = d.interval_percent.is_none_or(|[low, high]| {
                low >= -UNCHANGED_WITHIN_PERCENT && high <= UNCHANGED_WITHIN_PERCENT
            });
            match d.change_percent {
                Some(p) if sure && p <= -CHANGE_CALLED_PERCENT => {
                    format!("lowers {bucket} p99 wait by {} %{interval}", percent(-p))
                }
                Some(p) if sure && p >= CHANGE_CALLED_PERCENT => {
                    format!("raises {bucket} p99 wait by {} %{interval}", percent(p))
                }
                Some(_) if close => format!("leaves {bucket} p99 wait unchanged{interval}"),
                Some(_) => format!("is inconclusive on {bucket} p99 wait{interval}"),
                None if d.second_ms == 0 => format!("leaves {bucket} p99 wait at 0"),
                None => format!(
                    "raises {bucket} p99 wait from 0 to {}",
                    duration(d.second_ms)
                ),
            }
        })
        .collect();
    format!(
        "{name} {} ({CONFIDENCE_PERCENT:.0} % bootstrap intervals; a change is called at \
         {CHANGE_CALLED_PERCENT:.0} % or more with 0 outside its interval, none when the interval \
         lies within ±{UNCHANGED_WITHIN_PERCENT:.0} %, inconclusive otherwise)",
        parts.join("; ")
    )
}

/// A variant's share of an experiment's tasks beside its weight's share.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShareCheck {
    pub variant: String,
    pub tasks: u64,
    /// Its share of the tasks, in percent.
    pub share_percent: f64,
    /// Its weight's share of the weights, in percent.
    pub weight_percent: f64,
}

/// Shares this far (in percentage points) from the weights are reported...
pub const SHARE_OFF_POINTS: f64 = 10.0;
/// ...when chance would put them there less often than this many standard errors would (a
/// binomial of the tasks: assignment by device or tenant is coarser than that, which is one
/// reason a share can be off).
pub const SHARE_OFF_STANDARD_ERRORS: f64 = 3.0;

/// Each variant's share against its weight's, and a line when one is off by more than
/// `SHARE_OFF_POINTS` and `SHARE_OFF_STANDARD_ERRORS` (none when all are near).
/// `variants` is (name, tasks, weight); `unit` is what tasks are assigned by.
pub fn share_check(
    variants: &[(String, u64, u32)],
    unit: &str,
) -> (Vec<ShareCheck>, Option<String>) {
    let tasks: u64 = variants.iter().map(|v| v.1).sum();
    let weights: u64 = variants.iter().map(|v| u64::from(v.2)).sum();
    let checks: Vec<ShareCheck> = variants
        .iter()
        .map(|(name, n, weight)| ShareCheck {
            variant: name.clone(),
            tasks: *n,
            share_percent: match tasks {
                0 => 0.0,
                all => round3(*n as f64 / all as f64 * 100.0),
            },
            weight_percent: match weights {
                0 => 0.0,
                all => round3(f64::from(*weight) / all as f64 * 100.0),
            },
        })
        .collect();
    let off = tasks > 0
        && checks.iter().any(|check| {
            let p = check.weight_percent / 100.0;
            let standard_error = (p * (1.0 - p) / tasks as f64).sqrt() * 100.0;
            let gap = (check.share_percent - check.weight_percent).abs();
            gap > SHARE_OFF_POINTS && gap > SHARE_OFF_STANDARD_ERRORS * standard_error
        });
    let line = off.then(|| {
        let shares: Vec<String> = checks
            .iter()
            .map(|c| {
                format!(
                    "{} {} % of the tasks against a weight of {} %",
                    c.variant,
                    percent(c.share_percent),
                    percent(c.weight_percent)
                )
            })
            .collect();
        let why = match unit {
            "task" => "tasks are assigned one by one, so more than chance is at work".to_owned(),
            unit => {
                format!("tasks are assigned by {unit}, and with few of them the split is coarse")
            }
        };
        format!(
            "the variants' shares are far from their weights ({}); {why}: the variants saw \
             different work, so read their comparison with that in mind",
            shares.join(", ")
        )
    });
    (checks, line)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn p99(change: f64, interval: [f64; 2]) -> Difference {
        Difference {
            bucket: Priority::Normal,
            figure: "p99",
            first_ms: 1_000,
            second_ms: (1_000.0 * (1.0 + change / 100.0)) as u64,
            change_percent: Some(change),
            interval_percent: Some(interval),
        }
    }

    #[test]
    fn a_narrow_interval_is_unchanged_and_a_wide_one_inconclusive() {
        let sure_but_small = verdict("B", &[p99(-0.35, [-0.4, -0.3])]);
        assert!(
            sure_but_small.contains("leaves normal p99 wait unchanged"),
            "{sure_but_small}"
        );
        let wide = verdict("B", &[p99(-30.0, [-99.3, 30.3])]);
        assert!(
            wide.contains("is inconclusive on normal p99 wait [−99.3 %, +30.3 %]"),
            "{wide}"
        );
        let lower = verdict("B", &[p99(-11.4, [-11.5, -11.2])]);
        assert!(
            lower.contains("lowers normal p99 wait by 11.4 %"),
            "{lower}"
        );
        assert!(
            lower.contains("inconclusive otherwise"),
            "the thresholds are stated: {lower}"
        );
    }

    #[test]
    fn a_share_far_from_its_weight_is_reported_and_a_near_one_is_not() {
        let (checks, line) = share_check(&[("A".into(), 299, 1), ("B".into(), 101, 1)], "device");
        assert_eq!(checks[0].share_percent, 74.75);
        assert_eq!(checks[1].weight_percent, 50.0);
        let line = line.expect("299/101 for 50/50 is reported");
        assert!(
            line.contains("B 25.2 % of the tasks against a weight of 50.0 %"),
            "{line}"
        );
        assert!(line.contains("assigned by device"), "{line}");
        let (_, near) = share_check(&[("A".into(), 205, 1), ("B".into(), 195, 1)], "task");
        assert_eq!(near, None);
        // Off by more than 10 points, but within chance for 12 tasks.
        let (_, few) = share_check(&[("A".into(), 8, 1), ("B".into(), 4, 1)], "task");
        assert_eq!(few, None);
    }
}
