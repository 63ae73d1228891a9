//! Guarded rollouts through the registry: a rollout's steps are live experiments of the active
//! version (variant `baseline`) against the new one (variant `candidate`, weighted by the
//! step's share). Starting one, moving it a step on, rolling it back and finishing it are each
//! taken under the registry's lock and logged as policy events; the server judges the guards.

use super::registry::{PolicyRegistry, RegistryError};
use sluice_model::{
    AssignBy, BUILTIN_VERSION, Experiment, ExperimentEnd, ExperimentMode, ExperimentSpec,
    PolicyAction, PolicyKind, RolloutSpec, RolloutStep, VariantSpec,
};

/// The variants' names in a rollout's experiments.
pub const BASELINE: &str = "baseline";
pub const CANDIDATE: &str = "candidate";

impl PolicyRegistry {
    /// Starts a rollout: its first step's experiment, the kind's active version as baseline.
    pub fn start_rollout(
        &self,
        spec: RolloutSpec,
        now_ms: u64,
    ) -> Result<Experiment, RegistryError> {
        spec.check().map_err(RegistryError::ExperimentRefused)?;
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let baseline = self.status(spec.kind).active_version;
        if spec.version == baseline {
            return Err(RegistryError::ExperimentRefused(format!(
                "version {} is already the active {} policy; a rollout moves from the active version to another",
                spec.version, spec.kind
            )));
        }
        if spec.version != BUILTIN_VERSION && self.version(spec.kind, spec.version)?.is_none() {
            return Err(RegistryError::UnknownVersion {
                kind: spec.kind,
                version: spec.version,
            });
        }
        let step = RolloutStep {
            rollout: 0,
            step: 0,
            steps: spec.steps,
            step_ms: spec.step_ms,
            min_tasks: spec.min_tasks,
            guards: spec.guards,
        };
        self.start_step_locked(
            spec.kind,
            spec.assign_by,
            [baseline, spec.version],
            step,
            now_ms,
        )
    }

    /// Ends a step whose guards held (`judged`: how each was) and starts the next; after the
    /// last step below 100 % the new version becomes active instead. Answers the experiment
    /// now running, or the ended one when the rollout is complete.
    pub fn advance_rollout(
        &self,
        id: u32,
        judged: Vec<String>,
        now_ms: u64,
    ) -> Result<Experiment, RegistryError> {
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let mut experiment = self.running(id)?;
        let step = rollout_step(&experiment)?;
        let [baseline, candidate] = versions(&experiment);
        let why = format!(
            "rollout {} of v{candidate}: step {} ({} %) passed: {}",
            step.rollout,
            step.step + 1,
            step.share_percent(),
            judged_text(&judged)
        );
        experiment.ended_at_ms = Some(now_ms);
        if step.next_share_percent() >= 100 {
            let reason = format!("rollout {} reached 100 %", step.rollout);
            self.activate_locked(experiment.kind, candidate, now_ms, Some(reason))?;
            experiment.end = Some(ExperimentEnd::Promoted {
                variant: CANDIDATE.into(),
                version: candidate,
                judged,
            });
            self.record_because(
                &experiment,
                PolicyAction::ExperimentPromoted,
                candidate,
                now_ms,
                why,
            )?;
            self.end_trial(&experiment)?;
            tracing::info!(rollout = step.rollout, version = candidate, kind = %experiment.kind, "rollout complete: the version is active");
            return Ok(experiment);
        }
        experiment.end = Some(ExperimentEnd::Advanced { judged });
        self.record_because(
            &experiment,
            PolicyAction::RolloutAdvanced,
            baseline,
            now_ms,
            why,
        )?;
        self.end_trial(&experiment)?;
        let next = RolloutStep {
            step: step.step + 1,
            ..step
        };
        self.start_step_locked(
            experiment.kind,
            experiment.assign_by,
            [baseline, candidate],
            next,
            now_ms,
        )
    }

    /// Ends a step whose `guard` failed (`reason`: by how much): every task is the
    /// baseline's again, at once.
    pub fn roll_back_rollout(
        &self,
        id: u32,
        guard: String,
        reason: String,
        judged: Vec<String>,
        now_ms: u64,
    ) -> Result<Experiment, RegistryError> {
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let mut experiment = self.running(id)?;
        let step = rollout_step(&experiment)?;
        let [baseline, candidate] = versions(&experiment);
        let why = format!(
            "rollout {} of v{candidate} rolled back at step {} ({} %): {reason}",
            step.rollout,
            step.step + 1,
            step.share_percent()
        );
        experiment.ended_at_ms = Some(now_ms);
        experiment.end = Some(ExperimentEnd::RolledBack {
            guard,
            reason,
            judged,
        });
        self.record_because(
            &experiment,
            PolicyAction::RolloutRolledBack,
            baseline,
            now_ms,
            why.clone(),
        )?;
        self.end_trial(&experiment)?;
        tracing::warn!(rollout = step.rollout, kind = %experiment.kind, "{why}");
        Ok(experiment)
    }

    /// Starts the step after `ended`, a step that passed but whose successor never started
    /// (the server stopped between the two writes). None when one did.
    pub fn resume_rollout(
        &self,
        ended: &Experiment,
        now_ms: u64,
    ) -> Result<Option<Experiment>, RegistryError> {
        let _turn = self.mutations.lock().unwrap_or_else(|p| p.into_inner());
        let step = rollout_step(ended)?;
        let all = self.catalog.experiments()?;
        let succeeded = all.iter().any(|e| {
            e.id > ended.id
                && e.rollout
                    .as_ref()
                    .is_some_and(|r| r.rollout == step.rollout)
        });
        if succeeded || !matches!(ended.end, Some(ExperimentEnd::Advanced { .. })) {
            return Ok(None);
        }
        let next = RolloutStep {
            step: step.step + 1,
            ..step
        };
        self.start_step_locked(ended.kind, ended.assign_by, versions(ended), next, now_ms)
            .map(Some)
    }

    fn start_step_locked(
        &self,
        kind: PolicyKind,
        assign_by: AssignBy,
        [baseline, candidate]: [u32; 2],
        step: RolloutStep,
        now_ms: u64,
    ) -> Result<Experiment, RegistryError> {
        let share = step.share_percent();
        debug_assert!((1..100).contains(&share), "a step's share is 1 to 99 %");
        let spec = ExperimentSpec {
            kind,
            variants: vec![
                VariantSpec {
                    name: BASELINE.into(),
                    version: baseline,
                    weight: 100 - share,
                },
                VariantSpec {
                    name: CANDIDATE.into(),
                    version: candidate,
                    weight: share,
                },
            ],
            assign_by,
            mode: ExperimentMode::Live,
        };
        self.start_locked(spec, Some(step), now_ms)
    }
}

fn rollout_step(experiment: &Experiment) -> Result<RolloutStep, RegistryError> {
    experiment.rollout.clone().ok_or_else(|| {
        RegistryError::ExperimentRefused(format!(
            "experiment {} is not a step of a rollout",
            experiment.id
        ))
    })
}

/// The baseline's and the candidate's versions.
fn versions(experiment: &Experiment) -> [u32; 2] {
    [0, 1].map(|i| experiment.variants.get(i).map_or(0, |v| v.version))
}

fn judged_text(judged: &[String]) -> String {
    if judged.is_empty() {
        "no guards".into()
    } else {
        judged.join("; ")
    }
}
