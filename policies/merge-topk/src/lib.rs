//! Merge policy: k-way merge of the children's hit lists into the `k` nearest, each id once
//! (a vector held by two shards counts once: seed 000's duplicate results), ties broken by id so
//! the answer does not depend on which child answered first. The merge itself is `merge-core`'s.

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

wit_bindgen::generate!({ world: "merge-policy", path: "../../wit" });

use exports::sluice::policy::merge::Guest;
pub use merge_core::{Hit, MAX_K, Part, merge, parts};

#[allow(dead_code)] // used by `export!` in the wasm32 build only
struct Component;

impl Guest for Component {
    fn init(config: Vec<u8>) -> Result<(), String> {
        policy_config::Config::parse(&config, &[]).map(|_| ())
    }

    fn merge(k: u32, weights: Vec<f32>, hits: Vec<u64>) -> Result<Vec<u64>, String> {
        Ok(merge_core::pack(&merge(k, parts(&weights, &hits)?)?))
    }
}

// Exported only in the component build: native (test) builds have no component ABI.
#[cfg(target_arch = "wasm32")]
export!(Component);
