//! Warm-model placement on the virtual-time driver: a task naming a model goes to a worker
//! with it loaded (on the GPU that has it), waits for one up to `affinity_wait_ms`, then goes
//! to any worker it fits; a task no GPU can hold is never placed.

use super::Driver;
use super::tests::{a100s, claim, options, submit};
use crate::EngineOptions;
use serde_json::json;
use sluice_model::{Heartbeat, LoadedModel, Priority, State, TaskId};

const AFFINITY_WAIT_MS: u64 = 2_000;

fn worker(world: &mut Driver, id: &str, gpus: usize, loaded: &[(&str, u32)]) {
    let heartbeat = Heartbeat {
        gpus: a100s(gpus),
        max_concurrency: 2 * gpus as u32,
        loaded_models: loaded
            .iter()
            .map(|&(name, gpu)| LoadedModel {
                name: name.into(),
                gpu,
                memory_mb: 6_000,
            })
            .collect(),
        ..Heartbeat::default()
    };
    world.heartbeat(id, heartbeat).unwrap();
}

fn ids(tasks: &[sluice_model::Task]) -> Vec<TaskId> {
    tasks.iter().map(|t| t.id).collect()
}

#[test]
fn a_model_task_waits_for_a_warm_worker_only_up_to_affinity_wait_ms() {
    let options = EngineOptions {
        affinity_wait_ms: AFFINITY_WAIT_MS,
        ..options()
    };
    let mut world = Driver::new(21, options);
    let t0 = world.now_ms();
    let for_a: Vec<TaskId> = (0..6)
        .map(|_| {
            submit(
                &mut world,
                Priority::Normal,
                json!({"resources": {"gpu_memory_mb": 8000, "model": "seg-a"}}),
            )
        })
        .collect();
    let plain = submit(&mut world, Priority::Normal, json!({}));
    worker(&mut world, "warm", 2, &[("seg-a", 1)]);
    worker(&mut world, "cold", 2, &[]);
    // The cold worker gets only the task that names no model while a warm one is about.
    assert_eq!(ids(&claim(&mut world, "cold", 4)), [plain]);
    let warm = claim(&mut world, "warm", 2);
    assert_eq!(ids(&warm), for_a[..2]);
    for task in &warm {
        assert_eq!(
            task.lease.as_ref().unwrap().gpu,
            Some(1),
            "the GPU with it loaded"
        );
    }
    world.advance_to(t0 + AFFINITY_WAIT_MS - 1);
    worker(&mut world, "cold", 2, &[]);
    assert!(claim(&mut world, "cold", 4).is_empty());
    // Past the wait, any worker it fits.
    world.advance_to(t0 + AFFINITY_WAIT_MS);
    worker(&mut world, "cold", 2, &[]);
    let answer = world.claim("cold", 4).unwrap();
    assert_eq!(ids(&answer.leases), for_a[2..5], "{:?}", answer.refused);
}

#[test]
fn without_a_warm_worker_a_model_task_goes_anywhere_at_once() {
    let mut world = Driver::new(22, options());
    let task = submit(
        &mut world,
        Priority::Normal,
        json!({"resources": {"gpu_memory_mb": 8000, "model": "seg-b"}}),
    );
    worker(&mut world, "warm-with-another", 1, &[("seg-a", 0)]);
    worker(&mut world, "cold", 1, &[]);
    assert_eq!(ids(&claim(&mut world, "cold", 1)), [task]);
}

#[test]
fn a_task_no_gpu_can_hold_is_never_claimed() {
    let mut world = Driver::new(23, options());
    let t0 = world.now_ms();
    let huge = submit(
        &mut world,
        Priority::Urgent,
        json!({"resources": {"gpu_memory_mb": 100_000, "model": "seg-a"}}),
    );
    let small = submit(&mut world, Priority::Normal, json!({}));
    worker(&mut world, "warm", 2, &[("seg-a", 0)]);
    assert_eq!(ids(&claim(&mut world, "warm", 4)), [small]);
    world.advance_to(t0 + 60_000);
    worker(&mut world, "warm", 2, &[("seg-a", 0)]);
    assert!(claim(&mut world, "warm", 4).is_empty());
    assert_eq!(world.task(huge).unwrap().state, State::Queued);
    assert_eq!(
        world.engine().snapshot().largest_gpu_memory_mb,
        Some(40_000)
    );
}
