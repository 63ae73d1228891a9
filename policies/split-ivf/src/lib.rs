//! Split policy by IVF centroids: the `nprobe` centroids nearest the query vector (L2, ties by
//! list number) are probed, `lists_per_child` lists to a child. The centroids come as the
//! version's data blob `centroids` (an `.npy` of `lists × dim` little-endian f32, or raw
//! little-endian f32 rows with `dim` in the config), or for a few in the init config (`dim`, then
//! `centroids` as `lists × dim` numbers, row after row); a worker assigns
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
        Self::from_config_and_data(config, sluice_policy::data::get("centroids"))
    }

    /// The settings from the config and the `centroids` blob, if the version has one. Without
    /// centroids at all the policy inits, and refuses every split until a version with
    /// centroids is uploaded.
    pub fn from_config_and_data(
        config: &sluice_policy::Config,
        blob: Option<Vec<u8>>,
    ) -> Result<Settings, String> {
        let mut settings = Settings {
            dim: config.u32_or("dim", 0)? as usize,
            centroids: config.list_or("centroids", &[])?,
            nprobe: config.u32_or("nprobe", 1)?,
            lists_per_child: config.u32_or("lists_per_child", 1)?,
            max_children: config.u32_or("max_children", 256)?,
        };
        if settings.nprobe == 0 || settings.lists_per_child == 0 {
            return Err("`nprobe` and `lists_per_child` must be at least 1".into());
        }
        match blob {
            Some(_) if config.has("centroids") => {
                return Err("give the centroids in the config or as data, not both".into());
            }
            Some(bytes) => {
                let (dim, centroids) = read_centroids(&bytes, settings.dim)?;
                settings.dim = dim;
                settings.centroids = centroids;
            }
            // No centroids yet (perhaps `dim` for raw data to come): every split is refused.
            None if !config.has("centroids") => return Ok(settings),
            None => {}
        }
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

    /// Whether it has centroids to probe.
    pub fn has_centroids(&self) -> bool {
        !self.centroids.is_empty()
    }

    pub fn lists(&self) -> usize {
        self.centroids.len() / self.dim.max(1)
    }

    /// The lists to probe for `vector`, nearest centroid first.
    pub fn probe(&self, vector: &[f32], nprobe: u32) -> Result<Vec<u32>, String> {
        if !self.has_centroids() {
            return Err("no centroids: upload them as this version's data `centroids`".into());
        }
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

/// Centroids from a blob: an `.npy` of 2-D little-endian f32 (its shape gives the dimension,
/// which a `dim` setting must agree with), or raw little-endian f32 rows of `dim`.
pub fn read_centroids(bytes: &[u8], dim: usize) -> Result<(usize, Vec<f32>), String> {
    let (dim, body) = if bytes.starts_with(b"\x93NUMPY") {
        let (rows, cols, body) = npy_f32_matrix(bytes)?;
        if dim != 0 && dim != cols {
            return Err(format!("`dim` is {dim}; the centroids have {cols} columns"));
        }
        if body.len() != rows * cols * 4 {
            return Err("the .npy holds fewer values than its shape says".into());
        }
        (cols, body)
    } else {
        if dim == 0 {
            return Err("raw f32 centroids need `dim` in the config (or send an .npy)".into());
        }
        (dim, bytes)
    };
    if body.len() % (4 * dim) != 0 || body.is_empty() {
        return Err(format!(
            "the centroids are not whole rows of {dim} f32 values"
        ));
    }
    let centroids = body
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Ok((dim, centroids))
}

/// The shape and the data of a C-order 2-D `<f4` `.npy` (versions 1 to 3).
fn npy_f32_matrix(bytes: &[u8]) -> Result<(usize, usize, &[u8]), String> {
    let bad = |why: &str| format!("not a 2-D little-endian f32 .npy: {why}");
    let major = *bytes.get(6).ok_or_else(|| bad("too short"))?;
    let (len, start) = match major {
        1 => (
            u16::from_le_bytes([
                bytes.get(8).copied().unwrap_or(0),
                bytes.get(9).copied().unwrap_or(0),
            ]) as usize,
            10,
        ),
        2 | 3 => {
            let b = bytes.get(8..12).ok_or_else(|| bad("too short"))?;
            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 12)
        }
        _ => return Err(bad("unknown version")),
    };
    let header = bytes
        .get(start..start + len)
        .and_then(|h| core::str::from_utf8(h).ok())
        .ok_or_else(|| bad("unreadable header"))?;
    if !header.contains("'descr': '<f4'") {
        return Err(bad("the dtype is not '<f4'"));
    }
    if !header.contains("'fortran_order': False") {
        return Err(bad("Fortran order"));
    }
    let shape = header
        .split("'shape': (")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let dims: Vec<usize> = shape
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse().map_err(|_| bad("a bad shape")))
        .collect::<Result<_, _>>()?;
    match dims[..] {
        [rows, cols] if rows > 0 && cols > 0 => Ok((rows, cols, &bytes[start + len..])),
        _ => Err(bad("the shape is not (lists, dim)")),
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

    fn npy(rows: usize, cols: usize, values: &[f32]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    #[test]
    fn centroids_come_from_an_npy_or_raw_f32_blob() {
        let config = sluice_policy::Config::parse(b"nprobe=2", &SETTING_NAMES).unwrap();
        let corners = [0.0f32, 0.0, 10.0, 0.0, 0.0, 10.0, 10.0, 10.0];
        let from_npy = Settings::from_config_and_data(&config, Some(npy(4, 2, &corners))).unwrap();
        assert_eq!((from_npy.dim, from_npy.lists()), (2, 4));
        assert_eq!(lists(&from_npy.split(&[9.0, 1.0], 0).unwrap()), [[1], [0]]);
        let raw: Vec<u8> = corners.iter().flat_map(|v| v.to_le_bytes()).collect();
        let with_dim = sluice_policy::Config::parse(b"dim=2", &SETTING_NAMES).unwrap();
        let from_raw = Settings::from_config_and_data(&with_dim, Some(raw.clone())).unwrap();
        assert_eq!(from_raw.centroids, from_npy.centroids);
        assert!(Settings::from_config_and_data(&config, Some(raw)).is_err());
        let wrong_dim = sluice_policy::Config::parse(b"dim=3", &SETTING_NAMES).unwrap();
        assert!(Settings::from_config_and_data(&wrong_dim, Some(npy(4, 2, &corners))).is_err());
        assert!(Settings::from_config_and_data(&config, Some(npy(5, 2, &corners))).is_err());
    }

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
        // Without centroids it inits, and refuses to split.
        assert!(
            Settings::parse(b"nprobe=2")
                .unwrap()
                .split(&[0.0], 1)
                .is_err()
        );
        assert!(Settings::parse(b"centroids=1,2").is_err());
        assert!(Settings::parse(b"dim=1\ncentroids=1\nnprobe=0").is_err());
    }
}
