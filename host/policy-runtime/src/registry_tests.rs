//! The registry with real components and a real catalog in the default store: upload, activate, rollback,
//! refusals, fault fallback and deactivation, restart, and swaps under concurrent decisions.

use super::*;
use policy_packed::{Bucket, Decision, ErrorClass, Failure, View};
use sluice_model::{ExperimentSpec, NamesRef, PolicyAction, PolicyKind};
use sluice_store_sled::{SledOptions, SledStore};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

fn runtime() -> Arc<PolicyRuntime> {
    static RUNTIME: OnceLock<Arc<PolicyRuntime>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| Arc::new(PolicyRuntime::new(RuntimeOptions::default()).unwrap()))
        .clone()
}

fn open(dir: &std::path::Path, options: RegistryOptions) -> (Arc<SledStore>, PolicyRegistry) {
    let store = Arc::new(
        SledStore::reopen(
            dir,
            &SledOptions {
                fdatasync: false,
                ..SledOptions::default()
            },
        )
        .unwrap(),
    );
    let registry = PolicyRegistry::open(runtime(), store.clone(), options).unwrap();
    (store, registry)
}

fn meta(seq: u64, bucket: Bucket, est_exec_ms: u64) -> View {
    View {
        est_exec_ms,
        ..View::in_bucket(seq, bucket)
    }
}

/// The attempt timeout the active priority policy gives a normal task of 1 s.
fn normal_timeout(registry: &PolicyRegistry) -> (u64, u32) {
    let decided = registry
        .admit(
            0,
            None,
            &[meta(1, Bucket::Normal, 1000)],
            &[NamesRef::unnamed()],
        )
        .unwrap();
    (decided.answer[0].attempt_timeout_ms, decided.version)
}

#[test]
fn upload_activate_and_rollback_change_the_next_decision() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, registry) = open(dir.path(), RegistryOptions::default());
    assert_eq!(normal_timeout(&registry), (2000, 0));

    let uploaded = registry
        .upload(
            Kind::Priority,
            defaults::PRIORITY_BUCKETS,
            Some("normal_timeout_factor=5".into()),
            10,
        )
        .unwrap();
    assert!(uploaded.created);
    assert_eq!(uploaded.version.version, 1);
    // Stored, not active.
    assert_eq!(normal_timeout(&registry), (2000, 0));
    // The same bytes and config are the same version.
    let again = registry
        .upload(
            Kind::Priority,
            defaults::PRIORITY_BUCKETS,
            Some("normal_timeout_factor=5".into()),
            11,
        )
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.version.version, 1);

    registry.activate(Kind::Priority, 1, 20).unwrap();
    assert_eq!(normal_timeout(&registry), (5000, 1));

    let status = registry.rollback(Kind::Priority, 30).unwrap();
    assert_eq!(status.active_version, 0);
    assert_eq!(normal_timeout(&registry), (2000, 0));
    assert!(matches!(
        registry.rollback(Kind::Priority, 40),
        Err(RegistryError::NothingToRollBack(Kind::Priority))
    ));
    assert!(matches!(
        registry.activate(Kind::Priority, 9, 50),
        Err(RegistryError::UnknownVersion { version: 9, .. })
    ));

    let actions: Vec<_> = registry
        .detail(Kind::Priority)
        .unwrap()
        .events
        .iter()
        .map(|e| (e.action, e.version, e.from))
        .collect();
    assert_eq!(
        actions,
        [
            (PolicyAction::Uploaded, 1, None),
            (PolicyAction::Activated, 1, Some(0)),
            (PolicyAction::RolledBack, 0, Some(1)),
        ]
    );
}

