//! The sled store on a real directory: what is committed is read back, and recovered.

use super::*;
use sluice_engine::Engine;
use sluice_engine::testing::EngineTestSupport;
use sluice_model::{Actor, Limits, Submission, TaskSpec};

fn open(dir: &std::path::Path) -> SledStore {
    SledStore::open(dir, &SledOptions::default()).unwrap()
}

fn reopen(dir: &std::path::Path) -> SledStore {
    SledStore::reopen(dir, &SledOptions::default()).unwrap()
}

fn submission(
    kind: &str,
    device: &str,
    key: Option<&str>,
    payload: serde_json::Value,
) -> Submission {
    let spec: TaskSpec = serde_json::from_value(serde_json::json!({
        "kind": kind, "device": device, "key": key, "payload": payload
    }))
    .unwrap();
    spec.into_submission(None, &Limits::default()).unwrap()
}

/// Creates a task through the engine, commits it alone, and returns it.
fn create(engine: &mut Engine, store: &SledStore, now_ms: u64, submission: &Submission) -> Task {
    let admission = submission.native_admission(0);
    let change = engine.test_plan_create(now_ms, u128::from(now_ms), submission, &admission);
    engine.test_apply(&change);
    store.commit(&change).unwrap();
    change.writes[0].task.clone()
}

#[test]
fn tasks_payloads_keys_and_timelines_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut engine = Engine::default();
    let small = submission(
        "oct.scan",
        "s1",
        Some("exam-1"),
        serde_json::json!({"eye": "left"}),
    );
    let big_payload = serde_json::json!({"blob": "x".repeat(20_000)});
    let big = submission("oct.scan", "s1", None, big_payload.clone());
    let a = create(&mut engine, &store, 1_000, &small);
    let b = create(&mut engine, &store, 1_001, &big);

    assert_eq!(store.task(a.id).unwrap(), Some(a.clone()));
    assert_eq!(store.payload(a.id).unwrap().unwrap(), br#"{"eye":"left"}"#);
    let stored_big: serde_json::Value =
        serde_json::from_slice(&store.payload(b.id).unwrap().unwrap()).unwrap();
    assert_eq!(stored_big, big_payload);
    let key = store.key("exam-1").unwrap().unwrap();
    assert_eq!((key.task_id, key.fingerprint), (a.id, small.fingerprint));
    assert_eq!(store.key("exam-2").unwrap(), None);

    // A state change keeps the payload, wherever it lives, and extends the timeline.
    for task in [&a, &b] {
        let change = engine
            .test_plan_transition(
                2_000,
                task,
                State::Cancelled,
                Actor::api(),
                Some("by hand".into()),
            )
            .unwrap();
        engine.test_apply(&change);
        store.commit(&change).unwrap();
    }
    assert_eq!(store.payload(a.id).unwrap().unwrap(), br#"{"eye":"left"}"#);
    assert_eq!(
        store.payload(b.id).unwrap().unwrap().len(),
        serde_json::to_vec(&big_payload).unwrap().len()
    );
    let timeline = store.events_of(a.id, 0, 100).unwrap().unwrap();
    let steps: Vec<_> = timeline.iter().map(|e| (e.seq, e.to)).collect();
    assert_eq!(
        steps,
        [
            (1, State::Created),
            (2, State::Queued),
            (5, State::Cancelled)
        ]
    );
    assert_eq!(timeline[2].detail.as_deref(), Some("by hand"));
    assert_eq!(timeline[2].actor, Actor::api());
    let after = store.events_of(a.id, 1, 1).unwrap().unwrap();
    assert_eq!(after.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
    assert!(
        store
            .events_of(TaskId::from_u128(1), 0, 10)
            .unwrap()
            .is_none()
    );
}

#[test]
fn listing_filters_pages_and_respects_its_scan_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut engine = Engine::default();
    let mut ids = Vec::new();
    for n in 0..10u64 {
        let kind = if n % 2 == 0 { "even" } else { "odd" };
        let task = create(
            &mut engine,
            &store,
            1_000 + n,
            &submission(kind, &format!("d{}", n % 3), None, serde_json::Value::Null),
        );
        ids.push(task.id);
    }
    let cancelled = store.task(ids[4]).unwrap().unwrap();
    let change = engine
        .test_plan_transition(5_000, &cancelled, State::Cancelled, Actor::api(), None)
        .unwrap();
    store.commit(&change).unwrap();

    let query = |state, kind: Option<&str>, after, limit, scan_budget| ListQuery {
        state,
        kind: kind.map(str::to_owned),
        device: None,
        after,
        limit,
        scan_budget,
    };
    let all = store.list(&query(None, None, None, 100, 100)).unwrap();
    assert_eq!(all.tasks.iter().map(|t| t.id).collect::<Vec<_>>(), ids);
    assert_eq!(all.next_after, None);

    let first = store.list(&query(None, None, None, 4, 100)).unwrap();
    assert_eq!(first.tasks.len(), 4);
    assert_eq!(first.next_after, Some(ids[3]));
    let second = store
        .list(&query(None, None, first.next_after, 100, 100))
        .unwrap();
    assert_eq!(second.tasks[0].id, ids[4]);
    assert_eq!(second.tasks.len(), 6);

    let queued_even = store
        .list(&query(Some(State::Queued), Some("even"), None, 100, 100))
        .unwrap();
    assert_eq!(
        queued_even.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        [ids[0], ids[2], ids[6], ids[8]]
    );
    let gone = store
        .list(&query(Some(State::Cancelled), None, None, 100, 100))
        .unwrap();
    assert_eq!(
        gone.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        [ids[4]]
    );

    // A rare filter stops at the budget and says where to go on.
    let budgeted = store.list(&query(None, Some("odd"), None, 100, 3)).unwrap();
    assert_eq!(
        budgeted.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        [ids[1]]
    );
    assert_eq!(budgeted.next_after, Some(ids[2]));
}

#[test]
fn recovery_finds_numbering_counts_and_live_tasks_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let (last_id, cancelled_id) = {
        let store = open(dir.path());
        let mut engine = Engine::default();
        let a = create(
            &mut engine,
            &store,
            10,
            &submission("k", "d", None, serde_json::Value::Null),
        );
        let b = create(
            &mut engine,
            &store,
            11,
            &submission("k", "d", None, serde_json::Value::Null),
        );
        let change = engine
            .test_plan_transition(12, &a, State::Cancelled, Actor::api(), None)
            .unwrap();
        store.commit(&change).unwrap();
        store.sync().unwrap();
        (b.id, a.id)
    };
    let store = reopen(dir.path());
    let recovery = store.recover().unwrap();
    assert_eq!(recovery.last_event_seq, 5);
    assert_eq!(recovery.last_task_id, Some(last_id));
    assert_eq!(
        recovery.tasks_by_state[usize::from(State::Queued.code())],
        1
    );
    assert_eq!(
        recovery.tasks_by_state[usize::from(State::Cancelled.code())],
        1
    );
    // The queued task comes back from its index entry alone, whole.
    assert!(recovery.live.is_empty());
    assert_eq!(recovery.queued.len(), 1);
    assert_eq!(recovery.queued[0].id, last_id);
    assert_ne!(recovery.queued[0].id, cancelled_id);
    let record = store.task(last_id).unwrap().unwrap();
    assert_eq!(recovery.queued[0], sluice_model::QueueEntry::of(&record));
}

