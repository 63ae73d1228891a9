//! A task's life over the real API: submit, read, timeline, cancel, list, batch, restart.

use sluice_tests::*;

on_each_store!(submit_read_cancel_list_and_restart);

async fn submit_read_cancel_list_and_restart(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start_with(dir.path(), &["--callback-allow", "127.0.0.1"]);
    let client = http();
    let tasks_url = server.endpoint("/v1/tasks");

    let spec = json!({"kind": "oct.analyze", "priority": "urgent", "device": "scanner-3", "tenant": "site-b",
                      "labels": {"model": "layers-v2"}, "est_exec_ms": 4000, "deadline_ms": 600000,
                      "max_attempts": 5, "callback_url": "http://127.0.0.1:9/done",
                      "resources": {"gpu_memory_mb": 8000}, "payload": {"exam": "E-1", "frames": [1, 2, 3]}});
    let created = post_json(&client, &tasks_url, &spec).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let task = created.body;
    let id = task["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 26);
    assert_eq!(task["state"], "queued");
    assert_eq!(task["bucket"], "urgent");
    assert_eq!(task["attempt"], 0);
    assert_eq!(task["labels"]["model"], "layers-v2");
    assert_eq!(task["resources"]["gpu_memory_mb"], 8000);
    let created_at = task["created_at_ms"].as_u64().unwrap();
    assert_eq!(
        task["deadline_at_ms"].as_u64().unwrap(),
        created_at + 600_000
    );

    // A payload past the inline size is stored apart and reads back the same.
    let big_payload = json!({"vectors": vec![0.25; 4000]});
    let big = post_json(
        &client,
        &tasks_url,
        &json!({"kind": "embedding.index", "device": "front-1", "payload": big_payload}),
    )
    .await;
    assert_eq!(big.status, 201);
    let big_id = big.body["id"].as_str().unwrap().to_owned();

    let read = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.body["payload"], spec["payload"]);
    assert_eq!(read.body["state"], "queued");
    let read_big = get_json(&client, &server.endpoint(&format!("/v1/tasks/{big_id}"))).await;
    assert_eq!(read_big.body["payload"], big_payload);

    // Cancel once; a second cancel is refused, changes nothing, and the timeline shows one.
    let cancel_url = server.endpoint(&format!("/v1/tasks/{id}/cancel"));
    let cancelled = answer(client.post(&cancel_url).send().await.unwrap()).await;
    assert_eq!(cancelled.status, 200);
    assert_eq!(cancelled.body["state"], "cancelled");
    let again = answer(client.post(&cancel_url).send().await.unwrap()).await;
    assert_problem(&again, 409, "invalid-transition");
    let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
    let events = events.body["events"].as_array().unwrap().clone();
    // The callback to a closed port is attempted as soon as the task ends; its outcome may
    // already be on the timeline, but it is a delivery record, not a state change.
    let (deliveries, changes): (Vec<&Value>, Vec<&Value>) = events.iter().partition(|e| {
        e["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("callback"))
    });
    assert!(
        deliveries
            .iter()
            .all(|e| e["from"] == "cancelled" && e["to"] == "cancelled"),
        "{deliveries:?}"
    );
    let steps: Vec<(&Value, &Value, &Value)> = changes
        .iter()
        .map(|e| (&e["from"], &e["to"], &e["actor"]))
        .collect();
    assert_eq!(
        steps,
        [
            (&Value::Null, &json!("created"), &json!("device:scanner-3")),
            (&json!("created"), &json!("queued"), &json!("scheduler")),
            (&json!("queued"), &json!("cancelled"), &json!("api")),
        ]
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "oldest first: {seqs:?}"
    );
    let later = get_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{id}/events?after={}&limit=1", seqs[0])),
    )
    .await;
    assert_eq!(later.body["events"][0]["seq"], json!(seqs[1]));
    assert_eq!(later.body["events"].as_array().unwrap().len(), 1);

    // A batch: each item answered in order, a repeat inside the batch replays, a bad one fails alone.
    let batch = json!({"tasks": [
        {"kind": "oct.analyze", "key": "b-1", "device": "scanner-3"},
        {"kind": "oct.analyze", "key": "b-1", "device": "scanner-3"},
        {"kind": "oct.analyze", "key": "b-1", "device": "scanner-4"},
        {"kind": "oct.analyze", "priority": "whenever"},
        {"kind": "oct.report", "device": "scanner-4", "priority": "low"}
    ]});
    let results = post_json(&client, &server.endpoint("/v1/tasks:batch"), &batch).await;
    assert_eq!(results.status, 200);
    let statuses: Vec<u64> = results.body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [201, 200, 409, 400, 201]);
    assert_eq!(
        results.body["results"][0]["task"]["id"],
        results.body["results"][1]["task"]["id"]
    );
    assert_eq!(
        results.body["results"][3]["problem"]["type"],
        "urn:sluice:problem:invalid-request"
    );

    // Lists: filters, paging in arrival order, and the cancelled task under its state.
    let list = |query: &str| {
        let url = server.endpoint(&format!("/v1/tasks?{query}"));
        let client = client.clone();
        async move { get_json(&client, &url).await }
    };
    let queued = list("state=queued").await;
    assert_eq!(queued.body["tasks"].as_array().unwrap().len(), 3);
    let by_device = list("device=scanner-4").await;
    assert_eq!(by_device.body["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(by_device.body["tasks"][0]["kind"], "oct.report");
    let by_kind = list("kind=oct.analyze&state=queued").await;
    assert_eq!(by_kind.body["tasks"].as_array().unwrap().len(), 1);
    let gone = list("state=cancelled").await;
    assert_eq!(gone.body["tasks"][0]["id"], json!(id));
    let page_one = list("limit=2").await;
    assert_eq!(page_one.body["tasks"].as_array().unwrap().len(), 2);
    let next = page_one.body["next_after"].as_str().unwrap().to_owned();
    let page_two = list(&format!("limit=2&after={next}")).await;
    assert_eq!(page_two.body["tasks"].as_array().unwrap().len(), 2);
    assert_eq!(page_two.body["next_after"], Value::Null);
    let mut listed: Vec<Value> = page_one.body["tasks"].as_array().unwrap().clone();
    listed.extend(page_two.body["tasks"].as_array().unwrap().iter().cloned());
    let listed_ids: Vec<&str> = listed.iter().map(|t| t["id"].as_str().unwrap()).collect();
    let mut sorted = listed_ids.clone();
    sorted.sort();
    assert_eq!(listed_ids, sorted, "pages come in id (arrival) order");
    assert_eq!(listed_ids.len(), 4);

    // The counts agree with what happened, including the one refused cancel.
    let stats = get_json(&client, &server.endpoint("/v1/stats")).await.body;
    assert_eq!(stats["tasks_by_state"]["queued"], 3);
    assert_eq!(stats["tasks_by_state"]["cancelled"], 1);
    assert_eq!(stats["tasks_by_state"]["completed"], 0);
    assert_eq!(
        stats["queued_by_bucket"],
        json!({"urgent": 0, "normal": 2, "low": 1})
    );
    assert_eq!(stats["illegal_transitions_total"], 1);
    assert!(stats["last_event_seq"].as_u64().unwrap() >= *seqs.last().unwrap());

    assert_eq!(
        get_json(&client, &server.endpoint("/readyz")).await.status,
        200
    );
    assert_eq!(
        server.terminate().code(),
        Some(0),
        "SIGTERM drains and exits 0"
    );

    // After a clean restart everything is as it was.
    let server = store.start_with(dir.path(), &["--callback-allow", "127.0.0.1"]);
    let after = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(after.body["state"], "cancelled");
    assert_eq!(after.body["payload"], spec["payload"]);
    assert_eq!(all_tasks(&client, &server).await.len(), 4);
    let fresh = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "k"}),
    )
    .await;
    assert_eq!(fresh.status, 201);
    assert!(
        fresh.body["id"].as_str().unwrap() > big_id.as_str(),
        "ids keep growing across restarts"
    );
    let fresh_events = get_json(
        &client,
        &server.endpoint(&format!(
            "/v1/tasks/{}/events",
            fresh.body["id"].as_str().unwrap()
        )),
    )
    .await;
    assert!(
        fresh_events.body["events"][0]["seq"].as_u64().unwrap() > *seqs.last().unwrap(),
        "event numbers keep growing"
    );
}

/// The data directory and everything the server writes in it are its user's alone, also for
/// a directory an older release left open to others.
#[test]
fn the_data_directory_is_private_to_the_servers_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let server = Server::start(&data);
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode();
    assert_eq!(mode(&data) & 0o777, 0o700, "the data directory");
    let mut seen = 0;
    let mut pending = vec![data.clone()];
    while let Some(next) = pending.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            assert_eq!(
                mode(&path) & 0o077,
                0,
                "{} is open to others",
                path.display()
            );
            seen += 1;
            if path.is_dir() {
                pending.push(path);
            }
        }
    }
    assert!(seen > 0, "the server wrote nothing to check");
    drop(server);
}
