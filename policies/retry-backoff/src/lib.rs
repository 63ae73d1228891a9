//! Retry policy: a failed attempt waits a capped exponential backoff with full jitter drawn
//! from the host's random bits, so tasks that failed together do not return together (the
//! seed's retry storm). Permanent and invalid-input failures are dead at once.

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;

use sluice_policy::{Config, DeadReason, Decision, ErrorClass, Failure};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    pub initial_delay_ms: u64,
    pub max_delay_ms: u64,
}

/// The settings the config may set.
pub const SETTING_NAMES: [&str; 2] = ["initial_delay_ms", "max_delay_ms"];

/// No delay may exceed a day, whatever the configuration says.
pub const DELAY_LIMIT_MS: u64 = 24 * 3_600_000;

impl Default for Settings {
    fn default() -> Self {
        Settings {
            initial_delay_ms: 300_000,
            max_delay_ms: 3_600_000,
        }
    }
}

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &Config) -> Result<Settings, String> {
        let defaults = Settings::default();
        let settings = Settings {
            initial_delay_ms: config.u64_or("initial_delay_ms", defaults.initial_delay_ms)?,
            max_delay_ms: config.u64_or("max_delay_ms", defaults.max_delay_ms)?,
        };
        if settings.initial_delay_ms == 0 || settings.initial_delay_ms > settings.max_delay_ms {
            return Err("initial_delay_ms must be at least 1 and at most max_delay_ms".into());
        }
        if settings.max_delay_ms > DELAY_LIMIT_MS {
            return Err(format!("max_delay_ms must be at most {DELAY_LIMIT_MS}"));
        }
        Ok(settings)
    }

    /// The decision for one failure of attempt `attempt` (counted from 1).
    pub fn decide(
        &self,
        class: ErrorClass,
        attempt: u32,
        max_attempts: u32,
        random: u64,
    ) -> Decision {
        match class {
            ErrorClass::Permanent => return Decision::Dead(DeadReason::Permanent),
            ErrorClass::InvalidInput => return Decision::Dead(DeadReason::InvalidInput),
            ErrorClass::Transient
            | ErrorClass::NodeBusy
            | ErrorClass::LeaseExpired
            | ErrorClass::Timeout => {}
        }
        if attempt >= max_attempts {
            return Decision::Dead(DeadReason::AttemptsSpent);
        }
        let doublings = attempt.saturating_sub(1).min(63);
        let ceiling = self
            .initial_delay_ms
            .saturating_mul(1u64 << doublings)
            .min(self.max_delay_ms);
        // Full jitter: uniform over [0, ceiling].
        Decision::RetryAfterMs(random % (ceiling + 1))
    }
}

impl sluice_policy::Retry for Settings {
    fn init(config: &Config) -> Result<Self, String> {
        Settings::from_config(config)
    }

    fn decide(&self, _now_ms: u64, f: &Failure) -> Decision {
        Settings::decide(self, f.class, f.task.attempt, f.max_attempts, f.random)
    }
}

sluice_policy::retry_policy!(
    Settings,
    settings = ["initial_delay_ms", "max_delay_ms"],
    names = false,
);

#[cfg(test)]
mod tests {
    use super::*;

    fn delay(decision: Decision) -> u64 {
        match decision {
            Decision::RetryAfterMs(ms) => ms,
            Decision::Dead(reason) => panic!("dead: {}", reason.as_str()),
        }
    }

    #[test]
    fn delays_grow_by_attempt_up_to_the_cap_and_jitter_over_the_whole_range() {
        let settings = Settings::default();
        assert_eq!(
            delay(settings.decide(ErrorClass::Transient, 1, 10, u64::MAX - 1)),
            (u64::MAX - 1) % 300_001
        );
        assert_eq!(
            delay(settings.decide(ErrorClass::NodeBusy, 1, 10, 300_000)),
            300_000
        );
        assert_eq!(
            delay(settings.decide(ErrorClass::Timeout, 2, 10, 600_000)),
            600_000
        );
        assert_eq!(
            delay(settings.decide(ErrorClass::LeaseExpired, 3, 10, 1_200_000)),
            1_200_000
        );
        // Capped at max_delay_ms however many attempts.
        assert_eq!(
            delay(settings.decide(ErrorClass::Transient, 9, 10, 3_600_000)),
            3_600_000
        );
        assert_eq!(
            delay(settings.decide(ErrorClass::Transient, 9, 10, 3_600_001)),
            0
        );
        assert!(delay(settings.decide(ErrorClass::Transient, 99, 100, u64::MAX)) <= DELAY_LIMIT_MS);
    }

    #[test]
    fn same_instant_failures_spread_out() {
        let settings = Settings::default();
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut delays: Vec<u64> = (0..50)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                delay(settings.decide(ErrorClass::Transient, 1, 3, state))
            })
            .collect();
        delays.sort_unstable();
        delays.dedup();
        assert_eq!(
            delays.len(),
            50,
            "no two of 50 same-instant failures wait the same"
        );
    }

    #[test]
    fn permanent_invalid_and_exhausted_failures_are_dead() {
        let settings = Settings::default();
        assert!(matches!(
            settings.decide(ErrorClass::Permanent, 1, 3, 0),
            Decision::Dead(_)
        ));
        assert!(matches!(
            settings.decide(ErrorClass::InvalidInput, 1, 3, 0),
            Decision::Dead(_)
        ));
        assert!(matches!(
            settings.decide(ErrorClass::Transient, 3, 3, 0),
            Decision::Dead(_)
        ));
        assert!(matches!(
            settings.decide(ErrorClass::Transient, 2, 3, 0),
            Decision::RetryAfterMs(_)
        ));
    }

    #[test]
    fn config_is_checked() {
        assert_eq!(Settings::parse(b"").unwrap(), Settings::default());
        let quick = Settings::parse(b"initial_delay_ms=100\nmax_delay_ms=1000").unwrap();
        assert_eq!(quick.initial_delay_ms, 100);
        assert!(Settings::parse(b"initial_delay_ms=0").is_err());
        assert!(Settings::parse(b"initial_delay_ms=5000\nmax_delay_ms=1000").is_err());
        assert!(Settings::parse(b"max_delay_ms=90000000").is_err());
        assert!(Settings::parse(b"initial_delay=1").is_err());
    }
}
