//! The wall clock, behind a trait so the shell can be driven by a fake clock in tests.

use std::time::{SystemTime, UNIX_EPOCH};

pub trait Clock: Send + 'static {
    fn now_ms(&self) -> u64;
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}
