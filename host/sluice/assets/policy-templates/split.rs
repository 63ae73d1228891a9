//! A split policy: one child per stored shard, `shards` of them.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use sluice_policy::split::{ShardFilter, SplitRequest, Subtask};
use sluice_policy::{Config, Split, check_children};

pub struct PerShard {
    shards: u32,
}

impl Split for PerShard {
    fn init(config: &Config) -> Result<Self, String> {
        let shards = config.u32_or("shards", 4)?;
        check_children(shards, 256, "shards")?;
        Ok(PerShard { shards: shards.max(1) })
    }

    fn split(&self, _request: &SplitRequest) -> Result<Vec<Subtask>, String> {
        Ok((0..self.shards)
            .map(|shard| Subtask {
                filter: ShardFilter::Shard(shard),
                weight: 1.0,
            })
            .collect())
    }
}

sluice_policy::split_policy!(PerShard, settings = ["shards"]);
