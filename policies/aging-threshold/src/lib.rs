//! Aging policy: a task that has waited `low_to_normal_ms` in low moves to normal, and one that
//! has waited `normal_to_urgent_ms` in normal moves to urgent (default 30 minutes each, after
//! the seed's fix for starved low-priority work). One step per tick: the wait counts from when
//! the task entered its current bucket.

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use sluice_policy::packed::{Bucket, View};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    pub low_to_normal_ms: u64,
    pub normal_to_urgent_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            low_to_normal_ms: 1_800_000,
            normal_to_urgent_ms: 1_800_000,
        }
    }
}

/// The settings the config may set.
pub const SETTING_NAMES: [&str; 2] = ["low_to_normal_ms", "normal_to_urgent_ms"];

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let defaults = Settings::default();
        let settings = Settings {
            low_to_normal_ms: config.u64_or("low_to_normal_ms", defaults.low_to_normal_ms)?,
            normal_to_urgent_ms: config
                .u64_or("normal_to_urgent_ms", defaults.normal_to_urgent_ms)?,
        };
        if settings.low_to_normal_ms == 0 || settings.normal_to_urgent_ms == 0 {
            return Err("waits must be at least 1 ms".into());
        }
        Ok(settings)
    }

    /// The index and new bucket of each task to move.
    pub fn age(&self, now_ms: u64, waiting: &[View]) -> Vec<(u32, Bucket)> {
        waiting
            .iter()
            .enumerate()
            .filter_map(|(index, task)| {
                Some((u32::try_from(index).ok()?, self.promote(now_ms, task)?))
            })
            .collect()
    }

    /// The bucket `task` moves to at `now_ms`, if it has waited long enough in its own.
    pub fn promote(&self, now_ms: u64, task: &View) -> Option<Bucket> {
        let waited = now_ms.saturating_sub(task.bucket_since_ms);
        match task.bucket {
            Bucket::Low if waited >= self.low_to_normal_ms => Some(Bucket::Normal),
            Bucket::Normal if waited >= self.normal_to_urgent_ms => Some(Bucket::Urgent),
            _ => None,
        }
    }
}

impl sluice_policy::Aging for Settings {
    fn init(config: &sluice_policy::Config) -> Result<Self, String> {
        Settings::from_config(config)
    }

    fn promote(&self, now_ms: u64, task: &sluice_policy::Task) -> Option<Bucket> {
        Settings::promote(self, now_ms, &task.view())
    }
}

sluice_policy::aging_policy!(Settings, settings = SETTING_NAMES, names = false);

#[cfg(test)]
mod tests {
    use super::*;

    fn view(bucket: Bucket, bucket_since_ms: u64) -> View {
        View {
            submitted_bucket: Bucket::Low,
            bucket_since_ms,
            ..View::in_bucket(0, bucket)
        }
    }

    #[test]
    fn promotes_one_step_after_the_threshold_and_not_before() {
        let settings = Settings::parse(b"low_to_normal_ms=100\nnormal_to_urgent_ms=200").unwrap();
        let waiting = [
            view(Bucket::Low, 1_000),  // waited 100: promote
            view(Bucket::Low, 1_001),  // waited 99: stay
            view(Bucket::Normal, 900), // waited 200: promote
            view(Bucket::Normal, 950), // waited 150: stay
            view(Bucket::Urgent, 0),   // already at the top
            view(Bucket::Low, 5_000),  // clock behind the entry time: stay
        ];
        let promotions = settings.age(1_100, &waiting);
        assert_eq!(promotions, [(0, Bucket::Normal), (2, Bucket::Urgent)]);
        // One task at a time (the `age-one` path) answers as the batch does.
        let one_by_one: Vec<Option<Bucket>> = waiting
            .iter()
            .map(|task| settings.promote(1_100, task))
            .collect();
        assert_eq!(
            one_by_one,
            [
                Some(Bucket::Normal),
                None,
                Some(Bucket::Urgent),
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn defaults_are_thirty_minutes_and_config_is_checked() {
        assert_eq!(Settings::parse(b"").unwrap().low_to_normal_ms, 1_800_000);
        assert!(Settings::parse(b"low_to_normal_ms=0").is_err());
        assert!(Settings::parse(b"wait_ms=5").is_err());
    }
}
