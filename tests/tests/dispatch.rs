//! Dispatch end to end over real HTTP: a zombie worker's late report, the stale-token fence,
//! replayed reports, and bad reports refused.

use sluice_tests::*;

on_each_store!(
    a_zombie_reporting_with_its_expired_token_gets_409_and_the_new_attempt_is_undisturbed
);

async fn a_zombie_reporting_with_its_expired_token_gets_409_and_the_new_attempt_is_undisturbed(
    store: TestStore,
) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start_with(
        dir.path(),
        &[
            "--lease-ms",
            "500",
            "--policy-config",
            "retry.initial_delay_ms=1",
            "--policy-config",
            "retry.max_delay_ms=1",
        ],
    );
    let client = http();
    let submitted = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.scan", "priority": "urgent", "payload": {"eye": "left"}}),
    )
    .await;
    assert_eq!(submitted.status, 201);
    let id = submitted.body["id"].as_str().unwrap().to_owned();

    register_worker(&client, &server, "zombie", 1).await;
    let first = claim_lease(&client, &server, "zombie").await;
    assert_eq!(first["task"]["id"], id.as_str());
    assert_eq!(first["payload"], json!({"eye": "left"}));
    assert_eq!(first["attempt"], 1);
    let old_token = first["lease_token"].as_str().unwrap().to_owned();
    let started = report(
        &client,
        &server,
        &id,
        "start",
        json!({"lease_token": old_token}),
    )
    .await;
    assert_eq!(started.body["state"], "running");
    // The token is the holder's secret: readers of the task do not see it.
    let read = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(read.body["lease"]["token"], "");

    // The zombie goes quiet; its lease expires and the task comes back for another worker.
    register_worker(&client, &server, "healthy", 1).await;
    let second = claim_lease(&client, &server, "healthy").await;
    assert_eq!(second["task"]["id"], id.as_str());
    assert_eq!(second["attempt"], 2);
    let new_token = second["lease_token"].as_str().unwrap().to_owned();
    assert_ne!(new_token, old_token);

    let late = report(
        &client,
        &server,
        &id,
        "complete",
        json!({"lease_token": old_token, "result": "zombie"}),
    )
    .await;
    assert_problem(&late, 409, "stale-lease");
    assert_eq!(late.body["task_id"], id.as_str());
    let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(task.body["state"], "claimed");
    assert_eq!(task.body["lease"]["worker"], "healthy");
    assert_eq!(task.body["attempt"], 2);

    let done = report(
        &client,
        &server,
        &id,
        "complete",
        json!({"lease_token": new_token, "result": {"ok": true}}),
    )
    .await;
    assert_eq!(done.status, 200, "{:?}", done.body);
    assert_eq!(done.body["state"], "completed");
    assert_eq!(done.body["result"], json!({"ok": true}));
    // The same report again is answered as the first was, and changes nothing.
    let again = report(
        &client,
        &server,
        &id,
        "complete",
        json!({"lease_token": new_token, "result": {"ok": true}}),
    )
    .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body["event_seqs"], done.body["event_seqs"]);

    let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
    let details: Vec<String> = events.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}→{} {}",
                e["from"],
                e["to"],
                e["detail"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert!(
        details.iter().any(|d| d.contains("lease-expired")),
        "{details:#?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.contains("complete report of attempt 1 refused")),
        "{details:#?}"
    );
    let completions = details
        .iter()
        .filter(|d| d.contains("→\"completed\""))
        .count();
    assert_eq!(completions, 1, "{details:#?}");
}

on_each_store!(a_claim_says_how_long_its_long_poll_waited_for_work);

async fn a_claim_says_how_long_its_long_poll_waited_for_work(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start(dir.path());
    let client = http();
    register_worker(&client, &server, "gpu-1", 1).await;
    let submit = |priority: &'static str| {
        let (client, url) = (client.clone(), server.endpoint("/v1/tasks"));
        async move {
            let answer = post_json(
                &client,
                &url,
                &json!({"kind": "oct.scan", "priority": priority}),
            )
            .await;
            assert_eq!(answer.status, 201, "{:?}", answer.body);
        }
    };

    // Work already queued: no wait.
    submit("normal").await;
    let at_once = post_json(
        &client,
        &server.endpoint("/v1/workers/gpu-1/claim"),
        &json!({"max": 1, "wait_ms": 10_000}),
    )
    .await;
    assert_eq!(at_once.body["leases"].as_array().map(Vec::len), Some(1));
    assert_eq!(at_once.body["waited_for_work_us"], 0, "{:?}", at_once.body);

    // No work: the claim parks until a submission queues some. The work appeared after the
    // submission was sent and before it was acknowledged, so that bounds the reported wait.
    register_worker(&client, &server, "gpu-2", 1).await;
    let sent = std::time::Instant::now();
    let waiting = tokio::spawn({
        let (client, url) = (client.clone(), server.endpoint("/v1/workers/gpu-2/claim"));
        async move { post_json(&client, &url, &json!({"max": 1, "wait_ms": 30_000})).await }
    });
    // Time for the claim to reach the server and park; had it not, it would report no wait
    // and the lower bound below would say so.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    submit("urgent").await;
    let acknowledged_us = sent.elapsed().as_micros() as u64;
    let answer = waiting.await.unwrap();
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.body["leases"].as_array().map(Vec::len), Some(1));
    let waited_us = answer.body["waited_for_work_us"].as_u64().expect("a wait");
    assert!(
        (250_000..=acknowledged_us).contains(&waited_us),
        "waited {waited_us} µs for work submitted 500 ms after the claim and acknowledged after {acknowledged_us} µs"
    );
}

