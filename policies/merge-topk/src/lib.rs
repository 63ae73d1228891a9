//! Merge policy: k-way merge of the children's hit lists into the `k` nearest, each id once
//! (a vector held by two shards counts once: seed 000's duplicate results), ties broken by id so
//! the answer does not depend on which child answered first. The merge itself is `merge-core`'s.

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

pub use merge_core::{Hit, MAX_K, Part, merge, parts};

/// The policy: it takes no settings.
pub struct Policy;

impl sluice_policy::Merge for Policy {
    fn init(_config: &sluice_policy::Config) -> Result<Self, String> {
        Ok(Policy)
    }

    fn merge(&self, k: u32, parts: Vec<Part>) -> Result<Vec<Hit>, String> {
        merge(k, parts)
    }
}

sluice_policy::merge_policy!(Policy, settings = []);
