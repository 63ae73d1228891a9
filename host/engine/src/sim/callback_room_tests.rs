//! The callback queue bounded in bytes, on the virtual-time driver: a tick plans no more
//! callback bodies than the deliverer said it has room for; the rest stay due.

use super::Driver;
use super::tests::{claim, heartbeat, options, record, submit};
use crate::{Input, Report};
use serde_json::json;
use sluice_model::{Priority, TaskId};

#[test]
fn a_tick_hands_out_no_more_callback_bytes_than_the_deliverer_has_room_for() {
    let mut world = Driver::new(10, options());
    heartbeat(&mut world, "w", 0, 3);
    let spec = json!({"callback_url": "http://example.test/done"});
    let ids: Vec<TaskId> = (0..3)
        .map(|_| submit(&mut world, Priority::Normal, spec.clone()))
        .collect();
    for task in claim(&mut world, "w", 3) {
        let result = json!({"scan": "x".repeat(10_000)});
        world
            .report(
                task.id,
                &task.lease.clone().unwrap().token,
                Report::Complete { result },
            )
            .unwrap();
    }
    let attempts = |world: &Driver| -> Vec<u32> {
        ids.iter()
            .map(|&id| record(world, id).callback.unwrap().attempts)
            .collect()
    };
    assert_eq!(attempts(&world), [0, 0, 0]);
    // Room for one body of about 10 kB and a half: one callback goes, two stay due.
    world.step(Input::Tick {
        callback_slots: 10,
        callback_bytes: 15_000,
    });
    assert_eq!(
        attempts(&world).iter().sum::<u32>(),
        1,
        "{:?}",
        attempts(&world)
    );
    world.step(Input::Tick {
        callback_slots: 10,
        callback_bytes: usize::MAX,
    });
    assert_eq!(attempts(&world), [1, 1, 1]);
}
