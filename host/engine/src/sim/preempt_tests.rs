//! Preemption on the virtual-time driver: an urgent task that waited `preempt_after_ms` with
//! every GPU busy takes the place of the lowest bucket's attempt, which its worker is told to
//! stop; the stopped task waits again with no attempt spent.

use super::Driver;
use super::tests::{claim, heartbeat, options, record, report, submit};
use crate::{EngineOptions, Report, StepError, Verdict};
use serde_json::json;
use sluice_model::{Priority, State, Task, TaskId};

const AFTER_MS: u64 = 5_000;

fn preempting() -> EngineOptions {
    EngineOptions {
        preempt_after_ms: Some(AFTER_MS),
        ..options()
    }
}

fn token(task: &Task) -> String {
    task.lease.as_ref().unwrap().token.clone()
}

/// Ticks in 100 ms steps for `ms`, keeping `workers` fresh.
fn run_for(world: &mut Driver, ms: u64, workers: &[(&str, usize)]) {
    for _ in 0..ms / 100 {
        world.tick(100);
        for &(worker, gpus) in workers {
            heartbeat(world, worker, gpus, gpus as u32);
        }
    }
}

fn revoked_for(world: &Driver, id: TaskId) -> Option<TaskId> {
    record(world, id).lease.and_then(|lease| lease.revoked_for)
}

#[test]
fn an_urgent_task_takes_the_place_of_the_lowest_attempt_which_waits_again_unspent() {
    let mut world = Driver::new(11, preempting());
    let low = submit(&mut world, Priority::Low, json!({}));
    let normal = submit(&mut world, Priority::Normal, json!({}));
    heartbeat(&mut world, "a", 1, 1);
    heartbeat(&mut world, "b", 1, 1);
    let mut leased = claim(&mut world, "a", 1);
    leased.extend(claim(&mut world, "b", 1));
    leased.sort_by_key(|t| t.id != low);
    assert_eq!(
        leased.iter().map(|t| t.id).collect::<Vec<_>>(),
        [low, normal]
    );
    // `a` names the worker the low task runs on.
    let on_a = &leased[..1];
    let a = on_a[0].lease.as_ref().unwrap().worker.clone();
    let a = a.as_str();
    let workers = [("a", 1), ("b", 1)];
    let urgent = submit(&mut world, Priority::Urgent, json!({}));
    run_for(&mut world, AFTER_MS - 200, &workers);
    assert_eq!(
        revoked_for(&world, low),
        None,
        "not before preempt_after_ms"
    );
    run_for(&mut world, 300, &workers);
    // The low bucket's attempt is revoked for it, not the normal one; the event names it.
    assert_eq!(revoked_for(&world, low), Some(urgent));
    assert_eq!(revoked_for(&world, normal), None);
    let low_task = record(&world, low);
    assert_eq!(
        low_task.state,
        State::Claimed,
        "held until the worker stops"
    );
    assert!(
        world
            .transcript()
            .contains(&format!("preempted by urgent task {urgent}"))
    );
    // The worker hears it at its next report, and the place is still held.
    let heard = world.report(low, &token(&on_a[0]), Report::Heartbeat);
    assert!(
        matches!(heard, Err(StepError::AttemptRevoked { urgent: Some(u), .. }) if u == urgent),
        "{heard:?}"
    );
    assert!(claim(&mut world, a, 1).is_empty(), "the GPU still computes");
    // It stops: the task waits again, the attempt not counted, and the place goes to the
    // urgent task.
    let verdict = report(&mut world, low, &token(&on_a[0]), Report::Stopped);
    assert_eq!(verdict, Verdict::StoppedAfterRevoke);
    let requeued = record(&world, low);
    assert_eq!(requeued.state, State::Queued);
    assert_eq!((requeued.attempt, requeued.preemptions), (1, 1));
    assert_eq!(requeued.attempts_spent(), 0);
    let next = claim(&mut world, a, 1);
    assert_eq!(next.iter().map(|t| t.id).collect::<Vec<_>>(), [urgent]);
    // `stopped` said again is answered as before.
    assert_eq!(
        report(&mut world, low, &token(&on_a[0]), Report::Stopped),
        Verdict::Replay
    );
    // Once the urgent task is done, the low one runs again and completes, one attempt spent.
    report(
        &mut world,
        urgent,
        &token(&next[0]),
        Report::Complete { result: json!(1) },
    );
    let again = claim(&mut world, a, 1);
    assert_eq!(again[0].id, low);
    assert_eq!(again[0].attempt, 2);
    report(
        &mut world,
        low,
        &token(&again[0]),
        Report::Complete { result: json!(1) },
    );
    let done = record(&world, low);
    assert_eq!(done.state, State::Completed);
    assert_eq!(done.attempts_spent(), 1);
}

