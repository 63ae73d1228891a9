//! Split policy by id range: `parts` children dividing [`id_min`, `id_max`) into contiguous
//! ranges that differ in size by at most one id. Simple, and even when ids are dense.

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use sluice_policy::split::{ShardFilter, SplitRequest, Subtask};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    pub id_min: u64,
    pub id_max: u64,
    pub parts: u32,
    pub max_children: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            id_min: 0,
            id_max: 1,
            parts: 1,
            max_children: 256,
        }
    }
}

/// The settings the config may set.
pub const SETTING_NAMES: [&str; 4] = ["id_min", "id_max", "parts", "max_children"];

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let settings = Settings {
            id_min: config.u64_or("id_min", 0)?,
            id_max: config.u64_or("id_max", 1)?,
            parts: config.u32_or("parts", 1)?,
            max_children: config.u32_or("max_children", 256)?,
        };
        if settings.id_max <= settings.id_min {
            return Err("`id_max` must be above `id_min`".into());
        }
        if settings.parts == 0 || u64::from(settings.parts) > settings.id_max - settings.id_min {
            return Err("`parts` must be at least 1 and at most the number of ids".into());
        }
        Ok(settings)
    }

    pub fn split(&self) -> Result<Vec<Subtask>, String> {
        sluice_policy::check_children(self.parts, self.max_children, "parts")?;
        let span = self.id_max - self.id_min;
        let parts = u64::from(self.parts);
        let (size, extra) = (span / parts, span % parts);
        let mut low = self.id_min;
        Ok((0..parts)
            .map(|part| {
                let high = low + size + u64::from(part < extra);
                let child = Subtask {
                    filter: ShardFilter::IdRange((low, high)),
                    weight: 1.0,
                };
                low = high;
                child
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

    fn ranges(config: &[u8]) -> Vec<(u64, u64)> {
        Settings::parse(config)
            .unwrap()
            .split()
            .unwrap()
            .iter()
            .map(|c| match c.filter {
                ShardFilter::IdRange(range) => range,
                _ => panic!("not a range filter"),
            })
            .collect()
    }

    #[test]
    fn ranges_are_contiguous_cover_everything_and_differ_by_at_most_one() {
        assert_eq!(
            ranges(b"id_min=0\nid_max=10\nparts=3"),
            [(0, 4), (4, 7), (7, 10)]
        );
        assert_eq!(
            ranges(b"id_min=100\nid_max=104\nparts=4"),
            [(100, 101), (101, 102), (102, 103), (103, 104)]
        );
        let wide = ranges(b"id_min=0\nid_max=10000000\nparts=7");
        assert_eq!(wide.first().unwrap().0, 0);
        assert_eq!(wide.last().unwrap().1, 10_000_000);
        assert!(wide.windows(2).all(|w| w[0].1 == w[1].0));
    }

    #[test]
    fn bad_ranges_and_too_many_parts_are_refused() {
        assert!(Settings::parse(b"id_min=5\nid_max=5").is_err());
        assert!(Settings::parse(b"id_min=0\nid_max=3\nparts=4").is_err());
        assert!(
            Settings::parse(b"id_min=0\nid_max=1000\nparts=300")
                .unwrap()
                .split()
                .is_err()
        );
    }
}
