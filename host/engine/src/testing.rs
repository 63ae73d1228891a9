//! Planning single changes outside a step, for other crates' tests of what a store does with
//! a change (the `test-support` feature). A shell never plans outside `Engine::step`; these
//! are its `plan_*` and `apply` under names that say what they are for.

use crate::Engine;
use sluice_model::{Actor, Admission, Change, IllegalTransition, State, Submission, Task};

pub trait EngineTestSupport {
    /// `Engine::plan_create`: a new task, created and admitted.
    fn test_plan_create(
        &self,
        now_ms: u64,
        random: u128,
        submission: &Submission,
        admission: &Admission,
    ) -> Change;
    /// `Engine::plan_claim`: `task` leased to `worker`.
    fn test_plan_claim(
        &mut self,
        now_ms: u64,
        random: u128,
        task: &Task,
        worker: &str,
        gpu: Option<u32>,
        claim_id: Option<&str>,
    ) -> Result<Change, IllegalTransition>;
    /// `Engine::plan_transition`: `task` moved to `to`.
    fn test_plan_transition(
        &mut self,
        now_ms: u64,
        task: &Task,
        to: State,
        actor: Actor,
        detail: Option<String>,
    ) -> Result<Change, IllegalTransition>;
    /// `Engine::apply`: the engine learns a planned change.
    fn test_apply(&mut self, change: &Change);
}

impl EngineTestSupport for Engine {
    fn test_plan_create(
        &self,
        now_ms: u64,
        random: u128,
        submission: &Submission,
        admission: &Admission,
    ) -> Change {
        self.plan_create(now_ms, random, submission, admission)
    }

    fn test_plan_claim(
        &mut self,
        now_ms: u64,
        random: u128,
        task: &Task,
        worker: &str,
        gpu: Option<u32>,
        claim_id: Option<&str>,
    ) -> Result<Change, IllegalTransition> {
        self.plan_claim(now_ms, random, task, worker, gpu, claim_id)
    }

    fn test_plan_transition(
        &mut self,
        now_ms: u64,
        task: &Task,
        to: State,
        actor: Actor,
        detail: Option<String>,
    ) -> Result<Change, IllegalTransition> {
        self.plan_transition(now_ms, task, to, actor, detail)
    }

    fn test_apply(&mut self, change: &Change) {
        self.apply(change)
    }
}
