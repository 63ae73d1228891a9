//! Format 4: format 3's record, then postcard of `BatchV4` — the key a task shares with the
//! others of its GPU batch (`resources.batch_key`).
//!
//! A format-3 record is a format-4 record without this part: it is read as it is (no batch
//! key) and never rewritten.

use super::{corrupt, v3, whole};
use crate::StoreError;
use serde::{Deserialize, Serialize};
use sluice_model::Task;
use std::borrow::Cow;

#[derive(Serialize, Deserialize, Default)]
struct BatchV4<'a> {
    batch_key: Option<Cow<'a, str>>,
}

/// `[4][TaskV2][SearchV3][BatchV4]`.
pub(super) fn encode(task: &Task) -> Result<Vec<u8>, StoreError> {
    let out = v3::encode(task, super::FORMAT_VERSION)?;
    let batch = BatchV4 {
        batch_key: task.resources.batch_key.as_deref().map(Cow::Borrowed),
    };
    postcard::to_extend(&batch, out).map_err(|e| corrupt(format!("format 4: {e}")))
}

/// Reads a record of format 4, after its format byte.
pub(super) fn decode(bytes: &[u8]) -> Result<Task, StoreError> {
    let (mut task, rest) = v3::decode(bytes, true)?;
    let (batch, rest): (BatchV4<'_>, _) =
        postcard::take_from_bytes(rest).map_err(|e| corrupt(format!("format 4: {e}")))?;
    task.resources.batch_key = batch.batch_key.map(Cow::into_owned);
    whole((task, rest))
}
