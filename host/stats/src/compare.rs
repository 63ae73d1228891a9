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
