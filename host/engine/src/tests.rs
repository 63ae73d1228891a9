//! Unit tests of the deterministic core: no threads, no store, no clock.

use super::*;
use sluice_model::{Limits, Priority, TaskSpec};

fn submission(kind: &str, priority: Priority, key: Option<&str>) -> Submission {
    let spec: TaskSpec = serde_json::from_value(serde_json::json!({
        "kind": kind, "priority": priority, "key": key, "payload": {"n": 1}
    }))
    .unwrap();
    spec.into_submission(None, &Limits::default()).unwrap()
}

fn create(engine: &mut Engine, now_ms: u64, random: u128, priority: Priority) -> Task {
    let submitted = submission("k", priority, None);
    let change = engine.plan_create(now_ms, random, &submitted, &submitted.native_admission(0));
    engine.apply(&change);
    change.writes[0].task.clone()
}

#[test]
fn a_new_task_is_created_then_admitted_with_one_event_each() {
    let mut engine = Engine::default();
    let submitted = submission("oct.scan", Priority::Low, Some("exam-1"));
    let change = engine.plan_create(1_000, 7, &submitted, &submitted.native_admission(0));
    let task = &change.writes[0].task;
    assert_eq!(task.state, State::Queued);
    assert_eq!(task.bucket, Priority::Low);
    let steps: Vec<_> = change
        .events
        .iter()
        .map(|e| (e.seq, e.from, e.to))
        .collect();
    assert_eq!(
        steps,
        [
            (1, None, State::Created),
            (2, Some(State::Created), State::Queued)
        ]
    );
    assert_eq!(change.new_tasks[0].key.as_ref().unwrap().0, "exam-1");

    assert_eq!(task.event_seqs, [1, 2]);

    // Planning alone changes nothing; applying the change does.
    assert_eq!(engine.queues().total(), 0);
    engine.apply(&change);
    assert_eq!(engine.queues().front(Priority::Low), Some(task.id));
    assert_eq!(engine.tasks_in(State::Queued), 1);
    let submitted = submission("k", Priority::Low, None);
    let next = engine.plan_create(1_000, 7, &submitted, &submitted.native_admission(1));
    assert_eq!(next.events[0].seq, 3);
    assert!(next.writes[0].task.id > task.id);
}

#[test]
fn cancel_moves_a_task_out_of_its_queue_and_terminal_tasks_refuse_change() {
    let mut engine = Engine::default();
    let task = create(&mut engine, 10, 1, Priority::Urgent);
    let change = engine
        .plan_transition(20, &task, State::Cancelled, Actor::api(), None)
        .unwrap();
    engine.apply(&change);
    let cancelled = &change.writes[0].task;
    assert_eq!(cancelled.state, State::Cancelled);
    assert_eq!(cancelled.updated_at_ms, 20);
    assert_eq!(change.events[0].from, Some(State::Queued));
    assert_eq!(engine.queues().len(Priority::Urgent), 0);
    assert_eq!(engine.tasks_in(State::Cancelled), 1);
    assert_eq!(engine.tasks_in(State::Queued), 0);

    let refused = engine.plan_transition(30, cancelled, State::Queued, Actor::api(), None);
    assert_eq!(
        refused.unwrap_err(),
        IllegalTransition {
            from: State::Cancelled,
            to: State::Queued
        }
    );
    assert_eq!(engine.illegal_transitions(), 1);
}

#[test]
fn the_key_verdict_tells_new_replay_and_conflict_apart() {
    let record = KeyRecord {
        task_id: TaskId::from_u128(9),
        fingerprint: [1; 32],
    };
    assert_eq!(judge_key(None, &[1; 32]), KeyVerdict::New);
    assert_eq!(
        judge_key(Some(&record), &[1; 32]),
        KeyVerdict::Replay(record.task_id)
    );
    assert_eq!(
        judge_key(Some(&record), &[2; 32]),
        KeyVerdict::Conflict(record.task_id)
    );
}

#[test]
fn recovery_rebuilds_queues_leases_and_numbering_from_the_live_tasks() {
    let mut source = Engine::default();
    let normal = create(&mut source, 1, 1, Priority::Normal);
    let mut unadmitted = create(&mut source, 2, 2, Priority::Normal);
    unadmitted.state = State::Created;
    let urgent = create(&mut source, 3, 3, Priority::Urgent);
    let mut running = create(&mut source, 4, 4, Priority::Low);
    running.state = State::Running;
    running.lease = Some(sluice_model::Lease {
        worker: "gpu-7".into(),
        token: "t".into(),
        attempt: 1,
        expires_at_ms: 50_000,
        attempt_ends_at_ms: 90_000,
        claimed_at_ms: 30_000,
        started_at_ms: None,
        gpu: None,
        refusal_logged: false,
        ended_at_ms: None,
        stopped_at_ms: None,
        claim_id: None,
        revoked_at_ms: None,
        revoked_for: None,
    });
    let recovery = Recovery {
        last_event_seq: 41,
        last_task_id: Some(running.id),
        live: vec![
            normal.clone(),
            unadmitted.clone(),
            urgent.clone(),
            running.clone(),
        ],
        ..Recovery::default()
    };
    let (engine, pending) = Engine::recover(recovery, EngineOptions::default());
    assert_eq!(pending, [unadmitted.id]);
    assert_eq!(engine.queues().front(Priority::Normal), Some(normal.id));
    assert_eq!(engine.queues().front(Priority::Urgent), Some(urgent.id));
    assert_eq!(engine.queues().total(), 2);
    // The recovered lease is held by its worker and expires on time.
    assert_eq!(engine.workers(0)[0].leases, 1);
    assert_eq!(engine.due(49_999, 10), []);
    assert_eq!(engine.due(50_000, 10), [running.id]);
    let submitted = submission("k", Priority::Low, None);
    let change = engine.plan_create(0, 0, &submitted, &submitted.native_admission(0));
    assert_eq!(change.events[0].seq, 42);
    assert!(
        change.writes[0].task.id > running.id,
        "ids keep growing even with a clock behind them"
    );
}

#[test]
fn the_same_inputs_replay_to_the_same_changes() {
    let run = || {
        let mut engine = Engine::default();
        let mut out = Vec::new();
        for n in 0..50u64 {
            let priority = Priority::ALL[(n % 3) as usize];
            let submitted = submission("k", priority, None);
            let change = engine.plan_create(
                1_000 + n / 7,
                u128::from(n * 7919),
                &submitted,
                &submitted.native_admission(n),
            );
            engine.apply(&change);
            out.push((change.writes[0].task.id, change.events.clone()));
        }
        out
    };
    assert_eq!(run(), run());
}

/// A heartbeat may say any memory per GPU: the worker's free memory saturates instead of
/// wrapping around (or panicking in a debug build).
#[test]
fn a_workers_free_gpu_memory_saturates() {
    let mut engine = Engine::default();
    let gpu = sluice_model::Gpu {
        model: "A100".into(),
        memory_mb: u64::MAX,
        free: true,
    };
    let heartbeat = sluice_model::Heartbeat {
        gpus: vec![gpu.clone(), gpu],
        max_concurrency: 2,
        ..sluice_model::Heartbeat::default()
    };
    engine.heartbeat(1, "w", heartbeat).unwrap();
    let view = engine.worker(1, "w").unwrap();
    assert_eq!(view.free_gpus, 2);
    assert_eq!(view.free_gpu_memory_mb, u64::MAX);
}
