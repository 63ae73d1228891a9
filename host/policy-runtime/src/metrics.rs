//! Policy metrics: calls, faults and decision latency per policy kind and version.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VersionLabels {
    pub kind: &'static str,
    pub version: u32,
}

/// From a fraction of a microsecond (one packed call) to the 10 ms call deadline and past it.
const LATENCY_BUCKETS_S: [f64; 12] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 2.5e-3, 1e-2, 5e-2,
];

/// One decision in this many is timed for the latency histogram: timing every one would cost
/// a fifth of a single decision.
pub const TIMED_ONE_IN: u64 = 16;

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_S)
}

#[derive(Debug)]
pub struct PolicyMetrics {
    calls: Family<VersionLabels, Counter>,
    faults: Family<VersionLabels, Counter>,
    latency: Family<VersionLabels, Histogram, fn() -> Histogram>,
}

impl Default for PolicyMetrics {
    fn default() -> Self {
        PolicyMetrics {
            calls: Family::default(),
            faults: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl PolicyMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "policy_calls",
            "Calls into a policy version (a batch is one call)",
            self.calls.clone(),
        );
        registry.register(
            "policy_faults",
            "Calls that trapped, ran out of fuel or memory, or answered something unusable",
            self.faults.clone(),
        );
        registry.register(
            "policy_decision_latency_seconds",
            format!(
                "Time of one call into a policy version, faulted or not: one decision in \
                 {TIMED_ONE_IN} is timed, and every call of a stand-in version"
            ),
            self.latency.clone(),
        );
    }

    /// The series of `version` of `kind`, created now, so a new version shows zero calls and
    /// faults before its first call. The handles are kept by the version, so a call records
    /// without looking its labels up.
    pub fn version(&self, kind: &'static str, version: u32) -> VersionMetrics {
        let labels = VersionLabels { kind, version };
        VersionMetrics {
            calls: self.calls.get_or_create_owned(&labels),
            faults: self.faults.get_or_create_owned(&labels),
            latency: self.latency.get_or_create_owned(&labels),
        }
    }
}

/// One version's series.
#[derive(Clone, Debug)]
pub struct VersionMetrics {
    calls: Counter,
    faults: Counter,
    latency: Histogram,
}

impl VersionMetrics {
    /// One call, which faulted or not, and took `elapsed` if it was timed.
    pub fn record(&self, elapsed: Option<Duration>, faulted: bool) {
        self.calls.inc();
        if let Some(elapsed) = elapsed {
            self.latency.observe(elapsed.as_secs_f64());
        }
        if faulted {
            self.faults.inc();
        }
    }
}
