//! Experiments over real HTTP against a real server with real aging components: a live A/B
//! sticky by device whose variants act only on their own tasks, its report with intervals,
//! promotion of the winner; a shadow run that never acts; and the refusals.

use serde_json::{Value, json};
use sluice_tests::*;
use std::collections::BTreeMap;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A server whose aging step runs every 50 ms, with two uploaded aging versions: v1 never
/// promotes a low task within the test, v2 promotes it at once.
async fn server_with_two_agings(dir: &std::path::Path) -> (Server, reqwest::Client) {
    let config = dir.join("sluice.toml");
    std::fs::write(&config, "aging_interval_ms = 50\n").unwrap();
    let server = Server::start_with(&dir.join("data"), &["--config", config.to_str().unwrap()]);
    let client = http();
    let aging = policy_component("aging-threshold", None);
    for (config, version) in [
        ("low_to_normal_ms=86400000\nnormal_to_urgent_ms=86400000", 1),
        ("low_to_normal_ms=1\nnormal_to_urgent_ms=86400000", 2),
    ] {
        let uploaded = put_policy(&client, &server, "aging", aging.clone(), Some(config)).await;
        assert_eq!(uploaded.status, 201, "{:?}", uploaded.body);
        assert_eq!(uploaded.body["version"], version);
    }
    (server, client)
}

/// A low task of 2 s estimated (so 6 s per attempt before it times out: a loaded machine's
/// slow round trips never fail one).
async fn submit_low(client: &reqwest::Client, server: &Server, device: &str) -> String {
    let answer = post_json(
        client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct-scan", "priority": "low", "device": device, "est_exec_ms": 2000,
                "payload": {}}),
    )
    .await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    answer.body["id"].as_str().unwrap().to_owned()
}

