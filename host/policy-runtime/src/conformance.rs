//! The conformance cases a component must pass before it is stored: fixed inputs per kind,
//! each answer judged by the same checks as live decisions (`checks`), plus what a kind must
//! do on those inputs (a split answers well-formed children or a reason; a merge of hits must merge some).

use super::bindings::split;
use super::checks;
use super::instance::{
    AgingInstance, MergeInstance, PriorityInstance, RetryInstance, SplitInstance,
};
use policy_packed::{Bucket, ErrorClass, FAILURE_WORDS, Failure, Hit, VIEW_WORDS, View, pack};
use sluice_model::{NamesRef, TaskNames};
use std::collections::BTreeMap;

/// What every kind's instance must pass at upload.
pub trait Conformance {
    fn conformance(&mut self) -> Result<(), String>;
}

/// The moment the cases are set at: late enough that "a day ago" is a valid time.
const NOW_MS: u64 = 1_800_000_000_000;
const HOUR_MS: u64 = 3_600_000;

fn view(seq: u64, bucket: Bucket, since_ms: u64, attempt: u32) -> View {
    View {
        tenant: (seq % 3) as u32,
        kind: (seq % 2) as u32,
        created_ms: since_ms,
        bucket_since_ms: since_ms,
        attempt,
        est_exec_ms: 1 + (seq % 4) * 60_000,
        ..View::in_bucket(seq, bucket)
    }
}

/// The names of case `seq`: two kinds, three tenants, four devices, labels on some, so a
/// policy that reads names meets the shapes it will see.
fn names(seq: u64) -> TaskNames {
    let mut labels = BTreeMap::new();
    if seq % 4 == 1 {
        labels.insert("ed".to_owned(), "true".to_owned());
    }
    if seq % 5 == 2 {
        labels.insert("site".to_owned(), "north".to_owned());
        labels.insert("model".to_owned(), "seg-v3".to_owned());
    }
    TaskNames {
        kind: ["oct.qa", "ct.scan"][seq as usize % 2].to_owned(),
        tenant: ["site-a", "site-b", "site-c"][seq as usize % 3].to_owned(),
        device: format!("scanner-{}", seq % 4),
        labels,
    }
}

fn names_of(count: usize) -> Vec<TaskNames> {
    (0..count as u64).map(names).collect()
}

fn refs(names: &[TaskNames]) -> Vec<NamesRef<'_>> {
    names.iter().map(TaskNames::borrowed).collect()
}

fn fault(what: &str) -> impl Fn(super::PolicyError) -> String + '_ {
    move |error| format!("{what}: {error}")
}

impl Conformance for PriorityInstance {
    fn conformance(&mut self) -> Result<(), String> {
        checks::bucket_weights(self.bucket_weights().map_err(fault("bucket-weights"))?)?;
        checks::tenant_weights(self.tenant_weights().map_err(fault("tenant-weights"))?)?;
        let tasks: Vec<View> = (0..12u64)
            .map(|seq| view(seq, Bucket::ALL[seq as usize % 3], NOW_MS - seq, 0))
            .collect();
        let words = pack(&tasks, VIEW_WORDS, View::write);
        let names = names_of(tasks.len());
        let admitted = self
            .admit(NOW_MS, &words, &refs(&names))
            .map_err(fault("admit"))?;
        let admitted = checks::admissions(tasks.len(), &admitted)?;
        for ((task, batch), names) in tasks.iter().zip(&admitted).zip(&names) {
            let (a, b, c) = self
                .admit_one(NOW_MS, task.words(), names.borrowed())
                .map_err(fault("admit-one"))?;
            if checks::admissions(1, &[a, b, c])? != [*batch] {
                return Err(format!("admit-one and admit differ for task {}", task.seq));
            }
        }
        checks::admissions(0, &self.admit(NOW_MS, &[], &[]).map_err(fault("admit"))?).map(drop)
    }
}

impl Conformance for AgingInstance {
    fn conformance(&mut self) -> Result<(), String> {
        let waiting: Vec<View> = (0..12u64)
            .map(|seq| {
                let since = [NOW_MS, NOW_MS - HOUR_MS, NOW_MS - 24 * HOUR_MS][seq as usize / 4];
                view(seq, Bucket::ALL[seq as usize % 3], since, 0)
            })
            .collect();
        let words = pack(&waiting, VIEW_WORDS, View::write);
        let names = names_of(waiting.len());
        let promotions = self
            .age(NOW_MS, &words, &refs(&names))
            .map_err(fault("age"))?;
        let moves = checks::promotions(&waiting, promotions)?;
        for (index, task) in waiting.iter().enumerate() {
            let one = self
                .age_one(NOW_MS, task.words(), names[index].borrowed())
                .map_err(fault("age-one"))?;
            let one =
                one.map(
                    |to| super::bindings::aging::exports::sluice::policy::aging::Promotion {
                        index: 0,
                        to,
                    },
                );
            let one = checks::promotions(std::slice::from_ref(task), one)?;
            let batch = moves
                .iter()
                .find(|(i, _)| *i as usize == index)
                .map(|&(_, to)| to);
            if one.first().map(|&(_, to)| to) != batch {
                return Err(format!("age-one and age differ for task {}", task.seq));
            }
        }
        checks::promotions(&[], self.age(NOW_MS, &[], &[]).map_err(fault("age"))?).map(drop)
    }
}

