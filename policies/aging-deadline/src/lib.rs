//! Deadline-aware aging: each submitted priority has a turnaround target (low
//! `low_target_ms`, default an hour; normal `normal_target_ms`, default 15 minutes), so a task
//! is due by its submission plus its bucket's target. Its slack is what is left of that once
//! its own estimate is taken off: `created + target − now − est_exec_ms`. A low task whose
//! slack is below normal's target moves to normal (only normal's pace still makes it); any
//! task whose slack is below `headroom_ms` (default a minute) moves to urgent. So long tasks
//! move earlier than short ones that were submitted with them, which the threshold policy
//! cannot do.
//!
//! The aging view carries the task's estimate but not its own `deadline_ms`; targets per
//! bucket stand for it here.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;

use sluice_policy::packed::{Bucket, View};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    pub low_target_ms: u64,
    pub normal_target_ms: u64,
    pub headroom_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            low_target_ms: 3_600_000,
            normal_target_ms: 900_000,
            headroom_ms: 60_000,
        }
    }
}

pub const SETTING_NAMES: [&str; 3] = ["low_target_ms", "normal_target_ms", "headroom_ms"];

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let defaults = Settings::default();
        let settings = Settings {
            low_target_ms: config.u64_or("low_target_ms", defaults.low_target_ms)?,
            normal_target_ms: config.u64_or("normal_target_ms", defaults.normal_target_ms)?,
            headroom_ms: config.u64_or("headroom_ms", defaults.headroom_ms)?,
        };
        if settings.normal_target_ms == 0 || settings.low_target_ms < settings.normal_target_ms {
            return Err("the targets must be 1 ms or more, low's at least normal's".into());
        }
        if settings.headroom_ms >= settings.normal_target_ms {
            return Err("headroom_ms must be below normal_target_ms".into());
        }
        Ok(settings)
    }

    /// What is left of the task's target once its estimate is run, at `now_ms`; negative
    /// when it can no longer make it. None for urgent work, which has no target here.
    pub fn slack_ms(&self, now_ms: u64, task: &View) -> Option<i128> {
        let target_ms = match task.submitted_bucket {
            Bucket::Low => self.low_target_ms,
            Bucket::Normal => self.normal_target_ms,
            Bucket::Urgent => return None,
        };
        let due_ms = i128::from(task.created_ms) + i128::from(target_ms);
        Some(due_ms - i128::from(now_ms) - i128::from(task.est_exec_ms))
    }

    pub fn promote(&self, now_ms: u64, task: &View) -> Option<Bucket> {
        let slack_ms = self.slack_ms(now_ms, task)?;
        let to = if slack_ms < i128::from(self.headroom_ms) {
            Bucket::Urgent
        } else if slack_ms < i128::from(self.normal_target_ms) && task.bucket == Bucket::Low {
            Bucket::Normal
        } else {
            return None;
        };
        (to != task.bucket).then_some(to)
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

    fn task(bucket: Bucket, created_ms: u64, est_exec_ms: u64) -> View {
        View {
            created_ms,
            est_exec_ms,
            ..View::in_bucket(0, bucket)
        }
    }

    fn settings() -> Settings {
        Settings::parse(b"low_target_ms=10000\nnormal_target_ms=4000\nheadroom_ms=1000").unwrap()
    }

    #[test]
    fn a_low_task_moves_to_normal_then_urgent_as_its_slack_runs_out() {
        let s = settings();
        let low = task(Bucket::Low, 0, 1_000);
        // Slack at 4,000: 10,000 − 4,000 − 1,000 = 5,000: not yet below normal's target.
        assert_eq!(s.promote(4_000, &low), None);
        // At 5,001 the slack is 3,999.
        assert_eq!(s.promote(5_001, &low), Some(Bucket::Normal));
        // At 8,001 it is 999: below the headroom, straight to urgent.
        assert_eq!(s.promote(8_001, &low), Some(Bucket::Urgent));
        let moved = View {
            bucket: Bucket::Normal,
            ..low
        };
        assert_eq!(s.promote(6_000, &moved), None);
        assert_eq!(s.promote(8_001, &moved), Some(Bucket::Urgent));
    }

    #[test]
    fn a_long_task_moves_before_a_short_one_submitted_with_it() {
        let s = settings();
        let short = task(Bucket::Normal, 0, 100);
        let long = task(Bucket::Normal, 0, 2_500);
        assert_eq!(s.promote(1_000, &long), Some(Bucket::Urgent));
        assert_eq!(s.promote(1_000, &short), None);
        assert_eq!(s.promote(2_901, &short), Some(Bucket::Urgent));
        // Urgent work has no target here.
        assert_eq!(s.promote(1_000_000, &task(Bucket::Urgent, 0, 1)), None);
    }

    #[test]
    fn config_is_checked() {
        assert_eq!(Settings::parse(b"").unwrap(), Settings::default());
        assert!(Settings::parse(b"normal_target_ms=0").is_err());
        assert!(Settings::parse(b"low_target_ms=10\nnormal_target_ms=20").is_err());
        assert!(Settings::parse(b"headroom_ms=900000").is_err());
        assert!(Settings::parse(b"deadline_ms=5").is_err());
    }
}
