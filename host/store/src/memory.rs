//! A policy catalog held in memory, for a registry that lives and dies with one run: a
//! simulation's variants, an offline `sluice policy check`. Nothing is written anywhere, so
//! "durable when it returns" holds for the run that holds it and no longer.

use crate::{PolicyCatalog, StoreError};
use sluice_model::{
    Collection, ConcurrencyLimit, Experiment, PolicyEvent, PolicyKind, PolicyVersion,
};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

#[derive(Default)]
struct Catalog {
    modules: BTreeMap<String, Vec<u8>>,
    versions: BTreeMap<(PolicyKind, u32), PolicyVersion>,
    stacks: BTreeMap<PolicyKind, Vec<u32>>,
    /// Every kind's events, oldest first.
    events: Vec<PolicyEvent>,
    data: BTreeMap<(PolicyKind, u32, String), Vec<u8>>,
    compiled: BTreeMap<String, Vec<u8>>,
    experiments: BTreeMap<u32, Experiment>,
    limits: Vec<ConcurrencyLimit>,
    collections: Vec<Collection>,
}

impl Catalog {
    /// Numbers `event` one past the newest of any kind and logs it, as the stores do.
    fn log(&mut self, mut event: PolicyEvent) -> PolicyEvent {
        event.seq = self.events.last().map_or(1, |last| last.seq + 1);
        debug_assert!(self.events.iter().all(|e| e.seq < event.seq));
        self.events.push(event.clone());
        event
    }
}

/// The catalog in memory. Its writes never fail; its size is what the run puts in it (one
/// registry's uploads), so no bound is kept here beyond the registry's own.
#[derive(Default)]
pub struct MemoryCatalog(Mutex<Catalog>);

impl MemoryCatalog {
    pub fn new() -> Self {
        Self::default()
    }

    fn catalog(&self) -> Result<MutexGuard<'_, Catalog>, StoreError> {
        self.0
            .lock()
            .map_err(|_| StoreError::Failed("the in-memory catalog's lock was poisoned".into()))
    }
}

impl PolicyCatalog for MemoryCatalog {
    fn versions(&self, kind: PolicyKind) -> Result<Vec<PolicyVersion>, StoreError> {
        Ok(self
            .catalog()?
            .versions
            .range((kind, 0)..=(kind, u32::MAX))
            .map(|(_, version)| version.clone())
            .collect())
    }

