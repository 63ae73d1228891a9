//! Split policy by stored shard: one child per shard (`shards=N`), each weighted 1 unless
//! `weights` lists one weight per shard. More children than `max_children` (default 256) is
//! refused: a split too fine costs more to schedule than to run (seed 000).

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use sluice_policy::split::{ShardFilter, SplitRequest, Subtask};

#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub shards: u32,
    pub weights: Vec<f32>,
    pub max_children: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            shards: 1,
            weights: Vec::new(),
            max_children: 256,
        }
    }
}

/// The settings the config may set.
pub const SETTING_NAMES: [&str; 3] = ["shards", "weights", "max_children"];

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let settings = Settings {
            shards: config.u32_or("shards", 1)?,
            weights: config.list_or("weights", &[])?,
            max_children: config.u32_or("max_children", 256)?,
        };
        if settings.shards == 0 {
            return Err("`shards` must be at least 1".into());
        }
        if !settings.weights.is_empty() && settings.weights.len() != settings.shards as usize {
            return Err("`weights` needs one weight per shard".into());
        }
        if settings.weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
            return Err("`weights` must be finite and not negative".into());
        }
        Ok(settings)
    }

    pub fn split(&self) -> Result<Vec<Subtask>, String> {
        sluice_policy::check_children(self.shards, self.max_children, "shards")?;
        Ok((0..self.shards)
            .map(|shard| Subtask {
                filter: ShardFilter::Shard(shard),
                weight: self.weights.get(shard as usize).copied().unwrap_or(1.0),
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
    fn one_child_per_shard_with_weights() {
        let children = Settings::parse(b"shards=3\nweights=1,0.5,2")
            .unwrap()
            .split()
            .unwrap();
        let shards: Vec<_> = children
            .iter()
            .map(|c| match c.filter {
                ShardFilter::Shard(s) => (s, c.weight),
                _ => panic!("not a shard filter"),
            })
            .collect();
        assert_eq!(shards, [(0, 1.0), (1, 0.5), (2, 2.0)]);
        assert_eq!(
            Settings::parse(b"shards=4").unwrap().split().unwrap().len(),
            4
        );
    }

    #[test]
    fn too_many_children_and_bad_config_are_refused() {
        assert!(Settings::parse(b"shards=300").unwrap().split().is_err());
        assert!(
            Settings::parse(b"shards=300\nmax_children=512")
                .unwrap()
                .split()
                .is_ok()
        );
        assert!(Settings::parse(b"shards=0").is_err());
        assert!(Settings::parse(b"shards=2\nweights=1").is_err());
        assert!(Settings::parse(b"shards=1\nweights=-1").is_err());
    }
}
