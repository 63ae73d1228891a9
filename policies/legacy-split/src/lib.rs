//! A split policy exporting 0.1.0's `split` alone, as every split component built before the
//! `split-layout` interface does: it is never told the collection's layout, and always asks
//! for shards 0 and 1. The host's tests check that it still loads, decides, and that the
//! shards it leaves out are reported missing.

wit_bindgen::generate!({ world: "split-policy", path: "../../wit" });

use exports::sluice::policy::split::{Guest, ShardFilter, SplitRequest, Subtask};

#[allow(dead_code)] // used by `export!` in the wasm32 build only
struct Component;

impl Guest for Component {
    fn init(_config: Vec<u8>) -> Result<(), String> {
        Ok(())
    }

    fn split(_request: SplitRequest) -> Result<Vec<Subtask>, String> {
        Ok((0..2)
            .map(|shard| Subtask {
                filter: ShardFilter::Shard(shard),
                weight: 1.0,
            })
            .collect())
    }
}

// Natively (the policies workspace's tests) there is no component to export, and the
// component symbols' names would not link into a shared library.
#[cfg(target_arch = "wasm32")]
export!(Component);
