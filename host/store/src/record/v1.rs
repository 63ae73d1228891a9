//! Format 1, read only: the task as JSON, as Sluice wrote it before format 2 (when the stored
//! record and the API's JSON were one type). Frozen: these structs mirror what was written
//! then, with the defaults older records relied on, and never change again.

use super::corrupt;
use crate::StoreError;
use serde::Deserialize;
use sluice_model::{
    Callback, Family, FamilyPart, Lease, Priority, Resources, RetiredLease, State, Task, TaskError,
    TaskId, VariantTag,
};
use std::collections::BTreeMap;

#[derive(Deserialize)]
struct TaskV1 {
    id: TaskId,
    #[serde(default)]
    key: Option<String>,
    kind: String,
    priority: Priority,
    bucket: Priority,
    #[serde(default)]
    rank: u64,
    #[serde(default)]
    attempt_timeout_ms: u64,
    device: String,
    tenant: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    est_exec_ms: u64,
    #[serde(default)]
    deadline_ms: Option<u64>,
    #[serde(default)]
    deadline_at_ms: Option<u64>,
    max_attempts: u32,
    #[serde(default)]
    callback_url: Option<String>,
    #[serde(default)]
    resources: Resources,
    #[serde(default)]
    concurrency_key: Option<String>,
    #[serde(default = "yes")]
    preemptible: bool,
    #[serde(default)]
    preemptions: u32,
    created_at_ms: u64,
    updated_at_ms: u64,
    attempt: u32,
    state: State,
    #[serde(default)]
    bucket_since_ms: u64,
    #[serde(default)]
    lease: Option<LeaseV1>,
    #[serde(default)]
    not_before_ms: Option<u64>,
    #[serde(default)]
    callback: Option<CallbackV1>,
    #[serde(default)]
    result: Option<serde_json::Value>,
    #[serde(default)]
    error: Option<TaskErrorV1>,
    #[serde(default)]
    event_seqs: Vec<u64>,
    #[serde(default)]
    parent: Option<TaskId>,
    #[serde(default)]
    family: Option<FamilyV1>,
    #[serde(default)]
    retired_leases: Vec<RetiredLeaseV1>,
    #[serde(default)]
    variants: Vec<VariantTag>,
    #[serde(default)]
    first_claimed_at_ms: Option<u64>,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct TaskErrorV1 {
    class: String,
    message: String,
}

#[derive(Deserialize)]
struct RetiredLeaseV1 {
    token_sha256: String,
    attempt: u32,
    worker: String,
    #[serde(default)]
    refusal_logged: bool,
}

#[derive(Deserialize)]
struct FamilyV1 {
    parts: Vec<FamilyPartV1>,
    settled: u32,
    k: u32,
    allow_partial: bool,
    #[serde(default)]
    merge_at_ms: Option<u64>,
}

#[derive(Deserialize)]
struct FamilyPartV1 {
    task: TaskId,
    weight: f32,
    covers: String,
}

#[derive(Deserialize)]
struct LeaseV1 {
    worker: String,
    token: String,
    attempt: u32,
    expires_at_ms: u64,
    attempt_ends_at_ms: u64,
    #[serde(default)]
    claimed_at_ms: u64,
    #[serde(default)]
    started_at_ms: Option<u64>,
    #[serde(default)]
    gpu: Option<u32>,
    #[serde(default)]
    refusal_logged: bool,
    #[serde(default)]
    ended_at_ms: Option<u64>,
    #[serde(default)]
    stopped_at_ms: Option<u64>,
    #[serde(default)]
    claim_id: Option<String>,
    #[serde(default)]
    revoked_at_ms: Option<u64>,
    #[serde(default)]
    revoked_for: Option<TaskId>,
}

#[derive(Deserialize)]
struct CallbackV1 {
    attempts: u32,
    next_at_ms: u64,
    #[serde(default)]
    delivered_at_ms: Option<u64>,
    #[serde(default)]
    gave_up: bool,
}

pub(super) fn decode(bytes: &[u8]) -> Result<Task, StoreError> {
    let r: TaskV1 =
        serde_json::from_slice(bytes).map_err(|e| corrupt(format!("format 1 (JSON): {e}")))?;
    Ok(Task {
        id: r.id,
        key: r.key,
        kind: r.kind,
        priority: r.priority,
        bucket: r.bucket,
        rank: r.rank,
        attempt_timeout_ms: r.attempt_timeout_ms,
        device: r.device,
        tenant: r.tenant,
        labels: r.labels,
        est_exec_ms: r.est_exec_ms,
        deadline_ms: r.deadline_ms,
        deadline_at_ms: r.deadline_at_ms,
        max_attempts: r.max_attempts,
        callback_url: r.callback_url,
        resources: r.resources,
        concurrency_key: r.concurrency_key,
        preemptible: r.preemptible,
        preemptions: r.preemptions,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        attempt: r.attempt,
        state: r.state,
        bucket_since_ms: r.bucket_since_ms,
        lease: r.lease.map(|l| Lease {
            worker: l.worker,
            token: l.token,
            attempt: l.attempt,
            expires_at_ms: l.expires_at_ms,
            attempt_ends_at_ms: l.attempt_ends_at_ms,
            claimed_at_ms: l.claimed_at_ms,
            started_at_ms: l.started_at_ms,
            gpu: l.gpu,
            refusal_logged: l.refusal_logged,
            ended_at_ms: l.ended_at_ms,
            stopped_at_ms: l.stopped_at_ms,
            claim_id: l.claim_id,
            revoked_at_ms: l.revoked_at_ms,
            revoked_for: l.revoked_for,
        }),
        not_before_ms: r.not_before_ms,
        callback: r.callback.map(|c| Callback {
            attempts: c.attempts,
            next_at_ms: c.next_at_ms,
            delivered_at_ms: c.delivered_at_ms,
            gave_up: c.gave_up,
        }),
        result: r.result,
        error: r.error.map(|e| TaskError {
            class: e.class,
            message: e.message,
        }),
        event_seqs: r.event_seqs,
        parent: r.parent,
        family: r.family.map(|f| Family {
            parts: f
                .parts
                .into_iter()
                .map(|p| FamilyPart {
                    task: p.task,
                    weight: p.weight,
                    covers: p.covers,
                    shard: None,
                })
                .collect(),
            settled: f.settled,
            k: f.k,
            allow_partial: f.allow_partial,
            merge_at_ms: f.merge_at_ms,
            scope: None,
        }),
        retired_leases: r
            .retired_leases
            .into_iter()
            .map(|l| RetiredLease {
                token_sha256: l.token_sha256,
                attempt: l.attempt,
                worker: l.worker,
                refusal_logged: l.refusal_logged,
            })
            .collect(),
        variants: r.variants,
        first_claimed_at_ms: r.first_claimed_at_ms,
    })
}
