//! The scheduler's decisions through the policy registry: admissions, bucket weights,
//! promotions, retries, splits and merges, each packed for its policy and checked on the way back. When every
//! version of a kind faults, the host's own rule (`NativeDecider`) answers, so no task is ever
//! refused or stranded for a policy's sake.

use super::bindings::split::sluice::policy::types::{self as wit_types, TaskMeta};
use super::bindings::split_layout::{self as wit_split, SplitRequest};
use super::registry::PolicyRegistry;
use policy_packed::{Bucket, Failure, Hit, View, name_code};
use sluice_engine::{
    Decide, Decided, NativeDecider, SplitAnswer, SplitInput, native_merge, to_retry_decision,
};
use sluice_engine::{RetryDecision, from_bucket, to_bucket};
use sluice_model::{
    Admission, AssignBy, Assignments, Experiment, NamesRef, PolicyKind, ShardFilter, TaskSpec,
    VariantTag,
};
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

impl PolicyDecider {
    /// Admissions of tasks of one priority variant (or of none).
    fn admit_group(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        views: &[View],
        specs: &[&TaskSpec],
        first_seq: u64,
    ) -> Vec<Admission> {
        let names: Vec<NamesRef> = specs.iter().map(|&spec| spec.into()).collect();
        match self.registry.admit(now_ms, variant, views, &names) {
            Ok(decided) => decided
                .answer
                .iter()
                .map(|answer| Admission {
                    bucket: from_bucket(answer.bucket),
                    rank: answer.rank,
                    attempt_timeout_ms: answer.attempt_timeout_ms,
                    policy_version: Some(decided.version),
                    variants: Assignments::default(),
                })
                .collect(),
            Err(error) => {
                tracing::error!(%error, "every priority policy version faulted; admitting by the host's rule");
                self.native.admit(now_ms, first_seq, specs)
            }
        }
    }
}

/// The variant of each running live experiment a new task falls in.
fn assign(live: &[Experiment], spec: &TaskSpec, seq: u64) -> Assignments {
    let mut assignments = Assignments::default();
    for experiment in live {
        let seq_bytes = seq.to_be_bytes();
        let key: &[u8] = match experiment.assign_by {
            AssignBy::Task => &seq_bytes,
            AssignBy::Device => spec.device.as_bytes(),
            AssignBy::Tenant => spec.tenant.as_bytes(),
        };
        assignments.set(VariantTag {
            kind: experiment.kind,
            experiment: experiment.id,
            variant: experiment.assign(key),
        });
    }
    assignments
}

