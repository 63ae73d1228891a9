//! The `vector.search` payloads: a query as submitted, the query each child of its split runs
//! (with the part of the data it covers), and the hits a child answers. Distances are "lower
//! is nearer": squared L2, or the negated inner product.

use super::spec::{ValidationError, field};
use serde::{Deserialize, Serialize};

pub const MAX_DIMENSIONS: usize = 4_096;
pub const MAX_K: u32 = 1_000;
/// The longest a parent may wait before merging what its children have answered.
pub const MAX_MERGE_DEADLINE_MS: u64 = 24 * 3_600_000;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// Squared Euclidean distance.
    #[default]
    L2,
    /// Inner product, answered as its negation so that lower is nearer.
    Ip,
}

impl Metric {
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::L2 => "l2",
            Metric::Ip => "ip",
        }
    }

    pub fn distance(self, a: &[f32], b: &[f32]) -> f32 {
        match self {
            Metric::L2 => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
            Metric::Ip => -a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>(),
        }
    }
}

fn default_k() -> u32 {
    10
}

fn yes() -> bool {
    true
}

/// The payload of a `vector.search` task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorQuery {
    pub vector: Vec<f32>,
    #[serde(default = "default_k")]
    pub k: u32,
    /// The collection searched; `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collection: Option<String>,
    /// The collection's metric when absent; another metric than a declared collection's is
    /// refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<Metric>,
    /// IVF lists to probe; 0 lets the split policy choose.
    #[serde(default)]
    pub nprobe: u32,
    /// Whether an answer missing some shards may complete (marked `partial`), or must fail.
    #[serde(default = "yes")]
    pub allow_partial: bool,
    /// Merge what has answered this long after submission, without waiting for the rest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_deadline_ms: Option<u64>,
}

impl VectorQuery {
    /// Reads and checks a submitted payload.
    pub fn parse(payload: &serde_json::Value) -> Result<VectorQuery, ValidationError> {
        let query: VectorQuery = serde_json::from_value(payload.clone())
            .map_err(|e| field("payload", format!("not a vector query: {e}")))?;
        if query.vector.is_empty() || query.vector.len() > MAX_DIMENSIONS {
            return Err(field(
                "payload.vector",
                format!("must have 1 to {MAX_DIMENSIONS} numbers"),
            ));
        }
        if query.vector.iter().any(|x| !x.is_finite()) {
            return Err(field("payload.vector", "must hold finite numbers only"));
        }
        if let Some(name) = &query.collection {
            super::collection::check_collection_name(name)
                .map_err(|_| field("payload.collection", "1 to 64 bytes of A-Z a-z 0-9 . _ -"))?;
        }
        if query.k == 0 || query.k > MAX_K {
            return Err(field("payload.k", format!("must be 1 to {MAX_K}")));
        }
        if query
            .merge_deadline_ms
            .is_some_and(|ms| ms == 0 || ms > MAX_MERGE_DEADLINE_MS)
        {
            return Err(field(
                "payload.merge_deadline_ms",
                format!("must be 1 to {MAX_MERGE_DEADLINE_MS}"),
            ));
        }
        Ok(query)
    }

    /// The collection it searches.
    pub fn collection(&self) -> &str {
        self.collection
            .as_deref()
            .unwrap_or(super::collection::DEFAULT_COLLECTION)
    }
}

/// The part of the data one child covers, as its split policy chose.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ShardFilter {
    /// The whole of one stored shard.
    Shard(u32),
    /// Ids in `[low, high)`.
    IdRange(u64, u64),
    /// Ids whose `id_hash` modulo `of` is `bucket`.
    IdHash { bucket: u32, of: u32 },
    /// Vectors whose nearest IVF centroid is one of these lists.
    Centroids(Vec<u32>),
}

impl ShardFilter {
    /// The label value a worker must carry to run a child with this filter, in a collection
    /// of `shards` shards: its shard's number for a stored shard of several, `all` (a worker
    /// holding the whole set) for the only shard and for the other filters.
    pub fn routing(&self, shards: u32) -> String {
        match self {
            ShardFilter::Shard(shard) if shards > 1 => shard.to_string(),
            _ => "all".to_owned(),
        }
    }

