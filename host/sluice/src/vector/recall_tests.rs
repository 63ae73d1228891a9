//! Recall of split and merge against exact search, through the real policy components: the
//! UCI handwritten digits (1,797 × 64, from smartcore) and a synthetic clustered set. Exact
//! splits (shard list, id range, id hash) with the top-k merge must give exactly the
//! brute-force ids in (distance, id) order; IVF must reach its recall bound.

use super::{ShardIndex, ShardPart, Vectors, brute_force, clustered, kmeans};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_engine::SplitInput;
use sluice_model::{Hit, Layout, Metric, ShardFilter, ShardQuery, TaskSpec, VectorQuery};
use sluice_policy_runtime::{
    Kind, MergeInstance, PolicyRuntime, RuntimeOptions, SplitInstance, checks, defaults,
    shard_filter, split_request,
};
use std::sync::Arc;

const K: usize = 10;
const QUERIES: usize = 40;

fn digits() -> Vectors {
    let set = smartcore::dataset::digits::load_dataset();
    assert_eq!((set.num_samples, set.num_features), (1797, 64));
    Vectors {
        dim: set.num_features,
        data: set.data,
    }
}

/// Rows of the set, nudged so that a query is rarely a stored vector itself.
fn queries(vectors: &Vectors, seed: u64) -> Vec<Vec<f32>> {
    let mut random = SmallRng::seed_from_u64(seed);
    (0..QUERIES)
        .map(|_| {
            let row = random.random_range(0..vectors.len());
            vectors
                .row(row)
                .iter()
                .map(|x| x + random.random_range(-0.5..0.5))
                .collect()
        })
        .collect()
}

/// A split and a merge policy, as components, and the workers' indexes.
struct SearchPipeline {
    split: SplitInstance,
    merge: MergeInstance,
    /// Stored shards by number; `whole` answers every other filter.
    shards: Vec<ShardIndex>,
    whole: Option<ShardIndex>,
}

fn instance_bytes(name: &str) -> &'static [u8] {
    defaults::by_name(name).unwrap_or_else(|| panic!("no embedded policy {name}"))
}

impl SearchPipeline {
    fn new(split: &str, config: &str, shards: Vec<ShardIndex>, whole: Option<ShardIndex>) -> Self {
        let runtime = Arc::new(PolicyRuntime::new(RuntimeOptions::default()).unwrap());
        let compiled = runtime.compile(Kind::Split, instance_bytes(split)).unwrap();
        let split = SplitInstance::new(runtime.clone(), &compiled, config.as_bytes()).unwrap();
        let compiled = runtime
            .compile(Kind::Merge, instance_bytes("merge-topk"))
            .unwrap();
        let merge = MergeInstance::new(runtime, &compiled, b"").unwrap();
        SearchPipeline {
            split,
            merge,
            shards,
            whole,
        }
    }

    fn search(&mut self, vector: &[f32], nprobe: u32) -> (Vec<Hit>, usize) {
        let spec: TaskSpec =
            serde_json::from_value(serde_json::json!({"kind": "vector.search"})).unwrap();
        let query = VectorQuery {
            vector: vector.to_vec(),
            k: K as u32,
            collection: None,
            metric: None,
            nprobe,
            allow_partial: false,
            merge_deadline_ms: None,
        };
        let shards = self.shards.len().max(1) as u32;
        let layout = Layout {
            collection: "recall".into(),
            dim: vector.len() as u32,
            metric: Metric::L2,
            shards,
            live: (0..shards).collect(),
            declared: false,
        };
        let input = SplitInput {
            spec: &spec,
            seq: 1,
            query: &query,
            layout: &layout,
        };
        let answer = self.split.split(&split_request(0, &input)).unwrap();
        let children = checks::subtasks(answer).unwrap().unwrap();
        let mut packed = Vec::new();
        let mut weights = Vec::new();
        for (child, subtask) in (0u32..).zip(children.iter()) {
            let filter = shard_filter(subtask.filter.clone());
            let index = match &filter {
                ShardFilter::Shard(shard) => &self.shards[*shard as usize],
                _ => self.whole.as_ref().unwrap(),
            };
            let shard_query = ShardQuery {
                vector: vector.to_vec(),
                k: K as u32,
                metric: Metric::L2,
                filter,
                child,
            };
            for hit in index.search(&shard_query).unwrap().hits {
                policy_packed::Hit {
                    id: hit.id,
                    distance: hit.distance,
                }
                .write_part(child, &mut packed);
            }
            weights.push(subtask.weight);
        }
        let merged = self.merge.merge(K as u32, &weights, &packed).unwrap();
        let hits = checks::merged(K as u32, &packed, merged).unwrap().unwrap();
        let hits = hits
            .into_iter()
            .map(|h| Hit {
                id: h.id,
                distance: h.distance,
            })
            .collect();
        (hits, children.len())
    }
}

fn ids(hits: &[Hit]) -> Vec<u64> {
    hits.iter().map(|h| h.id).collect()
}

/// Every query's merged ids equal the exact ones, in order.
fn assert_exact(pipeline: &mut SearchPipeline, vectors: &Vectors, what: &str) {
    for (number, query) in queries(vectors, 11).iter().enumerate() {
        let exact = brute_force(vectors, query, K, Metric::L2);
        let (merged, _) = pipeline.search(query, 0);
        assert_eq!(ids(&merged), ids(&exact), "{what}: query {number}");
    }
}

