//! The embedded default components, compiled and called through wasmtime.

use super::bindings;
use super::defaults;
use super::*;
use policy_packed::{Bucket, DeadReason, Decision, ErrorClass, Failure, Hit, View};
use sluice_model::NamesRef;
use std::sync::{Arc, OnceLock};

fn runtime() -> Arc<PolicyRuntime> {
    static RUNTIME: OnceLock<Arc<PolicyRuntime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| Arc::new(PolicyRuntime::new(RuntimeOptions::default()).unwrap()))
        .clone()
}

#[test]
fn every_default_compiles_for_its_kind_and_only_its_kind() {
    let runtime = runtime();
    let defaults = [
        (Kind::Priority, defaults::PRIORITY_BUCKETS),
        (Kind::Aging, defaults::AGING_THRESHOLD),
        (Kind::Retry, defaults::RETRY_BACKOFF),
        (Kind::Split, defaults::SPLIT_SHARDS),
        (Kind::Split, defaults::SPLIT_HASH),
        (Kind::Split, defaults::SPLIT_RANGE),
        (Kind::Merge, defaults::MERGE_TOPK),
    ];
    for (kind, bytes) in defaults {
        runtime
            .compile(kind, bytes)
            .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    }
    let wrong = runtime.compile(Kind::Merge, defaults::RETRY_BACKOFF);
    assert!(
        matches!(wrong, Err(PolicyError::WrongWorld(Kind::Merge, _))),
        "{:?}",
        wrong.err()
    );
    let garbage = runtime.compile(Kind::Retry, b"\0asm garbage, not a component");
    assert!(matches!(garbage, Err(PolicyError::Compile(_))));
}

/// A failure of a normal task at `attempt` of 3.
fn retry_failure(attempt: u32, class: ErrorClass, random: u64) -> Failure {
    Failure {
        task: View {
            attempt,
            est_exec_ms: 1000,
            ..View::in_bucket(1, Bucket::Normal)
        },
        class,
        max_attempts: 3,
        random,
    }
}

#[test]
fn retry_backoff_decides_through_wasm_and_init_checks_its_config() {
    let runtime = runtime();
    let compiled = runtime
        .compile(Kind::Retry, defaults::RETRY_BACKOFF)
        .unwrap();
    let mut retry = RetryInstance::new(
        runtime.clone(),
        &compiled,
        b"initial_delay_ms=100\nmax_delay_ms=1000",
    )
    .unwrap();
    let mut failures = Vec::new();
    for (attempt, class, random) in [
        (1, ErrorClass::Transient, 50),
        (2, ErrorClass::NodeBusy, 1_000_000 + 150),
        (1, ErrorClass::Permanent, 0),
        (3, ErrorClass::Timeout, 0),
    ] {
        retry_failure(attempt, class, random).write(&mut failures);
    }
    let decisions: Vec<Decision> = retry
        .decide(
            5,
            &failures,
            &vec![NamesRef::unnamed(); failures.len() / policy_packed::FAILURE_WORDS],
        )
        .unwrap()
        .into_iter()
        .map(|word| Decision::read(word).unwrap())
        .collect();
    assert_eq!(
        decisions,
        [
            Decision::RetryAfterMs(50),
            Decision::RetryAfterMs((1_000_000 + 150) % 201),
            Decision::Dead(DeadReason::Permanent),
            Decision::Dead(DeadReason::AttemptsSpent),
        ]
    );

    let refused = RetryInstance::new(runtime.clone(), &compiled, b"initial_delay_ms=0");
    assert!(matches!(refused, Err(PolicyError::Init(_))));
    let unknown = RetryInstance::new(runtime, &compiled, b"retry_forever=true");
    assert!(matches!(unknown, Err(PolicyError::Init(reason)) if reason.contains("retry_forever")));
}

