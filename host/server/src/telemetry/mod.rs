//! Prometheus metrics: the families each layer records into (tasks by the writer, policies by
//! their slots, HTTP by a middleware), the gauges of the present state, and the scrape that
//! renders them all in the OpenMetrics text format.
//!
//! Every server owns its own registry (no process-wide recorder), so several servers in one
//! process — tests, embedders — keep their figures apart.

mod history;
mod http;
mod labels;
mod pipeline;
mod state;
mod tasks;

pub use history::{
    BucketSample, DEFAULT_HISTORY_INTERVAL_MS, History, HistoryView, MIN_HISTORY_INTERVAL_MS,
    Sample,
};
pub use http::{HttpMetrics, track};
pub use labels::{LabelBudget, OTHER, failure_reason};
pub use pipeline::PipelineMetrics;
pub use sluice_policy_runtime::PolicyMetrics;
pub use state::Present;
pub use tasks::TaskMetrics;

use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex};

pub use sluice_model::TASK_SPANS;

/// The content type of `render`'s text.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug)]
pub struct Metrics {
    pub tasks: Arc<TaskMetrics>,
    pub policies: Arc<PolicyMetrics>,
    pub http: Arc<HttpMetrics>,
    pub pipeline: Arc<PipelineMetrics>,
    state: state::StateGauges,
    registry: Registry,
    /// Scrapes take turns: each one clears and refills the state gauges.
    scrape: Mutex<()>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let tasks = Arc::new(TaskMetrics::default());
        let policies = Arc::new(PolicyMetrics::default());
        let http = Arc::new(HttpMetrics::default());
        let pipeline = Arc::new(PipelineMetrics::default());
        let state = state::StateGauges::default();
        let mut registry = Registry::with_prefix("sluice");
        tasks.register(&mut registry);
        policies.register(&mut registry);
        http.register(&mut registry);
        pipeline.register(&mut registry);
        state.register(&mut registry);
        Metrics {
            tasks,
            policies,
            http,
            pipeline,
            state,
            registry,
            scrape: Mutex::new(()),
        }
    }

    /// Every metric, with the state gauges set to `present`.
    pub fn render(&self, present: &Present<'_>) -> Result<String, std::fmt::Error> {
        let _turn = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.state.set(present);
        let mut text = String::with_capacity(16 * 1024);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
