//! Server configuration: defaults, overridden by a TOML file, by `SLUICE_*` environment
//! variables, then by command-line flags (clap reads the last two).

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read the config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: String,
        source: toml::de::Error,
    },
    #[error("invalid setting `{name}`: {reason}")]
    Invalid { name: &'static str, reason: String },
}

/// Everything `sluice serve` needs, resolved.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub max_payload_bytes: usize,
    pub max_batch_body_bytes: usize,
    /// Request bodies held in memory at once; past it, requests are refused as overloaded.
    pub inflight_body_bytes: usize,
    pub queue_capacity: usize,
    pub cache_capacity_bytes: u64,
    pub fdatasync: bool,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            data_dir: PathBuf::from("./sluice-data"),
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            max_payload_bytes: 1024 * 1024,
            max_batch_body_bytes: 16 * 1024 * 1024,
            inflight_body_bytes: 256 * 1024 * 1024,
            queue_capacity: 4096,
            cache_capacity_bytes: 512 * 1024 * 1024,
            fdatasync: true,
        }
    }
}

/// The `[server]`-level keys a config file may set; any other key is an error.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub max_payload_bytes: Option<usize>,
    pub max_batch_body_bytes: Option<usize>,
    pub inflight_body_bytes: Option<usize>,
    pub queue_capacity: Option<usize>,
    pub cache_capacity_bytes: Option<u64>,
    pub fdatasync: Option<bool>,
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.display().to_string(),
            source,
        })
    }
}

/// Settings given on the command line or in the environment; each overrides the file.
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub max_payload_bytes: Option<usize>,
    pub fdatasync: Option<bool>,
}

impl ServeConfig {
    pub fn resolve(file: FileConfig, overrides: Overrides) -> Result<ServeConfig, ConfigError> {
        let defaults = ServeConfig::default();
        let config = ServeConfig {
            data_dir: overrides
                .data_dir
                .or(file.data_dir)
                .unwrap_or(defaults.data_dir),
            listen: overrides.listen.or(file.listen).unwrap_or(defaults.listen),
            max_payload_bytes: overrides
                .max_payload_bytes
                .or(file.max_payload_bytes)
                .unwrap_or(defaults.max_payload_bytes),
            max_batch_body_bytes: file
                .max_batch_body_bytes
                .unwrap_or(defaults.max_batch_body_bytes),
            inflight_body_bytes: file
                .inflight_body_bytes
                .unwrap_or(defaults.inflight_body_bytes),
            queue_capacity: file.queue_capacity.unwrap_or(defaults.queue_capacity),
            cache_capacity_bytes: file
                .cache_capacity_bytes
                .unwrap_or(defaults.cache_capacity_bytes),
            fdatasync: overrides
                .fdatasync
                .or(file.fdatasync)
                .unwrap_or(defaults.fdatasync),
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |name, reason: &str| ConfigError::Invalid {
            name,
            reason: reason.to_owned(),
        };
        if !(1..=64 * 1024 * 1024).contains(&self.max_payload_bytes) {
            return Err(invalid("max_payload_bytes", "must be 1 B to 64 MiB"));
        }
        if self.max_batch_body_bytes < 1024 || self.max_batch_body_bytes > 256 * 1024 * 1024 {
            return Err(invalid("max_batch_body_bytes", "must be 1 KiB to 256 MiB"));
        }
        let largest_body = self
            .max_batch_body_bytes
            .max(self.max_payload_bytes + 64 * 1024);
        if self.inflight_body_bytes < largest_body || self.inflight_body_bytes > 4 << 30 {
            return Err(invalid(
                "inflight_body_bytes",
                "must hold at least the largest body (batch or single) and at most 4 GiB",
            ));
        }
        if !(1..=1_000_000).contains(&self.queue_capacity) {
            return Err(invalid("queue_capacity", "must be 1 to 1000000"));
        }
        if self.cache_capacity_bytes < 1024 * 1024 {
            return Err(invalid("cache_capacity_bytes", "must be at least 1 MiB"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let file: FileConfig =
            toml::from_str("listen = \"0.0.0.0:9000\"\ndata_dir = \"/srv/a\"\nqueue_capacity = 10")
                .unwrap();
        let overrides = Overrides {
            data_dir: Some("/srv/b".into()),
            ..Overrides::default()
        };
        let config = ServeConfig::resolve(file, overrides).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/srv/b"));
        assert_eq!(config.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(config.queue_capacity, 10);
        assert_eq!(config.max_payload_bytes, 1024 * 1024);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(toml::from_str::<FileConfig>("listen_addr = \"x\"").is_err());
        let file: FileConfig = toml::from_str("queue_capacity = 0").unwrap();
        assert!(ServeConfig::resolve(file, Overrides::default()).is_err());
    }
}
