use super::*;
use sluice_model::{
    Callback, Family, FamilyPart, Lease, Metric, PolicyKind, Priority, Resources, RetiredLease,
    SearchScope, State, TaskError, TaskId, VariantTag,
};

/// A task with every optional part set, so that a field the codec forgets shows.
fn full_task() -> Task {
    let id: TaskId = "01JEZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap();
    let child: TaskId = "01JEZ3NDEKTSV4RRFFQ69G5FAW".parse().unwrap();
    Task {
        id,
        key: Some("scan-17".into()),
        kind: "oct.segment".into(),
        priority: Priority::Low,
        bucket: Priority::Normal,
        rank: 99,
        attempt_timeout_ms: 120_000,
        device: "scanner-7".into(),
        tenant: "site-a".into(),
        labels: [("ed".to_owned(), "true".to_owned())].into(),
        est_exec_ms: 60_000,
        deadline_ms: Some(5_000),
        deadline_at_ms: Some(1_700_000_005_000),
        max_attempts: 3,
        callback_url: Some("https://example.org/done".into()),
        resources: Resources {
            gpu_memory_mb: 8_000,
            model: Some("seg-v3".into()),
            batch_key: Some("512x496".into()),
        },
        concurrency_key: Some("scanner-7".into()),
        preemptible: false,
        preemptions: 1,
        created_at_ms: 1_700_000_000_000,
        updated_at_ms: 1_700_000_001_000,
        attempt: 2,
        state: State::Running,
        bucket_since_ms: 1_700_000_000_500,
        lease: Some(Lease {
            worker: "gpu-1".into(),
            token: "tok".into(),
            attempt: 2,
            expires_at_ms: 1_700_000_031_000,
            attempt_ends_at_ms: 1_700_000_121_000,
            claimed_at_ms: 1_700_000_000_900,
            started_at_ms: Some(1_700_000_000_950),
            gpu: Some(1),
            refusal_logged: true,
            ended_at_ms: Some(1),
            stopped_at_ms: Some(2),
            claim_id: Some("c-1".into()),
            revoked_at_ms: Some(3),
            revoked_for: Some(child),
        }),
        not_before_ms: Some(7),
        callback: Some(Callback {
            attempts: 2,
            next_at_ms: 8,
            delivered_at_ms: Some(9),
            gave_up: true,
        }),
        result: Some(serde_json::json!({"layers": [1, 2.5, "x"], "ok": true})),
        error: Some(TaskError {
            class: "transient".into(),
            message: "GPU reset".into(),
        }),
        event_seqs: vec![10, 11, 4_000_000, 4_000_007],
        parent: Some(child),
        family: Some(Family {
            parts: vec![FamilyPart {
                task: child,
                weight: 0.25,
                covers: "shard 3".into(),
                shard: Some(3),
            }],
            settled: 1,
            k: 10,
            allow_partial: true,
            merge_at_ms: Some(11),
            scope: Some(SearchScope {
                collection: "docs".into(),
                metric: Metric::Ip,
                shards: 4,
            }),
        }),
        retired_leases: vec![RetiredLease {
            token_sha256: "ab".repeat(16),
            attempt: 1,
            worker: "gpu-0".into(),
            refusal_logged: true,
        }],
        variants: vec![VariantTag {
            kind: PolicyKind::Merge,
            experiment: 4,
            variant: 1,
        }],
        first_claimed_at_ms: Some(12),
    }
}

#[test]
fn a_task_comes_back_as_it_went_in() {
    let task = full_task();
    let bytes = encode(&task).unwrap();
    assert_eq!(bytes[0], FORMAT_VERSION);
    assert_eq!(format_of(&bytes), Some(FORMAT_VERSION));
    assert_eq!(decode(&bytes).unwrap(), task);

    let mut bare = full_task();
    bare.key = None;
    bare.lease = None;
    bare.callback = None;
    bare.result = None;
    bare.error = None;
    bare.family = None;
    bare.event_seqs.clear();
    bare.retired_leases.clear();
    bare.variants.clear();
    assert_eq!(decode(&encode(&bare).unwrap()).unwrap(), bare);
}

/// A record of format 2 (what the release before wrote) reads as the same task without the
/// search part: the family has no scope and its parts no shard.
#[test]
fn a_format_two_record_reads_without_its_search_part() {
    let task = full_task();
    let mut bytes = encode(&task).unwrap();
    // Format 3 is format 2's body then the search part: cut the part, mark it format 2.
    let mut plain = task.clone();
    plain.resources.batch_key = None;
    if let Some(family) = &mut plain.family {
        family.scope = None;
        family.parts.iter_mut().for_each(|p| p.shard = None);
    }
    bytes.truncate(bytes.len() - search_part_len(&bytes));
    bytes[0] = 2;
    assert_eq!(format_of(&bytes), Some(2));
    assert_eq!(decode(&bytes).unwrap(), plain);
    // A format-3 record cut short, or with bytes after it, is corrupt, not a panic.
    let whole = encode(&task).unwrap();
    assert!(decode(&whole[..whole.len() - 1]).is_err());
    let mut longer = whole.clone();
    longer.push(0);
    assert!(decode(&longer).is_err());
}

