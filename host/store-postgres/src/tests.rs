//! The PostgreSQL store on a real server (`SLUICE_TEST_POSTGRES`, skipped with a line when it is
//! not set): fencing of a deposed leader, handing the lease over, and what a commit writes.

use super::*;
use crate::backend;
use sluice_engine::Engine;
use sluice_engine::testing::EngineTestSupport;
use sluice_model::{Limits, State, Submission, TaskSpec};
use sluice_store::Store;
use sluice_store::{ListPage, ListQuery};

/// A fresh database, dropped at the end of the test.
pub(super) struct Scratch(pub(super) String);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = drop_scratch_database(&self.0);
    }
}

pub(super) fn scratch() -> Option<Scratch> {
    match std::env::var("SLUICE_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(Scratch(scratch_database(&url, "sluice_unit").unwrap())),
        _ => {
            assert!(
                std::env::var("SLUICE_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                "SLUICE_REQUIRE_POSTGRES=1 but SLUICE_TEST_POSTGRES is not set"
            );
            eprintln!("skipped: SLUICE_TEST_POSTGRES is not set");
            None
        }
    }
}

/// A store on a fresh database that leads it; the database goes with the `Scratch`.
pub(super) fn leading_store() -> Option<(Scratch, PgStore)> {
    let db = scratch()?;
    let store = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    store.lead("only", "127.0.0.1:1").unwrap();
    Some((db, store))
}

fn submission(key: &str) -> Submission {
    let spec: TaskSpec = serde_json::from_value(serde_json::json!({
        "kind": "oct.scan", "device": "s1", "key": key, "payload": {"eye": "left"}
    }))
    .unwrap();
    spec.into_submission(None, &Limits::default()).unwrap()
}

pub(super) fn plan_create(engine: &mut Engine, now_ms: u64, key: &str) -> sluice_model::Change {
    let submission = submission(key);
    let admission = submission.native_admission(0);
    let change = engine.test_plan_create(now_ms, u128::from(now_ms), &submission, &admission);
    engine.test_apply(&change);
    change
}

/// `count` new tasks planned one after another, keys `prefix-0`, `prefix-1`, ..., as one change.
pub(super) fn plan_creates(engine: &mut Engine, count: u64, prefix: &str) -> sluice_model::Change {
    let mut change = sluice_model::Change::default();
    for n in 0..count {
        change.merge(plan_create(engine, 1_000 + n, &format!("{prefix}-{n}")));
    }
    change
}

/// Ends `store`'s lease at once, as if it had not renewed it for `LEASE_MS`.
pub(super) fn expire_lease(store: &PgStore) {
    let pool = store.pool();
    store
        .block(async move {
            sqlx::query("UPDATE sluice_leader SET expires_at = '-infinity'")
                .execute(&pool)
                .await
                .map_err(backend)?;
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_deposed_leaders_late_commit_fails_and_writes_nothing() {
    let Some(db) = scratch() else { return };
    let old = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    assert_eq!(old.lead("old", "127.0.0.1:1").unwrap(), 1);
    let mut engine = Engine::default();
    let first = plan_create(&mut engine, 1_000, "exam-1");
    old.commit(&first).unwrap();
    old.sync().unwrap();

    // Another replica takes over while the old leader still thinks it leads.
    expire_lease(&old);
    let new = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    assert_eq!(new.lead("new", "127.0.0.1:2").unwrap(), 2);
    let late = plan_create(&mut engine, 2_000, "exam-2");
    let refused = old.commit(&late).unwrap_err();
    assert!(
        matches!(&refused, StoreError::Failed(reason) if reason.contains("deposed")),
        "{refused}"
    );
    assert!(
        old.failed().is_some(),
        "a deposed store takes no more writes"
    );
    assert!(matches!(old.sync(), Err(StoreError::Failed(_))));

    // The new leader sees the first task and nothing of the late one.
    let recovery = new.recover().unwrap();
    assert_eq!(recovery.queued.len(), 1);
    assert_eq!(recovery.last_event_seq, first.events.last().unwrap().seq);
    assert!(new.key("exam-2").unwrap().is_none());
    assert_eq!(
        new.key("exam-1").unwrap().unwrap().task_id,
        first.writes[0].task.id
    );
    assert_eq!(new.leader().unwrap().holder, "new");
}

#[test]
fn a_clean_stop_hands_the_lease_over_at_once() {
    let Some(db) = scratch() else { return };
    let first = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    first.lead("first", "127.0.0.1:1").unwrap();
    let standby = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    let info = standby.leader().unwrap();
    assert!(info.live && info.holder == "first" && info.epoch == 1);
    assert_eq!(standby.take_lead("standby", "127.0.0.1:2").unwrap(), None);
    // A store that does not lead refuses to write.
    assert!(matches!(
        standby.commit(&plan_create(&mut Engine::default(), 5, "k")),
        Err(StoreError::Failed(_))
    ));
    drop(first);
    let started = std::time::Instant::now();
    assert_eq!(standby.lead("standby", "127.0.0.1:2").unwrap(), 2);
    // Well inside the lease: the stop released it rather than letting it run out.
    assert!(started.elapsed() < std::time::Duration::from_millis(leader::LEASE_MS));
}

#[test]
fn a_duplicate_idempotency_key_fails_the_whole_commit() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let first = plan_create(&mut Engine::default(), 1_000, "same");
    store.commit(&first).unwrap();
    // An engine that numbers on from the store but does not check keys: the database's
    // unique constraint refuses the second task.
    let mut engine = Engine::recover(
        store.recover().unwrap(),
        sluice_engine::EngineOptions::default(),
    )
    .0;
    let second = plan_create(&mut engine, 2_000, "same");
    assert!(store.commit(&second).is_err());
    let recovery = store.recover().unwrap();
    assert_eq!(recovery.queued.len(), 1);
    assert_eq!(
        store.key("same").unwrap().unwrap().task_id,
        first.writes[0].task.id
    );
}

#[test]
fn the_event_log_reads_back_from_its_blocks_one_event_or_a_run_at_a_time() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    // Groups of one to three tasks, so blocks of different lengths.
    let mut logged = Vec::new();
    for group in 0..6u64 {
        let mut change = sluice_model::Change::default();
        for n in 0..=(group % 3) {
            change.merge(plan_create(
                &mut engine,
                1_000 + group * 10 + n,
                &format!("k-{group}-{n}"),
            ));
        }
        logged.extend(change.events.clone());
        store.commit(&change).unwrap();
    }
    assert!(logged.len() > 6, "several events a block");
    let seqs = |events: &[sluice_model::Event]| events.iter().map(|e| e.seq).collect::<Vec<_>>();
    for after in 0..=logged.len() as u64 {
        for limit in [1, 2, 5, 1_000] {
            let read = store.events_after(after, limit).unwrap();
            let expected: Vec<_> = logged
                .iter()
                .filter(|e| e.seq > after)
                .take(limit)
                .cloned()
                .collect();
            assert_eq!(seqs(&read), seqs(&expected), "after {after}, limit {limit}");
            assert_eq!(read, expected);
        }
    }
    for event in &logged {
        let of_task = store.events_of(event.task_id, 0, 100).unwrap().unwrap();
        let expected: Vec<_> = logged
            .iter()
            .filter(|e| e.task_id == event.task_id)
            .cloned()
            .collect();
        assert_eq!(of_task, expected);
    }
    assert_eq!(store.first_event_seq().unwrap(), 1);
    assert_eq!(
        store.recover().unwrap().last_event_seq,
        logged.last().unwrap().seq
    );
}

#[test]
fn listing_by_state_examines_at_most_its_budget_and_state_changes_are_hot_updates() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    let mut ids = Vec::new();
    for n in 0..10u64 {
        let change = plan_create(&mut engine, 1_000 + n, &format!("exam-{n}"));
        ids.push(change.writes[0].task.id);
        store.commit(&change).unwrap();
    }
    // The rows in the table, so the state changes below are updates of them.
    store.materialize().unwrap();
    for (n, &id) in ids.iter().enumerate().filter(|(n, _)| n % 3 == 0) {
        let task = store.task(id).unwrap().unwrap();
        let to = if n == 9 {
            State::Cancelled
        } else {
            State::Claimed
        };
        let change = if to == State::Claimed {
            engine
                .test_plan_claim(5_000, 7, &task, "w", None, None)
                .unwrap()
        } else {
            engine
                .test_plan_transition(5_000, &task, to, sluice_model::Actor::api(), None)
                .unwrap()
        };
        engine.test_apply(&change);
        store.commit(&change).unwrap();
    }
    store.sync().unwrap();
    store.materialize().unwrap();
    let query = |state, after, limit, scan_budget| ListQuery {
        state,
        kind: None,
        device: None,
        after,
        limit,
        scan_budget,
    };
    let listed = |page: &ListPage| page.tasks.iter().map(|t| t.id).collect::<Vec<_>>();
    // A live state, through the index of live tasks.
    let claimed = store
        .list(&query(Some(State::Claimed), None, 100, 100))
        .unwrap();
    assert_eq!(listed(&claimed), [ids[0], ids[3], ids[6]]);
    assert_eq!(claimed.next_after, None);
    let queued = store
        .list(&query(Some(State::Queued), None, 100, 100))
        .unwrap();
    assert_eq!(queued.tasks.len(), 6);
    // An ended state, in id order among all.
    let cancelled = store
        .list(&query(Some(State::Cancelled), None, 100, 100))
        .unwrap();
    assert_eq!(listed(&cancelled), [ids[9]]);
    // The budget bounds the rows examined, matching or not, and says where to go on.
    let budgeted = store
        .list(&query(Some(State::Claimed), None, 100, 2))
        .unwrap();
    assert_eq!(listed(&budgeted), [ids[0]]);
    assert_eq!(budgeted.next_after, Some(ids[1]));
    let rest = store
        .list(&query(Some(State::Claimed), budgeted.next_after, 100, 100))
        .unwrap();
    assert_eq!(listed(&rest), [ids[3], ids[6]]);

    // The claims changed the state of live tasks only: their rows were updated in place (HOT);
    // the cancel ended a task, and so changed `live`. The server's statistics arrive within
    // a second or so of each commit.
    let counts = task_table_counts(&store, |counts| counts.updates >= 4);
    assert_eq!((counts.updates, counts.hot_updates), (4, 3));
}

/// Migration 0005: a block large enough to be compressed is compressed with lz4 (pglz on a
/// server built without it) and reads back whole.
#[test]
fn large_event_blocks_are_compressed_with_lz4_and_read_back() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    // 200 events: about 9 KB in format 2, past the 2 KB at which PostgreSQL compresses a value.
    let change = plan_creates(&mut engine, 200, "big");
    store.commit(&change).unwrap();
    let pool = store.pool();
    let (method, lz4_built) = store
        .block(async move {
            let method: Option<String> =
                sqlx::query_scalar("SELECT pg_column_compression(events) FROM sluice_event_blocks")
                    .fetch_one(&pool)
                    .await
                    .map_err(backend)?;
            let lz4_built = sqlx::raw_sql("CREATE TEMP TABLE lz4_probe (b bytea COMPRESSION lz4)")
                .execute(&pool)
                .await
                .is_ok();
            Ok((method, lz4_built))
        })
        .unwrap();
    let expected = if lz4_built { "lz4" } else { "pglz" };
    assert_eq!(method.as_deref(), Some(expected), "a compressed block");
    assert_eq!(store.events_after(0, 1_000).unwrap(), change.events);
}

