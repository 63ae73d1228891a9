//! A merge policy: the `k` nearest hits over all children, each id once, ties by id.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::collections::BTreeSet;
use alloc::string::String;
use alloc::vec::Vec;
use sluice_policy::{Config, Hit, Merge, Part};

pub struct Nearest;

impl Merge for Nearest {
    fn init(_config: &Config) -> Result<Self, String> {
        Ok(Nearest)
    }

    fn merge(&self, k: u32, parts: Vec<Part>) -> Result<Vec<Hit>, String> {
        let mut hits: Vec<Hit> = parts.into_iter().flat_map(|part| part.hits).collect();
        if hits.iter().any(|hit| hit.distance.is_nan()) {
            return Err("a child answered a NaN distance".into());
        }
        hits.sort_by(|a, b| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id)));
        let mut seen = BTreeSet::new();
        hits.retain(|hit| seen.insert(hit.id));
        hits.truncate(k as usize);
        Ok(hits)
    }
}

sluice_policy::merge_policy!(Nearest, settings = []);
