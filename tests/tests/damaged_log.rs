//! A damaged write-ahead log: a flipped byte in the middle of the last segment, with intact
//! records after it, stops `sluice serve` with a message naming the file and the offset instead
//! of silently zeroing acknowledged records; `sluice repair` copies the log and cuts it there,
//! and the server then starts with everything before the damage.

use sluice_tests::*;
use std::process::{Command, Stdio};

/// The write-ahead segments of `data`, oldest first, with their first commit.
fn segments(data: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found: Vec<_> = std::fs::read_dir(data.join("wal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "wal"))
        .collect();
    found.sort();
    found
}

/// The byte offsets of the records in a segment: `[length u32][crc u32][commit u64][entry]`.
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut offsets = Vec::new();
    let mut at = 0;
    while at + 8 <= bytes.len() {
        let length = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if length == 0 {
            break;
        }
        offsets.push(at);
        at += 8 + length;
    }
    offsets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_record_stops_the_server_and_repair_cuts_the_log_keeping_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data);
    let client = http();
    let mut ids = Vec::new();
    for n in 0..20 {
        let created = post_json(
            &client,
            &server.endpoint("/v1/tasks"),
            &json!({"kind": "oct.scan", "payload": {"n": n}}),
        )
        .await;
        assert_eq!(created.status, 201, "{:?}", created.body);
        ids.push(created.body["id"].as_str().unwrap().to_owned());
    }
    // Killed at once: the commits are still in the log, not yet all written into sled.
    server.kill9();

    let segment = segments(&data)
        .into_iter()
        .rev()
        .find(|path| record_offsets(&std::fs::read(path).unwrap()).len() >= 3)
        .expect("a segment holding several commits");
    let mut bytes = std::fs::read(&segment).unwrap();
    let offsets = record_offsets(&bytes);
    let damaged_at = offsets[1];
    bytes[damaged_at + 20] ^= 0xFF;
    std::fs::write(&segment, &bytes).unwrap();

    let refused = Command::new(sluice_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .env("SLUICE_LOG", "error")
        .stdin(Stdio::null())
        .output()
        .expect("run sluice serve");
    assert!(
        !refused.status.success(),
        "the server started on a damaged log"
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains(&segment.display().to_string()), "{stderr}");
    assert!(stderr.contains(&format!("byte {damaged_at}")), "{stderr}");
    assert!(stderr.contains("sluice repair"), "{stderr}");
    assert_eq!(
        std::fs::read(&segment).unwrap(),
        bytes,
        "the refused start changed the log"
    );

    let repaired = Command::new(sluice_binary())
        .args(["repair", "--data-dir"])
        .arg(&data)
        .output()
        .expect("run sluice repair");
    let stdout = String::from_utf8_lossy(&repaired.stdout);
    assert!(
        repaired.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&repaired.stderr)
    );
    assert!(
        stdout.contains(&format!("cut at byte {damaged_at}")),
        "{stdout}"
    );
    let copy = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("wal.salvaged-")
        })
        .expect("a copy of the log");
    let copied = copy.join(segment.file_name().unwrap());
    assert_eq!(
        std::fs::read(copied).unwrap(),
        bytes,
        "the copy is the damaged log as it was"
    );

    let server = Server::start(&data);
    let tasks = all_tasks(&client, &server).await;
    // What is left is a prefix of what was submitted, in order: the commits before the damage
    // (and any the materializer had already written into sled).
    assert!(!tasks.is_empty(), "nothing before the damage was kept");
    let present: Vec<&str> = tasks.iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(
        present,
        ids[..present.len()]
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    let created = post_json(
        &client,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.scan"}),
    )
    .await;
    assert_eq!(created.status, 201, "{:?}", created.body);
    let status = server.terminate();
    assert!(status.success(), "{status:?}");
}
