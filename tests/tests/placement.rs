//! Warm-model placement end to end: a real server and two reference workers, one with model
//! `seg-a` loaded. 200 tasks for `seg-a` go to it while it has room, and spill to the other
//! only once they have waited `affinity_wait_ms`; a task that needs more GPU memory than any
//! worker has stays queued, says why, and is never claimed.

use sluice_tests::*;
use std::time::Duration;

const AFFINITY_WAIT_MS: u64 = 2_000;

on_each_store!(model_tasks_go_to_the_warm_worker_and_spill_only_past_affinity_wait_ms);

async fn model_tasks_go_to_the_warm_worker_and_spill_only_past_affinity_wait_ms(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, format!("affinity_wait_ms = {AFFINITY_WAIT_MS}\n")).unwrap();
    let server = store.start_with(dir.path(), &["--config", config.to_str().unwrap()]);
    let places = ["--gpus", "1", "--max-concurrency", "4"];
    let warm_args: Vec<&str> = places
        .iter()
        .copied()
        .chain(["--loaded-models", "seg-a:0:6000"])
        .collect();
    let warm = Worker::start(&server, "warm", &warm_args);
    let cold = Worker::start(&server, "cold", &places);
    let client = http();
    wait_for("both workers", Duration::from_secs(30), || async {
        let workers = get_json(&client, &server.endpoint("/v1/workers")).await;
        (workers.body["workers"].as_array()?.len() == 2).then_some(())
    })
    .await;

    let huge = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.scan", "resources": {"gpu_memory_mb": 100_000, "model": "seg-a"}}),
    )
    .await;
    assert_eq!(huge.status, 201, "{:?}", huge.body);
    let huge = huge.body["id"].as_str().unwrap().to_owned();
    // 200 tasks of 100 ms on four places: five seconds of work for the warm worker alone.
    let tasks: Vec<Value> = (0..200)
        .map(|n| {
            json!({"kind": "oct.scan", "payload": {"n": n, "exec_ms": 100},
                   "resources": {"gpu_memory_mb": 2000, "model": "seg-a"}})
        })
        .collect();
    let batch = post_json(
        &client,
        &server.endpoint("/v1/tasks:batch"),
        &json!({ "tasks": tasks }),
    )
    .await;
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    let ids: Vec<String> = batch.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["task"]["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 200);

    let done = wait_for(
        "200 tasks to complete",
        Duration::from_secs(120),
        || async {
            let mut done = Vec::new();
            for id in &ids {
                let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
                if task.body["state"] != "completed" {
                    return None;
                }
                done.push(task.body);
            }
            Some(done)
        },
    )
    .await;
    let (mut on_warm, mut on_cold, mut least_cold_wait_ms) = (0, 0, u64::MAX);
    for task in &done {
        let lease = &task["lease"];
        let waited_ms =
            lease["claimed_at_ms"].as_u64().unwrap() - task["bucket_since_ms"].as_u64().unwrap();
        match lease["worker"].as_str().unwrap() {
            "warm" => {
                on_warm += 1;
                assert_eq!(lease["gpu"], 0);
            }
            "cold" => {
                on_cold += 1;
                least_cold_wait_ms = least_cold_wait_ms.min(waited_ms);
                assert!(
                    waited_ms >= AFFINITY_WAIT_MS,
                    "spilled after {waited_ms} ms: {task}"
                );
            }
            other => panic!("unknown worker {other}"),
        }
    }
    println!("warm worker ran {on_warm}, cold {on_cold} (the first after {least_cold_wait_ms} ms)");
    assert!(on_warm >= 40, "the warm worker ran {on_warm}");
    assert!(
        on_cold > 0,
        "nothing spilled although the warm worker was full"
    );

    let huge = get_json(&client, &server.endpoint(&format!("/v1/tasks/{huge}"))).await;
    assert_eq!(huge.body["state"], "queued", "{:?}", huge.body);
    assert_eq!(huge.body["attempt"], 0);
    let reason = huge.body["waiting_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("needs 100000 MB of GPU memory") && reason.contains("16384 MB"),
        "{reason}"
    );
    warm.terminate();
    cold.terminate();
}

/// A worker that loads a model as it runs a task for it says so in its next heartbeat, at
/// once (the reference worker with `--learn-models`, through the worker client's
/// `LoadedModels`); the next task for that model then goes to it first.
#[tokio::test]
async fn a_model_loaded_while_working_is_told_at_once_and_draws_its_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let learner = Worker::start(
        &server,
        "learner",
        &["--gpus", "1", "--learn-models", "--exec-ms", "20"],
    );
    let client = http();
    let submit = || async {
        let created = post_json(
            &client,
            &server.endpoint("/v1/tasks"),
            &json!({"kind": "oct.scan", "resources": {"gpu_memory_mb": 3000, "model": "seg-b"}}),
        )
        .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        created.body["id"].as_str().unwrap().to_owned()
    };
    let first = submit().await;
    let loaded = wait_for(
        "the learner to say it holds seg-b",
        Duration::from_secs(30),
        || async {
            let workers = get_json(&client, &server.endpoint("/v1/workers")).await;
            let learner = workers.body["workers"]
                .as_array()?
                .iter()
                .find(|w| w["id"] == "learner")?
                .clone();
            let models = learner["loaded_models"].as_array()?.clone();
            (!models.is_empty()).then_some(models)
        },
    )
    .await;
    assert_eq!(
        loaded,
        [json!({"name": "seg-b", "gpu": 0, "memory_mb": 3000})],
        "after task {first}"
    );
    // A cold worker joins: the next seg-b task still goes to the learner.
    let cold = Worker::start(&server, "cold", &["--gpus", "1", "--exec-ms", "20"]);
    wait_for("both workers", Duration::from_secs(30), || async {
        let workers = get_json(&client, &server.endpoint("/v1/workers")).await;
        (workers.body["workers"].as_array()?.len() == 2).then_some(())
    })
    .await;
    let second = submit().await;
    let done = wait_for("the second task", Duration::from_secs(30), || async {
        let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{second}"))).await;
        (task.body["state"] == "completed").then_some(task.body)
    })
    .await;
    assert_eq!(done["lease"]["worker"], "learner", "{done}");
    learner.terminate();
    cold.terminate();
}
