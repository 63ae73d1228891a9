//! Smooth weighted round robin over the three buckets: over any run of picks each bucket gets
//! its weight's share, interleaved rather than in bursts. A bucket with nothing to offer
//! sits the round out, so its share goes to the others.

use sluice_model::Priority;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmoothWrr {
    current: [i64; 3],
}

impl SmoothWrr {
    /// The bucket to serve next among the `eligible` ones. Buckets whose weight is 0 are
    /// served only when no eligible bucket has a weight, most urgent first.
    pub fn pick(&mut self, weights: [u32; 3], eligible: [bool; 3]) -> Option<Priority> {
        let total: i64 = (0..3)
            .filter(|&b| eligible[b])
            .map(|b| i64::from(weights[b]))
            .sum();
        if total == 0 {
            return (0..3).find(|&b| eligible[b]).and_then(Priority::from_index);
        }
        let mut best: Option<usize> = None;
        for b in 0..3 {
            if !eligible[b] || weights[b] == 0 {
                continue;
            }
            self.current[b] += i64::from(weights[b]);
            if best.is_none_or(|chosen| self.current[b] > self.current[chosen]) {
                best = Some(b);
            }
        }
        let chosen = best?;
        self.current[chosen] -= total;
        Priority::from_index(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(weights: [u32; 3], eligible: [bool; 3], picks: usize) -> [usize; 3] {
        let mut wrr = SmoothWrr::default();
        let mut counts = [0; 3];
        for _ in 0..picks {
            if let Some(bucket) = wrr.pick(weights, eligible) {
                counts[bucket.index()] += 1;
            }
        }
        counts
    }

    #[test]
    fn shares_follow_the_weights_exactly_over_a_full_cycle() {
        assert_eq!(shares([60, 35, 5], [true; 3], 100), [60, 35, 5]);
        assert_eq!(shares([60, 35, 5], [true; 3], 10_000), [6_000, 3_500, 500]);
    }

    #[test]
    fn picks_are_interleaved_not_bursts() {
        let mut wrr = SmoothWrr::default();
        let first: Vec<usize> = (0..10)
            .filter_map(|_| wrr.pick([50, 50, 0], [true; 3]))
            .map(Priority::index)
            .collect();
        assert_eq!(first, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
    }

    #[test]
    fn an_empty_bucket_gives_its_share_to_the_others() {
        assert_eq!(shares([60, 35, 5], [true, false, true], 65), [60, 0, 5]);
        assert_eq!(shares([60, 35, 5], [false, false, true], 7), [0, 0, 7]);
        assert_eq!(shares([100, 0, 0], [false, true, true], 4), [0, 4, 0]);
        assert_eq!(shares([60, 35, 5], [false; 3], 4), [0, 0, 0]);
    }
}
