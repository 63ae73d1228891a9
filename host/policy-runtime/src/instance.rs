//! Instances of policy components, one type per kind. Each owns its `Store`, arms the call
//! deadline before every call, and after a fault (trap, deadline, memory cap) drops the store
//! and instantiates afresh from the `InstancePre`, running `init` again with the same config.

use super::bindings;
use super::names;
use super::runtime::{Compiled, Kind, PolicyError, PolicyRuntime, Sandbox};
use sluice_model::NamesRef;
use std::sync::Arc;
use wasmtime::Store;

/// Generates a policy instance type: construction (instantiate + init) and the fault-handling
/// `call` wrapper shared by every kind.
macro_rules! policy_instance {
    ($name:ident, $kind:ident, $module:ident, $pre:ident, $world:ident, $interface:ident) => {
        pub struct $name {
            runtime: Arc<PolicyRuntime>,
            pre: bindings::$module::$pre<Sandbox>,
            store: Store<Sandbox>,
            instance: bindings::$module::$world,
            /// The same instance untyped, for an export beside the world's (`fairness`).
            raw: wasmtime::component::Instance,
            named: NamedExports,
            config: Vec<u8>,
            grants: super::runtime::Grants,
            data: super::runtime::PolicyData,
        }

        impl $name {
            pub fn new(
                runtime: Arc<PolicyRuntime>,
                compiled: &Compiled,
                config: &[u8],
            ) -> Result<Self, PolicyError> {
                let pre = bindings::$module::$pre::new(compiled.pre.clone())
                    .map_err(|e| PolicyError::WrongWorld(compiled.kind, format!("{e:#}")))?;
                let grants = compiled.grants;
                let data = compiled.data.clone();
                let (store, instance, raw, named) =
                    Self::start(&runtime, &pre, config, grants, &data)?;
                Ok($name {
                    runtime,
                    pre,
                    store,
                    instance,
                    raw,
                    named,
                    config: config.to_vec(),
                    grants,
                    data,
                })
            }

            fn start(
                runtime: &PolicyRuntime,
                pre: &bindings::$module::$pre<Sandbox>,
                config: &[u8],
                grants: super::runtime::Grants,
                data: &super::runtime::PolicyData,
            ) -> Result<
                (
                    Store<Sandbox>,
                    bindings::$module::$world,
                    wasmtime::component::Instance,
                    NamedExports,
                ),
                PolicyError,
            > {
                let mut store = runtime.store(grants, data.clone());
                // Start-up and init see the clock at 0: they have no instant of their own.
                runtime.arm(&mut store, 0);
                let raw = pre
                    .instance_pre()
                    .instantiate(&mut store)
                    .map_err(|e| fault(&store, e))?;
                let instance = bindings::$module::$world::new(&mut store, &raw)
                    .map_err(|e| fault(&store, e))?;
                runtime.arm(&mut store, 0);
                instance
                    .$interface()
                    .call_init(&mut store, config)
                    .map_err(|e| fault(&store, e))?
                    .map_err(PolicyError::Init)?;
                let named = NamedExports::find(Kind::$kind, &mut store, &raw)
                    .map_err(|e| fault(&store, e))?;
                Ok((store, instance, raw, named))
            }

            /// Runs one call at `now_ms` under its fuel; a fault replaces the instance before
            /// returning.
            fn call<R>(
                &mut self,
                now_ms: u64,
                body: impl FnOnce(
                    &bindings::$module::$world,
                    wasmtime::component::Instance,
                    &NamedExports,
                    &mut Store<Sandbox>,
                ) -> wasmtime::Result<R>,
            ) -> Result<R, PolicyError> {
                self.runtime.arm(&mut self.store, now_ms);
                match body(&self.instance, self.raw, &self.named, &mut self.store) {
                    Ok(answer) => Ok(answer),
                    Err(error) => {
                        let fault = fault(&self.store, error);
                        let (store, instance, raw, named) = Self::start(
                            &self.runtime,
                            &self.pre,
                            &self.config,
                            self.grants,
                            &self.data,
                        )?;
                        self.store = store;
                        self.instance = instance;
                        self.raw = raw;
                        self.named = named;
                        Err(fault)
                    }
                }
            }
        }

        impl Policy for $name {
            const KIND: Kind = Kind::$kind;

            fn instantiate(
                runtime: Arc<PolicyRuntime>,
                compiled: &Compiled,
                config: &[u8],
            ) -> Result<Self, PolicyError> {
                $name::new(runtime, compiled, config)
            }
        }
    };
}

/// A fault, with the end of what the guest wrote before it (an interpreter's traceback, a
/// Rust panic message) when it wrote anything.
fn fault(store: &Store<Sandbox>, error: wasmtime::Error) -> PolicyError {
    let output = store.data().output_tail();
    if output.is_empty() {
        PolicyError::Fault(format!("{error:#}"))
    } else {
        PolicyError::Fault(format!("{error:#}; it wrote: {output}"))
    }
}

