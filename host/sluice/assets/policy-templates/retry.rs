//! A retry policy: transient failures wait `delay_ms` times the attempt number; anything
//! else, or the task's last attempt, is dead.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use sluice_policy::{Config, DeadReason, Decision, ErrorClass, Failure, Retry};

pub struct Linear {
    delay_ms: u64,
}

impl Retry for Linear {
    fn init(config: &Config) -> Result<Self, String> {
        let delay_ms = config.u64_or("delay_ms", 1_000)?;
        if delay_ms == 0 {
            return Err("delay_ms must be at least 1".into());
        }
        Ok(Linear { delay_ms })
    }

    fn decide(&self, _now_ms: u64, failure: &Failure) -> Decision {
        if failure.task.attempt >= failure.max_attempts {
            return Decision::Dead(DeadReason::AttemptsSpent);
        }
        match failure.class {
            ErrorClass::Transient | ErrorClass::NodeBusy | ErrorClass::LeaseExpired => {
                Decision::RetryAfterMs(self.delay_ms.saturating_mul(u64::from(failure.task.attempt)))
            }
            ErrorClass::Timeout | ErrorClass::Permanent => Decision::Dead(DeadReason::Permanent),
            ErrorClass::InvalidInput => Decision::Dead(DeadReason::InvalidInput),
        }
    }
}

sluice_policy::retry_policy!(Linear, settings = ["delay_ms"]);
