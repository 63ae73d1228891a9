//! The policy runtime: scheduling decisions made by WebAssembly components of the worlds in
//! `wit/policy.wit`, compiled once, each instance in its own `Store` with a memory cap and a
//! deadline per call, so a bad module can neither take the host down nor slow it without bound.

pub mod bindings;
pub mod defaults;
mod instance;
mod runtime;

pub use instance::{AgingInstance, MergeInstance, PriorityInstance, RetryInstance, SplitInstance};
pub use runtime::{Compiled, Kind, PolicyError, PolicyRuntime, RuntimeOptions, Sandbox};

#[cfg(test)]
mod hostile;
#[cfg(test)]
mod tests;
