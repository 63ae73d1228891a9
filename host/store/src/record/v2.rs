//! Format 2: postcard of `TaskV2` (also the body of format 3, see `v3`). Names and enums are stored as the model's stable codes
//! (`State::code`, `Priority::index`, `PolicyKind::code`), ids as their 16 bytes, the event
//! sequence numbers as differences (a task's events are near each other in the log), and a
//! result as its JSON text (postcard cannot carry a self-describing JSON value).

use super::corrupt;
use crate::StoreError;
use serde::{Deserialize, Serialize};
use sluice_model::{
    Callback, Family, FamilyPart, Lease, PolicyKind, Priority, Resources, RetiredLease, State,
    Task, TaskError, TaskId, VariantTag,
};
use std::borrow::Cow;
use std::collections::BTreeMap;

type Text<'a> = Cow<'a, str>;

#[derive(Serialize, Deserialize)]
struct TaskV2<'a> {
    id: [u8; 16],
    key: Option<Text<'a>>,
    kind: Text<'a>,
    priority: u8,
    bucket: u8,
    rank: u64,
    attempt_timeout_ms: u64,
    device: Text<'a>,
    tenant: Text<'a>,
    labels: Cow<'a, BTreeMap<String, String>>,
    est_exec_ms: u64,
    deadline_ms: Option<u64>,
    deadline_at_ms: Option<u64>,
    max_attempts: u32,
    callback_url: Option<Text<'a>>,
    gpu_memory_mb: u64,
    model: Option<Text<'a>>,
    concurrency_key: Option<Text<'a>>,
    preemptible: bool,
    preemptions: u32,
    created_at_ms: u64,
    updated_at_ms: u64,
    attempt: u32,
    state: u8,
    bucket_since_ms: u64,
    lease: Option<LeaseV2<'a>>,
    not_before_ms: Option<u64>,
    callback: Option<CallbackV2>,
    result_json: Option<Text<'a>>,
    error: Option<(Text<'a>, Text<'a>)>,
    /// The first sequence number, then each one's distance from the one before.
    event_seq_steps: Vec<u64>,
    parent: Option<[u8; 16]>,
    family: Option<FamilyV2<'a>>,
    retired_leases: Vec<RetiredLeaseV2<'a>>,
    /// (kind code, experiment, variant index).
    variants: Vec<(u8, u32, u8)>,
    first_claimed_at_ms: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct LeaseV2<'a> {
    worker: Text<'a>,
    token: Text<'a>,
    attempt: u32,
    expires_at_ms: u64,
    attempt_ends_at_ms: u64,
    claimed_at_ms: u64,
    started_at_ms: Option<u64>,
    gpu: Option<u32>,
    refusal_logged: bool,
    ended_at_ms: Option<u64>,
    stopped_at_ms: Option<u64>,
    claim_id: Option<Text<'a>>,
    revoked_at_ms: Option<u64>,
    revoked_for: Option<[u8; 16]>,
}

#[derive(Serialize, Deserialize)]
struct CallbackV2 {
    attempts: u32,
    next_at_ms: u64,
    delivered_at_ms: Option<u64>,
    gave_up: bool,
}

#[derive(Serialize, Deserialize)]
struct FamilyV2<'a> {
    parts: Vec<FamilyPartV2<'a>>,
    settled: u32,
    k: u32,
    allow_partial: bool,
    merge_at_ms: Option<u64>,
}

#[derive(Serialize, Deserialize)]
struct FamilyPartV2<'a> {
    task: [u8; 16],
    weight: f32,
    covers: Text<'a>,
}

#[derive(Serialize, Deserialize)]
struct RetiredLeaseV2<'a> {
    token_sha256: Text<'a>,
    attempt: u32,
    worker: Text<'a>,
    refusal_logged: bool,
}

fn text(value: &str) -> Text<'_> {
    Cow::Borrowed(value)
}

fn opt_text(value: &Option<String>) -> Option<Text<'_>> {
    value.as_deref().map(Cow::Borrowed)
}

