//! Observability end to end: `/metrics` parsed as OpenMetrics and checked against a scripted
//! load, the event stream checked for gaps against the log, and the task spans in the log.

use openmetrics_parser::{MetricsExposition, OpenMetricsType, OpenMetricsValue};
use sluice_tests::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

type Exposition = MetricsExposition<OpenMetricsType, OpenMetricsValue>;
/// A family, labels its samples must carry, and the sum they must add up to.
type Expected = (&'static str, &'static [(&'static str, &'static str)], f64);

async fn scrape(client: &reqwest::Client, server: &Server) -> Exposition {
    let response = client
        .get(server.endpoint("/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    let text = response.text().await.expect("metrics text");
    openmetrics_parser::openmetrics::parse_openmetrics(&text)
        .unwrap_or_else(|error| panic!("/metrics is not OpenMetrics: {error:?}\n{text}"))
}

/// The sum over the samples of `family` whose labels include `labels` (a histogram's
/// samples count their observations).
fn value(exposition: &Exposition, family: &str, labels: &[(&str, &str)]) -> f64 {
    let family = exposition
        .families
        .get(family)
        .unwrap_or_else(|| panic!("no metric family {family}"));
    family
        .iter_samples()
        .filter(|sample| {
            let set = sample.get_labelset().expect("labels");
            labels
                .iter()
                .all(|(name, want)| set.get_label_value(name) == Some(*want))
        })
        .map(|sample| match &sample.value {
            OpenMetricsValue::Counter(counter) => counter.value.as_f64(),
            OpenMetricsValue::Gauge(gauge) | OpenMetricsValue::Unknown(gauge) => gauge.as_f64(),
            OpenMetricsValue::Histogram(histogram) => histogram.count.unwrap_or(0) as f64,
            other => panic!("unexpected sample {other:?}"),
        })
        .sum()
}

async fn submit(client: &reqwest::Client, server: &Server, body: Value) -> String {
    let answer = post_json(client, &server.endpoint("/v1/tasks"), &body).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    answer.body["id"].as_str().unwrap().to_owned()
}

/// Registers `worker` with room for many leases.
async fn heartbeat(client: &reqwest::Client, server: &Server, worker: &str) {
    register_worker(client, server, worker, 64).await;
}

/// Claims one task for `worker`: its id and lease token.
async fn claim_one(client: &reqwest::Client, server: &Server, worker: &str) -> (String, String) {
    let lease = claim_lease(client, server, worker).await;
    (
        lease["task"]["id"].as_str().expect("a task id").to_owned(),
        lease["lease_token"].as_str().expect("a token").to_owned(),
    )
}

/// A report that must be accepted.
async fn accepted(client: &reqwest::Client, server: &Server, id: &str, what: &str, body: Value) {
    let answer = report(client, server, id, what, body).await;
    assert_eq!(answer.status, 200, "{what}: {:?}", answer.body);
}

/// Retries wait ten minutes, so tasks sent to retry stay there while the test looks.
const SLOW_RETRY: [&str; 4] = [
    "--policy-config",
    "retry.initial_delay_ms=600000",
    "--policy-config",
    "retry.max_delay_ms=600000",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_openmetrics_and_agree_with_a_scripted_load() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &SLOW_RETRY);
    let client = http();
    let devices = ["oct-a", "oct-b", "oct-c"];
    let kinds = ["oct.segment", "oct.denoise"];
    let priorities = ["urgent", "normal", "low"];
    for i in 0..30 {
        submit(
            &client,
            &server,
            json!({
                "kind": kinds[i % 2],
                "device": devices[i % 3],
                "priority": priorities[i % 3],
                "est_exec_ms": 60000,
                "payload": {"exam": i},
            }),
        )
        .await;
    }
    let refused = post_json(&client, &server.endpoint("/v1/tasks"), &json!({"kind": 7})).await;
    assert_problem(&refused, 400, "invalid-request");

    // 20 completions by a good worker: 15 report their start, 5 do not.
    heartbeat(&client, &server, "good").await;
    for i in 0..20 {
        let (id, token) = claim_one(&client, &server, "good").await;
        if i < 15 {
            accepted(
                &client,
                &server,
                &id,
                "start",
                json!({"lease_token": token}),
            )
            .await;
        }
        let body = json!({"lease_token": token, "result": {"ok": true}});
        accepted(&client, &server, &id, "complete", body).await;
    }
    // 5 failures in a row by a flaky worker open its breaker.
    heartbeat(&client, &server, "flaky").await;
    for i in 0..5 {
        let (id, token) = claim_one(&client, &server, "flaky").await;
        let message = format!("GPU {i} lost after {} ms", 10 * (i + 1));
        let body = json!({"lease_token": token, "class": "transient", "message": message});
        accepted(&client, &server, &id, "fail", body).await;
    }
    let completed_by_api = get_json(
        &client,
        &server.endpoint("/v1/tasks?state=completed&limit=1000"),
    )
    .await
    .body["tasks"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(completed_by_api, 20);

    let metrics = scrape(&client, &server).await;
    let completed = completed_by_api as f64;
    // What the script above did.
    let expected: &[Expected] = &[
        ("sluice_task_arrivals", &[], 30.0),
        ("sluice_task_arrivals", &[("device", "oct-a")], 10.0),
        ("sluice_task_arrivals", &[("device", "oct-b")], 10.0),
        ("sluice_task_arrivals", &[("device", "oct-c")], 10.0),
        ("sluice_task_arrivals", &[("kind", "oct.denoise")], 15.0),
        ("sluice_tasks", &[("state", "completed")], completed),
        (
            "sluice_task_transitions",
            &[("from", "running"), ("to", "completed")],
            completed,
        ),
        ("sluice_task_execution_seconds", &[], completed),
        ("sluice_task_wait_seconds", &[], 25.0),
        (
            "sluice_task_failures",
            &[("class", "transient"), ("reason", "GPU # lost after # ms")],
            5.0,
        ),
        ("sluice_task_retries", &[], 5.0),
        ("sluice_task_dead", &[], 0.0),
        ("sluice_tasks", &[("state", "retry_wait")], 5.0),
        ("sluice_queued_tasks", &[], 5.0),
        (
            "sluice_worker_breaker_state",
            &[("worker", "flaky"), ("state", "open")],
            1.0,
        ),
        (
            "sluice_worker_breaker_state",
            &[("worker", "flaky"), ("state", "closed")],
            0.0,
        ),
        (
            "sluice_worker_breaker_state",
            &[("worker", "good"), ("state", "closed")],
            1.0,
        ),
        ("sluice_worker_claims_served", &[("worker", "good")], 20.0),
        ("sluice_worker_claims_served", &[("worker", "flaky")], 5.0),
        ("sluice_worker_free_gpus", &[("worker", "good")], 1.0),
        (
            "sluice_http_requests",
            &[("route", "/v1/tasks"), ("status", "201")],
            30.0,
        ),
        (
            "sluice_http_requests",
            &[("route", "/v1/tasks"), ("status", "400")],
            1.0,
        ),
        ("sluice_policy_active_version", &[("kind", "priority")], 0.0),
        ("sluice_policy_faults", &[("kind", "retry")], 0.0),
        ("sluice_illegal_transitions", &[], 0.0),
        // Every claim above found work at once: one grant each.
        ("sluice_claim_grant_seconds", &[], 25.0),
    ];
    let wrong: Vec<String> = expected
        .iter()
        .filter_map(|&(family, labels, want)| {
            let got = value(&metrics, family, labels);
            (got != want).then(|| format!("{family}{labels:?} = {got}, expected {want}"))
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "metrics disagree with the load:\n{}",
        wrong.join("\n")
    );
    // The script waits for each answer before its next request, and an answer waits for a
    // sync that covers its write: so no two submissions share one.
    let syncs = value(&metrics, "sluice_store_sync_seconds", &[]);
    assert!(
        syncs >= 30.0,
        "{syncs} syncs for 30 submissions made one at a time"
    );
    assert!(
        value(
            &metrics,
            "sluice_policy_calls",
            &[("kind", "priority"), ("version", "0")]
        ) >= 1.0
    );
    // Each failure went through the retry policy: one call per failure at least. Latency is
    // sampled, and the first decision of a kind is always in the sample.
    assert!(value(&metrics, "sluice_policy_calls", &[("kind", "retry")]) >= 5.0);
    assert!(
        value(
            &metrics,
            "sluice_policy_decision_latency_seconds",
            &[("kind", "retry")]
        ) >= 1.0
    );
}

/// One Server-Sent Event: its id and its data.
#[derive(Debug)]
struct SseEvent {
    id: Option<u64>,
    event: String,
    data: String,
}

/// Reads SSE frames from `response` until `done` says stop or the stream ends.
async fn read_sse(
    mut response: reqwest::Response,
    mut done: impl FnMut(&[SseEvent]) -> bool,
) -> Vec<SseEvent> {
    let mut buffer = String::new();
    let mut events = Vec::new();
    while !done(&events) {
        let Some(chunk) = response.chunk().await.expect("read the stream") else {
            break;
        };
        buffer.push_str(std::str::from_utf8(&chunk).expect("UTF-8 stream"));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            let mut event = SseEvent {
                id: None,
                event: "message".into(),
                data: String::new(),
            };
            let mut has_data = false;
            for line in frame.lines() {
                if let Some(id) = line.strip_prefix("id:") {
                    event.id = Some(id.trim().parse().expect("numeric id"));
                } else if let Some(name) = line.strip_prefix("event:") {
                    event.event = name.trim().to_owned();
                } else if let Some(data) = line.strip_prefix("data:") {
                    event.data.push_str(data.trim_start());
                    has_data = true;
                }
            }
            if has_data {
                events.push(event);
            }
        }
    }
    events
}

async fn open_stream(
    client: &reqwest::Client,
    server: &Server,
    query: &str,
    last_id: Option<u64>,
) -> reqwest::Response {
    let mut request = client
        .get(server.endpoint(&format!("/v1/events{query}")))
        .header("accept", "text/event-stream")
        .timeout(Duration::from_secs(120));
    if let Some(id) = last_id {
        request = request.header("last-event-id", id.to_string());
    }
    let response = request.send().await.expect("open the event stream");
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    response
}

/// Every event of the log, page by page as JSON.
async fn log_pages(client: &reqwest::Client, server: &Server) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let page = get_json(
            client,
            &server.endpoint(&format!("/v1/events?after={after}&limit=37")),
        )
        .await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        let batch = page.body["events"].as_array().unwrap().clone();
        if batch.is_empty() {
            return events;
        }
        after = page.body["next_after"].as_u64().unwrap();
        events.extend(batch);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_delivers_every_transition_in_order_with_no_gap_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--drain-timeout-ms", "2000"]);
    let client = http();
    // Opened before anything happens: it must see the whole run as it happens.
    let live = open_stream(&client, &server, "?after=0", None).await;
    let expected_last = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let target = expected_last.clone();
    let reader = tokio::spawn(read_sse(live, move |events| {
        let last = target.load(std::sync::atomic::Ordering::Acquire);
        events
            .last()
            .and_then(|e| e.id)
            .is_some_and(|id| id >= last)
    }));

    heartbeat(&client, &server, "gpu-1").await;
    let mut ids = Vec::new();
    for i in 0..40 {
        let priority = ["urgent", "normal", "low"][i % 3];
        let body = json!({"kind": "oct.segment", "device": "oct-a", "priority": priority,
            "est_exec_ms": 60000, "max_attempts": 1, "payload": {}});
        ids.push(submit(&client, &server, body).await);
    }
    let cancelled = post_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{}/cancel", ids[39])),
        &json!({}),
    )
    .await;
    assert_eq!(cancelled.status, 200, "{:?}", cancelled.body);
    for i in 0..30 {
        let (id, token) = claim_one(&client, &server, "gpu-1").await;
        accepted(
            &client,
            &server,
            &id,
            "start",
            json!({"lease_token": token}),
        )
        .await;
        if i % 10 == 9 {
            let body = json!({"lease_token": token, "class": "permanent", "message": "bad scan"});
            accepted(&client, &server, &id, "fail", body).await;
        } else {
            let body = json!({"lease_token": token, "result": {"i": i}});
            accepted(&client, &server, &id, "complete", body).await;
        }
    }

    let logged = log_pages(&client, &server).await;
    let last_seq = logged.last().unwrap()["seq"].as_u64().unwrap();
    // 40 × (created, queued) + 1 cancel + 30 × (claimed, running, end).
    assert_eq!(last_seq, 40 * 2 + 1 + 30 * 3);
    expected_last.store(last_seq, std::sync::atomic::Ordering::Release);
    // The stream ends when it has reached the last seq; the bound only turns a hang into a failure.
    let streamed = tokio::time::timeout(Duration::from_secs(60), reader)
        .await
        .expect("the stream reached the end of the log")
        .unwrap();
    let seqs: Vec<u64> = streamed.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(
        seqs,
        (1..=last_seq).collect::<Vec<_>>(),
        "a gap or a repeat in the stream"
    );
    assert!(streamed.iter().all(|e| e.event == "transition"));
    let streamed_json: Vec<Value> = streamed
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    assert_eq!(streamed_json, logged, "the stream and the log pages differ");

    // Each task's own timeline is its slice of the global stream, in the same order.
    let mut by_task: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for event in &streamed_json {
        by_task
            .entry(event["task_id"].as_str().unwrap().to_owned())
            .or_default()
            .push(event.clone());
    }
    for id in ids.iter().step_by(7) {
        let own = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
        assert_eq!(own.body["events"].as_array().unwrap(), &by_task[id]);
    }

    // A reconnecting client resumes after its Last-Event-ID, not at the URL's `after`.
    let resumed = open_stream(&client, &server, "?after=0", Some(last_seq - 5)).await;
    let tail = tokio::time::timeout(
        Duration::from_secs(60),
        read_sse(resumed, |events| events.len() >= 5),
    )
    .await
    .expect("the resumed stream delivered the tail");
    let tail_seqs: Vec<u64> = tail.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(tail_seqs, ((last_seq - 4)..=last_seq).collect::<Vec<_>>());

    // An open stream does not hold the server up on SIGTERM: it ends, and the server exits.
    let idle = open_stream(&client, &server, &format!("?after={last_seq}"), None).await;
    let idle_reader = tokio::spawn(read_sse(idle, |_| false));
    server.send_sigterm();
    let ended = tokio::time::timeout(Duration::from_secs(30), idle_reader)
        .await
        .expect("the stream ended when the server drained")
        .unwrap();
    assert!(ended.is_empty(), "{ended:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = server
        .wait_until(deadline)
        .expect("the server exited after the drain");
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_event_queries_and_unknown_assets_get_problems() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = http();
    for query in [
        "?after=abc",
        "?after=-1",
        "?limit=0",
        "?limit=1001",
        "?colour=red",
    ] {
        let answer = get_json(&client, &server.endpoint(&format!("/v1/events{query}"))).await;
        assert_problem(&answer, 400, "invalid-query");
    }
    let bad_resume = client
        .get(server.endpoint("/v1/events"))
        .header("accept", "text/event-stream")
        .header("last-event-id", "yesterday")
        .send()
        .await
        .unwrap();
    assert_problem(&answer(bad_resume).await, 400, "invalid-query");
    let page = get_json(&client, &server.endpoint("/v1/events?after=999999")).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.body["events"], json!([]));
    assert_eq!(page.body["next_after"], 999999);
    let missing = get_json(&client, &server.endpoint("/assets/secrets.txt")).await;
    assert_problem(&missing, 404, "route-not-found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_spans_follow_a_task_from_submit_to_complete_by_its_id() {
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("sluice.log");
    let server = Server::launch(
        &dir.path().join("data"),
        &[],
        &[
            ("SLUICE_LOG", "warn,sluice::task=debug"),
            ("SLUICE_LOG_SPANS", "1"),
            ("SLUICE_LOG_FORMAT", "json"),
        ],
        Some(&log_path),
    );
    let client = http();
    let body = json!({"kind": "oct.segment", "device": "oct-a", "priority": "normal",
        "est_exec_ms": 60000, "payload": {}});
    let id = submit(&client, &server, body).await;
    heartbeat(&client, &server, "gpu-1").await;
    let (claimed, token) = claim_one(&client, &server, "gpu-1").await;
    assert_eq!(claimed, id);
    accepted(
        &client,
        &server,
        &id,
        "start",
        json!({"lease_token": token}),
    )
    .await;
    let done = json!({"lease_token": token, "result": {}});
    accepted(&client, &server, &id, "complete", done).await;
    assert!(server.terminate().success());

    let log = std::fs::read_to_string(&log_path).unwrap();
    let spans: Vec<String> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|entry| {
            entry["target"] == "sluice::task" && entry["span"]["task_id"] == id.as_str()
        })
        .map(|entry| entry["span"]["name"].as_str().unwrap().to_owned())
        .collect();
    // Spans are logged as they close: admission inside the submission, then each step.
    assert_eq!(
        spans,
        ["admit", "submit", "claim", "start", "complete"],
        "{log}"
    );
}

