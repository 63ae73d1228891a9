//! Concurrency keys on the virtual-time driver: a key at its limit holds back its own tasks
//! only, and never runs more than its limit at once.

use super::Driver;
use super::tests::{claim, complete, heartbeat, options, submit};
use crate::{EngineOptions, Input};
use serde_json::json;
use sluice_model::{ConcurrencyLimit, Priority, State, Task};

fn keyed(tasks: &[Task]) -> usize {
    tasks
        .iter()
        .filter(|t| t.concurrency_key.as_deref() == Some("scanner-7"))
        .count()
}

#[test]
fn a_key_at_its_limit_runs_no_more_and_holds_back_only_its_own_tasks() {
    let options = EngineOptions {
        concurrency_limits: vec![ConcurrencyLimit {
            key: "scanner-7".into(),
            limit: 2,
        }],
        ..options()
    };
    let mut world = Driver::new(5, options);
    // The keyed tasks first in line, the others behind them.
    for _ in 0..50 {
        submit(
            &mut world,
            Priority::Normal,
            json!({"concurrency_key": "scanner-7"}),
        );
    }
    for _ in 0..50 {
        submit(&mut world, Priority::Normal, json!({}));
    }
    heartbeat(&mut world, "gpu-1", 4, 12);
    let mut running = claim(&mut world, "gpu-1", 12);
    assert_eq!(running.len(), 12, "the others are not held behind the key");
    assert_eq!(keyed(&running), 2);
    let mut most_keyed = 0;
    let mut rounds = 0;
    while !running.is_empty() {
        rounds += 1;
        assert!(rounds < 1_000, "the run does not end");
        // Finish the oldest half (at least one) and claim again.
        let done = running.len().div_ceil(2);
        for task in running.drain(..done) {
            complete(&mut world, &task);
        }
        running.extend(claim(&mut world, "gpu-1", 12));
        most_keyed = most_keyed.max(keyed(&running));
        assert_eq!(
            world
                .engine()
                .snapshot()
                .keys_running
                .get("scanner-7")
                .copied()
                .unwrap_or(0) as usize,
            keyed(&running)
        );
    }
    assert_eq!(most_keyed, 2, "never more than the limit, and up to it");
    assert_eq!(world.engine().tasks_in(State::Completed), 100);
}

#[test]
fn a_limit_of_zero_holds_a_key_until_it_is_raised() {
    let mut world = Driver::new(6, options());
    world.step(Input::SetConcurrencyLimits(vec![ConcurrencyLimit {
        key: "model:*".into(),
        limit: 0,
    }]));
    let held = submit(
        &mut world,
        Priority::Urgent,
        json!({"concurrency_key": "model:seg-v3"}),
    );
    let free = submit(&mut world, Priority::Low, json!({}));
    heartbeat(&mut world, "gpu-1", 1, 4);
    let first = claim(&mut world, "gpu-1", 4);
    assert_eq!(first.iter().map(|t| t.id).collect::<Vec<_>>(), [free]);
    world.step(Input::SetConcurrencyLimits(vec![ConcurrencyLimit {
        key: "model:*".into(),
        limit: 1,
    }]));
    let then = claim(&mut world, "gpu-1", 4);
    assert_eq!(then.iter().map(|t| t.id).collect::<Vec<_>>(), [held]);
}
