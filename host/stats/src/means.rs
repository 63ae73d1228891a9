//! Means with percentile-bootstrap intervals, for figures that are averages over searches (a
//! merge's recall, its overlap with the baseline), and the verdict on a paired difference of
//! two such figures, stated with the thresholds it was judged by.

use crate::{BOOTSTRAP_REPLICATES, CONFIDENCE_PERCENT, rank};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// A difference of means is called a change when its interval leaves out 0 and the mean is at
/// least this far from 0, in points (0.01 = one point of recall)...
pub const CHANGE_CALLED_POINTS: f64 = 0.01;
/// ...and unchanged when its whole interval lies within ± this; otherwise inconclusive.
pub const UNCHANGED_WITHIN_POINTS: f64 = 0.05;

/// A mean over a sample, with its 95 % percentile-bootstrap interval (none for no values).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MeanFigure {
    pub mean: f64,
    pub interval: Option<[f64; 2]>,
    /// Values it is the mean of.
    pub n: u64,
}

impl MeanFigure {
    /// The mean of `values` and its interval, from `seed`'s resamples.
    pub fn of(values: &[f64], seed: u64) -> MeanFigure {
        MeanFigure {
            mean: round3(mean(values)),
            interval: mean_interval(values, seed),
            n: values.len() as u64,
        }
    }

    /// "0.412 [0.380, 0.445]".
    pub fn describe(&self) -> String {
        match self.interval {
            Some([low, high]) => format!("{:.3} [{low:.3}, {high:.3}]", self.mean),
            None => "none".to_owned(),
        }
    }
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

fn round3(value: f64) -> f64 {
    (value * 1_000.0).round() / 1_000.0
}

/// The 95 % percentile-bootstrap interval of the mean of `values`; none when empty. Each
/// replicate resamples all of them, so the cost is `BOOTSTRAP_REPLICATES` × n draws: callers
/// bound n. The values are put in order first, so the same values in any order give the same
/// interval for the same seed.
pub fn mean_interval(values: &[f64], seed: u64) -> Option<[f64; 2]> {
    let n = values.len();
    if n == 0 {
        return None;
    }
    let mut values = values.to_vec();
    values.sort_by(f64::total_cmp);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..BOOTSTRAP_REPLICATES)
        .map(|_| (0..n).map(|_| values[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    means.sort_by(f64::total_cmp);
    let tail = (100.0 - CONFIDENCE_PERCENT) / 200.0;
    let at = |p: f64| means[rank(means.len(), p) - 1];
    Some([round3(at(tail)), round3(at(1.0 - tail))])
}

/// The verdict on `difference` (a variant's figure minus the baseline's, search by search):
/// "lowers recall@k by 0.588 [...]", "leaves ... unchanged", or "is inconclusive on ...".
pub fn paired_verdict(name: &str, figure: &str, difference: &MeanFigure) -> String {
    let judged = format!(
        "({CONFIDENCE_PERCENT:.0} % bootstrap interval of the paired difference; a change is \
         called at {CHANGE_CALLED_POINTS} or more with 0 outside the interval, none when the \
         interval lies within ±{UNCHANGED_WITHIN_POINTS})"
    );
    let Some([low, high]) = difference.interval else {
        return format!("{name}: nothing to compare on {figure} yet");
    };
    let mean = difference.mean;
    let shown = difference.describe();
    if (low > 0.0 || high < 0.0) && mean.abs() >= CHANGE_CALLED_POINTS {
        let way = if mean < 0.0 { "lowers" } else { "raises" };
        format!(
            "{name} {way} {figure} by {:.3}: difference {shown} {judged}",
            mean.abs()
        )
    } else if low >= -UNCHANGED_WITHIN_POINTS && high <= UNCHANGED_WITHIN_POINTS {
        format!("{name} leaves {figure} unchanged: {shown} {judged}")
    } else {
        format!("{name} is inconclusive on {figure}: {shown} {judged}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mean_has_an_interval_around_it_and_verdicts_follow_their_thresholds() {
        let values: Vec<f64> = (0..400)
            .map(|i| if i % 4 == 0 { 0.0 } else { 1.0 })
            .collect();
        let figure = MeanFigure::of(&values, 7);
        assert_eq!(figure.mean, 0.75);
        let [low, high] = figure.interval.unwrap();
        assert!(
            low < 0.75 && 0.75 < high && high - low < 0.15,
            "{low} {high}"
        );
        assert_eq!(
            MeanFigure::of(&values, 7),
            figure,
            "the same seed, the same interval"
        );
        let mut reversed = values.clone();
        reversed.reverse();
        assert_eq!(MeanFigure::of(&reversed, 7), figure, "in any order");
        let same = MeanFigure::of(&[1.0; 50], 1);
        assert_eq!(same.interval, Some([1.0, 1.0]));
        assert_eq!(MeanFigure::of(&[], 1).interval, None);

        let lower = MeanFigure::of(&vec![-0.5; 30], 3);
        assert!(
            paired_verdict("t", "recall@k", &lower)
                .starts_with("t lowers recall@k by 0.500: difference -0.500 [-0.500, -0.500]")
        );
        let none = MeanFigure::of(&vec![0.0; 30], 3);
        assert!(paired_verdict("t", "recall@k", &none).contains("unchanged"));
        let spread: Vec<f64> = (0..10)
            .map(|i| if i % 2 == 0 { -0.9 } else { 0.9 })
            .collect();
        let wide = MeanFigure::of(&spread, 3);
        assert!(paired_verdict("t", "recall@k", &wide).contains("inconclusive"));
    }
}