/// An instance of one kind's world: what the registry pools, swaps and falls back between.
pub trait Policy: Sized + Send + 'static {
    const KIND: Kind;

    fn instantiate(
        runtime: Arc<PolicyRuntime>,
        compiled: &Compiled,
        config: &[u8],
    ) -> Result<Self, PolicyError>;
}

policy_instance!(
    PriorityInstance,
    Priority,
    priority,
    PriorityPolicyPre,
    PriorityPolicy,
    sluice_policy_priority
);
policy_instance!(
    AgingInstance,
    Aging,
    aging,
    AgingPolicyPre,
    AgingPolicy,
    sluice_policy_aging
);
policy_instance!(
    RetryInstance,
    Retry,
    retry,
    RetryPolicyPre,
    RetryPolicy,
    sluice_policy_retry
);
policy_instance!(
    SplitInstance,
    Split,
    split,
    SplitPolicyPre,
    SplitPolicy,
    sluice_policy_split
);
policy_instance!(
    MergeInstance,
    Merge,
    merge,
    MergePolicyPre,
    MergePolicy,
    sluice_policy_merge
);

use bindings::aging::exports::sluice::policy::aging::Promotion;
use bindings::aging::sluice::policy::types::Bucket as WitBucket;
use bindings::split::exports::sluice::policy::split as old_split;
use bindings::split_layout::{ShardFilter, SplitRequest, Subtask};

impl PriorityInstance {
    /// The tenants' weights, or `None` when the component does not export `fairness` (it was
    /// built before it existed, or without it): then every tenant weighs the same.
    pub fn tenant_weights(&mut self) -> Result<Option<Vec<(String, u32)>>, PolicyError> {
        self.call(
            0,
            |_, raw, _, store| match bindings::fairness::FairnessPolicy::new(&mut *store, &raw) {
                Ok(fairness) => fairness
                    .sluice_policy_fairness()
                    .call_tenant_weights(store)
                    .map(Some),
                Err(_) => Ok(None),
            },
        )
    }

    pub fn bucket_weights(&mut self) -> Result<Vec<u32>, PolicyError> {
        self.call(0, |i, _, _, store| {
            i.sluice_policy_priority().call_bucket_weights(store)
        })
    }