#[test]
fn pages_too_large_for_the_log_land_in_blob_files_that_sync_covers() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let mut engine = Engine::default();
    // A 3 MiB payload is past sled's blob threshold, a quarter of a segment (of 1 MiB, or 8 MiB
    // in directories made before).
    let huge = serde_json::json!({"blob": "z".repeat(3 << 20)});
    let spec: TaskSpec =
        serde_json::from_value(serde_json::json!({"kind": "k", "payload": huge.clone()})).unwrap();
    let limits = Limits {
        max_payload_bytes: 4 << 20,
        ..Limits::default()
    };
    let task = create(
        &mut engine,
        &store,
        1,
        &spec.into_submission(None, &limits).unwrap(),
    );
    store.sync().unwrap();
    store.materialize().unwrap();
    let blobs = std::fs::read_dir(dir.path().join("blobs")).unwrap().count();
    assert!(blobs >= 1, "sled wrote the page as a blob file");
    assert_eq!(
        store.synced_blob_count(),
        blobs,
        "every blob file was synced"
    );
    let read: serde_json::Value =
        serde_json::from_slice(&store.payload(task.id).unwrap().unwrap()).unwrap();
    assert_eq!(read, huge);
}

#[test]
fn commits_that_never_reached_sled_come_back_from_the_write_ahead_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::default();
    let big_payload = serde_json::json!({"blob": "y".repeat(20_000)});
    let (queued, claimed_then_cancelled, big) = {
        let store = SledStore::open_without_materializer(dir.path()).unwrap();
        let queued = create(
            &mut engine,
            &store,
            10,
            &submission("k", "d", Some("exam-7"), serde_json::Value::Null),
        );
        let other = create(
            &mut engine,
            &store,
            11,
            &submission("k", "d", None, serde_json::Value::Null),
        );
        let big = create(
            &mut engine,
            &store,
            12,
            &submission("k", "d", None, big_payload.clone()),
        );
        // Half of what follows reaches sled, then the rest stays in the log only.
        store.materialize().unwrap();
        for state in [State::Claimed, State::Cancelled] {
            let task = store.task(other.id).unwrap().unwrap();
            let change = engine
                .test_plan_transition(13, &task, state, Actor::api(), None)
                .unwrap();
            engine.test_apply(&change);
            store.commit(&change).unwrap();
        }
        store.sync().unwrap();
        // Readers see the log's version before sled has it.
        assert_eq!(
            store.task(other.id).unwrap().unwrap().state,
            State::Cancelled
        );
        (queued, other.id, big)
    };
    let store = reopen(dir.path());
    let cancelled = store.task(claimed_then_cancelled).unwrap().unwrap();
    assert_eq!(cancelled.state, State::Cancelled);
    assert_eq!(store.task(queued.id).unwrap(), Some(queued.clone()));
    assert_eq!(store.key("exam-7").unwrap().unwrap().task_id, queued.id);
    let stored_big: serde_json::Value =
        serde_json::from_slice(&store.payload(big.id).unwrap().unwrap()).unwrap();
    assert_eq!(stored_big, big_payload);
    let timeline = store
        .events_of(claimed_then_cancelled, 0, 100)
        .unwrap()
        .unwrap();
    assert_eq!(
        timeline.iter().map(|e| e.to).collect::<Vec<_>>(),
        [
            State::Created,
            State::Queued,
            State::Claimed,
            State::Cancelled
        ]
    );
    assert_eq!(store.events_after(0, 100).unwrap().len(), 8);
    // The index holds each task once, under its last state.
    let recovery = store.recover().unwrap();
    assert_eq!(recovery.last_event_seq, 8);
    assert_eq!(
        recovery.tasks_by_state[usize::from(State::Queued.code())],
        2
    );
    assert_eq!(
        recovery.tasks_by_state[usize::from(State::Claimed.code())],
        0
    );
    assert_eq!(
        recovery.tasks_by_state[usize::from(State::Cancelled.code())],
        1
    );
    assert!(recovery.live.is_empty());
    let query = ListQuery {
        state: Some(State::Cancelled),
        kind: None,
        device: None,
        after: None,
        limit: 10,
        scan_budget: 10,
    };
    let listed = store.list(&query).unwrap();
    assert_eq!(
        listed.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        [claimed_then_cancelled]
    );
}

