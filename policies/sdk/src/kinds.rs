//! One trait per policy kind, the glue from each kind's WIT exports to its trait (batch and
//! `-one` calls alike), and the macros that export a type implementing the trait.

use crate::split::{ShardFilter, SplitRequest, Subtask, without_layout as old};
use crate::{Failure, Instance, NO_NAMES, Names, Task};
use alloc::string::String;
use alloc::vec::Vec;
use policy_config::Config;
use policy_packed::{
    ADMISSION_WORDS, Admission, Bucket, Decision, FAILURE_WORDS, FailureWords, Hit, Part,
    VIEW_WORDS, View,
};

/// Admission: the bucket a task waits in, its rank there (lower first), and how long one
/// attempt may run.
pub trait Priority: Sized + 'static {
    fn init(config: &Config) -> Result<Self, String>;
    /// Shares of claims served from urgent, normal and low.
    fn bucket_weights(&self) -> [u32; 3];
    fn admit(&self, now_ms: u64, task: &Task) -> Admission;
    /// Fair share inside a bucket: weights (1 to 10,000) by tenant name; a tenant not named
    /// weighs 1. The default names none: every tenant the same.
    fn tenant_weights(&self) -> Vec<(String, u32)> {
        Vec::new()
    }
}

/// Aging: the bucket to move a task to, if it has waited too long where it is.
pub trait Aging: Sized + 'static {
    fn init(config: &Config) -> Result<Self, String>;
    fn promote(&self, now_ms: u64, task: &Task) -> Option<Bucket>;
}

/// Retry: what becomes of a failed attempt (a delay, or dead).
pub trait Retry: Sized + 'static {
    fn init(config: &Config) -> Result<Self, String>;
    fn decide(&self, now_ms: u64, failure: &Failure) -> Decision;
}

/// Split: the children of a task too large for one worker.
pub trait Split: Sized + 'static {
    fn init(config: &Config) -> Result<Self, String>;
    fn split(&self, request: &SplitRequest) -> Result<Vec<Subtask>, String>;
}

/// Merge: one answer from the children's answers, at most `k` hits, nearest first, each id
/// once.
pub trait Merge: Sized + 'static {
    fn init(config: &Config) -> Result<Self, String>;
    fn merge(&self, k: u32, parts: Vec<Part>) -> Result<Vec<Hit>, String>;
}

/// The exports' bodies, generic over the policy; the macros call these.
pub mod glue {
    use super::*;

    /// A word no decision has: the host counts it as a fault of the policy.
    const UNUSABLE: u64 = u64::MAX;

    /// A batch's names as the host sent them (`named-*` exports): each distinct one, and which
    /// one each task has. `None` for a call without names (the tasks' names are empty).
    pub type BatchNames<'a> = Option<(&'a [Names], &'a [u32])>;

