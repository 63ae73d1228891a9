//! Rules on names, one kind per feature, for the host's tests: kinds under `oct.`, an
//! `ed=true` label and tenant `site-er` are urgent; an `ed=true` task waiting low moves to
//! normal at once; a failed `ed=true` task with attempts left (and a curable failure) is retried after as many ms as
//! its device's name has bytes, any other is dead.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use sluice_policy::{Admission, Bucket, Config, DeadReason, Decision, Failure, Task};

pub struct ByName;

/// Whether the rules put `task` first.
pub fn urgent(task: &Task) -> bool {
    task.kind.starts_with("oct.") || task.label("ed") == Some("true") || task.tenant == "site-er"
}

impl sluice_policy::Priority for ByName {
    fn init(_config: &Config) -> Result<Self, String> {
        Ok(ByName)
    }
    fn bucket_weights(&self) -> [u32; 3] {
        [60, 35, 5]
    }
    fn admit(&self, _now_ms: u64, task: &Task) -> Admission {
        Admission {
            bucket: if urgent(task) {
                Bucket::Urgent
            } else {
                task.submitted_bucket
            },
            rank: task.seq,
            attempt_timeout_ms: task.est_exec_ms.saturating_mul(2).max(1),
        }
    }
}

impl sluice_policy::Aging for ByName {
    fn init(_config: &Config) -> Result<Self, String> {
        Ok(ByName)
    }
    fn promote(&self, _now_ms: u64, task: &Task) -> Option<Bucket> {
        (task.bucket == Bucket::Low && task.label("ed") == Some("true")).then_some(Bucket::Normal)
    }
}

impl sluice_policy::Retry for ByName {
    fn init(_config: &Config) -> Result<Self, String> {
        Ok(ByName)
    }
    fn decide(&self, _now_ms: u64, failure: &Failure) -> Decision {
        if failure.class.is_hopeless() {
            Decision::Dead(DeadReason::Permanent)
        } else if failure.task.attempt >= failure.max_attempts {
            Decision::Dead(DeadReason::AttemptsSpent)
        } else if failure.task.label("ed") == Some("true") {
            Decision::RetryAfterMs(failure.task.device.len() as u64)
        } else {
            Decision::Dead(DeadReason::Policy)
        }
    }
}

#[cfg(feature = "priority")]
sluice_policy::priority_policy!(ByName, settings = []);
#[cfg(feature = "aging")]
sluice_policy::aging_policy!(ByName, settings = []);
#[cfg(feature = "retry")]
sluice_policy::retry_policy!(ByName, settings = []);