/// The committer's path: a group encoded ahead on the writer's thread is written as a plain
/// commit writes it; anything else handed over as its encoding is planned again.
#[test]
fn a_commit_encoded_ahead_writes_what_a_plain_commit_does() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    let first = plan_create(&mut engine, 1_000, "ahead-1");
    let prepared = store.prepare_commit(&first).unwrap();
    store
        .commit_prepared(&first, prepared.expect("PostgreSQL encodes ahead"))
        .unwrap();
    let second = plan_create(&mut engine, 2_000, "ahead-2");
    store
        .commit_prepared(&second, sluice_store::PreparedCommit::new(7u8))
        .unwrap();
    for change in [&first, &second] {
        for write in &change.writes {
            assert_eq!(
                store.task(write.task.id).unwrap().as_ref(),
                Some(&write.task)
            );
        }
        let (key, record) = change.new_tasks[0].key.clone().unwrap();
        assert_eq!(store.key(&key).unwrap(), Some(record));
    }
    let logged = [first.events.clone(), second.events.clone()].concat();
    assert_eq!(store.events_after(0, 100).unwrap(), logged);
}

/// What the server's statistics count for the task table.
#[derive(Debug)]
pub(super) struct TableCounts {
    pub(super) inserts: i64,
    pub(super) updates: i64,
    pub(super) hot_updates: i64,
    pub(super) index_scans: i64,
}

