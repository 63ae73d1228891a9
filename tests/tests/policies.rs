//! The policy registry over real HTTP with real components built from `policies/`: upload,
//! activate, the next admission following the new version, rollback, a restart, and hostile
//! uploads each refused with a clear 4xx while the server keeps serving.

use sluice_tests::*;

async fn submit_normal(client: &reqwest::Client, server: &Server) -> Value {
    let spec =
        json!({"kind": "oct.analyze", "priority": "normal", "est_exec_ms": 1000, "payload": {}});
    let created = post_json(client, &server.endpoint("/v1/tasks"), &spec).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    created.body
}

async fn active_version(client: &reqwest::Client, server: &Server) -> u64 {
    let detail = get_json(client, &server.endpoint("/v1/policies/priority")).await;
    assert_eq!(detail.status, 200, "{:?}", detail.body);
    detail.body["active_version"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upload_activate_rollback_and_restart_over_http() {
    let priority = policy_component("priority-buckets", None);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = http();

    assert_eq!(
        submit_normal(&client, &server).await["attempt_timeout_ms"],
        2000
    );
    let uploaded = put_policy(
        &client,
        &server,
        "priority",
        priority.clone(),
        Some("normal_timeout_factor=5"),
    )
    .await;
    assert_eq!(uploaded.status, 201, "{:?}", uploaded.body);
    assert_eq!(uploaded.body["version"], 1);
    assert_eq!(uploaded.body["kind"], "priority");
    assert_eq!(uploaded.body["sha256"].as_str().unwrap().len(), 64);
    let again = put_policy(
        &client,
        &server,
        "priority",
        priority.clone(),
        Some("normal_timeout_factor=5"),
    )
    .await;
    assert_eq!(
        (again.status, again.body["version"].clone()),
        (200, json!(1))
    );
    // Stored is not active.
    assert_eq!(
        submit_normal(&client, &server).await["attempt_timeout_ms"],
        2000
    );

    let activate = server.endpoint("/v1/policies/priority/activate");
    let activated = post_json(&client, &activate, &json!({"version": 1})).await;
    assert_eq!(activated.status, 200, "{:?}", activated.body);
    assert_eq!(activated.body["active_version"], 1);
    let task = submit_normal(&client, &server).await;
    assert_eq!(task["attempt_timeout_ms"], 5000);
    let id = task["id"].as_str().unwrap();
    let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
    assert_eq!(
        events.body["events"][1]["detail"],
        "admitted by priority policy v1"
    );

    let rollback = server.endpoint("/v1/policies/priority/rollback");
    let rolled = answer(client.post(&rollback).send().await.unwrap()).await;
    assert_eq!(
        (rolled.status, rolled.body["active_version"].clone()),
        (200, json!(0))
    );
    assert_eq!(
        submit_normal(&client, &server).await["attempt_timeout_ms"],
        2000
    );
    let nothing = answer(client.post(&rollback).send().await.unwrap()).await;
    assert_problem(&nothing, 409, "policy-conflict");
    let unknown = post_json(&client, &activate, &json!({"version": 7})).await;
    assert_problem(&unknown, 404, "policy-version-not-found");

    // The active version is durable: activate, SIGKILL, restart.
    let activated = post_json(&client, &activate, &json!({"version": 1})).await;
    assert_eq!(activated.status, 200);
    server.kill9();
    let server = Server::start(dir.path());
    assert_eq!(active_version(&client, &server).await, 1);
    assert_eq!(
        submit_normal(&client, &server).await["attempt_timeout_ms"],
        5000
    );
    let detail = get_json(&client, &server.endpoint("/v1/policies/priority")).await;
    let actions: Vec<&str> = detail.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["uploaded", "activated", "rolled_back", "activated"]
    );
    let listed = get_json(&client, &server.endpoint("/v1/policies")).await;
    let kinds: Vec<&str> = listed.body["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["priority", "aging", "retry", "split", "merge"]);
    server.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_uploads_get_clear_4xx_and_the_server_keeps_serving() {
    let retry = policy_component("retry-backoff", None);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = http();

    /// (name, kind, component, config, the check that must refuse it)
    type Refusal<'a> = (&'a str, &'a str, Vec<u8>, Option<&'a str>, &'a str);
    let refusals: Vec<Refusal> = vec![
        (
            "garbage",
            "retry",
            b"\0asm\x0d\0\x01\0 not a component".to_vec(),
            None,
            "compile",
        ),
        ("wrong world", "merge", retry.clone(), None, "world"),
        (
            "an import of its own",
            "retry",
            policy_component("hostile", Some("leaky")),
            None,
            "imports",
        ),
        (
            "endless loop",
            "retry",
            policy_component("hostile", Some("spin")),
            None,
            "conformance",
        ),
        (
            "memory bomb",
            "retry",
            policy_component("hostile", Some("memory-bomb")),
            None,
            "conformance",
        ),
        (
            "trap",
            "retry",
            policy_component("hostile", Some("trap")),
            None,
            "conformance",
        ),
        (
            "unknown setting",
            "retry",
            retry.clone(),
            Some("initial_delay=5"),
            "init",
        ),
    ];
    for (name, kind, bytes, config, check) in refusals {
        let refused = put_policy(&client, &server, kind, bytes, config).await;
        assert_problem(&refused, 422, "policy-refused");
        assert_eq!(refused.body["check"], check, "{name}: {:?}", refused.body);
    }

    // 50 MiB: refused by size before anything is compiled.
    let huge = put_policy(&client, &server, "retry", vec![0u8; 50 << 20], None).await;
    assert_problem(&huge, 413, "body-too-large");
    let wrong_type = answer(
        client
            .put(server.endpoint("/v1/policies/retry"))
            .header("content-type", "application/json")
            .body(retry.clone())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_problem(&wrong_type, 415, "unsupported-media-type");
    let unknown_kind = put_policy(&client, &server, "sorting", retry.clone(), None).await;
    assert_problem(&unknown_kind, 404, "policy-kind-not-found");
    let bad_activate = post_json(
        &client,
        &server.endpoint("/v1/policies/retry/activate"),
        &json!({"version": "one"}),
    )
    .await;
    assert_problem(&bad_activate, 400, "invalid-request");

    // Nothing was stored or activated, and the server still serves.
    for kind in ["retry", "merge"] {
        let detail = get_json(&client, &server.endpoint(&format!("/v1/policies/{kind}"))).await;
        assert_eq!(detail.body["active_version"], 0, "{kind}");
        assert_eq!(detail.body["versions"], json!([]), "{kind}");
    }
    submit_normal(&client, &server).await;
    assert_eq!(server.terminate().code(), Some(0));
}

/// Waits until `/v1/stats` shows `expected` as the bucket weights.
async fn wait_for_weights(client: &reqwest::Client, server: &Server, expected: Value) {
    let url = server.endpoint("/v1/stats");
    wait_for(
        "the bucket weights",
        std::time::Duration::from_secs(10),
        || async {
            let stats = get_json(client, &url).await;
            (stats.body["bucket_weights"] == expected).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activation_takes_the_new_bucket_weights_without_waiting_for_an_aging_tick() {
    let dir = tempfile::tempdir().unwrap();
    // An hour between aging ticks: only the activation itself can bring the new weights in.
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "aging_interval_ms = 3600000\n").unwrap();
    let data = dir.path().join("data");
    let server = Server::start_with(&data, &["--config", config.to_str().unwrap()]);
    let client = http();
    let stats = get_json(&client, &server.endpoint("/v1/stats")).await;
    assert_eq!(stats.body["bucket_weights"], json!([60, 35, 5]));

    let priority = policy_component("priority-buckets", None);
    let uploaded = put_policy(
        &client,
        &server,
        "priority",
        priority,
        Some("weights=10,80,10"),
    )
    .await;
    assert_eq!(uploaded.status, 201, "{:?}", uploaded.body);
    let activate = server.endpoint("/v1/policies/priority/activate");
    let activated = post_json(&client, &activate, &json!({"version": 1})).await;
    assert_eq!(activated.status, 200, "{:?}", activated.body);
    wait_for_weights(&client, &server, json!([10, 80, 10])).await;

    let rollback = server.endpoint("/v1/policies/priority/rollback");
    let rolled = answer(client.post(&rollback).send().await.unwrap()).await;
    assert_eq!(rolled.status, 200, "{:?}", rolled.body);
    wait_for_weights(&client, &server, json!([60, 35, 5])).await;
}

/// Names reach live decisions: `policies/by-name` puts kinds under `oct.`, an `ed=true` label
/// and tenant `site-er` in urgent; a task that is none of these keeps its bucket. The default
/// policy, which reads no names, admitted the same tasks by their submitted bucket before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_on_a_label_or_a_tenant_decides_live() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let client = http();
    let bucket_of = async |spec: Value| {
        let created = post_json(&client, &server.endpoint("/v1/tasks"), &spec).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        created.body["bucket"].as_str().unwrap().to_owned()
    };
    let er = json!({"kind": "ct.scan", "priority": "low", "tenant": "site-er"});
    let ed = json!({"kind": "ct.scan", "priority": "low", "labels": {"ed": "true"}});
    let plain = json!({"kind": "ct.scan", "priority": "low", "tenant": "site-a"});
    for spec in [&er, &ed, &plain] {
        assert_eq!(bucket_of(spec.clone()).await, "low");
    }
    let component = policy_component("by-name", Some("priority"));
    let uploaded = put_policy(&client, &server, "priority", component, None).await;
    assert_eq!(uploaded.status, 201, "{:?}", uploaded.body);
    let activated = post_json(
        &client,
        &server.endpoint("/v1/policies/priority/activate"),
        &json!({"version": uploaded.body["version"]}),
    )
    .await;
    assert_eq!(activated.status, 200, "{:?}", activated.body);
    assert_eq!(bucket_of(er).await, "urgent");
    assert_eq!(bucket_of(ed).await, "urgent");
    assert_eq!(bucket_of(plain).await, "low");
    assert_eq!(
        bucket_of(json!({"kind": "oct.qa", "priority": "normal"})).await,
        "urgent"
    );
}
