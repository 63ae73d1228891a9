//! Merge policy: every hit within `max_distance` (config, default unbounded), each id once,
//! nearest first, ties broken by id, at most `k` (the host's bound on any answer). For a
//! search that wants "everything this close" rather than a fixed count.

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use merge_core::{Hit, MAX_K, Part};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    pub max_distance: f32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_distance: f32::INFINITY,
        }
    }
}

/// The settings the config may set.
pub const SETTING_NAMES: [&str; 1] = ["max_distance"];

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let mut settings = Settings::default();
        if config.has("max_distance") {
            settings.max_distance = config.f64_or("max_distance", 0.0)? as f32;
        }
        Ok(settings)
    }

    pub fn merge(&self, k: u32, parts: Vec<Part>) -> Result<Vec<Hit>, String> {
        if k > MAX_K {
            return Err(format!("k is {k}; at most {MAX_K}"));
        }
        let mut hits = Vec::new();
        for part in parts {
            for hit in part.hits {
                if hit.distance.is_nan() {
                    return Err(format!(
                        "child {} answered id {} with a NaN distance",
                        part.child, hit.id
                    ));
                }
                if hit.distance <= self.max_distance {
                    hits.push(hit);
                }
            }
        }
        merge_core::sort_unique(&mut hits);
        hits.truncate(k as usize);
        Ok(hits)
    }
}

impl sluice_policy::Merge for Settings {
    fn init(config: &sluice_policy::Config) -> Result<Self, String> {
        Settings::from_config(config)
    }

    fn merge(&self, k: u32, parts: Vec<Part>) -> Result<Vec<Hit>, String> {
        Settings::merge(self, k, parts)
    }
}

sluice_policy::merge_policy!(Settings, settings = SETTING_NAMES);

#[cfg(test)]
mod tests {
    use super::*;

    fn part(child: u32, hits: &[(u64, f32)]) -> Part {
        Part {
            child,
            weight: 1.0,
            hits: hits
                .iter()
                .map(|&(id, distance)| Hit { id, distance })
                .collect(),
        }
    }

    #[test]
    fn keeps_hits_within_the_threshold_once_each_nearest_first() {
        let settings = Settings::parse(b"max_distance=0.5").unwrap();
        let parts = vec![
            part(0, &[(4, 0.5), (1, 0.1), (9, 0.7)]),
            part(1, &[(1, 0.1), (2, 0.5), (3, 0.3)]),
        ];
        let ids: Vec<u64> = settings
            .merge(10, parts.clone())
            .unwrap()
            .iter()
            .map(|h| h.id)
            .collect();
        assert_eq!(ids, [1, 3, 2, 4]);
        assert_eq!(settings.merge(2, parts).unwrap().len(), 2);
    }

    #[test]
    fn defaults_to_every_hit_and_refuses_bad_input() {
        let all = Settings::parse(b"").unwrap();
        assert_eq!(all.merge(10, vec![part(0, &[(1, 9e9)])]).unwrap().len(), 1);
        assert!(all.merge(10, vec![part(0, &[(1, f32::NAN)])]).is_err());
        assert!(all.merge(MAX_K + 1, Vec::new()).is_err());
        assert!(Settings::parse(b"max_distance=x").is_err());
        assert!(Settings::parse(b"threshold=1").is_err());
    }
}