#[test]
fn listing_merges_what_is_only_in_the_log_with_what_is_in_sled() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open_without_materializer(dir.path()).unwrap();
    let mut engine = Engine::default();
    let mut ids = Vec::new();
    for n in 0..6u64 {
        let task = create(
            &mut engine,
            &store,
            n,
            &submission("k", "d", None, serde_json::Value::Null),
        );
        ids.push(task.id);
        if n == 2 {
            store.materialize().unwrap();
        }
    }
    // Task 1 is in sled as queued, and cancelled in the log only.
    let task = store.task(ids[1]).unwrap().unwrap();
    let change = engine
        .test_plan_transition(9, &task, State::Cancelled, Actor::api(), None)
        .unwrap();
    store.commit(&change).unwrap();
    let query = |state, after, limit| ListQuery {
        state,
        kind: None,
        device: None,
        after,
        limit,
        scan_budget: 100,
    };
    let queued = store.list(&query(Some(State::Queued), None, 100)).unwrap();
    assert_eq!(
        queued.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        [ids[0], ids[2], ids[3], ids[4], ids[5]]
    );
    let all = store.list(&query(None, None, 3)).unwrap();
    assert_eq!(
        all.tasks
            .iter()
            .map(|t| (t.id, t.state))
            .collect::<Vec<_>>(),
        [
            (ids[0], State::Queued),
            (ids[1], State::Cancelled),
            (ids[2], State::Queued)
        ]
    );
    assert_eq!(all.next_after, Some(ids[2]));
    let rest = store.list(&query(None, all.next_after, 10)).unwrap();
    assert_eq!(
        rest.tasks.iter().map(|t| t.id).collect::<Vec<_>>(),
        &ids[3..]
    );
}
