//! A task as the API shows it: the JSON shape of `GET /v1/tasks/{id}` and of every answer that
//! carries a task, kept apart from the engine's record (`sluice_model::Task`) and from the bytes
//! the stores write, so that the API's names can change without a data migration and the
//! stored format without an API change. The schemas keep the names `Task`, `Lease`, ... that the
//! API document has always used.

use serde::{Deserialize, Serialize};
use sluice_model::{
    Callback, Family, FamilyPart, Lease, Priority, Resources, RetiredLease, State, Task, TaskError,
    TaskId, VariantTag,
};
use std::collections::BTreeMap;

/// Why a task ended badly (or why its last attempt failed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = TaskError))]
pub struct TaskErrorView {
    pub class: String,
    pub message: String,
}

/// A task as stored and as shown by the API. The payload is stored beside it, not inside it, so
/// that state changes do not rewrite up to a MiB of payload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Task))]
pub struct TaskView {
    pub id: TaskId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub kind: String,
    pub priority: Priority,
    /// The bucket the task waits in now: as admitted, or higher after aging.
    pub bucket: Priority,
    /// Its order inside the bucket (lower first), as admitted.
    #[serde(default)]
    pub rank: u64,
    /// How long one attempt may run before it is failed as timed out, as admitted.
    #[serde(default)]
    pub attempt_timeout_ms: u64,
    pub device: String,
    pub tenant: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub est_exec_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// `created_at_ms + deadline_ms`, when a deadline was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_at_ms: Option<u64>,
    pub max_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    #[serde(default)]
    pub resources: Resources,
    /// See `TaskSpec::concurrency_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// See `TaskSpec::preemptible`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub preemptible: bool,
    /// Attempts stopped by preemption: they do not count against `max_attempts`, so the
    /// attempts spent are `attempt - preemptions`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub preemptions: u32,
    pub created_at_ms: u64,
    pub updated_at_ms: u64,
    pub attempt: u32,
    pub state: State,
    /// When it entered its current bucket (admission or its last promotion), for aging.
    #[serde(default)]
    pub bucket_since_ms: u64,
    /// The lease of the current attempt while Claimed or Running; after that, the last
    /// attempt's, so that a repeated report can be told from a stale one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<LeaseView>,
    /// While in RetryWait: when it goes back to its queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before_ms: Option<u64>,
    /// The completion callback's delivery, once the task is terminal and has a `callback_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<CallbackView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<TaskErrorView>,
    /// The `seq` of each of its events, oldest first: the index from a task into the log.
    #[serde(default)]
    pub event_seqs: Vec<u64>,
    /// For a child of a split: the task it is part of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<TaskId>,
    /// For a split parent: its children and how many have ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family: Option<FamilyView>,
    /// The leases of earlier attempts, newest last, at most `MAX_RETIRED_LEASES`: a report
    /// with one of their tokens comes from a genuinely stale holder (logged once per attempt);
    /// a token found neither here nor in `lease` never held the task, and writes nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retired_leases: Vec<RetiredLeaseView>,
    /// The experiment variants it was assigned at admission, one per kind at most; its
    /// decisions of that kind are the variant's for as long as the experiment runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<VariantTag>,
    /// When its first attempt was claimed: the end of its first wait, which experiment
    /// reports measure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_claimed_at_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

fn is_true(value: &bool) -> bool {
    *value
}

/// What a task keeps of an earlier attempt's lease: a digest of its token (never the token),
/// whose it was, and whether a refused report of it has been logged already.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = RetiredLease))]
pub struct RetiredLeaseView {
    pub token_sha256: String,
    pub attempt: u32,
    pub worker: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refusal_logged: bool,
}

/// A split parent's bookkeeping: what it needs to merge without reading its payload again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Family))]
pub struct FamilyView {
    pub parts: Vec<FamilyPartView>,
    /// Children that have reached a terminal state.
    pub settled: u32,
    pub k: u32,
    pub allow_partial: bool,
    /// When it merges whatever has answered, if its children have not all ended by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_at_ms: Option<u64>,
    /// The collection searched, as its layout stood at the split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<SearchScopeView>,
}

/// What a split search was over: its coverage is measured against this.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = SearchScope))]
pub struct SearchScopeView {
    pub collection: String,
    pub metric: sluice_model::Metric,
    /// The collection's shards at the split.
    pub shards: u32,
}

/// One child of a split parent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = FamilyPart))]
pub struct FamilyPartView {
    pub task: TaskId,
    pub weight: f32,
    /// What it covers, for messages ("shard 3").
    pub covers: String,
    /// The stored shard it searches, for a shard filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<u32>,
}

/// One attempt's hold on a task: only reports carrying `token` count, and only until
/// `expires_at_ms` (which heartbeats push back, never past `attempt_ends_at_ms`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Lease))]
pub struct LeaseView {
    pub worker: String,
    pub token: String,
    pub attempt: u32,
    pub expires_at_ms: u64,
    /// Claim time plus the attempt timeout: past it the attempt fails as `timeout`.
    pub attempt_ends_at_ms: u64,
    /// When the attempt was leased (0 in records written before it was kept).
    #[serde(default)]
    pub claimed_at_ms: u64,
    /// When the worker reported the start, if it did: execution time runs from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    /// The worker's GPU this attempt occupies, by index in its heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// Whether a refused report carrying this token has been logged: one event per attempt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refusal_logged: bool,
    /// When the task ended (cancelled, or past its deadline) while this attempt held it. The
    /// worker learns it at its next report (`attempt-cancelled`), and its place (the GPU) stays
    /// counted as busy until `stopped_at_ms`: nothing is placed on a GPU still computing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// When the worker said the attempt had stopped after `ended_at_ms`, or the lease ran out
    /// without it saying so (then this is at or after `expires_at_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_ms: Option<u64>,
    /// The worker's name for the claim that granted this lease: the same claim sent again
    /// (its answer was lost, say with the replica that served it) is answered with the leases
    /// it granted instead of new ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_id: Option<String>,
    /// When an urgent task preempted this attempt: the worker learns it at its next report
    /// (`attempt-revoked`), and the place stays held until it says `stopped` (or the lease,
    /// no longer extended, runs out); then the task waits in its queue again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at_ms: Option<u64>,
    /// The urgent task this attempt was preempted for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_for: Option<TaskId>,
}

/// Delivery of a completion callback: at least once, retried with backoff up to a bound.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = Callback))]
pub struct CallbackView {
    pub attempts: u32,
    /// When the next attempt is due (while one is in flight: when it is given up on).
    pub next_at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_at_ms: Option<u64>,
    #[serde(default)]
    pub gave_up: bool,
}

impl From<TaskError> for TaskErrorView {
    fn from(e: TaskError) -> Self {
        TaskErrorView {
            class: e.class,
            message: e.message,
        }
    }
}

impl From<TaskErrorView> for TaskError {
    fn from(e: TaskErrorView) -> Self {
        TaskError {
            class: e.class,
            message: e.message,
        }
    }
}

impl From<RetiredLease> for RetiredLeaseView {
    fn from(r: RetiredLease) -> Self {
        RetiredLeaseView {
            token_sha256: r.token_sha256,
            attempt: r.attempt,
            worker: r.worker,
            refusal_logged: r.refusal_logged,
        }
    }
}

impl From<RetiredLeaseView> for RetiredLease {
    fn from(r: RetiredLeaseView) -> Self {
        RetiredLease {
            token_sha256: r.token_sha256,
            attempt: r.attempt,
            worker: r.worker,
            refusal_logged: r.refusal_logged,
        }
    }
}

impl From<FamilyPart> for FamilyPartView {
    fn from(p: FamilyPart) -> Self {
        FamilyPartView {
            task: p.task,
            weight: p.weight,
            covers: p.covers,
            shard: p.shard,
        }
    }
}

impl From<FamilyPartView> for FamilyPart {
    fn from(p: FamilyPartView) -> Self {
        FamilyPart {
            task: p.task,
            weight: p.weight,
            covers: p.covers,
            shard: p.shard,
        }
    }
}

impl From<Family> for FamilyView {
    fn from(f: Family) -> Self {
        FamilyView {
            parts: f.parts.into_iter().map(Into::into).collect(),
            settled: f.settled,
            k: f.k,
            allow_partial: f.allow_partial,
            merge_at_ms: f.merge_at_ms,
            scope: f.scope.map(|s| SearchScopeView {
                collection: s.collection,
                metric: s.metric,
                shards: s.shards,
            }),
        }
    }
}

impl From<FamilyView> for Family {
    fn from(f: FamilyView) -> Self {
        Family {
            parts: f.parts.into_iter().map(Into::into).collect(),
            settled: f.settled,
            k: f.k,
            allow_partial: f.allow_partial,
            merge_at_ms: f.merge_at_ms,
            scope: f.scope.map(|s| sluice_model::SearchScope {
                collection: s.collection,
                metric: s.metric,
                shards: s.shards,
            }),
        }
    }
}

impl From<Callback> for CallbackView {
    fn from(c: Callback) -> Self {
        CallbackView {
            attempts: c.attempts,
            next_at_ms: c.next_at_ms,
            delivered_at_ms: c.delivered_at_ms,
            gave_up: c.gave_up,
        }
    }
}

impl From<CallbackView> for Callback {
    fn from(c: CallbackView) -> Self {
        Callback {
            attempts: c.attempts,
            next_at_ms: c.next_at_ms,
            delivered_at_ms: c.delivered_at_ms,
            gave_up: c.gave_up,
        }
    }
}

/// Both directions list every field, so that a field added to one side and not the other is a
/// compile error here rather than a value silently dropped from the API.
macro_rules! lease_fields {
    ($to:ident, $l:ident) => {
        $to {
            worker: $l.worker,
            token: $l.token,
            attempt: $l.attempt,
            expires_at_ms: $l.expires_at_ms,
            attempt_ends_at_ms: $l.attempt_ends_at_ms,
            claimed_at_ms: $l.claimed_at_ms,
            started_at_ms: $l.started_at_ms,
            gpu: $l.gpu,
            refusal_logged: $l.refusal_logged,
            ended_at_ms: $l.ended_at_ms,
            stopped_at_ms: $l.stopped_at_ms,
            claim_id: $l.claim_id,
            revoked_at_ms: $l.revoked_at_ms,
            revoked_for: $l.revoked_for,
        }
    };
}

impl From<Lease> for LeaseView {
    fn from(l: Lease) -> Self {
        lease_fields!(LeaseView, l)
    }
}

impl From<LeaseView> for Lease {
    fn from(l: LeaseView) -> Self {
        lease_fields!(Lease, l)
    }
}

macro_rules! task_fields {
    ($to:ident, $t:ident) => {
        $to {
            id: $t.id,
            key: $t.key,
            kind: $t.kind,
            priority: $t.priority,
            bucket: $t.bucket,
            rank: $t.rank,
            attempt_timeout_ms: $t.attempt_timeout_ms,
            device: $t.device,
            tenant: $t.tenant,
            labels: $t.labels,
            est_exec_ms: $t.est_exec_ms,
            deadline_ms: $t.deadline_ms,
            deadline_at_ms: $t.deadline_at_ms,
            max_attempts: $t.max_attempts,
            callback_url: $t.callback_url,
            resources: $t.resources,
            concurrency_key: $t.concurrency_key,
            preemptible: $t.preemptible,
            preemptions: $t.preemptions,
            created_at_ms: $t.created_at_ms,
            updated_at_ms: $t.updated_at_ms,
            attempt: $t.attempt,
            state: $t.state,
            bucket_since_ms: $t.bucket_since_ms,
            lease: $t.lease.map(Into::into),
            not_before_ms: $t.not_before_ms,
            callback: $t.callback.map(Into::into),
            result: $t.result,
            error: $t.error.map(Into::into),
            event_seqs: $t.event_seqs,
            parent: $t.parent,
            family: $t.family.map(Into::into),
            retired_leases: $t.retired_leases.into_iter().map(Into::into).collect(),
            variants: $t.variants,
            first_claimed_at_ms: $t.first_claimed_at_ms,
        }
    };
}

impl From<Task> for TaskView {
    fn from(task: Task) -> Self {
        task_fields!(TaskView, task)
    }
}

/// A task read back from the API (a trace export reads tasks this way).
impl From<TaskView> for Task {
    fn from(view: TaskView) -> Self {
        task_fields!(Task, view)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claimed task as a server of format 1 answered it, when the API's JSON was the stored
    /// record's: the view gives the same bytes, so no client sees the change.
    const CLAIMED: &str = r#"{"id":"01M97G6YW4F8EM7KM7WAFGF11N","kind":"oct.report","priority":"urgent","bucket":"urgent","rank":5,"attempt_timeout_ms":90000,"device":"unknown","tenant":"default","labels":{},"est_exec_ms":60000,"max_attempts":3,"resources":{"gpu_memory_mb":0},"created_at_ms":1796621958020,"updated_at_ms":1796621958481,"attempt":1,"state":"claimed","bucket_since_ms":1796621958020,"lease":{"worker":"gpu-1","token":"981e0788b5c2f1db9f6dd69e44b78e7b","attempt":1,"expires_at_ms":1796621988481,"attempt_ends_at_ms":1796622048481,"claimed_at_ms":1796621958481,"gpu":0},"event_seqs":[5,6,12],"first_claimed_at_ms":1796621958481}"#;

    #[test]
    fn the_api_shows_a_task_as_it_always_has() {
        let view: TaskView = serde_json::from_str(CLAIMED).unwrap();
        let task = Task::from(view);
        assert_eq!(task.state, State::Claimed);
        assert!(task.preemptible, "absent means preemptible");
        assert_eq!(task.lease.as_ref().unwrap().gpu, Some(0));
        let shown = serde_json::to_string(&TaskView::from(task.clone())).unwrap();
        assert_eq!(shown, CLAIMED);

        // What a change adds shows, and what it leaves at its default does not.
        let mut ended = task;
        ended.preemptible = false;
        ended.result = Some(serde_json::json!({"ok": true}));
        ended.lease = None;
        let shown: serde_json::Value = serde_json::to_value(TaskView::from(ended.clone())).unwrap();
        assert_eq!(shown["preemptible"], false);
        assert_eq!(shown["result"]["ok"], true);
        assert!(shown.get("lease").is_none() && shown.get("error").is_none());
        let back: TaskView = serde_json::from_value(shown).unwrap();
        assert_eq!(Task::from(back), ended);
    }
}
