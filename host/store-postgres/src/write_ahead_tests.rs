//! The write-ahead log on a real server: rows committed but not yet written into the table are
//! read from the overlay, survive a leader that dies before writing them (the next one replays
//! the log), are written once per round however often they changed, and after a failed commit
//! nothing more is committed until the log has been read back.

use super::tests::{
    expire_lease, leading_store, plan_create, plan_creates, scratch, task_table_counts,
};
use super::*;
use crate::backend;
use sluice_engine::Engine;
use sluice_engine::testing::EngineTestSupport;
use sluice_model::{Actor, Change, Recovery, State, Task, TaskId};
use sluice_store::{ListQuery, Store};
use std::collections::BTreeMap;

fn count(store: &PgStore, sql: &'static str) -> i64 {
    let pool = store.pool();
    store
        .block(async move {
            sqlx::query_scalar(sql)
                .fetch_one(&pool)
                .await
                .map_err(backend)
        })
        .unwrap()
}

fn claim(engine: &mut Engine, task: &Task, now_ms: u64) -> Change {
    let change = engine
        .test_plan_claim(now_ms, 7, task, "w", None, None)
        .unwrap();
    engine.test_apply(&change);
    change
}

fn cancel(engine: &mut Engine, task: &Task, now_ms: u64) -> Change {
    let change = engine
        .test_plan_transition(now_ms, task, State::Cancelled, Actor::api(), None)
        .unwrap();
    engine.test_apply(&change);
    change
}

fn query(state: Option<State>, after: Option<TaskId>, limit: usize, budget: usize) -> ListQuery {
    ListQuery {
        state,
        kind: None,
        device: None,
        after,
        limit,
        scan_budget: budget,
    }
}

/// Every task `store.list` gives in `state`, page after page.
fn list_all(store: &PgStore, state: Option<State>, limit: usize, budget: usize) -> Vec<Task> {
    let mut tasks = Vec::new();
    let mut after = None;
    for _ in 0..1_000 {
        let page = store.list(&query(state, after, limit, budget)).unwrap();
        tasks.extend(page.tasks);
        match page.next_after {
            Some(next) => after = Some(next),
            None => return tasks,
        }
    }
    panic!("a listing that never ends");
}

#[test]
fn a_leader_that_dies_before_writing_its_rows_loses_none_of_them() {
    let Some(db) = scratch() else { return };
    let old = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    old.lead("old", "127.0.0.1:1").unwrap();
    // No round runs while this is held: the rows stay in the log and the overlay.
    let rounds = old.pending.rounds.lock().unwrap();
    let mut engine = Engine::default();
    let created = plan_creates(&mut engine, 5, "dies");
    old.commit(&created).unwrap();
    let tasks: Vec<Task> = created.writes.iter().map(|w| w.task.clone()).collect();
    let claimed = claim(&mut engine, &tasks[0], 5_000);
    old.commit(&claimed).unwrap();
    let claimed_again = claim(&mut engine, &tasks[1], 5_001);
    let cancelled = cancel(&mut engine, &claimed_again.writes[0].task, 5_002);
    let mut group = claimed_again;
    group.merge(cancelled);
    old.commit(&group).unwrap();
    old.sync().unwrap();

    // Read through the overlay: nothing is in the table yet.
    assert_eq!(count(&old, "SELECT count(*) FROM sluice_tasks"), 0);
    assert_eq!(count(&old, "SELECT count(*) FROM sluice_wal"), 3);
    let first = old.task(tasks[0].id).unwrap().unwrap();
    assert_eq!(first.state, State::Claimed);
    assert_eq!(
        old.payload(tasks[0].id).unwrap(),
        Some(created.new_tasks[0].payload_json.clone())
    );
    let ids = |tasks: &[Task]| tasks.iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(
        ids(&list_all(&old, Some(State::Claimed), 10, 100)),
        [tasks[0].id]
    );
    assert_eq!(list_all(&old, Some(State::Queued), 2, 100).len(), 3);

    // The leader dies (its lease runs out); the next one replays the log before it reads.
    expire_lease(&old);
    let new = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    new.lead("new", "127.0.0.1:2").unwrap();
    let recovery = new.recover().unwrap();
    assert_eq!(count(&new, "SELECT count(*) FROM sluice_wal"), 0);
    assert_eq!(count(&new, "SELECT count(*) FROM sluice_tasks"), 5);
    assert_eq!(recovery.queued.len(), 3);
    assert_eq!(ids(&recovery.live), [tasks[0].id]);
    assert_eq!(
        recovery.tasks_by_state[usize::from(State::Cancelled.code())],
        1
    );
    assert_eq!(
        new.task(tasks[1].id).unwrap().unwrap().state,
        State::Cancelled
    );
    assert_eq!(
        new.payload(tasks[4].id).unwrap(),
        Some(created.new_tasks[4].payload_json.clone())
    );

    // The old leader's own round, once it may run, is refused by the fence, and it stops.
    drop(rounds);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while old.failed().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        old.failed()
            .is_some_and(|reason| reason.contains("deposed"))
    );
    assert_eq!(count(&new, "SELECT count(*) FROM sluice_tasks"), 5);
}

