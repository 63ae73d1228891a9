//! Aging policy after Slurm's multifactor age factor: a task's score is its submitted
//! priority's base (low 0, normal 1000, urgent 2000) plus an age factor that grows linearly
//! with the time since submission, `age_weight` at `max_age_ms` and no more after; the score
//! picks the bucket (1000 and up normal, 2000 and up urgent). Unlike the threshold policy,
//! the wait counts from submission, not from entering the current bucket, and one setting
//! (`age_weight`) says how far age may lift a task: with the default 1500 a low task reaches
//! normal at two thirds of the maximum age and never urgent, while a normal task reaches
//! urgent at two thirds of it.
//!
//! Slurm adds the factor to a job's rank; here the score picks a bucket and, inside a
//! bucket, tasks stay in arrival order, which is already oldest first.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;

use sluice_policy::packed::{Bucket, View};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// The age at which the factor stops growing.
    pub max_age_ms: u64,
    /// The factor at `max_age_ms`, on the buckets' scale of 1000 apart.
    pub age_weight: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_age_ms: 3_600_000,
            age_weight: 1_500,
        }
    }
}

pub const SETTING_NAMES: [&str; 2] = ["max_age_ms", "age_weight"];

/// The score at which a task belongs to normal, and to urgent.
const NORMAL_SCORE: u64 = 1_000;
const URGENT_SCORE: u64 = 2_000;

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let defaults = Settings::default();
        let settings = Settings {
            max_age_ms: config.u64_or("max_age_ms", defaults.max_age_ms)?,
            age_weight: config.u64_or("age_weight", defaults.age_weight)?,
        };
        if settings.max_age_ms == 0 {
            return Err("max_age_ms must be at least 1".into());
        }
        if settings.age_weight > 10_000 {
            return Err("age_weight is at most 10000 (ten buckets' worth)".into());
        }
        Ok(settings)
    }

    /// The task's score at `now_ms`: its base plus its age factor.
    pub fn score(&self, now_ms: u64, task: &View) -> u64 {
        let base = match task.submitted_bucket {
            Bucket::Low => 0,
            Bucket::Normal => NORMAL_SCORE,
            Bucket::Urgent => URGENT_SCORE,
        };
        let age_ms = now_ms.saturating_sub(task.created_ms).min(self.max_age_ms);
        // u128: age_weight × max_age_ms may pass u64 for long ages and large weights.
        let factor = u128::from(self.age_weight) * u128::from(age_ms) / u128::from(self.max_age_ms);
        base + factor as u64
    }

    /// The bucket the score reaches, when it is above the task's current one.
    pub fn promote(&self, now_ms: u64, task: &View) -> Option<Bucket> {
        let score = self.score(now_ms, task);
        let reached = if score >= URGENT_SCORE {
            Bucket::Urgent
        } else if score >= NORMAL_SCORE {
            Bucket::Normal
        } else {
            Bucket::Low
        };
        // Buckets order urgent first.
        (reached < task.bucket).then_some(reached)
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

    fn submitted(bucket: Bucket, created_ms: u64) -> View {
        View {
            created_ms,
            ..View::in_bucket(0, bucket)
        }
    }

    #[test]
    fn the_factor_grows_linearly_and_stops_at_the_maximum_age() {
        let settings = Settings::parse(b"max_age_ms=1000\nage_weight=1500").unwrap();
        let low = submitted(Bucket::Low, 0);
        assert_eq!(settings.score(0, &low), 0);
        assert_eq!(settings.score(500, &low), 750);
        assert_eq!(settings.score(1_000, &low), 1_500);
        assert_eq!(settings.score(50_000, &low), 1_500);
        // A low task reaches normal at two thirds of the maximum age, never urgent.
        assert_eq!(settings.promote(666, &low), None);
        assert_eq!(settings.promote(667, &low), Some(Bucket::Normal));
        assert_eq!(settings.promote(1_000_000, &low), Some(Bucket::Normal));
        // A normal task reaches urgent at the same age.
        let normal = submitted(Bucket::Normal, 0);
        assert_eq!(settings.promote(666, &normal), None);
        assert_eq!(settings.promote(667, &normal), Some(Bucket::Urgent));
    }

    #[test]
    fn the_age_counts_from_submission_and_a_promoted_task_is_not_promoted_again() {
        let settings = Settings::parse(b"max_age_ms=1000\nage_weight=2500").unwrap();
        // Submitted low at 100, already moved to normal: at 900 its score (2000) is urgent's.
        let moved = View {
            bucket: Bucket::Normal,
            bucket_since_ms: 800,
            ..submitted(Bucket::Low, 100)
        };
        assert_eq!(settings.promote(900, &moved), Some(Bucket::Urgent));
        // Already where its score puts it: nothing.
        let there = View {
            bucket: Bucket::Normal,
            ..submitted(Bucket::Low, 100)
        };
        assert_eq!(settings.promote(600, &there), None);
        // A clock behind the submission: no age at all.
        assert_eq!(settings.promote(50, &submitted(Bucket::Low, 100)), None);
    }

    #[test]
    fn config_is_checked() {
        assert_eq!(Settings::parse(b"").unwrap(), Settings::default());
        assert!(Settings::parse(b"max_age_ms=0").is_err());
        assert!(Settings::parse(b"age_weight=10001").is_err());
        assert!(Settings::parse(b"weight=5").is_err());
    }
}
