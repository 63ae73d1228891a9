//! Order statistics for the researcher's reports: nearest-rank quantiles and percentile-bootstrap
//! intervals for how much one sample's quantile differs from another's. Random bits come from a
//! seed, so a report is the same bytes every time.
//!
//! The bootstrap never resamples. Drawing n values with replacement from a sorted sample and
//! taking the k-th smallest is the same as taking the sample's value at `floor(U·n)`, where U is
//! the k-th smallest of n uniform draws, and that is Beta(k, n − k + 1) distributed (the floor
//! is monotone, so it keeps the order). One Beta draw per replicate gives the exact bootstrap
//! distribution of a quantile, at a cost that does not grow with the sample: a million waits
//! cost what a hundred do.
//!
//! `compare` puts these to work on wait figures per bucket, for the simulation's and the live
//! experiments' reports; `means` gives averages over searches (a merge's recall) their
//! intervals, by resampling.

pub mod compare;
pub mod means;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Beta, Distribution};

/// Replicates per interval: enough for a stable 2.5th and 97.5th percentile.
pub const BOOTSTRAP_REPLICATES: usize = 2_000;
/// The interval's coverage, in percent.
pub const CONFIDENCE_PERCENT: f64 = 95.0;

/// The nearest-rank `q` quantile of sorted `values`; 0 for none.
pub fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[rank(sorted.len(), q) - 1]
}

/// The 1-based nearest rank of the `q` quantile among `n` values (`n` > 0).
pub(crate) fn rank(n: usize, q: f64) -> usize {
    ((q * n as f64).ceil() as usize).clamp(1, n)
}

/// Draws the `q` quantile of bootstrap resamples of `sorted` (not empty), one per call.
struct QuantileDraw<'a> {
    sorted: &'a [u64],
    beta: Beta<f64>,
}

impl<'a> QuantileDraw<'a> {
    fn new(sorted: &'a [u64], q: f64) -> Option<QuantileDraw<'a>> {
        debug_assert!(sorted.is_sorted(), "a quantile draw reads a sorted sample");
        let n = sorted.len();
        if n == 0 {
            return None;
        }
        let k = rank(n, q);
        let beta = Beta::new(k as f64, (n - k + 1) as f64).ok()?;
        Some(QuantileDraw { sorted, beta })
    }

    fn draw(&self, rng: &mut StdRng) -> u64 {
        let n = self.sorted.len();
        let u: f64 = self.beta.sample(rng);
        self.sorted[((u * n as f64) as usize).min(n - 1)]
    }
}

/// The 95 % percentile-bootstrap interval of `(q(second) − q(first)) / q(first)`, in percent,
/// for the `q` quantile of two independent sorted samples. None when either is empty or the
/// first's quantile is 0 in more than 2.5 % of the replicates (a change from 0 has no percent).
pub fn change_interval_percent(
    first: &[u64],
    second: &[u64],
    q: f64,
    seed: u64,
) -> Option<[f64; 2]> {
    let first = QuantileDraw::new(first, q)?;
    let second = QuantileDraw::new(second, q)?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut changes: Vec<f64> = Vec::with_capacity(BOOTSTRAP_REPLICATES);
    let mut undefined = 0_usize;
    for _ in 0..BOOTSTRAP_REPLICATES {
        let (a, b) = (first.draw(&mut rng), second.draw(&mut rng));
        if a == 0 {
            undefined += 1;
            continue;
        }
        changes.push((b as f64 - a as f64) / a as f64 * 100.0);
    }
    let tail = (100.0 - CONFIDENCE_PERCENT) / 200.0;
    if undefined as f64 > tail * BOOTSTRAP_REPLICATES as f64 {
        return None;
    }
    changes.sort_by(f64::total_cmp);
    let at = |p: f64| changes[rank(changes.len(), p) - 1];
    Some([round1(at(tail)), round1(at(1.0 - tail))])
}

fn round1(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn sample(n: usize, scale: f64, seed: u64) -> Vec<u64> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut values: Vec<u64> = (0..n)
            .map(|_| {
                // Exponential waits, 1 s mean at scale 1.
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                (-u.ln() * 1_000.0 * scale) as u64
            })
            .collect();
        values.sort_unstable();
        values
    }

    #[test]
    fn nearest_rank_quantiles() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&values, 0.5), 50);
        assert_eq!(quantile(&values, 0.99), 99);
        assert_eq!(quantile(&values, 1.0), 100);
        assert_eq!(quantile(&values, 0.0), 1);
        assert_eq!(quantile(&[], 0.5), 0);
    }

    #[test]
    fn the_interval_holds_a_real_change_and_no_change_where_there_is_none() {
        let first = sample(20_000, 1.0, 1);
        let halved = sample(20_000, 0.5, 2);
        let same = sample(20_000, 1.0, 3);
        let [low, high] = change_interval_percent(&first, &halved, 0.99, 7).unwrap();
        assert!(
            low < -50.0 + 8.0 && high > -50.0 - 8.0 && high < 0.0,
            "{low} {high}"
        );
        let [low, high] = change_interval_percent(&first, &same, 0.99, 7).unwrap();
        assert!(low < 0.0 && high > 0.0, "{low} {high}");
        let [low, high] = change_interval_percent(&first, &same, 0.5, 7).unwrap();
        assert!(low < 0.0 && high > 0.0 && high - low < 10.0, "{low} {high}");
        // One seed, one interval.
        assert_eq!(
            change_interval_percent(&first, &halved, 0.99, 7),
            change_interval_percent(&first, &halved, 0.99, 7)
        );
    }

    /// The Beta draw gives what resampling gives: the bootstrap distribution of the p90 of
    /// 200 values, by both, agrees in its 5th, 50th and 95th percentiles.
    #[test]
    fn a_beta_draw_is_the_resampled_quantile() {
        let values = sample(200, 1.0, 11);
        let draw = QuantileDraw::new(&values, 0.9).unwrap();
        let mut rng = StdRng::seed_from_u64(5);
        let replicates = 20_000;
        let mut by_beta: Vec<u64> = (0..replicates).map(|_| draw.draw(&mut rng)).collect();
        let mut by_resampling: Vec<u64> = (0..replicates)
            .map(|_| {
                let mut resample: Vec<u64> = (0..values.len())
                    .map(|_| values[rng.random_range(0..values.len())])
                    .collect();
                resample.sort_unstable();
                quantile(&resample, 0.9)
            })
            .collect();
        by_beta.sort_unstable();
        by_resampling.sort_unstable();
        for p in [0.05, 0.5, 0.95] {
            let (a, b) = (quantile(&by_beta, p), quantile(&by_resampling, p));
            // Neighbouring order statistics of this sample lie ~2 % apart near the p90.
            let gap = a.abs_diff(b) as f64 / b as f64;
            assert!(gap < 0.04, "p{p}: by beta {a}, by resampling {b}");
        }
    }

    #[test]
    fn no_interval_for_an_empty_sample_or_a_change_from_zero() {
        let some = sample(100, 1.0, 1);
        assert_eq!(change_interval_percent(&[], &some, 0.5, 1), None);
        assert_eq!(change_interval_percent(&some, &[], 0.5, 1), None);
        assert_eq!(change_interval_percent(&[0; 100], &some, 0.5, 1), None);
    }
}
