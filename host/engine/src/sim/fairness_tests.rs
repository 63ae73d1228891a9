//! Fair share inside a bucket on the virtual-time driver: a tenant that arrives behind
//! another's flood is served at its share from its first task, and weights split a saturated
//! bucket in their proportion.

use super::Driver;
use super::tests::{claim, complete, heartbeat, options, record, submit};
use crate::{Input, NativeDecider};
use serde_json::json;
use sluice_model::{Priority, Task, TaskId};

fn submit_as(world: &mut Driver, tenant: &str) -> TaskId {
    submit(world, Priority::Normal, json!({ "tenant": tenant }))
}

/// One claim of one task by the only worker, completed at once: the tenant it served.
fn serve_one(world: &mut Driver) -> String {
    let leased = claim(world, "gpu-1", 1);
    let [task]: [Task; 1] = leased.try_into().expect("one task a claim");
    complete(world, &task);
    record(world, task.id).tenant
}

fn world_with(tenant_weights: &[(&str, u32)]) -> Driver {
    let decide = NativeDecider {
        tenant_weights: tenant_weights
            .iter()
            .map(|&(tenant, weight)| (tenant.to_owned(), weight))
            .collect(),
        ..NativeDecider::default()
    };
    let mut world = Driver::with_decide(11, options(), Box::new(decide));
    world.step(Input::PoliciesChanged);
    heartbeat(&mut world, "gpu-1", 1, 1);
    world
}

#[test]
fn a_tenant_behind_a_flood_is_served_at_its_share_from_its_first_task() {
    let mut world = world_with(&[]);
    for _ in 0..10_000 {
        submit_as(&mut world, "site-flood");
    }
    for _ in 0..1_000 {
        assert_eq!(serve_one(&mut world), "site-flood");
    }
    for _ in 0..100 {
        submit_as(&mut world, "site-small");
    }
    // Equal weights: every other claim from the moment its tasks arrive, not after the
    // 9,000 still ahead of them.
    let next: Vec<String> = (0..200).map(|_| serve_one(&mut world)).collect();
    let small = next.iter().filter(|t| *t == "site-small").count();
    assert!((99..=100).contains(&small), "{small} of 200");
    assert_eq!(next[0], "site-small", "it starts level, a stride behind");
    let longest_run = next
        .chunk_by(|a, b| a == b)
        .map(<[String]>::len)
        .max()
        .unwrap();
    assert!(
        longest_run <= 2,
        "interleaved, not in bursts: {longest_run}"
    );
}

#[test]
fn weights_of_three_to_one_split_a_saturated_bucket_three_to_one() {
    let mut world = world_with(&[("site-a", 3), ("site-b", 1)]);
    for _ in 0..5_000 {
        submit_as(&mut world, "site-a");
        submit_as(&mut world, "site-b");
    }
    let served: Vec<String> = (0..4_000).map(|_| serve_one(&mut world)).collect();
    let a = served.iter().filter(|t| *t == "site-a").count() as f64;
    let b = served.len() as f64 - a;
    let ratio = a / b;
    assert!(
        (ratio - 3.0).abs() <= 3.0 * 0.02,
        "site-a:site-b = {a}:{b} = {ratio:.3}"
    );
}