    fn module(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.catalog()?.modules.get(sha256).cloned())
    }

    fn add_version(
        &self,
        version: &PolicyVersion,
        module: &[u8],
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        let mut catalog = self.catalog()?;
        catalog
            .modules
            .entry(version.sha256.clone())
            .or_insert_with(|| module.to_vec());
        catalog
            .versions
            .insert((version.kind, version.version), version.clone());
        Ok(catalog.log(event))
    }

    fn stack(&self, kind: PolicyKind) -> Result<Vec<u32>, StoreError> {
        Ok(self
            .catalog()?
            .stacks
            .get(&kind)
            .cloned()
            .unwrap_or_default())
    }

    fn set_stack(
        &self,
        kind: PolicyKind,
        stack: &[u32],
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        let mut catalog = self.catalog()?;
        catalog.stacks.insert(kind, stack.to_vec());
        Ok(catalog.log(event))
    }

    fn events(&self, kind: PolicyKind, limit: usize) -> Result<Vec<PolicyEvent>, StoreError> {
        let catalog = self.catalog()?;
        let mut events: Vec<PolicyEvent> = catalog
            .events
            .iter()
            .rev()
            .filter(|event| event.kind == kind)
            .take(limit)
            .cloned()
            .collect();
        events.reverse();
        Ok(events)
    }

    fn put_data(
        &self,
        version: &PolicyVersion,
        name: &str,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let mut catalog = self.catalog()?;
        catalog.data.insert(
            (version.kind, version.version, name.to_owned()),
            bytes.to_vec(),
        );
        catalog
            .versions
            .insert((version.kind, version.version), version.clone());
        Ok(())
    }

    fn data(&self, kind: PolicyKind, version: u32) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self
            .catalog()?
            .data
            .iter()
            .filter(|((k, v, _), _)| *k == kind && *v == version)
            .map(|((_, _, name), bytes)| (name.clone(), bytes.clone()))
            .collect())
    }

    fn compiled(&self, cache_key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.catalog()?.compiled.get(cache_key).cloned())
    }

    fn put_compiled(&self, cache_key: &str, code: &[u8]) -> Result<(), StoreError> {
        self.catalog()?
            .compiled
            .insert(cache_key.to_owned(), code.to_vec());
        Ok(())
    }

    fn experiments(&self) -> Result<Vec<Experiment>, StoreError> {
        Ok(self.catalog()?.experiments.values().cloned().collect())
    }

    fn concurrency_limits(&self) -> Result<Vec<ConcurrencyLimit>, StoreError> {
        Ok(self.catalog()?.limits.clone())
    }

    fn put_concurrency_limits(&self, limits: &[ConcurrencyLimit]) -> Result<(), StoreError> {
        self.catalog()?.limits = limits.to_vec();
        Ok(())
    }

    fn collections(&self) -> Result<Vec<Collection>, StoreError> {
        Ok(self.catalog()?.collections.clone())
    }

    fn put_collections(&self, collections: &[Collection]) -> Result<(), StoreError> {
        self.catalog()?.collections = collections.to_vec();
        Ok(())
    }

    fn put_experiment(
        &self,
        experiment: &Experiment,
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        let mut catalog = self.catalog()?;
        catalog
            .experiments
            .insert(experiment.id, experiment.clone());
        Ok(catalog.log(event))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_model::PolicyAction;

    fn version(kind: PolicyKind, version: u32, sha256: &str) -> PolicyVersion {
        PolicyVersion {
            kind,
            version,
            sha256: sha256.into(),
            config: String::new(),
            size_bytes: 3,
            uploaded_at_ms: 0,
            signed_by: None,
            memory_limit_bytes: None,
            call_fuel: None,
            data: Vec::new(),
        }
    }

    fn event(kind: PolicyKind, version: u32) -> PolicyEvent {
        PolicyEvent {
            seq: 0,
            kind,
            action: PolicyAction::Uploaded,
            version,
            from: None,
            at_ms: 0,
            reason: None,
            signed_by: None,
        }
    }

    #[test]
    fn versions_modules_stacks_and_events_read_back_as_written() {
        let catalog = MemoryCatalog::new();
        let uploads = [
            (PolicyKind::Retry, 1, "aa"),
            (PolicyKind::Aging, 1, "bb"),
            (PolicyKind::Retry, 2, "aa"),
        ];
        let mut seqs = Vec::new();
        for (kind, number, sha) in uploads {
            let logged = catalog
                .add_version(
                    &version(kind, number, sha),
                    sha.as_bytes(),
                    event(kind, number),
                )
                .unwrap();
            seqs.push(logged.seq);
        }
        // One sequence across kinds, from 1, as the stores number it.
        assert_eq!(seqs, [1, 2, 3]);
        let retry: Vec<u32> = catalog
            .versions(PolicyKind::Retry)
            .unwrap()
            .iter()
            .map(|v| v.version)
            .collect();
        assert_eq!(retry, [1, 2]);
        assert_eq!(catalog.module("aa").unwrap().as_deref(), Some(&b"aa"[..]));
        assert_eq!(catalog.module("cc").unwrap(), None);

        assert!(catalog.stack(PolicyKind::Retry).unwrap().is_empty());
        let set = catalog
            .set_stack(PolicyKind::Retry, &[1, 2], event(PolicyKind::Retry, 2))
            .unwrap();
        assert_eq!(set.seq, 4);
        assert_eq!(catalog.stack(PolicyKind::Retry).unwrap(), [1, 2]);

        // The newest events of one kind, oldest first, at most `limit`.
        let events = catalog.events(PolicyKind::Retry, 2).unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [3, 4]);
        assert_eq!(catalog.events(PolicyKind::Aging, 10).unwrap().len(), 1);
    }

    #[test]
    fn data_blobs_belong_to_their_version() {
        let catalog = MemoryCatalog::new();
        let first = version(PolicyKind::Split, 1, "aa");
        catalog.put_data(&first, "centroids", b"123").unwrap();
        catalog.put_data(&first, "centroids", b"45").unwrap();
        catalog
            .put_data(&version(PolicyKind::Split, 2, "bb"), "other", b"6")
            .unwrap();
        assert_eq!(
            catalog.data(PolicyKind::Split, 1).unwrap(),
            [("centroids".to_owned(), b"45".to_vec())]
        );
        assert_eq!(catalog.versions(PolicyKind::Split).unwrap().len(), 2);
    }
}