#[test]
fn a_task_submitted_and_ended_within_a_round_is_written_into_the_table_once() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    let created = plan_create(&mut engine, 1_000, "once");
    let task = created.writes[0].task.clone();
    store.commit(&created).unwrap();
    let claimed = claim(&mut engine, &task, 2_000);
    store.commit(&claimed).unwrap();
    store
        .commit(&cancel(&mut engine, &claimed.writes[0].task, 3_000))
        .unwrap();
    store.materialize().unwrap();
    let counts = task_table_counts(&store, |counts| counts.inserts >= 1);
    assert_eq!((counts.inserts, counts.updates), (1, 0));
    assert_eq!(count(&store, "SELECT count(*) FROM sluice_wal"), 0);
    let pool = store.pool();
    let id = task.id.to_bytes().to_vec();
    let (state, payload): (i16, Vec<u8>) = store
        .block(async move {
            sqlx::query_as("SELECT state, payload FROM sluice_tasks WHERE id = $1")
                .bind(id)
                .fetch_one(&pool)
                .await
                .map_err(backend)
        })
        .unwrap();
    assert_eq!(state, i16::from(State::Cancelled.code()));
    assert_eq!(payload, created.new_tasks[0].payload_json);
}

/// Listings of tasks partly in the table and partly still pending (some with a newer row
/// pending over an older one in the table) give every task once, in its newest state, in id
/// order, whatever the page size and budget.
#[test]
fn listings_merge_the_tables_rows_with_the_rows_still_pending() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    let mut latest: BTreeMap<TaskId, Task> = BTreeMap::new();
    let commit = |store: &PgStore, change: Change, latest: &mut BTreeMap<TaskId, Task>| {
        for write in &change.writes {
            latest.insert(write.task.id, write.task.clone());
        }
        store.commit(&change).unwrap();
    };
    commit(&store, plan_creates(&mut engine, 12, "table"), &mut latest);
    store.materialize().unwrap();
    // Changed after they reached the table: claimed (every third), cancelled (every fifth).
    let stored: Vec<Task> = latest.values().cloned().collect();
    let rounds = store.pending.rounds.lock().unwrap();
    for (n, task) in stored.iter().enumerate() {
        if n % 3 == 0 {
            commit(
                &store,
                claim(&mut engine, task, 5_000 + n as u64),
                &mut latest,
            );
        } else if n % 5 == 0 {
            commit(
                &store,
                cancel(&mut engine, task, 5_000 + n as u64),
                &mut latest,
            );
        }
    }
    // New ones, some changed too, none in the table.
    let fresh = plan_creates(&mut engine, 9, "pending");
    commit(&store, fresh.clone(), &mut latest);
    for write in fresh.writes.iter().step_by(4) {
        commit(&store, claim(&mut engine, &write.task, 9_000), &mut latest);
    }
    for state in [
        None,
        Some(State::Queued),
        Some(State::Claimed),
        Some(State::Cancelled),
    ] {
        let expected: Vec<&Task> = latest
            .values()
            .filter(|t| state.is_none_or(|s| t.state == s))
            .collect();
        for (limit, budget) in [(1, 100), (3, 100), (100, 1), (100, 4), (100, 1_000)] {
            let listed = list_all(&store, state, limit, budget);
            assert_eq!(
                listed.iter().collect::<Vec<_>>(),
                expected,
                "{state:?}, limit {limit}, budget {budget}"
            );
        }
    }
    drop(rounds);
}

