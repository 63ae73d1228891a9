//! The scheduler's decisions through the policy registry: admissions, bucket weights,
//! promotions and retries, each packed for its policy and checked on the way back. When every
//! version of a kind faults, the host's own rule (`NativeDecider`) answers, so no task is ever
//! refused or stranded for a policy's sake.

use super::registry::PolicyRegistry;
use crate::engine::{RetryDecision, from_bucket, to_bucket};
use crate::model::{Admission, TaskSpec};
use crate::scheduler::{Decided, Decider, NativeDecider, to_retry_decision};
use policy_packed::{Bucket, Failure, View, name_code};
use std::sync::Arc;

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

pub struct PolicyDecider {
    registry: Arc<PolicyRegistry>,
    native: NativeDecider,
}

impl PolicyDecider {
    pub fn new(registry: Arc<PolicyRegistry>) -> Self {
        PolicyDecider {
            registry,
            native: NativeDecider::default(),
        }
    }
}

impl Decider for PolicyDecider {
    fn admit(&self, now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission> {
        let views: Vec<View> = specs
            .iter()
            .zip(first_seq..)
            .map(|(spec, seq)| view(now_ms, seq, spec))
            .collect();
        match self.registry.admit(now_ms, &views) {
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
                self.native.admit(now_ms, first_seq, specs)
            }
        }
    }

    fn bucket_weights(&self, now_ms: u64) -> [u32; 3] {
        match self.registry.bucket_weights(now_ms) {
            Ok(decided) => match decided.answer[..] {
                [urgent, normal, low] => [urgent, normal, low],
                _ => self.native.bucket_weights(now_ms),
            },
            Err(error) => {
                tracing::error!(%error, "every priority policy version faulted; default bucket weights");
                self.native.bucket_weights(now_ms)
            }
        }
    }

    fn age(&self, now_ms: u64, waiting: &[View]) -> Decided<Vec<(u32, Bucket)>> {
        match self.registry.age(now_ms, waiting) {
            Ok(decided) => Decided {
                answer: decided.answer,
                version: Some(decided.version),
            },
            Err(error) => {
                tracing::error!(%error, "every aging policy version faulted; aging by the host's rule");
                self.native.age(now_ms, waiting)
            }
        }
    }

    fn retry(&self, now_ms: u64, failures: &[Failure]) -> Decided<Vec<RetryDecision>> {
        match self.registry.retry(now_ms, failures) {
            Ok(decided) => Decided {
                answer: decided.answer.into_iter().map(to_retry_decision).collect(),
                version: Some(decided.version),
            },
            Err(error) => {
                tracing::error!(%error, "every retry policy version faulted; deciding by the host's rule");
                self.native.retry(now_ms, failures)
            }
        }
    }
}
