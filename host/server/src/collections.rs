//! The vector collections declared through the API (`PUT /v1/collections/{name}`), kept in the
//! catalog so that they survive a restart and reach a replica that takes the lead. The engine
//! is told the whole set on each change; the layout it shows joins these to what shard
//! workers announce in their heartbeats.

use sluice_model::{Collection, MAX_COLLECTIONS};
use sluice_store::{PolicyCatalog, StoreError};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum CollectionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("at most {MAX_COLLECTIONS} collections may be declared")]
    TooMany,
}

pub struct CollectionTable {
    catalog: Arc<dyn PolicyCatalog>,
    /// As stored, by name; held across a change, so changes go one at a time.
    declared: Mutex<BTreeMap<String, Collection>>,
}

impl CollectionTable {
    pub fn open(catalog: Arc<dyn PolicyCatalog>) -> Result<CollectionTable, StoreError> {
        let declared = catalog
            .collections()?
            .into_iter()
            .map(|c| (c.name.clone(), c))
            .collect();
        Ok(CollectionTable {
            catalog,
            declared: Mutex::new(declared),
        })
    }

    /// Every declared collection, by name.
    pub fn all(&self) -> Vec<Collection> {
        let declared = self.declared.lock().unwrap_or_else(|p| p.into_inner());
        declared.values().cloned().collect()
    }

    /// Declares (or redeclares) `collection` durably; the whole set now. Blocking.
    pub fn put(&self, collection: Collection) -> Result<Vec<Collection>, CollectionError> {
        self.change(|declared| {
            declared.insert(collection.name.clone(), collection);
            true
        })
        .map(|changed| changed.unwrap_or_default())
    }

    /// Forgets the declaration of `name`: `None` when there was none. Blocking.
    pub fn remove(&self, name: &str) -> Result<Option<Vec<Collection>>, CollectionError> {
        self.change(|declared| declared.remove(name).is_some())
    }

    fn change(
        &self,
        edit: impl FnOnce(&mut BTreeMap<String, Collection>) -> bool,
    ) -> Result<Option<Vec<Collection>>, CollectionError> {
        let mut declared = self.declared.lock().unwrap_or_else(|p| p.into_inner());
        let mut changed = declared.clone();
        if !edit(&mut changed) {
            return Ok(None);
        }
        if changed.len() > MAX_COLLECTIONS {
            return Err(CollectionError::TooMany);
        }
        let all: Vec<Collection> = changed.values().cloned().collect();
        self.catalog.put_collections(&all)?;
        *declared = changed;
        Ok(Some(all))
    }
}
