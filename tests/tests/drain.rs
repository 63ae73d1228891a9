//! Graceful drain: on SIGTERM the server refuses new work and new claims, lets leased work
//! report, and exits 0 within the drain timeout; after a restart every task is accounted for,
//! and a lease still out across the restart completes normally.

use sluice_tests::*;
use std::time::{Duration, Instant};

const TASKS: usize = 20;

on_each_store!(sigterm_under_load_lets_running_work_finish_then_exits_zero_and_loses_nothing);

async fn sigterm_under_load_lets_running_work_finish_then_exits_zero_and_loses_nothing(
    store: TestStore,
) {
    let dir = tempfile::tempdir().unwrap();
    let drain_timeout = Duration::from_secs(20);
    let server = store.start_with(dir.path(), &["--drain-timeout-ms", "20000"]);
    let client = http();
    for n in 0..TASKS {
        let answer = post_json(
            &client,
            &server.endpoint("/v1/tasks"),
            &json!({"kind": "oct.inference", "key": format!("exam-{n}")}),
        )
        .await;
        assert_eq!(answer.status, 201);
    }
    let worker = Worker::start(&server, "gpu-0", &["--gpus", "2", "--exec-ms", "1500"]);
    wait_for("two attempts running", Duration::from_secs(30), || {
        let client = client.clone();
        let server = &server;
        async move { (count_in(&client, server, "running").await == 2).then_some(()) }
    })
    .await;
    let running = get_json(&client, &server.endpoint("/v1/tasks?state=running")).await;
    let in_flight: Vec<String> = running.body["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(in_flight.len(), 2);

    let stopping = Instant::now();
    server.send_sigterm();
    // Draining: not ready, no new submissions.
    let ready = wait_for("the drain to begin", Duration::from_secs(10), || {
        let client = client.clone();
        let url = server.endpoint("/readyz");
        async move {
            let answer = get_json(&client, &url).await;
            (answer.status == 503).then_some(answer)
        }
    })
    .await;
    assert_problem(&ready, 503, "draining");
    let refused = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "late"}),
    )
    .await;
    assert_problem(&refused, 503, "draining");

    let status = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    let took = stopping.elapsed();
    assert!(status.success(), "exit {status}");
    assert!(took < drain_timeout, "drain took {took:?}");
    drop(worker);

    // After a restart every task is there: the two in flight completed, none half-done.
    let server = store.start(dir.path());
    let tasks = all_tasks(&client, &server).await;
    assert_eq!(tasks.len(), TASKS);
    for task in &tasks {
        let state = task["state"].as_str().unwrap();
        let id = task["id"].as_str().unwrap();
        if in_flight.iter().any(|f| f == id) {
            assert_eq!(state, "completed", "{task:?}");
        } else {
            assert!(["completed", "queued"].contains(&state), "{task:?}");
        }
    }
    // And the rest is served by the restarted server.
    let worker = Worker::start(&server, "gpu-0", &["--gpus", "4", "--exec-ms", "10"]);
    wait_for("every task to complete", Duration::from_secs(60), || {
        let client = client.clone();
        let server = &server;
        async move { (count_in(&client, server, "completed").await == TASKS as u64).then_some(()) }
    })
    .await;
    worker.terminate();
}

on_each_store!(a_lease_outlives_a_restart_and_its_holder_completes_normally);

async fn a_lease_outlives_a_restart_and_its_holder_completes_normally(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start_with(dir.path(), &["--drain-timeout-ms", "0"]);
    let client = http();
    let submitted = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "k"}),
    )
    .await;
    let id = submitted.body["id"].as_str().unwrap().to_owned();
    let beat = post_json(
        &client,
        &server.endpoint("/v1/workers/w/heartbeat"),
        &json!({"gpus": [{"memory_mb": 16000}]}),
    )
    .await;
    assert_eq!(beat.status, 200);
    let claimed = post_json(
        &client,
        &server.endpoint("/v1/workers/w/claim"),
        &json!({"max": 1}),
    )
    .await;
    let token = claimed.body["leases"][0]["lease_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let status = server.terminate();
    assert!(status.success());

    let server = store.start(dir.path());
    let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(task.body["state"], "claimed");
    let done = post_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{id}/complete")),
        &json!({"lease_token": token, "result": 42}),
    )
    .await;
    assert_eq!(done.status, 200, "{:?}", done.body);
    assert_eq!(done.body["state"], "completed");
    assert_eq!(done.body["result"], 42);
}
