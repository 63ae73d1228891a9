//! The embedded default components, compiled and called through wasmtime.

use super::bindings;
use super::defaults;
use super::*;
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

#[test]
fn retry_backoff_decides_through_wasm_and_init_checks_its_config() {
    use bindings::retry::exports::sluice::policy::retry::{Decision, ErrorClass, Failure};
    use bindings::retry::sluice::policy::types::{Bucket, TaskView};
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
    let failure = |attempt, class, random| Failure {
        task: TaskView {
            seq: 1,
            tenant: 0,
            kind: 0,
            bucket: Bucket::Normal,
            submitted_bucket: Bucket::Normal,
            created_ms: 0,
            bucket_since_ms: 0,
            attempt,
            est_exec_ms: 1000,
        },
        class,
        max_attempts: 3,
        random,
    };
    let decisions = retry
        .decide(
            5,
            &[
                failure(1, ErrorClass::Transient, 50),
                failure(2, ErrorClass::NodeBusy, 1_000_000 + 150),
                failure(1, ErrorClass::Permanent, 0),
                failure(3, ErrorClass::Timeout, 0),
            ],
        )
        .unwrap();
    assert!(matches!(decisions[0], Decision::RetryAfterMs(50)));
    assert!(matches!(decisions[1], Decision::RetryAfterMs(ms) if ms == (1_000_000 + 150) % 201));
    assert!(matches!(decisions[2], Decision::Dead(_)));
    assert!(matches!(decisions[3], Decision::Dead(_)));

    let refused = RetryInstance::new(runtime.clone(), &compiled, b"initial_delay_ms=0");
    assert!(matches!(refused, Err(PolicyError::Init(_))));
    let unknown = RetryInstance::new(runtime, &compiled, b"retry_forever=true");
    assert!(matches!(unknown, Err(PolicyError::Init(reason)) if reason.contains("retry_forever")));
}

#[test]
fn priority_aging_split_and_merge_defaults_answer_through_wasm() {
    let runtime = runtime();

    use bindings::priority::sluice::policy::types as ptypes;
    let compiled = runtime
        .compile(Kind::Priority, defaults::PRIORITY_BUCKETS)
        .unwrap();
    let mut priority = PriorityInstance::new(runtime.clone(), &compiled, b"").unwrap();
    assert_eq!(priority.bucket_weights().unwrap(), [60, 35, 5]);
    let meta = ptypes::TaskMeta {
        view: ptypes::TaskView {
            seq: 42,
            tenant: 1,
            kind: 2,
            bucket: ptypes::Bucket::Low,
            submitted_bucket: ptypes::Bucket::Low,
            created_ms: 0,
            bucket_since_ms: 0,
            attempt: 0,
            est_exec_ms: 30_000,
        },
        kind_name: "oct.analyze".into(),
        tenant_name: "site-a".into(),
        device: "scanner-1".into(),
        labels: vec![("model".into(), "v2".into())],
    };
    let admitted = priority.admit(0, &[meta]).unwrap();
    assert_eq!(admitted.len(), 1);
    assert_eq!(
        (
            admitted[0].bucket,
            admitted[0].rank,
            admitted[0].attempt_timeout_ms
        ),
        (ptypes::Bucket::Low, 42, 90_000)
    );

    use bindings::aging::sluice::policy::types as atypes;
    let compiled = runtime
        .compile(Kind::Aging, defaults::AGING_THRESHOLD)
        .unwrap();
    let mut aging = AgingInstance::new(runtime.clone(), &compiled, b"low_to_normal_ms=10").unwrap();
    let view = |bucket, since| atypes::TaskView {
        seq: 0,
        tenant: 0,
        kind: 0,
        bucket,
        submitted_bucket: atypes::Bucket::Low,
        created_ms: 0,
        bucket_since_ms: since,
        attempt: 0,
        est_exec_ms: 0,
    };
    let promotions = aging
        .age(
            100,
            &[view(atypes::Bucket::Low, 95), view(atypes::Bucket::Low, 90)],
        )
        .unwrap();
    assert_eq!(
        promotions
            .iter()
            .map(|p| (p.index, p.to))
            .collect::<Vec<_>>(),
        [(1, atypes::Bucket::Normal)]
    );

    use bindings::split::exports::sluice::policy::split::{ShardFilter, SplitRequest};
    use bindings::split::sluice::policy::types as stypes;
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

    use bindings::merge::exports::sluice::policy::merge::{Hit, Part};
    let compiled = runtime.compile(Kind::Merge, defaults::MERGE_TOPK).unwrap();
    let mut merge = MergeInstance::new(runtime, &compiled, b"").unwrap();
    let part = |child, hits: &[(u64, f32)]| Part {
        child,
        weight: 1.0,
        hits: hits
            .iter()
            .map(|&(id, distance)| Hit { id, distance })
            .collect(),
    };
    let merged = merge
        .merge(
            3,
            &[
                part(0, &[(5, 0.1), (9, 0.4)]),
                part(1, &[(5, 0.1), (3, 0.4), (1, 0.9)]),
            ],
        )
        .unwrap()
        .unwrap();
    assert_eq!(merged.iter().map(|h| h.id).collect::<Vec<_>>(), [5, 3, 9]);
    let refused = merge.merge(3, &[part(0, &[(1, f32::NAN)])]).unwrap();
    assert!(refused.is_err(), "a NaN distance is refused by the policy");
}

mod sandbox {
    use super::super::hostile;
    use super::*;
    use bindings::retry::exports::sluice::policy::retry::{Decision, ErrorClass, Failure};
    use bindings::retry::sluice::policy::types::{Bucket, TaskView};
    use std::time::{Duration, Instant};

    fn failure() -> Failure {
        Failure {
            task: TaskView {
                seq: 1,
                tenant: 0,
                kind: 0,
                bucket: Bucket::Low,
                submitted_bucket: Bucket::Low,
                created_ms: 0,
                bucket_since_ms: 0,
                attempt: 1,
                est_exec_ms: 10,
            },
            class: ErrorClass::Transient,
            max_attempts: 3,
            random: 7,
        }
    }

    /// A misbehaving call faults within its bounds, and the instance serves again afterwards
    /// (a fresh instance of the same module, which misbehaves again: the host keeps going).
    fn assert_bounded_fault(feature: &str, within: Duration) {
        let runtime = runtime();
        let compiled = runtime
            .compile(Kind::Retry, &hostile::component(feature))
            .unwrap();
        let mut policy = RetryInstance::new(runtime.clone(), &compiled, b"").unwrap();
        for round in 0..2 {
            let started = Instant::now();
            let answer = policy.decide(5, &[failure()]);
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
        assert!(matches!(
            good.decide(5, &[failure()]).unwrap()[0],
            Decision::RetryAfterMs(_)
        ));
    }

    #[test]
    fn an_endless_loop_is_cut_at_the_deadline() {
        // The deadline is 10 ms; the bound here only catches a deadline that never fires.
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
    fn a_module_that_imports_the_filesystem_is_refused() {
        let refused = runtime().compile(Kind::Retry, &hostile::component("files"));
        assert!(
            matches!(&refused, Err(PolicyError::ForbiddenImport(names))
                if names.iter().any(|n| n.starts_with("wasi:filesystem/"))),
            "{:?}",
            refused.err()
        );
    }
}