/// A record of format 3 (the release before this one) reads as the same task without a batch
/// key; a format-3 record with format 4's part after it is corrupt.
#[test]
fn a_format_three_record_reads_without_its_batch_key() {
    let task = full_task();
    let format_3 = super::v3::encode(&task, 3).unwrap();
    let mut plain = task.clone();
    plain.resources.batch_key = None;
    assert_eq!(format_of(&format_3), Some(3));
    assert_eq!(decode(&format_3).unwrap(), plain);
    let mut marked_3 = encode(&task).unwrap();
    marked_3[0] = 3;
    assert!(decode(&marked_3).is_err());
}

/// The length of `bytes`' search part: everything after the format-2 body.
fn search_part_len(bytes: &[u8]) -> usize {
    let (_, rest) = super::v2::decode_body(&bytes[1..]).unwrap();
    rest.len()
}

#[test]
fn a_record_is_a_fraction_of_the_json_it_replaces() {
    // A queued task as a device submits it: the common record.
    let mut task = full_task();
    task.state = State::Queued;
    task.lease = None;
    task.callback = None;
    task.result = None;
    task.error = None;
    task.family = None;
    task.parent = None;
    task.retired_leases.clear();
    task.variants.clear();
    let compact = encode(&task).unwrap().len();
    let json = LEGACY_QUEUED.len();
    assert!(
        compact * 2 < json,
        "format 2 takes {compact} bytes, the JSON {json}"
    );
}

/// A queued task's record as format 1 wrote it (the JSON of the API at the time).
const LEGACY_QUEUED: &str = r#"{"id":"01JEZ3NDEKTSV4RRFFQ69G5FAV","key":"scan-17","kind":"oct.segment","priority":"low","bucket":"normal","rank":99,"attempt_timeout_ms":120000,"device":"scanner-7","tenant":"site-a","labels":{"ed":"true"},"est_exec_ms":60000,"deadline_ms":5000,"deadline_at_ms":1700000005000,"max_attempts":3,"callback_url":"https://example.org/done","resources":{"gpu_memory_mb":8000,"model":"seg-v3"},"concurrency_key":"scanner-7","preemptible":false,"preemptions":1,"created_at_ms":1700000000000,"updated_at_ms":1700000001000,"attempt":2,"state":"queued","bucket_since_ms":1700000000500,"event_seqs":[10,11,4000000,4000007]}"#;

#[test]
fn format_one_json_is_read_with_its_defaults() {
    let task = decode(LEGACY_QUEUED.as_bytes()).unwrap();
    assert_eq!(format_of(LEGACY_QUEUED.as_bytes()), Some(1));
    assert_eq!(task.state, State::Queued);
    assert_eq!(task.labels["ed"], "true");
    assert_eq!(task.resources.model.as_deref(), Some("seg-v3"));
    assert!(!task.preemptible);
    assert_eq!(task.event_seqs, [10, 11, 4_000_000, 4_000_007]);

    // The oldest records lack the fields added since; each has its default.
    let oldest = r#"{"id":"01JEZ3NDEKTSV4RRFFQ69G5FAV","kind":"k","priority":"normal","bucket":"urgent","device":"d","tenant":"t","est_exec_ms":5,"max_attempts":3,"created_at_ms":1,"updated_at_ms":2,"attempt":0,"state":"queued"}"#;
    let task = decode(oldest.as_bytes()).unwrap();
    assert!(task.preemptible);
    assert_eq!(task.rank, 0);
    assert_eq!(task.bucket, Priority::Urgent);
    assert!(task.lease.is_none() && task.labels.is_empty());
}

#[test]
fn a_bad_record_is_corrupt_not_a_panic() {
    let good = encode(&full_task()).unwrap();
    for cut in 0..good.len() {
        assert!(
            decode(&good[..cut]).is_err(),
            "a record cut at {cut} decoded"
        );
    }
    let mut longer = good.clone();
    longer.push(0);
    assert!(decode(&longer).is_err());
    let mut newer = good.clone();
    newer[0] = FORMAT_VERSION + 1;
    let error = decode(&newer).unwrap_err().to_string();
    assert!(error.contains("newer Sluice"), "{error}");
    assert!(decode(b"{\"id\":").is_err());
}
