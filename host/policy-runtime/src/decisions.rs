//! Decisions through the registry: each kind's call packs its records, runs on the active
//! version's chain (falling back on a fault), and judges the answer before the host uses it.

use super::bindings::aging::exports::sluice::policy::aging::Promotion;
use super::bindings::split_layout;
use super::checks;
use super::registry::PolicyRegistry;
use super::runtime::PolicyError;
use super::slot::SlotAnswer;
use policy_packed::{
    Admission, Bucket, Decision, FAILURE_WORDS, Failure, Hit, VIEW_WORDS, View, pack,
};
use sluice_model::{NamesRef, VariantTag};

impl PolicyRegistry {
    /// The tenants' weights for fair share; `None` from a component without the export.
    pub fn tenant_weights(
        &self,
        now_ms: u64,
    ) -> Result<SlotAnswer<Option<sluice_engine::NamedWeights>>, PolicyError> {
        self.priority
            .decide(now_ms, |p| p.tenant_weights(), checks::tenant_weights)
    }

    pub fn bucket_weights(&self, now_ms: u64) -> Result<SlotAnswer<Vec<u32>>, PolicyError> {
        self.priority
            .decide(now_ms, |p| p.bucket_weights(), checks::bucket_weights)
    }

    /// One admission per task, in order; `names[i]`: task i's names. `variant`: the live
    /// priority experiment's variant these tasks were all assigned, if any.
    pub fn admit(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        tasks: &[View],
        names: &[NamesRef<'_>],
    ) -> Result<SlotAnswer<Vec<Admission>>, PolicyError> {
        debug_assert_eq!(tasks.len(), names.len(), "one task's names per view");
        if let ([task], [task_names]) = (tasks, names) {
            let words = task.words();
            return self.priority.decide_for(
                now_ms,
                variant,
                |p| p.admit_one(now_ms, words, *task_names),
                |(a, b, c)| checks::admissions(1, &[a, b, c]),
            );
        }
        let words = pack(tasks, VIEW_WORDS, View::write);
        self.priority.decide_for(
            now_ms,
            variant,
            |p| p.admit(now_ms, &words, names),
            |answer| checks::admissions(tasks.len(), &answer),
        )
    }

    /// The index in `waiting` and the new bucket of each task to move; `names[i]`: task i's
    /// names. `variant`: the live aging experiment's variant these tasks were all assigned, if
    /// any.
    pub fn age(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        waiting: &[View],
        names: &[NamesRef<'_>],
    ) -> Result<SlotAnswer<Vec<(u32, Bucket)>>, PolicyError> {
        debug_assert_eq!(waiting.len(), names.len(), "one task's names per view");
        if let ([task], [task_names]) = (waiting, names) {
            let words = task.words();
            return self.aging.decide_for(
                now_ms,
                variant,
                |p| p.age_one(now_ms, words, *task_names),
                |to| checks::promotions(waiting, to.map(|to| Promotion { index: 0, to })),
            );
        }
        let words = pack(waiting, VIEW_WORDS, View::write);
        self.aging.decide_for(
            now_ms,
            variant,
            |p| p.age(now_ms, &words, names),
            |promotions| checks::promotions(waiting, promotions),
        )
    }

    /// One decision per failure, in order; `names[i]`: failure i's task's names. `variant`:
    /// the live retry experiment's variant these failures' tasks were all assigned, if any.
    pub fn retry(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        failures: &[Failure],
        names: &[NamesRef<'_>],
    ) -> Result<SlotAnswer<Vec<Decision>>, PolicyError> {
        debug_assert_eq!(failures.len(), names.len(), "one task's names per failure");
        if let ([failure], [task_names]) = (failures, names) {
            let words = failure.words();
            return self.retry.decide_for(
                now_ms,
                variant,
                |p| p.decide_one(now_ms, words, *task_names),
                |word| checks::decisions(failures, &[word]),
            );
        }
        let words = pack(failures, FAILURE_WORDS, Failure::write);
        self.retry.decide_for(
            now_ms,
            variant,
            |p| p.decide(now_ms, &words, names),
            |answer| checks::decisions(failures, &answer),
        )
    }

    pub fn split(
        &self,
        now_ms: u64,
        request: &split_layout::SplitRequest,
    ) -> Result<SlotAnswer<Result<Vec<split_layout::Subtask>, String>>, PolicyError> {
        self.split
            .decide(now_ms, |p| p.split(request), checks::subtasks)
    }

    /// `hits`: the children's hits packed with `Hit::write_part`, each child's run nearest
    /// first; `weights[c]` is child c's weight.
    /// `variant`: the live merge experiment's variant the search was assigned, if any. While
    /// a merge experiment runs, every variant then merges the same hits to be scored
    /// (`merge_scores.rs`); the answer is the one decided here all the same.
    pub fn merge(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        k: u32,
        weights: &[f32],
        hits: &[u64],
    ) -> Result<SlotAnswer<Result<Vec<Hit>, String>>, PolicyError> {
        let decided = self.merge.decide_for(
            now_ms,
            variant,
            |p| p.merge(k, weights, hits),
            |answer| checks::merged(k, hits, answer),
        )?;
        if let Some(trial) = self.merge.trial() {
            trial.score_merges(k, weights, hits, self.merge.metrics());
        }
        Ok(decided)
    }
}
