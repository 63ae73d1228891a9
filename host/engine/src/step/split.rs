//! A step's split and merge work: a submission of a split kind is split by the split
//! policy before anything is written (a refusal creates nothing); a child that ends is counted
//! on its parent; a parent whose children have all ended (or whose merge deadline passed) is
//! merged by the merge policy over the children's results; a parent that ends otherwise takes
//! its unfinished children with it.

use super::{StepError, Stepper};
use crate::{ChildPlan, Decided, SplitInput, ready_to_merge};
use rand::Rng;
use sluice_model::{
    Actor, Admission, Hit, MergedAnswer, ShardAnswer, ShardQuery, State, Submission, Task,
    TaskError, TaskId, VectorQuery,
};

/// The most bytes the children of one split may carry in payloads together: each holds the
/// query vector, so a wide vector split very fine would otherwise make one huge write.
const MAX_CHILDREN_PAYLOAD_BYTES: usize = 16 << 20;

impl Stepper<'_> {
    /// Creates a task of a split kind and splits it in the same change.
    pub(super) fn create_split(
        &mut self,
        submission: &Submission,
        admission: &Admission,
    ) -> Result<Task, StepError> {
        let payload: serde_json::Value = serde_json::from_slice(&submission.payload_json)
            .map_err(|e| StepError::Internal(format!("a stored payload is not JSON: {e}")))?;
        let query = VectorQuery::parse(&payload).map_err(StepError::InvalidTask)?;
        let now_ms = self.now_ms;
        let input = SplitInput {
            spec: &submission.spec,
            seq: self.engine.next_event_seq(),
            query: &query,
        };
        let Decided { answer, version } = self
            .decide
            .split(now_ms, &input)
            .map_err(StepError::PolicyUnavailable)?;
        let children = answer.map_err(StepError::SplitRefused)?;
        let plans = children
            .into_iter()
            .zip(0u32..)
            .map(|((filter, weight), child)| {
                let payload = ShardQuery {
                    vector: query.vector.clone(),
                    k: query.k,
                    metric: query.metric,
                    filter: filter.clone(),
                    child,
                };
                serde_json::to_vec(&payload).map(|payload_json| ChildPlan {
                    filter,
                    weight,
                    payload_json,
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| StepError::Internal(format!("cannot encode a child payload: {e}")))?;
        let payload_bytes: usize = plans.iter().map(|p| p.payload_json.len()).sum();
        if payload_bytes > MAX_CHILDREN_PAYLOAD_BYTES {
            return Err(StepError::SplitRefused(format!(
                "{} children would carry {payload_bytes} bytes of payload, more than the limit of \
                 {MAX_CHILDREN_PAYLOAD_BYTES}; split into fewer children",
                plans.len()
            )));
        }
        let created = self
            .engine
            .plan_create(now_ms, self.random.random(), submission, admission);
        let parent = self.plan(created);
        let randoms: Vec<u128> = plans.iter().map(|_| self.random.random()).collect();
        let split = self
            .engine
            .plan_split(now_ms, &randoms, &parent, &plans, &query, version)
            .map_err(|source| StepError::Illegal {
                task_id: parent.id,
                state: parent.state,
                source,
            })?;
        Ok(self.plan(split))
    }

    /// What a planned change means for families: children that ended are counted on their
    /// parents (which merge once all have), and parents that ended cancel their unfinished
    /// children. Called by `plan` with a change's writes (previous state,
    /// task) of family members, after the change joined the step.
    pub(super) fn follow_families(&mut self, writes: &[(Option<State>, Task)]) {
        let mut settled: Vec<(TaskId, TaskId)> = Vec::new();
        let mut orphaned: Vec<Task> = Vec::new();
        for (previous, task) in writes {
            let ended_now = task.state.is_terminal() && previous.is_some_and(|p| !p.is_terminal());
            if !ended_now {
                continue;
            }
            if let Some(parent) = task.parent {
                settled.push((parent, task.id));
            }
            if task.family.is_some() {
                orphaned.push(task.clone());
            }
        }
        for (parent, child) in settled {
            if let Err(error) = self.settle_child(parent) {
                tracing::error!(task_id = %child, parent_id = %parent, %error, "cannot count an ended child on its parent");
            }
        }
        for parent in orphaned {
            self.cancel_children(&parent);
        }
    }

    fn settle_child(&mut self, parent_id: TaskId) -> Result<(), StepError> {
        let parent = self.task(parent_id)?;
        if parent.state != State::Split {
            // Already merged, cancelled or timed out: the child's end changes nothing.
            return Ok(());
        }
        let now_ms = self.now_ms;
        let change = self.engine.plan_child_settled(now_ms, &parent);
        let parent = self.plan(change);
        if ready_to_merge(&parent, now_ms) {
            self.merge_family(&parent)?;
        }
        Ok(())
    }

    /// Merges what `parent`'s children answered and completes (or fails) it.
    pub(super) fn merge_family(&mut self, parent: &Task) -> Result<(), StepError> {
        let Some(family) = parent.family.clone() else {
            return Ok(());
        };
        let now_ms = self.now_ms;
        let mut weights = Vec::with_capacity(family.parts.len());
        let mut packed = Vec::new();
        let mut missing = Vec::new();
        for (index, part) in (0u32..).zip(&family.parts) {
            weights.push(part.weight);
            let child = self.task(part.task)?;
            match answered_hits(&child) {
                Ok(hits) => {
                    for hit in hits {
                        policy_packed::Hit {
                            id: hit.id,
                            distance: hit.distance,
                        }
                        .write_part(index, &mut packed);
                    }
                }
                Err(why) => missing.push(format!("{} ({why})", part.covers)),
            }
        }
        let children = family.parts.len() as u32;
        let answered = children - missing.len() as u32;
        let coverage = if children == 0 {
            0.0
        } else {
            f64::from(answered) / f64::from(children)
        };
        let (outcome, detail) = if answered == 0 {
            let error = TaskError {
                class: "no-shard-answered".into(),
                message: format!("no shard answered; missing: {}", missing.join("; ")),
            };
            (Err(error), "no child answered".to_owned())
        } else if !missing.is_empty() && !family.allow_partial {
            let error = TaskError {
                class: "partial".into(),
                message: format!(
                    "{} of {children} shards missing and partial results are not allowed: {}",
                    missing.len(),
                    missing.join("; ")
                ),
            };
            (Err(error), "shards missing".to_owned())
        } else {
            let decided = self.decide.merge(now_ms, family.k, &weights, &packed);
            let by = match decided.version {
                Some(v) => format!("merged by merge policy v{v}"),
                None => "merged by the host's top-k".to_owned(),
            };
            match decided.answer {
                Ok(hits) => (
                    Ok(MergedAnswer {
                        hits: hits
                            .into_iter()
                            .map(|h| Hit {
                                id: h.id,
                                distance: h.distance,
                            })
                            .collect(),
                        coverage,
                        partial: !missing.is_empty(),
                        children,
                        missing,
                        merge_policy_version: decided.version,
                    }),
                    format!("{by}; coverage {answered}/{children}"),
                ),
                Err(refusal) => (
                    Err(TaskError {
                        class: "merge-refused".into(),
                        message: refusal,
                    }),
                    format!("{by}: refused"),
                ),
            }
        };
        let change = self
            .engine
            .plan_merged(now_ms, parent, outcome, detail)
            .map_err(|source| StepError::Illegal {
                task_id: parent.id,
                state: parent.state,
                source,
            })?;
        // Children still out (a merge deadline passed) are cancelled as the parent ends.
        self.plan(change);
        Ok(())
    }

    fn cancel_children(&mut self, parent: &Task) {
        let Some(family) = &parent.family else {
            return;
        };
        let now_ms = self.now_ms;
        for part in &family.parts {
            let child = match self.task(part.task) {
                Ok(child) => child,
                Err(error) => {
                    tracing::error!(task_id = %part.task, %error, "cannot read a child to cancel");
                    continue;
                }
            };
            if child.state.is_terminal() {
                continue;
            }
            let detail = Some(format!("parent {} is {}", parent.id, parent.state));
            if let Ok(change) = self.engine.plan_transition(
                now_ms,
                &child,
                State::Cancelled,
                Actor::scheduler(),
                detail,
            ) {
                self.plan(change);
            }
        }
    }
}

/// A child's hits, or why it has none to give.
fn answered_hits(child: &Task) -> Result<Vec<Hit>, String> {
    match (child.state, &child.result) {
        (State::Completed, Some(result)) => serde_json::from_value::<ShardAnswer>(result.clone())
            .map(|answer| answer.hits)
            .map_err(|e| format!("its answer is not a list of hits: {e}")),
        (State::Completed, None) => Err("it completed without an answer".into()),
        (state, _) => match &child.error {
            Some(error) => Err(format!("{state}: {}", error.message)),
            None => Err(state.to_string()),
        },
    }
}
