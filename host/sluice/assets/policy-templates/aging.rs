//! An aging policy: a task moves up one bucket after `wait_ms` in its bucket.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use sluice_policy::{Aging, Bucket, Config, Task};

pub struct OneStep {
    wait_ms: u64,
}

impl Aging for OneStep {
    fn init(config: &Config) -> Result<Self, String> {
        Ok(OneStep {
            wait_ms: config.u64_or("wait_ms", 600_000)?.max(1),
        })
    }

    fn promote(&self, now_ms: u64, task: &Task) -> Option<Bucket> {
        if now_ms.saturating_sub(task.bucket_since_ms) < self.wait_ms {
            return None;
        }
        match task.bucket {
            Bucket::Low => Some(Bucket::Normal),
            Bucket::Normal => Some(Bucket::Urgent),
            Bucket::Urgent => None,
        }
    }
}

sluice_policy::aging_policy!(OneStep, settings = ["wait_ms"]);