on_each_store!(bad_reports_and_claims_are_refused_with_problems);

async fn bad_reports_and_claims_are_refused_with_problems(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start(dir.path());
    let client = http();
    let submitted = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "k"}),
    )
    .await;
    let id = submitted.body["id"].as_str().unwrap().to_owned();

    let never = report(
        &client,
        &server,
        &id,
        "complete",
        json!({"lease_token": "x"}),
    )
    .await;
    assert_problem(&never, 409, "stale-lease");
    let expired_class = report(
        &client,
        &server,
        &id,
        "fail",
        json!({"lease_token": "x", "class": "lease-expired"}),
    )
    .await;
    assert_problem(&expired_class, 400, "invalid-request");
    let unknown_class = report(
        &client,
        &server,
        &id,
        "fail",
        json!({"lease_token": "x", "class": "bad-luck"}),
    )
    .await;
    assert_problem(&unknown_class, 400, "invalid-request");
    let missing = report(
        &client,
        &server,
        "01JAAAAAAAAAAAAAAAAAAAAAAA",
        "start",
        json!({"lease_token": "x"}),
    )
    .await;
    assert_problem(&missing, 404, "task-not-found");

    let workers = server.endpoint("/v1/workers/w-1");
    let too_many = post_json(&client, &format!("{workers}/claim"), &json!({"max": 65})).await;
    assert_problem(&too_many, 400, "invalid-request");
    let too_long = post_json(
        &client,
        &format!("{workers}/claim"),
        &json!({"max": 1, "wait_ms": 3_600_000}),
    )
    .await;
    assert_problem(&too_long, 400, "invalid-request");
    let unknown = post_json(&client, &format!("{workers}/claim"), &json!({})).await;
    assert_eq!(unknown.status, 200);
    assert_eq!(unknown.body["reason"]["code"], "unknown-worker");
    let bad_id = post_json(
        &client,
        &server.endpoint("/v1/workers/bad%20id/heartbeat"),
        &json!({}),
    )
    .await;
    assert_problem(&bad_id, 400, "invalid-request");
    let zero = post_json(
        &client,
        &format!("{workers}/heartbeat"),
        &json!({"max_concurrency": 0}),
    )
    .await;
    assert_problem(&zero, 400, "invalid-request");
    let not_json = client
        .post(format!("{workers}/heartbeat"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_problem(&answer(not_json).await, 415, "unsupported-media-type");
    let reset_unknown = post_json(&client, &format!("{workers}/reset"), &json!({})).await;
    assert_problem(&reset_unknown, 404, "worker-not-found");
}

on_each_store!(a_completion_callback_is_retried_until_delivered_and_each_attempt_is_an_event);

async fn a_completion_callback_is_retried_until_delivered_and_each_attempt_is_an_event(
    store: TestStore,
) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start_with(dir.path(), &["--callback-allow", "127.0.0.1"]);
    let client = http();
    let (url, mut bodies) = callback_receiver(vec![500, 200], None).await;
    let submitted = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "k", "callback_url": url}),
    )
    .await;
    let id = submitted.body["id"].as_str().unwrap().to_owned();
    register_worker(&client, &server, "w", 1).await;
    let lease = claim_lease(&client, &server, "w").await;
    let token = lease["lease_token"].as_str().unwrap();
    let done = report(
        &client,
        &server,
        &id,
        "complete",
        json!({"lease_token": token, "result": "fine"}),
    )
    .await;
    assert_eq!(done.status, 200);

    let first = bodies.recv().await.unwrap();
    let second = bodies.recv().await.unwrap();
    for body in [&first, &second] {
        assert_eq!(body["id"], id.as_str());
        assert_eq!(body["state"], "completed");
        assert_eq!(body["result"], "fine");
        assert_eq!(
            body["lease"]["token"], "",
            "the token never leaves the server"
        );
    }
    let details = wait_for(
        "the delivery event",
        std::time::Duration::from_secs(10),
        || {
            let client = client.clone();
            let url = server.endpoint(&format!("/v1/tasks/{id}/events"));
            async move {
                let events = get_json(&client, &url).await;
                let details: Vec<String> = events.body["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|e| e["detail"].as_str().map(str::to_owned))
                    .filter(|d| d.starts_with("callback"))
                    .collect();
                (details.len() == 2).then_some(details)
            }
        },
    )
    .await;
    assert!(
        details[0].contains("attempt 1 failed (HTTP 500)"),
        "{details:?}"
    );
    assert!(details[1].contains("attempt 2 delivered"), "{details:?}");
    let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert!(
        task.body["callback"]["delivered_at_ms"].is_u64(),
        "{:?}",
        task.body
    );
}

