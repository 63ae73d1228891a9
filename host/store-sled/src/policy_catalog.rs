//! The policy catalog in sled: a tree of its own, each mutation one atomic batch followed by
//! the store's `sync`, so an acknowledged upload or activation survives a crash.
//!
//! Keys: `m`+sha256 → component bytes; `v`+kind+version → version record; `a`+kind → the
//! activation stack; `e`+kind+seq → policy event; `c`+cache key → compiled code; `d`+kind+
//! version+name → a version's data blob; `x`+id → an experiment's record; `l` → the
//! concurrency limits set through the API, as one JSON list.

use super::SledStore;
use super::util::corrupt;
use crate::sled_error;
use sluice_model::{
    Collection, ConcurrencyLimit, Experiment, PolicyEvent, PolicyKind, PolicyVersion,
};
use sluice_store::{PolicyCatalog, StoreError};

fn module_key(sha256: &str) -> Vec<u8> {
    [b"m".as_slice(), sha256.as_bytes()].concat()
}

fn version_key(kind: PolicyKind, version: u32) -> Vec<u8> {
    [&[b'v', kind.code()][..], &version.to_be_bytes()].concat()
}

fn stack_key(kind: PolicyKind) -> [u8; 2] {
    [b'a', kind.code()]
}

fn event_key(kind: PolicyKind, seq: u64) -> Vec<u8> {
    [&[b'e', kind.code()][..], &seq.to_be_bytes()].concat()
}

fn data_prefix(kind: PolicyKind, version: u32) -> Vec<u8> {
    [&[b'd', kind.code()][..], &version.to_be_bytes()].concat()
}

fn compiled_key(cache_key: &str) -> Vec<u8> {
    [b"c".as_slice(), cache_key.as_bytes()].concat()
}

fn experiment_key(id: u32) -> Vec<u8> {
    [b"x".as_slice(), &id.to_be_bytes()].concat()
}

const LIMITS_KEY: &[u8] = b"l";
const COLLECTIONS_KEY: &[u8] = b"v";

fn json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| corrupt("policy record", e))
}

impl SledStore {
    /// The next policy event number: one past the newest event of any kind.
    fn next_policy_seq(&self) -> Result<u64, StoreError> {
        let mut last = 0;
        for kind in PolicyKind::ALL {
            if let Some(entry) = self.policies.scan_prefix([b'e', kind.code()]).next_back() {
                let (key, _) = entry.map_err(sled_error)?;
                let seq = key
                    .get(2..10)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| corrupt("policy log", "short key"))?;
                last = last.max(seq);
            }
        }
        Ok(last + 1)
    }
}

impl PolicyCatalog for SledStore {
    fn versions(&self, kind: PolicyKind) -> Result<Vec<PolicyVersion>, StoreError> {
        self.policies
            .scan_prefix([b'v', kind.code()])
            .map(|entry| {
                let (_, bytes) = entry.map_err(sled_error)?;
                serde_json::from_slice(&bytes).map_err(|e| corrupt("policy version", e))
            })
            .collect()
    }