fn stored_shards(vectors: &Vectors, count: u32) -> Vec<ShardIndex> {
    (0..count)
        .map(|index| ShardIndex::from_rows(vectors, Some(ShardPart { index, count })))
        .collect()
}

fn exact_splits_give_exact_answers(vectors: &Vectors, name: &str) {
    let rows = vectors.len();
    for count in [1u32, 2, 4, 7] {
        let mut by_shard = SearchPipeline::new(
            "split-shards",
            &format!("shards={count}"),
            stored_shards(vectors, count),
            None,
        );
        assert_exact(
            &mut by_shard,
            vectors,
            &format!("{name}, {count} stored shards"),
        );
        let whole = || Some(ShardIndex::from_rows(vectors, None));
        let mut by_range = SearchPipeline::new(
            "split-range",
            &format!("id_min=0\nid_max={rows}\nparts={count}"),
            Vec::new(),
            whole(),
        );
        assert_exact(
            &mut by_range,
            vectors,
            &format!("{name}, {count} id ranges"),
        );
        let mut by_hash = SearchPipeline::new(
            "split-hash",
            &format!("buckets={count}"),
            Vec::new(),
            whole(),
        );
        assert_exact(
            &mut by_hash,
            vectors,
            &format!("{name}, {count} hash buckets"),
        );
    }
}

#[test]
fn exact_splits_match_brute_force_on_the_digits() {
    exact_splits_give_exact_answers(&digits(), "digits");
}

#[test]
fn exact_splits_match_brute_force_on_a_clustered_set() {
    exact_splits_give_exact_answers(&clustered(3_000, 32, 24, 5), "clustered");
}

#[test]
fn vectors_copied_into_a_second_shard_count_once() {
    let vectors = digits();
    let count = 4u32;
    let mut random = SmallRng::seed_from_u64(3);
    // Each shard also holds a copy of 20 % of the next shard's vectors, under the same ids.
    let shards: Vec<ShardIndex> = (0..count)
        .map(|index| {
            let own = ShardPart { index, count }.rows(vectors.len());
            let next = ShardPart {
                index: (index + 1) % count,
                count,
            }
            .rows(vectors.len());
            let copied: Vec<usize> = next.filter(|_| random.random_bool(0.2)).collect();
            let rows: Vec<usize> = own.chain(copied).collect();
            let data = rows
                .iter()
                .flat_map(|&r| vectors.row(r).iter().copied())
                .collect();
            ShardIndex::new(
                vectors.dim,
                rows.iter().map(|&r| r as u64).collect(),
                data,
                Some(ShardPart { index, count }),
            )
        })
        .collect();
    let copies: usize = shards.iter().map(ShardIndex::len).sum::<usize>() - vectors.len();
    assert!(copies > vectors.len() / 10, "only {copies} copies");
    let mut pipeline =
        SearchPipeline::new("split-shards", &format!("shards={count}"), shards, None);
    for query in queries(&vectors, 17) {
        let (merged, _) = pipeline.search(&query, 0);
        let mut unique = ids(&merged);
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(
            unique.len(),
            K,
            "duplicate ids or a short answer: {merged:?}"
        );
        assert_eq!(
            ids(&merged),
            ids(&brute_force(&vectors, &query, K, Metric::L2))
        );
    }
}

/// Mean recall@10 of IVF with 32 lists at `nprobe`.
fn ivf_recall(vectors: &Vectors, nprobe: u32) -> f64 {
    let lists = 32;
    let centroids = Vectors {
        dim: vectors.dim,
        data: kmeans(&vectors.data, vectors.dim, lists, 20, 9),
    };
    let listed: Vec<String> = centroids.data.iter().map(f32::to_string).collect();
    let config = format!("dim={}\ncentroids={}", vectors.dim, listed.join(","));
    let whole = ShardIndex::from_rows(vectors, None)
        .with_lists(&centroids)
        .unwrap();
    let mut pipeline = SearchPipeline::new("split-ivf", &config, Vec::new(), Some(whole));
    let mut found = 0usize;
    for query in queries(vectors, 23) {
        let exact = ids(&brute_force(vectors, &query, K, Metric::L2));
        let (merged, children) = pipeline.search(&query, nprobe);
        assert_eq!(children, nprobe as usize);
        found += ids(&merged).iter().filter(|id| exact.contains(id)).count();
    }
    found as f64 / (QUERIES * K) as f64
}

#[test]
fn ivf_with_32_lists_reaches_its_recall() {
    for (name, vectors) in [
        ("digits", digits()),
        ("clustered", clustered(3_000, 32, 24, 5)),
    ] {
        let one = ivf_recall(&vectors, 1);
        let four = ivf_recall(&vectors, 4);
        println!("{name}: recall@10 probing 1 / 4 of 32 IVF lists: {one:.3} / {four:.3}");
        assert!(
            four >= 0.95,
            "{name}: recall@10 probing 4 of 32 lists is {four}"
        );
        let all = ivf_recall(&vectors, 32);
        assert_eq!(all, 1.0, "{name}: probing every list must be exact");
    }
}
