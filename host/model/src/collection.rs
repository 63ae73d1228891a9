//! Vector collections: a named set of vectors with one dimension and metric, stored in a
//! number of shards; what a shard worker announces about the shard it holds; and the layout a
//! split policy is given (which shards exist, which have a live worker).

use super::spec::{ValidationError, field};
use super::vector::{MAX_DIMENSIONS, Metric};
use serde::{Deserialize, Serialize};

/// The collection a query searches when it names none, and that a shard worker holds when
/// started without `--collection`: payloads written before collections existed keep working.
pub const DEFAULT_COLLECTION: &str = "default";
/// The most shards a collection may have: a split covers each with one child, and a split
/// into more children than this costs more to schedule than to run.
pub const MAX_COLLECTION_SHARDS: u32 = 1_024;
/// The most collections a server keeps, declared and announced together.
pub const MAX_COLLECTIONS: usize = 1_000;
const MAX_COLLECTION_NAME_BYTES: usize = 64;

/// Checks a collection's name: 1 to 64 bytes of `A-Z a-z 0-9 . _ -` (it is a path segment).
pub fn check_collection_name(name: &str) -> Result<(), ValidationError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if name.is_empty() || name.len() > MAX_COLLECTION_NAME_BYTES || !name.bytes().all(allowed) {
        return Err(field(
            "collection",
            format!(
                "`{name}` is not a collection name: 1 to {MAX_COLLECTION_NAME_BYTES} bytes of \
                 A-Z a-z 0-9 . _ -"
            ),
        ));
    }
    Ok(())
}

fn check_shape(dim: u32, shards: u32) -> Result<(), ValidationError> {
    if dim == 0 || dim as usize > MAX_DIMENSIONS {
        return Err(field("dim", format!("must be 1 to {MAX_DIMENSIONS}")));
    }
    if shards == 0 || shards > MAX_COLLECTION_SHARDS {
        return Err(field(
            "shards",
            format!("must be 1 to {MAX_COLLECTION_SHARDS}"),
        ));
    }
    Ok(())
}

/// A collection as an admin declares it (`PUT /v1/collections/{name}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Collection {
    pub name: String,
    /// Numbers in each vector.
    pub dim: u32,
    /// How its distances are measured; a query that names another metric is refused.
    pub metric: Metric,
    /// Shards numbered 0 to `shards - 1`, each held by `sluice worker --shard I/N`.
    pub shards: u32,
}

impl Collection {
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_collection_name(&self.name)?;
        check_shape(self.dim, self.shards)
    }
}

/// What a vector shard worker says in its heartbeat about the data it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ShardAnnouncement {
    pub collection: String,
    /// The shard it holds, 0 to `shards - 1`.
    pub shard: u32,
    /// The shards the collection has, as the worker was told (`--shard I/N`: N); 1 for a
    /// worker holding the whole set.
    pub shards: u32,
    pub dim: u32,
    /// Vectors it holds.
    #[serde(default)]
    pub vectors: u64,
}

impl ShardAnnouncement {
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_collection_name(&self.collection)?;
        check_shape(self.dim, self.shards)?;
        if self.shard >= self.shards {
            return Err(field(
                "vectors.shard",
                format!("shard {} of {} does not exist", self.shard, self.shards),
            ));
        }
        Ok(())
    }

    /// Why this announcement cannot be part of a collection shaped `dim` × `shards` (as
    /// declared, or as its other live workers announce it), if it cannot.
    pub fn disagreement(&self, dim: u32, shards: u32, by: &str) -> Option<String> {
        let name = &self.collection;
        if self.shards != shards {
            return Some(format!(
                "this worker holds shard {}/{} of collection `{name}`, which has {shards} shards \
                 ({by}); start it with --shard I/{shards}",
                self.shard, self.shards
            ));
        }
        if self.dim != dim {
            return Some(format!(
                "this worker's vectors have {} dimensions; collection `{name}` has {dim} ({by})",
                self.dim
            ));
        }
        None
    }
}

/// A collection's layout as a split sees it, taken when the query is split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub collection: String,
    pub dim: u32,
    pub metric: Metric,
    pub shards: u32,
    /// The shards a live worker holds now, ascending.
    pub live: Vec<u32>,
    /// Whether an admin declared it (else it is known from its workers' heartbeats alone).
    pub declared: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn announcement(shard: u32, shards: u32, dim: u32) -> ShardAnnouncement {
        ShardAnnouncement {
            collection: "docs".into(),
            shard,
            shards,
            dim,
            vectors: 10,
        }
    }

    #[test]
    fn names_shapes_and_disagreements_are_checked() {
        assert!(check_collection_name("docs-v2.1_a").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_collection_name(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(announcement(5, 4, 8).validate().is_err());
        assert!(announcement(0, 0, 8).validate().is_err());
        assert!(announcement(0, 4, 0).validate().is_err());
        assert!(announcement(3, 4, 8).validate().is_ok());
        let wrong_count = announcement(5, 8, 64)
            .disagreement(64, 4, "declared")
            .unwrap();
        assert!(wrong_count.contains("shard 5/8") && wrong_count.contains("4 shards"));
        let wrong_dim = announcement(1, 4, 32)
            .disagreement(64, 4, "declared")
            .unwrap();
        assert!(wrong_dim.contains("32 dimensions") && wrong_dim.contains("has 64"));
        assert_eq!(announcement(1, 4, 64).disagreement(64, 4, "declared"), None);
        let declared = Collection {
            name: "docs".into(),
            dim: 64,
            metric: Metric::Ip,
            shards: 2_000,
        };
        assert!(declared.validate().is_err());
    }
}
