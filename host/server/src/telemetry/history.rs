//! The last 15 minutes for the status page's charts: queued tasks, claims and wait p50/p99 per
//! bucket, one sample an interval, in a ring bounded in samples (and so in bytes). Waits are
//! counted in log-spaced bins (at most 1/16 apart), so an interval costs the same memory
//! whether it saw ten claims or a million.

use serde::Serialize;
use sluice_model::Priority;
use std::collections::VecDeque;
use std::sync::Mutex;

/// How far back the charts reach.
pub const HISTORY_SPAN_MS: u64 = 15 * 60_000;
/// The sampler's default interval.
pub const DEFAULT_HISTORY_INTERVAL_MS: u64 = 5_000;
/// The shortest interval a server may sample at (tests use it); the ring holds a span of it.
pub const MIN_HISTORY_INTERVAL_MS: u64 = 100;
/// Samples kept at most: a span at one sample a second. A shorter interval keeps a shorter
/// span, never more samples.
pub const MAX_HISTORY_SAMPLES: usize = (HISTORY_SPAN_MS / 1_000) as usize;

/// Waits below this many ms each have a bin of their own.
const EXACT_MS: u64 = 32;
/// Bins per doubling above `EXACT_MS`.
const SUB_BINS: u64 = 16;
/// Enough doublings for waits of 2^44 ms (557 years).
const BINS: usize = (EXACT_MS + SUB_BINS * (44 - 5)) as usize;

fn bin_of(wait_ms: u64) -> usize {
    if wait_ms < EXACT_MS {
        return wait_ms as usize;
    }
    let doubling = u64::from(63 - wait_ms.leading_zeros());
    let sub = (wait_ms >> (doubling - 4)) & (SUB_BINS - 1);
    ((EXACT_MS + (doubling - 5) * SUB_BINS + sub) as usize).min(BINS - 1)
}

/// The middle of `bin`'s range of waits.
fn bin_value_ms(bin: usize) -> u64 {
    let bin = bin as u64;
    if bin < EXACT_MS {
        return bin;
    }
    let doubling = (bin - EXACT_MS) / SUB_BINS + 5;
    let sub = (bin - EXACT_MS) % SUB_BINS;
    let width = 1_u64 << (doubling - 4);
    (SUB_BINS + sub) * width + width / 2
}

/// One bucket's waits of one interval.
#[derive(Clone)]
struct WaitBins {
    counts: Box<[u32; BINS]>,
    total: u64,
}

impl Default for WaitBins {
    fn default() -> Self {
        WaitBins {
            counts: Box::new([0; BINS]),
            total: 0,
        }
    }
}

impl WaitBins {
    fn add(&mut self, wait_ms: u64) {
        let count = &mut self.counts[bin_of(wait_ms)];
        *count = count.saturating_add(1);
        self.total += 1;
    }

    /// The nearest-rank `q` quantile, as its bin's middle; none with no waits.
    fn quantile_ms(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0_u64;
        for (bin, &count) in self.counts.iter().enumerate() {
            seen += u64::from(count);
            if seen >= rank {
                return Some(bin_value_ms(bin));
            }
        }
        None
    }
}

/// One bucket in one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct BucketSample {
    /// Tasks waiting in the bucket when the sample was taken.
    pub queued: u64,
    /// First claims of the bucket's tasks in the interval.
    pub claimed: u64,
    /// Their waits from submission, within 1/16 (none without claims).
    pub wait_ms_p50: Option<u64>,
    pub wait_ms_p99: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Sample {
    /// The interval's end.
    pub at_ms: u64,
    pub urgent: BucketSample,
    pub normal: BucketSample,
    pub low: BucketSample,
}

/// `GET /v1/stats/history`: the samples, oldest first.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct HistoryView {
    pub interval_ms: u64,
    pub span_ms: u64,
    pub samples: Vec<Sample>,
}

#[derive(Default)]
struct Inner {
    interval_ms: u64,
    samples: VecDeque<Sample>,
    waits: [WaitBins; 3],
}

/// Written by the writer (waits, as it commits first claims) and by the sampler (one sample
/// an interval); read by the API.
#[derive(Default)]
pub struct History {
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").finish_non_exhaustive()
    }
}

