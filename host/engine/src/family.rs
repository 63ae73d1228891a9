//! Split and merge bookkeeping. A parent goes Queued → Split and its children are created
//! beside it, as ordinary queued tasks, in one change; each child that ends is counted on the
//! parent; when all have ended (or the parent's merge deadline passes) the parent goes
//! Split → Merging → Completed or Failed with the merged answer. These are the plans; the
//! step (`step/split.rs`) calls the split and merge policies and follows the family.

use super::Engine;
use sluice_model::{
    Actor, Change, Family, FamilyPart, IllegalTransition, MergedAnswer, NewTask, SearchScope,
    ShardFilter, State, Task, TaskError, TaskId, TaskWrite, VectorQuery,
};

/// The label a child carries so that only a worker holding its data claims it.
pub const SHARD_LABEL: &str = "shard";
/// The label a child carries so that only a worker of its collection claims it.
pub const COLLECTION_LABEL: &str = "collection";

/// One child as the split policy gave it, with its payload already written.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildPlan {
    pub filter: ShardFilter,
    pub weight: f32,
    pub payload_json: Vec<u8>,
}

impl Engine {
    /// Plans `parent` (Queued) → Split, with one new queued child per plan: same kind,
    /// bucket, rank and deadline as the parent, labelled with its collection and its shard's
    /// routing. `randoms`
    /// gives one random id part per child. The parent's write comes first in the change.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan_split(
        &mut self,
        now_ms: u64,
        randoms: &[u128],
        parent: &Task,
        children: &[ChildPlan],
        query: &VectorQuery,
        scope: SearchScope,
        version: Option<u32>,
    ) -> Result<Change, IllegalTransition> {
        let mut ids = self.ids.clone();
        let child_ids: Vec<TaskId> = children
            .iter()
            .zip(randoms.iter().chain(std::iter::repeat(&0)))
            .map(|(_, &random)| ids.next(now_ms, random))
            .collect();
        let detail = match version {
            Some(v) => format!(
                "split into {} children by split policy v{v}",
                children.len()
            ),
            None => format!("split into {} children", children.len()),
        };
        let shards = scope.shards;
        let collection = scope.collection.clone();
        let family = Family {
            parts: children
                .iter()
                .zip(&child_ids)
                .map(|(child, &task)| FamilyPart {
                    task,
                    weight: child.weight,
                    covers: child.filter.describe(),
                    shard: match child.filter {
                        ShardFilter::Shard(shard) => Some(shard),
                        _ => None,
                    },
                })
                .collect(),
            settled: 0,
            k: query.k,
            allow_partial: query.allow_partial,
            merge_at_ms: query
                .merge_deadline_ms
                .map(|ms| parent.created_at_ms.saturating_add(ms)),
            scope: Some(scope),
        };
        let mut change = self.plan_with(
            now_ms,
            parent,
            &[State::Split],
            Actor::scheduler(),
            Some(detail),
            |after| after.family = Some(family),
        )?;
        // The parent's event took one seq; each child takes two (created, queued).
        let mut offset = change.events.len() as u64;
        for (index, (plan, &id)) in children.iter().zip(&child_ids).enumerate() {
            let created = self.event(
                offset,
                id,
                None,
                State::Created,
                Actor::scheduler(),
                now_ms,
                Some(format!(
                    "child {index} of {}: {}",
                    parent.id,
                    plan.filter.describe()
                )),
            );
            let queued = self.event(
                offset + 1,
                id,
                Some(State::Created),
                State::Queued,
                Actor::scheduler(),
                now_ms,
                None,
            );
            offset += 2;
            let mut labels = parent.labels.clone();
            labels.insert(SHARD_LABEL.to_owned(), plan.filter.routing(shards));
            labels.insert(COLLECTION_LABEL.to_owned(), collection.clone());
            let child = Task {
                id,
                key: None,
                labels,
                created_at_ms: now_ms,
                updated_at_ms: now_ms,
                attempt: 0,
                state: State::Queued,
                bucket_since_ms: now_ms,
                lease: None,
                not_before_ms: None,
                callback_url: None,
                callback: None,
                result: None,
                error: None,
                event_seqs: vec![created.seq, queued.seq],
                parent: Some(parent.id),
                family: None,
                ..parent.clone()
            };
            change.new_tasks.push(NewTask {
                id,
                payload_json: plan.payload_json.clone(),
                key: None,
            });
            change.writes.push(TaskWrite {
                previous: None,
                task: child,
            });
            change.events.extend([created, queued]);
        }
        Ok(change)
    }

    /// Counts one more ended child on `parent`. Not an event: the child's own event says it.
    pub(crate) fn plan_child_settled(&self, now_ms: u64, parent: &Task) -> Change {
        let mut after = parent.clone();
        after.updated_at_ms = now_ms;
        if let Some(family) = &mut after.family {
            family.settled = family.settled.saturating_add(1);
        }
        Change {
            writes: vec![TaskWrite {
                previous: Some(parent.state),
                task: after,
            }],
            ..Change::default()
        }
    }

    /// Plans `parent` Split → Merging → Completed with `merged`, or → Failed with `error`.
    pub(crate) fn plan_merged(
        &mut self,
        now_ms: u64,
        parent: &Task,
        outcome: Result<MergedAnswer, TaskError>,
        detail: String,
    ) -> Result<Change, IllegalTransition> {
        let end = if outcome.is_ok() {
            State::Completed
        } else {
            State::Failed
        };
        self.plan_with(
            now_ms,
            parent,
            &[State::Merging, end],
            Actor::scheduler(),
            Some(detail),
            |after| match outcome {
                Ok(merged) => {
                    after.result = serde_json::to_value(merged).ok();
                    after.error = None;
                }
                Err(error) => after.error = Some(error),
            },
        )
    }
}

/// Whether a family's parent should merge now: every child has ended, or its merge deadline
/// has passed.
pub fn ready_to_merge(parent: &Task, now_ms: u64) -> bool {
    parent.state == State::Split
        && parent.family.as_ref().is_some_and(|family| {
            family.settled as usize >= family.parts.len()
                || family.merge_at_ms.is_some_and(|at| at <= now_ms)
        })
}