#[test]
fn priority_aging_split_and_merge_defaults_answer_through_wasm() {
    let runtime = runtime();

    let compiled = runtime
        .compile(Kind::Priority, defaults::PRIORITY_BUCKETS)
        .unwrap();
    let mut priority = PriorityInstance::new(runtime.clone(), &compiled, b"").unwrap();
    assert_eq!(priority.bucket_weights().unwrap(), [60, 35, 5]);
    assert_eq!(priority.tenant_weights().unwrap(), Some(Vec::new()));
    let mut weighted = PriorityInstance::new(
        runtime.clone(),
        &compiled,
        b"tenant_weights=site-a:3,site-b:2",
    )
    .unwrap();
    assert_eq!(
        weighted.tenant_weights().unwrap(),
        Some(vec![("site-a".to_owned(), 3), ("site-b".to_owned(), 2)])
    );
    let view = |seq, bucket, since, est_exec_ms| View {
        tenant: 1,
        kind: 2,
        bucket_since_ms: since,
        est_exec_ms,
        ..View::in_bucket(seq, bucket)
    };
    let mut tasks = Vec::new();
    view(42, Bucket::Low, 0, 30_000).write(&mut tasks);
    let admitted = priority.admit(0, &tasks, &[NamesRef::unnamed()]).unwrap();
    assert_eq!(
        policy_packed::Admission::read(&admitted).unwrap(),
        policy_packed::Admission {
            bucket: Bucket::Low,
            rank: 42,
            attempt_timeout_ms: 90_000
        }
    );

    let compiled = runtime
        .compile(Kind::Aging, defaults::AGING_THRESHOLD)
        .unwrap();
    let mut aging = AgingInstance::new(runtime.clone(), &compiled, b"low_to_normal_ms=10").unwrap();
    let mut waiting = Vec::new();
    view(0, Bucket::Low, 95, 0).write(&mut waiting);
    view(1, Bucket::Low, 90, 0).write(&mut waiting);
    let promotions = aging.age(100, &waiting, &[NamesRef::unnamed(); 2]).unwrap();
    assert_eq!(
        promotions
            .iter()
            .map(|p| (p.index, p.to))
            .collect::<Vec<_>>(),
        [(1, bindings::aging::sluice::policy::types::Bucket::Normal)]
    );

    use bindings::split::sluice::policy::types as stypes;
    use bindings::split_layout::{Layout, ShardFilter, SplitRequest};
    let compiled = runtime.compile(Kind::Split, defaults::SPLIT_RANGE).unwrap();
    let mut split =
        SplitInstance::new(runtime.clone(), &compiled, b"id_min=0\nid_max=10\nparts=3").unwrap();
    let request = SplitRequest {
        task: stypes::TaskMeta {
            view: stypes::TaskView {
                seq: 0,
                tenant: 0,
                kind: 0,
                bucket: stypes::Bucket::Urgent,
                submitted_bucket: stypes::Bucket::Urgent,
                created_ms: 0,
                bucket_since_ms: 0,
                attempt: 0,
                est_exec_ms: 0,
            },
            kind_name: "vector.search".into(),
            tenant_name: "t".into(),
            device: "d".into(),
            labels: Vec::new(),
        },
        vector: vec![0.5; 8],
        k: 10,
        nprobe: 4,
        layout: Layout {
            collection: "docs".into(),
            dim: 8,
            shards: 4,
            live: vec![0, 1, 3],
        },
    };
    let children = split.split(&request).unwrap().unwrap();
    let ranges: Vec<_> = children
        .iter()
        .map(|c| match c.filter {
            ShardFilter::IdRange(range) => range,
            _ => (u64::MAX, u64::MAX),
        })
        .collect();
    assert_eq!(ranges, [(0, 4), (4, 7), (7, 10)]);

    // The default split-shards is told the layout (through `split-layout`): one child per
    // live shard, none for shard 2.
    let compiled = runtime
        .compile(Kind::Split, defaults::SPLIT_SHARDS)
        .unwrap();
    let mut split = SplitInstance::new(runtime.clone(), &compiled, b"").unwrap();
    let children = split.split(&request).unwrap().unwrap();
    let shards: Vec<_> = children
        .iter()
        .map(|c| match c.filter {
            ShardFilter::Shard(shard) => shard,
            _ => u32::MAX,
        })
        .collect();
    assert_eq!(shards, [0, 1, 3]);

    // A component of 0.1.0's `split` world alone (as every one built before `split-layout`)
    // loads, passes conformance and decides through `split`, without the layout.
    let compiled = runtime
        .compile(Kind::Split, &super::hostile::legacy_split())
        .unwrap();
    let mut legacy = SplitInstance::new(runtime.clone(), &compiled, b"").unwrap();
    crate::conformance::Conformance::conformance(&mut legacy).unwrap();
    let children = legacy.split(&request).unwrap().unwrap();
    assert_eq!(
        children
            .iter()
            .map(|c| c.filter.clone())
            .collect::<Vec<_>>(),
        [ShardFilter::Shard(0), ShardFilter::Shard(1)]
    );

    let compiled = runtime.compile(Kind::Merge, defaults::MERGE_TOPK).unwrap();
    let mut merge = MergeInstance::new(runtime, &compiled, b"").unwrap();
    let pack = |parts: &[(u32, &[(u64, f32)])]| {
        let mut words = Vec::new();
        for &(child, hits) in parts {
            for &(id, distance) in hits {
                Hit { id, distance }.write_part(child, &mut words);
            }
        }
        words
    };
    let hits = pack(&[
        (0, &[(5, 0.1), (9, 0.4)]),
        (1, &[(5, 0.1), (3, 0.4), (1, 0.9)]),
    ]);
    let merged = merge.merge(3, &[1.0, 1.0], &hits).unwrap().unwrap();
    let merged = policy_packed::records(&merged, 2, Hit::read).unwrap();
    assert_eq!(merged.iter().map(|h| h.id).collect::<Vec<_>>(), [5, 3, 9]);
    let nan = pack(&[(0, &[(1, f32::NAN)])]);
    let refused = merge.merge(3, &[1.0], &nan).unwrap();
    assert!(refused.is_err(), "a NaN distance is refused by the policy");
}

