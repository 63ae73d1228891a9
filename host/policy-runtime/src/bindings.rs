//! Host bindings generated from `wit/policy.wit`, one module per world. Each module has its own
//! copy of the shared `types` interface; `convert` maps between them where a caller needs to.

pub mod priority {
    wasmtime::component::bindgen!({ world: "priority-policy", path: "../../wit" });
}

/// The fairness export a priority component may have beside `priority`: looked up on its
/// instance, so a component built without it still loads.
pub mod fairness {
    wasmtime::component::bindgen!({ world: "fairness-policy", path: "../../wit" });
}

pub mod aging {
    wasmtime::component::bindgen!({ world: "aging-policy", path: "../../wit" });
}

pub mod retry {
    wasmtime::component::bindgen!({ world: "retry-policy", path: "../../wit" });
}

pub mod split {
    // Compared in shadow experiments.
    wasmtime::component::bindgen!({ world: "split-policy", path: "../../wit", additional_derives: [PartialEq] });
}

/// The `split-layout` export a split component may have beside `split`: looked up on its
/// instance, so a component built before it still loads (and is called through `split`).
/// The host's split requests and answers are this module's types.
pub mod split_layout {
    wasmtime::component::bindgen!({
        world: "split-layout-policy",
        path: "../../wit",
        additional_derives: [PartialEq],
        with: { "sluice:policy/types": super::split::sluice::policy::types },
    });
    pub use exports::sluice::policy::split_layout::{Layout, ShardFilter, SplitRequest, Subtask};
}

pub mod merge {
    wasmtime::component::bindgen!({ world: "merge-policy", path: "../../wit" });
}

/// The `names` types every named export shares (generated once, reused below).
pub mod names {
    wasmtime::component::bindgen!({ world: "named-priority-export", path: "../../wit" });
    pub use sluice::policy::names::TaskNames;
}

/// The named exports a priority, aging or retry component may have beside its kind's: looked
/// up once per instance, so a component built before names existed still loads.
pub mod named_priority {
    pub use super::names::NamedPriorityExport;
}

pub mod named_aging {
    wasmtime::component::bindgen!({
        world: "named-aging-export",
        path: "../../wit",
        with: {
            "sluice:policy/names": super::names::sluice::policy::names,
            "sluice:policy/types": super::aging::sluice::policy::types,
        },
    });
    pub use exports::sluice::policy::named_aging::Promotion;
}

pub mod named_retry {
    wasmtime::component::bindgen!({
        world: "named-retry-export",
        path: "../../wit",
        with: { "sluice:policy/names": super::names::sluice::policy::names },
    });
}
