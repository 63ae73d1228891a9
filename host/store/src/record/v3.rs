//! Format 3: format 2's `TaskV2`, then postcard of `SearchV3` — what a split search was over
//! (its collection, metric and shard count) and the shard each child searches, by which its
//! coverage is measured against the collection rather than against the children.
//!
//! A format-2 record is a format-3 record without this part: it is read as it is (a family
//! split then has no scope) and never rewritten.

use super::{corrupt, v2};
use crate::StoreError;
use serde::{Deserialize, Serialize};
use sluice_model::{Metric, SearchScope, Task};
use std::borrow::Cow;

#[derive(Serialize, Deserialize, Default)]
struct SearchV3<'a> {
    /// (collection, metric code, shards).
    scope: Option<(Cow<'a, str>, u8, u32)>,
    /// One per family part, in order; empty when no part searches a stored shard.
    part_shards: Vec<Option<u32>>,
}

fn metric_code(metric: Metric) -> u8 {
    match metric {
        Metric::L2 => 0,
        Metric::Ip => 1,
    }
}

fn metric_of(code: u8) -> Result<Metric, StoreError> {
    match code {
        0 => Ok(Metric::L2),
        1 => Ok(Metric::Ip),
        other => Err(corrupt(format!("format 3: unknown metric code {other}"))),
    }
}

/// `[format][TaskV2][SearchV3]`: format 3's whole record, or format 4's first part.
pub(super) fn encode(task: &Task, format: u8) -> Result<Vec<u8>, StoreError> {
    let out = v2::encode_body(task, format)?;
    let search = match &task.family {
        Some(family) => SearchV3 {
            scope: family.scope.as_ref().map(|s| {
                (
                    Cow::Borrowed(s.collection.as_str()),
                    metric_code(s.metric),
                    s.shards,
                )
            }),
            part_shards: if family.parts.iter().any(|p| p.shard.is_some()) {
                family.parts.iter().map(|p| p.shard).collect()
            } else {
                Vec::new()
            },
        },
        None => SearchV3::default(),
    };
    postcard::to_extend(&search, out).map_err(|e| corrupt(format!("format 3: {e}")))
}

/// Reads a record of format 2 (`with_search` false) or 3, after its format byte; answers the
/// bytes after it (format 4's part), which a record of format 2 or 3 must not have.
pub(super) fn decode(bytes: &[u8], with_search: bool) -> Result<(Task, &[u8]), StoreError> {
    let (mut task, rest) = v2::decode_body(bytes)?;
    let rest = if with_search {
        let (search, rest): (SearchV3<'_>, _) =
            postcard::take_from_bytes(rest).map_err(|e| corrupt(format!("format 3: {e}")))?;
        apply(&mut task, search)?;
        rest
    } else {
        rest
    };
    Ok((task, rest))
}

fn apply(task: &mut Task, search: SearchV3<'_>) -> Result<(), StoreError> {
    let Some(family) = &mut task.family else {
        if search.scope.is_some() || !search.part_shards.is_empty() {
            return Err(corrupt("format 3: a search scope without a family".into()));
        }
        return Ok(());
    };
    if let Some((collection, metric, shards)) = search.scope {
        family.scope = Some(SearchScope {
            collection: collection.into_owned(),
            metric: metric_of(metric)?,
            shards,
        });
    }
    if !search.part_shards.is_empty() {
        if search.part_shards.len() != family.parts.len() {
            return Err(corrupt(format!(
                "format 3: {} part shards for {} parts",
                search.part_shards.len(),
                family.parts.len()
            )));
        }
        for (part, shard) in family.parts.iter_mut().zip(search.part_shards) {
            part.shard = shard;
        }
    }
    Ok(())
}