#[test]
fn the_servers_config_reaches_the_builtin_version_and_a_bad_one_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let options = RegistryOptions {
        configs: [(Kind::Priority, "normal_timeout_factor=4\n".to_owned())].into(),
        ..RegistryOptions::default()
    };
    let (store, registry) = open(dir.path(), options);
    assert_eq!(normal_timeout(&registry), (4000, 0));
    drop(registry);
    let bad = RegistryOptions {
        configs: [(Kind::Retry, "initial_delay=5\n".to_owned())].into(),
        ..RegistryOptions::default()
    };
    let opened = PolicyRegistry::open(runtime(), store, bad);
    assert!(
        matches!(
            &opened,
            Err(RegistryError::Builtin {
                kind: Kind::Retry,
                ..
            })
        ),
        "{:?}",
        opened.err()
    );
}

#[test]
fn the_active_version_and_compiled_code_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, registry) = open(dir.path(), RegistryOptions::default());
        let uploaded = registry
            .upload(
                Kind::Priority,
                defaults::PRIORITY_BUCKETS,
                Some("normal_timeout_factor=3".into()),
                1,
            )
            .unwrap();
        registry.activate(Kind::Priority, 1, 2).unwrap();
        let sha = &uploaded.version.sha256;
        let cached = store
            .policies_compiled_keys()
            .into_iter()
            .any(|key| key.starts_with(sha.as_str()));
        assert!(cached, "the compiled code of {sha} is cached");
    }
    let (_store, registry) = open(dir.path(), RegistryOptions::default());
    assert_eq!(normal_timeout(&registry), (3000, 1));
    assert_eq!(registry.status(Kind::Priority).fallback_versions, [0]);
}

fn failure(seq: u64) -> Failure {
    Failure {
        task: View {
            attempt: 1,
            est_exec_ms: 1000,
            ..View::in_bucket(seq, Bucket::Normal)
        },
        class: ErrorClass::Transient,
        max_attempts: 3,
        random: 7,
    }
}

/// The task `seq` the `late-*` hostile policies misbehave on.
const LATE_SEQ: u64 = 424_242;

/// A version that faults only later is replaced by the one before it for each faulting
/// decision, and deactivated after the limit, as an event.
fn assert_late_faults_fall_back_then_deactivate(feature: &str) {
    let dir = tempfile::tempdir().unwrap();
    let options = RegistryOptions {
        fault_limit: FaultLimit {
            max_faults: 3,
            window_ms: 1000,
        },
        ..RegistryOptions::default()
    };
    let (_store, registry) = open(dir.path(), options);
    let late = super::hostile::component(feature);
    let uploaded = registry.upload(Kind::Retry, &late, None, 0).unwrap();
    registry
        .activate(Kind::Retry, uploaded.version.version, 0)
        .unwrap();

    let fine = registry
        .retry(100, None, &[failure(1)], &[NamesRef::unnamed()])
        .unwrap();
    assert_eq!(fine.version, 1);
    assert!(matches!(fine.answer[0], Decision::RetryAfterMs(1100)));

    // Faults spread wider than the window do not add up.
    for now_ms in [1_000, 3_000] {
        let replaced = registry
            .retry(now_ms, None, &[failure(LATE_SEQ)], &[NamesRef::unnamed()])
            .unwrap();
        assert_eq!((replaced.version, replaced.fallbacks), (0, 1), "{feature}");
    }
    assert_eq!(registry.status(Kind::Retry).active_version, 1);
    for now_ms in [5_000, 5_001, 5_002] {
        let replaced = registry
            .retry(now_ms, None, &[failure(LATE_SEQ)], &[NamesRef::unnamed()])
            .unwrap();
        assert_eq!(replaced.version, 0);
    }
    let status = registry.status(Kind::Retry);
    assert_eq!(status.active_version, 0, "{feature}: deactivated");
    assert_eq!(status.counters.faults_total, 5);
    assert_eq!(status.counters.deactivations_total, 1);
    let last = registry.detail(Kind::Retry).unwrap().events.pop().unwrap();
    assert_eq!(
        (last.action, last.version, last.from),
        (PolicyAction::Deactivated, 0, Some(1))
    );
    assert_eq!(
        registry
            .retry(6_000, None, &[failure(1)], &[NamesRef::unnamed()])
            .unwrap()
            .version,
        0
    );
}

