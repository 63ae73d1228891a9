//! Split families through the writer over a real store (the default backend), on a clock the test moves: a
//! child's answer is counted on its parent, the merge deadline merges what has answered and
//! cancels the rest, and a restart in the middle loses no count.

use super::*;
use sluice_engine::{Decided, NativeDecider, Report, SplitAnswer, SplitInput};
use sluice_model::{Admission, Heartbeat, Limits, MergedAnswer, ShardFilter, State, TaskSpec};
use sluice_store_sled::{SledOptions, SledStore};
use std::sync::atomic::{AtomicU64, Ordering};

/// A clock the test sets.
#[derive(Clone, Default)]
struct TestClock(Arc<AtomicU64>);

impl Clock for TestClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// The host's own rules, but splitting into `shards` stored shards.
struct Shards {
    native: NativeDecider,
    shards: u32,
}

impl Decide for Shards {
    fn admit(&self, now_ms: u64, first_seq: u64, specs: &[&TaskSpec]) -> Vec<Admission> {
        self.native.admit(now_ms, first_seq, specs)
    }
    fn bucket_weights(&self, now_ms: u64) -> [u32; 3] {
        self.native.bucket_weights(now_ms)
    }
    fn age(
        &self,
        now_ms: u64,
        variant: Option<sluice_model::VariantTag>,
        waiting: &[policy_packed::View],
        names: &[sluice_model::NamesRef<'_>],
    ) -> Decided<Vec<(u32, policy_packed::Bucket)>> {
        self.native.age(now_ms, variant, waiting, names)
    }
    fn retry(
        &self,
        now_ms: u64,
        variant: Option<sluice_model::VariantTag>,
        failures: &[policy_packed::Failure],
        names: &[sluice_model::NamesRef<'_>],
    ) -> Decided<Vec<sluice_engine::RetryDecision>> {
        self.native.retry(now_ms, variant, failures, names)
    }
    fn split(&self, _now_ms: u64, _input: &SplitInput) -> Result<Decided<SplitAnswer>, String> {
        Ok(Decided {
            answer: Ok((0..self.shards)
                .map(|shard| (ShardFilter::Shard(shard), 1.0))
                .collect()),
            version: None,
        })
    }
    fn merge(
        &self,
        now_ms: u64,
        variant: Option<sluice_model::VariantTag>,
        k: u32,
        weights: &[f32],
        hits: &[u64],
    ) -> Decided<Result<Vec<policy_packed::Hit>, String>> {
        self.native.merge(now_ms, variant, k, weights, hits)
    }
}

fn start(dir: &std::path::Path, clock: &TestClock) -> Scheduler {
    let store = Arc::new(SledStore::reopen(dir, &SledOptions::default()).unwrap());
    Scheduler::start(
        store,
        Box::new(clock.clone()),
        Arc::new(Shards {
            native: NativeDecider::default(),
            shards: 2,
        }),
        &SchedulerOptions {
            engine: sluice_engine::EngineOptions {
                // Declared, so a query splits before any shard worker has announced it.
                collections: vec![sluice_model::Collection {
                    name: "default".into(),
                    dim: 2,
                    metric: sluice_model::Metric::L2,
                    shards: 2,
                }],
                ..sluice_engine::EngineOptions::default()
            },
            ..SchedulerOptions::default()
        },
    )
    .unwrap()
}

fn query(merge_deadline_ms: u64) -> Submission {
    let spec: TaskSpec = serde_json::from_value(serde_json::json!({
        "kind": "vector.search",
        "payload": {"vector": [0.0, 1.0], "k": 2, "merge_deadline_ms": merge_deadline_ms},
    }))
    .unwrap();
    spec.into_submission(None, &Limits::default()).unwrap()
}

/// Claims shard `shard`'s child as a worker holding that shard and answers it.
async fn answer_shard(scheduler: &Scheduler, shard: u32, hits: serde_json::Value) -> Task {
    let worker = format!("w{shard}");
    let heartbeat: Heartbeat = serde_json::from_value(serde_json::json!({
        "labels": {"shard": shard.to_string(), "collection": "default"},
        "vectors": {"collection": "default", "shard": shard, "shards": 2, "dim": 2},
        "kinds": ["vector.search"],
        "max_concurrency": 4,
    }))
    .unwrap();
    scheduler
        .heartbeat(worker.clone(), heartbeat)
        .await
        .unwrap();
    let claimed = scheduler.claim(worker, 4, None, None).await.unwrap();
    assert_eq!(claimed.claimed.leases.len(), 1, "{claimed:?}");
    let child = &claimed.claimed.leases[0];
    let token = child.lease.as_ref().unwrap().token.clone();
    scheduler
        .report(
            child.id,
            token,
            Report::Complete {
                result: serde_json::json!({"hits": hits}),
            },
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn the_merge_deadline_merges_what_answered_and_cancels_the_rest_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::default();
    clock.0.store(1_000, Ordering::SeqCst);
    let scheduler = start(dir.path(), &clock);
    let parent = scheduler.submit(query(5_000)).await.unwrap().task;
    assert_eq!(parent.state, State::Split);
    let family = parent.family.clone().unwrap();
    assert_eq!(family.parts.len(), 2);
    assert_eq!(family.merge_at_ms, Some(6_000));

    let child = answer_shard(
        &scheduler,
        0,
        serde_json::json!([{"id": 7, "distance": 0.5}, {"id": 3, "distance": 0.5}]),
    )
    .await;
    assert_eq!(child.state, State::Completed);
    assert_eq!(child.parent, Some(parent.id));
    let counted = scheduler.task(parent.id).unwrap();
    assert_eq!(counted.state, State::Split);
    assert_eq!(counted.family.unwrap().settled, 1);

    // A restart keeps the count and the deadline.
    scheduler.shutdown().await;
    drop(scheduler);
    let scheduler = start(dir.path(), &clock);
    clock.0.store(5_999, Ordering::SeqCst);
    scheduler.tick().await.unwrap();
    assert_eq!(scheduler.task(parent.id).unwrap().state, State::Split);

    clock.0.store(6_000, Ordering::SeqCst);
    scheduler.tick().await.unwrap();
    let merged = scheduler.task(parent.id).unwrap();
    assert_eq!(merged.state, State::Completed, "{merged:?}");
    let answer: MergedAnswer = serde_json::from_value(merged.result.unwrap()).unwrap();
    // Ties at 0.5 go by id.
    let ids: Vec<u64> = answer.hits.iter().map(|h| h.id).collect();
    assert_eq!(ids, [3, 7]);
    assert_eq!((answer.coverage, answer.partial), (0.5, true));
    assert!(
        answer.missing[0].starts_with("shard 1"),
        "{:?}",
        answer.missing
    );
    let late = scheduler.task(family.parts[1].task).unwrap();
    assert_eq!(late.state, State::Cancelled);
    let states: Vec<_> = scheduler
        .events(parent.id, 0, 100)
        .unwrap()
        .iter()
        .map(|e| e.to)
        .collect();
    assert_eq!(
        states,
        [
            State::Created,
            State::Queued,
            State::Split,
            State::Merging,
            State::Completed
        ]
    );
    scheduler.shutdown().await;
}

#[tokio::test]
async fn a_parent_merges_as_soon_as_its_last_child_ends() {
    let dir = tempfile::tempdir().unwrap();
    let clock = TestClock::default();
    clock.0.store(1_000, Ordering::SeqCst);
    let scheduler = start(dir.path(), &clock);
    let parent = scheduler.submit(query(60_000)).await.unwrap().task;
    answer_shard(
        &scheduler,
        1,
        serde_json::json!([{"id": 9, "distance": 2.0}]),
    )
    .await;
    answer_shard(
        &scheduler,
        0,
        serde_json::json!([{"id": 9, "distance": 2.0}, {"id": 1, "distance": 4.0}]),
    )
    .await;
    let merged = scheduler.task(parent.id).unwrap();
    assert_eq!(merged.state, State::Completed);
    let answer: MergedAnswer = serde_json::from_value(merged.result.unwrap()).unwrap();
    // Id 9 came from both shards and counts once.
    let ids: Vec<u64> = answer.hits.iter().map(|h| h.id).collect();
    assert_eq!(ids, [9, 1]);
    assert_eq!((answer.coverage, answer.partial), (1.0, false));
    scheduler.shutdown().await;
}
