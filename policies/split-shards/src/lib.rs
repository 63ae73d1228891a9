//! Split policy by stored shard: one child per shard of the collection that has a live worker
//! (from the layout the host gives), or per shard 0 to N-1 when `shards=N` is set; each
//! weighted 1 unless `weights` lists one weight per shard. More children than `max_children`
//! (default 256) is refused: a split too fine costs more to schedule than to run (seed 000).
//! A shard left out because no worker holds it is reported missing by the host, so the
//! answer says it is partial.

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use sluice_policy::split::{Layout, ShardFilter, SplitRequest, Subtask};

#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Shards to split over whatever the layout says; `None` (the default) follows it.
    pub shards: Option<u32>,
    pub weights: Vec<f32>,
    pub max_children: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            shards: None,
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
        let shards = match config.u32_or("shards", 0)? {
            0 if config.has("shards") => return Err("`shards` must be at least 1".into()),
            0 => None,
            n => Some(n),
        };
        let settings = Settings {
            shards,
            weights: config.list_or("weights", &[])?,
            max_children: config.u32_or("max_children", 256)?,
        };
        if let Some(shards) = settings.shards
            && !settings.weights.is_empty()
            && settings.weights.len() != shards as usize
        {
            return Err("`weights` needs one weight per shard".into());
        }
        if settings.weights.iter().any(|w| !w.is_finite() || *w < 0.0) {
            return Err("`weights` must be finite and not negative".into());
        }
        Ok(settings)
    }

    /// The children for `layout`: its live shards, or every shard of `shards` when set (a
    /// host that gives no layout says 0 shards: then shard 0 alone).
    pub fn split(&self, layout: &Layout) -> Result<Vec<Subtask>, String> {
        let shards: Vec<u32> = match self.shards {
            Some(shards) => (0..shards).collect(),
            None if layout.shards == 0 => alloc::vec![0],
            None if layout.live.is_empty() => {
                return Err(alloc::format!(
                    "no shard of collection `{}` has a live worker",
                    layout.collection
                ));
            }
            None => layout.live.clone(),
        };
        sluice_policy::check_children(shards.len() as u32, self.max_children, "shards")?;
        Ok(shards
            .into_iter()
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

    fn split(&self, request: &SplitRequest) -> Result<Vec<Subtask>, String> {
        Settings::split(self, &request.layout)
    }
}

sluice_policy::split_policy!(Settings, settings = SETTING_NAMES);

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(shards: u32, live: &[u32]) -> Layout {
        Layout {
            collection: "docs".into(),
            dim: 8,
            shards,
            live: live.to_vec(),
        }
    }

    #[test]
    fn one_child_per_live_shard_by_default_and_none_is_refused() {
        let settings = Settings::parse(b"").unwrap();
        let children = settings.split(&layout(4, &[0, 1, 3])).unwrap();
        let shards: Vec<_> = children
            .iter()
            .map(|c| match c.filter {
                ShardFilter::Shard(s) => s,
                _ => panic!("not a shard filter"),
            })
            .collect();
        assert_eq!(shards, [0, 1, 3]);
        let none = settings.split(&layout(4, &[])).unwrap_err();
        assert!(none.contains("`docs`"), "{none}");
        // A host that gives no layout (0 shards): shard 0, as before layouts.
        assert_eq!(settings.split(&layout(0, &[])).unwrap().len(), 1);
    }

    #[test]
    fn one_child_per_shard_with_weights() {
        let children = Settings::parse(b"shards=3\nweights=1,0.5,2")
            .unwrap()
            .split(&layout(4, &[0]))
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
            Settings::parse(b"shards=4")
                .unwrap()
                .split(&layout(4, &[]))
                .unwrap()
                .len(),
            4
        );
    }

    #[test]
    fn too_many_children_and_bad_config_are_refused() {
        let any = layout(0, &[]);
        assert!(Settings::parse(b"shards=300").unwrap().split(&any).is_err());
        assert!(
            Settings::parse(b"shards=300\nmax_children=512")
                .unwrap()
                .split(&any)
                .is_ok()
        );
        assert!(Settings::parse(b"shards=0").is_err());
        assert!(Settings::parse(b"shards=2\nweights=1").is_err());
        assert!(Settings::parse(b"shards=1\nweights=-1").is_err());
    }
}
