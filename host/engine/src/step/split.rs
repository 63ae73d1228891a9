//! A step's split and merge work: a submission of a split kind is split by the split
//! policy before anything is written (a refusal creates nothing); a child that ends is counted
//! on its parent; a parent whose children have all ended (or whose merge deadline passed) is
//! merged by the merge policy over the children's results; a parent that ends otherwise takes
//! its unfinished children with it.

use super::{StepError, Stepper};
use crate::{ChildPlan, Decided, SplitInput, ready_to_merge};
use rand::Rng;
use sluice_model::{
    Actor, Admission, Family, Hit, Layout, MergedAnswer, Metric, SearchScope, ShardAnswer,
    ShardFilter, ShardQuery, State, Submission, Task, TaskError, TaskId, ValidationError,
    VectorQuery,
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
        let layout = self
            .engine
            .layout(now_ms, query.collection())
            .ok_or_else(|| {
                StepError::SplitRefused(format!(
                    "collection `{0}` is unknown: no shard worker announces it (sluice worker \
                 --vectors FILE --collection {0} --shard I/N) and none was declared (PUT \
                 /v1/collections/{0})",
                    query.collection()
                ))
            })?;
        let metric = check_query(&query, &layout).map_err(StepError::InvalidTask)?;
        let input = SplitInput {
            spec: &submission.spec,
            seq: self.engine.next_event_seq(),
            query: &query,
            layout: &layout,
        };
        let Decided { answer, version } = self
            .decide
            .split(now_ms, &input)
            .map_err(StepError::PolicyUnavailable)?;
        let children = answer.map_err(StepError::SplitRefused)?;
        check_children(&children, &layout).map_err(StepError::SplitRefused)?;
        let plans = children
            .into_iter()
            .zip(0u32..)
            .map(|((filter, weight), child)| {
                let payload = ShardQuery {
                    vector: query.vector.clone(),
                    k: query.k,
                    metric,
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
        let scope = SearchScope {
            collection: layout.collection,
            metric,
            shards: layout.shards,
        };
        let split = self
            .engine
            .plan_split(now_ms, &randoms, &parent, &plans, &query, scope, version)
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
        let mut missing_children = Vec::new();
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
                Err(why) => missing_children.push((index as usize, why)),
            }
        }
        let children = family.parts.len() as u32;
        let answered = children - missing_children.len() as u32;
        let covered = Coverage::of(&family, &missing_children);
        let missing = covered.missing;
        let coverage = covered.share;
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
                    "{} missing and partial results are not allowed: {}",
                    covered.missing_count,
                    missing.join("; ")
                ),
            };
            (Err(error), "shards missing".to_owned())
        } else {
            let variant = parent.variant(sluice_model::PolicyKind::Merge);
            let decided = self
                .decide
                .merge(now_ms, variant, family.k, &weights, &packed);
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
                        collection: family.scope.as_ref().map(|s| s.collection.clone()),
                        metric: family.scope.as_ref().map(|s| s.metric),
                        coverage,
                        partial: !missing.is_empty(),
                        children,
                        missing,
                        merge_policy_version: decided.version,
                    }),
                    format!(
                        "{by}; {answered} of {children} children answered, coverage {coverage:.3}"
                    ),
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

/// The metric a query is searched by: its own, or its collection's. A query of another
/// dimension than its collection's, or naming another metric than a declared collection's,
/// is refused.
fn check_query(query: &VectorQuery, layout: &Layout) -> Result<Metric, ValidationError> {
    if query.vector.len() != layout.dim as usize {
        return Err(ValidationError::Field {
            field: "payload.vector",
            reason: format!(
                "has {} numbers; collection `{}` has {} dimensions",
                query.vector.len(),
                layout.collection,
                layout.dim
            ),
        });
    }
    match query.metric {
        Some(metric) if layout.declared && metric != layout.metric => Err(ValidationError::Field {
            field: "payload.metric",
            reason: format!(
                "collection `{}` is searched by {}, not {}",
                layout.collection,
                layout.metric.as_str(),
                metric.as_str()
            ),
        }),
        Some(metric) => Ok(metric),
        None => Ok(layout.metric),
    }
}

/// Refuses a split that names no child, or a shard the collection does not have.
fn check_children(children: &[(ShardFilter, f32)], layout: &Layout) -> Result<(), String> {
    if children.is_empty() {
        return Err("the split policy chose no children".into());
    }
    for (filter, _) in children {
        if let ShardFilter::Shard(shard) = filter
            && *shard >= layout.shards
        {
            return Err(format!(
                "the split policy asked for shard {shard}; collection `{}` has {} (0 to {})",
                layout.collection,
                layout.shards,
                layout.shards - 1
            ));
        }
    }
    Ok(())
}

/// How much of the data a merge's answer covers, and what it leaves out.
struct Coverage {
    /// 0 to 1.
    share: f64,
    /// Each thing not searched, with why ("shard 3 (dead: ...)").
    missing: Vec<String>,
    /// "1 of 4 shards", "2 of 8 children": for messages.
    missing_count: String,
}

impl Coverage {
    /// Measured against the collection's shards when the children searched stored shards:
    /// a shard counts once any child that searched it answered, and a shard no child asked
    /// for is missing. Otherwise (id ranges, hashes, IVF lists, or a family split before
    /// collections) against the children, which the split made to partition the data.
    /// `missing_children`: (part index, why it has no answer).
    fn of(family: &Family, missing_children: &[(usize, String)]) -> Coverage {
        let why_missing = |index: usize| {
            missing_children
                .iter()
                .find(|(i, _)| *i == index)
                .map(|(_, why)| why.as_str())
        };
        let by_shard = family.parts.iter().any(|p| p.shard.is_some());
        let shards = family.scope.as_ref().map_or(0, |s| s.shards);
        if !by_shard || shards == 0 {
            let children = family.parts.len();
            let missing: Vec<String> = missing_children
                .iter()
                .map(|(i, why)| format!("{} ({why})", family.parts[*i].covers))
                .collect();
            let share = if children == 0 {
                0.0
            } else {
                (children - missing.len()) as f64 / children as f64
            };
            return Coverage {
                share,
                missing_count: format!("{} of {children} children", missing.len()),
                missing,
            };
        }
        let mut missing = Vec::new();
        let mut answered = 0u32;
        for shard in 0..shards {
            let asked: Vec<usize> = (0..family.parts.len())
                .filter(|&i| family.parts[i].shard == Some(shard))
                .collect();
            if asked.iter().any(|&i| why_missing(i).is_none()) {
                answered += 1;
                continue;
            }
            let why = match asked.first() {
                Some(&i) => why_missing(i).unwrap_or("no answer").to_owned(),
                None => "not searched: it had no live worker when the search was split, or \
                         the split policy left it out"
                    .to_owned(),
            };
            missing.push(format!("shard {shard} ({why})"));
        }
        debug_assert!(answered <= shards, "a shard is counted once");
        Coverage {
            share: f64::from(answered) / f64::from(shards),
            missing_count: format!("{} of {shards} shards", missing.len()),
            missing,
        }
    }
}
