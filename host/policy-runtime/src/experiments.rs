//! Experiments through the registry: starting one (its variants loaded into its kind's slot),
//! stopping it, promoting a variant to active, and resuming the running ones at start. Each
//! takes the registry's lock and is a policy event, so it reaches the log and survives a crash.

use super::instance::Policy;
use super::registry::{PolicyRegistry, RegistryError, on_slot};
use super::slot::{Loaded, Slot};
use super::trial::{Arm, ArmFigures, Trial};
use sluice_model::{
    BUILTIN_VERSION, Experiment, ExperimentEnd, ExperimentMode, ExperimentSpec, MAX_EXPERIMENTS,
    PolicyAction, PolicyEvent, RolloutStep,
};
use std::sync::Arc;

/// Ended experiments whose variants' counters are kept for their reports.
const ENDED_FIGURES_KEPT: usize = 32;

impl PolicyRegistry {
    /// Every experiment, in id order.
    pub fn experiments(&self) -> Result<Vec<Experiment>, RegistryError> {
        Ok(self.catalog.experiments()?)
    }

    pub fn experiment(&self, id: u32) -> Result<Experiment, RegistryError> {
        self.catalog
            .experiments()?
            .into_iter()
            .find(|e| e.id == id)
            .ok_or(RegistryError::UnknownExperiment(id))
    }

    /// The running live experiments, for assigning new tasks (no lock, no allocation).
    pub fn live_experiments(&self) -> arc_swap::Guard<Arc<Vec<Experiment>>> {
        self.live.load()
    }

    /// What each variant's version did, while the experiment runs or shortly after it ended
    /// (since this server started); none when nothing was kept.
    pub fn variant_figures(&self, experiment: &Experiment) -> Option<Vec<ArmFigures>> {
        let running = on_slot!(self, experiment.kind, slot => slot.trial()
            .filter(|t| t.experiment.id == experiment.id)
            .map(|t| t.figures()));
        running.or_else(|| {
            let ended = self.ended_figures.lock().unwrap_or_else(|p| p.into_inner());
            ended
                .iter()
                .find(|(id, _)| *id == experiment.id)
                .map(|(_, figures)| figures.clone())
        })
    }

    /// Starts an experiment: every variant's version must exist and load. One per kind.
    pub fn start_experiment(
        &self,
        spec: ExperimentSpec,
        now_ms: u64,
    ) -> Result<Experiment, RegistryError> {
        spec.check().map_err(RegistryError::ExperimentRefused)?;
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        self.start_locked(spec, None, now_ms)
    }

    /// `start_experiment` with the registry's lock held; `rollout`: the step of a rollout it
    /// is (a `rollout` id of 0 is this experiment's own, for a rollout's first step).
    pub(super) fn start_locked(
        &self,
        spec: ExperimentSpec,
        rollout: Option<RolloutStep>,
        now_ms: u64,
    ) -> Result<Experiment, RegistryError> {
        let all = self.catalog.experiments()?;
        if let Some(running) = all.iter().find(|e| e.kind == spec.kind && e.is_running()) {
            return Err(RegistryError::ExperimentConflict(format!(
                "experiment {} of the {} policy is running; stop or promote it first (one per kind)",
                running.id, spec.kind
            )));
        }
        if all.len() >= MAX_EXPERIMENTS {
            return Err(RegistryError::ExperimentConflict(format!(
                "the server holds {MAX_EXPERIMENTS} experiments, its most"
            )));
        }
        for variant in &spec.variants {
            if variant.version != BUILTIN_VERSION
                && self.version(spec.kind, variant.version)?.is_none()
            {
                return Err(RegistryError::UnknownVersion {
                    kind: spec.kind,
                    version: variant.version,
                });
            }
        }
        let id = all.iter().map(|e| e.id).max().unwrap_or(0) + 1;
        let experiment = Experiment {
            id,
            kind: spec.kind,
            variants: spec.variants,
            assign_by: spec.assign_by,
            mode: spec.mode,
            started_at_ms: now_ms,
            ended_at_ms: None,
            end: None,
            rollout: rollout.map(|step| RolloutStep {
                rollout: if step.rollout == 0 { id } else { step.rollout },
                ..step
            }),
        };
        // Loaded before anything is stored: a variant that cannot load refuses the start.
        on_slot!(self, experiment.kind, slot => {
            let trial = self.trial_of(slot, &experiment, false)?;
            self.record(&experiment, PolicyAction::ExperimentStarted, experiment.variants[0].version, now_ms)?;
            slot.install_trial(Some(trial));
        });
        self.refresh_live()?;
        tracing::info!(experiment = %experiment.describe(), "experiment started");
        Ok(experiment)
    }

    /// Ends a running experiment; the active version stays as it is.
    pub fn stop_experiment(&self, id: u32, now_ms: u64) -> Result<Experiment, RegistryError> {
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let mut experiment = self.running(id)?;
        let active = self.status(experiment.kind).active_version;
        experiment.ended_at_ms = Some(now_ms);
        experiment.end = Some(ExperimentEnd::Stopped);
        self.record(&experiment, PolicyAction::ExperimentStopped, active, now_ms)?;
        self.end_trial(&experiment)?;
        Ok(experiment)
    }

