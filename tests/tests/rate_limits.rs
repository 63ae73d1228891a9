//! Per-device request rates: a device flooding the server is answered 429 with Retry-After
//! past its rate and burst, while another device's submissions at a steady pace are all
//! accepted. Their latency, with and without the flood, is printed (the bound is stated in
//! docs/security.md; this test asserts behaviour, not time).

use sluice_tests::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const ROOT: &str = "root-token-for-the-rate-test";
const STEADY_SUBMISSIONS: usize = 150;
/// Between two steady submissions: 40 a second, under the rate of 50.
const STEADY_GAP: Duration = Duration::from_millis(25);

/// Submits `STEADY_SUBMISSIONS` tasks one after another at the steady pace; answers each
/// one's latency in ms, asserting every one was accepted.
async fn steady_run(client: &reqwest::Client, server: &Server) -> Vec<f64> {
    let mut latencies = Vec::with_capacity(STEADY_SUBMISSIONS);
    let mut next = Instant::now();
    for _ in 0..STEADY_SUBMISSIONS {
        tokio::time::sleep_until(next.into()).await;
        next += STEADY_GAP;
        let sent = Instant::now();
        let answer = post_json(
            client,
            &server.endpoint("/v1/tasks"),
            &json!({"kind": "oct.scan"}),
        )
        .await;
        latencies.push(sent.elapsed().as_secs_f64() * 1e3);
        assert_eq!(
            answer.status, 201,
            "the steady device was refused: {:?}",
            answer.body
        );
    }
    latencies
}

fn percentile(values: &[f64], p: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_device_is_limited_and_another_keeps_its_pace() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::launch(
        &dir.path().join("data"),
        &["--device-rate-per-s", "50", "--device-burst", "50"],
        &[("SLUICE_ADMIN_TOKEN", ROOT)],
        None,
    );
    let admin = http_as(ROOT);
    let (flood_token, _) = issue_token(
        &admin,
        &server,
        &json!({"role": "device", "device": "flood"}),
    )
    .await;
    let (steady_token, _) = issue_token(
        &admin,
        &server,
        &json!({"role": "device", "device": "steady"}),
    )
    .await;
    let steady = http_as(&steady_token);

    let alone = steady_run(&steady, &server).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (accepted, limited, other) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    // The window covers every request of the flood, from before the first is sent to after
    // the last is answered, so the limiter's quota over it is an exact bound.
    let flood_started = Instant::now();
    let mut flooders = Vec::new();
    for _ in 0..16 {
        let client = http_as(&flood_token);
        let url = server.endpoint("/v1/tasks");
        let (stop, accepted, limited, other) = (
            stop.clone(),
            accepted.clone(),
            limited.clone(),
            other.clone(),
        );
        flooders.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let response = client
                    .post(&url)
                    .json(&json!({"kind": "oct.flood"}))
                    .send()
                    .await;
                match response
                    .map(|r| (r.status().as_u16(), r.headers().get("retry-after").cloned()))
                {
                    Ok((201, _)) => accepted.fetch_add(1, Ordering::Relaxed),
                    Ok((429, Some(_))) => limited.fetch_add(1, Ordering::Relaxed),
                    _ => other.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    let flooded = steady_run(&steady, &server).await;
    stop.store(true, Ordering::Relaxed);
    for flooder in flooders {
        flooder.await.unwrap();
    }
    let flood_s = flood_started.elapsed().as_secs_f64();
    let (accepted, limited, other) = (
        accepted.load(Ordering::Relaxed),
        limited.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed),
    );
    println!(
        "steady device, {STEADY_SUBMISSIONS} submissions at 40/s: p50 {:.1} ms, p99 {:.1} ms alone; p50 {:.1} ms, p99 {:.1} ms beside the flood",
        percentile(&alone, 0.5),
        percentile(&alone, 0.99),
        percentile(&flooded, 0.5),
        percentile(&flooded, 0.99),
    );
    println!(
        "flooding device over {flood_s:.1} s: {accepted} accepted ({:.0}/s), {limited} answered 429, {other} other",
        accepted as f64 / flood_s
    );
    assert!(limited > 0, "the flood was never limited");
    assert_eq!(other, 0, "the flood got answers other than 201 and 429");
    // The limiter lets through the burst plus the rate over the window, no more (one request
    // of slack for the clock's rounding).
    let allowed = 50.0 + 50.0 * flood_s + 1.0;
    assert!(
        (accepted as f64) <= allowed,
        "{accepted} accepted in {flood_s:.1} s, more than the {allowed:.0} allowed"
    );
    let refused = post_json(
        &http_as(&flood_token),
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "x"}),
    )
    .await;
    if refused.status == 429 {
        assert_problem(&refused, 429, "rate-limited");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_in_flight_bound_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "max_requests_in_flight = 2\n").unwrap();
    let server = Server::start_with(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let client = http();
    register_worker(&client, &server, "gpu-1", 1).await;
    // Two claims wait for work that never comes, holding both places for 25 s (under the test
    // client's 30 s timeout): a loaded machine (CI runs tests side by side, a policy compile
    // may take both cores for a minute) still sees them held.
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let (client, url) = (client.clone(), server.endpoint("/v1/workers/gpu-1/claim"));
        waiting.push(tokio::spawn(async move {
            post_json(&client, &url, &json!({"max": 1, "wait_ms": 25000})).await
        }));
    }
    let refused = wait_for(
        "a request refused for want of room",
        Duration::from_secs(23),
        || {
            let (client, url) = (client.clone(), server.endpoint("/v1/stats"));
            async move {
                let response = client.get(&url).send().await.unwrap();
                let retry_after = response.headers().contains_key("retry-after");
                let answer = answer(response).await;
                (answer.status == 503).then_some((answer, retry_after))
            }
        },
    )
    .await;
    assert_problem(&refused.0, 503, "too-many-requests-in-flight");
    assert!(refused.1, "no Retry-After");
    for claim in waiting {
        assert_eq!(claim.await.unwrap().status, 200);
    }
    assert_eq!(
        get_json(&client, &server.endpoint("/v1/stats"))
            .await
            .status,
        200
    );
}
