//! A full disk, for real: a size-limited tmpfs mounted by the test, filled by a file while a
//! device submits and a worker claims and completes. While it is full every write is answered
//! 507 `insufficient-storage` and reads and the status page still answer; once the file is
//! removed writes resume without a restart; and nothing answered 507 exists, nothing
//! acknowledged is lost (after a restart too), and the event log has no gap.

use sluice_tests::disk::{Tmpfs, fill, free_bytes};
use sluice_tests::*;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TMPFS_MB: u64 = 256;
/// The server's reserve: 32 MiB.
const RESERVE_BYTES: u64 = 32 << 20;
/// What the filler leaves: under the reserve, so the disk is full to Sluice.
const LEFT_BYTES: u64 = 4 << 20;

fn reserve_args() -> Vec<String> {
    vec![
        "--min-free-disk-bytes".into(),
        RESERVE_BYTES.to_string(),
        "--lease-ms".into(),
        "60000".into(),
    ]
}

fn start(data: &std::path::Path) -> Server {
    let args = reserve_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start_with(data, &args)
}

/// What the load saw: tasks acknowledged (by key), submissions refused with 507 (by key),
/// and the statuses of claims and reports.
#[derive(Default)]
struct Seen {
    /// Key → id.
    acknowledged: Mutex<HashMap<String, String>>,
    refused: Mutex<HashSet<String>>,
    /// Claims and completes answered 507.
    refused_worker_writes: AtomicUsize,
}

async fn submit_until(server: Arc<Server>, seen: Arc<Seen>, stop: Arc<AtomicBool>) {
    let client = http();
    // Payloads of 8 KiB, so the log grows fast enough to matter.
    let filler = "x".repeat(8 << 10);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("exam-{n}");
        let body = json!({"kind": "oct.scan", "key": key, "payload": {"scan": filler}});
        let submitted = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
        match submitted.status {
            201 => {
                let id = submitted.body["id"].as_str().unwrap().to_owned();
                seen.acknowledged.lock().unwrap().insert(key, id);
            }
            507 => {
                assert_problem(&submitted, 507, "insufficient-storage");
                seen.refused.lock().unwrap().insert(key);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            other => panic!("submission {key} got {other}: {:?}", submitted.body),
        }
    }
}

