//! The data directory's format: the version every task record in it is written in, kept under
//! `keys::FORMAT`, and the migration that brings a directory an older release made up to it.
//!
//! A directory without the key is either new (no task) or was made before format 2 (tasks in
//! JSON, format 1). Opening such a directory rewrites each JSON record as format 2 in batches,
//! then writes the key: a crash in between leaves every record readable in one format or the
//! other, and the next open finishes the job. Records of format 2 are read as they are (format
//! 3 only appends to them), so a directory of format 2 changes only its key. A directory of a newer format than this release
//! knows is refused, since its records may mean something this release cannot tell.

use super::keys;
use super::record as value;
use super::util::corrupt;
use crate::sled_error;
use sluice_store::StoreError;
use sluice_store::record::{self, FORMAT_VERSION};
use std::path::Path;

/// Records rewritten per sled batch while migrating: bounds the batch's memory (a record is a
/// few hundred bytes plus its inline payload, at most 8 KiB).
const MIGRATION_BATCH_RECORDS: usize = 4_096;

/// The format the directory is in, after migrating it if it was older; an error for a newer one.
pub fn open(tree: &sled::Tree, dir: &Path) -> Result<Migrated, StoreError> {
    let found = match tree.get(keys::FORMAT).map_err(sled_error)? {
        Some(bytes) => match bytes.as_ref() {
            [version] => Some(*version),
            _ => return Err(corrupt("data directory format", "not one byte")),
        },
        None => None,
    };
    match found {
        Some(FORMAT_VERSION) => Ok(Migrated::default()),
        Some(newer) if newer > FORMAT_VERSION => Err(StoreError::Open {
            path: dir.display().to_string(),
            source: format!(
                "the data directory is in format {newer}, written by a newer Sluice; this \
                 release reads formats 1 to {FORMAT_VERSION}. Run the release that wrote it, \
                 or restore a backup taken before the upgrade"
            )
            .into(),
        }),
        // Format 1 never wrote the key; a key of 0 or 1 is treated the same way.
        _ => {
            let migrated = migrate(tree)?;
            tree.insert(keys::FORMAT, &[FORMAT_VERSION])
                .map_err(sled_error)?;
            tree.flush().map_err(sled_error)?;
            if migrated.records > 0 {
                tracing::info!(
                    records = migrated.records,
                    bytes_before = migrated.bytes_before,
                    bytes_after = migrated.bytes_after,
                    "migrated the data directory's task records to format {FORMAT_VERSION}"
                );
            }
            Ok(migrated)
        }
    }
}

/// What a migration rewrote.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    pub records: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

fn migrate(tree: &sled::Tree) -> Result<Migrated, StoreError> {
    let mut migrated = Migrated::default();
    let mut batch = sled::Batch::default();
    let mut in_batch = 0;
    for item in tree.scan_prefix([keys::TASK]) {
        let (key, bytes) = item.map_err(sled_error)?;
        let parts = value::split(&bytes)?;
        if record::format_of(parts.task) != Some(record::LEGACY_JSON_FORMAT) {
            continue;
        }
        let task = record::decode(parts.task)?;
        let rewritten = value::encode(&record::encode(&task)?, &parts.tail())?;
        migrated.records += 1;
        migrated.bytes_before += bytes.len() as u64;
        migrated.bytes_after += rewritten.len() as u64;
        batch.insert(key, rewritten);
        in_batch += 1;
        if in_batch == MIGRATION_BATCH_RECORDS {
            tree.apply_batch(std::mem::take(&mut batch))
                .map_err(sled_error)?;
            in_batch = 0;
        }
    }
    tree.apply_batch(batch).map_err(sled_error)?;
    Ok(migrated)
}