#[test]
fn a_version_that_traps_later_falls_back_and_is_deactivated() {
    assert_late_faults_fall_back_then_deactivate("late-trap");
}

#[test]
fn a_version_that_answers_nonsense_later_falls_back_and_is_deactivated() {
    assert_late_faults_fall_back_then_deactivate("late-nonsense");
}

#[test]
fn hostile_uploads_are_refused_at_the_check_they_fail_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, registry) = open(dir.path(), RegistryOptions::default());
    /// (name, kind, component, config, the check that must refuse it)
    type Case<'a> = (&'a str, Kind, Vec<u8>, Option<&'a str>, Check);
    let cases: [Case; 7] = [
        (
            "garbage",
            Kind::Retry,
            b"\0asm\x0d\0\x01\0 not really".to_vec(),
            None,
            Check::Compile,
        ),
        (
            "wrong world",
            Kind::Merge,
            defaults::RETRY_BACKOFF.to_vec(),
            None,
            Check::World,
        ),
        (
            "leaky",
            Kind::Retry,
            super::hostile::component("leaky"),
            None,
            Check::Imports,
        ),
        (
            "spin",
            Kind::Retry,
            super::hostile::component("spin"),
            None,
            Check::Conformance,
        ),
        (
            "memory bomb",
            Kind::Retry,
            super::hostile::component("memory-bomb"),
            None,
            Check::Conformance,
        ),
        (
            "trap",
            Kind::Retry,
            super::hostile::component("trap"),
            None,
            Check::Conformance,
        ),
        (
            "unknown setting",
            Kind::Retry,
            defaults::RETRY_BACKOFF.to_vec(),
            Some("nope=1"),
            Check::Init,
        ),
    ];
    for (name, kind, bytes, config, check) in cases {
        let refused = registry.upload(kind, &bytes, config.map(str::to_owned), 0);
        match refused {
            Err(RegistryError::Refused { check: got, .. }) => assert_eq!(got, check, "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        assert!(registry.detail(kind).unwrap().versions.is_empty(), "{name}");
        assert_eq!(registry.status(kind).active_version, 0, "{name}");
    }
}

#[test]
fn swaps_under_concurrent_decisions_never_fail_or_mix_versions() {
    let dir = tempfile::tempdir().unwrap();
    let (_store, registry) = open(dir.path(), RegistryOptions::default());
    let registry = Arc::new(registry);
    for factor in ["2", "3"] {
        registry
            .upload(
                Kind::Priority,
                defaults::PRIORITY_BUCKETS,
                Some(format!("normal_timeout_factor={factor}")),
                0,
            )
            .unwrap();
    }
    registry.activate(Kind::Priority, 1, 0).unwrap();
    const THREADS: u64 = 4;
    const DECISIONS_PER_THREAD: u64 = 25_000;
    let swapping = Arc::new(AtomicBool::new(true));
    let by_version = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let deciders: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (registry, by_version) = (registry.clone(), by_version.clone());
            std::thread::spawn(move || {
                let batch: Vec<View> = (0..4)
                    .map(|n| meta(thread * 10 + n, Bucket::Normal, 1000 + n))
                    .collect();
                for _ in 0..DECISIONS_PER_THREAD {
                    let decided = registry
                        .admit(0, None, &batch, &vec![NamesRef::unnamed(); batch.len()])
                        .expect("a decision never fails");
                    assert_eq!(decided.fallbacks, 0);
                    let factor = match decided.version {
                        1 => 2,
                        2 => 3,
                        other => panic!("decided by version {other}"),
                    };
                    for (task, admission) in batch.iter().zip(&decided.answer) {
                        assert_eq!(
                            admission.attempt_timeout_ms,
                            task.est_exec_ms * factor,
                            "every answer of one decision comes from its one version"
                        );
                    }
                    by_version[decided.version as usize - 1].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let mut swaps = 0;
    while swaps < 20 {
        let target = if swaps % 2 == 0 { 2 } else { 1 };
        registry.activate(Kind::Priority, target, swaps).unwrap();
        swaps += 1;
        // Let some decisions land on each version before the next swap.
        let seen = by_version[0].load(Ordering::Relaxed) + by_version[1].load(Ordering::Relaxed);
        while swapping.load(Ordering::Relaxed)
            && by_version[0].load(Ordering::Relaxed) + by_version[1].load(Ordering::Relaxed)
                < seen + 2_000
            && !deciders.iter().all(|d| d.is_finished())
        {
            std::thread::yield_now();
        }
    }
    swapping.store(false, Ordering::Relaxed);
    for decider in deciders {
        decider.join().unwrap();
    }
    let counts = [
        by_version[0].load(Ordering::Relaxed),
        by_version[1].load(Ordering::Relaxed),
    ];
    assert_eq!(counts[0] + counts[1], THREADS * DECISIONS_PER_THREAD);
    assert!(counts[0] > 0 && counts[1] > 0, "{counts:?}");
    assert_eq!(swaps, 20);
    assert_eq!(registry.status(Kind::Priority).counters.faults_total, 0);
    let activations = registry
        .detail(PolicyKind::Priority)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.action == PolicyAction::Activated)
        .count();
    assert_eq!(activations, 21);
}

fn spec(kind: Kind, mode: sluice_model::ExperimentMode, versions: &[u32]) -> ExperimentSpec {
    ExperimentSpec {
        kind,
        mode,
        assign_by: sluice_model::AssignBy::Task,
        variants: versions
            .iter()
            .enumerate()
            .map(|(i, &version)| sluice_model::VariantSpec {
                name: format!("v{i}"),
                version,
                weight: 1,
            })
            .collect(),
    }
}

#[test]
fn a_live_variant_decides_for_its_tasks_only_until_its_experiment_ends() {
    use sluice_model::{ExperimentMode, VariantTag};
    let dir = tempfile::tempdir().unwrap();
    let (_store, registry) = open(dir.path(), RegistryOptions::default());
    let slow = registry
        .upload(
            Kind::Priority,
            defaults::PRIORITY_BUCKETS,
            Some("normal_timeout_factor=5".into()),
            0,
        )
        .unwrap()
        .version
        .version;
    let experiment = registry
        .start_experiment(spec(Kind::Priority, ExperimentMode::Live, &[0, slow]), 10)
        .unwrap();
    assert_eq!(registry.live_experiments().len(), 1);
    let tag = |variant| VariantTag {
        kind: Kind::Priority,
        experiment: experiment.id,
        variant,
    };
    let timeout = |variant: Option<VariantTag>| {
        let decided = registry
            .admit(
                0,
                variant,
                &[meta(1, Bucket::Normal, 1000)],
                &[NamesRef::unnamed()],
            )
            .unwrap();
        (decided.answer[0].attempt_timeout_ms, decided.version)
    };
    assert_eq!(timeout(Some(tag(1))), (5000, slow));
    assert_eq!(timeout(Some(tag(0))), (2000, 0));
    assert_eq!(
        timeout(None),
        (2000, 0),
        "a task in no variant: the active one"
    );
    // A tag of another experiment, or past the variants, is the active version's.
    assert_eq!(
        timeout(Some(VariantTag {
            experiment: 99,
            ..tag(1)
        })),
        (2000, 0)
    );
    assert_eq!(timeout(Some(tag(7))), (2000, 0));
    let figures = registry.variant_figures(&experiment).unwrap();
    assert_eq!(figures[1].decisions_total, 1);

    // One per kind.
    let second =
        registry.start_experiment(spec(Kind::Priority, ExperimentMode::Live, &[0, slow]), 11);
    assert!(
        matches!(second, Err(RegistryError::ExperimentConflict(_))),
        "{second:?}"
    );
    let ended = registry.stop_experiment(experiment.id, 20).unwrap();
    assert_eq!(ended.ended_at_ms, Some(20));
    assert!(registry.live_experiments().is_empty());
    assert_eq!(
        timeout(Some(tag(1))),
        (2000, 0),
        "ended: the active version decides"
    );
    assert_eq!(
        registry.variant_figures(&ended).unwrap()[1].decisions_total,
        1
    );
    let actions: Vec<PolicyAction> = registry
        .detail(Kind::Priority)
        .unwrap()
        .events
        .iter()
        .map(|e| e.action)
        .collect();
    assert!(actions.ends_with(&[
        PolicyAction::ExperimentStarted,
        PolicyAction::ExperimentStopped
    ]));
}

#[test]
fn a_faulting_shadow_variant_is_counted_and_never_touches_the_active_answer() {
    use sluice_model::ExperimentMode;
    let dir = tempfile::tempdir().unwrap();
    let (store, registry) = open(dir.path(), RegistryOptions::default());
    let late = super::hostile::component("late-trap");
    let version = registry
        .upload(Kind::Retry, &late, None, 0)
        .unwrap()
        .version
        .version;
    let experiment = registry
        .start_experiment(spec(Kind::Retry, ExperimentMode::Shadow, &[version]), 0)
        .unwrap();
    assert!(
        registry.live_experiments().is_empty(),
        "shadow assigns nothing"
    );
    for now_ms in 0..10 {
        let decided = registry
            .retry(now_ms, None, &[failure(LATE_SEQ)], &[NamesRef::unnamed()])
            .unwrap();
        assert_eq!((decided.version, decided.fallbacks), (0, 0));
    }
    let answered = registry
        .retry(10, None, &[failure(1)], &[NamesRef::unnamed()])
        .unwrap();
    assert_eq!(answered.version, 0);
    let figures = &registry.variant_figures(&experiment).unwrap()[0];
    assert_eq!(figures.decisions_total, 11);
    assert_eq!(figures.faults_total, 10);
    // Its one answer is compared (it backs off otherwise than the built-in one: a sample).
    assert_eq!(figures.compared_total, 1);
    assert_eq!(
        figures.disagreement_samples.len() as u64,
        figures.disagreements_total
    );
    let status = registry.status(Kind::Retry);
    assert_eq!(
        (status.active_version, status.counters.deactivations_total),
        (0, 0)
    );

    // It resumes, running, after a restart.
    drop((store, registry));
    let (_store, registry) = open(dir.path(), RegistryOptions::default());
    assert!(registry.experiment(experiment.id).unwrap().is_running());
    registry
        .retry(20, None, &[failure(LATE_SEQ)], &[NamesRef::unnamed()])
        .unwrap();
    assert_eq!(
        registry.variant_figures(&experiment).unwrap()[0].faults_total,
        1
    );
}

#[test]
fn a_live_retry_variant_decides_for_its_failures_in_batches_and_alone() {
    use sluice_model::{ExperimentMode, VariantTag};
    let dir = tempfile::tempdir().unwrap();
    let (_store, registry) = open(dir.path(), RegistryOptions::default());
    // Full jitter over [0, ceiling]: a random far past the 10 ms ceiling tells the versions
    // apart.
    let short = registry
        .upload(
            Kind::Retry,
            defaults::RETRY_BACKOFF,
            Some("initial_delay_ms=10\nmax_delay_ms=10".into()),
            0,
        )
        .unwrap()
        .version
        .version;
    let experiment = registry
        .start_experiment(spec(Kind::Retry, ExperimentMode::Live, &[0, short]), 10)
        .unwrap();
    let tag = VariantTag {
        kind: Kind::Retry,
        experiment: experiment.id,
        variant: 1,
    };
    let far = Failure {
        random: 1_000_000,
        ..failure(1)
    };
    let delays = |variant: Option<VariantTag>, failures: &[Failure]| {
        let names = vec![NamesRef::unnamed(); failures.len()];
        let decided = registry.retry(20, variant, failures, &names).unwrap();
        let delays: Vec<u64> = decided
            .answer
            .iter()
            .map(|d| match d {
                Decision::RetryAfterMs(ms) => *ms,
                Decision::Dead(reason) => panic!("dead: {reason:?}"),
            })
            .collect();
        (delays, decided.version)
    };
    assert_eq!(delays(Some(tag), &[far]), (vec![1_000_000 % 11], short));
    let (builtin, version) = delays(None, &[far]);
    assert_eq!(version, 0, "a task in no variant: the active one");
    assert_ne!(builtin, [1_000_000 % 11]);
    assert_eq!(
        delays(Some(tag), &[far, far]),
        (vec![1_000_000 % 11; 2], short),
        "a batch"
    );
    let figures = registry.variant_figures(&experiment).unwrap();
    assert_eq!(figures[1].decisions_total, 2, "one per call");
}

#[test]
fn a_rollout_steps_through_its_shares_then_activates_or_rolls_back() {
    use sluice_model::{AssignBy, BUILTIN_VERSION, ExperimentEnd, RolloutSpec, RolloutState};
    let dir = tempfile::tempdir().unwrap();
    let (_store, registry) = open(dir.path(), RegistryOptions::default());
    let version = registry
        .upload(Kind::Aging, defaults::AGING_THRESHOLD, None, 0)
        .unwrap()
        .version
        .version;
    let spec = || RolloutSpec {
        kind: Kind::Aging,
        version,
        steps: vec![10, 50, 100],
        step_ms: 1_000,
        guards: vec!["faults == 0".into()],
        min_tasks: 1,
        assign_by: AssignBy::Task,
    };
    let first = registry.start_rollout(spec(), 10).unwrap();
    let weights: Vec<u32> = first.variants.iter().map(|v| v.weight).collect();
    assert_eq!(weights, [90, 10]);
    assert_eq!(first.rollout.as_ref().unwrap().rollout, first.id);
    let second = registry
        .advance_rollout(first.id, vec!["faults == 0 held: 0".into()], 20)
        .unwrap();
    assert_eq!(second.variants[1].weight, 50);
    assert_eq!(second.rollout.as_ref().unwrap().rollout, first.id);
    assert_eq!(registry.live_experiments().len(), 1);
    let done = registry.advance_rollout(second.id, vec![], 30).unwrap();
    assert!(matches!(done.end, Some(ExperimentEnd::Promoted { .. })));
    assert_eq!(registry.status(Kind::Aging).active_version, version);
    assert!(registry.live_experiments().is_empty());
    let all = sluice_model::rollouts(&registry.experiments().unwrap());
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].state, RolloutState::Completed);
    assert_eq!(all[0].history.len(), 2);

    // Back to the built-in one, rolled back at its first step.
    let back = RolloutSpec {
        version: BUILTIN_VERSION,
        ..spec()
    };
    let step = registry.start_rollout(back, 40).unwrap();
    registry
        .roll_back_rollout(step.id, "faults == 0".into(), "3 faults".into(), vec![], 50)
        .unwrap();
    assert_eq!(registry.status(Kind::Aging).active_version, version);
    let last = registry.detail(Kind::Aging).unwrap().events.pop().unwrap();
    assert_eq!(last.action, PolicyAction::RolloutRolledBack);
    assert!(
        last.reason
            .unwrap()
            .contains("rolled back at step 1 (10 %): 3 faults")
    );
    // The active version cannot be rolled out onto itself.
    let same = registry.start_rollout(spec(), 60).unwrap_err();
    assert!(same.to_string().contains("already the active"), "{same}");
}