impl Conformance for RetryInstance {
    fn conformance(&mut self) -> Result<(), String> {
        let mut failures = Vec::new();
        for (n, class) in ErrorClass::ALL.into_iter().enumerate() {
            for attempt in [1, 2, 3, 100] {
                for random in [0, u64::MAX, 0x9e37_79b9_7f4a_7c15] {
                    let seq = failures.len() as u64;
                    failures.push(Failure {
                        task: view(seq, Bucket::Normal, NOW_MS - HOUR_MS, attempt),
                        class,
                        max_attempts: if n % 2 == 0 { 3 } else { 100 },
                        random,
                    });
                }
            }
        }
        let words = pack(&failures, FAILURE_WORDS, Failure::write);
        let names = names_of(failures.len());
        let decisions = self
            .decide(NOW_MS, &words, &refs(&names))
            .map_err(fault("decide"))?;
        let decisions = checks::decisions(&failures, &decisions)?;
        for ((failure, batch), names) in failures.iter().zip(&decisions).zip(&names) {
            let one = self
                .decide_one(NOW_MS, failure.words(), names.borrowed())
                .map_err(fault("decide-one"))?;
            if checks::decisions(std::slice::from_ref(failure), &[one])? != [*batch] {
                return Err(format!(
                    "decide-one and decide differ for failure {}",
                    failure.task.seq
                ));
            }
        }
        Ok(())
    }
}

impl Conformance for SplitInstance {
    fn conformance(&mut self) -> Result<(), String> {
        use super::bindings::split_layout::{Layout, SplitRequest};
        use split::sluice::policy::types::{Bucket, TaskMeta, TaskView};
        let request = SplitRequest {
            task: TaskMeta {
                view: TaskView {
                    seq: 7,
                    tenant: 0,
                    kind: 0,
                    bucket: Bucket::Normal,
                    submitted_bucket: Bucket::Normal,
                    created_ms: NOW_MS,
                    bucket_since_ms: NOW_MS,
                    attempt: 0,
                    est_exec_ms: 60_000,
                },
                kind_name: "vector.search".into(),
                tenant_name: "conformance".into(),
                device: "conformance".into(),
                labels: Vec::new(),
            },
            vector: (0..16).map(|i| i as f32 / 16.0).collect(),
            k: 10,
            nprobe: 4,
            layout: Layout {
                collection: "conformance".into(),
                dim: 16,
                shards: 4,
                live: vec![0, 1, 2, 3],
            },
        };
        let answer = self.split(&request).map_err(fault("split"))?;
        // A refusal is a valid answer here: a policy may not take 16-dimensional queries (an
        // IVF split with centroids of another dimension). Its form is checked all the same.
        checks::subtasks(answer).map(drop)
    }
}

impl Conformance for MergeInstance {
    fn conformance(&mut self) -> Result<(), String> {
        let mut hits = Vec::new();
        let parts: [&[(u64, f32)]; 3] = [
            &[(1, 0.1), (4, 0.4), (7, 0.7)],
            &[(2, 0.2), (4, 0.4), (5, 0.5)],
            &[(3, 0.2), (6, 0.6)],
        ];
        for (child, part) in parts.iter().enumerate() {
            for &(id, distance) in *part {
                Hit { id, distance }.write_part(child as u32, &mut hits);
            }
        }
        let weights = [1.0, 1.0, 1.0];
        for k in [0, 1, 3, 100] {
            let answer = self.merge(k, &weights, &hits).map_err(fault("merge"))?;
            match checks::merged(k, &hits, answer)? {
                Ok(merged) if k > 0 && merged.is_empty() => {
                    return Err(format!("merged no hits for k = {k} from three parts"));
                }
                Ok(_) => {}
                Err(refusal) => return Err(format!("refused a plain merge: {refusal}")),
            }
        }
        let empty = self.merge(5, &[], &[]).map_err(fault("merge"))?;
        checks::merged(5, &[], empty).map(drop)
    }
}
