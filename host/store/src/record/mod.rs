//! The bytes of a stored task: a versioned, compact encoding of `sluice_model::Task` that both
//! backends write, apart from the API's JSON (`sluice_wire::TaskView`), so that renaming an API
//! field is not a data migration and a state change does not re-encode ~620 bytes of JSON.
//!
//! Every record starts with its format's byte:
//! - `FORMAT_VERSION` (4): format 3, then postcard of `v4::BatchV4` (a task's GPU batch key).
//!   Postcard has no field names and no defaults, so a change to a stored struct is a new
//!   format: add one, keep the old for reading, and bump `FORMAT_VERSION`.
//! - 3: format 2's body, then postcard of `v3::SearchV3` (a split search's collection and the
//!   shard of each child). Read as it is (no batch key).
//! - 2: postcard (varint integers, length-prefixed strings) of `v2::TaskV2`, fields in
//!   declaration order. Read as it is: format 3 only adds to it, so nothing is rewritten.
//! - `{` (format 1): the JSON that Sluice wrote before format 2, which was also the API's shape.
//!   It is read (`v1`) so that a data directory written then opens; it is never written.
//!
//! Records are decoded with every bound a stored value could break checked (a state code, a
//! priority index, an experiment's kind): a bad record is `StoreError::Corrupt`, never a panic.

pub mod event;
mod v1;
mod v2;
mod v3;
mod v4;

use crate::StoreError;
use sluice_model::Task;

/// The format this release writes, first byte of every task record.
pub const FORMAT_VERSION: u8 = 4;

/// A format-4 record without its batch part.
const FORMAT_3: u8 = 3;

/// A format-3 record without its search part.
const FORMAT_2: u8 = 2;

/// The format of a JSON record, as `format_of` names it: the only one a data directory's
/// migration rewrites.
pub const LEGACY_JSON_FORMAT: u8 = 1;

/// The first byte of a format-1 (JSON) record.
const LEGACY_JSON_FIRST_BYTE: u8 = b'{';

/// The record of `task`, in the current format.
pub fn encode(task: &Task) -> Result<Vec<u8>, StoreError> {
    v4::encode(task)
}

/// The task a record holds, in whichever format it was written.
pub fn decode(bytes: &[u8]) -> Result<Task, StoreError> {
    match bytes.first() {
        Some(&FORMAT_VERSION) => v4::decode(&bytes[1..]),
        Some(&FORMAT_3) => whole(v3::decode(&bytes[1..], true)?),
        Some(&FORMAT_2) => whole(v3::decode(&bytes[1..], false)?),
        Some(&LEGACY_JSON_FIRST_BYTE) => v1::decode(bytes),
        Some(other) => Err(corrupt(format!(
            "record format {other} is not one this release reads (it writes {FORMAT_VERSION}); \
             was the data written by a newer Sluice?"
        ))),
        None => Err(corrupt("empty record".to_owned())),
    }
}

/// The format a record was written in: `FORMAT_VERSION`, 1 for legacy JSON, or the unknown byte.
pub fn format_of(bytes: &[u8]) -> Option<u8> {
    match bytes.first() {
        Some(&LEGACY_JSON_FIRST_BYTE) => Some(LEGACY_JSON_FORMAT),
        other => other.copied(),
    }
}

/// The task of a record that must end where its last part ends.
fn whole((task, rest): (Task, &[u8])) -> Result<Task, StoreError> {
    if rest.is_empty() {
        Ok(task)
    } else {
        Err(corrupt(format!("{} bytes after the record", rest.len())))
    }
}

fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt {
        what: "task",
        detail,
    }
}

#[cfg(test)]
mod tests;
