//! Bad input of every kind is a 4xx problem+json, never a 5xx, a panic or a hang.

use sluice_tests::*;

#[tokio::test]
async fn bad_requests_get_problem_json() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = http();
    let tasks = server.endpoint("/v1/tasks");
    let raw = |body: &'static str| {
        let request = client
            .post(&tasks)
            .header("content-type", "application/json")
            .body(body);
        async move { answer(request.send().await.unwrap()).await }
    };

    assert_problem(
        &raw(r#"{"kind": "oct.scan", "#).await,
        400,
        "malformed-json",
    );
    assert_problem(&raw("not json at all").await, 400, "malformed-json");
    assert_problem(&raw("").await, 400, "malformed-json");
    assert_problem(&raw(r#"{"kind": 42}"#).await, 400, "invalid-request");
    assert_problem(
        &raw(r#"{"kind": "k", "max_attempts": "three"}"#).await,
        400,
        "invalid-request",
    );
    assert_problem(
        &raw(r#"{"kind": "k", "est_exec_ms": -5}"#).await,
        400,
        "invalid-request",
    );
    assert_problem(
        &raw(r#"{"kind": "k", "priority": "asap"}"#).await,
        400,
        "invalid-request",
    );
    assert_problem(
        &raw(r#"{"kind": "k", "priorty": "low"}"#).await,
        400,
        "invalid-request",
    );
    assert_problem(&raw(r#"{"priority": "low"}"#).await, 400, "invalid-request");
    assert_problem(&raw(r#"["kind"]"#).await, 400, "invalid-request");
    assert_problem(&raw(r#"{"kind": ""}"#).await, 422, "invalid-task");
    assert_problem(
        &raw(r#"{"kind": "k", "max_attempts": 0}"#).await,
        422,
        "invalid-task",
    );
    assert_problem(
        &raw(r#"{"kind": "k", "callback_url": "not a url"}"#).await,
        422,
        "invalid-task",
    );
    // Callbacks may not be aimed at the server's own machine or a private network unless
    // `callback_allow` names the destination; this server allows none.
    for private in [
        "http://127.0.0.1:7700/v1/tasks",
        "http://localhost/done",
        "http://10.1.2.3/done",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/done",
        "http://[fd00::1]/done",
        // IPv6 forms that carry a private IPv4 address, and reserved IPv4.
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",
        "http://[::127.0.0.1]/done",
        "http://[2002:7f00:1::]/done",
        "http://0.0.0.1/done",
        "http://198.18.0.1/done",
        "http://240.0.0.1/done",
    ] {
        let body = format!(r#"{{"kind": "k", "callback_url": "{private}"}}"#);
        let refused = answer(
            client
                .post(&tasks)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_problem(&refused, 422, "invalid-task");
        assert!(
            refused.body["detail"]
                .as_str()
                .unwrap()
                .contains("callback_allow"),
            "{private}"
        );
    }

    // A 2 MiB payload: over the 1 MiB payload limit, and over the body limit too.
    let big = json!({"kind": "oct.scan", "payload": "x".repeat(2 * 1024 * 1024)});
    assert_problem(
        &post_json(&client, &tasks, &big).await,
        413,
        "body-too-large",
    );
    // Just over the payload limit but inside the body limit: refused as a payload.
    let over = json!({"kind": "oct.scan", "payload": "x".repeat(1024 * 1024)});
    assert_problem(
        &post_json(&client, &tasks, &over).await,
        413,
        "payload-too-large",
    );

    let text = client
        .post(&tasks)
        .header("content-type", "text/plain")
        .body(r#"{"kind":"k"}"#);
    assert_problem(
        &answer(text.send().await.unwrap()).await,
        415,
        "unsupported-media-type",
    );

    // Unknown and malformed ids.
    let unknown = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
    assert_problem(
        &get_json(&client, &server.endpoint(&format!("/v1/tasks/{unknown}"))).await,
        404,
        "task-not-found",
    );
    assert_problem(
        &get_json(
            &client,
            &server.endpoint(&format!("/v1/tasks/{unknown}/events")),
        )
        .await,
        404,
        "task-not-found",
    );
    let cancel_unknown = client
        .post(server.endpoint(&format!("/v1/tasks/{unknown}/cancel")))
        .send()
        .await
        .unwrap();
    assert_problem(&answer(cancel_unknown).await, 404, "task-not-found");
    assert_problem(
        &get_json(&client, &server.endpoint("/v1/tasks/not-an-id")).await,
        400,
        "invalid-task-id",
    );
    assert_problem(
        &get_json(
            &client,
            &server.endpoint("/v1/tasks/ZZZZZZZZZZZZZZZZZZZZZZZZZZ"),
        )
        .await,
        400,
        "invalid-task-id",
    );

    // Bad paging and filters.
    for query in [
        "limit=0",
        "limit=1001",
        "limit=-1",
        "limit=ten",
        "after=nope",
        "state=sleeping",
        "colour=red",
    ] {
        let page = get_json(&client, &server.endpoint(&format!("/v1/tasks?{query}"))).await;
        assert_problem(&page, 400, "invalid-query");
    }
    let events_query = get_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{unknown}/events?limit=0")),
    )
    .await;
    assert_problem(&events_query, 400, "invalid-query");

    // Batches: more than 1,000 items is refused whole; a bad item is answered in place.
    let too_many = json!({"tasks": vec![json!({"kind": "k"}); 1001]});
    assert_problem(
        &post_json(&client, &server.endpoint("/v1/tasks:batch"), &too_many).await,
        422,
        "batch-too-large",
    );
    assert_problem(
        &post_json(
            &client,
            &server.endpoint("/v1/tasks:batch"),
            &json!({"items": []}),
        )
        .await,
        400,
        "invalid-request",
    );

    // A path parameter of the wrong type is problem+json too, not the framework's plain text.
    let bad_version = client
        .put(server.endpoint("/v1/policies/retry/not-a-number/data/blob"))
        .header("content-type", "application/octet-stream")
        .body(vec![1u8, 2, 3])
        .send()
        .await
        .unwrap();
    assert_problem(&answer(bad_version).await, 400, "invalid-request");

    // Unknown routes and methods.
    assert_problem(
        &get_json(&client, &server.endpoint("/v1/nothing")).await,
        404,
        "route-not-found",
    );
    assert_problem(
        &answer(client.delete(&tasks).send().await.unwrap()).await,
        405,
        "method-not-allowed",
    );

    // None of it created anything, and the server still serves.
    assert!(all_tasks(&client, &server).await.is_empty());
    assert_eq!(
        get_json(&client, &server.endpoint("/healthz")).await.status,
        200
    );
}
