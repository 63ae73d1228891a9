//! Preemption end to end: a real server with preemption on and two reference workers
//! (`sluice worker`), one GPU each, both busy with long low-priority tasks. Urgent tasks
//! arrive; each starts within `preempt_after_ms` plus one lease heartbeat, because the workers
//! hear `attempt-revoked`, stop their attempts and say so. The preempted tasks complete later
//! with no attempt spent, and none completes twice.

use sluice_tests::*;
use std::time::Duration;

const PREEMPT_AFTER_MS: u64 = 1_000;
/// `--lease-ms 3000`: the reference worker heartbeats a lease every third of it.
const LEASE_HEARTBEAT_MS: u64 = 1_000;

async fn task(client: &reqwest::Client, server: &Server, id: &str) -> Value {
    let read = get_json(client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(read.status, 200, "{:?}", read.body);
    read.body
}

async fn submit(client: &reqwest::Client, server: &Server, priority: &str, exec_ms: u64) -> String {
    let created = post_json(
        client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.scan", "priority": priority, "payload": {"exec_ms": exec_ms},
                "resources": {"gpu_memory_mb": 8000}}),
    )
    .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    created.body["id"].as_str().unwrap().to_owned()
}

async fn wait_for_states(client: &reqwest::Client, server: &Server, ids: &[String], state: &str) {
    wait_for(
        &format!("{ids:?} to be {state}"),
        Duration::from_secs(60),
        || async {
            for id in ids {
                if task(client, server, id).await["state"] != state {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

/// A server with preemption on after `PREEMPT_AFTER_MS` and leases of 3 s, and `more` flags.
fn start_preempting(store: &TestStore, dir: &std::path::Path, more: &[&str]) -> Server {
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!("preemption = true\npreempt_after_ms = {PREEMPT_AFTER_MS}\n"),
    )
    .unwrap();
    let mut args = vec!["--config", config.to_str().unwrap(), "--lease-ms", "3000"];
    args.extend_from_slice(more);
    store.start_with(dir, &args)
}

on_each_store!(urgent_tasks_preempt_low_ones_which_complete_later_with_no_attempt_spent);

async fn urgent_tasks_preempt_low_ones_which_complete_later_with_no_attempt_spent(
    store: TestStore,
) {
    let dir = tempfile::tempdir().unwrap();
    let server = start_preempting(&store, dir.path(), &[]);
    let workers: Vec<Worker> = ["gpu-a", "gpu-b"]
        .iter()
        .map(|id| Worker::start(&server, id, &["--gpus", "1", "--max-concurrency", "1"]))
        .collect();
    let client = http();
    let mut low = Vec::new();
    for _ in 0..2 {
        low.push(submit(&client, &server, "low", 8_000).await);
    }
    wait_for_states(&client, &server, &low, "running").await;
    let mut urgent = Vec::new();
    for _ in 0..2 {
        urgent.push(submit(&client, &server, "urgent", 200).await);
    }
    wait_for_states(&client, &server, &urgent, "completed").await;
    wait_for_states(&client, &server, &low, "completed").await;

    for id in &urgent {
        let done = task(&client, &server, id).await;
        let waited_ms = done["lease"]["started_at_ms"].as_u64().unwrap()
            - done["created_at_ms"].as_u64().unwrap();
        println!("urgent task {id} started {waited_ms} ms after it arrived");
        // The tick that notices runs every 100 ms; the claim and start are a few requests.
        assert!(
            waited_ms <= PREEMPT_AFTER_MS + LEASE_HEARTBEAT_MS + 1_000,
            "urgent task waited {waited_ms} ms: {done}"
        );
        assert_eq!(done["attempt"], 1);
    }
    for id in &low {
        let done = task(&client, &server, id).await;
        assert_eq!(done["preemptions"], 1, "{done}");
        assert_eq!(
            done["attempt"], 2,
            "one attempt spent, one preempted: {done}"
        );
        let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
        let events = events.body["events"].as_array().unwrap().clone();
        let completed = events.iter().filter(|e| e["to"] == "completed").count();
        assert_eq!(completed, 1, "completed once: {events:?}");
        let named = events.iter().any(|e| {
            e["detail"].as_str().is_some_and(|d| {
                d.contains("preempted by urgent task")
                    && urgent.iter().any(|u| d.contains(u.as_str()))
            })
        });
        assert!(named, "the event names the urgent task: {events:?}");
        let stopped = events.iter().any(|e| {
            e["to"] == "queued"
                && e["detail"].as_str().is_some_and(|d| {
                    d.contains("stopped on worker") && d.contains("no attempt spent")
                })
        });
        assert!(
            stopped,
            "the worker stopped it and it waited again: {events:?}"
        );
    }
    let metrics = client
        .get(server.endpoint("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name} ")))
            .map(str::to_owned)
    };
    assert_eq!(value("sluice_task_preemptions_total").as_deref(), Some("2"));
    assert_eq!(
        value("sluice_task_retries_total").as_deref(),
        Some("0"),
        "a preemption is not a retry"
    );
    for worker in workers {
        let summary = worker.terminate();
        assert!(
            summary.contains("cancelled 1"),
            "one attempt stopped each: {summary}"
        );
    }
}

on_each_store!(a_draining_server_preempts_nothing_and_lets_the_low_task_finish);

/// Claims are refused while the server drains, so the urgent task could not take the place a
/// preemption freed: the low task's attempt runs to its end and the drain waits for it.
async fn a_draining_server_preempts_nothing_and_lets_the_low_task_finish(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = start_preempting(&store, dir.path(), &["--drain-timeout-ms", "20000"]);
    let worker = Worker::start(&server, "gpu-a", &["--gpus", "1", "--max-concurrency", "1"]);
    let client = http();
    // Runs three times `preempt_after_ms` plus a lease heartbeat: long enough to be preempted.
    let low = submit(
        &client,
        &server,
        "low",
        3 * PREEMPT_AFTER_MS + LEASE_HEARTBEAT_MS,
    )
    .await;
    wait_for_states(&client, &server, std::slice::from_ref(&low), "running").await;
    let urgent = submit(&client, &server, "urgent", 200).await;
    server.send_sigterm();
    let status = tokio::task::spawn_blocking(move || server.wait())
        .await
        .unwrap();
    assert!(status.success(), "exit {status}");
    drop(worker);

    let server = store.start(dir.path());
    let done = task(&client, &server, &low).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["attempt"], 1, "{done}");
    assert!(done["lease"]["revoked_for"].is_null(), "{done}");
    assert_eq!(done["preemptions"].as_u64().unwrap_or(0), 0, "{done}");
    let waiting = task(&client, &server, &urgent).await;
    assert_eq!(waiting["state"], "queued", "{waiting}");
    assert_eq!(waiting["attempt"], 0, "{waiting}");
}
