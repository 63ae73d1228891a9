//! Retention on a real server with a retention of one second: ended tasks go with their keys
//! and events, a task still due a callback and a live one stay, the event log's floor moves
//! (a reader behind it gets 410 with the floor), the counts follow, and a restart agrees.
//! The soak prints bytes on disk over time under a steady load.

use sluice_tests::*;
use std::time::{Duration, Instant};

async fn submit(client: &reqwest::Client, server: &Server, body: Value) -> String {
    let created = post_json(client, &server.endpoint("/v1/tasks"), &body).await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    created.body["id"].as_str().unwrap().to_owned()
}

async fn complete_all(client: &reqwest::Client, server: &Server, worker: &str, count: usize) {
    let mut done = 0;
    while done < count {
        let url = server.endpoint(&format!("/v1/workers/{worker}/claim"));
        let claim = post_json(client, &url, &json!({"max": 64, "wait_ms": 1000})).await;
        assert_eq!(claim.status, 200, "{:?}", claim.body);
        for lease in claim.body["leases"].as_array().unwrap() {
            let id = lease["task"]["id"].as_str().unwrap();
            let body = json!({"lease_token": lease["lease_token"], "result": {"ok": 1}});
            let reported = report(client, server, id, "complete", body).await;
            assert_eq!(reported.status, 200, "{:?}", reported.body);
            done += 1;
        }
    }
}

async fn status_of(client: &reqwest::Client, server: &Server, id: &str) -> u16 {
    get_json(client, &server.endpoint(&format!("/v1/tasks/{id}")))
        .await
        .status
}

on_each_store!(ended_tasks_go_after_the_retention_with_their_keys_and_events);