#[test]
fn after_a_failed_commit_nothing_more_is_committed_until_the_log_is_read_back() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let first = plan_create(&mut Engine::default(), 1_000, "same");
    store.commit(&first).unwrap();
    // An engine that does not know the key: the unique constraint refuses its commit.
    let mut stale = Engine::default();
    let duplicate = plan_create(&mut stale, 2_000, "same");
    assert!(store.commit(&duplicate).is_err());
    let mut engine = Engine::recover(
        Recovery {
            last_task_id: Some(first.writes[0].task.id),
            last_event_seq: first.events.last().unwrap().seq,
            ..Recovery::default()
        },
        sluice_engine::EngineOptions::default(),
    )
    .0;
    let next = plan_create(&mut engine, 3_000, "other");
    let refused = store.commit(&next).unwrap_err();
    assert!(refused.to_string().contains("read back"), "{refused}");
    assert!(store.task(next.writes[0].task.id).unwrap().is_none());
    let recovery = store.recover().unwrap();
    assert_eq!(recovery.queued.len(), 1);
    store.commit(&next).unwrap();
    assert!(store.task(next.writes[0].task.id).unwrap().is_some());
}

/// A round whose answer was lost (it committed, the materializer heard an error) is written
/// again: the same rows over the ones it wrote, not a primary-key failure for ever.
#[test]
fn a_round_written_a_second_time_leaves_the_rows_it_wrote() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    let created = plan_creates(&mut engine, 3, "twice");
    let tasks: Vec<Task> = created.writes.iter().map(|w| w.task.clone()).collect();
    // No round of the store's own runs while this is held.
    let rounds = store.pending.rounds.lock().unwrap();
    store.commit(&created).unwrap();
    store.commit(&claim(&mut engine, &tasks[0], 5_000)).unwrap();
    let generation = materializer::lock(&store.pending.overlay)
        .take_round()
        .unwrap();
    let epoch = store.leadership.epoch();
    for _ in 0..2 {
        let (pool, round) = (store.engine_pool(), generation.clone());
        store
            .block(async move { materializer::apply(&pool, epoch, &round).await })
            .unwrap();
    }
    assert_eq!(count(&store, "SELECT count(*) FROM sluice_tasks"), 3);
    assert_eq!(count(&store, "SELECT count(*) FROM sluice_wal"), 0);
    materializer::lock(&store.pending.overlay).settle(&generation);
    drop(rounds);
    assert_eq!(
        store.task(tasks[0].id).unwrap().unwrap().state,
        State::Claimed
    );
    assert_eq!(
        store.payload(tasks[2].id).unwrap(),
        Some(created.new_tasks[2].payload_json.clone())
    );
}

/// A replica of a version before the write-ahead log would not read it: its takeover (the
/// statement that version sends, without saying it reads the log) is refused by the database,
/// so the rows pending in the log are never lost to it; a replica of this version takes over.
#[test]
fn a_replica_that_does_not_read_the_write_ahead_log_cannot_take_the_lease() {
    let Some(db) = scratch() else { return };
    let old = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    old.lead("dies", "127.0.0.1:1").unwrap();
    let rounds = old.pending.rounds.lock().unwrap();
    let created = plan_creates(&mut Engine::default(), 2, "guarded");
    old.commit(&created).unwrap();
    old.sync().unwrap();
    expire_lease(&old);

    let follower = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    let pool = follower.pool();
    let refused = follower.block(async move {
        sqlx::query_scalar::<_, i64>(
            "UPDATE sluice_leader SET holder = 'older', address = '127.0.0.1:3', \
             epoch = epoch + 1, expires_at = now() + interval '10 seconds' \
             WHERE id = 1 AND expires_at <= now() RETURNING epoch",
        )
        .fetch_optional(&pool)
        .await
        .map_err(backend)
    });
    let Err(StoreError::Backend(error)) = refused else {
        panic!("an older replica's takeover went through: {refused:?}");
    };
    assert!(error.to_string().contains("write-ahead log"), "{error}");
    assert_eq!(follower.leader().unwrap().holder, "dies");

    follower.lead("new", "127.0.0.1:2").unwrap();
    follower.recover().unwrap();
    assert_eq!(count(&follower, "SELECT count(*) FROM sluice_tasks"), 2);
    drop(rounds);
}