    /// Task `index`'s names; `None` when the host sent too few (a fault it counts).
    fn names_at<'a>(names: BatchNames<'a>, index: usize) -> Option<&'a Names> {
        match names {
            None => Some(&NO_NAMES),
            Some((distinct, which)) => distinct.get(*which.get(index)? as usize),
        }
    }

    pub fn init<P>(
        instance: &Instance<P>,
        config: &[u8],
        known: &[&str],
        make: fn(&Config) -> Result<P, String>,
    ) -> Result<(), String> {
        let config = Config::parse(config, known)?;
        instance.set(make(&config)?);
        Ok(())
    }

    pub fn bucket_weights<P: Priority>(instance: &Instance<P>) -> Vec<u32> {
        instance
            .with(|p| p.bucket_weights().to_vec())
            .unwrap_or_default()
    }

    pub fn tenant_weights<P: Priority>(instance: &Instance<P>) -> Vec<(String, u32)> {
        instance.with(|p| p.tenant_weights()).unwrap_or_default()
    }

    pub fn admit<P: Priority>(
        instance: &Instance<P>,
        now_ms: u64,
        tasks: &[u64],
        names: BatchNames,
    ) -> Vec<u64> {
        instance
            .with(|p| {
                let mut answers = Vec::with_capacity(tasks.len() / VIEW_WORDS * ADMISSION_WORDS);
                // A malformed view ends the answer short: a fault the host counts.
                for (index, words) in tasks.chunks_exact(VIEW_WORDS).enumerate() {
                    let Ok(view) = View::read(words) else { break };
                    let Some(names) = names_at(names, index) else {
                        break;
                    };
                    p.admit(now_ms, &Task::new(view, names)).write(&mut answers);
                }
                answers
            })
            .unwrap_or_default()
    }

    pub fn admit_one<P: Priority>(
        instance: &Instance<P>,
        now_ms: u64,
        task: (u64, u64, u64, u64, u64, u64),
        names: &Names,
    ) -> (u64, u64, u64) {
        View::from_words(task)
            .ok()
            .and_then(|view| instance.with(|p| p.admit(now_ms, &Task::new(view, names)).words()))
            .unwrap_or((UNUSABLE, 0, 0))
    }

    /// Promotions as (index in `waiting`, bucket), for the bindings' record.
    pub fn age<P: Aging>(
        instance: &Instance<P>,
        now_ms: u64,
        waiting: &[u64],
        names: BatchNames,
    ) -> Vec<(u32, Bucket)> {
        instance
            .with(|p| {
                let mut promotions = Vec::new();
                for (index, words) in waiting.chunks_exact(VIEW_WORDS).enumerate() {
                    let Ok(view) = View::read(words) else { break };
                    let Some(names) = names_at(names, index) else {
                        break;
                    };
                    if let Some(to) = p.promote(now_ms, &Task::new(view, names)) {
                        promotions.push((index as u32, to));
                    }
                }
                promotions
            })
            .unwrap_or_default()
    }

    pub fn age_one<P: Aging>(
        instance: &Instance<P>,
        now_ms: u64,
        task: (u64, u64, u64, u64, u64, u64),
        names: &Names,
    ) -> Option<Bucket> {
        let view = View::from_words(task).ok()?;
        instance
            .with(|p| p.promote(now_ms, &Task::new(view, names)))
            .flatten()
    }

    pub fn decide<P: Retry>(
        instance: &Instance<P>,
        now_ms: u64,
        failures: &[u64],
        names: BatchNames,
    ) -> Vec<u64> {
        instance
            .with(|p| {
                let mut decisions = Vec::with_capacity(failures.len() / FAILURE_WORDS);
                for (index, words) in failures.chunks_exact(FAILURE_WORDS).enumerate() {
                    let Ok(failure) = policy_packed::Failure::read(words) else {
                        break;
                    };
                    let Some(names) = names_at(names, index) else {
                        break;
                    };
                    decisions.push(p.decide(now_ms, &Failure::new(failure, names)).word());
                }
                decisions
            })
            .unwrap_or_default()
    }

    pub fn decide_one<P: Retry>(
        instance: &Instance<P>,
        now_ms: u64,
        failure: FailureWords,
        names: &Names,
    ) -> u64 {
        policy_packed::Failure::from_words(failure)
            .ok()
            .and_then(|failure| {
                instance.with(|p| p.decide(now_ms, &Failure::new(failure, names)).word())
            })
            .unwrap_or(UNUSABLE)
    }

    pub fn split<P: Split>(
        instance: &Instance<P>,
        request: &SplitRequest,
    ) -> Result<Vec<Subtask>, String> {
        instance
            .with(|p| p.split(request))
            .unwrap_or_else(|| Err("the policy was not initialised".into()))
    }

    /// The 0.1.0 `split` export: the same policy, told the layout is unknown (no collection,
    /// 0 shards, none live), its children in the older types.
    pub fn split_without_layout<P: Split>(
        instance: &Instance<P>,
        request: old::SplitRequest,
    ) -> Result<Vec<old::Subtask>, String> {
        let dim = request.vector.len() as u32;
        let request = SplitRequest {
            task: request.task,
            vector: request.vector,
            k: request.k,
            nprobe: request.nprobe,
            layout: crate::split::Layout {
                collection: String::new(),
                dim,
                shards: 0,
                live: Vec::new(),
            },
        };
        let children = split(instance, &request)?;
        Ok(children
            .into_iter()
            .map(|child| old::Subtask {
                filter: match child.filter {
                    ShardFilter::Shard(shard) => old::ShardFilter::Shard(shard),
                    ShardFilter::IdRange(range) => old::ShardFilter::IdRange(range),
                    ShardFilter::IdHash(hash) => old::ShardFilter::IdHash(hash),
                    ShardFilter::Centroids(lists) => old::ShardFilter::Centroids(lists),
                },
                weight: child.weight,
            })
            .collect())
    }

    pub fn merge<P: Merge>(
        instance: &Instance<P>,
        k: u32,
        weights: &[f32],
        hits: &[u64],
    ) -> Result<Vec<u64>, String> {
        let parts = policy_packed::parts(weights, hits)?;
        let merged = instance
            .with(|p| p.merge(k, parts))
            .unwrap_or_else(|| Err("the policy was not initialised".into()))?;
        Ok(policy_packed::pack_hits(&merged))
    }
}

