//! An experiment's disagreement samples as JSON: the two answers with their ids, buckets,
//! delays and distances as fields, so that a researcher's script reads them, rather than as
//! debug text cut at a byte count.

use super::bindings::split_layout::{ShardFilter, Subtask};
use policy_packed::{Admission, Bucket, Decision, Hit};
use serde_json::{Value, json};

/// Items of one answer kept in a sample; a longer answer is cut, and says how long it was.
pub const MAX_SAMPLE_ITEMS: usize = 32;

/// An answer as a sample shows it.
pub trait Sample {
    fn sample(&self) -> Value;
}

/// The first `MAX_SAMPLE_ITEMS` of `items`, with the full count when it was cut.
fn list<T>(items: &[T], one: impl Fn(&T) -> Value) -> Value {
    let kept: Vec<Value> = items.iter().take(MAX_SAMPLE_ITEMS).map(one).collect();
    if items.len() > MAX_SAMPLE_ITEMS {
        json!({"first": kept, "of": items.len()})
    } else {
        Value::Array(kept)
    }
}

fn bucket(bucket: Bucket) -> &'static str {
    match bucket {
        Bucket::Urgent => "urgent",
        Bucket::Normal => "normal",
        Bucket::Low => "low",
    }
}

fn refused_or<T>(answer: &Result<Vec<T>, String>, one: impl Fn(&T) -> Value) -> Value {
    match answer {
        Ok(items) => list(items, one),
        Err(reason) => json!({"refused": reason}),
    }
}

impl Sample for Vec<u32> {
    fn sample(&self) -> Value {
        list(self, |weight| json!(weight))
    }
}

impl Sample for Option<Vec<(String, u32)>> {
    fn sample(&self) -> Value {
        match self {
            Some(weights) => list(
                weights,
                |(tenant, weight)| json!({"tenant": tenant, "weight": weight}),
            ),
            None => Value::Null,
        }
    }
}

impl Sample for Vec<Admission> {
    fn sample(&self) -> Value {
        list(
            self,
            |a| json!({"bucket": bucket(a.bucket), "rank": a.rank, "attempt_timeout_ms": a.attempt_timeout_ms}),
        )
    }
}

/// Aging: the promotions, each the index of the task in the call and the bucket it goes to.
impl Sample for Vec<(u32, Bucket)> {
    fn sample(&self) -> Value {
        list(self, |(task, to)| json!({"task": task, "to": bucket(*to)}))
    }
}

impl Sample for Vec<Decision> {
    fn sample(&self) -> Value {
        list(self, |decision| match decision {
            Decision::RetryAfterMs(ms) => json!({"retry_after_ms": ms}),
            Decision::Dead(reason) => json!({"dead": reason.as_str()}),
        })
    }
}

impl Sample for Result<Vec<Subtask>, String> {
    fn sample(&self) -> Value {
        refused_or(self, |child| {
            let filter = match &child.filter {
                ShardFilter::Shard(shard) => json!({"shard": shard}),
                ShardFilter::IdRange((low, high)) => json!({"id_range": [low, high]}),
                ShardFilter::IdHash((bucket, of)) => {
                    json!({"id_hash": {"bucket": bucket, "of": of}})
                }
                ShardFilter::Centroids(list) => json!({"centroids": list}),
            };
            json!({"filter": filter, "weight": child.weight})
        })
    }
}

impl Sample for Result<Vec<Hit>, String> {
    fn sample(&self) -> Value {
        refused_or(self, |hit| json!({"id": hit.id, "distance": hit.distance}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_merge_answer_is_ids_and_distances_and_a_long_one_is_cut_with_its_length() {
        let hits: Result<Vec<Hit>, String> = Ok(vec![Hit {
            id: 19_852,
            distance: 20.5,
        }]);
        assert_eq!(hits.sample(), json!([{"id": 19_852, "distance": 20.5}]));
        let refused: Result<Vec<Hit>, String> = Err("no".into());
        assert_eq!(refused.sample(), json!({"refused": "no"}));
        let many: Vec<u32> = (0..100).collect();
        let cut = many.sample();
        assert_eq!(cut["of"], 100);
        assert_eq!(cut["first"].as_array().unwrap().len(), MAX_SAMPLE_ITEMS);
        let decisions = vec![Decision::RetryAfterMs(250)];
        assert_eq!(decisions.sample(), json!([{"retry_after_ms": 250}]));
    }
}