impl Decide for PolicyDecider {
    fn admit(&self, now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission> {
        let views: Vec<View> = specs
            .iter()
            .zip(first_seq..)
            .map(|(spec, seq)| view(now_ms, seq, spec))
            .collect();
        let live = self.registry.live_experiments();
        if live.is_empty() {
            return self.admit_group(now_ms, None, &views, specs, first_seq);
        }
        let assigned: Vec<Assignments> = specs
            .iter()
            .zip(first_seq..)
            .map(|(spec, seq)| assign(&live, spec, seq))
            .collect();
        // A live priority experiment: each variant admits its own tasks, in one call each.
        let mut admissions: Vec<Option<Admission>> = vec![None; specs.len()];
        let mut groups: std::collections::BTreeMap<Option<u8>, Vec<usize>> = Default::default();
        for (index, assignments) in assigned.iter().enumerate() {
            let variant = assignments.get(PolicyKind::Priority).map(|t| t.variant);
            groups.entry(variant).or_default().push(index);
        }
        for indices in groups.into_values() {
            let tag = assigned[indices[0]].get(PolicyKind::Priority);
            let group_views: Vec<View> = indices.iter().map(|&i| views[i]).collect();
            let group_specs: Vec<&TaskSpec> = indices.iter().map(|&i| specs[i]).collect();
            // The native rule numbers from `first_seq`: each task keeps its own seq in its view.
            let answers = self.admit_group(now_ms, tag, &group_views, &group_specs, first_seq);
            for (&index, mut admission) in indices.iter().zip(answers) {
                if admission.policy_version.is_none() {
                    admission.rank = views[index].seq;
                }
                admission.variants = assigned[index];
                admissions[index] = Some(admission);
            }
        }
        admissions
            .into_iter()
            .zip(specs.iter().zip(first_seq..))
            .map(|(admission, (spec, seq))| {
                admission.unwrap_or_else(|| Admission::native(spec.priority, spec.est_exec_ms, seq))
            })
            .collect()
    }

    fn tenant_weights(&self, now_ms: u64) -> Vec<(String, u32)> {
        match self.registry.tenant_weights(now_ms) {
            Ok(decided) => decided.answer.unwrap_or_default(),
            Err(error) => {
                tracing::error!(%error, "every priority policy version faulted; every tenant weighs the same");
                self.native.tenant_weights(now_ms)
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

    fn age(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        waiting: &[View],
        names: &[NamesRef<'_>],
    ) -> Decided<Vec<(u32, Bucket)>> {
        match self.registry.age(now_ms, variant, waiting, names) {
            Ok(decided) => Decided {
                answer: decided.answer,
                version: Some(decided.version),
            },
            Err(error) => {
                tracing::error!(%error, "every aging policy version faulted; aging by the host's rule");
                self.native.age(now_ms, variant, waiting, names)
            }
        }
    }

    fn retry(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        failures: &[Failure],
        names: &[NamesRef<'_>],
    ) -> Decided<Vec<RetryDecision>> {
        match self.registry.retry(now_ms, variant, failures, names) {
            Ok(decided) => Decided {
                answer: decided.answer.into_iter().map(to_retry_decision).collect(),
                version: Some(decided.version),
            },
            Err(error) => {
                tracing::error!(%error, "every retry policy version faulted; deciding by the host's rule");
                self.native.retry(now_ms, variant, failures, names)
            }
        }
    }

    fn split(&self, now_ms: u64, input: &SplitInput) -> Result<Decided<SplitAnswer>, String> {
        let request = split_request(now_ms, input);
        match self.registry.split(now_ms, &request) {
            Ok(decided) => Ok(Decided {
                answer: decided.answer.map(|children| {
                    children
                        .into_iter()
                        .map(|child| (shard_filter(child.filter), child.weight))
                        .collect()
                }),
                version: Some(decided.version),
            }),
            Err(error) => Err(format!("no split policy version could answer: {error}")),
        }
    }

    fn merge(
        &self,
        now_ms: u64,
        variant: Option<VariantTag>,
        k: u32,
        weights: &[f32],
        hits: &[u64],
    ) -> Decided<Result<Vec<Hit>, String>> {
        match self.registry.merge(now_ms, variant, k, weights, hits) {
            Ok(decided) => Decided {
                answer: decided.answer,
                version: Some(decided.version),
            },
            Err(error) => {
                tracing::error!(%error, "every merge policy version faulted; merging by the host's top-k");
                Decided {
                    answer: native_merge(k, weights, hits),
                    version: None,
                }
            }
        }
    }
}

fn wit_bucket(bucket: Bucket) -> wit_types::Bucket {
    match bucket {
        Bucket::Urgent => wit_types::Bucket::Urgent,
        Bucket::Normal => wit_types::Bucket::Normal,
        Bucket::Low => wit_types::Bucket::Low,
    }
}

/// A split's input as the split world's request: what the host sends a split component.
pub fn split_request(now_ms: u64, input: &SplitInput) -> SplitRequest {
    let spec = input.spec;
    let packed = view(now_ms, input.seq, spec);
    SplitRequest {
        task: TaskMeta {
            view: wit_types::TaskView {
                seq: packed.seq,
                tenant: packed.tenant,
                kind: packed.kind,
                bucket: wit_bucket(packed.bucket),
                submitted_bucket: wit_bucket(packed.submitted_bucket),
                created_ms: packed.created_ms,
                bucket_since_ms: packed.bucket_since_ms,
                attempt: packed.attempt,
                est_exec_ms: packed.est_exec_ms,
            },
            kind_name: spec.kind.clone(),
            tenant_name: spec.tenant.clone(),
            device: spec.device.clone(),
            labels: spec
                .labels
                .iter()
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
        },
        vector: input.query.vector.clone(),
        k: input.query.k,
        nprobe: input.query.nprobe,
        layout: wit_split::Layout {
            collection: input.layout.collection.clone(),
            dim: input.layout.dim,
            shards: input.layout.shards,
            live: input.layout.live.clone(),
        },
    }
}

/// A shard filter a split component answered, as the model's.
pub fn shard_filter(filter: wit_split::ShardFilter) -> ShardFilter {
    match filter {
        wit_split::ShardFilter::Shard(shard) => ShardFilter::Shard(shard),
        wit_split::ShardFilter::IdRange((low, high)) => ShardFilter::IdRange(low, high),
        wit_split::ShardFilter::IdHash((bucket, of)) => ShardFilter::IdHash { bucket, of },
        wit_split::ShardFilter::Centroids(lists) => ShardFilter::Centroids(lists),
    }
}
