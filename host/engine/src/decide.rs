//! Who decides: a step asks `Decide` for admissions, bucket weights, promotions, retries, splits
//! and merges. Each call is pure (the same inputs give the same answer), so a step stays
//! deterministic with the policies in it. The server's implementation is the policy registry
//! (`policy::PolicyDecider`); `NativeDecider` is the host's own rule, for the virtual-time
//! driver, tests and tools that run a scheduler alone, and for when every policy version faults.

use super::{DEFAULT_BUCKET_WEIGHTS, RetryDecision};
use policy_packed::{Bucket, Decision, Failure, Hit, View};
use sluice_model::{Admission, NamesRef, ShardFilter, TaskSpec, VariantTag, VectorQuery};

/// An answer and the policy version that gave it (none for the host's own rule).
#[derive(Clone, Debug, PartialEq)]
pub struct Decided<T> {
    pub answer: T,
    pub version: Option<u32>,
}

pub trait Decide: Send + Sync + 'static {
    /// One admission per spec, in order. `first_seq` numbers the specs in arrival order
    /// (`first_seq`, `first_seq + 1`, ...). Never fails: an implementation that cannot decide
    /// answers with `Admission::native`.
    fn admit(&self, now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission>;
    /// Urgent, normal and low.
    fn bucket_weights(&self, now_ms: u64) -> [u32; 3];
    /// Fair share inside a bucket: weights by tenant name; a tenant not named weighs 1.
    fn tenant_weights(&self, _now_ms: u64) -> Vec<(String, u32)> {
        Vec::new()
    }
    /// The index in `waiting` and the new bucket of each task to promote. `variant`: the
    /// live aging experiment's variant these tasks were all assigned, if any; `names[i]`:
    /// the names of task i.
    fn age(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        waiting: &[View],
        names: &[NamesRef<'_>],
    ) -> Decided<Vec<(u32, Bucket)>>;
    /// One decision per failure, in order. `variant`: the live retry experiment's variant
    /// these failures' tasks were all assigned, if any; `names[i]`: the names of failure i's
    /// task.
    fn retry(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        failures: &[Failure],
        names: &[NamesRef<'_>],
    ) -> Decided<Vec<RetryDecision>>;
    /// The children of a task to split: the part each covers and its weight, or the
    /// policy's reason to refuse. `Err` when no policy version could answer at all.
    fn split(&self, now_ms: u64, input: &SplitInput) -> Result<Decided<SplitAnswer>, String>;
    /// At most `k` hits, nearest first, each id once; or the policy's reason to refuse.
    /// `hits` are the children's hits packed with `Hit::write_part`; `variant`, the live merge
    /// experiment's variant the search was assigned. Never fails for a policy's sake: when
    /// every version faults, the host's own top-k merge answers.
    fn merge(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        k: u32,
        weights: &[f32],
        hits: &[u64],
    ) -> Decided<Result<Vec<Hit>, String>>;
}

/// What a split policy reads of a submitted task.
#[derive(Clone, Copy, Debug)]
pub struct SplitInput<'a> {
    pub spec: &'a TaskSpec,
    /// Its arrival order, as its admission's.
    pub seq: u64,
    pub query: &'a VectorQuery,
    /// The collection it searches, as it stands now.
    pub layout: &'a sluice_model::Layout,
}

/// A split policy's answer: each child's filter and weight, or its reason to refuse.
pub type SplitAnswer = Result<Vec<(ShardFilter, f32)>, String>;

/// The host's own merge: `merge-topk`'s logic, run natively.
pub fn native_merge(k: u32, weights: &[f32], hits: &[u64]) -> Result<Vec<Hit>, String> {
    merge_topk::merge(k, merge_topk::parts(weights, hits)?)
}

/// The default policies' own logic, run natively with their default settings (or others).
#[derive(Clone, Debug)]
pub struct NativeDecider {
    pub aging: aging_threshold::Settings,
    pub retry: retry_backoff::Settings,
    /// Urgent, normal and low, as the priority policy's defaults give them.
    pub bucket_weights: [u32; 3],
    /// Fair-share weights by tenant name (`priority-buckets`' `tenant_weights`); none named
    /// by default, so every tenant weighs 1.
    pub tenant_weights: Vec<(String, u32)>,
    /// Stored shards a search splits over, one child each (`split-shards`' `shards`); 0 for
    /// the collection's live shards (its default).
    pub shards: u32,
}

impl Default for NativeDecider {
    fn default() -> Self {
        NativeDecider {
            aging: aging_threshold::Settings::default(),
            retry: retry_backoff::Settings::default(),
            bucket_weights: DEFAULT_BUCKET_WEIGHTS,
            tenant_weights: Vec::new(),
            shards: 0,
        }
    }
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

impl Decide for NativeDecider {
    fn admit(&self, _now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission> {
        specs
            .iter()
            .zip(first_seq..)
            .map(|(spec, seq)| Admission::native(spec.priority, spec.est_exec_ms, seq))
            .collect()
    }

    fn bucket_weights(&self, _now_ms: u64) -> [u32; 3] {
        self.bucket_weights
    }

    fn tenant_weights(&self, _now_ms: u64) -> Vec<(String, u32)> {
        self.tenant_weights.clone()
    }

    fn age(
        &self,
        now_ms: u64,
        _variant: Option<VariantTag>,
        waiting: &[View],
        _names: &[NamesRef<'_>],
    ) -> Decided<Vec<(u32, Bucket)>> {
        Decided {
            answer: self.aging.age(now_ms, waiting),
            version: None,
        }
    }

    fn retry(
        &self,
        _now_ms: u64,
        _variant: Option<VariantTag>,
        failures: &[Failure],
        _names: &[NamesRef<'_>],
    ) -> Decided<Vec<RetryDecision>> {
        Decided {
            answer: failures.iter().map(|f| self.retry_decision(f)).collect(),
            version: None,
        }
    }

    /// One child per stored shard, of equal weight: `split-shards`' rule.
    fn split(&self, _now_ms: u64, input: &SplitInput) -> Result<Decided<SplitAnswer>, String> {
        let shards: Vec<u32> = if self.shards == 0 {
            input.layout.live.clone()
        } else {
            (0..self.shards).collect()
        };
        let answer = if shards.is_empty() {
            Err(format!(
                "no shard of collection `{}` has a live worker",
                input.layout.collection
            ))
        } else {
            Ok(shards
                .into_iter()
                .map(|shard| (ShardFilter::Shard(shard), 1.0))
                .collect())
        };
        Ok(Decided {
            answer,
            version: None,
        })
    }

    fn merge(
        &self,
        _now_ms: u64,
        _variant: Option<VariantTag>,
        k: u32,
        weights: &[f32],
        hits: &[u64],
    ) -> Decided<Result<Vec<Hit>, String>> {
        Decided {
            answer: native_merge(k, weights, hits),
            version: None,
        }
    }
}
