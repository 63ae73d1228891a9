//! The policy runtime: scheduling decisions made by WebAssembly components of the worlds in
//! `wit/policy.wit`, compiled once, each instance in its own `Store` with a memory cap and a
//! deadline per call, so a bad module can neither take the host down nor slow it without bound;
//! and the registry that validates, stores, activates and rolls back versions of them.

pub mod bindings;
pub mod checks;
mod conformance;
mod decider;
mod decisions;
pub mod defaults;
mod experiments;
mod instance;
mod merge_scores;
mod metrics;
mod names;
mod pool;
mod refusals;
mod registry;
mod rollouts;
mod runtime;
mod sample;
mod slot;
mod trial;
mod wasi;

pub use conformance::Conformance;
pub use decider::PolicyDecider;
pub use decider::{shard_filter, split_request};
pub use instance::{
    AgingInstance, MergeInstance, Policy, PriorityInstance, RetryInstance, SplitInstance,
};
pub use merge_scores::{MAX_SCORED_SEARCHES, MergeFigures};
pub use metrics::{PolicyMetrics, TIMED_ONE_IN, VersionMetrics};
pub use registry::{
    Check, DEFAULT_MAX_DATA_BYTES, KindDetail, KindStatus, MAX_CONFIG_BYTES, PolicyRegistry,
    RegistryError, RegistryOptions, UploadOptions, Uploaded, sha256_hex,
};
pub use rollouts::{BASELINE, CANDIDATE};
pub use runtime::{
    Compiled, Grants, Kind, PolicyData, PolicyError, PolicyRuntime, RuntimeOptions, Sandbox,
    exported_kind,
};
pub use slot::{FaultLimit, SlotAnswer, SlotCounters};
pub use trial::{ArmFigures, MAX_DISAGREEMENT_SAMPLES};

#[cfg(test)]
mod hostile;
#[cfg(test)]
mod registry_tests;
#[cfg(test)]
#[path = "../build/shim.rs"]
mod shim;
#[cfg(test)]
mod tests;