mod sandbox {
    use super::super::hostile;
    use super::*;
    use std::time::{Duration, Instant};

    fn failure() -> Vec<u64> {
        let mut words = Vec::new();
        retry_failure(1, ErrorClass::Transient, 7).write(&mut words);
        words
    }

    /// The hostile retry policy built with `feature`, compiled.
    fn hostile_retry(feature: &str) -> (Arc<PolicyRuntime>, Compiled) {
        let runtime = runtime();
        let compiled = runtime
            .compile(Kind::Retry, &hostile::component(feature))
            .unwrap();
        (runtime, compiled)
    }

    /// A misbehaving call faults within its bounds, and the instance serves again afterwards
    /// (a fresh instance of the same module, which misbehaves again: the host keeps going).
    fn assert_bounded_fault(feature: &str, within: Duration) {
        let (runtime, compiled) = hostile_retry(feature);
        let mut policy = RetryInstance::new(runtime.clone(), &compiled, b"").unwrap();
        for round in 0..2 {
            let started = Instant::now();
            let answer = policy.decide(5, &failure(), &[NamesRef::unnamed()]);
            assert!(
                matches!(answer, Err(PolicyError::Fault(_))),
                "{feature} round {round}: {answer:?}"
            );
            assert!(
                started.elapsed() < within,
                "{feature} took {:?}",
                started.elapsed()
            );
        }
        // The runtime is unharmed: a well-behaved policy still answers.
        let good = runtime
            .compile(Kind::Retry, defaults::RETRY_BACKOFF)
            .unwrap();
        let mut good = RetryInstance::new(runtime, &good, b"").unwrap();
        let answer = good.decide(5, &failure(), &[NamesRef::unnamed()]).unwrap();
        assert!(matches!(
            Decision::read(answer[0]),
            Ok(Decision::RetryAfterMs(_))
        ));
    }

    #[test]
    fn an_endless_loop_is_cut_when_its_fuel_runs_out() {
        // The fuel lasts about 10 ms; the bound here only catches fuel that never runs out.
        assert_bounded_fault("spin", Duration::from_secs(5));
    }

    #[test]
    fn a_memory_bomb_stops_at_the_memory_cap() {
        assert_bounded_fault("memory-bomb", Duration::from_secs(5));
    }

    #[test]
    fn a_trap_is_a_fault_and_the_instance_is_replaced() {
        assert_bounded_fault("trap", Duration::from_secs(5));
    }

