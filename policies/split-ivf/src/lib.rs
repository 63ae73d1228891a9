//! Split policy by IVF centroids: the `nprobe` centroids nearest the query vector (L2, ties by
//! list number) are probed, `lists_per_child` lists to a child. The centroids come in the init
//! config (`dim`, then `centroids` as `lists × dim` numbers, row after row); a worker assigns
//! its vectors to the same centroids, so child `c` searches the vectors whose nearest centroid
//! is one of its lists. `nprobe` comes from the query (0: the config's `nprobe`, default 1).

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use sluice_policy::split::{ShardFilter, SplitRequest, Subtask};

/// The most lists (centroids) a config may hold.
pub const MAX_LISTS: usize = 65_536;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Settings {
    pub dim: usize,
    pub centroids: Vec<f32>,
    pub nprobe: u32,
    pub lists_per_child: u32,
    pub max_children: u32,
}

/// The settings the config may set.
pub const SETTING_NAMES: [&str; 5] = [
    "dim",
    "centroids",
    "nprobe",
    "lists_per_child",
    "max_children",
];

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &SETTING_NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let settings = Settings {
            dim: config.u32_or("dim", 0)? as usize,
            centroids: config.list_or("centroids", &[])?,
            nprobe: config.u32_or("nprobe", 1)?,
            lists_per_child: config.u32_or("lists_per_child", 1)?,
            max_children: config.u32_or("max_children", 256)?,
        };
        if settings.dim == 0 {
            return Err("`dim` (the vectors' dimension) must be given and above 0".into());
        }
        if settings.centroids.is_empty() || !settings.centroids.len().is_multiple_of(settings.dim) {
            return Err(format!(
                "`centroids` must hold whole rows of {} numbers",
                settings.dim
            ));
        }
        if settings.lists() > MAX_LISTS {
            return Err(format!("at most {MAX_LISTS} centroids"));
        }
        if settings.centroids.iter().any(|c| !c.is_finite()) {
            return Err("`centroids` must be finite numbers".into());
        }
        if settings.nprobe == 0 || settings.lists_per_child == 0 {
            return Err("`nprobe` and `lists_per_child` must be at least 1".into());
        }
        Ok(settings)
    }

    pub fn lists(&self) -> usize {
        self.centroids.len() / self.dim.max(1)
    }

    /// The lists to probe for `vector`, nearest centroid first.
    pub fn probe(&self, vector: &[f32], nprobe: u32) -> Result<Vec<u32>, String> {
        if vector.len() != self.dim {
            return Err(format!(
                "the query has {} dimensions; the centroids have {}",
                vector.len(),
                self.dim
            ));
        }
        if vector.iter().any(|x| !x.is_finite()) {
            return Err("the query vector must be finite numbers".into());
        }
        let mut ranked: Vec<(f32, u32)> = self
            .centroids
            .chunks_exact(self.dim)
            .zip(0u32..)
            .map(|(centroid, list)| {
                let d: f32 = centroid
                    .iter()
                    .zip(vector)
                    .map(|(c, x)| (c - x) * (c - x))
                    .sum();
                (d, list)
            })
            .collect();
        ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let take = if nprobe == 0 { self.nprobe } else { nprobe } as usize;
        Ok(ranked
            .into_iter()
            .take(take)
            .map(|(_, list)| list)
            .collect())
    }

    pub fn split(&self, vector: &[f32], nprobe: u32) -> Result<Vec<Subtask>, String> {
        let lists = self.probe(vector, nprobe)?;
        let per_child = self.lists_per_child as usize;
        let children = lists.len().div_ceil(per_child) as u32;
        sluice_policy::check_children(children, self.max_children, "probed list groups")?;
        Ok(lists
            .chunks(per_child)
            .map(|group| Subtask {
                filter: ShardFilter::Centroids(group.to_vec()),
                weight: 1.0,
            })
            .collect())
    }
}

impl sluice_policy::Split for Settings {
    fn init(config: &sluice_policy::Config) -> Result<Self, String> {
        Settings::from_config(config)
    }

    fn split(&self, request: &SplitRequest) -> Result<Vec<Subtask>, String> {
        Settings::split(self, &request.vector, request.nprobe)
    }
}

sluice_policy::split_policy!(Settings, settings = SETTING_NAMES);

#[cfg(test)]
mod tests {
    use super::*;

    fn four_corners() -> Settings {
        Settings::parse(b"dim=2\ncentroids=0,0, 10,0, 0,10, 10,10\nnprobe=2").unwrap()
    }

    fn lists(children: &[Subtask]) -> Vec<Vec<u32>> {
        children
            .iter()
            .map(|c| match &c.filter {
                ShardFilter::Centroids(lists) => lists.clone(),
                _ => panic!("not a centroid filter"),
            })
            .collect()
    }

    #[test]
    fn probes_the_nearest_centroids_one_list_per_child() {
        let settings = four_corners();
        assert_eq!(lists(&settings.split(&[9.0, 1.0], 0).unwrap()), [[1], [0]]);
        // Equidistant from all four: ties go by list number.
        assert_eq!(
            lists(&settings.split(&[5.0, 5.0], 4).unwrap()),
            [[0], [1], [2], [3]]
        );
        // More probes than lists probes them all.
        assert_eq!(settings.split(&[0.0, 0.0], 9).unwrap().len(), 4);
    }

    #[test]
    fn groups_lists_and_refuses_bad_queries_and_configs() {
        let mut settings = four_corners();
        settings.lists_per_child = 3;
        assert_eq!(
            lists(&settings.split(&[0.0, 0.0], 4).unwrap()),
            [vec![0, 1, 2], vec![3]]
        );
        assert!(settings.split(&[1.0], 1).is_err());
        assert!(settings.split(&[f32::NAN, 0.0], 1).is_err());
        settings.max_children = 1;
        settings.lists_per_child = 1;
        assert!(settings.split(&[0.0, 0.0], 2).is_err());
        assert!(Settings::parse(b"dim=3\ncentroids=1,2").is_err());
        assert!(Settings::parse(b"centroids=1,2").is_err());
        assert!(Settings::parse(b"dim=1\ncentroids=1\nnprobe=0").is_err());
    }
}