#[test]
fn nothing_is_preempted_once_the_server_drains() {
    for drains in [false, true] {
        let mut world = Driver::new(13, preempting());
        let low = submit(&mut world, Priority::Low, json!({}));
        heartbeat(&mut world, "a", 1, 1);
        claim(&mut world, "a", 1);
        let urgent = submit(&mut world, Priority::Urgent, json!({}));
        run_for(&mut world, AFTER_MS - 200, &[("a", 1)]);
        if drains {
            world.step(crate::Input::Drain);
        }
        run_for(&mut world, 3 * AFTER_MS, &[("a", 1)]);
        let expected = (!drains).then_some(urgent);
        assert_eq!(revoked_for(&world, low), expected, "draining: {drains}");
    }
}

#[test]
fn nothing_is_preempted_when_off_for_urgent_work_or_for_a_task_marked_not_preemptible() {
    for (options, preemptible, urgent_victim) in [
        (options(), true, false),
        (preempting(), false, false),
        (preempting(), true, true),
    ] {
        let mut world = Driver::new(12, options);
        let priority = if urgent_victim {
            Priority::Urgent
        } else {
            Priority::Low
        };
        let running = submit(&mut world, priority, json!({"preemptible": preemptible}));
        heartbeat(&mut world, "a", 1, 1);
        claim(&mut world, "a", 1);
        let urgent = submit(&mut world, Priority::Urgent, json!({}));
        run_for(&mut world, 3 * AFTER_MS, &[("a", 1)]);
        assert_eq!(revoked_for(&world, running), None);
        assert_eq!(record(&world, urgent).state, State::Queued);
    }
}

#[test]
fn a_worker_is_asked_once_an_interval_and_a_silent_one_loses_the_attempt_unspent() {
    let mut world = Driver::new(13, preempting());
    let lows: Vec<TaskId> = (0..2)
        .map(|_| submit(&mut world, Priority::Low, json!({})))
        .collect();
    heartbeat(&mut world, "a", 2, 2);
    assert_eq!(claim(&mut world, "a", 2).len(), 2);
    let urgent: Vec<TaskId> = (0..2)
        .map(|_| submit(&mut world, Priority::Urgent, json!({})))
        .collect();
    run_for(&mut world, AFTER_MS + 100, &[("a", 2)]);
    let revoked: Vec<TaskId> = lows
        .iter()
        .copied()
        .filter(|&id| revoked_for(&world, id).is_some())
        .collect();
    assert_eq!(revoked.len(), 1, "one preemption per worker per interval");
    let (first, other) = (
        revoked[0],
        *lows.iter().find(|&&id| id != revoked[0]).unwrap(),
    );
    assert_eq!(revoked_for(&world, first), Some(urgent[0]));
    run_for(&mut world, AFTER_MS - 500, &[("a", 2)]);
    assert_eq!(revoked_for(&world, other), None, "not within the interval");
    run_for(&mut world, 600, &[("a", 2)]);
    assert_eq!(revoked_for(&world, other), Some(urgent[1]));
    // The worker never answers: the revoked leases run out (they are not extended), and the
    // tasks wait again, no attempt spent.
    run_for(&mut world, 30_000, &[("a", 2)]);
    for id in [first, other] {
        let requeued = record(&world, id);
        assert_eq!(requeued.state, State::Queued);
        assert_eq!((requeued.attempts_spent(), requeued.preemptions), (0, 1));
    }
    // The freed places go to the urgent tasks they were freed for.
    let mut next: Vec<TaskId> = claim(&mut world, "a", 2).iter().map(|t| t.id).collect();
    next.sort();
    assert_eq!(next, urgent);
}