    #[test]
    fn a_fault_says_what_the_guest_wrote_before_it() {
        let (runtime, compiled) = hostile_retry("trap");
        let mut policy = RetryInstance::new(runtime, &compiled, b"").unwrap();
        match policy.decide(5, &failure(), &[NamesRef::unnamed()]) {
            Err(PolicyError::Fault(message)) => assert!(
                message.contains("it wrote:") && message.contains("a policy that panics at 5"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_module_that_imports_what_policies_are_not_granted_is_refused() {
        let refused = runtime().compile(Kind::Retry, &hostile::component("leaky"));
        assert!(
            matches!(&refused, Err(PolicyError::ForbiddenImport(names)) if names == &["leak"]),
            "{:?}",
            refused.err()
        );
    }

    #[test]
    fn a_module_that_reads_a_host_file_finds_none() {
        // Its init refuses to start if the read succeeds.
        let (runtime, compiled) = hostile_retry("files");
        RetryInstance::new(runtime, &compiled, b"").unwrap();
    }

    /// The probe answers 1-4 if it sees a real clock, a moving clock, a file or an
    /// environment, and 10,000 + bits of std's randomly seeded hasher otherwise. std draws the
    /// hasher's keys once per instance, so each draw is the first call of a fresh instance.
    #[test]
    fn the_virtual_wasi_freezes_the_clock_at_now_and_replays_its_random_bits() {
        let (runtime, compiled) = hostile_retry("wasi-probe");
        let delay_at = |now_ms: u64| {
            let mut policy = RetryInstance::new(runtime.clone(), &compiled, b"").unwrap();
            match Decision::read(
                policy
                    .decide(now_ms, &failure(), &[NamesRef::unnamed()])
                    .unwrap()[0],
            ) {
                Ok(Decision::RetryAfterMs(ms)) => ms,
                other => panic!("{other:?}"),
            }
        };
        let now_ms = 1_764_000_000_123;
        let first = delay_at(now_ms);
        assert!((10_000..11_000).contains(&first), "the probe saw {first}");
        assert_eq!(
            delay_at(now_ms),
            first,
            "the same instant draws the same bits"
        );
        let others: Vec<u64> = (1..=8).map(|n| delay_at(now_ms + n)).collect();
        assert!(
            others.iter().all(|d| (10_000..11_000).contains(d)),
            "{others:?}"
        );
        assert!(
            others.iter().any(|&d| d != first),
            "other instants draw other bits: {others:?}"
        );
    }
}

#[test]
fn the_kind_is_read_from_the_exports_without_compiling() {
    assert_eq!(exported_kind(defaults::RETRY_BACKOFF), Some(Kind::Retry));
    assert_eq!(exported_kind(defaults::AGING_THRESHOLD), Some(Kind::Aging));
    assert_eq!(exported_kind(defaults::MERGE_TOPK), Some(Kind::Merge));
    assert_eq!(exported_kind(defaults::SPLIT_HASH), Some(Kind::Split));
    assert_eq!(
        exported_kind(defaults::PRIORITY_BUCKETS),
        Some(Kind::Priority)
    );
    assert_eq!(exported_kind(b"\0asm garbage"), None);
}

/// A retry component built at commit 3c4ae0e, before the `data` interface was added to
/// `sluice:policy@0.1.0` and before the virtual WASI: it still loads, inits and decides.
#[test]
fn a_component_built_before_the_wit_grew_still_loads_and_decides() {
    const BEFORE: &[u8] = include_bytes!("../fixtures/retry-backoff-built-at-3c4ae0e.wasm");
    let runtime = runtime();
    let compiled = runtime.compile(Kind::Retry, BEFORE).unwrap();
    let mut policy = RetryInstance::new(
        runtime,
        &compiled,
        b"initial_delay_ms=100\nmax_delay_ms=100",
    )
    .unwrap();
    let mut words = Vec::new();
    retry_failure(1, ErrorClass::Transient, 7).write(&mut words);
    retry_failure(1, ErrorClass::Permanent, 7).write(&mut words);
    let decided: Vec<_> = policy
        .decide(5, &words, &[NamesRef::unnamed(); 2])
        .unwrap()
        .into_iter()
        .map(Decision::read)
        .collect();
    // Full jitter over [0, 100]: 7 % 101.
    assert_eq!(
        decided,
        [
            Ok(Decision::RetryAfterMs(7)),
            Ok(Decision::Dead(DeadReason::Permanent))
        ]
    );
}

/// A priority component built at commit 03f8947, before the `fairness` export: it still
/// loads and admits, and answers no tenant weights, so every tenant weighs the same.
#[test]
fn a_priority_component_without_fairness_loads_and_weighs_tenants_alike() {
    const BEFORE: &[u8] = include_bytes!("../fixtures/priority-buckets-built-at-03f8947.wasm");
    let runtime = runtime();
    let compiled = runtime.compile(Kind::Priority, BEFORE).unwrap();
    let mut policy = PriorityInstance::new(runtime, &compiled, b"weights=70,25,5").unwrap();
    assert_eq!(policy.bucket_weights().unwrap(), [70, 25, 5]);
    assert_eq!(policy.tenant_weights().unwrap(), None);
    let (bucket, rank, timeout) = policy
        .admit_one(
            0,
            View {
                est_exec_ms: 60_000,
                ..View::in_bucket(9, Bucket::Normal)
            }
            .words(),
            NamesRef::unnamed(),
        )
        .unwrap();
    assert_eq!((bucket, rank, timeout), (1, 9, 120_000));
}

/// Task `seq`'s names for the by-name rules.
fn named(kind: &str, tenant: &str, device: &str, ed: bool) -> sluice_model::TaskNames {
    sluice_model::TaskNames {
        kind: kind.into(),
        tenant: tenant.into(),
        device: device.into(),
        labels: if ed {
            [("ed".to_owned(), "true".to_owned())].into()
        } else {
            Default::default()
        },
    }
}

/// `policies/by-name` (kinds under `oct.`, `ed=true` and tenant `site-er` urgent) decides on
/// the names the host sends, in batches and one at a time alike.
#[test]
fn names_and_labels_reach_a_priority_component_that_reads_them() {
    let runtime = runtime();
    let compiled = runtime
        .compile(Kind::Priority, &super::hostile::by_name("priority"))
        .unwrap();
    let mut policy = PriorityInstance::new(runtime, &compiled, b"").unwrap();
    let cases = [
        (named("oct.qa", "site-a", "scanner-1", false), 0),
        (named("ct.scan", "site-a", "scanner-1", false), 2),
        (named("ct.scan", "site-a", "scanner-1", true), 0),
        (named("ct.scan", "site-er", "scanner-2", false), 0),
        (named("octopus", "site-b", "scanner-3", false), 2),
    ];
    let mut words = Vec::new();
    for (seq, _) in cases.iter().enumerate() {
        View::in_bucket(seq as u64, Bucket::Low).write(&mut words);
    }
    let names: Vec<NamesRef> = cases.iter().map(|(n, _)| n.borrowed()).collect();
    let admitted = policy.admit(0, &words, &names).unwrap();
    let buckets: Vec<u64> = admitted.chunks(3).map(|a| a[0]).collect();
    let expected: Vec<u64> = cases.iter().map(|&(_, b)| b).collect();
    assert_eq!(buckets, expected);
    for (seq, (names, bucket)) in cases.iter().enumerate() {
        let view = View::in_bucket(seq as u64, Bucket::Low);
        let (one, _, _) = policy.admit_one(0, view.words(), names.borrowed()).unwrap();
        assert_eq!(one, *bucket, "{names:?}");
    }
}

#[test]
fn names_reach_aging_and_retry_components_that_read_them() {
    let runtime = runtime();
    let compiled = runtime
        .compile(Kind::Aging, &super::hostile::by_name("aging"))
        .unwrap();
    let mut aging = AgingInstance::new(runtime.clone(), &compiled, b"").unwrap();
    let cases = [
        named("ct.scan", "site-a", "scanner-1", false),
        named("ct.scan", "site-a", "scanner-1", true),
        named("ct.scan", "site-b", "scanner-2", false),
    ];
    let mut waiting = Vec::new();
    for seq in 0..3 {
        View::in_bucket(seq, Bucket::Low).write(&mut waiting);
    }
    let names: Vec<NamesRef> = cases.iter().map(|n| n.borrowed()).collect();
    let promotions = aging.age(0, &waiting, &names).unwrap();
    assert_eq!(
        promotions
            .iter()
            .map(|p| (p.index, p.to))
            .collect::<Vec<_>>(),
        [(1, bindings::aging::sluice::policy::types::Bucket::Normal)]
    );
    let view = View::in_bucket(1, Bucket::Low);
    assert!(aging.age_one(0, view.words(), names[0]).unwrap().is_none());
    assert!(aging.age_one(0, view.words(), names[1]).unwrap().is_some());

    let compiled = runtime
        .compile(Kind::Retry, &super::hostile::by_name("retry"))
        .unwrap();
    let mut retry = RetryInstance::new(runtime, &compiled, b"").unwrap();
    let failure = retry_failure(1, ErrorClass::Transient, 7);
    let mut words = Vec::new();
    failure.write(&mut words);
    failure.write(&mut words);
    let decided: Vec<_> = retry
        .decide(0, &words, &[names[0], names[1]])
        .unwrap()
        .into_iter()
        .map(Decision::read)
        .collect();
    assert_eq!(
        decided,
        [
            Ok(Decision::Dead(DeadReason::Policy)),
            Ok(Decision::RetryAfterMs("scanner-1".len() as u64)),
        ]
    );
    let one = retry.decide_one(0, failure.words(), names[1]).unwrap();
    assert_eq!(Decision::read(one), Ok(Decision::RetryAfterMs(9)));
}
