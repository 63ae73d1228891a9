//! A priority policy: the submitted bucket, first come first served, an attempt may run
//! twice its estimate.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use sluice_policy::{Admission, Config, Priority, Task};

pub struct Fifo {
    weights: [u32; 3],
}

impl Priority for Fifo {
    fn init(config: &Config) -> Result<Self, String> {
        let weights = config.list_or("weights", &[60u32, 35, 5])?;
        let weights: [u32; 3] = weights
            .try_into()
            .map_err(|_| String::from("weights needs three values"))?;
        Ok(Fifo { weights })
    }

    fn bucket_weights(&self) -> [u32; 3] {
        self.weights
    }

    fn admit(&self, _now_ms: u64, task: &Task) -> Admission {
        Admission {
            bucket: task.submitted_bucket,
            rank: task.seq,
            attempt_timeout_ms: task.est_exec_ms.saturating_mul(2).max(1),
        }
    }
}

sluice_policy::priority_policy!(Fifo, settings = ["weights"]);