/// The metric names a PromQL expression mentions.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("sluice_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grafana_dashboard_queries_only_metrics_the_server_exports() {
    let dashboard: Value = serde_json::from_str(include_str!(
        "../../host/server/assets/grafana/sluice-dashboard.json"
    ))
    .expect("the dashboard is JSON");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &SLOW_RETRY);
    let client = http();
    // Families show once they have a sample: one task completes and one fails.
    heartbeat(&client, &server, "gpu-1").await;
    for fails in [false, true] {
        let body = json!({"kind": "oct.segment", "device": "oct-a", "priority": "normal",
            "est_exec_ms": 60000, "payload": {}});
        submit(&client, &server, body).await;
        let (id, token) = claim_one(&client, &server, "gpu-1").await;
        accepted(
            &client,
            &server,
            &id,
            "start",
            json!({"lease_token": token}),
        )
        .await;
        let (what, body) = if fails {
            (
                "fail",
                json!({"lease_token": token, "class": "transient", "message": "GPU lost"}),
            )
        } else {
            ("complete", json!({"lease_token": token, "result": {}}))
        };
        accepted(&client, &server, &id, what, body).await;
    }
    let metrics = scrape(&client, &server).await;
    let mut checked = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for name in metric_names(expr) {
                let family = ["_bucket", "_total", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(&name);
                assert!(
                    metrics.families.contains_key(family),
                    "panel {:?} queries {name}, which /metrics does not export",
                    panel["title"]
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 30, "only {checked} metric references found");
}

/// Junk reports (tokens that never held the task) and a replayed submission of a leased task:
/// the junk is refused 409 and counted, and writes nothing; the replay shows no token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_reports_are_counted_and_write_nothing_and_a_replay_shows_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = http();
    let body = json!({"kind": "oct.scan", "key": "exam-1", "payload": {"eye": "left"}});
    let id = submit(&client, &server, body.clone()).await;
    register_worker(&client, &server, "w", 1).await;
    let lease = claim_lease(&client, &server, "w").await;
    let token = lease["lease_token"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 32);

    let replay = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
    assert_eq!((replay.status, replay.replayed), (200, true));
    assert_eq!(replay.body["state"], "claimed");
    assert_eq!(replay.body["lease"]["worker"], "w");
    assert!(
        !replay.body.to_string().contains(&token),
        "the replay leaked the token"
    );
    let batch = post_json(
        &client,
        &server.endpoint("/v1/tasks:batch"),
        &json!({"tasks": [body]}),
    )
    .await;
    assert_eq!(batch.status, 200, "{:?}", batch.body);
    assert!(
        !batch.body.to_string().contains(&token),
        "the batch leaked the token"
    );

    let record = || async {
        let task = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
        let events = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
        (
            task.body.to_string(),
            events.body["events"].as_array().unwrap().len(),
        )
    };
    let before = record().await;
    for n in 0..500 {
        let junk = format!("{n:032x}");
        let refused = report(
            &client,
            &server,
            &id,
            "complete",
            json!({"lease_token": junk, "result": 1}),
        )
        .await;
        assert_problem(&refused, 409, "stale-lease");
    }
    assert_eq!(
        record().await,
        before,
        "junk reports changed the task or its timeline"
    );
    let metrics = scrape(&client, &server).await;
    assert_eq!(
        value(&metrics, "sluice_reports_refused", &[("logged", "false")]),
        500.0
    );
    let done = report(
        &client,
        &server,
        &id,
        "complete",
        json!({"lease_token": token, "result": 1}),
    )
    .await;
    assert_eq!(done.status, 200, "{:?}", done.body);
}
