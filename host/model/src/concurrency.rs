//! Concurrency limits: at most N leased tasks at once per concurrency key, set per key
//! (`scanner-7`) or per key prefix (`scanner-*`), from the configuration and the admin API.

use super::spec::{ValidationError, check_name, field};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The largest limit a key may have.
pub const MAX_CONCURRENCY_LIMIT: u32 = 1_000_000;
/// Limits set at once, at most.
pub const MAX_CONCURRENCY_LIMITS: usize = 10_000;

/// One limit as it is set and shown: `key` is a concurrency key, or a prefix of keys ending in
/// `*`; `limit` leased tasks at most (0 holds every task of the key until it is raised).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConcurrencyLimit {
    pub key: String,
    pub limit: u32,
}

/// Checks a limit's key (a concurrency key, or one followed by `*`) and its value.
pub fn check_concurrency_limit(key: &str, limit: u32) -> Result<(), ValidationError> {
    let name = key.strip_suffix('*').unwrap_or(key);
    if !(name.is_empty() && key == "*") {
        check_name("key", name)?;
    }
    if limit > MAX_CONCURRENCY_LIMIT {
        return Err(field(
            "limit",
            format!("must be 0 to {MAX_CONCURRENCY_LIMIT}"),
        ));
    }
    Ok(())
}

/// The limits in force: exact keys first, then the longest matching prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConcurrencyLimits {
    exact: BTreeMap<String, u32>,
    /// (prefix, limit), longest prefix first.
    prefixes: Vec<(String, u32)>,
}

impl ConcurrencyLimits {
    pub fn new<'a>(limits: impl IntoIterator<Item = &'a ConcurrencyLimit>) -> ConcurrencyLimits {
        let mut set = ConcurrencyLimits::default();
        for limit in limits {
            match limit.key.strip_suffix('*') {
                Some(prefix) => {
                    set.prefixes.retain(|(p, _)| p != prefix);
                    set.prefixes.push((prefix.to_owned(), limit.limit));
                }
                None => {
                    set.exact.insert(limit.key.clone(), limit.limit);
                }
            }
        }
        set.prefixes
            .sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        set
    }

    /// The limit on `key`, if any applies.
    pub fn limit(&self, key: &str) -> Option<u32> {
        self.exact.get(key).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(prefix, _)| key.starts_with(prefix.as_str()))
                .map(|&(_, limit)| limit)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// Every limit, by key.
    pub fn list(&self) -> Vec<ConcurrencyLimit> {
        let exact = self.exact.iter().map(|(key, &limit)| ConcurrencyLimit {
            key: key.clone(),
            limit,
        });
        let prefixes = self
            .prefixes
            .iter()
            .map(|(prefix, limit)| ConcurrencyLimit {
                key: format!("{prefix}*"),
                limit: *limit,
            });
        let mut all: Vec<ConcurrencyLimit> = exact.chain(prefixes).collect();
        all.sort_by(|a, b| a.key.cmp(&b.key));
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(key: &str, limit: u32) -> ConcurrencyLimit {
        ConcurrencyLimit {
            key: key.into(),
            limit,
        }
    }

    #[test]
    fn an_exact_key_wins_then_the_longest_prefix() {
        let limits = ConcurrencyLimits::new(&[
            limit("scanner-*", 1),
            limit("scanner-7*", 3),
            limit("scanner-7", 2),
            limit("*", 50),
        ]);
        assert_eq!(limits.limit("scanner-7"), Some(2));
        assert_eq!(limits.limit("scanner-71"), Some(3));
        assert_eq!(limits.limit("scanner-1"), Some(1));
        assert_eq!(limits.limit("model:seg"), Some(50));
        assert_eq!(ConcurrencyLimits::default().limit("x"), None);
        assert_eq!(limits.list().len(), 4);
    }

    #[test]
    fn keys_are_names_or_prefixes_and_limits_bounded() {
        assert!(check_concurrency_limit("model:seg-v3", 2).is_ok());
        assert!(check_concurrency_limit("scanner-*", 0).is_ok());
        assert!(check_concurrency_limit("*", 5).is_ok());
        assert!(check_concurrency_limit("", 1).is_err());
        assert!(check_concurrency_limit("two words", 1).is_err());
        assert!(check_concurrency_limit("a*b", 1).is_err());
        assert!(check_concurrency_limit("k", MAX_CONCURRENCY_LIMIT + 1).is_err());
    }
}
