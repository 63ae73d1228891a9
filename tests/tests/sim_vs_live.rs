//! One short scripted workload through the real server (real HTTP, real sled) and through the
//! virtual-time driver: every task must pass through the same states in the same order. The
//! two differ only in their shells around the engine's step, so any decision made in a shell
//! alone would show here.

use sluice_engine::sim::Driver;
use sluice_engine::{EngineOptions, NativeDecider, Report};
use sluice_model::{Actor, FailureClass, Heartbeat, Limits, TaskSpec};
use sluice_tests::*;
use std::time::Duration;

/// The tasks, by role: what each is submitted as.
fn specs() -> Vec<Value> {
    vec![
        json!({"kind": "oct.scan", "priority": "urgent", "payload": {"role": 0}}),
        json!({"kind": "oct.scan", "priority": "normal", "payload": {"role": 1}}),
        json!({"kind": "oct.scan", "priority": "low", "payload": {"role": 2}}),
        json!({"kind": "oct.scan", "priority": "normal", "payload": {"role": 3}}),
        json!({"kind": "oct.scan", "priority": "normal", "max_attempts": 1, "payload": {"role": 4}}),
        json!({"kind": "oct.scan", "priority": "low", "payload": {"role": 5}}),
    ]
}

/// What a worker does with attempt `attempt` of the task of `role`: the reports it sends.
fn script(role: usize, attempt: u64) -> Vec<(&'static str, Value)> {
    let fail = |class: &str| ("fail", json!({"class": class, "message": "scripted"}));
    let complete = ("complete", json!({"result": {"ok": role}}));
    match (role, attempt) {
        (0, _) => vec![("start", json!({})), complete],
        (1, _) => vec![("start", json!({})), fail("permanent")],
        (2, _) => vec![complete],
        (3, 1) => vec![("start", json!({})), fail("transient")],
        (3, _) => vec![("start", json!({})), complete],
        _ => vec![fail("transient")],
    }
}

/// Role 5 is cancelled while it waits; the others run until they end.
const CANCELLED: usize = 5;
const RUN: usize = 5;

fn report_of(what: &str, body: &Value) -> Report {
    match what {
        "start" => Report::Start,
        "complete" => Report::Complete {
            result: body["result"].clone(),
        },
        _ => Report::Fail {
            class: serde_json::from_value::<FailureClass>(body["class"].clone()).unwrap(),
            message: body["message"].as_str().unwrap_or_default().to_owned(),
        },
    }
}

fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "completed" | "dead" | "cancelled" | "failed" | "timed_out"
    )
}

/// Each role's (from, to) steps as the server's event log has them.
async fn live() -> Vec<Vec<(Value, Value)>> {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        dir.path(),
        &[
            "--policy-config",
            "retry.initial_delay_ms=1",
            "--policy-config",
            "retry.max_delay_ms=1",
        ],
    );
    let client = http();
    let mut ids = Vec::new();
    for spec in specs() {
        let created = post_json(&client, &server.endpoint("/v1/tasks"), &spec).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        ids.push(created.body["id"].as_str().unwrap().to_owned());
    }
    let cancel = format!("/v1/tasks/{}/cancel", ids[CANCELLED]);
    let cancelled = post_json(&client, &server.endpoint(&cancel), &json!({})).await;
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.body);
    register_worker(&client, &server, "w", 1).await;
    let mut ended = 0;
    while ended < RUN {
        let lease = claim_lease(&client, &server, "w").await;
        let id = lease["task"]["id"].as_str().unwrap();
        let role = ids.iter().position(|known| known == id).unwrap();
        let token = lease["lease_token"].clone();
        let attempt = lease["attempt"].as_u64().unwrap();
        let mut last = Value::Null;
        for (what, mut body) in script(role, attempt) {
            body["lease_token"] = token.clone();
            let answer = report(&client, &server, id, what, body).await;
            assert_eq!(answer.status, 200, "{what}: {:?}", answer.body);
            last = answer.body["state"].clone();
        }
        if is_terminal(last.as_str().unwrap_or_default()) {
            ended += 1;
        }
    }
    let mut steps = Vec::new();
    for id in &ids {
        let url = server.endpoint(&format!("/v1/tasks/{id}/events"));
        let events = get_json(&client, &url).await;
        assert_eq!(events.status, 200, "{:?}", events.body);
        let list = events.body["events"].as_array().expect("events").clone();
        steps.push(
            list.iter()
                .map(|e| (e["from"].clone(), e["to"].clone()))
                .collect(),
        );
    }
    steps
}

/// The same script on the driver, with the same settings of the retry policy.
fn simulated() -> Vec<Vec<(Value, Value)>> {
    let mut decide = NativeDecider::default();
    decide.retry.initial_delay_ms = 1;
    decide.retry.max_delay_ms = 1;
    let mut driver = Driver::with_decide(1, EngineOptions::default(), Box::new(decide));
    let mut ids = Vec::new();
    for spec in specs() {
        let spec: TaskSpec = serde_json::from_value(spec).unwrap();
        let submission = spec.into_submission(None, &Limits::default()).unwrap();
        ids.push(driver.submit(submission).unwrap().task.id);
    }
    driver.cancel(ids[CANCELLED], Actor::api()).unwrap();
    driver.heartbeat("w", one_gpu()).unwrap();
    let mut ended = 0;
    let mut idle_ticks = 0;
    while ended < RUN {
        let Some(task) = driver.claim("w", 1).unwrap().leases.pop() else {
            // Nothing queued: the retry is waiting. Let virtual time pass.
            idle_ticks += 1;
            assert!(idle_ticks < 1_000, "the driver never released the retry");
            driver.tick(100);
            driver.heartbeat("w", one_gpu()).unwrap();
            continue;
        };
        let role = ids.iter().position(|&known| known == task.id).unwrap();
        let token = task.lease.as_ref().unwrap().token.clone();
        let mut last = task.state;
        for (what, body) in script(role, u64::from(task.attempt)) {
            last = driver
                .report(task.id, &token, report_of(what, &body))
                .unwrap()
                .state;
        }
        if last.is_terminal() {
            ended += 1;
        }
    }
    ids.iter()
        .map(|&id| {
            driver
                .store()
                .events()
                .iter()
                .filter(|e| e.task_id == id)
                .map(|e| {
                    let e = serde_json::to_value(e).unwrap();
                    (e["from"].clone(), e["to"].clone())
                })
                .collect()
        })
        .collect()
}

fn one_gpu() -> Heartbeat {
    serde_json::from_value(
        json!({"gpus": [{"model": "A100", "memory_mb": 40000}], "max_concurrency": 1}),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_and_the_driver_take_every_task_through_the_same_states() {
    let live = tokio::time::timeout(Duration::from_secs(120), live())
        .await
        .expect("the live run finished");
    let simulated = simulated();
    assert_eq!(live.len(), simulated.len());
    for (role, (live, simulated)) in live.iter().zip(&simulated).enumerate() {
        assert!(live.len() >= 2, "role {role}: {live:?}");
        assert_eq!(live, simulated, "role {role} took another path");
    }
    // The retried task went through RetryWait and back.
    assert!(
        live[3].iter().any(|(_, to)| to == "retry_wait"),
        "{:?}",
        live[3]
    );
}