async fn work_until(server: Arc<Server>, seen: Arc<Seen>, stop: Arc<AtomicBool>) {
    let client = http();
    register_worker(&client, &server, "w", 16).await;
    while !stop.load(Ordering::Relaxed) {
        let url = server.endpoint("/v1/workers/w/claim");
        let claim = post_json(&client, &url, &json!({"max": 16, "wait_ms": 50})).await;
        match claim.status {
            200 => {}
            507 => {
                assert_problem(&claim, 507, "insufficient-storage");
                seen.refused_worker_writes.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            other => panic!("a claim got {other}: {:?}", claim.body),
        }
        for lease in claim.body["leases"].as_array().unwrap() {
            let id = lease["task"]["id"].as_str().unwrap();
            let token = lease["lease_token"].as_str().unwrap();
            let result = json!({"lease_token": token, "result": {"ok": true}});
            // A complete refused by the full disk is repeated until it is taken.
            loop {
                let url = server.endpoint(&format!("/v1/tasks/{id}/complete"));
                let done = post_json(&client, &url, &result).await;
                match done.status {
                    200 => break,
                    507 => {
                        assert_problem(&done, 507, "insufficient-storage");
                        seen.refused_worker_writes.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    other => panic!("a complete got {other}: {:?}", done.body),
                }
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }
}

/// Every task present is one that was acknowledged, and every acknowledged one is present.
async fn assert_exactly_the_acknowledged(server: &Server, seen: &Seen) {
    let client = http();
    let tasks = all_tasks(&client, server).await;
    let keys: HashSet<String> = tasks
        .iter()
        .filter_map(|t| t["key"].as_str().map(str::to_owned))
        .collect();
    let acknowledged = seen.acknowledged.lock().unwrap().clone();
    let refused = seen.refused.lock().unwrap().clone();
    for key in acknowledged.keys() {
        assert!(keys.contains(key), "acknowledged task {key} is gone");
    }
    for key in &refused {
        assert!(!keys.contains(key), "{key} was answered 507 yet exists");
    }
    assert_eq!(
        tasks.len(),
        acknowledged.len(),
        "a task nobody acknowledged"
    );
    assert_gap_free_log(&client, server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_answered_507_and_writes_resume_once_space_is_freed() {
    let Some(disk) = Tmpfs::mount(TMPFS_MB) else {
        return;
    };
    let data = disk.path().join("data");
    let server = Arc::new(start(&data));
    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let load = [
        tokio::spawn(submit_until(server.clone(), seen.clone(), stop.clone())),
        tokio::spawn(work_until(server.clone(), seen.clone(), stop.clone())),
    ];
    let client = http();
    wait_for(
        "tasks acknowledged before the disk fills",
        Duration::from_secs(60),
        || async { (seen.acknowledged.lock().unwrap().len() >= 100).then_some(()) },
    )
    .await;

    let filler = fill(disk.path(), LEFT_BYTES);
    println!("filled: {} bytes free", free_bytes(disk.path()));
    wait_for(
        "submissions and claims answered 507",
        Duration::from_secs(30),
        || async {
            let refused = seen.refused.lock().unwrap().len();
            (refused >= 20 && seen.refused_worker_writes.load(Ordering::Relaxed) > 0).then_some(())
        },
    )
    .await;
    // Reads, the status page and the metrics still answer while the disk is full.
    let some = seen
        .acknowledged
        .lock()
        .unwrap()
        .values()
        .next()
        .cloned()
        .unwrap();
    let read = get_json(&client, &server.endpoint(&format!("/v1/tasks/{some}"))).await;
    assert_eq!(read.status, 200, "{:?}", read.body);
    for path in ["/", "/v1/stats", "/v1/events?after=0&limit=10", "/metrics"] {
        let read = client.get(server.endpoint(path)).send().await.unwrap();
        assert_eq!(read.status(), 200, "{path} while the disk is full");
    }
    let acknowledged_while_full = seen.acknowledged.lock().unwrap().len();

    std::fs::remove_file(&filler).unwrap();
    println!("freed: {} bytes free", free_bytes(disk.path()));
    wait_for(
        "writes to resume without a restart",
        Duration::from_secs(30),
        || async {
            (seen.acknowledged.lock().unwrap().len() >= acknowledged_while_full + 50).then_some(())
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    println!(
        "{} acknowledged, {} submissions and {} claims or completes answered 507",
        seen.acknowledged.lock().unwrap().len(),
        seen.refused.lock().unwrap().len(),
        seen.refused_worker_writes.load(Ordering::Relaxed)
    );
    assert_exactly_the_acknowledged(&server, &seen).await;

    // And after a kill and a restart.
    Arc::into_inner(server).expect("the load is over").kill9();
    let server = start(&data);
    assert_exactly_the_acknowledged(&server, &seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_started_on_a_full_disk_serves_reads_and_takes_writes_once_there_is_room() {
    let Some(disk) = Tmpfs::mount(TMPFS_MB) else {
        return;
    };
    let data = disk.path().join("data");
    let client = http();
    let mut ids = Vec::new();
    {
        let server = start(&data);
        for n in 0..5 {
            let body = json!({"kind": "oct.scan", "payload": {"n": n}});
            let created = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
            assert_eq!(created.status, 201, "{:?}", created.body);
            ids.push(created.body["id"].as_str().unwrap().to_owned());
        }
        assert!(server.terminate().success());
    }
    // Too full for the reserve, and far too full for a zeroed log segment (32 MiB). A server
    // drops the spare segment the last run laid down when it cannot make one again, which
    // would free 32 MiB here: the disk is filled as if that run had stopped before its spare
    // was ready.
    let _ = std::fs::remove_file(data.join("wal/spare.tmp"));
    let filler = fill(disk.path(), LEFT_BYTES);
    let server = start(&data);
    for id in &ids {
        let read = get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
        assert_eq!(read.status, 200, "{:?}", read.body);
    }
    let page = client.get(server.endpoint("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let body = json!({"kind": "oct.scan", "key": "while-full"});
    let refused = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
    assert_problem(&refused, 507, "insufficient-storage");
    assert!(
        refused.body["detail"]
            .as_str()
            .unwrap()
            .contains("bytes free"),
        "{:?}",
        refused.body
    );

    std::fs::remove_file(&filler).unwrap();
    let created = wait_for(
        "a write once there is room",
        Duration::from_secs(30),
        || async {
            let created = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
            (created.status == 201).then_some(created)
        },
    )
    .await;
    ids.push(created.body["id"].as_str().unwrap().to_owned());
    let tasks = all_tasks(&client, &server).await;
    assert_eq!(tasks.len(), ids.len(), "{tasks:?}");
    assert_gap_free_log(&client, &server).await;
}
