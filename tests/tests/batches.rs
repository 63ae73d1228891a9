//! GPU batches end to end, on each store: `sluice worker --batch-size` processes claim batches
//! over HTTP and run each as one synthetic call; every batch holds one kind, model and batch
//! key on one GPU, no more than its size, and every task completes exactly once. Bad batch
//! claims and batch keys get problem+json.

use serde_json::{Value, json};
use sluice_tests::*;
use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TASKS: usize = 240;
const BATCH_SIZE: u64 = 8;

fn spawn_worker(server: &Server, id: &str, seed: u64) -> Child {
    Command::new(sluice_binary())
        .args([
            "worker",
            "--server",
            &server.endpoint(""),
            "--id",
            id,
            "--gpus",
            "2",
            "--batch-size",
            &BATCH_SIZE.to_string(),
            "--batch-wait-ms",
            "50",
            "--exec-ms",
            "30",
            "--seed",
            &seed.to_string(),
        ])
        .env("SLUICE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start a worker")
}

on_each_store!(batches_hold_one_model_and_shape_and_every_task_completes_once);

async fn batches_hold_one_model_and_shape_and_every_task_completes_once(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start(dir.path());
    let client = http();
    let tasks: Vec<Value> = (0..TASKS)
        .map(|n| {
            let priority = ["urgent", "normal", "low", "normal", "low"][n % 5];
            let model = ["seg-v3", "denoise-v2"][n % 2];
            let shape = ["512x496", "1024x496"][(n / 2) % 2];
            json!({
                "kind": "oct.infer",
                "priority": priority,
                "tenant": format!("site-{}", n % 3),
                "est_exec_ms": 1000,
                "resources": {"model": model, "batch_key": shape, "gpu_memory_mb": 1000},
            })
        })
        .collect();
    for chunk in tasks.chunks(60) {
        let answer = post_json(
            &client,
            &server.endpoint("/v1/tasks:batch"),
            &json!({ "tasks": chunk }),
        )
        .await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
    }
    let mut workers: Vec<Child> = (0..2)
        .map(|n| spawn_worker(&server, &format!("batcher-{n}"), n))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let done = all_tasks(&client, &server).await;
        if done.iter().all(|t| t["state"] == "completed") || Instant::now() > deadline {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for worker in &workers {
        let _ = Command::new("kill")
            .args(["-TERM", &worker.id().to_string()])
            .status();
    }
    for worker in &mut workers {
        let output = worker.wait().unwrap();
        assert!(output.success(), "a worker exited {output:?}");
    }
    assert_eq!(done.len(), TASKS);
    let unfinished: Vec<&Value> = done.iter().filter(|t| t["state"] != "completed").collect();
    assert!(
        unfinished.is_empty(),
        "{} unfinished: {:?}",
        unfinished.len(),
        unfinished.first()
    );

    // One batch: the tasks one worker's claim leased together on one GPU, at one moment.
    let mut batches: BTreeMap<(String, u64, u64), Vec<&Value>> = BTreeMap::new();
    for task in &done {
        let lease = &task["lease"];
        let key = (
            lease["worker"].as_str().unwrap().to_owned(),
            lease["gpu"].as_u64().expect("a batch runs on a GPU"),
            lease["claimed_at_ms"].as_u64().unwrap(),
        );
        batches.entry(key).or_default().push(task);
    }
    let mut largest = 0;
    for (key, members) in &batches {
        let first = &members[0];
        for task in members {
            assert_eq!(task["kind"], first["kind"], "{key:?}");
            assert_eq!(
                task["resources"]["model"], first["resources"]["model"],
                "{key:?}"
            );
            assert_eq!(
                task["resources"]["batch_key"], first["resources"]["batch_key"],
                "{key:?}"
            );
            // The executor ran the batch as one call of this many tasks.
            assert_eq!(task["result"]["batch"], members.len(), "{key:?}");
        }
        assert!(
            members.len() as u64 <= BATCH_SIZE,
            "{key:?}: {}",
            members.len()
        );
        largest = largest.max(members.len());
    }
    assert!(largest > 1, "no batch held more than one task");
    assert!(batches.len() < TASKS, "every task ran alone");

    // Every task entered `completed` once, by the event log.
    let mut completions: BTreeMap<String, usize> = BTreeMap::new();
    let mut after = 0;
    loop {
        let url = server.endpoint(&format!("/v1/events?after={after}&limit=1000"));
        let page = get_json(&client, &url).await;
        let events = page.body["events"].as_array().expect("events").clone();
        let Some(last) = events.last() else { break };
        after = last["seq"].as_u64().unwrap();
        for event in events.iter().filter(|e| e["to"] == "completed") {
            *completions
                .entry(event["task_id"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    assert_eq!(completions.len(), TASKS);
    assert!(
        completions.values().all(|&n| n == 1),
        "a task completed twice"
    );
    assert_gap_free_log(&client, &server).await;
}

#[tokio::test]
async fn bad_batch_claims_and_batch_keys_are_refused_with_problems() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = http();
    register_worker(&client, &server, "w", 8).await;
    let claim = server.endpoint("/v1/workers/w/claim");
    for (body, status, problem) in [
        (json!({"batch": {"max_size": 0}}), 400, "invalid-request"),
        (
            json!({"max": 4, "batch": {"max_size": 8}}),
            400,
            "invalid-request",
        ),
        (json!({"batch": {"max_size": 65}}), 400, "invalid-request"),
        (
            json!({"batch": {"max_size": 8, "max_wait_ms": 10001}}),
            400,
            "invalid-request",
        ),
        (
            json!({"batch": {"max_size": 8, "models": ["no spaces"]}}),
            400,
            "invalid-request",
        ),
        (
            json!({"batch": {"max_size": 8, "colour": "red"}}),
            400,
            "invalid-request",
        ),
        (json!({"batch": {}}), 400, "invalid-request"),
    ] {
        let answer = post_json(&client, &claim, &body).await;
        assert_problem(&answer, status, problem);
    }
    // A well-formed batch claim with nothing queued and no wait answers no leases.
    let answer = post_json(&client, &claim, &json!({"batch": {"max_size": 8}})).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.body["leases"], json!([]));
    let refused = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "k", "resources": {"batch_key": "512 x 496"}}),
    )
    .await;
    assert_problem(&refused, 422, "invalid-task");
    assert!(
        refused.body["detail"]
            .as_str()
            .unwrap()
            .contains("resources.batch_key"),
        "{:?}",
        refused.body
    );
}