    /// A short name for messages: "shard 3", "ids 0..450", "hash 1/4", "lists 5,9".
    pub fn describe(&self) -> String {
        match self {
            ShardFilter::Shard(shard) => format!("shard {shard}"),
            ShardFilter::IdRange(low, high) => format!("ids {low}..{high}"),
            ShardFilter::IdHash { bucket, of } => format!("hash {bucket}/{of}"),
            ShardFilter::Centroids(lists) => {
                let lists: Vec<String> = lists.iter().map(u32::to_string).collect();
                format!("lists {}", lists.join(","))
            }
        }
    }

    /// Whether the filter selects `id` (a centroid filter needs the vector's list instead).
    pub fn selects_id(&self, id: u64) -> bool {
        match self {
            ShardFilter::Shard(_) | ShardFilter::Centroids(_) => true,
            ShardFilter::IdRange(low, high) => (*low..*high).contains(&id),
            ShardFilter::IdHash { bucket, of } => {
                id_hash(id) % u64::from(*of) == u64::from(*bucket)
            }
        }
    }
}

/// The hash an `IdHash` filter buckets ids by (splitmix64's finaliser): workers and tools
/// must agree on it, so it is fixed here.
pub fn id_hash(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The payload of a child of a split `vector.search`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardQuery {
    pub vector: Vec<f32>,
    pub k: u32,
    pub metric: Metric,
    pub filter: ShardFilter,
    /// Its place among its parent's children.
    pub child: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    pub id: u64,
    pub distance: f32,
}

/// What a child answers: its nearest hits, nearest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardAnswer {
    pub hits: Vec<Hit>,
    /// Vectors compared, for the curious.
    #[serde(default)]
    pub scanned: u64,
}

/// A split parent's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergedAnswer {
    pub hits: Vec<Hit>,
    /// The collection searched and its metric (absent in answers merged before collections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collection: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<Metric>,
    /// The share of the data whose answer is in `hits`, 0 to 1: of the collection's shards
    /// for a shard split, of the children otherwise.
    pub coverage: f64,
    pub partial: bool,
    pub children: u32,
    /// What was not searched — shards no child asked for, children that did not answer — and
    /// why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// The merge policy version that merged; absent when the host's own merge did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge_policy_version: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_query_takes_defaults_and_refuses_what_it_cannot_search() {
        let query = VectorQuery::parse(&json!({"vector": [1.0, 2.0]})).unwrap();
        assert_eq!(
            (
                query.k,
                query.metric,
                query.allow_partial,
                query.collection()
            ),
            (10, None, true, "default")
        );
        for bad in [
            json!({"vector": []}),
            json!({"vector": [1.0], "k": 0}),
            json!({"vector": [1.0], "k": 5000}),
            json!({"vector": [1.0], "metric": "cosine"}),
            json!({"vector": [1.0], "merge_deadline_ms": 0}),
            json!({"vector": [1.0], "extra": 1}),
            json!({"vector": [1.0], "collection": "a/b"}),
            json!({"k": 3}),
            json!("text"),
        ] {
            assert!(VectorQuery::parse(&bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn filters_route_describe_and_select() {
        assert_eq!(ShardFilter::Shard(3).routing(4), "3");
        assert_eq!(ShardFilter::Shard(0).routing(1), "all");
        assert_eq!(ShardFilter::IdRange(0, 5).routing(4), "all");
        assert!(ShardFilter::IdRange(2, 5).selects_id(2));
        assert!(!ShardFilter::IdRange(2, 5).selects_id(5));
        let of = 4;
        let buckets: Vec<u32> = (0..of)
            .map(|bucket| {
                (0..1000)
                    .filter(|&id| ShardFilter::IdHash { bucket, of }.selects_id(id))
                    .count() as u32
            })
            .collect();
        assert_eq!(buckets.iter().sum::<u32>(), 1000);
        assert!(buckets.iter().all(|&n| n > 200), "{buckets:?}");
        assert_eq!(ShardFilter::Centroids(vec![5, 9]).describe(), "lists 5,9");
        assert_eq!(Metric::Ip.distance(&[1.0, 2.0], &[3.0, 4.0]), -11.0);
        assert_eq!(Metric::L2.distance(&[1.0, 2.0], &[3.0, 4.0]), 8.0);
    }
}
