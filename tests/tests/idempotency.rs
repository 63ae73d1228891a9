//! Devices resend: the same key must yield one task and never an error, under concurrency.

use sluice_tests::*;
use std::sync::Arc;
use tokio::sync::Barrier;

on_each_store!(two_hundred_concurrent_resends_make_exactly_one_task);

async fn two_hundred_concurrent_resends_make_exactly_one_task(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start(dir.path());
    let client = http();
    let body = json!({"kind": "oct.analyze", "priority": "urgent", "device": "scanner-7",
                      "tenant": "site-a", "key": "exam-4711", "payload": {"eye": "left", "frames": 512}});
    let barrier = Arc::new(Barrier::new(200));
    let mut requests = tokio::task::JoinSet::new();
    for _ in 0..200 {
        let (client, barrier, body) = (client.clone(), barrier.clone(), body.clone());
        let url = server.endpoint("/v1/tasks");
        requests.spawn(async move {
            barrier.wait().await;
            post_json(&client, &url, &body).await
        });
    }
    let mut created = 0;
    let mut ids = std::collections::HashSet::new();
    while let Some(answer) = requests.join_next().await {
        let answer = answer.unwrap();
        match answer.status {
            201 => created += 1,
            200 => assert!(answer.replayed, "a 200 must say Idempotent-Replay: true"),
            other => panic!("a resend got {other}: {:?}", answer.body),
        }
        ids.insert(answer.body["id"].as_str().unwrap().to_owned());
    }
    assert_eq!(created, 1, "exactly one of the resends creates the task");
    assert_eq!(ids.len(), 1, "every answer names the same task");

    let tasks = all_tasks(&client, &server).await;
    assert_eq!(tasks.len(), 1);
    let id = ids.into_iter().next().unwrap();
    let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
    let steps: Vec<&str> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["to"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        ["created", "queued"],
        "one creation, one admission, nothing else"
    );

    // The same key with another body is a conflict, not a second task.
    let mut other = body.clone();
    other["payload"]["eye"] = json!("right");
    let conflict = post_json(&client, &server.endpoint("/v1/tasks"), &other).await;
    assert_problem(&conflict, 409, "idempotency-conflict");
    assert_eq!(conflict.body["task_id"], json!(id));
    assert_eq!(all_tasks(&client, &server).await.len(), 1);
}

on_each_store!(the_key_may_come_from_the_header_and_must_agree_with_the_body);

async fn the_key_may_come_from_the_header_and_must_agree_with_the_body(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start(dir.path());
    let client = http();
    let url = server.endpoint("/v1/tasks");
    let body = json!({"kind": "embedding.lookup", "payload": {"k": 10}});
    let send = |key: &'static str, body: Value| {
        let request = client.post(&url).header("Idempotency-Key", key).json(&body);
        async move { answer(request.send().await.unwrap()).await }
    };
    let first = send("q-1", body.clone()).await;
    assert_eq!(first.status, 201);
    assert_eq!(first.body["key"], "q-1");
    // The same body with the key in the field instead of the header is the same submission.
    let mut keyed = body.clone();
    keyed["key"] = json!("q-1");
    let again = post_json(&client, &url, &keyed).await;
    assert_eq!((again.status, again.replayed), (200, true));
    assert_eq!(again.body["id"], first.body["id"]);
    // Header and field disagreeing is refused, and creates nothing.
    let mut clash = body.clone();
    clash["key"] = json!("q-2");
    assert_problem(&send("q-1", clash).await, 422, "invalid-task");
    // Without any key, every submission is a new task.
    let a = post_json(&client, &url, &body).await;
    let b = post_json(&client, &url, &body).await;
    assert_eq!((a.status, b.status), (201, 201));
    assert_ne!(a.body["id"], b.body["id"]);
    assert_eq!(all_tasks(&client, &server).await.len(), 3);
}
