//! GPU batches on the virtual-time driver: a batch claim gets tasks of one kind, model and
//! batch key on one GPU; urgent work is handed out at once, a batch of other buckets waits at
//! most its bucket's `batch_wait_ms` (and the claim's `max_wait_ms`) to fill, and a batch
//! held back changes neither the round robin nor fair share.

use super::Driver;
use super::tests::{a100s, options, submit};
use crate::{BatchClaim, EngineOptions};
use serde_json::json;
use sluice_model::{Heartbeat, Priority, Task, TaskId};

fn worker(world: &mut Driver, id: &str, gpus: usize, max_concurrency: u32) {
    let heartbeat = Heartbeat {
        gpus: a100s(gpus),
        max_concurrency,
        ..Heartbeat::default()
    };
    world.heartbeat(id, heartbeat).unwrap();
}

fn batch(max_size: usize, max_wait_ms: u64) -> BatchClaim {
    BatchClaim {
        max_size,
        max_wait_ms,
        models: Vec::new(),
        may_hold: true,
    }
}

fn task_of(world: &mut Driver, priority: Priority, model: &str, memory_mb: u64) -> TaskId {
    submit(
        world,
        priority,
        json!({"resources": {"model": model, "gpu_memory_mb": memory_mb}}),
    )
}

fn ids(tasks: &[Task]) -> Vec<TaskId> {
    tasks.iter().map(|t| t.id).collect()
}

#[test]
fn an_urgent_task_arriving_alone_is_claimed_at_once_by_a_batch_claim() {
    let mut world = Driver::new(31, options());
    worker(&mut world, "gpu", 1, 8);
    let urgent = task_of(&mut world, Priority::Urgent, "seg", 1_000);
    let answer = world.claim_batch("gpu", 8, Some(batch(8, 1_000))).unwrap();
    assert_eq!(ids(&answer.leases), [urgent]);
    assert_eq!(answer.hold_ms, None);
    // A normal task alone waits for its batch to fill instead.
    let normal = task_of(&mut world, Priority::Normal, "seg", 1_000);
    let answer = world.claim_batch("gpu", 8, Some(batch(8, 1_000))).unwrap();
    assert!(answer.leases.is_empty());
    assert_eq!(answer.hold_ms, Some(1_000));
    // An urgent one joining it takes it along at once.
    let urgent = task_of(&mut world, Priority::Urgent, "seg", 1_000);
    let answer = world.claim_batch("gpu", 8, Some(batch(8, 1_000))).unwrap();
    let mut got = ids(&answer.leases);
    got.sort();
    let mut both = vec![urgent, normal];
    both.sort();
    assert_eq!(got, both);
}

#[test]
fn a_low_task_waits_for_a_batch_at_most_its_buckets_batch_wait() {
    let options = EngineOptions {
        batch_wait_ms: [0, 1_000, 50],
        ..options()
    };
    let mut world = Driver::new(32, options);
    worker(&mut world, "gpu", 1, 8);
    let t0 = world.now_ms();
    let first = task_of(&mut world, Priority::Low, "seg", 1_000);
    let held = world.claim_batch("gpu", 8, Some(batch(8, 1_000))).unwrap();
    assert!(held.leases.is_empty() && held.refused.is_none());
    assert_eq!(
        held.hold_ms,
        Some(50),
        "the low bucket's cap, not the claim's 1000"
    );
    world.advance_to(t0 + 10);
    let second = task_of(&mut world, Priority::Low, "seg", 1_000);
    let other_model = task_of(&mut world, Priority::Low, "denoise", 1_000);
    world.advance_to(t0 + 49);
    worker(&mut world, "gpu", 1, 8);
    let held = world.claim_batch("gpu", 8, Some(batch(8, 1_000))).unwrap();
    assert_eq!(
        held.hold_ms,
        Some(1),
        "counted from the oldest task's arrival"
    );
    world.advance_to(t0 + 50);
    worker(&mut world, "gpu", 1, 8);
    let answer = world.claim_batch("gpu", 8, Some(batch(8, 1_000))).unwrap();
    assert_eq!(ids(&answer.leases), [first, second], "one model per batch");
    // A claim's own max_wait_ms is shorter than the bucket's: it rules.
    world.advance_to(t0 + 60);
    let third = task_of(&mut world, Priority::Low, "denoise", 1_000);
    worker(&mut world, "gpu", 1, 8);
    let answer = world.claim_batch("gpu", 8, Some(batch(8, 5))).unwrap();
    assert_eq!(ids(&answer.leases), [other_model, third]);
    // A full batch goes at once, whatever the wait.
    let full: Vec<TaskId> = (0..4)
        .map(|_| task_of(&mut world, Priority::Normal, "seg", 1_000))
        .collect();
    worker(&mut world, "gpu", 1, 8);
    let answer = world.claim_batch("gpu", 8, Some(batch(4, 1_000))).unwrap();
    assert_eq!(ids(&answer.leases), full);
}