impl History {
    /// Counts a first claim of a `bucket` task that waited `wait_ms`.
    pub fn record_wait(&self, bucket: Priority, wait_ms: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.waits[bucket.index()].add(wait_ms);
    }

    /// Ends the interval at `now_ms` with the queues as they are (`queued`, by bucket index),
    /// dropping samples past the span of `interval_ms` or the ring's size.
    pub fn sample(&self, now_ms: u64, interval_ms: u64, queued: [u64; 3]) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let waits = std::mem::take(&mut inner.waits);
        let bucket = |priority: Priority| {
            let bins = &waits[priority.index()];
            BucketSample {
                queued: queued[priority.index()],
                claimed: bins.total,
                wait_ms_p50: bins.quantile_ms(0.50),
                wait_ms_p99: bins.quantile_ms(0.99),
            }
        };
        let sample = Sample {
            at_ms: now_ms,
            urgent: bucket(Priority::Urgent),
            normal: bucket(Priority::Normal),
            low: bucket(Priority::Low),
        };
        inner.interval_ms = interval_ms;
        let keep = ((HISTORY_SPAN_MS / interval_ms.max(1)) as usize).clamp(1, MAX_HISTORY_SAMPLES);
        inner.samples.push_back(sample);
        while inner.samples.len() > keep {
            inner.samples.pop_front();
        }
        debug_assert!(inner.samples.len() <= MAX_HISTORY_SAMPLES);
    }

    pub fn view(&self) -> HistoryView {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        HistoryView {
            interval_ms: inner.interval_ms,
            span_ms: HISTORY_SPAN_MS,
            samples: inner.samples.iter().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bins_middle_is_within_a_sixteenth_of_every_wait_in_it() {
        let mut last_bin = 0;
        for wait_ms in (0..200_000).chain([3_600_000, 86_400_000, 1 << 43]) {
            let bin = bin_of(wait_ms);
            assert!(
                bin >= last_bin || wait_ms > 200_000,
                "bins grow with the wait"
            );
            last_bin = bin;
            let middle = bin_value_ms(bin);
            let error = middle.abs_diff(wait_ms) as f64 / wait_ms.max(1) as f64;
            assert!(error <= 1.0 / 16.0, "{wait_ms} ms in a bin of {middle} ms");
        }
        assert_eq!(bin_of(u64::MAX), BINS - 1);
    }

    #[test]
    fn samples_hold_each_intervals_waits_and_the_ring_keeps_the_span() {
        let history = History::default();
        for wait_ms in 1..=100 {
            history.record_wait(Priority::Low, wait_ms * 100);
        }
        history.record_wait(Priority::Urgent, 7);
        history.sample(1_000, 1_000, [1, 2, 3]);
        history.sample(2_000, 1_000, [0, 0, 0]);
        let view = history.view();
        let [first, second] = view.samples[..] else {
            panic!("{:?}", view.samples);
        };
        assert_eq!(first.low.claimed, 100);
        let p50 = first.low.wait_ms_p50.unwrap();
        assert!(p50.abs_diff(5_000) <= 5_000 / 16, "{p50}");
        let p99 = first.low.wait_ms_p99.unwrap();
        assert!(p99.abs_diff(9_900) <= 9_900 / 16, "{p99}");
        assert_eq!(first.urgent.wait_ms_p99, Some(7));
        assert_eq!((first.urgent.queued, first.low.queued), (1, 3));
        assert_eq!(first.normal.wait_ms_p50, None);
        // The next interval starts empty.
        assert_eq!(second.low.claimed, 0);
        assert_eq!(second.low.wait_ms_p99, None);
        for n in 0..2_000 {
            history.sample(3_000 + n * 1_000, 1_000, [0; 3]);
        }
        let view = history.view();
        assert_eq!(view.samples.len(), (HISTORY_SPAN_MS / 1_000) as usize);
        assert_eq!(view.samples.last().unwrap().at_ms, 3_000 + 1_999 * 1_000);
        // At 5 s, 15 minutes are 180 samples.
        history.sample(9_999_999, 5_000, [0; 3]);
        assert_eq!(history.view().samples.len(), 180);
    }
}
