//! Admission through the priority policy: task specs become packed task views, one batch per
//! request, and the answers become the engine's `Admission` inputs.

use super::registry::PolicyRegistry;
use crate::model::{Admission, Priority, TaskSpec};
use crate::scheduler::Admitter;
use policy_packed::{Bucket, View, name_code};
use std::sync::Arc;

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

fn view(now_ms: u64, seq: u64, spec: &TaskSpec) -> View {
    View {
        seq,
        tenant: name_code(&spec.tenant),
        kind: name_code(&spec.kind),
        bucket: to_bucket(spec.priority),
        submitted_bucket: to_bucket(spec.priority),
        created_ms: now_ms,
        bucket_since_ms: now_ms,
        attempt: 0,
        est_exec_ms: spec.est_exec_ms,
    }
}

/// Admits through the registry's priority policy; when every version faults, by the host's
/// own rule, so a submission is never refused for a policy's sake.
pub struct PolicyAdmitter(pub Arc<PolicyRegistry>);

impl Admitter for PolicyAdmitter {
    fn admit(&self, now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission> {
        let views: Vec<View> = specs
            .iter()
            .zip(first_seq..)
            .map(|(spec, seq)| view(now_ms, seq, spec))
            .collect();
        match self.0.admit(now_ms, &views) {
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
