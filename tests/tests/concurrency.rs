//! Concurrency keys over real HTTP: a limit set in the configuration file and through the
//! API, kept across a restart; a task held by its key says why; bad limits are refused.

use sluice_tests::*;

on_each_store!(a_key_at_its_limit_holds_its_tasks_and_the_api_limit_survives_a_restart);

async fn submit_keyed(client: &reqwest::Client, server: &Server, key: Option<&str>) -> String {
    let mut spec = json!({"kind": "oct.scan", "est_exec_ms": 60_000, "payload": {}});
    if let Some(key) = key {
        spec["concurrency_key"] = json!(key);
    }
    let created = post_json(client, &server.endpoint("/v1/tasks"), &spec).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    created.body["id"].as_str().unwrap().to_owned()
}

async fn a_key_at_its_limit_holds_its_tasks_and_the_api_limit_survives_a_restart(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "[concurrency_limits]\n\"scanner-*\" = 3\n").unwrap();
    let config = config.to_str().unwrap().to_owned();
    let server = store.start_with(dir.path(), &["--config", &config]);
    let client = http();

    // The API's limit on one scanner is over the configuration's on them all.
    let url = |key: &str| server.endpoint(&format!("/v1/concurrency-limits/{key}"));
    let put = client
        .put(url("scanner-7"))
        .json(&json!({"limit": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let mut keyed = Vec::new();
    for _ in 0..3 {
        keyed.push(submit_keyed(&client, &server, Some("scanner-7")).await);
    }
    let other = submit_keyed(&client, &server, None).await;
    register_worker(&client, &server, "gpu-1", 4).await;
    let claimed = post_json(
        &client,
        &server.endpoint("/v1/workers/gpu-1/claim"),
        &json!({"max": 4}),
    )
    .await;
    let ids: Vec<&str> = claimed.body["leases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|lease| lease["task"]["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids.len(),
        2,
        "one of the key and the task behind them: {ids:?}"
    );
    assert!(ids.contains(&keyed[0].as_str()) && ids.contains(&other.as_str()));

    let waiting = get_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{}", keyed[1])),
    )
    .await;
    assert_eq!(waiting.body["state"], "queued");
    let reason = waiting.body["waiting_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("scanner-7") && reason.contains("1 of 1"),
        "{reason}"
    );
    let running = get_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{}", keyed[0])),
    )
    .await;
    assert!(running.body.get("waiting_reason").is_none());

    let limits = get_json(&client, &server.endpoint("/v1/concurrency-limits")).await;
    assert_eq!(
        limits.body["limits"],
        json!([{"key": "scanner-*", "limit": 3, "source": "config"},
               {"key": "scanner-7", "limit": 1, "source": "api"}])
    );
    assert_eq!(limits.body["running"], json!({"scanner-7": 1}));

    // Bad limits are problems; nothing changes.
    for (key, body) in [
        ("two%20words", json!({"limit": 1})),
        ("scanner-8", json!({"limit": 2_000_000})),
        ("scanner-8", json!({"limit": -1})),
        ("scanner-8", json!({"max": 1})),
    ] {
        let refused = client.put(url(key)).json(&body).send().await.unwrap();
        assert_problem(&answer(refused).await, 400, "invalid-request");
    }

    // The API's limit is kept; the configuration's comes back when it is removed.
    drop(server);
    let server = store.start_with(dir.path(), &["--config", &config]);
    let url = |key: &str| server.endpoint(&format!("/v1/concurrency-limits/{key}"));
    let limits = get_json(&client, &server.endpoint("/v1/concurrency-limits")).await;
    assert_eq!(
        limits.body["limits"][1],
        json!({"key": "scanner-7", "limit": 1, "source": "api"})
    );
    let removed = client.delete(url("scanner-7")).send().await.unwrap();
    assert_eq!(removed.status(), 200);
    let removed = answer(removed).await;
    assert_eq!(
        removed.body["limits"],
        json!([{"key": "scanner-*", "limit": 3, "source": "config"}])
    );
    let again = client.delete(url("scanner-7")).send().await.unwrap();
    assert_problem(&answer(again).await, 404, "concurrency-limit-not-found");
    let audit = get_json(&client, &server.endpoint("/v1/audit")).await;
    let actions: Vec<&str> = audit.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["concurrency.set", "concurrency.remove"]);
}
