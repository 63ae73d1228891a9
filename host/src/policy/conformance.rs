//! The conformance cases a component must pass before it is stored: fixed inputs per kind,
//! each answer judged by the same checks as live decisions (`checks`), plus what a kind must
//! do on those inputs (a split must split; a merge of hits must merge some).

use super::bindings::{aging, merge, priority, retry, split};
use super::checks;
use super::instance::{
    AgingInstance, MergeInstance, PriorityInstance, RetryInstance, SplitInstance,
};

/// What every kind's instance must pass at upload.
pub trait Conformance {
    fn conformance(&mut self) -> Result<(), String>;
}

/// The moment the cases are set at: late enough that "an hour ago" is a valid time.
const NOW_MS: u64 = 1_800_000_000_000;
const HOUR_MS: u64 = 3_600_000;

/// A `TaskView` of the given world's copy of the `types` interface.
macro_rules! view {
    ($types:path, $seq:expr, $bucket:expr, $since_ms:expr, $attempt:expr) => {{
        use $types as types;
        types::TaskView {
            seq: $seq,
            tenant: ($seq % 3) as u32,
            kind: ($seq % 2) as u32,
            bucket: $bucket,
            submitted_bucket: $bucket,
            created_ms: $since_ms,
            bucket_since_ms: $since_ms,
            attempt: $attempt,
            est_exec_ms: 1 + ($seq % 4) * 60_000,
        }
    }};
}

fn fault(what: &str) -> impl Fn(super::PolicyError) -> String + '_ {
    move |error| format!("{what}: {error}")
}

impl Conformance for PriorityInstance {
    fn conformance(&mut self) -> Result<(), String> {
        use priority::sluice::policy::types::{Bucket, TaskMeta};
        checks::bucket_weights(&self.bucket_weights().map_err(fault("bucket-weights"))?)?;
        let tasks: Vec<TaskMeta> = (0..12u64)
            .map(|seq| TaskMeta {
                view: view!(
                    priority::sluice::policy::types,
                    seq,
                    [Bucket::Urgent, Bucket::Normal, Bucket::Low][seq as usize % 3],
                    NOW_MS - seq,
                    0
                ),
                kind_name: format!("kind-{}", seq % 2),
                tenant_name: format!("tenant-{}", seq % 3),
                device: "conformance".into(),
                labels: vec![("case".into(), seq.to_string())],
            })
            .collect();
        let admitted = self.admit(NOW_MS, &tasks).map_err(fault("admit"))?;
        checks::admissions(tasks.len(), &admitted)?;
        checks::admissions(0, &self.admit(NOW_MS, &[]).map_err(fault("admit"))?)
    }
}

impl Conformance for AgingInstance {
    fn conformance(&mut self) -> Result<(), String> {
        use aging::sluice::policy::types::Bucket;
        let waiting: Vec<_> = (0..12u64)
            .map(|seq| {
                let bucket = [Bucket::Urgent, Bucket::Normal, Bucket::Low][seq as usize % 3];
                let since = [NOW_MS, NOW_MS - HOUR_MS, NOW_MS - 24 * HOUR_MS][seq as usize / 4];
                view!(aging::sluice::policy::types, seq, bucket, since, 0)
            })
            .collect();
        let promotions = self.age(NOW_MS, &waiting).map_err(fault("age"))?;
        checks::promotions(&waiting, &promotions)?;
        checks::promotions(&[], &self.age(NOW_MS, &[]).map_err(fault("age"))?)
    }
}

impl Conformance for RetryInstance {
    fn conformance(&mut self) -> Result<(), String> {
        use retry::exports::sluice::policy::retry::{ErrorClass, Failure};
        use retry::sluice::policy::types::Bucket;
        let classes = [
            ErrorClass::Transient,
            ErrorClass::NodeBusy,
            ErrorClass::LeaseExpired,
            ErrorClass::Timeout,
            ErrorClass::Permanent,
            ErrorClass::InvalidInput,
        ];
        let mut failures = Vec::new();
        for (n, class) in classes.into_iter().enumerate() {
            for attempt in [1, 2, 3, 100] {
                for random in [0, u64::MAX, 0x9e37_79b9_7f4a_7c15] {
                    let seq = failures.len() as u64;
                    failures.push(Failure {
                        task: view!(
                            retry::sluice::policy::types,
                            seq,
                            Bucket::Normal,
                            NOW_MS - HOUR_MS,
                            attempt
                        ),
                        class,
                        max_attempts: if n % 2 == 0 { 3 } else { 100 },
                        random,
                    });
                }
            }
        }
        let decisions = self.decide(NOW_MS, &failures).map_err(fault("decide"))?;
        checks::decisions(&failures, &decisions)
    }
}

impl Conformance for SplitInstance {
    fn conformance(&mut self) -> Result<(), String> {
        use split::exports::sluice::policy::split::SplitRequest;
        use split::sluice::policy::types::{Bucket, TaskMeta};
        let request = SplitRequest {
            task: TaskMeta {
                view: view!(split::sluice::policy::types, 7, Bucket::Normal, NOW_MS, 0),
                kind_name: "vector.search".into(),
                tenant_name: "conformance".into(),
                device: "conformance".into(),
                labels: Vec::new(),
            },
            vector: (0..16).map(|i| i as f32 / 16.0).collect(),
            k: 10,
            nprobe: 4,
        };
        let answer = self.split(&request).map_err(fault("split"))?;
        checks::subtasks(&answer)?;
        answer
            .map(drop)
            .map_err(|refusal| format!("refused a plain split: {refusal}"))
    }
}

impl Conformance for MergeInstance {
    fn conformance(&mut self) -> Result<(), String> {
        use merge::exports::sluice::policy::merge::{Hit, Part};
        let part = |child: u32, hits: &[(u64, f32)]| Part {
            child,
            weight: 1.0,
            hits: hits
                .iter()
                .map(|&(id, distance)| Hit { id, distance })
                .collect(),
        };
        let parts = [
            part(0, &[(1, 0.1), (4, 0.4), (7, 0.7)]),
            part(1, &[(2, 0.2), (4, 0.4), (5, 0.5)]),
            part(2, &[(3, 0.2), (6, 0.6)]),
        ];
        for k in [0, 1, 3, 100] {
            let answer = self.merge(k, &parts).map_err(fault("merge"))?;
            checks::merged(k, &parts, &answer)?;
            match answer {
                Ok(hits) if k > 0 && hits.is_empty() => {
                    return Err(format!("merged no hits for k = {k} from three parts"));
                }
                Ok(_) => {}
                Err(refusal) => return Err(format!("refused a plain merge: {refusal}")),
            }
        }
        checks::merged(5, &[], &self.merge(5, &[]).map_err(fault("merge"))?)
    }
}