on_each_store!(a_batch_of_reports_is_answered_item_by_item);

async fn a_batch_of_reports_is_answered_item_by_item(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start(dir.path());
    let client = http();
    for _ in 0..2 {
        post_json(
            &client,
            &server.endpoint("/v1/tasks"),
            &json!({"kind": "k"}),
        )
        .await;
    }
    let beat = post_json(
        &client,
        &server.endpoint("/v1/workers/w/heartbeat"),
        &json!({"max_concurrency": 2}),
    )
    .await;
    assert_eq!(beat.status, 200);
    let claimed = post_json(
        &client,
        &server.endpoint("/v1/workers/w/claim"),
        &json!({"max": 2}),
    )
    .await;
    let leases = claimed.body["leases"].as_array().unwrap().clone();
    assert_eq!(leases.len(), 2);
    let reports = json!({"reports": [
        {"report": "complete", "task": leases[0]["task"]["id"], "lease_token": leases[0]["lease_token"], "result": 1},
        {"report": "fail", "task": leases[1]["task"]["id"], "lease_token": "not-the-token", "class": "transient"},
        {"report": "complete", "task": "nonsense", "lease_token": "x"},
        {"report": "fail", "task": leases[1]["task"]["id"], "lease_token": leases[1]["lease_token"], "class": "permanent", "message": "bad scan"},
    ]});
    let answer = post_json(&client, &server.endpoint("/v1/reports"), &reports).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let results = answer.body["results"].as_array().unwrap();
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 409, 400, 200]);
    assert_eq!(results[0]["task"]["state"], "completed");
    assert_eq!(
        results[1]["problem"]["type"],
        "urn:sluice:problem:stale-lease"
    );
    assert_eq!(results[3]["task"]["state"], "dead");
    let too_many: Vec<Value> = (0..1001).map(|_| json!({})).collect();
    let refused = post_json(
        &client,
        &server.endpoint("/v1/reports"),
        &json!({ "reports": too_many }),
    )
    .await;
    assert_problem(&refused, 400, "invalid-request");
}

on_each_store!(a_claim_sent_again_under_its_id_gets_the_leases_it_granted);

/// A worker whose claim got no answer sends it again under the same `claim_id`: it gets the
/// leases that claim granted (those it has not started), not new ones and not nothing.
async fn a_claim_sent_again_under_its_id_gets_the_leases_it_granted(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = store.start_with(dir.path(), &[]);
    let client = http();
    for n in 0..5 {
        let spec = json!({"kind": "oct.scan", "key": format!("again-{n}"), "payload": {"n": n}});
        let submitted = post_json(&client, &server.endpoint("/v1/tasks"), &spec).await;
        assert_eq!(submitted.status, 201, "{:?}", submitted.body);
    }
    register_worker(&client, &server, "gpu-1", 4).await;
    let claim_url = server.endpoint("/v1/workers/gpu-1/claim");
    let claim = |claim_id: &'static str, max: u64| {
        let (client, url) = (client.clone(), claim_url.clone());
        async move {
            let body = json!({"max": max, "wait_ms": 0, "claim_id": claim_id});
            let answer = post_json(&client, &url, &body).await;
            assert_eq!(answer.status, 200, "{:?}", answer.body);
            answer.body["leases"].as_array().unwrap().clone()
        }
    };
    let tokens = |leases: &[Value]| {
        let mut tokens: Vec<String> = leases
            .iter()
            .map(|lease| lease["lease_token"].as_str().unwrap().to_owned())
            .collect();
        tokens.sort();
        tokens
    };
    let first = claim("claim-a", 2).await;
    assert_eq!(first.len(), 2);
    let again = claim("claim-a", 2).await;
    assert_eq!(tokens(&again), tokens(&first), "the same leases again");
    assert!(again.iter().all(|lease| lease["payload"]["n"].is_number()));
    assert_eq!(
        count_in(&client, &server, "claimed").await,
        2,
        "nothing new leased"
    );

    // A started attempt is the worker's already: only the unstarted lease comes back.
    let started = &first[0];
    let id = started["task"]["id"].as_str().unwrap();
    let token = started["lease_token"].as_str().unwrap();
    let answer = report(&client, &server, id, "start", json!({"lease_token": token})).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let after_start = claim("claim-a", 2).await;
    assert_eq!(tokens(&after_start), tokens(&first[1..]));

    // Another id is another claim.
    let second = claim("claim-b", 2).await;
    assert_eq!(second.len(), 2);
    assert!(tokens(&second).iter().all(|t| !tokens(&first).contains(t)));

    let bad = post_json(
        &client,
        &claim_url,
        &json!({"max": 1, "claim_id": "no spaces allowed"}),
    )
    .await;
    assert_problem(&bad, 400, "invalid-request");
}
