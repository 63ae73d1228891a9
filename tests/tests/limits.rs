//! Bounded resources: request bodies in memory have a budget, and a stalled body cannot hold
//! more than its share.

use sluice_tests::*;
use std::io::Write;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_memory_budget_are_refused_as_overloaded() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    // Room for exactly one single-task body in memory at a time.
    std::fs::write(
        &config,
        "max_payload_bytes = 1024\nmax_result_bytes = 1024\nmax_batch_body_bytes = 1024\nmax_policy_bytes = 1024\ninflight_body_bytes = 66560\n",
    )
    .unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let address = server.url.trim_start_matches("http://").to_owned();

    // A client declares a 60,000-byte body and sends only part of it.
    let stall = || {
        let mut stalled = std::net::TcpStream::connect(&address).unwrap();
        write!(
            stalled,
            "POST /v1/tasks HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: 60000\r\n\r\n{{\"kind\":"
        )
        .unwrap();
        stalled.flush().unwrap();
        stalled
            .set_read_timeout(Some(Duration::from_millis(1)))
            .unwrap();
        stalled
    };
    let mut stalled = stall();

    // Once the server holds that body's share, another large body finds no room.
    let client = http();
    let url = server.endpoint("/v1/tasks");
    let big_spec =
        json!({"kind": "k", "labels": {"pad": "x".repeat(200)}, "payload": "y".repeat(900)});
    let padded = format!("{}{}", big_spec, " ".repeat(10_000));
    let send_padded = || {
        let request = client
            .post(&url)
            .header("content-type", "application/json")
            .body(padded.clone());
        async move { answer(request.send().await.unwrap()).await }
    };
    let started = Instant::now();
    let refused = loop {
        let answer = send_padded().await;
        if answer.status == 503 {
            break answer;
        }
        assert_eq!(answer.status, 201, "{:?}", answer.body);
        // If the stalled request reached the budget while a padded one held part of it, it
        // was itself refused (and answered): stall again.
        let mut byte = [0u8; 1];
        if matches!(std::io::Read::read(&mut stalled, &mut byte), Ok(n) if n > 0) {
            stalled = stall();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the stalled body never took its share"
        );
    };
    assert_problem(&refused, 503, "overloaded");

    // The stalled client goes away; its share returns and large bodies are served again.
    drop(stalled);
    let started = Instant::now();
    loop {
        let answer = send_padded().await;
        if answer.status == 201 {
            break;
        }
        assert_problem(&answer, 503, "overloaded");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the budget was not returned"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_past_max_result_bytes_is_refused_and_the_attempt_stays_open() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "max_result_bytes = 1000\n").unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let client = http();
    for _ in 0..2 {
        let created = post_json(
            &client,
            &server.endpoint("/v1/tasks"),
            &json!({"kind": "k"}),
        )
        .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    register_worker(&client, &server, "w", 2).await;
    let first = claim_lease(&client, &server, "w").await;
    let second = claim_lease(&client, &server, "w").await;
    let (id, token) = (
        first["task"]["id"].as_str().unwrap(),
        first["lease_token"].clone(),
    );

    let big = json!({"lease_token": token, "result": {"text": "x".repeat(2_000)}});
    let refused = report(&client, &server, id, "complete", big).await;
    assert_problem(&refused, 413, "result-too-large");
    let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(
        task.body["state"], "claimed",
        "a refused result changes nothing"
    );

    // In a batch, the large result is refused on its own; the small one completes.
    let batch = post_json(
        &client,
        &server.endpoint("/v1/reports"),
        &json!({"reports": [
            {"report": "complete", "task": id, "lease_token": token, "result": "x".repeat(2_000)},
            {"report": "complete", "task": second["task"]["id"], "lease_token": second["lease_token"], "result": {"ok": true}},
        ]}),
    )
    .await;
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    let results = batch.body["results"].as_array().unwrap();
    assert_eq!(results[0]["status"], 413, "{results:?}");
    assert_eq!(
        results[0]["problem"]["type"],
        "urn:sluice:problem:result-too-large"
    );
    assert_eq!(results[1]["status"], 200, "{results:?}");
    let small = json!({"lease_token": token, "result": {"ok": true}});
    let done = report(&client, &server, id, "complete", small).await;
    assert_eq!(done.status, 200, "{:?}", done.body);
}
