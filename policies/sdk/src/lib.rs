//! The Rust SDK for Sluice policies: typed views over the packed records the host sends
//! ([`Task`], [`Failure`], [`Admission`], [`Decision`], [`Hit`], [`Part`]), settings parsing
//! with typed errors ([`Config`], [`ConfigError`]), and one macro per policy kind that exports
//! the kind's world from a plain trait impl — the batch export and its `-one` twin both call
//! the same method, so they cannot disagree.
//!
//! ```ignore
//! struct MyRetry { delay_ms: u64 }
//!
//! impl sluice_policy::Retry for MyRetry {
//!     fn init(config: &sluice_policy::Config) -> Result<Self, String> {
//!         Ok(MyRetry { delay_ms: config.u64_or("delay_ms", 1_000)? })
//!     }
//!     fn decide(&self, _now_ms: u64, failure: &sluice_policy::Failure) -> sluice_policy::Decision {
//!         sluice_policy::Decision::RetryAfterMs(self.delay_ms)
//!     }
//! }
//!
//! sluice_policy::retry_policy!(MyRetry, settings = ["delay_ms"]);
//! ```
//!
//! A policy crate is `no_std` in its wasm32 build (`#![cfg_attr(target_arch = "wasm32",
//! no_std)]`); the SDK brings the allocator, the panic handler (a trap) and `cabi_realloc`.
//! Policies must be deterministic: time and random bits come from the host as arguments.

#![no_std]

extern crate alloc;

mod instance;
pub mod kinds;
mod task;

pub use instance::Instance;
pub use kinds::{Aging, Merge, Priority, Retry, Split};
pub use policy_config::{Config, ConfigError, check_children};
/// The packed layouts in full (word counts, readers and writers), for what the typed views
/// above do not cover.
pub use policy_packed as packed;
pub use policy_packed::{
    Admission, Bucket, DeadReason, Decision, ErrorClass, Hit, Malformed, Part, View,
};
pub use task::{Failure, NO_NAMES, Names, Task};

/// The WIT bindings of each kind's world, for the macros (and for `split`'s request and
/// answer types).
pub mod bindings {
    pub mod priority {
        // The priority world with the fairness and names exports: every SDK priority component
        // answers `tenant-weights` (none named, unless the policy overrides `tenant_weights`)
        // and `reads-names`.
        wit_bindgen::generate!({
            world: "named-priority-policy",
            path: "wit",
            pub_export_macro: true,
            export_macro_name: "__export_priority_world",
            default_bindings_module: "sluice_policy::bindings::priority",
        });
    }
    pub mod aging {
        wit_bindgen::generate!({
            world: "named-aging-policy",
            path: "wit",
            pub_export_macro: true,
            export_macro_name: "__export_aging_world",
            default_bindings_module: "sluice_policy::bindings::aging",
        });
    }
    pub mod retry {
        wit_bindgen::generate!({
            world: "named-retry-policy",
            path: "wit",
            pub_export_macro: true,
            export_macro_name: "__export_retry_world",
            default_bindings_module: "sluice_policy::bindings::retry",
        });
    }
    pub mod split {
        // The split world given the collection's layout that may read its version's data; a
        // component that never calls `data::get` does not import it (unused imports are
        // dropped when it is made).
        wit_bindgen::generate!({
            world: "split-layout-data-policy",
            path: "wit",
            pub_export_macro: true,
            export_macro_name: "__export_split_world",
            default_bindings_module: "sluice_policy::bindings::split",
        });
    }
    pub mod merge {
        wit_bindgen::generate!({
            world: "merge-policy",
            path: "wit",
            pub_export_macro: true,
            export_macro_name: "__export_merge_world",
            default_bindings_module: "sluice_policy::bindings::merge",
        });
    }
}

/// A version's data blobs (uploaded with `PUT /v1/policies/{kind}/{version}/data/{name}`),
/// for a split policy to read in `init`. Natively (in tests) there is none.
pub mod data {
    use alloc::vec::Vec;

    /// Blob `name` of this version, if it has one; each call copies it in, so read it once.
    pub fn get(name: &str) -> Option<Vec<u8>> {
        #[cfg(target_arch = "wasm32")]
        {
            crate::bindings::split::sluice::policy::data::get(name)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let _ = name;
            None
        }
    }
}

/// What a split policy reads and answers (the WIT types of `split-layout`: the request
/// carries the collection's layout).
pub mod split {
    pub use crate::bindings::split::exports::sluice::policy::split_layout::{
        Layout, ShardFilter, SplitRequest, Subtask,
    };
    pub use crate::bindings::split::sluice::policy::types::{TaskMeta, TaskView};

    /// The request and answer of the 0.1.0 `split` export, which a host without `split-layout`
    /// calls: the SDK answers it with the same policy and an unknown layout.
    pub mod without_layout {
        pub use crate::bindings::split::exports::sluice::policy::split::{
            ShardFilter, SplitRequest, Subtask,
        };
    }
}

/// What the macros' expansions name; not part of the SDK's API.
#[doc(hidden)]
pub mod __private {
    pub use crate::__names as names;
    pub use crate::NO_NAMES;
    pub use crate::kinds::glue;
    pub use alloc::string::String;
    pub use alloc::vec::Vec;
}