/// The task table's counts once `enough` holds of them (they arrive within a second or so of
/// each transaction), or after 20 s.
pub(super) fn task_table_counts(
    store: &PgStore,
    enough: impl Fn(&TableCounts) -> bool,
) -> TableCounts {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let pool = store.pool();
        let (inserts, updates, hot_updates, index_scans): (i64, i64, i64, i64) = store
            .block(async move {
                sqlx::query_as(
                    "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, coalesce(idx_scan, 0) \
                     FROM pg_stat_user_tables WHERE relname = 'sluice_tasks'",
                )
                .fetch_one(&pool)
                .await
                .map_err(backend)
            })
            .unwrap();
        let counts = TableCounts {
            inserts,
            updates,
            hot_updates,
            index_scans,
        };
        if enough(&counts) || std::time::Instant::now() > deadline {
            return counts;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Migrations 0006 and 0007: the function that writes task rows (the materializer's now) keeps
/// its plan, and that plan finds changed rows through the primary key even while the table is
/// small enough that a fresh plan would read it whole (a plan kept from then would read it
/// whole for every round once it is large).
#[test]
fn commits_find_changed_rows_through_the_primary_key_on_a_small_table() {
    let Some((_db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    let created = plan_creates(&mut engine, 20, "small");
    store.commit(&created).unwrap();
    store.sync().unwrap();
    store.materialize().unwrap();
    let before = task_table_counts(&store, |_| true).index_scans;
    // Six commits of three claimed tasks each, as groups carry several.
    let mut updated = 0;
    for tasks in created.writes.chunks(3).take(6) {
        let mut group = sluice_model::Change::default();
        for write in tasks {
            let change = engine
                .test_plan_claim(5_000, 7, &write.task, "w", None, None)
                .unwrap();
            engine.test_apply(&change);
            group.merge(change);
        }
        updated += group.writes.len() as i64;
        store.commit(&group).unwrap();
        // A round each, as rounds come apart under load.
        store.materialize().unwrap();
    }
    // Each changed row was found through the primary key: one index probe a row (a plan that
    // read the table whole would make none).
    let after =
        task_table_counts(&store, |counts| counts.index_scans >= before + updated).index_scans;
    assert!(
        after >= before + updated,
        "index scans of the task table {before} -> {after} for {updated} changed rows"
    );
}

/// Readers holding every shared connection (a burst of listings) hold neither the leader's
/// commits back nor its lease renewals: the engine's path has connections of its own.
#[test]
fn readers_holding_every_shared_connection_stop_neither_commits_nor_the_lease() {
    let Some(db) = scratch() else { return };
    let options = PgOptions {
        max_connections: 2,
        acquire_timeout: std::time::Duration::from_secs(1),
        ..PgOptions::default()
    };
    let store = PgStore::open(&db.0, &options).unwrap();
    let epoch = store.lead("only", "127.0.0.1:1").unwrap();
    // Both shared connections, held on the store's runtime until `release` goes.
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let (acquired, all_acquired) = std::sync::mpsc::channel();
    let pool = store.pool();
    store.handle.spawn(async move {
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(pool.acquire().await);
        }
        let _ = acquired.send(held.iter().all(Result::is_ok));
        let _ = released.await;
    });
    assert!(
        all_acquired.recv().unwrap(),
        "holding the shared connections"
    );
    let mut engine = Engine::default();
    let first = plan_create(&mut engine, 1_000, "busy-1");
    store.commit(&first).unwrap();
    store.sync().unwrap();
    // Past the lease's length: only renewals keep it.
    std::thread::sleep(std::time::Duration::from_millis(
        leader::LEASE_MS + leader::RENEW_MS,
    ));
    let second = plan_create(&mut engine, 2_000, "busy-2");
    store.commit(&second).unwrap();
    store.sync().unwrap();
    assert_eq!(store.failed(), None);
    drop(release);

    let lease = store.leader().unwrap();
    assert!(lease.live && lease.epoch == epoch, "{lease:?}");
    for change in [&first, &second] {
        let id = change.writes[0].task.id;
        assert_eq!(store.task(id).unwrap().map(|task| task.id), Some(id));
    }
}

/// Rows are written in format 2 (`sluice_store::record`), and a row an older release wrote in
/// format 1 (JSON) is read as it was: nothing rewrites the table at open.
#[test]
fn rows_are_written_in_format_two_and_rows_of_format_one_still_read() {
    let Some((db, store)) = leading_store() else {
        return;
    };
    let mut engine = Engine::default();
    let change = plan_create(&mut engine, 1_000, "format-1");
    store.commit(&change).unwrap();
    store.materialize().unwrap();
    let task = change.writes[0].task.clone();
    let id = task.id.to_bytes().to_vec();
    let pool = store.pool();
    let first_byte = |pool: sqlx::PgPool, id: Vec<u8>| async move {
        sqlx::query_scalar::<_, i32>("SELECT get_byte(record, 0) FROM sluice_tasks WHERE id = $1")
            .bind(id)
            .fetch_one(&pool)
            .await
            .map_err(backend)
    };
    let written = store.block(first_byte(pool.clone(), id.clone())).unwrap();
    assert_eq!(written, i32::from(sluice_store::record::FORMAT_VERSION));

    // The row as a release of format 1 left it.
    let legacy = serde_json::to_vec(&sluice_wire::TaskView::from(task.clone())).unwrap();
    let (pool_for_update, id_for_update) = (pool.clone(), id.clone());
    store
        .block(async move {
            sqlx::query("UPDATE sluice_tasks SET record = $1 WHERE id = $2")
                .bind(legacy)
                .bind(id_for_update)
                .execute(&pool_for_update)
                .await
                .map_err(backend)
        })
        .unwrap();
    assert_eq!(store.block(first_byte(pool, id)).unwrap(), i32::from(b'{'));
    drop(store);
    let reader = PgStore::open(&db.0, &PgOptions::default()).unwrap();
    assert_eq!(reader.task(task.id).unwrap(), Some(task));
}