/// Exports `$policy: Priority` as a priority-policy component; `settings` are the names its
/// config may set (any other is refused at `init`). The policy reads each task's names; with
/// `names = false` it says it reads none, the host sends none, and every task's names are
/// empty (the default policies, which rank by bucket and arrival alone, save their copy).
#[macro_export]
macro_rules! priority_policy {
    ($policy:ty, settings = $names:expr, names = false $(,)?) => {
        $crate::__priority_export!($policy, $names, false);
    };
    ($policy:ty, settings = $names:expr $(,)?) => {
        $crate::__priority_export!($policy, $names, true);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __priority_export {
    ($policy:ty, $names:expr, $reads_names:literal) => {
        #[cfg(target_arch = "wasm32")]
        mod __sluice_policy_export {
            use super::*;
            use $crate::__private::{NO_NAMES, String, Vec, glue, names};
            use $crate::bindings::priority::exports::sluice::policy::fairness::Guest as Fairness;
            use $crate::bindings::priority::exports::sluice::policy::named_priority::Guest as Named;
            use $crate::bindings::priority::exports::sluice::policy::priority::Guest;
            use $crate::bindings::priority::sluice::policy::names::TaskNames;
            static INSTANCE: $crate::Instance<$policy> = $crate::Instance::new();
            pub struct Component;
            impl Fairness for Component {
                fn tenant_weights() -> Vec<(String, u32)> {
                    glue::tenant_weights(&INSTANCE)
                }
            }
            impl Guest for Component {
                fn init(config: Vec<u8>) -> Result<(), String> {
                    glue::init(&INSTANCE, &config, &$names, <$policy as $crate::Priority>::init)
                }
                fn bucket_weights() -> Vec<u32> {
                    glue::bucket_weights(&INSTANCE)
                }
                fn admit(now_ms: u64, tasks: Vec<u64>) -> Vec<u64> {
                    glue::admit(&INSTANCE, now_ms, &tasks, None)
                }
                fn admit_one(now_ms: u64, task: (u64, u64, u64, u64, u64, u64)) -> (u64, u64, u64) {
                    glue::admit_one(&INSTANCE, now_ms, task, &NO_NAMES)
                }
            }
            impl Named for Component {
                fn reads_names() -> bool {
                    $reads_names
                }
                fn admit(now_ms: u64, tasks: Vec<u64>, names: Vec<TaskNames>, which: Vec<u32>) -> Vec<u64> {
                    let names = names!(names);
                    glue::admit(&INSTANCE, now_ms, &tasks, Some((&names, &which)))
                }
                fn admit_one(now_ms: u64, task: (u64, u64, u64, u64, u64, u64), names: TaskNames) -> (u64, u64, u64) {
                    glue::admit_one(&INSTANCE, now_ms, task, &names!(one names))
                }
            }
            $crate::bindings::priority::__export_priority_world!(Component with_types_in $crate::bindings::priority);
        }
    };
}

/// The SDK's names from the bindings' record: `names!(list)` for a batch's, `names!(one
/// record)` for one task's.
#[doc(hidden)]
#[macro_export]
macro_rules! __names {
    (one $record:expr) => {{
        let record = $record;
        $crate::Names {
            kind: record.kind,
            tenant: record.tenant,
            device: record.device,
            labels: record.labels,
        }
    }};
    ($list:expr) => {
        $list
            .into_iter()
            .map(|record| $crate::__names!(one record))
            .collect::<$crate::__private::Vec<$crate::Names>>()
    };
}

/// Exports `$policy: Aging` as an aging-policy component; `names = false` as in
/// [`priority_policy!`].
#[macro_export]
macro_rules! aging_policy {
    ($policy:ty, settings = $names:expr, names = false $(,)?) => {
        $crate::__aging_export!($policy, $names, false);
    };
    ($policy:ty, settings = $names:expr $(,)?) => {
        $crate::__aging_export!($policy, $names, true);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __aging_export {
    ($policy:ty, $names:expr, $reads_names:literal) => {
        #[cfg(target_arch = "wasm32")]
        mod __sluice_policy_export {
            use super::*;
            use $crate::__private::{NO_NAMES, String, Vec, glue, names};
            use $crate::bindings::aging::exports::sluice::policy::aging::{Guest, Promotion};
            use $crate::bindings::aging::exports::sluice::policy::named_aging;
            use $crate::bindings::aging::sluice::policy::names::TaskNames;
            use $crate::bindings::aging::sluice::policy::types::Bucket as WitBucket;
            static INSTANCE: $crate::Instance<$policy> = $crate::Instance::new();
            fn wit(bucket: $crate::Bucket) -> WitBucket {
                match bucket {
                    $crate::Bucket::Urgent => WitBucket::Urgent,
                    $crate::Bucket::Normal => WitBucket::Normal,
                    $crate::Bucket::Low => WitBucket::Low,
                }
            }
            pub struct Component;
            impl Guest for Component {
                fn init(config: Vec<u8>) -> Result<(), String> {
                    glue::init(&INSTANCE, &config, &$names, <$policy as $crate::Aging>::init)
                }
                fn age(now_ms: u64, waiting: Vec<u64>) -> Vec<Promotion> {
                    glue::age(&INSTANCE, now_ms, &waiting, None)
                        .into_iter()
                        .map(|(index, to)| Promotion { index, to: wit(to) })
                        .collect()
                }
                fn age_one(now_ms: u64, task: (u64, u64, u64, u64, u64, u64)) -> Option<WitBucket> {
                    glue::age_one(&INSTANCE, now_ms, task, &NO_NAMES).map(wit)
                }
            }
            impl named_aging::Guest for Component {
                fn reads_names() -> bool {
                    $reads_names
                }
                fn age(now_ms: u64, waiting: Vec<u64>, names: Vec<TaskNames>, which: Vec<u32>) -> Vec<named_aging::Promotion> {
                    let names = names!(names);
                    glue::age(&INSTANCE, now_ms, &waiting, Some((&names, &which)))
                        .into_iter()
                        .map(|(index, to)| named_aging::Promotion { index, to: wit(to) })
                        .collect()
                }
                fn age_one(now_ms: u64, task: (u64, u64, u64, u64, u64, u64), names: TaskNames) -> Option<WitBucket> {
                    glue::age_one(&INSTANCE, now_ms, task, &names!(one names)).map(wit)
                }
            }
            $crate::bindings::aging::__export_aging_world!(Component with_types_in $crate::bindings::aging);
        }
    };
}

/// Exports `$policy: Retry` as a retry-policy component; `names = false` as in
/// [`priority_policy!`].
#[macro_export]
macro_rules! retry_policy {
    ($policy:ty, settings = $names:expr, names = false $(,)?) => {
        $crate::__retry_export!($policy, $names, false);
    };
    ($policy:ty, settings = $names:expr $(,)?) => {
        $crate::__retry_export!($policy, $names, true);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __retry_export {
    ($policy:ty, $names:expr, $reads_names:literal) => {
        #[cfg(target_arch = "wasm32")]
        mod __sluice_policy_export {
            use super::*;
            use $crate::__private::{NO_NAMES, String, Vec, glue, names};
            use $crate::bindings::retry::exports::sluice::policy::named_retry;
            use $crate::bindings::retry::exports::sluice::policy::retry::Guest;
            use $crate::bindings::retry::sluice::policy::names::TaskNames;
            static INSTANCE: $crate::Instance<$policy> = $crate::Instance::new();
            pub struct Component;
            impl Guest for Component {
                fn init(config: Vec<u8>) -> Result<(), String> {
                    glue::init(&INSTANCE, &config, &$names, <$policy as $crate::Retry>::init)
                }
                fn decide(now_ms: u64, failures: Vec<u64>) -> Vec<u64> {
                    glue::decide(&INSTANCE, now_ms, &failures, None)
                }
                fn decide_one(
                    now_ms: u64,
                    failure: (u64, u64, u64, u64, u64, u64, u64, u64),
                ) -> u64 {
                    glue::decide_one(&INSTANCE, now_ms, failure, &NO_NAMES)
                }
            }
            impl named_retry::Guest for Component {
                fn reads_names() -> bool {
                    $reads_names
                }
                fn decide(now_ms: u64, failures: Vec<u64>, names: Vec<TaskNames>, which: Vec<u32>) -> Vec<u64> {
                    let names = names!(names);
                    glue::decide(&INSTANCE, now_ms, &failures, Some((&names, &which)))
                }
                fn decide_one(
                    now_ms: u64,
                    failure: (u64, u64, u64, u64, u64, u64, u64, u64),
                    names: TaskNames,
                ) -> u64 {
                    glue::decide_one(&INSTANCE, now_ms, failure, &names!(one names))
                }
            }
            $crate::bindings::retry::__export_retry_world!(Component with_types_in $crate::bindings::retry);
        }
    };
}

/// Exports `$policy: Split` as a split-policy component.
#[macro_export]
macro_rules! split_policy {
    ($policy:ty, settings = $names:expr $(,)?) => {
        #[cfg(target_arch = "wasm32")]
        mod __sluice_policy_export {
            use super::*;
            use $crate::__private::{String, Vec, glue};
            use $crate::bindings::split::exports::sluice::policy::{split, split_layout};
            use $crate::split::without_layout as old;
            static INSTANCE: $crate::Instance<$policy> = $crate::Instance::new();
            pub struct Component;
            impl split::Guest for Component {
                fn init(config: Vec<u8>) -> Result<(), String> {
                    glue::init(&INSTANCE, &config, &$names, <$policy as $crate::Split>::init)
                }
                fn split(request: old::SplitRequest) -> Result<Vec<old::Subtask>, String> {
                    glue::split_without_layout(&INSTANCE, request)
                }
            }
            impl split_layout::Guest for Component {
                fn split(request: $crate::split::SplitRequest) -> Result<Vec<$crate::split::Subtask>, String> {
                    glue::split(&INSTANCE, &request)
                }
            }
            $crate::bindings::split::__export_split_world!(Component with_types_in $crate::bindings::split);
        }
    };
}

/// Exports `$policy: Merge` as a merge-policy component.
#[macro_export]
macro_rules! merge_policy {
    ($policy:ty, settings = $names:expr $(,)?) => {
        #[cfg(target_arch = "wasm32")]
        mod __sluice_policy_export {
            use super::*;
            use $crate::__private::{String, Vec, glue};
            use $crate::bindings::merge::exports::sluice::policy::merge::Guest;
            static INSTANCE: $crate::Instance<$policy> = $crate::Instance::new();
            pub struct Component;
            impl Guest for Component {
                fn init(config: Vec<u8>) -> Result<(), String> {
                    glue::init(&INSTANCE, &config, &$names, <$policy as $crate::Merge>::init)
                }
                fn merge(k: u32, weights: Vec<f32>, hits: Vec<u64>) -> Result<Vec<u64>, String> {
                    glue::merge(&INSTANCE, k, &weights, &hits)
                }
            }
            $crate::bindings::merge::__export_merge_world!(Component with_types_in $crate::bindings::merge);
        }
    };
}
