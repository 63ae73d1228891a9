//! Cancel that reaches the worker, on the virtual-time driver: a task ended while leased keeps
//! its GPU counted as busy until the worker says it stopped or the lease runs out, the worker
//! is told at its next report, and what it sends meanwhile grows nothing.

use super::Driver;
use super::tests::{claim, heartbeat, options, record, report, submit};
use crate::{Report, StepError, Verdict};
use serde_json::json;
use sluice_model::{Actor, Priority, State, Task, TaskId};

/// One worker with one GPU; two tasks; the first leased, started and then cancelled.
fn cancelled_while_running() -> (Driver, Task, TaskId) {
    let mut world = Driver::new(7, options());
    heartbeat(&mut world, "gpu-1", 1, 1);
    let first = submit(&mut world, Priority::Normal, json!({}));
    let second = submit(&mut world, Priority::Normal, json!({}));
    let leased = claim(&mut world, "gpu-1", 1);
    assert_eq!(leased.iter().map(|t| t.id).collect::<Vec<_>>(), [first]);
    let token = leased[0].lease.as_ref().unwrap().token.clone();
    assert_eq!(
        report(&mut world, first, &token, Report::Start),
        Verdict::Fresh
    );
    let cancelled = world.cancel(first, Actor::api()).unwrap();
    assert_eq!(cancelled.state, State::Cancelled);
    let lease = cancelled.lease.as_ref().unwrap();
    assert_eq!(lease.ended_at_ms, Some(world.now_ms()));
    assert!(lease.holds_place_after_end());
    (world, cancelled, second)
}

fn token(task: &Task) -> String {
    task.lease.as_ref().unwrap().token.clone()
}

#[test]
fn a_cancelled_attempt_keeps_its_gpu_until_the_worker_says_it_stopped() {
    let (mut world, cancelled, second) = cancelled_while_running();
    let token = token(&cancelled);
    // The GPU is still computing: nothing else is placed on it.
    assert!(claim(&mut world, "gpu-1", 1).is_empty());
    // The worker's heartbeats are answered `attempt-cancelled`, and write nothing.
    let before = record(&world, cancelled.id);
    for _ in 0..1_000 {
        let answer = world.report(cancelled.id, &token, Report::Heartbeat);
        assert!(
            matches!(
                answer,
                Err(StepError::AttemptCancelled {
                    state: State::Cancelled,
                    ..
                })
            ),
            "{answer:?}"
        );
    }
    assert_eq!(record(&world, cancelled.id), before);
    assert!(claim(&mut world, "gpu-1", 1).is_empty());

    world.tick(10);
    let stopped = world.report(cancelled.id, &token, Report::Stopped).unwrap();
    let lease = stopped.lease.as_ref().unwrap();
    assert_eq!(lease.stopped_at_ms, Some(world.now_ms()));
    assert!(lease.stopped_at_ms < Some(lease.expires_at_ms));
    assert_eq!(stopped.state, State::Cancelled);
    // One event on the timeline says so; a repeated `stopped` adds none.
    let events = stopped.event_seqs.len();
    assert_eq!(cancelled.event_seqs.len() + 1, events);
    assert!(world.report(cancelled.id, &token, Report::Stopped).is_ok());
    assert_eq!(record(&world, cancelled.id).event_seqs.len(), events);
    // Now the GPU takes the next task.
    let next = claim(&mut world, "gpu-1", 1);
    assert_eq!(next.iter().map(|t| t.id).collect::<Vec<_>>(), [second]);
    assert_eq!(next[0].lease.as_ref().unwrap().gpu, Some(0));
}

#[test]
fn a_held_gpu_is_freed_when_the_lease_runs_out_without_a_word_from_the_worker() {
    let (mut world, cancelled, second) = cancelled_while_running();
    let expires_at_ms = cancelled.lease.as_ref().unwrap().expires_at_ms;
    while world.now_ms() < expires_at_ms {
        assert!(
            claim(&mut world, "gpu-1", 1).is_empty(),
            "at {}",
            world.now_ms()
        );
        heartbeat(&mut world, "gpu-1", 1, 1);
        world.tick(1_000);
    }
    let freed = record(&world, cancelled.id);
    let stopped_at_ms = freed.lease.as_ref().unwrap().stopped_at_ms.unwrap();
    assert!(stopped_at_ms >= expires_at_ms);
    assert_eq!(claim(&mut world, "gpu-1", 1)[0].id, second);
    // The worker's late word is taken as said before.
    assert!(
        world
            .report(cancelled.id, &token(&cancelled), Report::Stopped)
            .is_ok()
    );
}

#[test]
fn an_outcome_reported_after_the_cancel_frees_the_gpu_and_is_not_kept() {
    let (mut world, cancelled, second) = cancelled_while_running();
    let answer = world.report(
        cancelled.id,
        &token(&cancelled),
        Report::Complete {
            result: json!({"late": true}),
        },
    );
    assert!(
        matches!(answer, Err(StepError::AttemptCancelled { .. })),
        "{answer:?}"
    );
    let after = record(&world, cancelled.id);
    assert_eq!(after.state, State::Cancelled);
    assert!(after.result.is_none());
    assert!(after.lease.as_ref().unwrap().stopped_at_ms.is_some());
    assert_eq!(claim(&mut world, "gpu-1", 1)[0].id, second);
}

#[test]
fn only_a_cancelled_attempt_may_say_it_stopped() {
    let mut world = Driver::new(8, options());
    heartbeat(&mut world, "gpu-1", 1, 1);
    let id = submit(&mut world, Priority::Normal, json!({}));
    let leased = claim(&mut world, "gpu-1", 1);
    let answer = world.report(id, &token(&leased[0]), Report::Stopped);
    assert!(
        matches!(answer, Err(StepError::StaleLease { logged: false, .. })),
        "{answer:?}"
    );
    assert_eq!(record(&world, id).state, State::Claimed);
}

#[test]
fn a_deadline_passing_under_a_lease_holds_the_gpu_the_same_way() {
    let mut world = Driver::new(9, options());
    heartbeat(&mut world, "gpu-1", 1, 1);
    let id = submit(&mut world, Priority::Normal, json!({"deadline_ms": 5_000}));
    let leased = claim(&mut world, "gpu-1", 1);
    world.tick(6_000);
    let ended = record(&world, id);
    assert_eq!(ended.state, State::TimedOut);
    assert!(ended.lease.as_ref().unwrap().holds_place_after_end());
    let answer = world.report(id, &token(&leased[0]), Report::Heartbeat);
    assert!(matches!(
        answer,
        Err(StepError::AttemptCancelled {
            state: State::TimedOut,
            ..
        })
    ));
    heartbeat(&mut world, "gpu-1", 1, 1);
    submit(&mut world, Priority::Normal, json!({}));
    assert!(claim(&mut world, "gpu-1", 1).is_empty());
    world
        .report(id, &token(&leased[0]), Report::Stopped)
        .unwrap();
    assert_eq!(claim(&mut world, "gpu-1", 1).len(), 1);
}
