//! The seed's load, scaled to CI: 800 tasks in mixed priorities submitted at once, 8 real
//! `sluice worker --max-concurrency 4` processes (one GPU each, the default), 2 failing 30 % of
//! their attempts and 1 SIGKILLed mid-run. Every
//! task ends Completed, or Dead only with its attempts spent on injected failures; none
//! completes twice; none is lost or left behind.

use sluice_tests::*;
use std::collections::BTreeMap;
use std::time::Duration;

const TASKS: usize = 800;

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_hundred_tasks_eight_workers_two_flaky_one_killed_nothing_lost_or_doubled() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        dir.path(),
        &[
            "--lease-ms",
            "2000",
            "--policy-config",
            "retry.initial_delay_ms=20",
            "--policy-config",
            "retry.max_delay_ms=200",
        ],
    );
    let client = http();
    let mut workers = Vec::new();
    for n in 0..8 {
        let id = format!("gpu-{n}");
        // The flags a user would pass: one GPU (the default) shared by four attempts.
        let mut args = vec!["--max-concurrency", "4", "--exec-ms", "60"];
        let seed = n.to_string();
        if n < 2 {
            args.extend(["--fail-rate", "0.3", "--seed", &seed]);
        }
        workers.push(Worker::start(&server, &id, &args));
    }
    let victim = workers.remove(7);

    // Everything at once, in batches, 100 concurrent requests of 8 tasks each.
    let mut batches = Vec::new();
    for b in 0..(TASKS / 8) {
        let tasks: Vec<Value> = (0..8)
            .map(|i| {
                let priority = ["urgent", "normal", "low"][(b * 8 + i) % 3];
                json!({"kind": "oct.inference", "priority": priority, "key": format!("scan-{b}-{i}"),
                       "resources": {"gpu_memory_mb": 4000}})
            })
            .collect();
        let client = client.clone();
        let url = server.endpoint("/v1/tasks:batch");
        batches.push(tokio::spawn(async move {
            post_json(&client, &url, &json!({ "tasks": tasks })).await
        }));
    }
    for batch in batches {
        let answer = batch.await.unwrap();
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        for item in answer.body["results"].as_array().unwrap() {
            assert_eq!(item["status"], 201, "{item:?}");
        }
    }

    // Mid-run, one worker dies holding leases.
    wait_for(
        "a quarter of the tasks to complete",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            let server = &server;
            async move { (count_in(&client, server, "completed").await >= 200).then_some(()) }
        },
    )
    .await;
    victim.kill9();

    let terminal = ["completed", "dead", "failed", "cancelled", "timed_out"];
    wait_for("every task to end", Duration::from_secs(120), || {
        let client = client.clone();
        let server = &server;
        async move {
            let mut ended = 0;
            for state in terminal {
                ended += count_in(&client, server, state).await;
            }
            (ended == TASKS as u64).then_some(())
        }
    })
    .await;
    for worker in workers {
        worker.terminate();
    }

    let tasks = all_tasks(&client, &server).await;
    assert_eq!(tasks.len(), TASKS, "a task was lost or made twice");
    let mut waits: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut retries = 0u64;
    let mut completed = 0;
    let mut dead = 0;
    for task in &tasks {
        let id = task["id"].as_str().unwrap();
        let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
        let events = events.body["events"].as_array().unwrap().clone();
        let into = |state: &str| {
            events
                .iter()
                .filter(|e| e["to"] == state && e["from"] != state)
                .count()
        };
        match task["state"].as_str().unwrap() {
            "completed" => {
                completed += 1;
                assert_eq!(
                    into("completed"),
                    1,
                    "{id} completed {} times",
                    into("completed")
                );
            }
            "dead" => {
                dead += 1;
                // Dead only with every attempt spent on an injected failure.
                let error = &task["error"];
                assert!(
                    error["message"]
                        .as_str()
                        .unwrap()
                        .contains("attempts spent"),
                    "{task:?}"
                );
                assert!(
                    ["transient", "lease-expired"].contains(&error["class"].as_str().unwrap()),
                    "{task:?}"
                );
                assert_eq!(task["attempt"], task["max_attempts"]);
                assert_eq!(into("completed"), 0);
            }
            other => panic!("task {id} ended {other}: {task:?}"),
        }
        retries += into("retry_wait") as u64;
        let created = events[0]["at_ms"].as_u64().unwrap();
        if let Some(claimed) = events.iter().find(|e| e["to"] == "claimed") {
            let wait_ms = claimed["at_ms"].as_u64().unwrap() - created;
            let bucket = task["priority"].as_str().unwrap().to_owned();
            waits.entry(bucket).or_default().push(wait_ms);
        }
    }
    println!(
        "seed load: {TASKS} tasks, {:.1} % completed, {dead} dead, {retries} retries",
        completed as f64 * 100.0 / TASKS as f64
    );
    for (bucket, waits) in &mut waits {
        waits.sort_unstable();
        println!(
            "  wait {bucket:>6}: p50 {} ms, p99 {} ms",
            percentile(waits, 0.5),
            percentile(waits, 0.99)
        );
    }
    assert!(completed + dead == TASKS);
    assert!(retries > 0, "the flaky workers injected no failure");
    let dead_share = dead as f64 / TASKS as f64;
    assert!(
        dead_share < 0.05,
        "{dead} dead: more than injected failures explain"
    );
}
