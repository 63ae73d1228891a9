//! Split policy by hash of vector id: `buckets=N` children, child `i` covering the ids whose
//! hash modulo N is `i`. Even load on any data set, at the cost of every child scanning for its
//! ids (seed 000's table).

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use sluice_policy::split::{ShardFilter, SplitRequest, Subtask};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    pub buckets: u32,
    pub max_children: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            buckets: 1,
            max_children: 256,
        }
    }
}

/// The settings the config may set.
pub const SETTING_NAMES: [&str; 2] = ["buckets", "max_children"];

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let settings = Settings {
            buckets: config.u32_or("buckets", 1)?,
            max_children: config.u32_or("max_children", 256)?,
        };
        if settings.buckets == 0 {
            return Err("`buckets` must be at least 1".into());
        }
        Ok(settings)
    }

    pub fn split(&self) -> Result<Vec<Subtask>, String> {
        sluice_policy::check_children(self.buckets, self.max_children, "buckets")?;
        Ok((0..self.buckets)
            .map(|bucket| Subtask {
                filter: ShardFilter::IdHash((bucket, self.buckets)),
                weight: 1.0,
            })
            .collect())
    }
}

impl sluice_policy::Split for Settings {
    fn init(config: &sluice_policy::Config) -> Result<Self, String> {
        Settings::from_config(config)
    }

    fn split(&self, _request: &SplitRequest) -> Result<Vec<Subtask>, String> {
        Settings::split(self)
    }
}

sluice_policy::split_policy!(Settings, settings = SETTING_NAMES);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_cover_every_bucket_once() {
        let children = Settings::parse(b"buckets=4").unwrap().split().unwrap();
        let filters: Vec<_> = children
            .iter()
            .map(|c| match c.filter {
                ShardFilter::IdHash(pair) => pair,
                _ => panic!("not a hash filter"),
            })
            .collect();
        assert_eq!(filters, [(0, 4), (1, 4), (2, 4), (3, 4)]);
        assert!(Settings::parse(b"buckets=257").unwrap().split().is_err());
        assert!(Settings::parse(b"buckets=0").is_err());
    }
}
