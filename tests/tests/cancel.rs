//! Cancel reaches the worker: a real server and the reference worker (`sluice worker`) on one
//! GPU running a long task. The task is cancelled; the worker hears it at its next lease
//! heartbeat, stops the attempt and says so, and only then does the next task land on the GPU.

use sluice_tests::*;
use std::time::Duration;

async fn task(client: &reqwest::Client, server: &Server, id: &str) -> Value {
    let read = get_json(client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(read.status, 200, "{:?}", read.body);
    read.body
}

async fn wait_for_state(client: &reqwest::Client, server: &Server, id: &str, state: &str) {
    wait_for(
        &format!("{id} to be {state}"),
        Duration::from_secs(30),
        || async { (task(client, server, id).await["state"] == state).then_some(()) },
    )
    .await;
}

async fn cancel(client: &reqwest::Client, server: &Server, id: &str) {
    let url = server.endpoint(&format!("/v1/tasks/{id}/cancel"));
    let cancelled = post_json(client, &url, &json!({})).await;
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.body);
    assert_eq!(cancelled.body["state"], "cancelled");
}

on_each_store!(a_cancelled_running_task_is_stopped_by_the_worker_before_its_gpu_takes_another);

async fn a_cancelled_running_task_is_stopped_by_the_worker_before_its_gpu_takes_another(
    store: TestStore,
) {
    let dir = tempfile::tempdir().unwrap();
    // Lease heartbeats every second; a task runs ten minutes unless stopped.
    let server = store.start_with(dir.path(), &["--lease-ms", "3000"]);
    let worker = Worker::start(
        &server,
        "gpu-0",
        &[
            "--gpus",
            "1",
            "--max-concurrency",
            "1",
            "--exec-ms",
            "600000",
        ],
    );
    let client = http();
    let submit = |n: u32| {
        let client = client.clone();
        let url = server.endpoint("/v1/tasks");
        async move {
            let created = post_json(
                &client,
                &url,
                &json!({"kind": "oct.scan", "payload": {"n": n}}),
            )
            .await;
            assert_eq!(created.status, 201, "{:?}", created.body);
            created.body["id"].as_str().unwrap().to_owned()
        }
    };
    let first = submit(1).await;
    wait_for_state(&client, &server, &first, "running").await;
    let second = submit(2).await;
    cancel(&client, &server, &first).await;

    wait_for_state(&client, &server, &second, "running").await;
    let first_now = task(&client, &server, &first).await;
    let lease = &first_now["lease"];
    let stopped_at_ms = lease["stopped_at_ms"]
        .as_u64()
        .expect("the worker said it stopped");
    let ended_at_ms = lease["ended_at_ms"].as_u64().unwrap();
    // Said by the worker, before the lease ran out (the lease is not extended after a cancel).
    assert!(
        stopped_at_ms < lease["expires_at_ms"].as_u64().unwrap(),
        "{lease}"
    );
    assert!(stopped_at_ms >= ended_at_ms);
    assert_eq!(first_now["state"], "cancelled");
    // The second task was leased only once the first had stopped: never two on the one GPU.
    let second_now = task(&client, &server, &second).await;
    let claimed_at_ms = second_now["lease"]["claimed_at_ms"].as_u64().unwrap();
    assert!(claimed_at_ms >= stopped_at_ms, "{second_now}");
    assert_eq!(second_now["lease"]["gpu"], 0);
    let timeline = get_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{first}/events")),
    )
    .await;
    let details: Vec<&str> = timeline.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["detail"].as_str())
        .collect();
    assert!(
        details
            .iter()
            .any(|d| d.contains("stopped on worker gpu-0")),
        "{details:?}"
    );

    cancel(&client, &server, &second).await;
    let summary = worker.terminate();
    assert!(summary.contains("cancelled 2"), "{summary}");
    assert!(summary.contains("completed 0"), "{summary}");
}
