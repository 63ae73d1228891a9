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
        "max_payload_bytes = 1024\nmax_result_bytes = 1024\nmax_batch_body_bytes = 1024\nmax_policy_bytes = 1024\nmax_policy_data_bytes = 1024\ninflight_body_bytes = 66560\n",
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

/// The server's resident memory now and at its peak, in bytes (`/proc/PID/status`).
fn rss_bytes(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .unwrap()
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// 20 workers complete 70 tasks (more than the callback queue's 64 MiB) with results of a mebibyte each, every task owing a callback
/// to a receiver that accepts connections and never answers: the server's memory stays under
/// the sum of its byte bounds (bodies in flight, the log's overlay, the callback queue, sled's
/// cache) and a base, however many results go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_of_a_mebibyte_and_a_stalled_callback_receiver_leave_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    // A small page cache, so the bound is the store's and the queues' own.
    // Leases and heartbeats that outlast a debug build's slow handling of a mebibyte of JSON.
    std::fs::write(
        &config,
        "cache_capacity_bytes = 67108864\nworker_stale_ms = 600000\nlease_ms = 600000\n",
    )
    .unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--callback-allow",
            "127.0.0.1",
        ],
    );
    // The stalled receiver: connections are taken and held, nothing is ever read or answered.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback_url = format!("http://{}/done", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    let client = http();
    const WORKERS: usize = 20;
    const TASKS: usize = 70;
    for n in 0..TASKS {
        let body = json!({"kind": "oct.scan", "callback_url": callback_url, "payload": {"n": n}});
        let created = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
        assert_eq!(created.status, 201, "{:?}", created.body);
    }
    let result = "r".repeat(1_000_000);
    // A debug build moves a mebibyte of JSON slowly: 100 of them at once take a while.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap();
    let started = Instant::now();
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (client, server_url, result) = (client.clone(), server.url.clone(), result.clone());
        workers.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            let heartbeat = json!({"gpus": [], "max_concurrency": 1});
            let url = format!("{server_url}/v1/workers/{worker}/heartbeat");
            assert_eq!(post_json(&client, &url, &heartbeat).await.status, 200);
            let mut done = 0;
            loop {
                let url = format!("{server_url}/v1/workers/{worker}/claim");
                let claim = post_json(&client, &url, &json!({"max": 1, "wait_ms": 0})).await;
                assert_eq!(claim.status, 200, "{:?}", claim.body);
                let Some(lease) = claim.body["leases"].as_array().unwrap().first().cloned() else {
                    return done;
                };
                let id = lease["task"]["id"].as_str().unwrap();
                let url = format!("{server_url}/v1/tasks/{id}/complete");
                let body = json!({"lease_token": lease["lease_token"], "result": {"mask": result}});
                let reported = post_json(&client, &url, &body).await;
                assert_eq!(reported.status, 200, "{:?}", reported.body);
                done += 1;
            }
        }));
    }
    let mut completed = 0;
    for worker in workers {
        completed += worker.await.unwrap();
    }
    assert_eq!(completed, TASKS);
    println!(
        "{TASKS} reports in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (rss, peak) = rss_bytes(server.pid());
    let mib = |bytes: u64| bytes / (1 << 20);
    // Bodies in flight (256 MiB) + the overlay (256 MiB) + callbacks queued (64 MiB) and in
    // flight (16 of 1 MiB) + sled's cache (64 MiB) + a base of 256 MiB (the runtime, the
    // policy engine's code, allocator slack).
    let bound: u64 = (256 + 256 + 64 + 16 + 64 + 256) << 20;
    println!(
        "{TASKS} results of 1 MB through {WORKERS} workers, callbacks stalled: RSS {} MiB, peak {} MiB (bound {} MiB)",
        mib(rss),
        mib(peak),
        mib(bound)
    );
    assert!(peak < bound, "peak RSS {} MiB", mib(peak));
}
