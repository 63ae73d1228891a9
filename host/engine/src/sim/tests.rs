//! Deterministic tests of dispatch on the virtual-time driver: bucket shares, aging under a
//! flood, spread retries, the breaker's cycle, leases and tokens, callbacks, and seeded runs
//! that replay byte for byte. No threads, no sockets, no disk: every input goes through the
//! engine's step, as in the server.

use super::workload::{self, Workload};
use super::{CallbackReceiver, Driver};
use crate::{
    BreakerState, CallbackOutcome, EngineOptions, Input, MAX_CALLBACK_ATTEMPTS, NativeDecider,
    NoClaim, Report, StepError, Verdict, judge_report,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sluice_model::{Actor, FailureClass, Gpu, Heartbeat, Priority, State, Task, TaskId, TaskSpec};

pub(super) fn options() -> EngineOptions {
    EngineOptions::default()
}

pub(super) fn submit(world: &mut Driver, priority: Priority, extra: serde_json::Value) -> TaskId {
    let mut spec = json!({"kind": "oct.scan", "priority": priority});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let spec: TaskSpec = serde_json::from_value(spec).unwrap();
    let submission = spec
        .into_submission(None, &sluice_model::Limits::default())
        .unwrap();
    world.submit(submission).unwrap().task.id
}

/// `count` free GPUs of 40,000 MB.
pub(super) fn a100s(count: usize) -> Vec<Gpu> {
    (0..count)
        .map(|_| Gpu {
            model: "A100".into(),
            memory_mb: 40_000,
            free: true,
        })
        .collect()
}

pub(super) fn heartbeat(world: &mut Driver, worker: &str, gpus: usize, max_concurrency: u32) {
    let heartbeat = Heartbeat {
        gpus: a100s(gpus),
        max_concurrency,
        ..Heartbeat::default()
    };
    world.heartbeat(worker, heartbeat).unwrap();
}

/// The leases a claim got.
pub(super) fn claim(world: &mut Driver, worker: &str, max: usize) -> Vec<Task> {
    world.claim(worker, max).unwrap().leases
}

/// Why a claim got nothing.
fn refused(world: &mut Driver, worker: &str) -> Option<NoClaim> {
    world.claim(worker, 1).unwrap().refused
}

/// Reports through the step, and says how the report stood against the task before it.
pub(super) fn report(world: &mut Driver, id: TaskId, token: &str, report: Report) -> Verdict {
    let verdict = judge_report(world.now_ms(), &record(world, id), token, &report);
    let _ = world.report(id, token, report);
    verdict
}

pub(super) fn record(world: &Driver, id: TaskId) -> Task {
    world.task(id).cloned().unwrap()
}

/// Completes `task`'s attempt, which must be the current one.
pub(super) fn complete(world: &mut Driver, task: &Task) {
    let token = task.lease.as_ref().unwrap().token.clone();
    let verdict = report(
        world,
        task.id,
        &token,
        Report::Complete { result: json!(1) },
    );
    assert_eq!(verdict, Verdict::Fresh);
}

fn fail(world: &mut Driver, task: &Task, class: FailureClass) {
    let token = task.lease.as_ref().unwrap().token.clone();
    let verdict = report(
        world,
        task.id,
        &token,
        Report::Fail {
            class,
            message: "boom".into(),
        },
    );
    assert_eq!(verdict, Verdict::Fresh);
}

#[test]
fn with_every_bucket_full_ten_thousand_claims_split_60_35_5() {
    let mut world = Driver::new(1, options());
    for priority in Priority::ALL {
        for _ in 0..10_000 {
            submit(&mut world, priority, json!({}));
        }
    }
    heartbeat(&mut world, "gpu-1", 1, 1);
    let mut counts = [0usize; 3];
    for _ in 0..10_000 {
        let leased = claim(&mut world, "gpu-1", 1);
        assert_eq!(leased.len(), 1);
        counts[leased[0].bucket.index()] += 1;
        complete(&mut world, &leased[0]);
    }
    let shares = counts.map(|c| c as f64 / 10_000.0);
    for (share, want) in shares.iter().zip([0.60, 0.35, 0.05]) {
        assert!((share - want).abs() <= 0.01, "shares {shares:?}");
    }
    assert_eq!(world.engine().tasks_in(State::Completed), 10_000);
}

#[test]
fn inside_a_bucket_tasks_go_first_in_first_out() {
    let mut world = Driver::new(2, options());
    let ids: Vec<TaskId> = (0..5)
        .map(|_| submit(&mut world, Priority::Normal, json!({})))
        .collect();
    heartbeat(&mut world, "w", 0, 8);
    let claimed: Vec<TaskId> = claim(&mut world, "w", 5).iter().map(|t| t.id).collect();
    assert_eq!(claimed, ids);
}

#[test]
fn a_low_task_under_a_constant_urgent_flood_is_claimed_within_its_aging_bound() {
    // Weights that never serve the low bucket while urgent work waits: only aging (30 min to
    // normal, 30 more to urgent) can bring the low task forward.
    let decide = NativeDecider {
        bucket_weights: [100, 0, 0],
        ..NativeDecider::default()
    };
    let mut world = Driver::with_decide(3, options(), Box::new(decide));
    heartbeat(&mut world, "gpu-1", 1, 1);
    let low = submit(&mut world, Priority::Low, json!({}));
    let submitted_at = world.now_ms();
    let aging_bound_ms = 2 * 1_800_000;
    let mut claimed_at = None;
    // One claim per second; two urgent tasks arrive per second, so urgent work never runs out.
    for _ in 0..(3 * 3_600) {
        submit(&mut world, Priority::Urgent, json!({}));
        submit(&mut world, Priority::Urgent, json!({}));
        world.tick(1_000);
        heartbeat(&mut world, "gpu-1", 1, 1);
        let leased = claim(&mut world, "gpu-1", 1);
        for task in &leased {
            complete(&mut world, task);
            if task.id == low {
                claimed_at = Some(world.now_ms());
            }
        }
        if claimed_at.is_some() {
            break;
        }
    }
    let waited_ms = claimed_at.expect("the low task was never claimed") - submitted_at;
    assert!(
        waited_ms <= aging_bound_ms + 2_000,
        "waited {waited_ms} ms, bound {aging_bound_ms} ms"
    );
    assert!(
        world.engine().queues().len(Priority::Urgent) > 1000,
        "the flood went on"
    );
    let promotions = world
        .transcript()
        .lines()
        .filter(|line| line.contains(&low.to_string()) && line.contains("promoted"))
        .count();
    assert_eq!(promotions, 2, "low → normal → urgent");
}

#[test]
fn backoff_delays_of_fifty_tasks_failing_at_once_are_spread() {
    let mut world = Driver::new(4, options());
    for _ in 0..50 {
        submit(&mut world, Priority::Normal, json!({}));
    }
    heartbeat(&mut world, "gpu-1", 0, 64);
    let leased = claim(&mut world, "gpu-1", 50);
    assert_eq!(leased.len(), 50);
    for task in &leased {
        fail(&mut world, task, FailureClass::Transient);
    }
    let mut not_before: Vec<u64> = leased
        .iter()
        .map(|t| record(&world, t.id).not_before_ms.unwrap())
        .collect();
    assert!(
        leased
            .iter()
            .all(|t| record(&world, t.id).state == State::RetryWait)
    );
    not_before.sort_unstable();
    not_before.dedup();
    assert_eq!(not_before.len(), 50, "two retries share an instant");
    let spread_ms = not_before[49] - not_before[0];
    assert!(
        spread_ms > 150_000,
        "spread over only {spread_ms} ms of 300 s"
    );
}

#[test]
fn hopeless_and_exhausted_failures_are_dead_and_others_come_back_after_their_delay() {
    let mut world = Driver::new(5, options());
    let permanent = submit(&mut world, Priority::Normal, json!({}));
    let once = submit(&mut world, Priority::Normal, json!({"max_attempts": 1}));
    let retried = submit(&mut world, Priority::Normal, json!({}));
    heartbeat(&mut world, "w", 0, 8);
    let leased = claim(&mut world, "w", 3);
    fail(&mut world, &leased[0], FailureClass::Permanent);
    fail(&mut world, &leased[1], FailureClass::Transient);
    fail(&mut world, &leased[2], FailureClass::NodeBusy);
    assert_eq!(record(&world, permanent).state, State::Dead);
    assert_eq!(record(&world, once).state, State::Dead);
    assert!(
        record(&world, once)
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("attempts spent")
    );
    let waiting = &record(&world, retried);
    assert_eq!(waiting.state, State::RetryWait);
    let due = waiting.not_before_ms.unwrap();
    while world.now_ms() < due {
        assert_eq!(record(&world, retried).state, State::RetryWait);
        world.tick(10_000);
    }
    assert_eq!(record(&world, retried).state, State::Queued);
    // The failure repeated after the release is still a replay of the recorded one.
    let token = leased[2].lease.as_ref().unwrap().token.clone();
    let again = Report::Fail {
        class: FailureClass::NodeBusy,
        message: "boom".into(),
    };
    assert_eq!(report(&mut world, retried, &token, again), Verdict::Replay);
    heartbeat(&mut world, "w", 0, 8);
    let again = claim(&mut world, "w", 1);
    assert_eq!(again[0].id, retried);
    assert_eq!(again[0].attempt, 2);
}

#[test]
fn a_lease_that_expires_goes_through_retry_and_the_old_token_is_refused() {
    let mut world = Driver::new(
        6,
        EngineOptions {
            lease_ms: 5_000,
            ..options()
        },
    );
    let id = submit(&mut world, Priority::Urgent, json!({}));
    heartbeat(&mut world, "a", 0, 1);
    let first = claim(&mut world, "a", 1).remove(0);
    let old_token = first.lease.clone().unwrap().token;
    assert_eq!(
        report(&mut world, id, &old_token, Report::Start),
        Verdict::Fresh
    );
    assert_eq!(
        report(&mut world, id, &old_token, Report::Start),
        Verdict::Replay
    );
    world.tick(6_000);
    let task = record(&world, id).clone();
    assert_eq!(task.state, State::RetryWait);
    assert_eq!(task.error.as_ref().unwrap().class, "lease-expired");
    // Release it at once for the test's sake.
    while record(&world, id).state != State::Queued {
        world.tick(60_000);
    }
    heartbeat(&mut world, "b", 0, 1);
    let second = claim(&mut world, "b", 1).remove(0);
    let new_token = second.lease.clone().unwrap().token;
    assert_ne!(new_token, old_token);
    let zombie = report(
        &mut world,
        id,
        &old_token,
        Report::Complete {
            result: json!("late"),
        },
    );
    assert!(
        matches!(&zombie, Verdict::Stale { worker, attempt: 1, log: true, .. } if worker == "a"),
        "{zombie:?}"
    );
    assert_eq!(record(&world, id).state, State::Claimed);
    assert_eq!(record(&world, id).lease.as_ref().unwrap().token, new_token);
    assert_eq!(
        report(
            &mut world,
            id,
            &new_token,
            Report::Complete {
                result: json!("ok")
            }
        ),
        Verdict::Fresh
    );
    assert_eq!(
        report(
            &mut world,
            id,
            &new_token,
            Report::Complete {
                result: json!("ok")
            }
        ),
        Verdict::Replay
    );
    assert_eq!(record(&world, id).state, State::Completed);
    assert!(
        world
            .transcript()
            .contains("complete report of attempt 1 refused")
    );
}

#[test]
fn heartbeats_extend_a_lease_but_never_past_the_attempt_timeout() {
    let mut world = Driver::new(
        7,
        EngineOptions {
            lease_ms: 10_000,
            ..options()
        },
    );
    let id = submit(&mut world, Priority::Normal, json!({"est_exec_ms": 15_000}));
    heartbeat(&mut world, "a", 0, 1);
    let token = claim(&mut world, "a", 1)[0].lease.clone().unwrap().token;
    for _ in 0..3 {
        world.tick(8_000);
        assert_eq!(
            report(&mut world, id, &token, Report::Heartbeat),
            Verdict::Fresh
        );
    }
    // 24 s in: the attempt timeout (2 × 15 s) ends the attempt at 30 s despite heartbeats.
    world.tick(7_000);
    assert_eq!(record(&world, id).state, State::RetryWait);
    assert_eq!(record(&world, id).error.as_ref().unwrap().class, "timeout");
}

#[test]
fn claims_respect_labels_gpu_memory_and_concurrency() {
    let mut world = Driver::new(8, options());
    let big = submit(
        &mut world,
        Priority::Urgent,
        json!({"resources": {"gpu_memory_mb": 80_000}}),
    );
    let labelled = submit(
        &mut world,
        Priority::Urgent,
        json!({"labels": {"site": "a"}}),
    );
    let plain: Vec<TaskId> = (0..3)
        .map(|_| submit(&mut world, Priority::Urgent, json!({})))
        .collect();
    heartbeat(&mut world, "two-gpus", 2, 2);
    let leased = claim(&mut world, "two-gpus", 8);
    let ids: Vec<TaskId> = leased.iter().map(|t| t.id).collect();
    assert_eq!(
        ids,
        &plain[..2],
        "two GPUs, two tasks; no 80 GB task, no site label"
    );
    let gpus: Vec<_> = leased
        .iter()
        .map(|t| t.lease.as_ref().unwrap().gpu)
        .collect();
    assert_eq!(gpus, [Some(0), Some(1)]);
    assert!(claim(&mut world, "two-gpus", 8).is_empty());
    complete(&mut world, &leased[0]);
    assert_eq!(claim(&mut world, "two-gpus", 8)[0].id, plain[2]);
    assert_eq!(world.engine().queues().len(Priority::Urgent), 2);
    assert!(record(&world, big).state == State::Queued);
    assert!(record(&world, labelled).state == State::Queued);
}

#[test]
fn a_gpu_takes_its_share_of_max_concurrency_as_long_as_its_memory_lasts() {
    let mut world = Driver::new(16, options());
    let big: Vec<TaskId> = (0..3)
        .map(|_| {
            submit(
                &mut world,
                Priority::Urgent,
                json!({"resources": {"gpu_memory_mb": 16_000}}),
            )
        })
        .collect();
    let small: Vec<TaskId> = (0..4)
        .map(|_| {
            submit(
                &mut world,
                Priority::Urgent,
                json!({"resources": {"gpu_memory_mb": 1_000}}),
            )
        })
        .collect();
    // One GPU of 40 GB and four places: two 16 GB tasks fit, not a third; small ones fill the
    // remaining places.
    heartbeat(&mut world, "shared", 1, 4);
    let leased: Vec<TaskId> = claim(&mut world, "shared", 8)
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(leased, [big[0], big[1], small[0], small[1]]);
    assert!(
        claim(&mut world, "shared", 8).is_empty(),
        "four places, four leases"
    );
    let view = world.engine().worker(world.now_ms(), "shared").unwrap();
    assert_eq!((view.leases, view.free_gpus), (4, 0));
    // Two GPUs and max_concurrency 3: two places each, three leases in all.
    heartbeat(&mut world, "pair", 2, 3);
    assert_eq!(claim(&mut world, "pair", 8).len(), 3);
    let gpus: Vec<Option<u32>> = world
        .store()
        .tasks()
        .filter(|t| t.lease.as_ref().is_some_and(|l| l.worker == "pair"))
        .map(|t| t.lease.as_ref().unwrap().gpu)
        .collect();
    assert_eq!(
        gpus.iter().filter(|g| **g == Some(0)).count(),
        2,
        "{gpus:?}"
    );
    assert_eq!(
        gpus.iter().filter(|g| **g == Some(1)).count(),
        1,
        "{gpus:?}"
    );
}

#[test]
fn stale_and_unknown_workers_get_nothing() {
    let mut world = Driver::new(9, options());
    submit(&mut world, Priority::Normal, json!({}));
    assert_eq!(refused(&mut world, "ghost"), Some(NoClaim::UnknownWorker));
    heartbeat(&mut world, "w", 0, 1);
    world.tick(31_000);
    assert!(matches!(
        refused(&mut world, "w"),
        Some(NoClaim::Stale { .. })
    ));
    heartbeat(&mut world, "w", 0, 1);
    assert_eq!(claim(&mut world, "w", 1).len(), 1);
}

fn breaker(world: &Driver, worker: &str) -> BreakerState {
    world
        .engine
        .workers(world.now_ms())
        .into_iter()
        .find(|w| w.id == worker)
        .unwrap()
        .breaker
}

#[test]
fn the_breaker_opens_half_opens_and_closes_as_specified() {
    let mut world = Driver::new(10, options());
    for _ in 0..100 {
        submit(&mut world, Priority::Normal, json!({}));
    }
    heartbeat(&mut world, "sick", 0, 1);
    // Five failures in a row open it.
    for n in 0..5 {
        assert_eq!(breaker(&world, "sick"), BreakerState::Closed, "after {n}");
        let task = claim(&mut world, "sick", 1).remove(0);
        fail(&mut world, &task, FailureClass::Transient);
    }
    let opened_at = world.now_ms();
    assert_eq!(
        breaker(&world, "sick"),
        BreakerState::Open {
            until_ms: opened_at + 30_000
        }
    );
    assert!(matches!(
        refused(&mut world, "sick"),
        Some(NoClaim::BreakerOpen { .. })
    ));
    // After the cool-down: one probe, no more while it is out.
    world.advance_to(opened_at + 30_000);
    heartbeat(&mut world, "sick", 0, 8);
    let probe = claim(&mut world, "sick", 8);
    assert_eq!(probe.len(), 1);
    assert!(matches!(
        breaker(&world, "sick"),
        BreakerState::HalfOpen { probe: Some(_) }
    ));
    assert!(claim(&mut world, "sick", 8).is_empty());
    // The probe fails: open again, for twice as long.
    fail(&mut world, &probe[0], FailureClass::NodeBusy);
    assert_eq!(
        breaker(&world, "sick"),
        BreakerState::Open {
            until_ms: world.now_ms() + 60_000
        }
    );
    world.advance_to(world.now_ms() + 60_000);
    heartbeat(&mut world, "sick", 0, 8);
    let probe = claim(&mut world, "sick", 8);
    complete(&mut world, &probe[0]);
    assert_eq!(breaker(&world, "sick"), BreakerState::Closed);
    let changes: Vec<(String, String)> = world
        .store()
        .worker_events()
        .iter()
        .map(|e| (e.from.clone(), e.to.clone()))
        .collect();
    let expected = [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    .map(|(a, b)| (a.to_owned(), b.to_owned()));
    assert_eq!(changes, expected);
}

#[test]
fn a_failure_ratio_opens_the_breaker_without_a_run_of_failures() {
    let mut world = Driver::new(11, options());
    for _ in 0..40 {
        submit(&mut world, Priority::Normal, json!({}));
    }
    heartbeat(&mut world, "flaky", 0, 1);
    // Alternate success and failure: never 5 in a row, but 5 of 10 fail.
    for n in 0..10 {
        assert_eq!(breaker(&world, "flaky"), BreakerState::Closed, "after {n}");
        let task = claim(&mut world, "flaky", 1).remove(0);
        if n % 2 == 0 {
            complete(&mut world, &task);
        } else {
            fail(&mut world, &task, FailureClass::Timeout);
        }
    }
    assert!(matches!(
        breaker(&world, "flaky"),
        BreakerState::Open { .. }
    ));
    // Permanent failures blame the task, not the worker.
    heartbeat(&mut world, "careful", 0, 1);
    for _ in 0..6 {
        let task = claim(&mut world, "careful", 1).remove(0);
        fail(&mut world, &task, FailureClass::Permanent);
    }
    assert_eq!(breaker(&world, "careful"), BreakerState::Closed);
}

/// A day of traffic on virtual time: arrivals in three priorities, six workers of which two
/// fail a third of their attempts and one vanishes for an hour holding its leases, aging,
/// retries, deadlines. Returns the transcript.
fn day(seed: u64) -> (String, Driver) {
    let mut world = Driver::new(seed, options());
    let mut chance = SmallRng::seed_from_u64(seed);
    let workers = ["w0", "w1", "w2", "w3", "flaky-a", "flaky-b"];
    let mut held: Vec<sluice_model::Task> = Vec::new();
    let step_ms = 10_000;
    for step in 0..(24 * 360) {
        let arrivals = chance.random_range(0..4);
        for _ in 0..arrivals {
            let priority = Priority::ALL[chance.random_range(0..3)];
            let deadline = if chance.random_bool(0.1) {
                json!({"deadline_ms": 600_000})
            } else {
                json!({})
            };
            submit(&mut world, priority, deadline);
        }
        if step == 999 {
            // A burst, so the worker about to vanish surely holds work.
            for _ in 0..12 {
                submit(&mut world, Priority::Urgent, json!({}));
            }
        }
        world.tick(step_ms);
        let vanished = (1_000..1_360).contains(&step);
        for worker in workers {
            if vanished && worker == "w3" {
                continue;
            }
            heartbeat(&mut world, worker, 1, 2);
            held.extend(claim(&mut world, worker, 2));
        }
        // Every held attempt ends this step, except the vanished worker's: it goes silent
        // holding what it claimed just before, and reports it (too late) when it is back.
        let silent = (999..1_360).contains(&step);
        let mut kept = Vec::new();
        for task in held.drain(..) {
            let lease = task.lease.clone().unwrap();
            if silent && lease.worker == "w3" {
                kept.push(task);
                continue;
            }
            let flaky = lease.worker.starts_with("flaky");
            let outcome = if flaky && chance.random_bool(0.33) {
                Report::Fail {
                    class: FailureClass::Transient,
                    message: "injected".into(),
                }
            } else {
                Report::Complete {
                    result: json!(step),
                }
            };
            report(&mut world, task.id, &lease.token, outcome);
        }
        held = kept;
    }
    (world.transcript().to_owned(), world)
}

#[test]
fn a_simulated_day_replays_identically_from_its_seed_and_loses_nothing() {
    let (first, world) = day(42);
    let (second, _) = day(42);
    assert_eq!(first.len(), second.len());
    assert!(first == second, "the same seed gave another run");
    let (other, _) = day(43);
    assert_ne!(first, other, "the seed is an input");

    let states = world.store().states();
    let completed = states.get(&State::Completed).copied().unwrap_or(0);
    assert!(completed > 10_000, "{states:?}");
    // Nothing stranded: every task is terminal, waiting, or held by a live lease.
    for task in world.store().tasks() {
        match task.state {
            State::Completed | State::Dead | State::TimedOut => {}
            State::Queued | State::RetryWait | State::Claimed | State::Running => {}
            other => panic!("task {} ended {other}", task.id),
        }
        if task.state == State::Dead {
            let error = task.error.as_ref().unwrap();
            assert!(
                error.message.contains("attempts spent"),
                "dead without spending its attempts: {error:?}"
            );
        }
    }
    // The vanished worker's leases expired and went through retry; its late reports were
    // refused.
    assert!(first.contains("lease-expired"));
    assert!(first.contains(" refused: "));
    // No task completed twice.
    let mut completions = std::collections::HashMap::new();
    for line in first.lines() {
        if line.contains(" running->completed ") {
            let id = line.split(' ').nth(2).unwrap().to_owned();
            *completions.entry(id).or_insert(0) += 1;
        }
    }
    assert!(completions.values().all(|&n| n == 1));
    assert_eq!(completions.len(), completed);
}

#[test]
fn callbacks_retry_with_backoff_ignore_stale_answers_and_give_up_at_the_bound() {
    let mut world = Driver::new(12, options());
    world.set_callback_receiver(CallbackReceiver::Refuse("HTTP 503".into()));
    let id = submit(
        &mut world,
        Priority::Normal,
        json!({"callback_url": "http://example.test/done"}),
    );
    heartbeat(&mut world, "w", 0, 1);
    let leased = claim(&mut world, "w", 1).remove(0);
    complete(&mut world, &leased);
    let mut delays = Vec::new();
    for attempt in 1..=MAX_CALLBACK_ATTEMPTS {
        let due_at = record(&world, id).callback.unwrap().next_at_ms;
        world.advance_to(due_at);
        assert_eq!(world.engine().due(world.now_ms(), 10), [id]);
        // The tick hands the callback out; the receiver refuses it at once.
        world.tick(0);
        let callback = record(&world, id).callback.unwrap();
        assert_eq!(callback.attempts, attempt);
        // An answer to an older attempt changes nothing.
        let before = record(&world, id);
        world.step(Input::CallbackDone {
            id,
            attempt: attempt - 1,
            outcome: CallbackOutcome::Delivered { status: 200 },
        });
        assert_eq!(record(&world, id), before);
        delays.push(callback.next_at_ms - world.now_ms());
    }
    let ended = record(&world, id);
    assert!(ended.callback.as_ref().unwrap().gave_up);
    assert!(!ended.callback_pending());
    assert_eq!(world.engine().due(u64::MAX, 10), Vec::<TaskId>::new());
    assert_eq!(&delays[..4], [1_000, 2_000, 4_000, 8_000]);
    assert!(delays.iter().all(|&d| d <= 600_000));
    assert_eq!(ended.state, State::Completed);
}

#[test]
fn a_cancelled_probe_frees_the_half_open_breaker_and_the_worker_table_is_bounded() {
    let mut world = Driver::new(
        13,
        EngineOptions {
            max_workers: 2,
            ..options()
        },
    );
    for _ in 0..10 {
        submit(&mut world, Priority::Normal, json!({}));
    }
    heartbeat(&mut world, "sick", 0, 1);
    for _ in 0..5 {
        let task = claim(&mut world, "sick", 1).remove(0);
        fail(&mut world, &task, FailureClass::Transient);
    }
    world.advance_to(world.now_ms() + 30_000);
    heartbeat(&mut world, "sick", 0, 1);
    let probe = claim(&mut world, "sick", 1).remove(0);
    world.cancel(probe.id, Actor::api()).unwrap();
    // Its one place is held until it says it stopped.
    assert!(claim(&mut world, "sick", 1).is_empty());
    let token = probe.lease.as_ref().unwrap().token.clone();
    world.report(probe.id, &token, Report::Stopped).unwrap();
    assert_eq!(
        claim(&mut world, "sick", 1).len(),
        1,
        "a new probe goes out"
    );

    assert!(world.heartbeat("second", Heartbeat::default()).is_ok());
    assert!(world.heartbeat("third", Heartbeat::default()).is_err());
    assert!(world.heartbeat("sick", Heartbeat::default()).is_ok());
}

/// The seeded mixed workload: three priorities, shard families, flaky workers and one killed
/// a third of the way through.
#[test]
fn a_hundred_thousand_task_run_replays_byte_for_byte_and_ends_every_task() {
    let workload = Workload::mixed(7, 100_000);
    let first = workload::run(&workload);
    let second = workload::run(&workload);
    assert!(first.drained, "work was left: {:?}", first.states);
    assert_eq!(first.transcript.len(), second.transcript.len());
    assert!(
        first.transcript == second.transcript,
        "the same seed gave another run"
    );
    let submitted: usize = first.states.values().sum();
    assert!(submitted >= 100_000, "{:?}", first.states);
    assert!(first.states.keys().all(|state| state.is_terminal()));
    // Every kind of path was taken: retries, expired leases of the killed worker, families.
    for needle in [
        "lease-expired",
        "retry after",
        "split into 2 children",
        "merged by",
    ] {
        assert!(
            first.transcript.contains(needle),
            "no `{needle}` in the run"
        );
    }
    // Nothing completed twice.
    let mut completions = std::collections::HashMap::new();
    for line in first.transcript.lines() {
        if line.contains("->completed ") {
            let id = line.split(' ').nth(2).unwrap_or_default().to_owned();
            *completions.entry(id).or_insert(0u32) += 1;
        }
    }
    assert!(completions.values().all(|&n| n == 1));
    assert_eq!(completions.len(), first.states[&State::Completed]);
}

#[test]
fn junk_reports_write_nothing_and_a_stale_holder_is_logged_once_per_attempt() {
    let mut world = Driver::new(
        14,
        EngineOptions {
            lease_ms: 5_000,
            ..options()
        },
    );
    let id = submit(&mut world, Priority::Normal, json!({}));
    heartbeat(&mut world, "a", 0, 1);
    let first = claim(&mut world, "a", 1).remove(0);
    let old_token = first.lease.unwrap().token;
    let before = record(&world, id);
    let events_before = world.store().events().len();
    // Not the driver's seed: that generator drew the real token.
    let mut chance = SmallRng::seed_from_u64(0x6a75_6e6b);
    for _ in 0..100_000 {
        let junk = format!("{:032x}", chance.random::<u128>());
        let refused = world.report(id, &junk, Report::Complete { result: json!(1) });
        assert!(
            matches!(refused, Err(StepError::StaleLease { logged: false, .. })),
            "{refused:?}"
        );
    }
    assert_eq!(record(&world, id), before, "the record grew");
    assert_eq!(
        world.store().events().len(),
        events_before,
        "the timeline grew"
    );

    // The lease expires; another worker takes the second attempt. The first holder's late
    // reports are refused, logged once, in its own name.
    world.tick(6_000);
    while record(&world, id).state != State::Queued {
        world.tick(60_000);
    }
    heartbeat(&mut world, "b", 0, 1);
    let second = claim(&mut world, "b", 1).remove(0);
    assert_eq!(second.attempt, 2);
    let events_before = world.store().events().len();
    for n in 0..1_000 {
        let refused = world.report(id, &old_token, Report::Complete { result: json!(n) });
        let logged = matches!(refused, Err(StepError::StaleLease { logged: true, .. }));
        assert_eq!(logged, n == 0, "report {n}: {refused:?}");
    }
    let new_events = &world.store().events()[events_before..];
    assert_eq!(new_events.len(), 1, "{new_events:?}");
    assert_eq!(new_events[0].actor, Actor::worker("a"));
    let detail = new_events[0].detail.as_deref().unwrap_or_default();
    assert!(detail.contains("attempt 1 refused"), "{detail}");
    assert_eq!(record(&world, id).lease.unwrap().worker, "b");
}

#[test]
fn a_late_fail_after_the_lease_expired_is_stale_and_a_repeated_fail_is_a_replay() {
    let mut world = Driver::new(
        15,
        EngineOptions {
            lease_ms: 5_000,
            ..options()
        },
    );
    let expired = submit(&mut world, Priority::Normal, json!({}));
    let failed = submit(&mut world, Priority::Normal, json!({}));
    heartbeat(&mut world, "w", 0, 2);
    let leases = claim(&mut world, "w", 2);
    let token_of = |id: TaskId| {
        let lease = leases.iter().find(|t| t.id == id).unwrap();
        lease.lease.clone().unwrap().token
    };
    let fail = || Report::Fail {
        class: FailureClass::Transient,
        message: "boom".into(),
    };
    // The worker fails one attempt itself, and repeats the report: a replay, answered 200.
    assert!(world.report(failed, &token_of(failed), fail()).is_ok());
    assert_eq!(record(&world, failed).state, State::RetryWait);
    assert!(world.report(failed, &token_of(failed), fail()).is_ok());
    // The other lease expires: the scheduler fails it. The worker's late fail is stale.
    world.tick(6_000);
    assert_eq!(record(&world, expired).state, State::RetryWait);
    let late = world.report(expired, &token_of(expired), fail());
    assert!(
        matches!(late, Err(StepError::StaleLease { .. })),
        "{late:?}"
    );
    assert_eq!(
        record(&world, expired).error.unwrap().class,
        "lease-expired"
    );
}
