//! kill -9 under load: every acknowledged task survives, with its events, and nothing doubles.
//! Three rounds of submit → SIGKILL → restart on the same directory.

use sluice_tests::*;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const ROUNDS: usize = 3;
const CLIENTS: usize = 8;
/// Each round's kill comes once this many of its submissions have been acknowledged.
const ACKED_BEFORE_KILL: usize = 300;
const MAX_REQUESTS_PER_CLIENT: usize = 50_000;

fn key(round: usize, client: usize, n: usize) -> String {
    format!("crash-{round}-{client}-{n}")
}

fn body(round: usize, client: usize, n: usize) -> Value {
    let priority = ["urgent", "normal", "low"][n % 3];
    json!({"kind": "oct.analyze", "key": key(round, client, n), "device": format!("scanner-{client}"),
           "priority": priority, "payload": {"round": round, "client": client, "n": n}})
}

/// How a round stops the server while requests are in flight.
#[derive(Clone, Copy, PartialEq)]
enum Stop {
    Kill,
    Terminate,
}

/// One round: 8 clients submit until enough are acknowledged, then the server is stopped with
/// requests in flight. Returns key → id of the acknowledged ones and the keys tried.
async fn submit_then_stop(
    server: Server,
    round: usize,
    how: Stop,
) -> (HashMap<String, String>, Vec<Value>) {
    let url = server.endpoint("/v1/tasks");
    let client = http();
    let stop = Arc::new(AtomicBool::new(false));
    let acked_count = Arc::new(AtomicUsize::new(0));
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let (client, url, stop, acked_count) = (
            client.clone(),
            url.clone(),
            stop.clone(),
            acked_count.clone(),
        );
        clients.spawn(async move {
            let mut acked = HashMap::new();
            let mut tried = Vec::new();
            while !stop.load(Ordering::Acquire) && tried.len() < MAX_REQUESTS_PER_CLIENT {
                let body = body(round, c, tried.len());
                let sent = client.post(&url).json(&body).send().await;
                tried.push(body);
                let Ok(response) = sent else { continue };
                let answer = answer(response).await;
                if answer.status == 201 {
                    let key = answer.body["key"].as_str().unwrap().to_owned();
                    acked.insert(key, answer.body["id"].as_str().unwrap().to_owned());
                    acked_count.fetch_add(1, Ordering::Relaxed);
                }
            }
            (acked, tried)
        });
    }
    let waited = Instant::now();
    while acked_count.load(Ordering::Relaxed) < ACKED_BEFORE_KILL {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the server acknowledged too little"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    match how {
        Stop::Kill => server.kill9(),
        Stop::Terminate => assert_eq!(
            server.terminate().code(),
            Some(0),
            "SIGTERM under load exits 0"
        ),
    }
    stop.store(true, Ordering::Release);
    let mut acked = HashMap::new();
    let mut tried = Vec::new();
    while let Some(done) = clients.join_next().await {
        let (client_acked, client_tried) = done.unwrap();
        acked.extend(client_acked);
        tried.extend(client_tried);
    }
    (acked, tried)
}

/// Every acknowledged task is stored with exactly its creation and admission events, and no
/// key or id or event number appears twice.
async fn check_nothing_lost_or_doubled(server: &Server, acked: &HashMap<String, String>) {
    let client = http();
    let tasks = all_tasks(&client, server).await;
    let mut keys = HashSet::new();
    let mut by_id = HashMap::new();
    for task in &tasks {
        let key = task["key"].as_str().unwrap();
        assert!(keys.insert(key.to_owned()), "key {key} names two tasks");
        assert!(
            by_id.insert(task["id"].as_str().unwrap(), task).is_none(),
            "an id appears twice"
        );
    }
    let mut seqs = HashSet::new();
    for (key, id) in acked {
        let task = by_id
            .get(id.as_str())
            .unwrap_or_else(|| panic!("acknowledged task {id} ({key}) is lost"));
        assert_eq!(task["key"], json!(key));
        assert_eq!(task["state"], "queued");
        let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
        let events = events.body["events"].as_array().unwrap().clone();
        let steps: Vec<(&Value, &Value)> = events.iter().map(|e| (&e["from"], &e["to"])).collect();
        assert_eq!(
            steps,
            [
                (&Value::Null, &json!("created")),
                (&json!("created"), &json!("queued"))
            ],
            "{id}"
        );
        for event in &events {
            assert!(
                seqs.insert(event["seq"].as_u64().unwrap()),
                "an event seq repeats"
            );
        }
    }
}

on_each_store!(sigkill_during_submissions_loses_and_duplicates_nothing);

async fn sigkill_during_submissions_loses_and_duplicates_nothing(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let mut acked = HashMap::new();
    let mut tried = Vec::new();
    let mut server = store.start(dir.path());
    for round in 0..ROUNDS {
        let (round_acked, round_tried) = submit_then_stop(server, round, Stop::Kill).await;
        assert!(round_acked.len() >= ACKED_BEFORE_KILL);
        acked.extend(round_acked);
        tried.extend(round_tried);
        server = store.start(dir.path());
        check_nothing_lost_or_doubled(&server, &acked).await;
    }

    // The devices resend everything they ever tried: acknowledged keys replay their task, the
    // rest are created or replayed, and nothing doubles.
    let client = http();
    for body in &tried {
        let resend = post_json(&client, &server.endpoint("/v1/tasks"), body).await;
        let key = body["key"].as_str().unwrap();
        match acked.get(key) {
            Some(id) => {
                assert_eq!((resend.status, resend.replayed), (200, true), "{key}");
                assert_eq!(resend.body["id"], json!(id));
            }
            None => assert!(
                resend.status == 200 || resend.status == 201,
                "{key}: {:?}",
                resend.body
            ),
        }
    }
    let stored = all_tasks(&client, &server).await;
    assert_eq!(
        stored.len(),
        tried.len(),
        "one task per key tried, no more, no less"
    );
    check_nothing_lost_or_doubled(&server, &acked).await;
    assert_eq!(
        server.terminate().code(),
        Some(0),
        "SIGTERM stops the server cleanly"
    );
}

on_each_store!(sigterm_under_load_exits_cleanly_and_keeps_everything_acknowledged);

async fn sigterm_under_load_exits_cleanly_and_keeps_everything_acknowledged(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start(dir.path());
    let (acked, tried) = submit_then_stop(server, 0, Stop::Terminate).await;
    let server = store.start(dir.path());
    check_nothing_lost_or_doubled(&server, &acked).await;
    let stored = all_tasks(&http(), &server).await;
    assert!(stored.len() >= acked.len() && stored.len() <= tried.len());
}
