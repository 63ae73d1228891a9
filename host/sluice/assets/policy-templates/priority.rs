//! A priority policy: tasks whose kind starts with one of `urgent_prefixes` (a setting, e.g.
//! `urgent_prefixes=oct.,ed.`), or that carry the label `ed=true`, wait in urgent; the rest in
//! the bucket they were submitted to. First come first served in each bucket; an attempt may
//! run twice its estimate.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use sluice_policy::{Admission, Bucket, Config, Priority, Task};

/// The settings this policy reads; any other name is refused at upload.
pub const SETTINGS: [&str; 2] = ["weights", "urgent_prefixes"];

pub struct ByKind {
    weights: [u32; 3],
    urgent_prefixes: Vec<String>,
}

impl Priority for ByKind {
    fn init(config: &Config) -> Result<Self, String> {
        let weights = config.list_or("weights", &[60u32, 35, 5])?;
        let weights: [u32; 3] = weights
            .try_into()
            .map_err(|_| String::from("weights needs three values"))?;
        let urgent_prefixes = config.list_or::<String>("urgent_prefixes", &[])?;
        Ok(ByKind {
            weights,
            urgent_prefixes,
        })
    }

    fn bucket_weights(&self) -> [u32; 3] {
        self.weights
    }

    fn admit(&self, _now_ms: u64, task: &Task) -> Admission {
        let urgent = self
            .urgent_prefixes
            .iter()
            .any(|prefix| task.kind.starts_with(prefix.as_str()))
            || task.label("ed") == Some("true");
        Admission {
            bucket: if urgent { Bucket::Urgent } else { task.submitted_bucket },
            rank: task.seq,
            attempt_timeout_ms: task.est_exec_ms.saturating_mul(2).max(1),
        }
    }
}

sluice_policy::priority_policy!(ByKind, settings = SETTINGS);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::{Names, View};

    fn bucket_of(policy: &ByKind, kind: &str, labels: &[(&str, &str)]) -> Bucket {
        let names = Names {
            kind: kind.into(),
            tenant: "site-a".into(),
            device: "scanner-1".into(),
            labels: labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect(),
        };
        let task = Task::new(View::in_bucket(1, Bucket::Low), &names);
        policy.admit(0, &task).bucket
    }

    #[test]
    fn listed_kinds_and_emergencies_are_urgent_and_the_rest_keep_their_bucket() {
        let config = Config::parse(b"urgent_prefixes=oct.", &SETTINGS).unwrap();
        let policy = ByKind::init(&config).unwrap();
        assert_eq!(bucket_of(&policy, "oct.qa", &[]), Bucket::Urgent);
        assert_eq!(bucket_of(&policy, "ct.scan", &[]), Bucket::Low);
        assert_eq!(bucket_of(&policy, "ct.scan", &[("ed", "true")]), Bucket::Urgent);
    }

    #[test]
    fn a_setting_it_does_not_know_is_refused() {
        assert!(Config::parse(b"urgent_prefix=oct.", &SETTINGS).is_err());
    }
}