/// `[format][postcard]`: the format byte, then `TaskV2`, to which format 3 appends its part.
pub(super) fn encode_body(task: &Task, format: u8) -> Result<Vec<u8>, StoreError> {
    let mut steps = Vec::with_capacity(task.event_seqs.len());
    let mut before = 0u64;
    for &seq in &task.event_seqs {
        debug_assert!(seq >= before, "a task's event seqs ascend");
        steps.push(seq.wrapping_sub(before));
        before = seq;
    }
    let record = TaskV2 {
        id: task.id.to_bytes(),
        key: opt_text(&task.key),
        kind: text(&task.kind),
        priority: task.priority.index() as u8,
        bucket: task.bucket.index() as u8,
        rank: task.rank,
        attempt_timeout_ms: task.attempt_timeout_ms,
        device: text(&task.device),
        tenant: text(&task.tenant),
        labels: Cow::Borrowed(&task.labels),
        est_exec_ms: task.est_exec_ms,
        deadline_ms: task.deadline_ms,
        deadline_at_ms: task.deadline_at_ms,
        max_attempts: task.max_attempts,
        callback_url: opt_text(&task.callback_url),
        gpu_memory_mb: task.resources.gpu_memory_mb,
        model: opt_text(&task.resources.model),
        concurrency_key: opt_text(&task.concurrency_key),
        preemptible: task.preemptible,
        preemptions: task.preemptions,
        created_at_ms: task.created_at_ms,
        updated_at_ms: task.updated_at_ms,
        attempt: task.attempt,
        state: task.state.code(),
        bucket_since_ms: task.bucket_since_ms,
        lease: task.lease.as_ref().map(|l| LeaseV2 {
            worker: text(&l.worker),
            token: text(&l.token),
            attempt: l.attempt,
            expires_at_ms: l.expires_at_ms,
            attempt_ends_at_ms: l.attempt_ends_at_ms,
            claimed_at_ms: l.claimed_at_ms,
            started_at_ms: l.started_at_ms,
            gpu: l.gpu,
            refusal_logged: l.refusal_logged,
            ended_at_ms: l.ended_at_ms,
            stopped_at_ms: l.stopped_at_ms,
            claim_id: opt_text(&l.claim_id),
            revoked_at_ms: l.revoked_at_ms,
            revoked_for: l.revoked_for.map(TaskId::to_bytes),
        }),
        not_before_ms: task.not_before_ms,
        callback: task.callback.as_ref().map(|c| CallbackV2 {
            attempts: c.attempts,
            next_at_ms: c.next_at_ms,
            delivered_at_ms: c.delivered_at_ms,
            gave_up: c.gave_up,
        }),
        // A `serde_json::Value` always prints; `to_string` only fails on a map with non-string
        // keys, which a `Value` cannot hold.
        result_json: task
            .result
            .as_ref()
            .map(|value| Cow::Owned(value.to_string())),
        error: task
            .error
            .as_ref()
            .map(|e| (text(&e.class), text(&e.message))),
        event_seq_steps: steps,
        parent: task.parent.map(TaskId::to_bytes),
        family: task.family.as_ref().map(|f| FamilyV2 {
            parts: f
                .parts
                .iter()
                .map(|p| FamilyPartV2 {
                    task: p.task.to_bytes(),
                    weight: p.weight,
                    covers: text(&p.covers),
                })
                .collect(),
            settled: f.settled,
            k: f.k,
            allow_partial: f.allow_partial,
            merge_at_ms: f.merge_at_ms,
        }),
        retired_leases: task
            .retired_leases
            .iter()
            .map(|r| RetiredLeaseV2 {
                token_sha256: text(&r.token_sha256),
                attempt: r.attempt,
                worker: text(&r.worker),
                refusal_logged: r.refusal_logged,
            })
            .collect(),
        variants: task
            .variants
            .iter()
            .map(|v| (v.kind.code(), v.experiment, v.variant))
            .collect(),
        first_claimed_at_ms: task.first_claimed_at_ms,
    };
    let mut out = Vec::with_capacity(160 + task.kind.len() + task.device.len());
    out.push(format);
    // Writing into a Vec does not fail and every field is a type postcard encodes, but an error
    // stays an error rather than a panic on the commit path.
    postcard::to_extend(&record, out).map_err(|e| corrupt(format!("format 2: {e}")))
}

