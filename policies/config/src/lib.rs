//! A policy's init config: UTF-8 `name=value` lines (blank lines and `#` comments allowed).
//! Each policy names the settings it knows; any other name is an error, so a typo fails
//! `init` instead of silently running with a default.

use std::collections::BTreeMap;

pub struct Config {
    values: BTreeMap<String, String>,
}

impl Config {
    /// Parses `bytes`, refusing names outside `known`.
    pub fn parse(bytes: &[u8], known: &[&str]) -> Result<Config, String> {
        let text = std::str::from_utf8(bytes).map_err(|_| "config is not UTF-8".to_string())?;
        let mut values = BTreeMap::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {}: expected name=value", number + 1))?;
            let name = name.trim();
            if !known.contains(&name) {
                return Err(format!(
                    "unknown setting `{name}`; known: {}",
                    known.join(", ")
                ));
            }
            values.insert(name.to_string(), value.trim().to_string());
        }
        Ok(Config { values })
    }

    pub fn u64_or(&self, name: &str, default: u64) -> Result<u64, String> {
        self.parsed_or(name, default)
    }

    pub fn u32_or(&self, name: &str, default: u32) -> Result<u32, String> {
        self.parsed_or(name, default)
    }

    pub fn f64_or(&self, name: &str, default: f64) -> Result<f64, String> {
        let value: f64 = self.parsed_or(name, default)?;
        if value.is_finite() {
            Ok(value)
        } else {
            Err(format!("`{name}` must be a finite number"))
        }
    }

    /// A comma-separated list, e.g. `weights=60,35,5`.
    pub fn list_or<T: std::str::FromStr + Clone>(
        &self,
        name: &str,
        default: &[T],
    ) -> Result<Vec<T>, String> {
        match self.values.get(name) {
            None => Ok(default.to_vec()),
            Some(text) => text
                .split(',')
                .map(|item| {
                    item.trim()
                        .parse()
                        .map_err(|_| format!("`{name}`: bad item `{item}`"))
                })
                .collect(),
        }
    }

    fn parsed_or<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.values.get(name) {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|_| format!("`{name}`: bad value `{text}`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_known_names_and_refuses_the_rest() {
        let config = Config::parse(
            b"# comment\n\ndelay_ms = 100\nweights=1, 2,3\n",
            &["delay_ms", "weights", "x"],
        )
        .unwrap();
        assert_eq!(config.u64_or("delay_ms", 5).unwrap(), 100);
        assert_eq!(config.u64_or("x", 5).unwrap(), 5);
        assert_eq!(config.list_or::<u32>("weights", &[]).unwrap(), [1, 2, 3]);
        assert!(Config::parse(b"delay=1", &["delay_ms"]).is_err());
        assert!(Config::parse(b"no equals sign", &["delay_ms"]).is_err());
        assert!(Config::parse(&[0xff], &[]).is_err());
        let bad = Config::parse(b"delay_ms=soon", &["delay_ms"]).unwrap();
        assert!(bad.u64_or("delay_ms", 1).is_err());
        let nan = Config::parse(b"f=NaN", &["f"]).unwrap();
        assert!(nan.f64_or("f", 1.0).is_err());
    }
}