async fn ended_tasks_go_after_the_retention_with_their_keys_and_events(store: TestStore) {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--retention-ms", "1000", "--callback-allow", "127.0.0.1"];
    let server = store.start_with(dir.path(), &args);
    let client = http();
    register_worker(&client, &server, "w", 64).await;
    let mut ended = Vec::new();
    for n in 0..20 {
        let body = json!({"kind": "oct.scan", "key": format!("exam-{n}"), "payload": {"n": n}});
        ended.push(submit(&client, &server, body).await);
    }
    // One whose receiver refuses: its callback stays due for minutes, so it stays.
    let (url, _bodies) = callback_receiver(vec![503], None).await;
    let owed = submit(
        &client,
        &server,
        json!({"kind": "oct.scan", "callback_url": url}),
    )
    .await;
    complete_all(&client, &server, "w", 21).await;
    // A live one, queued after the others ended; no worker takes it.
    let live = submit(&client, &server, json!({"kind": "never.claimed"})).await;

    wait_for("the ended tasks to go", Duration::from_secs(30), || async {
        for id in &ended {
            if status_of(&client, &server, id).await != 404 {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert_eq!(status_of(&client, &server, &owed).await, 200);
    assert_eq!(status_of(&client, &server, &live).await, 200);
    let timeline = get_json(
        &client,
        &server.endpoint(&format!("/v1/tasks/{live}/events")),
    )
    .await;
    assert_eq!(timeline.status, 200, "{:?}", timeline.body);
    // The key went with its task: the same key makes a new task.
    let again = submit(
        &client,
        &server,
        json!({"kind": "oct.scan", "key": "exam-0", "payload": {"n": 0}}),
    )
    .await;
    assert!(!ended.contains(&again));

    // The event log's floor has moved; a reader behind it is told where it is, and reads on
    // from there. Retention may move the floor again between the two reads (a callback owed
    // when the first pass ran is delivered, and the next pass takes its task's events): the
    // reader is then told the new floor, and follows it.
    let floor = wait_for(
        "the event log's floor to move",
        Duration::from_secs(30),
        || async {
            let page = get_json(&client, &server.endpoint("/v1/events?after=0")).await;
            (page.status == 410).then_some(page)
        },
    )
    .await;
    assert_problem(&floor, 410, "events-gone");
    let mut first_seq = floor.body["first_seq"].as_u64().unwrap();
    assert!(first_seq > 1);
    let page = loop {
        let url = server.endpoint(&format!("/v1/events?after={}", first_seq - 1));
        let page = get_json(&client, &url).await;
        if page.status == 200 {
            break page;
        }
        assert_problem(&page, 410, "events-gone");
        let moved = page.body["first_seq"].as_u64().unwrap();
        assert!(
            moved > first_seq,
            "the floor went back from {first_seq} to {moved}"
        );
        first_seq = moved;
    };
    assert_eq!(page.body["first_seq"], first_seq);

    // The counts follow, and a restart finds the same.
    let stats = get_json(&client, &server.endpoint("/v1/stats")).await;
    assert_eq!(
        stats.body["tasks_by_state"]["completed"], 1,
        "{:?}",
        stats.body
    );
    drop(server);
    let server = store.start_with(dir.path(), &args);
    let stats = get_json(&client, &server.endpoint("/v1/stats")).await;
    assert_eq!(
        stats.body["tasks_by_state"]["completed"], 1,
        "{:?}",
        stats.body
    );
    for id in &ended {
        assert_eq!(status_of(&client, &server, id).await, 404);
    }
}

/// Bytes under `dir`, every file counted at its length.
fn bytes_on_disk(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let meta = entry.metadata().unwrap();
        total += if meta.is_dir() {
            bytes_on_disk(&entry.path())
        } else {
            meta.len()
        };
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_load_with_a_short_retention_keeps_the_disk_flat() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--retention-ms", "1000"]);
    let client = http();
    register_worker(&client, &server, "w", 64).await;
    let started = Instant::now();
    // (seconds, bytes in sled's files, bytes of the write-ahead log, payload bytes submitted)
    let mut samples = Vec::new();
    let mut next_sample = Duration::ZERO;
    let payload = "x".repeat(4 << 10);
    let mut submitted_bytes = 0u64;
    while started.elapsed() < Duration::from_secs(20) {
        let batch: Vec<Value> = (0..50)
            .map(|_| json!({"kind": "oct.scan", "payload": {"scan": payload}}))
            .collect();
        let url = server.endpoint("/v1/tasks:batch");
        let created = post_json(&client, &url, &json!({"tasks": batch})).await;
        assert_eq!(created.status, 200, "{:?}", created.body);
        submitted_bytes += 50 * payload.len() as u64;
        complete_all(&client, &server, "w", 50).await;
        if started.elapsed() >= next_sample {
            let at_s = started.elapsed().as_secs();
            let wal = bytes_on_disk(&dir.path().join("wal"));
            let sled = bytes_on_disk(dir.path()) - wal;
            samples.push((at_s, sled, wal, submitted_bytes));
            next_sample += Duration::from_secs(2);
        }
    }
    let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
    for (at_s, sled, wal, submitted) in &samples {
        println!(
            "at {at_s:>2} s: sled {:>6.1} MiB, log {:>6.1} MiB on disk; {:>6.1} MiB of payloads submitted",
            mib(*sled),
            mib(*wal),
            mib(*submitted)
        );
    }
    // Past the first samples (sled's files being laid down), sled grows by far less than what
    // was submitted since: what ended is removed. The log is bounded by its own design: the
    // segment being written, one zeroed ahead (32 MiB each), and those not yet written in place.
    let (_, settled_sled, _, settled_submitted) = samples[2];
    let (_, last_sled, _, last_submitted) = *samples.last().unwrap();
    let grown = last_sled.saturating_sub(settled_sled);
    let submitted_since = last_submitted - settled_submitted;
    assert!(
        grown * 4 < submitted_since,
        "sled grew {:.1} MiB while {:.1} MiB were submitted",
        mib(grown),
        mib(submitted_since)
    );
    let largest_log = samples.iter().map(|s| s.2).max().unwrap();
    assert!(
        largest_log <= 4 * (32 << 20),
        "the log reached {:.1} MiB",
        mib(largest_log)
    );
}