async fn task(client: &reqwest::Client, server: &Server, id: &str) -> Value {
    get_json(client, &server.endpoint(&format!("/v1/tasks/{id}")))
        .await
        .body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_ab_test_is_sticky_by_device_acts_per_variant_reports_and_promotes() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = server_with_two_agings(dir.path()).await;
    let started = post_json(
        &client,
        &server.endpoint("/v1/experiments"),
        &json!({"kind": "aging", "assign_by": "device", "mode": "live", "variants": [
            {"name": "A", "version": 1, "weight": 50},
            {"name": "B", "version": 2, "weight": 50}]}),
    )
    .await;
    assert_eq!(started.status, 201, "{:?}", started.body);
    let id = started.body["id"].as_u64().unwrap();

    // 16 devices, 4 tasks each: every task of a device lands in the same variant.
    let mut tasks: Vec<(String, String)> = Vec::new();
    for device in 0..16 {
        let device = format!("scanner-{device:02}");
        for _ in 0..4 {
            tasks.push((device.clone(), submit_low(&client, &server, &device).await));
        }
    }
    let mut variant_of_device: BTreeMap<String, u64> = BTreeMap::new();
    let mut variant_of_task: BTreeMap<String, u64> = BTreeMap::new();
    for (device, task_id) in &tasks {
        let record = task(&client, &server, task_id).await;
        let tags = record["variants"].as_array().expect("the task's variants");
        assert_eq!(tags.len(), 1, "{record}");
        assert_eq!(tags[0]["kind"], "aging");
        assert_eq!(tags[0]["experiment"], id);
        let variant = tags[0]["variant"].as_u64().unwrap();
        let first = *variant_of_device.entry(device.clone()).or_insert(variant);
        assert_eq!(first, variant, "device {device} stays in one variant");
        variant_of_task.insert(task_id.clone(), variant);
    }
    let in_b = variant_of_device.values().filter(|&&v| v == 1).count();
    assert!(
        (1..16).contains(&in_b),
        "both variants get devices: {variant_of_device:?}"
    );

    // B's version promotes its tasks at once; A's never does. Only B's tasks move.
    for (task_id, &variant) in variant_of_task.iter().filter(|(_, v)| **v == 1) {
        let promoted = wait_for("a B task promoted", LIMIT, || async {
            let record = task(&client, &server, task_id).await;
            (record["bucket"] == "normal").then_some(record)
        })
        .await;
        assert_eq!(variant, 1);
        let events = get_json(
            &client,
            &server.endpoint(&format!("/v1/tasks/{task_id}/events")),
        )
        .await
        .body;
        let text = events.to_string();
        assert!(
            text.contains("promoted low → normal by aging policy v2"),
            "{text}"
        );
        assert!(
            text.contains(&format!("in aging experiment {id} as variant 1")),
            "{text}"
        );
        assert_eq!(promoted["priority"], "low");
    }
    for (task_id, _) in variant_of_task.iter().filter(|(_, v)| **v == 0) {
        let record = task(&client, &server, task_id).await;
        assert_eq!(
            record["bucket"], "low",
            "A's version never promotes: {record}"
        );
    }

    // Run them all, then read the report.
    let worker = Worker::start(&server, "gpu-0", &["--gpus", "2", "--exec-ms", "5"]);
    wait_for("every task ended", LIMIT, || async {
        let ended = ["completed", "dead", "failed", "timed_out", "cancelled"];
        let mut total = 0;
        for state in ended {
            total += count_in(&client, &server, state).await;
        }
        (total == tasks.len() as u64).then_some(())
    })
    .await;
    assert_eq!(
        count_in(&client, &server, "completed").await,
        tasks.len() as u64
    );
    drop(worker);
    let report = get_json(&client, &server.endpoint(&format!("/v1/experiments/{id}"))).await;
    assert_eq!(report.status, 200, "{:?}", report.body);
    let report = report.body;
    assert_eq!(report["complete"], true);
    let variants = report["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 2);
    let counted: u64 = variants.iter().map(|v| v["tasks"].as_u64().unwrap()).sum();
    assert_eq!(counted, tasks.len() as u64);
    assert_eq!(variants[1]["tasks"], (in_b * 4) as u64);
    assert_eq!(variants[1]["promoted"], (in_b * 4) as u64);
    assert_eq!(variants[0]["promoted"], 0);
    for variant in variants {
        assert_eq!(variant["completed"], variant["tasks"]);
        assert_eq!(variant["wait_ms"]["low"]["claimed"], variant["tasks"]);
        assert!(variant["runtime"]["decisions_total"].as_u64().unwrap() > 0);
    }
    let comparison = &report["comparisons"][0];
    assert_eq!(comparison["variant"], "B");
    let low_p99 = comparison["differences"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["bucket"] == "low" && d["figure"] == "p99")
        .expect("low p99 compared");
    let interval = low_p99["interval_percent"].as_array().expect("an interval");
    assert!(interval[0].as_f64().unwrap() <= interval[1].as_f64().unwrap());
    let verdict = comparison["verdict"].as_str().unwrap();
    assert!(
        verdict.starts_with("B ") && verdict.contains("low p99 wait"),
        "{verdict}"
    );
    assert!(report["text"].as_str().unwrap().contains("verdict: B "));
    // Shares beside weights: 4 tasks per device over 16 devices is 6.25 points of standard
    // error at 50 %, so a share is called out past 18.75 points (and 10).
    let shares = report["shares"].as_array().unwrap();
    assert_eq!(shares[1]["tasks"], (in_b * 4) as u64);
    assert_eq!(shares[1]["weight_percent"], 50.0);
    let b_share = shares[1]["share_percent"].as_f64().unwrap();
    assert!((b_share - in_b as f64 * 4.0 / 64.0 * 100.0).abs() < 0.01);
    let far = (b_share - 50.0).abs() > 18.75;
    assert_eq!(report["shares_warning"].is_string(), far, "{report}");

    // The CLI prints the same report.
    let printed = succeeded(run_sluice(
        &[
            "experiment",
            "report",
            &id.to_string(),
            "--server",
            &server.url,
        ],
        &[],
    ));
    println!("{printed}");
    assert!(
        printed.contains("variant B (v2)") && printed.contains("verdict: B "),
        "{printed}"
    );

    // Promote B: it becomes the active aging version and the experiment ends.
    let promoted = post_json(
        &client,
        &server.endpoint(&format!("/v1/experiments/{id}/promote")),
        &json!({"variant": "B"}),
    )
    .await;
    assert_eq!(promoted.status, 200, "{:?}", promoted.body);
    assert_eq!(promoted.body["end"]["outcome"], "promoted");
    let aging = get_json(&client, &server.endpoint("/v1/policies/aging"))
        .await
        .body;
    assert_eq!(aging["active_version"], 2);
    let actions: Vec<&str> = aging["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert!(
        actions.ends_with(&["experiment_started", "activated", "experiment_promoted"]),
        "{actions:?}"
    );
    let again = post_json(
        &client,
        &server.endpoint(&format!("/v1/experiments/{id}/promote")),
        &json!({"variant": "B"}),
    )
    .await;
    assert_problem(&again, 409, "policy-conflict");
    // A task submitted now is in no experiment.
    let later = submit_low(&client, &server, "scanner-00").await;
    assert!(
        task(&client, &server, &later)
            .await
            .get("variants")
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_experiment_compares_answers_but_only_the_active_one_acts() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = server_with_two_agings(dir.path()).await;
    // The active version is the built-in one (30 min to promote); v2 would promote at once.
    let started = post_json(
        &client,
        &server.endpoint("/v1/experiments"),
        &json!({"kind": "aging", "mode": "shadow",
                "variants": [{"name": "eager", "version": 2}]}),
    )
    .await;
    assert_eq!(started.status, 201, "{:?}", started.body);
    let id = started.body["id"].as_u64().unwrap();
    let mut ids = Vec::new();
    for device in 0..4 {
        ids.push(submit_low(&client, &server, &format!("scanner-{device}")).await);
    }
    let report = wait_for("the shadow variant disagreeing", LIMIT, || async {
        let report = get_json(&client, &server.endpoint(&format!("/v1/experiments/{id}")))
            .await
            .body;
        let runtime = &report["variants"][0]["runtime"];
        (runtime["disagreements_total"].as_u64().unwrap_or(0) > 0).then(|| report.clone())
    })
    .await;
    let runtime = &report["variants"][0]["runtime"];
    assert!(
        runtime["compared_total"].as_u64().unwrap()
            >= runtime["disagreements_total"].as_u64().unwrap()
    );
    // Structured: the active answer promoted nothing, the variant promoted task 0 to normal.
    let sample = &runtime["disagreement_samples"][0];
    assert_eq!(sample["active"], json!([]), "{sample}");
    assert_eq!(sample["variant"][0]["to"], "normal", "{sample}");
    for task_id in &ids {
        let record = task(&client, &server, task_id).await;
        assert_eq!(
            record["bucket"], "low",
            "the shadow answer is never acted on: {record}"
        );
        assert!(
            record.get("variants").is_none(),
            "shadow assigns no variant"
        );
    }
    let stopped = post_json(
        &client,
        &server.endpoint(&format!("/v1/experiments/{id}/stop")),
        &json!({}),
    )
    .await;
    assert_eq!(stopped.status, 200, "{:?}", stopped.body);
    assert_eq!(stopped.body["end"]["outcome"], "stopped");
    let aging = get_json(&client, &server.endpoint("/v1/policies/aging"))
        .await
        .body;
    assert_eq!(aging["active_version"], 0, "stopping changes no activation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn experiments_refuse_what_they_cannot_run_with_problems() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = server_with_two_agings(dir.path()).await;
    let url = server.endpoint("/v1/experiments");
    let two = |first: u32, second: u32| json!([{"name": "A", "version": first}, {"name": "B", "version": second}]);
    let unknown_version = post_json(
        &client,
        &url,
        &json!({"kind": "aging", "variants": two(1, 9)}),
    )
    .await;
    assert_problem(&unknown_version, 404, "policy-version-not-found");
    let split = post_json(
        &client,
        &url,
        &json!({"kind": "split", "variants": two(0, 0)}),
    )
    .await;
    assert_problem(&split, 400, "invalid-request");
    let one = post_json(
        &client,
        &url,
        &json!({"kind": "aging", "variants": [{"name": "A", "version": 1}]}),
    )
    .await;
    assert_problem(&one, 400, "invalid-request");
    let unknown_field = post_json(
        &client,
        &url,
        &json!({"kind": "aging", "variants": two(1, 2), "seed": 1}),
    )
    .await;
    assert_eq!(unknown_field.status / 100, 4, "{:?}", unknown_field.body);
    let first = post_json(
        &client,
        &url,
        &json!({"kind": "aging", "variants": two(1, 2)}),
    )
    .await;
    assert_eq!(first.status, 201);
    let second = post_json(
        &client,
        &url,
        &json!({"kind": "aging", "variants": two(2, 1)}),
    )
    .await;
    assert_problem(&second, 409, "policy-conflict");
    let id = first.body["id"].as_u64().unwrap();
    let no_such_variant = post_json(
        &client,
        &server.endpoint(&format!("/v1/experiments/{id}/promote")),
        &json!({"variant": "C"}),
    )
    .await;
    assert_problem(&no_such_variant, 400, "invalid-request");
    let missing = get_json(&client, &server.endpoint("/v1/experiments/99")).await;
    assert_problem(&missing, 404, "experiment-not-found");
    let bad_id = get_json(&client, &server.endpoint("/v1/experiments/x")).await;
    assert_problem(&bad_id, 400, "invalid-request");
    let listed = get_json(&client, &url).await;
    assert_eq!(listed.body.as_array().unwrap().len(), 1);

    // The experiment survives a restart, running, and still assigns new tasks.
    server.kill9();
    let config = dir.path().join("sluice.toml");
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let listed = get_json(&client, &server.endpoint("/v1/experiments")).await;
    assert!(
        listed.body[0].get("ended_at_ms").is_none(),
        "{:?}",
        listed.body
    );
    let task_id = submit_low(&client, &server, "scanner-1").await;
    let record = task(&client, &server, &task_id).await;
    assert_eq!(record["variants"][0]["experiment"], id, "{record}");
}
