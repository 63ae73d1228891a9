//! A data directory written by the last release of format 1 (JSON records), kept as a fixture
//! (`fixtures/format-1`), opens with this release: every task reads back as it was, the
//! directory is migrated to the current format, and one of a newer format is refused.

use super::*;
use sluice_store::record::{FORMAT_VERSION, format_of};

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/format-1");

/// The fixture unpacked into a fresh directory, and its tasks with the state each was in.
fn unpack() -> (tempfile::TempDir, Vec<(TaskId, State)>) {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("tar")
        .arg("xzf")
        .arg(format!("{FIXTURE}/data.tar.gz"))
        .arg("-C")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success(), "tar: {status}");
    let listed = std::fs::read_to_string(format!("{FIXTURE}/tasks.txt")).unwrap();
    let tasks = listed
        .lines()
        .map(|line| {
            let (id, state) = line.split_once(' ').unwrap();
            let state = State::ALL
                .into_iter()
                .find(|s| s.as_str() == state)
                .unwrap();
            (id.parse().unwrap(), state)
        })
        .collect();
    (dir, tasks)
}

/// The tasks tree of a closed directory, opened as sled alone.
fn raw(dir: &std::path::Path) -> (sled::Db, sled::Tree) {
    let db = sled::Config::new()
        .path(dir)
        .segment_size(segment::segment_bytes(dir))
        .open()
        .unwrap();
    let tree = db.open_tree(TREE_NAME).unwrap();
    (db, tree)
}

fn formats(store: &SledStore) -> Vec<Option<u8>> {
    store
        .shared
        .tree
        .scan_prefix([keys::TASK])
        .map(|item| {
            let (_, bytes) = item.unwrap();
            format_of(record::split(&bytes).unwrap().task)
        })
        .collect()
}

#[test]
fn a_directory_of_format_one_opens_migrated_with_every_task_as_it_was() {
    let (dir, expected) = unpack();
    let data = dir.path().join("data");
    // Before: no format key, and JSON records.
    {
        let (_db, tree) = raw(&data);
        assert!(tree.get(keys::FORMAT).unwrap().is_none());
    }
    let store = SledStore::open(&data, &SledOptions::default()).unwrap();
    assert_eq!(formats(&store), vec![Some(FORMAT_VERSION); expected.len()]);
    assert_eq!(
        store.shared.tree.get(keys::FORMAT).unwrap().as_deref(),
        Some(&[FORMAT_VERSION][..])
    );
    for (id, state) in &expected {
        let task = store.task(*id).unwrap().unwrap();
        assert_eq!(task.state, *state, "{id}");
        assert!(!task.event_seqs.is_empty(), "{id} lost its timeline");
    }
    let [queued, big, completed, dead, cancelled, claimed] = &expected[..] else {
        panic!("the fixture lists six tasks");
    };
    let queued = store.task(queued.0).unwrap().unwrap();
    assert_eq!(queued.key.as_deref(), Some("fixture-a"));
    assert_eq!(queued.labels["ed"], "true");
    assert_eq!(queued.resources.model.as_deref(), Some("seg-v3"));
    assert_eq!(queued.concurrency_key.as_deref(), Some("scanner-7"));
    assert_eq!(
        store.payload(queued.id).unwrap().unwrap(),
        br#"{"eye":"left"}"#
    );
    let big_payload = store.payload(big.0).unwrap().unwrap();
    assert!(big_payload.len() > 20_000, "{} bytes", big_payload.len());
    let completed = store.task(completed.0).unwrap().unwrap();
    assert_eq!(
        completed.result,
        Some(serde_json::json!({"layers": [1, 2.5], "ok": true}))
    );
    let dead = store.task(dead.0).unwrap().unwrap();
    assert_eq!(dead.error.unwrap().class, "permanent");
    assert!(store.task(cancelled.0).unwrap().unwrap().lease.is_none());
    let lease = store.task(claimed.0).unwrap().unwrap().lease.unwrap();
    assert_eq!(lease.worker, "gpu-1");
    assert!(!lease.token.is_empty());

    // The event log's blocks stay as format 1 wrote them (JSON) and read back: every event a
    // task lists is in the log, in order.
    let events = store.events_after(0, 1_000).unwrap();
    assert!(events.windows(2).all(|pair| pair[1].seq == pair[0].seq + 1));
    for (id, _) in &expected {
        let task = store.task(*id).unwrap().unwrap();
        for seq in &task.event_seqs {
            let event = events.iter().find(|e| e.seq == *seq).unwrap();
            assert_eq!(event.task_id, *id);
        }
    }

    // Recovery rebuilds the queues from the two queued tasks and the leases from the claimed
    // one. Their index entries predate the queue entry's names (format 4), so the two queued
    // tasks come from their records, as live tasks the engine queues.
    let recovery = store.recover().unwrap();
    assert!(recovery.queued.is_empty());
    let of_state = |queued: bool| -> Vec<TaskId> {
        recovery
            .live
            .iter()
            .filter(|t| (t.state == State::Queued) == queued)
            .map(|t| t.id)
            .collect()
    };
    let waiting = of_state(true);
    assert_eq!(waiting.len(), 2);
    assert!(waiting.contains(&queued.id));
    assert_eq!(of_state(false), [claimed.0]);
    assert_eq!(
        recovery.tasks_by_state.iter().sum::<u64>(),
        expected.len() as u64
    );
    let key = store.key("fixture-a").unwrap().unwrap();
    assert_eq!(key.task_id, queued.id);
    drop(store);

    // Opened again, nothing is left to migrate and everything is still there.
    let again = SledStore::open(&data, &SledOptions::default()).unwrap();
    assert_eq!(formats(&again), vec![Some(FORMAT_VERSION); expected.len()]);
    assert_eq!(again.task(completed.id).unwrap().unwrap(), completed);
}

#[test]
fn a_directory_of_a_newer_format_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    drop(SledStore::open(dir.path(), &SledOptions::default()).unwrap());
    {
        let (db, tree) = raw(dir.path());
        assert_eq!(
            tree.get(keys::FORMAT).unwrap().as_deref(),
            Some(&[FORMAT_VERSION][..]),
            "a new directory is marked with the current format"
        );
        tree.insert(keys::FORMAT, &[FORMAT_VERSION + 1]).unwrap();
        db.flush().unwrap();
    }
    let error = match SledStore::open(dir.path(), &SledOptions::default()) {
        Ok(_) => panic!("a directory of a newer format opened"),
        Err(error) => error.to_string(),
    };
    assert!(error.contains("newer Sluice"), "{error}");
    assert!(
        error.contains(&format!("format {}", FORMAT_VERSION + 1)),
        "{error}"
    );
}
