//! Latency inside the server that no route's timing shows: how long each group-commit sync
//! takes (the disk's share of every acknowledged write), and how long a claim that found work
//! took from reaching the scheduler to its durable lease (a claim's HTTP time also counts
//! the long-poll wait for work, which says nothing about the server).

use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

const LATENCY_BUCKETS_S: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

#[derive(Debug)]
pub struct PipelineMetrics {
    sync: Histogram,
    claim_grant: Histogram,
}

impl Default for PipelineMetrics {
    fn default() -> Self {
        PipelineMetrics {
            sync: Histogram::new(LATENCY_BUCKETS_S),
            claim_grant: Histogram::new(LATENCY_BUCKETS_S),
        }
    }
}

impl PipelineMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "store_sync_seconds",
            "Time of one group-commit sync (write-ahead log fdatasync), which every write's answer waits on",
            self.sync.clone(),
        );
        registry.register(
            "claim_grant_seconds",
            "Time from a claim that found work having work (its arrival, or the queueing that woke its long poll) to its answer being ready",
            self.claim_grant.clone(),
        );
    }

    pub fn observe_sync(&self, seconds: f64) {
        self.sync.observe(seconds);
    }

    pub fn observe_claim_grant(&self, seconds: f64) {
        self.claim_grant.observe(seconds);
    }
}