    /// `tasks`: packed task views, `names[i]` task i's names (sent only to a component that
    /// reads them); the answer: packed admissions (see `policy_packed`).
    pub fn admit(
        &mut self,
        now_ms: u64,
        tasks: &[u64],
        names: &[NamesRef<'_>],
    ) -> Result<Vec<u64>, PolicyError> {
        self.call(now_ms, |i, _, named, store| match &named.priority {
            Some(named) => {
                let (records, which) = names::table(names);
                named
                    .sluice_policy_named_priority()
                    .call_admit(store, now_ms, tasks, &records, &which)
            }
            None => i.sluice_policy_priority().call_admit(store, now_ms, tasks),
        })
    }

    /// One task's packed view and names; its packed admission.
    pub fn admit_one(
        &mut self,
        now_ms: u64,
        task: (u64, u64, u64, u64, u64, u64),
        names: NamesRef<'_>,
    ) -> Result<(u64, u64, u64), PolicyError> {
        self.call(now_ms, |i, _, named, store| match &named.priority {
            Some(named) => named.sluice_policy_named_priority().call_admit_one(
                store,
                now_ms,
                task,
                &names::record(names),
            ),
            None => i
                .sluice_policy_priority()
                .call_admit_one(store, now_ms, task),
        })
    }
}

impl AgingInstance {
    /// `waiting`: packed task views, `names[i]` task i's names.
    pub fn age(
        &mut self,
        now_ms: u64,
        waiting: &[u64],
        names: &[NamesRef<'_>],
    ) -> Result<Vec<Promotion>, PolicyError> {
        self.call(now_ms, |i, _, named, store| match &named.aging {
            Some(named) => {
                let (records, which) = names::table(names);
                let promotions = named
                    .sluice_policy_named_aging()
                    .call_age(store, now_ms, waiting, &records, &which)?;
                Ok(promotions
                    .into_iter()
                    .map(|p| Promotion {
                        index: p.index,
                        to: p.to,
                    })
                    .collect())
            }
            None => i.sluice_policy_aging().call_age(store, now_ms, waiting),
        })
    }

    /// One task's packed view and names; the bucket to move it to, if any.
    pub fn age_one(
        &mut self,
        now_ms: u64,
        task: (u64, u64, u64, u64, u64, u64),
        names: NamesRef<'_>,
    ) -> Result<Option<WitBucket>, PolicyError> {
        self.call(now_ms, |i, _, named, store| match &named.aging {
            Some(named) => named.sluice_policy_named_aging().call_age_one(
                store,
                now_ms,
                task,
                &names::record(names),
            ),
            None => i.sluice_policy_aging().call_age_one(store, now_ms, task),
        })
    }
}

impl RetryInstance {
    /// `failures`: packed failures, `names[i]` failure i's task's names; the answer: one
    /// packed decision each.
    pub fn decide(
        &mut self,
        now_ms: u64,
        failures: &[u64],
        names: &[NamesRef<'_>],
    ) -> Result<Vec<u64>, PolicyError> {
        self.call(now_ms, |i, _, named, store| match &named.retry {
            Some(named) => {
                let (records, which) = names::table(names);
                named
                    .sluice_policy_named_retry()
                    .call_decide(store, now_ms, failures, &records, &which)
            }
            None => i.sluice_policy_retry().call_decide(store, now_ms, failures),
        })
    }

    /// One packed failure and its task's names; its packed decision.
    pub fn decide_one(
        &mut self,
        now_ms: u64,
        failure: policy_packed::FailureWords,
        names: NamesRef<'_>,
    ) -> Result<u64, PolicyError> {
        self.call(now_ms, |i, _, named, store| match &named.retry {
            Some(named) => named.sluice_policy_named_retry().call_decide_one(
                store,
                now_ms,
                failure,
                &names::record(names),
            ),
            None => i
                .sluice_policy_retry()
                .call_decide_one(store, now_ms, failure),
        })
    }
}

/// The named export of an instance's kind, when its component has one (found once, when the
/// instance starts: an export's lookup costs more than a decision).
#[derive(Default)]
pub struct NamedExports {
    priority: Option<bindings::names::NamedPriorityExport>,
    aging: Option<bindings::named_aging::NamedAgingExport>,
    retry: Option<bindings::named_retry::NamedRetryExport>,
}

impl NamedExports {
    /// The kind's named export, kept only when the component says it reads names. A trap in
    /// `reads-names` is the component's fault, as one in `init` is.
    fn find(
        kind: Kind,
        store: &mut Store<Sandbox>,
        raw: &wasmtime::component::Instance,
    ) -> wasmtime::Result<NamedExports> {
        let mut named = NamedExports::default();
        match kind {
            Kind::Priority => {
                if let Ok(e) = bindings::names::NamedPriorityExport::new(&mut *store, raw)
                    && e.sluice_policy_named_priority()
                        .call_reads_names(&mut *store)?
                {
                    named.priority = Some(e);
                }
            }
            Kind::Aging => {
                if let Ok(e) = bindings::named_aging::NamedAgingExport::new(&mut *store, raw)
                    && e.sluice_policy_named_aging()
                        .call_reads_names(&mut *store)?
                {
                    named.aging = Some(e);
                }
            }
            Kind::Retry => {
                if let Ok(e) = bindings::named_retry::NamedRetryExport::new(&mut *store, raw)
                    && e.sluice_policy_named_retry()
                        .call_reads_names(&mut *store)?
                {
                    named.retry = Some(e);
                }
            }
            Kind::Split | Kind::Merge => {}
        }
        Ok(named)
    }
}

impl SplitInstance {
    /// The children, or the policy's reason for refusing the split: through `split-layout`
    /// when the component exports it, else through 0.1.0's `split` (which is not told the
    /// layout).
    pub fn split(
        &mut self,
        request: &SplitRequest,
    ) -> Result<Result<Vec<Subtask>, String>, PolicyError> {
        self.call(
            0,
            |i, raw, _, store| match bindings::split_layout::SplitLayoutPolicy::new(
                &mut *store,
                &raw,
            ) {
                Ok(with_layout) => with_layout
                    .sluice_policy_split_layout()
                    .call_split(store, request),
                Err(_) => {
                    let answer = i
                        .sluice_policy_split()
                        .call_split(store, &without_layout(request))?;
                    Ok(answer.map(|children| children.into_iter().map(with_layout).collect()))
                }
            },
        )
    }
}

/// A request as 0.1.0's `split` takes it: the same without the layout.
fn without_layout(request: &SplitRequest) -> old_split::SplitRequest {
    old_split::SplitRequest {
        task: request.task.clone(),
        vector: request.vector.clone(),
        k: request.k,
        nprobe: request.nprobe,
    }
}

/// A child 0.1.0's `split` answered, in `split-layout`'s types.
fn with_layout(child: old_split::Subtask) -> Subtask {
    Subtask {
        filter: match child.filter {
            old_split::ShardFilter::Shard(shard) => ShardFilter::Shard(shard),
            old_split::ShardFilter::IdRange(range) => ShardFilter::IdRange(range),
            old_split::ShardFilter::IdHash(hash) => ShardFilter::IdHash(hash),
            old_split::ShardFilter::Centroids(lists) => ShardFilter::Centroids(lists),
        },
        weight: child.weight,
    }
}

impl MergeInstance {
    /// `hits`: the children's packed hits; the answer: packed hits, or the policy's reason for
    /// refusing the merge.
    pub fn merge(
        &mut self,
        k: u32,
        weights: &[f32],
        hits: &[u64],
    ) -> Result<Result<Vec<u64>, String>, PolicyError> {
        self.call(0, |i, _, _, store| {
            i.sluice_policy_merge().call_merge(store, k, weights, hits)
        })
    }
}
