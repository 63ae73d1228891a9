//! The concurrency limits a server enforces: the configuration's, overridden key by key by
//! those set through the API. The API's are kept in the catalog, so they survive a restart
//! and reach a replica that takes the lead; the engine is told the whole set on each change.

use arc_swap::ArcSwap;
use serde::Serialize;
use sluice_model::{ConcurrencyLimit, ConcurrencyLimits, MAX_CONCURRENCY_LIMITS};
use sluice_store::{PolicyCatalog, StoreError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Where a limit in force comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LimitSource {
    Config,
    Api,
}

/// A limit in force, as `GET /v1/concurrency-limits` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct LimitInForce {
    pub key: String,
    pub limit: u32,
    pub source: LimitSource,
}

#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("at most {MAX_CONCURRENCY_LIMITS} concurrency limits may be set")]
    TooMany,
}

pub struct LimitTable {
    catalog: Arc<dyn PolicyCatalog>,
    configured: BTreeMap<String, u32>,
    /// The API's limits by key, as stored; held across a change, so changes go one at a time.
    set_by_api: Mutex<BTreeMap<String, u32>>,
    /// What is in force, for readers that must not wait: as the engine reads it, and as shown.
    in_force: ArcSwap<ConcurrencyLimits>,
    shown: ArcSwap<Vec<LimitInForce>>,
}

impl LimitTable {
    pub fn open(
        catalog: Arc<dyn PolicyCatalog>,
        configured: &[ConcurrencyLimit],
    ) -> Result<LimitTable, StoreError> {
        let set_by_api: BTreeMap<String, u32> = catalog
            .concurrency_limits()?
            .into_iter()
            .map(|l| (l.key, l.limit))
            .collect();
        let table = LimitTable {
            catalog,
            configured: configured
                .iter()
                .map(|l| (l.key.clone(), l.limit))
                .collect(),
            set_by_api: Mutex::new(BTreeMap::new()),
            in_force: ArcSwap::from_pointee(ConcurrencyLimits::default()),
            shown: ArcSwap::from_pointee(Vec::new()),
        };
        table.install(&set_by_api);
        *table.set_by_api.lock().unwrap_or_else(|p| p.into_inner()) = set_by_api;
        Ok(table)
    }

    /// The configuration's limits with the API's over them, key by key.
    fn merged(&self, set_by_api: &BTreeMap<String, u32>) -> Vec<LimitInForce> {
        let mut merged: BTreeMap<&str, LimitInForce> = BTreeMap::new();
        for (source, limits) in [
            (LimitSource::Config, &self.configured),
            (LimitSource::Api, set_by_api),
        ] {
            for (key, &limit) in limits {
                merged.insert(
                    key,
                    LimitInForce {
                        key: key.clone(),
                        limit,
                        source,
                    },
                );
            }
        }
        merged.into_values().collect()
    }

    fn install(&self, set_by_api: &BTreeMap<String, u32>) {
        let shown = self.merged(set_by_api);
        let limits: Vec<ConcurrencyLimit> = shown
            .iter()
            .map(|l| ConcurrencyLimit {
                key: l.key.clone(),
                limit: l.limit,
            })
            .collect();
        self.in_force
            .store(Arc::new(ConcurrencyLimits::new(&limits)));
        self.shown.store(Arc::new(shown));
    }

    /// Every limit in force, by key, with where it comes from.
    pub fn view(&self) -> Arc<Vec<LimitInForce>> {
        self.shown.load_full()
    }

    /// The whole set in force, for the engine.
    pub fn in_force(&self) -> Vec<ConcurrencyLimit> {
        self.in_force.load().list()
    }

    /// The limits in force, read without waiting.
    pub fn limits(&self) -> Arc<ConcurrencyLimits> {
        self.in_force.load_full()
    }

    /// Sets `key`'s limit (durably) and returns the set now in force. Blocking.
    pub fn set(&self, key: &str, limit: u32) -> Result<Vec<ConcurrencyLimit>, LimitError> {
        let mut set_by_api = self.set_by_api.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed = set_by_api.clone();
        changed.insert(key.to_owned(), limit);
        if changed.len() > MAX_CONCURRENCY_LIMITS {
            return Err(LimitError::TooMany);
        }
        self.store(&changed)?;
        *set_by_api = changed;
        Ok(self.in_force())
    }

    /// Removes the API's limit on `key` (the configuration's, if any, is in force again):
    /// `None` when the API had set none. Blocking.
    pub fn remove(&self, key: &str) -> Result<Option<Vec<ConcurrencyLimit>>, LimitError> {
        let mut set_by_api = self.set_by_api.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed = set_by_api.clone();
        if changed.remove(key).is_none() {
            return Ok(None);
        }
        self.store(&changed)?;
        *set_by_api = changed;
        Ok(Some(self.in_force()))
    }

    /// Writes the API's limits to the catalog, then puts them in force.
    fn store(&self, set_by_api: &BTreeMap<String, u32>) -> Result<(), StoreError> {
        let stored: Vec<ConcurrencyLimit> = set_by_api
            .iter()
            .map(|(key, &limit)| ConcurrencyLimit {
                key: key.clone(),
                limit,
            })
            .collect();
        self.catalog.put_concurrency_limits(&stored)?;
        self.install(set_by_api);
        Ok(())
    }
}
