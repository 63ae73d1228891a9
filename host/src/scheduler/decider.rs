//! Who decides: the writer asks a `Decider` for admissions, bucket weights, promotions and
//! retries, and hands each answer to the deterministic engine as an input, as it does the time.
//! The server's decider is the policy registry; `NativeDecider` is the host's own rule, for
//! tests and tools that run a scheduler alone, and for when every policy version faults.

use crate::engine::{DEFAULT_BUCKET_WEIGHTS, RetryDecision};
use crate::model::{Admission, TaskSpec};
use policy_packed::{Bucket, Decision, Failure, View};

/// An answer and the policy version that gave it (none for the host's own rule).
#[derive(Clone, Debug, PartialEq)]
pub struct Decided<T> {
    pub answer: T,
    pub version: Option<u32>,
}

pub trait Decider: Send + Sync + 'static {
    /// One admission per spec, in order. `first_seq` numbers the specs in arrival order
    /// (`first_seq`, `first_seq + 1`, ...). Never fails: an implementation that cannot decide
    /// answers with `Admission::native`.
    fn admit(&self, now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission>;
    /// Urgent, normal and low.
    fn bucket_weights(&self, now_ms: u64) -> [u32; 3];
    /// The index in `waiting` and the new bucket of each task to promote.
    fn age(&self, now_ms: u64, waiting: &[View]) -> Decided<Vec<(u32, Bucket)>>;
    /// One decision per failure, in order.
    fn retry(&self, now_ms: u64, failures: &[Failure]) -> Decided<Vec<RetryDecision>>;
}

/// The default policies' own logic, run natively with their default settings (or others).
#[derive(Clone, Debug, Default)]
pub struct NativeDecider {
    pub aging: aging_threshold::Settings,
    pub retry: retry_backoff::Settings,
}

impl NativeDecider {
    pub fn retry_decision(&self, failure: &Failure) -> RetryDecision {
        to_retry_decision(self.retry.decide(
            failure.class,
            failure.task.attempt,
            failure.max_attempts,
            failure.random,
        ))
    }
}

pub fn to_retry_decision(decision: Decision) -> RetryDecision {
    match decision {
        Decision::RetryAfterMs(delay_ms) => RetryDecision::RetryAfterMs(delay_ms),
        Decision::Dead(reason) => RetryDecision::Dead(reason.as_str().to_owned()),
    }
}

impl Decider for NativeDecider {
    fn admit(&self, _now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission> {
        specs
            .iter()
            .zip(first_seq..)
            .map(|(spec, seq)| Admission::native(spec.priority, spec.est_exec_ms, seq))
            .collect()
    }

    fn bucket_weights(&self, _now_ms: u64) -> [u32; 3] {
        DEFAULT_BUCKET_WEIGHTS
    }

    fn age(&self, now_ms: u64, waiting: &[View]) -> Decided<Vec<(u32, Bucket)>> {
        Decided {
            answer: self.aging.age(now_ms, waiting),
            version: None,
        }
    }

    fn retry(&self, _now_ms: u64, failures: &[Failure]) -> Decided<Vec<RetryDecision>> {
        Decided {
            answer: failures.iter().map(|f| self.retry_decision(f)).collect(),
            version: None,
        }
    }
}