/// The task a `TaskV2` holds, and the bytes after it (format 3's part).
pub(super) fn decode_body(bytes: &[u8]) -> Result<(Task, &[u8]), StoreError> {
    let (r, rest): (TaskV2<'_>, _) =
        postcard::take_from_bytes(bytes).map_err(|e| corrupt(format!("format 2: {e}")))?;
    let mut event_seqs = Vec::with_capacity(r.event_seq_steps.len());
    let mut seq = 0u64;
    for step in r.event_seq_steps {
        seq = seq
            .checked_add(step)
            .ok_or_else(|| corrupt("format 2: event seq overflows".to_owned()))?;
        event_seqs.push(seq);
    }
    let variants = r
        .variants
        .into_iter()
        .map(|(kind, experiment, variant)| {
            let kind = PolicyKind::ALL
                .get(usize::from(kind))
                .copied()
                .ok_or_else(|| corrupt(format!("format 2: unknown policy kind code {kind}")))?;
            Ok(VariantTag {
                kind,
                experiment,
                variant,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let result = match r.result_json {
        Some(json) => Some(
            serde_json::from_str(&json).map_err(|e| corrupt(format!("format 2: result: {e}")))?,
        ),
        None => None,
    };
    let task = Task {
        id: TaskId::from_bytes(r.id),
        key: r.key.map(Cow::into_owned),
        kind: r.kind.into_owned(),
        priority: priority(r.priority)?,
        bucket: priority(r.bucket)?,
        rank: r.rank,
        attempt_timeout_ms: r.attempt_timeout_ms,
        device: r.device.into_owned(),
        tenant: r.tenant.into_owned(),
        labels: r.labels.into_owned(),
        est_exec_ms: r.est_exec_ms,
        deadline_ms: r.deadline_ms,
        deadline_at_ms: r.deadline_at_ms,
        max_attempts: r.max_attempts,
        callback_url: r.callback_url.map(Cow::into_owned),
        resources: Resources {
            gpu_memory_mb: r.gpu_memory_mb,
            model: r.model.map(Cow::into_owned),
            // Format 4's part, when the record has one.
            batch_key: None,
        },
        concurrency_key: r.concurrency_key.map(Cow::into_owned),
        preemptible: r.preemptible,
        preemptions: r.preemptions,
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        attempt: r.attempt,
        state: State::from_code(r.state)
            .ok_or_else(|| corrupt(format!("format 2: unknown state code {}", r.state)))?,
        bucket_since_ms: r.bucket_since_ms,
        lease: r.lease.map(|l| Lease {
            worker: l.worker.into_owned(),
            token: l.token.into_owned(),
            attempt: l.attempt,
            expires_at_ms: l.expires_at_ms,
            attempt_ends_at_ms: l.attempt_ends_at_ms,
            claimed_at_ms: l.claimed_at_ms,
            started_at_ms: l.started_at_ms,
            gpu: l.gpu,
            refusal_logged: l.refusal_logged,
            ended_at_ms: l.ended_at_ms,
            stopped_at_ms: l.stopped_at_ms,
            claim_id: l.claim_id.map(Cow::into_owned),
            revoked_at_ms: l.revoked_at_ms,
            revoked_for: l.revoked_for.map(TaskId::from_bytes),
        }),
        not_before_ms: r.not_before_ms,
        callback: r.callback.map(|c| Callback {
            attempts: c.attempts,
            next_at_ms: c.next_at_ms,
            delivered_at_ms: c.delivered_at_ms,
            gave_up: c.gave_up,
        }),
        result,
        error: r.error.map(|(class, message)| TaskError {
            class: class.into_owned(),
            message: message.into_owned(),
        }),
        event_seqs,
        parent: r.parent.map(TaskId::from_bytes),
        family: r.family.map(|f| Family {
            parts: f
                .parts
                .into_iter()
                .map(|p| FamilyPart {
                    task: TaskId::from_bytes(p.task),
                    weight: p.weight,
                    covers: p.covers.into_owned(),
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
                token_sha256: l.token_sha256.into_owned(),
                attempt: l.attempt,
                worker: l.worker.into_owned(),
                refusal_logged: l.refusal_logged,
            })
            .collect(),
        variants,
        first_claimed_at_ms: r.first_claimed_at_ms,
    };
    Ok((task, rest))
}

fn priority(index: u8) -> Result<Priority, StoreError> {
    Priority::from_index(usize::from(index))
        .ok_or_else(|| corrupt(format!("format 2: unknown priority index {index}")))
}