    /// Makes variant `name`'s version the active one of the kind and ends the experiment.
    /// The activation is written first: a crash between the two leaves the winner active and
    /// the experiment running, to be promoted or stopped again.
    pub fn promote_experiment(
        &self,
        id: u32,
        name: &str,
        now_ms: u64,
    ) -> Result<Experiment, RegistryError> {
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let mut experiment = self.running(id)?;
        let Some(variant) = experiment.variants.iter().find(|v| v.name == name).cloned() else {
            let names: Vec<&str> = experiment
                .variants
                .iter()
                .map(|v| v.name.as_str())
                .collect();
            return Err(RegistryError::ExperimentRefused(format!(
                "experiment {id} has no variant `{}`; its variants are {}",
                name.chars().take(64).collect::<String>(),
                names.join(", ")
            )));
        };
        let reason = format!("promoted variant {} of experiment {id}", variant.name);
        self.activate_locked(experiment.kind, variant.version, now_ms, Some(reason))?;
        experiment.ended_at_ms = Some(now_ms);
        experiment.end = Some(ExperimentEnd::Promoted {
            variant: variant.name.clone(),
            version: variant.version,
            judged: Vec::new(),
        });
        self.record(
            &experiment,
            PolicyAction::ExperimentPromoted,
            variant.version,
            now_ms,
        )?;
        self.end_trial(&experiment)?;
        Ok(experiment)
    }

    /// At start: each running experiment back in its slot. A variant that no longer loads is
    /// left out (logged); its tasks are decided by the active chain.
    pub(super) fn resume_experiments(&self) -> Result<(), RegistryError> {
        for experiment in self.catalog.experiments()? {
            if experiment.is_running() {
                on_slot!(self, experiment.kind, slot => {
                    let trial = self.trial_of(slot, &experiment, true)?;
                    slot.install_trial(Some(trial));
                });
            }
        }
        self.refresh_live()
    }

    pub(super) fn running(&self, id: u32) -> Result<Experiment, RegistryError> {
        let experiment = self.experiment(id)?;
        if !experiment.is_running() {
            return Err(RegistryError::ExperimentConflict(format!(
                "experiment {id} has already ended"
            )));
        }
        Ok(experiment)
    }

    fn record(
        &self,
        experiment: &Experiment,
        action: PolicyAction,
        version: u32,
        now_ms: u64,
    ) -> Result<(), RegistryError> {
        self.record_because(experiment, action, version, now_ms, experiment.describe())
    }

    /// Stores the experiment's record with a policy event saying `reason`, as one write.
    pub(super) fn record_because(
        &self,
        experiment: &Experiment,
        action: PolicyAction,
        version: u32,
        now_ms: u64,
        reason: String,
    ) -> Result<(), RegistryError> {
        let event = PolicyEvent {
            seq: 0,
            kind: experiment.kind,
            action,
            version,
            from: None,
            at_ms: now_ms,
            reason: Some(reason),
            signed_by: None,
        };
        self.catalog.put_experiment(experiment, event)?;
        Ok(())
    }

    /// Takes an ended experiment out of its slot, keeping its variants' counters a while.
    pub(super) fn end_trial(&self, experiment: &Experiment) -> Result<(), RegistryError> {
        let figures = self.variant_figures(experiment).unwrap_or_default();
        on_slot!(self, experiment.kind, slot => slot.install_trial(None));
        let mut ended = self.ended_figures.lock().unwrap_or_else(|p| p.into_inner());
        ended.push_back((experiment.id, figures));
        while ended.len() > ENDED_FIGURES_KEPT {
            ended.pop_front();
        }
        drop(ended);
        self.refresh_live()?;
        tracing::info!(experiment = %experiment.describe(), end = ?experiment.end, "experiment ended");
        Ok(())
    }

    fn refresh_live(&self) -> Result<(), RegistryError> {
        let live: Vec<Experiment> = self
            .catalog
            .experiments()?
            .into_iter()
            .filter(|e| e.is_running() && e.mode == ExperimentMode::Live)
            .collect();
        self.live.store(Arc::new(live));
        Ok(())
    }

    /// The experiment's variants loaded for `slot`: a version already in the chain is shared
    /// with it (the built-in one always is); another is loaded anew.
    fn trial_of<P: Policy>(
        &self,
        slot: &Slot<P>,
        experiment: &Experiment,
        lenient: bool,
    ) -> Result<Trial<P>, RegistryError> {
        let chain = slot.chain();
        let mut arms = Vec::with_capacity(experiment.variants.len());
        for variant in &experiment.variants {
            let shared = chain
                .links
                .iter()
                .find(|l| l.version == variant.version)
                .cloned();
            let loaded: Result<Arc<Loaded<P>>, RegistryError> = match shared {
                Some(loaded) => Ok(loaded),
                None => self.load::<P>(variant.version).map(Arc::new),
            };
            match loaded {
                Ok(loaded) => arms.push(Arm::new(Some(loaded))),
                Err(error) if lenient => {
                    tracing::error!(%error, experiment = experiment.id, variant = %variant.name,
                        "experiment variant left out: the active version decides for its tasks");
                    arms.push(Arm::new(None));
                }
                Err(error) => return Err(error),
            }
        }
        Ok(Trial {
            experiment: experiment.clone(),
            arms,
            scores: super::merge_scores::MergeScores::default(),
        })
    }
}