    fn module(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .policies
            .get(module_key(sha256))
            .map_err(sled_error)?
            .map(|b| b.to_vec()))
    }

    fn add_version(
        &self,
        version: &PolicyVersion,
        module: &[u8],
        mut event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        // sled writes in place here: it must not meet a full disk (see `space`).
        self.shared.space.check(module.len() as u64)?;
        event.seq = self.next_policy_seq()?;
        let mut batch = sled::Batch::default();
        if !self
            .policies
            .contains_key(module_key(&version.sha256))
            .map_err(sled_error)?
        {
            batch.insert(module_key(&version.sha256), module);
        }
        batch.insert(version_key(version.kind, version.version), json(version)?);
        batch.insert(event_key(event.kind, event.seq), json(&event)?);
        self.policies.apply_batch(batch).map_err(sled_error)?;
        self.sync_sled()?;
        Ok(event)
    }

    fn stack(&self, kind: PolicyKind) -> Result<Vec<u32>, StoreError> {
        match self.policies.get(stack_key(kind)).map_err(sled_error)? {
            Some(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| corrupt("policy activations", e))
            }
            None => Ok(Vec::new()),
        }
    }

    fn set_stack(
        &self,
        kind: PolicyKind,
        stack: &[u32],
        mut event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        self.shared.space.check(0)?;
        event.seq = self.next_policy_seq()?;
        let mut batch = sled::Batch::default();
        batch.insert(&stack_key(kind)[..], json(&stack)?);
        batch.insert(event_key(kind, event.seq), json(&event)?);
        self.policies.apply_batch(batch).map_err(sled_error)?;
        self.sync_sled()?;
        Ok(event)
    }

    fn events(&self, kind: PolicyKind, limit: usize) -> Result<Vec<PolicyEvent>, StoreError> {
        let mut events = self
            .policies
            .scan_prefix([b'e', kind.code()])
            .rev()
            .take(limit)
            .map(|entry| {
                let (_, bytes) = entry.map_err(sled_error)?;
                serde_json::from_slice(&bytes).map_err(|e| corrupt("policy log", e))
            })
            .collect::<Result<Vec<PolicyEvent>, StoreError>>()?;
        events.reverse();
        Ok(events)
    }

    fn put_data(
        &self,
        version: &PolicyVersion,
        name: &str,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        self.shared.space.check(bytes.len() as u64)?;
        let mut batch = sled::Batch::default();
        let key = [
            data_prefix(version.kind, version.version),
            name.as_bytes().to_vec(),
        ]
        .concat();
        batch.insert(key, bytes);
        batch.insert(version_key(version.kind, version.version), json(version)?);
        self.policies.apply_batch(batch).map_err(sled_error)?;
        self.sync_sled()?;
        Ok(())
    }

    fn data(&self, kind: PolicyKind, version: u32) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let prefix = data_prefix(kind, version);
        self.policies
            .scan_prefix(&prefix)
            .map(|entry| {
                let (key, bytes) = entry.map_err(sled_error)?;
                let name = String::from_utf8(key[prefix.len()..].to_vec())
                    .map_err(|e| corrupt("policy data name", e))?;
                Ok((name, bytes.to_vec()))
            })
            .collect()
    }

    fn compiled(&self, cache_key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self
            .policies
            .get(compiled_key(cache_key))
            .map_err(sled_error)?
            .map(|b| b.to_vec()))
    }

    fn put_compiled(&self, cache_key: &str, code: &[u8]) -> Result<(), StoreError> {
        self.shared.space.check(code.len() as u64)?;
        self.policies
            .insert(compiled_key(cache_key), code)
            .map_err(sled_error)?;
        Ok(())
    }

    fn experiments(&self) -> Result<Vec<Experiment>, StoreError> {
        self.policies
            .scan_prefix(b"x")
            .map(|entry| {
                let (_, bytes) = entry.map_err(sled_error)?;
                serde_json::from_slice(&bytes).map_err(|e| corrupt("experiment", e))
            })
            .collect()
    }

    fn put_experiment(
        &self,
        experiment: &Experiment,
        mut event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        self.shared.space.check(0)?;
        event.seq = self.next_policy_seq()?;
        let mut batch = sled::Batch::default();
        batch.insert(experiment_key(experiment.id), json(experiment)?);
        batch.insert(event_key(event.kind, event.seq), json(&event)?);
        self.policies.apply_batch(batch).map_err(sled_error)?;
        self.sync_sled()?;
        Ok(event)
    }

    fn concurrency_limits(&self) -> Result<Vec<ConcurrencyLimit>, StoreError> {
        match self.policies.get(LIMITS_KEY).map_err(sled_error)? {
            Some(bytes) => {
                serde_json::from_slice(&bytes).map_err(|e| corrupt("concurrency limits", e))
            }
            None => Ok(Vec::new()),
        }
    }

    fn put_concurrency_limits(&self, limits: &[ConcurrencyLimit]) -> Result<(), StoreError> {
        self.shared.space.check(0)?;
        self.policies
            .insert(LIMITS_KEY, json(&limits)?)
            .map_err(sled_error)?;
        self.sync_sled()
    }

    fn collections(&self) -> Result<Vec<Collection>, StoreError> {
        match self.policies.get(COLLECTIONS_KEY).map_err(sled_error)? {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| corrupt("collections", e)),
            None => Ok(Vec::new()),
        }
    }

    fn put_collections(&self, collections: &[Collection]) -> Result<(), StoreError> {
        self.shared.space.check(0)?;
        self.policies
            .insert(COLLECTIONS_KEY, json(&collections)?)
            .map_err(sled_error)?;
        self.sync_sled()
    }
}

#[cfg(any(test, feature = "test-support"))]
impl SledStore {
    /// The keys of the compiled-code cache.
    pub fn policies_compiled_keys(&self) -> Vec<String> {
        self.policies
            .scan_prefix(b"c")
            .keys()
            .filter_map(|key| key.ok())
            .map(|key| String::from_utf8_lossy(&key[1..]).into_owned())
            .collect()
    }
}
