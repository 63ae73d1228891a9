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
        "max_payload_bytes = 1024\nmax_batch_body_bytes = 1024\nmax_policy_bytes = 1024\ninflight_body_bytes = 66560\n",
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
