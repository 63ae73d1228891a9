//! Deterministic tests of dispatch: bucket shares, aging under a flood, spread retries, the
//! breaker's cycle, leases and tokens, and a seeded day-long run that replays exactly. No
//! threads, no sockets, no store: the `sim` shell drives the engine on virtual time.

use super::sim::World;
use super::{BreakerState, EngineOptions, NoClaim, Report, Verdict};
use crate::model::{FailureClass, Priority, State, TaskId};
use rand::Rng;
use serde_json::json;

fn options() -> EngineOptions {
    EngineOptions::default()
}

fn complete(world: &mut World, task: &crate::model::Task) {
    let token = task.lease.as_ref().unwrap().token.clone();
    let verdict = world.report(task.id, &token, Report::Complete { result: json!(1) });
    assert_eq!(verdict, Verdict::Fresh);
}

fn fail(world: &mut World, task: &crate::model::Task, class: FailureClass) {
    let token = task.lease.as_ref().unwrap().token.clone();
    let verdict = world.report(
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
    let mut world = World::new(1, options());
    for priority in Priority::ALL {
        for _ in 0..10_000 {
            world.submit(priority, json!({}));
        }
    }
    world.heartbeat("gpu-1", 1, 1);
    let mut counts = [0usize; 3];
    for _ in 0..10_000 {
        let leased = world.claim("gpu-1", 1);
        assert_eq!(leased.len(), 1);
        counts[leased[0].bucket.index()] += 1;
        complete(&mut world, &leased[0]);
    }
    let shares = counts.map(|c| c as f64 / 10_000.0);
    for (share, want) in shares.iter().zip([0.60, 0.35, 0.05]) {
        assert!((share - want).abs() <= 0.01, "shares {shares:?}");
    }
    assert_eq!(world.engine.tasks_in(State::Completed), 10_000);
}

#[test]
fn inside_a_bucket_tasks_go_first_in_first_out() {
    let mut world = World::new(2, options());
    let ids: Vec<TaskId> = (0..5)
        .map(|_| world.submit(Priority::Normal, json!({})))
        .collect();
    world.heartbeat("w", 0, 8);
    let claimed: Vec<TaskId> = world.claim("w", 5).iter().map(|t| t.id).collect();
    assert_eq!(claimed, ids);
}

#[test]
fn a_low_task_under_a_constant_urgent_flood_is_claimed_within_its_aging_bound() {
    // Weights that never serve the low bucket while urgent work waits: only aging (30 min to
    // normal, 30 more to urgent) can bring the low task forward.
    let mut world = World::new(3, options());
    world.engine.set_bucket_weights([100, 0, 0]);
    world.heartbeat("gpu-1", 1, 1);
    let low = world.submit(Priority::Low, json!({}));
    let submitted_at = world.now_ms;
    let aging_bound_ms = 2 * 1_800_000;
    let mut claimed_at = None;
    // One claim per second; two urgent tasks arrive per second, so urgent work never runs out.
    for _ in 0..(3 * 3_600) {
        world.submit(Priority::Urgent, json!({}));
        world.submit(Priority::Urgent, json!({}));
        world.tick(1_000, 1_000);
        world.heartbeat("gpu-1", 1, 1);
        let leased = world.claim("gpu-1", 1);
        for task in &leased {
            complete(&mut world, task);
            if task.id == low {
                claimed_at = Some(world.now_ms);
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
        world.engine.queues().len(Priority::Urgent) > 1000,
        "the flood went on"
    );
    let promotions = world
        .log
        .iter()
        .filter(|line| line.contains(&low.to_string()) && line.contains("promoted"))
        .count();
    assert_eq!(promotions, 2, "low → normal → urgent");
}

#[test]
fn backoff_delays_of_fifty_tasks_failing_at_once_are_spread() {
    let mut world = World::new(4, options());
    for _ in 0..50 {
        world.submit(Priority::Normal, json!({}));
    }
    world.heartbeat("gpu-1", 0, 64);
    let leased = world.claim("gpu-1", 50);
    assert_eq!(leased.len(), 50);
    for task in &leased {
        fail(&mut world, task, FailureClass::Transient);
    }
    let mut not_before: Vec<u64> = leased
        .iter()
        .map(|t| world.tasks[&t.id].not_before_ms.unwrap())
        .collect();
    assert!(
        leased
            .iter()
            .all(|t| world.tasks[&t.id].state == State::RetryWait)
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
    let mut world = World::new(5, options());
    let permanent = world.submit(Priority::Normal, json!({}));
    let once = world.submit(Priority::Normal, json!({"max_attempts": 1}));
    let retried = world.submit(Priority::Normal, json!({}));
    world.heartbeat("w", 0, 8);
    let leased = world.claim("w", 3);
    fail(&mut world, &leased[0], FailureClass::Permanent);
    fail(&mut world, &leased[1], FailureClass::Transient);
    fail(&mut world, &leased[2], FailureClass::NodeBusy);
    assert_eq!(world.tasks[&permanent].state, State::Dead);
    assert_eq!(world.tasks[&once].state, State::Dead);
    assert!(
        world.tasks[&once]
            .error
            .as_ref()
            .unwrap()
            .message
            .contains("attempts spent")
    );
    let waiting = &world.tasks[&retried];
    assert_eq!(waiting.state, State::RetryWait);
    let due = waiting.not_before_ms.unwrap();
    while world.now_ms < due {
        assert_eq!(world.tasks[&retried].state, State::RetryWait);
        world.tick(10_000, 60_000);
    }
    assert_eq!(world.tasks[&retried].state, State::Queued);
    // The failure repeated after the release is still a replay of the recorded one.
    let token = leased[2].lease.as_ref().unwrap().token.clone();
    let again = Report::Fail {
        class: FailureClass::NodeBusy,
        message: "boom".into(),
    };
    assert_eq!(world.report(retried, &token, again), Verdict::Replay);
    world.heartbeat("w", 0, 8);
    let again = world.claim("w", 1);
    assert_eq!(again[0].id, retried);
    assert_eq!(again[0].attempt, 2);
}

#[test]
fn a_lease_that_expires_goes_through_retry_and_the_old_token_is_refused() {
    let mut world = World::new(
        6,
        EngineOptions {
            lease_ms: 5_000,
            ..options()
        },
    );
    let id = world.submit(Priority::Urgent, json!({}));
    world.heartbeat("a", 0, 1);
    let first = world.claim("a", 1).remove(0);
    let old_token = first.lease.clone().unwrap().token;
    assert_eq!(world.report(id, &old_token, Report::Start), Verdict::Fresh);
    assert_eq!(world.report(id, &old_token, Report::Start), Verdict::Replay);
    world.tick(6_000, 60_000);
    let task = world.tasks[&id].clone();
    assert_eq!(task.state, State::RetryWait);
    assert_eq!(task.error.as_ref().unwrap().class, "lease-expired");
    // Release it at once for the test's sake.
    while world.tasks[&id].state != State::Queued {
        world.tick(60_000, 600_000);
    }
    world.heartbeat("b", 0, 1);
    let second = world.claim("b", 1).remove(0);
    let new_token = second.lease.clone().unwrap().token;
    assert_ne!(new_token, old_token);
    let zombie = world.report(
        id,
        &old_token,
        Report::Complete {
            result: json!("late"),
        },
    );
    assert!(matches!(zombie, Verdict::Stale(_)), "{zombie:?}");
    assert_eq!(world.tasks[&id].state, State::Claimed);
    assert_eq!(world.tasks[&id].lease.as_ref().unwrap().token, new_token);
    assert_eq!(
        world.report(
            id,
            &new_token,
            Report::Complete {
                result: json!("ok")
            }
        ),
        Verdict::Fresh
    );
    assert_eq!(
        world.report(
            id,
            &new_token,
            Report::Complete {
                result: json!("ok")
            }
        ),
        Verdict::Replay
    );
    assert_eq!(world.tasks[&id].state, State::Completed);
    assert!(
        world
            .log
            .iter()
            .any(|l| l.contains("complete report refused"))
    );
}

#[test]
fn heartbeats_extend_a_lease_but_never_past_the_attempt_timeout() {
    let mut world = World::new(
        7,
        EngineOptions {
            lease_ms: 10_000,
            ..options()
        },
    );
    let id = world.submit(Priority::Normal, json!({"est_exec_ms": 15_000}));
    world.heartbeat("a", 0, 1);
    let token = world.claim("a", 1)[0].lease.clone().unwrap().token;
    for _ in 0..3 {
        world.tick(8_000, 600_000);
        assert_eq!(world.report(id, &token, Report::Heartbeat), Verdict::Fresh);
    }
    // 24 s in: the attempt timeout (2 × 15 s) ends the attempt at 30 s despite heartbeats.
    world.tick(7_000, 600_000);
    assert_eq!(world.tasks[&id].state, State::RetryWait);
    assert_eq!(world.tasks[&id].error.as_ref().unwrap().class, "timeout");
}

#[test]
fn claims_respect_labels_gpu_memory_and_concurrency() {
    let mut world = World::new(8, options());
    let big = world.submit(
        Priority::Urgent,
        json!({"resources": {"gpu_memory_mb": 80_000}}),
    );
    let labelled = world.submit(Priority::Urgent, json!({"labels": {"site": "a"}}));
    let plain: Vec<TaskId> = (0..3)
        .map(|_| world.submit(Priority::Urgent, json!({})))
        .collect();
    world.heartbeat("two-gpus", 2, 8);
    let leased = world.claim("two-gpus", 8);
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
    assert!(world.claim("two-gpus", 8).is_empty());
    complete(&mut world, &leased[0]);
    assert_eq!(world.claim("two-gpus", 8)[0].id, plain[2]);
    assert_eq!(world.engine.queues().len(Priority::Urgent), 2);
    assert!(world.tasks[&big].state == State::Queued);
    assert!(world.tasks[&labelled].state == State::Queued);
}

#[test]
fn stale_and_unknown_workers_get_nothing() {
    let mut world = World::new(9, options());
    world.submit(Priority::Normal, json!({}));
    let (unknown, _) = world.engine.pick(world.now_ms, "ghost", 1);
    assert_eq!(unknown, Err(NoClaim::UnknownWorker));
    world.heartbeat("w", 0, 1);
    world.tick(31_000, 600_000);
    let (stale, _) = world.engine.pick(world.now_ms, "w", 1);
    assert!(matches!(stale, Err(NoClaim::Stale { .. })));
    world.heartbeat("w", 0, 1);
    assert_eq!(world.claim("w", 1).len(), 1);
}

fn breaker(world: &World, worker: &str) -> BreakerState {
    world
        .engine
        .workers(world.now_ms)
        .into_iter()
        .find(|w| w.id == worker)
        .unwrap()
        .breaker
}

#[test]
fn the_breaker_opens_half_opens_and_closes_as_specified() {
    let mut world = World::new(10, options());
    for _ in 0..100 {
        world.submit(Priority::Normal, json!({}));
    }
    world.heartbeat("sick", 0, 1);
    // Five failures in a row open it.
    for n in 0..5 {
        assert_eq!(breaker(&world, "sick"), BreakerState::Closed, "after {n}");
        let task = world.claim("sick", 1).remove(0);
        fail(&mut world, &task, FailureClass::Transient);
    }
    let opened_at = world.now_ms;
    assert_eq!(
        breaker(&world, "sick"),
        BreakerState::Open {
            until_ms: opened_at + 30_000
        }
    );
    let (refused, _) = world.engine.pick(world.now_ms, "sick", 1);
    assert!(matches!(refused, Err(NoClaim::BreakerOpen { .. })));
    // After the cool-down: one probe, no more while it is out.
    world.now_ms = opened_at + 30_000;
    world.heartbeat("sick", 0, 8);
    let probe = world.claim("sick", 8);
    assert_eq!(probe.len(), 1);
    assert!(matches!(
        breaker(&world, "sick"),
        BreakerState::HalfOpen { probe: Some(_) }
    ));
    assert!(world.claim("sick", 8).is_empty());
    // The probe fails: open again, for twice as long.
    fail(&mut world, &probe[0], FailureClass::NodeBusy);
    assert_eq!(
        breaker(&world, "sick"),
        BreakerState::Open {
            until_ms: world.now_ms + 60_000
        }
    );
    world.now_ms += 60_000;
    world.heartbeat("sick", 0, 8);
    let probe = world.claim("sick", 8);
    complete(&mut world, &probe[0]);
    assert_eq!(breaker(&world, "sick"), BreakerState::Closed);
    let changes: Vec<(String, String)> = world
        .worker_events
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
    let mut world = World::new(11, options());
    for _ in 0..40 {
        world.submit(Priority::Normal, json!({}));
    }
    world.heartbeat("flaky", 0, 1);
    // Alternate success and failure: never 5 in a row, but 5 of 10 fail.
    for n in 0..10 {
        assert_eq!(breaker(&world, "flaky"), BreakerState::Closed, "after {n}");
        let task = world.claim("flaky", 1).remove(0);
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
    world.heartbeat("careful", 0, 1);
    for _ in 0..6 {
        let task = world.claim("careful", 1).remove(0);
        fail(&mut world, &task, FailureClass::Permanent);
    }
    assert_eq!(breaker(&world, "careful"), BreakerState::Closed);
}

/// A day of traffic on virtual time: arrivals in three priorities, six workers of which two
/// fail a third of their attempts and one vanishes for an hour holding its leases, aging,
/// retries, deadlines. Returns the transcript.
fn day(seed: u64) -> (Vec<String>, World) {
    let mut world = World::new(seed, options());
    let workers = ["w0", "w1", "w2", "w3", "flaky-a", "flaky-b"];
    let mut held: Vec<crate::model::Task> = Vec::new();
    let step_ms = 10_000;
    for step in 0..(24 * 360) {
        let arrivals = world.rng.random_range(0..4);
        for _ in 0..arrivals {
            let priority = Priority::ALL[world.rng.random_range(0..3)];
            let deadline = if world.rng.random_bool(0.1) {
                json!({"deadline_ms": 600_000})
            } else {
                json!({})
            };
            world.submit(priority, deadline);
        }
        if step == 999 {
            // A burst, so the worker about to vanish surely holds work.
            for _ in 0..12 {
                world.submit(Priority::Urgent, json!({}));
            }
        }
        world.tick(step_ms, 1_000);
        let vanished = (1_000..1_360).contains(&step);
        for worker in workers {
            if vanished && worker == "w3" {
                continue;
            }
            world.heartbeat(worker, 1, 2);
            held.extend(world.claim(worker, 2));
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
            let report = if flaky && world.rng.random_bool(0.33) {
                Report::Fail {
                    class: FailureClass::Transient,
                    message: "injected".into(),
                }
            } else {
                Report::Complete {
                    result: json!(step),
                }
            };
            world.report(task.id, &lease.token, report);
        }
        held = kept;
    }
    (world.log.clone(), world)
}

#[test]
fn a_simulated_day_replays_identically_from_its_seed_and_loses_nothing() {
    let (first, world) = day(42);
    let (second, _) = day(42);
    assert_eq!(first.len(), second.len());
    assert!(first == second, "the same seed gave another run");
    let (other, _) = day(43);
    assert_ne!(first, other, "the seed is an input");

    let states = world.states();
    let completed = states.get(&State::Completed).copied().unwrap_or(0);
    assert!(completed > 10_000, "{states:?}");
    // Nothing stranded: every task is terminal, waiting, or held by a live lease.
    for task in world.tasks.values() {
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
    assert!(first.iter().any(|l| l.contains("lease-expired")));
    assert!(first.iter().any(|l| l.contains("report refused")));
    // No task completed twice.
    let mut completions = std::collections::HashMap::new();
    for line in &first {
        if line.contains("Some(Running)->completed") {
            let id = line.split(' ').nth(2).unwrap().to_owned();
            *completions.entry(id).or_insert(0) += 1;
        }
    }
    assert!(completions.values().all(|&n| n == 1));
    assert_eq!(completions.len(), completed);
}

#[test]
fn callbacks_retry_with_backoff_ignore_stale_answers_and_give_up_at_the_bound() {
    use super::{CallbackOutcome, Due, MAX_CALLBACK_ATTEMPTS};
    let mut world = World::new(12, options());
    let id = world.submit(
        Priority::Normal,
        json!({"callback_url": "http://example.test/done"}),
    );
    world.heartbeat("w", 0, 1);
    let task = world.claim("w", 1).remove(0);
    complete(&mut world, &task);
    let mut delays = Vec::new();
    for attempt in 1..=MAX_CALLBACK_ATTEMPTS {
        let task = world.tasks[&id].clone();
        let due_at = task.callback.as_ref().unwrap().next_at_ms;
        world.now_ms = world.now_ms.max(due_at);
        assert_eq!(world.engine.due(world.now_ms, 10), [id]);
        assert_eq!(
            world.engine.due_action(world.now_ms, &task),
            Some(Due::Callback)
        );
        let (n, change) = world
            .engine
            .plan_callback_attempt(world.now_ms, &task)
            .unwrap();
        assert_eq!(n, attempt);
        world.commit(change);
        let task = world.tasks[&id].clone();
        // An answer to an older attempt changes nothing.
        let failed = CallbackOutcome::Failed {
            reason: "HTTP 503".into(),
        };
        assert!(
            world
                .engine
                .plan_callback_outcome(world.now_ms, &task, n - 1, &failed)
                .is_none()
        );
        let change = world
            .engine
            .plan_callback_outcome(world.now_ms, &task, n, &failed)
            .unwrap();
        world.commit(change);
        let next = world.tasks[&id].callback.clone().unwrap();
        delays.push(next.next_at_ms - world.now_ms);
    }
    let task = &world.tasks[&id];
    assert!(task.callback.as_ref().unwrap().gave_up);
    assert!(!task.callback_pending());
    assert_eq!(world.engine.due(u64::MAX, 10), Vec::<TaskId>::new());
    assert_eq!(&delays[..4], [1_000, 2_000, 4_000, 8_000]);
    assert!(delays.iter().all(|&d| d <= 600_000));
    assert_eq!(task.state, State::Completed);
}

#[test]
fn a_cancelled_probe_frees_the_half_open_breaker_and_the_worker_table_is_bounded() {
    let mut world = World::new(
        13,
        EngineOptions {
            max_workers: 2,
            ..options()
        },
    );
    for _ in 0..10 {
        world.submit(Priority::Normal, json!({}));
    }
    world.heartbeat("sick", 0, 1);
    for _ in 0..5 {
        let task = world.claim("sick", 1).remove(0);
        fail(&mut world, &task, FailureClass::Transient);
    }
    world.now_ms += 30_000;
    world.heartbeat("sick", 0, 1);
    let probe = world.claim("sick", 1).remove(0);
    let change = world
        .engine
        .plan_transition(
            world.now_ms,
            &world.tasks[&probe.id].clone(),
            State::Cancelled,
            crate::model::Actor::api(),
            None,
        )
        .unwrap();
    world.commit(change);
    assert_eq!(world.claim("sick", 1).len(), 1, "a new probe goes out");

    let other = crate::model::Heartbeat::default();
    assert!(
        world
            .engine
            .heartbeat(world.now_ms, "second", other.clone())
            .is_ok()
    );
    assert!(
        world
            .engine
            .heartbeat(world.now_ms, "third", other.clone())
            .is_err()
    );
    assert!(world.engine.heartbeat(world.now_ms, "sick", other).is_ok());
}
