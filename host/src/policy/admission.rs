//! Admission through the priority policy: task specs become the WIT `task-meta` records, one
//! batch per request, and the answers become the engine's `Admission` inputs.

use super::bindings::priority::sluice::policy::types::{Bucket, TaskMeta, TaskView};
use super::registry::PolicyRegistry;
use crate::model::{Admission, Priority, TaskSpec};
use crate::scheduler::Admitter;
use std::sync::Arc;

/// A stable 32-bit code for a tenant or kind name (FNV-1a), so that hot records carry an
/// integer and a replay on another process gets the same codes.
pub fn name_code(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(0x0100_0193)
    })
}

fn to_bucket(priority: Priority) -> Bucket {
    match priority {
        Priority::Urgent => Bucket::Urgent,
        Priority::Normal => Bucket::Normal,
        Priority::Low => Bucket::Low,
    }
}

fn from_bucket(bucket: Bucket) -> Priority {
    match bucket {
        Bucket::Urgent => Priority::Urgent,
        Bucket::Normal => Priority::Normal,
        Bucket::Low => Priority::Low,
    }
}

fn meta(now_ms: u64, seq: u64, spec: &TaskSpec) -> TaskMeta {
    TaskMeta {
        view: TaskView {
            seq,
            tenant: name_code(&spec.tenant),
            kind: name_code(&spec.kind),
            bucket: to_bucket(spec.priority),
            submitted_bucket: to_bucket(spec.priority),
            created_ms: now_ms,
            bucket_since_ms: now_ms,
            attempt: 0,
            est_exec_ms: spec.est_exec_ms,
        },
        kind_name: spec.kind.clone(),
        tenant_name: spec.tenant.clone(),
        device: spec.device.clone(),
        labels: spec
            .labels
            .iter()
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
    }
}

/// Admits through the registry's priority policy; when every version faults, by the host's
/// own rule, so a submission is never refused for a policy's sake.
pub struct PolicyAdmitter(pub Arc<PolicyRegistry>);

impl Admitter for PolicyAdmitter {
    fn admit(&self, now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission> {
        let metas: Vec<TaskMeta> = specs
            .iter()
            .zip(first_seq..)
            .map(|(spec, seq)| meta(now_ms, seq, spec))
            .collect();
        match self.0.admit(now_ms, &metas) {
            Ok(decided) => decided
                .answer
                .iter()
                .map(|answer| Admission {
                    bucket: from_bucket(answer.bucket),
                    rank: answer.rank,
                    attempt_timeout_ms: answer.attempt_timeout_ms,
                    policy_version: Some(decided.version),
                })
                .collect(),
            Err(error) => {
                tracing::error!(%error, "every priority policy version faulted; admitting by the host's rule");
                specs
                    .iter()
                    .zip(first_seq..)
                    .map(|(spec, seq)| Admission::native(spec.priority, spec.est_exec_ms, seq))
                    .collect()
            }
        }
    }
}