#[test]
fn a_claim_that_may_not_wait_takes_the_batch_as_it_is() {
    let mut world = Driver::new(33, options());
    worker(&mut world, "gpu", 1, 8);
    let low = task_of(&mut world, Priority::Low, "seg", 1_000);
    let answer = world
        .claim_batch(
            "gpu",
            8,
            Some(BatchClaim {
                may_hold: false,
                ..batch(8, 1_000)
            }),
        )
        .unwrap();
    assert_eq!(ids(&answer.leases), [low]);
}

#[test]
fn a_batch_never_exceeds_the_free_memory_of_its_one_gpu() {
    let mut world = Driver::new(34, options());
    // Two GPUs of 40,000 MB, eight places each.
    worker(&mut world, "gpu", 2, 16);
    let tasks: Vec<TaskId> = (0..12)
        .map(|_| task_of(&mut world, Priority::Normal, "seg", 8_000))
        .collect();
    let answer = world.claim_batch("gpu", 8, Some(batch(8, 0))).unwrap();
    // 40,000 MB holds five tasks of 8,000: the batch stops there, all on one GPU.
    assert_eq!(ids(&answer.leases), tasks[..5]);
    let gpus: Vec<Option<u32>> = answer
        .leases
        .iter()
        .map(|t| t.lease.as_ref().unwrap().gpu)
        .collect();
    assert!(
        gpus.iter().all(|gpu| *gpu == gpus[0] && gpu.is_some()),
        "{gpus:?}"
    );
    // Each attempt of a batch of five may take five times the longest attempt timeout (its
    // own is twice its 60 s estimate): the batch runs no longer than its tasks in a row.
    for task in &answer.leases {
        let lease = task.lease.as_ref().unwrap();
        assert_eq!(lease.attempt_ends_at_ms - lease.claimed_at_ms, 5 * 120_000);
    }
    // The next batch goes to the other GPU.
    let answer = world.claim_batch("gpu", 8, Some(batch(8, 0))).unwrap();
    assert_eq!(ids(&answer.leases), tasks[5..10]);
    let gpu = answer.leases[0].lease.as_ref().unwrap().gpu;
    assert_ne!(gpu, gpus[0]);
}

#[test]
fn a_batch_holds_one_kind_model_and_batch_key_and_only_the_models_asked() {
    let mut world = Driver::new(35, options());
    worker(&mut world, "gpu", 1, 16);
    let shape = |world: &mut Driver, model: &str, key: &str| {
        submit(
            world,
            Priority::Normal,
            json!({"resources": {"model": model, "batch_key": key}}),
        )
    };
    let a_512 = shape(&mut world, "seg", "512");
    let a_1024 = shape(&mut world, "seg", "1024");
    let other_kind = submit(
        &mut world,
        Priority::Normal,
        json!({"kind": "ct.scan", "resources": {"model": "seg", "batch_key": "512"}}),
    );
    let b_512 = shape(&mut world, "den", "512");
    let a_512_again = shape(&mut world, "seg", "512");
    let now = BatchClaim {
        may_hold: false,
        ..batch(8, 0)
    };
    let answer = world.claim_batch("gpu", 8, Some(now.clone())).unwrap();
    assert_eq!(ids(&answer.leases), [a_512, a_512_again]);
    let only_den = BatchClaim {
        models: vec!["den".into()],
        ..now.clone()
    };
    let answer = world.claim_batch("gpu", 8, Some(only_den)).unwrap();
    assert_eq!(ids(&answer.leases), [b_512]);
    let answer = world.claim_batch("gpu", 8, Some(now.clone())).unwrap();
    assert_eq!(ids(&answer.leases), [a_1024]);
    let answer = world.claim_batch("gpu", 8, Some(now)).unwrap();
    assert_eq!(ids(&answer.leases), [other_kind]);
}

/// A batch held to fill leases nothing, and leaves the buckets' round robin and the tenants'
/// fair share where they were: the claims after it pick what they would have without it.
#[test]
fn a_held_batch_changes_nothing_the_next_claims_see() {
    let run = |with_held_claim: bool| {
        let mut world = Driver::new(36, options());
        worker(&mut world, "gpu", 1, 64);
        worker(&mut world, "batcher", 1, 64);
        for n in 0..30 {
            let priority = [Priority::Normal, Priority::Low][n % 2];
            let tenant = ["site-a", "site-b", "site-c"][n % 3];
            submit(
                &mut world,
                priority,
                json!({"tenant": tenant, "resources": {"model": "seg"}}),
            );
        }
        if with_held_claim {
            let held = world
                .claim_batch("batcher", 64, Some(batch(64, 1_000)))
                .unwrap();
            assert!(held.leases.is_empty() && held.hold_ms.is_some());
        }
        ids(&world.claim("gpu", 12).unwrap().leases)
    };
    assert_eq!(run(true), run(false));
}
