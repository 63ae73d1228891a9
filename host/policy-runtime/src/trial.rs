//! A running experiment inside its kind's slot: one loaded version per variant and what each
//! did. Live, a task's variant decides for it and falls back to the active chain when it
//! faults; shadow, every variant decides after the active answer on the same inputs and only
//! agreement is recorded. Counters live here, in memory: a restart starts them at 0 (the
//! report's task figures come from the task records and survive it).

use super::instance::Policy;
use super::merge_scores::{MergeFigures, MergeScores};
use super::metrics::PolicyMetrics;
use super::runtime::PolicyError;
use super::sample::Sample;
use super::slot::{Loaded, SlotAnswer};
use serde::Serialize;
use sluice_model::{Experiment, ExperimentMode, VariantTag};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Disagreements kept per variant: enough to see what differs (each answer in one is cut at
/// `sample::MAX_SAMPLE_ITEMS` items).
pub const MAX_DISAGREEMENT_SAMPLES: usize = 16;

/// One variant: its version, loaded (none when it could not be at start: its tasks are then
/// decided by the active chain, and each such decision counts as a fault), and its counters.
pub struct Arm<P> {
    pub loaded: Option<Arc<Loaded<P>>>,
    decisions_total: AtomicU64,
    faults_total: AtomicU64,
    compared_total: AtomicU64,
    disagreements_total: AtomicU64,
    samples: Mutex<Vec<serde_json::Value>>,
}

impl<P> Arm<P> {
    pub fn new(loaded: Option<Arc<Loaded<P>>>) -> Arm<P> {
        Arm {
            loaded,
            decisions_total: AtomicU64::new(0),
            faults_total: AtomicU64::new(0),
            compared_total: AtomicU64::new(0),
            disagreements_total: AtomicU64::new(0),
            samples: Mutex::new(Vec::new()),
        }
    }
}

/// What one variant's version did while the experiment ran (since the server started).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ArmFigures {
    /// Live: decisions it made for its tasks. Shadow: decisions it made beside the active one.
    pub decisions_total: u64,
    /// Calls that trapped, ran out of fuel or memory, or answered what the host refuses
    /// (the active chain decided instead).
    pub faults_total: u64,
    /// Shadow: answers compared with the active one, and how many differed.
    pub compared_total: u64,
    pub disagreements_total: u64,
    /// Shadow: the first disagreements, each `{"active": answer, "variant": answer}` with the
    /// answers as JSON (`sample.rs`).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub disagreement_samples: Vec<serde_json::Value>,
    /// A merge experiment: its merges of every scored search, judged by recall.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merge: Option<MergeFigures>,
}

pub struct Trial<P> {
    pub experiment: Experiment,
    pub arms: Vec<Arm<P>>,
    /// A merge experiment's scored searches (`merge_scores.rs`); empty for other kinds.
    pub scores: MergeScores,
}

impl<P: Policy> Trial<P> {
    pub fn figures(&self) -> Vec<ArmFigures> {
        let names: Vec<&str> = self
            .experiment
            .variants
            .iter()
            .map(|v| v.name.as_str())
            .collect();
        let mut merge = self.scores.figures(&names).map(Vec::into_iter);
        self.arms
            .iter()
            .map(|arm| ArmFigures {
                decisions_total: arm.decisions_total.load(Ordering::Relaxed),
                faults_total: arm.faults_total.load(Ordering::Relaxed),
                compared_total: arm.compared_total.load(Ordering::Relaxed),
                disagreements_total: arm.disagreements_total.load(Ordering::Relaxed),
                disagreement_samples: arm
                    .samples
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
                merge: merge.as_mut().and_then(Iterator::next),
            })
            .collect()
    }

    /// Live: the answer of `tag`'s variant, when `tag` is of this experiment and the variant
    /// answers; none sends the decision to the active chain.
    pub fn decide_live<R, T>(
        &self,
        tag: VariantTag,
        metrics: &PolicyMetrics,
        call: &mut impl FnMut(&mut P) -> Result<R, PolicyError>,
        judge: &impl Fn(R) -> Result<T, String>,
    ) -> Option<SlotAnswer<T>> {
        if self.experiment.mode != ExperimentMode::Live || tag.experiment != self.experiment.id {
            return None;
        }
        let arm = self.arms.get(usize::from(tag.variant))?;
        let Some(loaded) = &arm.loaded else {
            arm.faults_total.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        arm.decisions_total.fetch_add(1, Ordering::Relaxed);
        let outcome = loaded.run(call, judge);
        loaded.metrics_in(metrics).record(None, outcome.is_err());
        match outcome {
            Ok(answer) => Some(SlotAnswer {
                answer,
                version: loaded.version,
                fallbacks: 0,
            }),
            Err(fault) => {
                arm.faults_total.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(kind = %P::KIND, experiment = self.experiment.id, variant = tag.variant,
                    version = loaded.version, %fault, "experiment variant faulted; the active version decides");
                None
            }
        }
    }

    /// Shadow: every variant decides on the same inputs after `active`; only agreement is
    /// kept. A variant of the version that answered is the active answer itself: skipped.
    pub fn shadow<R, T: PartialEq + Sample>(
        &self,
        active: &SlotAnswer<T>,
        metrics: &PolicyMetrics,
        call: &mut impl FnMut(&mut P) -> Result<R, PolicyError>,
        judge: &impl Fn(R) -> Result<T, String>,
    ) {
        if self.experiment.mode != ExperimentMode::Shadow {
            return;
        }
        for arm in &self.arms {
            let Some(loaded) = &arm.loaded else {
                continue;
            };
            if loaded.version == active.version {
                continue;
            }
            arm.decisions_total.fetch_add(1, Ordering::Relaxed);
            let outcome = loaded.run(call, judge);
            loaded.metrics_in(metrics).record(None, outcome.is_err());
            match outcome {
                Ok(answer) => {
                    arm.compared_total.fetch_add(1, Ordering::Relaxed);
                    if answer != active.answer {
                        arm.disagreements_total.fetch_add(1, Ordering::Relaxed);
                        let mut samples = arm.samples.lock().unwrap_or_else(|p| p.into_inner());
                        if samples.len() < MAX_DISAGREEMENT_SAMPLES {
                            samples.push(serde_json::json!({
                                "active": active.answer.sample(),
                                "variant": answer.sample(),
                            }));
                        }
                    }
                }
                Err(_) => {
                    arm.faults_total.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
