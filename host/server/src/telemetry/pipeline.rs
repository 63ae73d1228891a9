//! Latency inside the server that no route's timing shows: how long each group-commit sync
//! takes (the disk's share of every acknowledged write), and how long a claim that found work
//! took from reaching the scheduler to its durable lease (a claim's HTTP time also counts
//! the long-poll wait for work, which says nothing about the server); and what claims hand
//! out: tasks per claim, GPU batch sizes per model, and how long batches waited to fill.

use super::labels::LabelBudget;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Tasks in one claim's answer, and in one batch (claims take at most 64): each size to 8,
/// the common batch sizes, then coarser.
const CLAIM_SIZE_BUCKETS: [f64; 14] = [
    1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0,
];

/// Models named in the batch-size family; later ones are `other`.
const MAX_MODEL_LABELS: usize = 64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// The batch's model, `none` for tasks that name none.
    pub model: String,
}

fn claim_size_histogram() -> Histogram {
    Histogram::new(CLAIM_SIZE_BUCKETS)
}

const LATENCY_BUCKETS_S: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

#[derive(Debug)]
pub struct PipelineMetrics {
    sync: Histogram,
    claim_grant: Histogram,
    claim_tasks: Histogram,
    batch_size: Family<ModelLabels, Histogram, fn() -> Histogram>,
    batch_fill_wait: Histogram,
    models: LabelBudget,
}

impl Default for PipelineMetrics {
    fn default() -> Self {
        PipelineMetrics {
            sync: Histogram::new(LATENCY_BUCKETS_S),
            claim_grant: Histogram::new(LATENCY_BUCKETS_S),
            claim_tasks: claim_size_histogram(),
            batch_size: Family::new_with_constructor(claim_size_histogram),
            batch_fill_wait: Histogram::new(LATENCY_BUCKETS_S),
            models: LabelBudget::new(MAX_MODEL_LABELS),
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
        registry.register(
            "claim_tasks",
            "Tasks in one claim's answer, for claims that got any",
            self.claim_tasks.clone(),
        );
        registry.register(
            "batch_size",
            "Tasks in one GPU batch handed to a worker, by model",
            self.batch_size.clone(),
        );
        registry.register(
            "batch_fill_wait_seconds",
            "How long a batch claim held a batch short of its size waiting for more tasks (0 when it was handed out at once)",
            self.batch_fill_wait.clone(),
        );
    }

    pub fn observe_sync(&self, seconds: f64) {
        self.sync.observe(seconds);
    }

    pub fn observe_claim_grant(&self, seconds: f64) {
        self.claim_grant.observe(seconds);
    }

    /// A claim's answer of `tasks` tasks (at least one).
    pub fn observe_claim_tasks(&self, tasks: usize) {
        self.claim_tasks.observe(tasks as f64);
    }

    /// A GPU batch of `tasks` tasks of `model`, held `fill_wait_s` to fill.
    pub fn observe_batch(&self, model: Option<&str>, tasks: usize, fill_wait_s: f64) {
        let model = self.models.label(model.unwrap_or("none"));
        self.batch_size
            .get_or_create(&ModelLabels { model })
            .observe(tasks as f64);
        self.batch_fill_wait.observe(fill_wait_s);
    }
}
