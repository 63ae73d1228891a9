//! The trace format's reader and writer, the generators and the CSV importer.

use super::generate::{Shape, generate};
use super::import::{Columns, ImportError, TimeUnit, import};
use super::*;

fn written(tasks: &[TraceTask]) -> Vec<u8> {
    let mut out = Vec::new();
    for task in tasks {
        write_task(&mut out, task).unwrap();
    }
    out
}

fn read_all(bytes: &[u8]) -> Result<Vec<TraceTask>, TraceError> {
    TraceReader::new(bytes).collect()
}

#[test]
fn a_written_trace_reads_back_the_same_and_defaults_fill_what_a_line_leaves_out() {
    let tasks: Vec<TraceTask> = generate(Shape::Burst, 500, 7).collect();
    assert_eq!(read_all(&written(&tasks)).unwrap(), tasks);
    let short = read_all(b"{\"submit_ms\": 5, \"service_ms\": 100}\n\n").unwrap();
    assert_eq!(short, [TraceTask::at(5, 100)]);
    assert_eq!(short[0].priority, Priority::Normal);
}

#[test]
fn bad_lines_are_refused_with_their_line_number() {
    let cases: [(&[u8], &str); 7] = [
        (b"{\"submit_ms\": 5}", "service_ms"),
        (
            b"{\"submit_ms\": 5, \"service_ms\": 1, \"gpu\": 2}",
            "unknown field",
        ),
        (
            b"{\"submit_ms\": 5, \"service_ms\": 1}\n{\"submit_ms\": 4, \"service_ms\": 1}",
            "submission order",
        ),
        (
            b"{\"submit_ms\": 0, \"service_ms\": 90000000}",
            "over a day",
        ),
        (
            b"{\"submit_ms\": 0, \"service_ms\": 1, \"failures\": [\"lease-expired\"]}",
            "scheduler's",
        ),
        (
            b"{\"submit_ms\": 0, \"service_ms\": 1, \"kind\": \"\"}",
            "1 to 128",
        ),
        (
            b"{\"submit_ms\": 0, \"service_ms\": 1, \"model\": \"seg a\"}",
            "field `model`",
        ),
    ];
    for (input, expected) in cases {
        let error = read_all(input).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
        assert!(error.starts_with("line "), "{error}");
    }
    let error = read_all(b"\n{\"submit_ms\": 5, \"service_ms\": 1}\n{bad").unwrap_err();
    assert!(
        matches!(error, TraceError::Invalid { line: 3, .. }),
        "{error}"
    );
    // A line past the bound is refused without reading the rest of it.
    let long = vec![b' '; MAX_LINE_BYTES + 10];
    assert!(
        read_all(&long)
            .unwrap_err()
            .to_string()
            .contains("longer than")
    );
}

#[test]
fn generators_replay_from_their_seed_and_keep_their_shape() {
    for shape in [Shape::Steady, Shape::Burst, Shape::Diurnal, Shape::Seed800] {
        let first = written(&generate(shape, 2_000, 42).collect::<Vec<_>>());
        assert_eq!(
            first,
            written(&generate(shape, 2_000, 42).collect::<Vec<_>>())
        );
        assert_ne!(
            first,
            written(&generate(shape, 2_000, 43).collect::<Vec<_>>())
        );
        let tasks = read_all(&first).unwrap();
        assert_eq!(tasks.len(), 2_000);
        let urgent = tasks
            .iter()
            .filter(|t| t.priority == Priority::Urgent)
            .count();
        assert!(
            (100..300).contains(&urgent),
            "{shape:?}: {urgent} urgent of 2,000"
        );
    }
    let seed = generate(Shape::Seed800, 800, 1).collect::<Vec<_>>();
    assert!(
        seed.iter().all(|t| t.submit_ms == 0),
        "the seed's load arrives at once"
    );
    let failed = seed.iter().filter(|t| !t.failures.is_empty()).count();
    assert!(
        (20..70).contains(&failed),
        "{failed} of 800 scripted to fail"
    );
    // Steady: 100 a second, so 2,000 tasks span about 20 s.
    let steady = generate(Shape::Steady, 2_000, 3).last().unwrap().submit_ms;
    assert!((17_000..23_000).contains(&steady), "{steady}");
    // Bursts: most arrivals land in the first 6 s of each minute.
    let burst: Vec<TraceTask> = generate(Shape::Burst, 5_000, 3).collect();
    let in_bursts = burst
        .iter()
        .filter(|t| t.submit_ms % 60_000 < 6_000)
        .count();
    assert!(
        in_bursts * 2 > burst.len(),
        "{in_bursts} of {} in bursts",
        burst.len()
    );
}

const CSV: &str = "\
job_id,start_time,duration,prio,user,gpu_num
a,1700000010.5,30,2,alice,1
b,1700000000,12.25,0,bob,2
c,1700000003,1,1,alice,
";

fn columns() -> Columns {
    "submit=start_time,service=duration,priority=prio:0=low/1=normal/2=urgent,tenant=user,gpus=gpu_num"
        .parse()
        .unwrap()
}

#[test]
fn a_csv_imports_through_its_column_mapping_relative_and_in_order() {
    let tasks = import(CSV.as_bytes(), &columns(), TimeUnit::Seconds, 10, false)
        .unwrap()
        .tasks;
    let summary: Vec<(u64, u64, Priority, &str, u32)> = tasks
        .iter()
        .map(|t| {
            (
                t.submit_ms,
                t.service_ms,
                t.priority,
                t.tenant.as_str(),
                t.gpus,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (0, 12_250, Priority::Low, "bob", 2),
            (3_000, 1_000, Priority::Normal, "alice", 0),
            (10_500, 30_000, Priority::Urgent, "alice", 1),
        ]
    );
    // What it writes reads back as a trace.
    assert_eq!(read_all(&written(&tasks)).unwrap(), tasks);
    // End times instead of durations, in ms.
    let ends = "s,e\n100,350\n50,60\n";
    let by_end: Columns = "submit=s,end=e".parse().unwrap();
    let tasks = import(ends.as_bytes(), &by_end, TimeUnit::Millis, 10, false)
        .unwrap()
        .tasks;
    assert_eq!(
        tasks
            .iter()
            .map(|t| (t.submit_ms, t.service_ms))
            .collect::<Vec<_>>(),
        [(0, 10), (50, 250)]
    );
}

#[test]
fn a_bad_mapping_or_row_is_refused_with_what_is_wrong() {
    for (mapping, expected) in [
        ("submit=a", "one of service or end"),
        ("submit=a,service=b,end=c", "one of service or end"),
        ("submit=a,service=b,prio=c", "unknown field"),
        ("submit=a,service=b,priority=c", "value map"),
        ("submit=a,service=b,priority=c:1=high", "not a bucket"),
        ("submit=a,submit=b,service=c", "mapped twice"),
    ] {
        let error = mapping.parse::<Columns>().unwrap_err().to_string();
        assert!(error.contains(expected), "{mapping}: {error}");
    }
    let missing: Columns = "submit=start,service=duration".parse().unwrap();
    let error = import(CSV.as_bytes(), &missing, TimeUnit::Seconds, 10, false).unwrap_err();
    assert!(
        matches!(error, ImportError::NoColumn(ref c, _) if c == "start"),
        "{error}"
    );
    let unmapped = CSV.replace(",1,alice,\n", ",7,alice,\n");
    let error = import(
        unmapped.as_bytes(),
        &columns(),
        TimeUnit::Seconds,
        10,
        false,
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "row 4: priority \"7\" is not in the value map (--skip-invalid leaves such rows out)"
    );
    let negative = CSV.replace(",30,", ",-30,");
    let error = import(
        negative.as_bytes(),
        &columns(),
        TimeUnit::Seconds,
        10,
        false,
    )
    .unwrap_err();
    assert!(error.to_string().starts_with("row 2: "), "{error}");
    let error = import(CSV.as_bytes(), &columns(), TimeUnit::Seconds, 2, false).unwrap_err();
    assert!(matches!(error, ImportError::TooMany(2)), "{error}");
    // A model column: a name is kept, an empty cell names none, a bad name is refused.
    let with_models: Columns = "submit=s,service=d,model=m".parse().unwrap();
    let csv = "s,d,m\n0,1,seg-v3\n1,1,\n";
    let tasks = import(csv.as_bytes(), &with_models, TimeUnit::Seconds, 10, false)
        .unwrap()
        .tasks;
    let models: Vec<_> = tasks.iter().map(|t| t.model.as_deref()).collect();
    assert_eq!(models, [Some("seg-v3"), None]);
    let bad = import(
        "s,d,m\n0,1,seg v3\n".as_bytes(),
        &with_models,
        TimeUnit::Seconds,
        10,
        false,
    );
    let error = bad.unwrap_err().to_string();
    assert!(
        error.starts_with("row 2: ") && error.contains("model"),
        "{error}"
    );
}

fn submission(body: serde_json::Value) -> sluice_model::Submission {
    serde_json::from_value::<sluice_model::TaskSpec>(body)
        .unwrap()
        .into_submission(None, &sluice_model::Limits::default())
        .unwrap()
}

#[test]
fn an_export_holds_each_ended_tasks_submission_service_time_and_failed_attempts() {
    use super::export::{EventFold, export, failure_class};
    use sluice_engine::sim::Driver;
    use sluice_engine::{EngineOptions, Report};
    use sluice_model::{Heartbeat, State};
    let mut driver = Driver::new(1, EngineOptions::default());
    let urgent = driver
        .submit(submission(serde_json::json!({
            "kind": "oct.scan", "priority": "urgent", "tenant": "site-1",
            "device": "scanner-1", "est_exec_ms": 500,
            "resources": {"gpu_memory_mb": 0, "model": "seg-v3"},
        })))
        .unwrap()
        .task
        .id;
    driver.advance_to(driver.now_ms() + 100);
    let low = driver
        .submit(submission(serde_json::json!({
            "kind": "oct.scan", "priority": "low", "tenant": "site-2", "est_exec_ms": 900,
        })))
        .unwrap()
        .task
        .id;
    let never_run = driver
        .submit(submission(serde_json::json!({"kind": "other.kind"})))
        .unwrap()
        .task
        .id;
    let worker = Heartbeat {
        max_concurrency: 2,
        kinds: vec!["oct.scan".into()],
        ..Heartbeat::default()
    };
    driver.heartbeat("w", worker.clone()).unwrap();
    let leases = driver.claim("w", 2).unwrap().leases;
    let token = |id| {
        let task: &sluice_model::Task = leases.iter().find(|t| t.id == id).unwrap();
        task.lease.as_ref().unwrap().token.clone()
    };
    let (urgent_token, low_token) = (token(urgent), token(low));
    driver.advance_to(driver.now_ms() + 50);
    driver.report(urgent, &urgent_token, Report::Start).unwrap();
    driver.advance_to(driver.now_ms() + 300);
    let complete = || Report::Complete {
        result: serde_json::json!({}),
    };
    driver.report(urgent, &urgent_token, complete()).unwrap();
    let fail = Report::Fail {
        class: FailureClass::NodeBusy,
        message: "busy".into(),
    };
    driver.report(low, &low_token, fail).unwrap();
    // Past the retry delay, it runs again and completes after 400 ms.
    while driver.task(low).unwrap().state != State::Queued {
        driver.tick(60_000);
    }
    driver.heartbeat("w", worker).unwrap();
    let again = driver.claim("w", 1).unwrap().leases;
    assert_eq!(again[0].id, low);
    let token = again[0].lease.as_ref().unwrap().token.clone();
    driver.advance_to(driver.now_ms() + 400);
    driver.report(low, &token, complete()).unwrap();

    let mut fold = EventFold::default();
    for event in driver.store().events() {
        fold.add(event);
    }
    let tasks: Vec<sluice_model::Task> = driver.store().tasks().cloned().collect();
    let (trace, skipped) = export(tasks, &fold, None);
    assert_eq!(
        skipped.unfinished_or_never_ran, 1,
        "{never_run} is still queued"
    );
    let mut expected_urgent = TraceTask::at(0, 300);
    expected_urgent.priority = Priority::Urgent;
    expected_urgent.tenant = "site-1".into();
    expected_urgent.device = "scanner-1".into();
    expected_urgent.est_exec_ms = Some(500);
    expected_urgent.model = Some("seg-v3".into());
    let mut expected_low = TraceTask::at(100, 400);
    expected_low.priority = Priority::Low;
    expected_low.tenant = "site-2".into();
    expected_low.device = "unknown".into();
    expected_low.est_exec_ms = Some(900);
    expected_low.failures = vec![FailureClass::NodeBusy];
    assert_eq!(trace, [expected_urgent, expected_low]);
    // What it writes reads back as a trace.
    assert_eq!(read_all(&written(&trace)).unwrap(), trace);
    assert_eq!(
        failure_class("attempt 3 failed (invalid-input); dead: x, by y"),
        Some(FailureClass::InvalidInput)
    );
    assert_eq!(failure_class("promoted low → normal"), None);
}

#[test]
fn a_recorded_search_reads_back_and_a_bad_one_names_its_line() {
    let mut task = TraceTask::at(0, 20);
    task.kind = "vector.search".into();
    task.search = Some(super::RecordedSearch {
        k: 2,
        children: vec![
            super::RecordedChild {
                weight: 1.0,
                hits: vec![sluice_model::Hit {
                    id: 7,
                    distance: 0.5,
                }],
            },
            super::RecordedChild {
                weight: 0.5,
                hits: Vec::new(),
            },
        ],
    });
    let bytes = written(std::slice::from_ref(&task));
    assert_eq!(read_all(&bytes).unwrap(), [task]);
    for (bad, says) in [
        (r#"{"k": 0, "children": []}"#, "search.k"),
        (
            r#"{"k": 2, "children": [{"weight": -1, "hits": []}]}"#,
            "weight",
        ),
        (r#"{"k": 2, "children": [], "extra": 1}"#, "unknown field"),
    ] {
        let line = format!(r#"{{"submit_ms": 0, "service_ms": 1, "search": {bad}}}"#);
        let error = read_all(line.as_bytes()).unwrap_err().to_string();
        assert!(error.contains("line 1") && error.contains(says), "{error}");
    }
}

/// Rows in the published format of the Alibaba GPU 2023 pod list (`openb_pod_list_default`,
/// times in seconds): pods running for months beside minutes, a pending pod never scheduled,
/// one without a deletion time.
const POD_LIST: &str = "\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0
openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497
openb-pod-0022,4000,15258,1,220,,BE,Running,9679175,9973826,9679175
openb-pod-0033,3152,5600,1,1000,,BE,Failed,9965463,9965645,9965463
openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,
openb-pod-0063,12000,24576,1,1000,,LS,Running,10001854,10043044,10002793
openb-pod-0129,12000,24576,1,1000,,Guaranteed,Running,10035396,10036353,10035396
openb-pod-9999,1000,2048,0,0,,BE,Running,10040000,,10040001
";

const POD_COLUMNS: &str = "submit=creation_time,start=scheduled_time,end=deletion_time,\
    priority=qos:LS=urgent/Guaranteed=normal/Burstable=normal/BE=low,gpus=num_gpu,device=name";

#[test]
fn the_alibaba_pod_list_imports_with_long_pods_clipped_and_unusable_rows_counted() {
    let columns: Columns = POD_COLUMNS.parse().unwrap();
    // By default the first unusable row refuses the file, named.
    let error = import(POD_LIST.as_bytes(), &columns, TimeUnit::Seconds, 100, false)
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("row 6: scheduled_time is empty"),
        "{error}"
    );
    let imported = import(POD_LIST.as_bytes(), &columns, TimeUnit::Seconds, 100, true).unwrap();
    let skipped: Vec<(&str, u64)> = imported
        .skipped
        .iter()
        .map(|(reason, n)| (reason.as_str(), *n))
        .collect();
    assert_eq!(skipped, [("no deletion_time", 1), ("no scheduled_time", 1)]);
    // Every row with all three times is kept; service runs from scheduling to deletion.
    let seen: Vec<(&str, u64, u64, Priority, u32)> = imported
        .tasks
        .iter()
        .map(|t| {
            (
                t.device.as_str(),
                t.submit_ms,
                t.service_ms,
                t.priority,
                t.gpus,
            )
        })
        .collect();
    let day = MAX_SERVICE_MS;
    assert_eq!(
        seen,
        [
            ("openb-pod-0000", 0, day, Priority::Urgent, 1),
            ("openb-pod-0017", 9_437_497_000, day, Priority::Normal, 8),
            ("openb-pod-0022", 9_679_175_000, day, Priority::Low, 1),
            ("openb-pod-0033", 9_965_463_000, 182_000, Priority::Low, 1),
            (
                "openb-pod-0063",
                10_001_854_000,
                40_251_000,
                Priority::Urgent,
                1
            ),
            (
                "openb-pod-0129",
                10_035_396_000,
                957_000,
                Priority::Normal,
                1
            ),
        ]
    );
    assert_eq!(imported.clipped, 3);
    assert_eq!(imported.longest_clipped_ms, 12_537_496_000);

    // And the simulator replays it to the end, through four months of virtual time.
    let trace = crate::replay::Trace::from_tasks(imported.tasks).unwrap();
    let options = crate::replay::ReplayOptions {
        workers: "2x8".parse().unwrap(),
        ..crate::replay::ReplayOptions::default()
    };
    let variant = crate::replay::Variant::pair(Vec::new(), Vec::new())
        .unwrap()
        .remove(0);
    let outcome = crate::replay::run(&trace, &variant, &options).unwrap();
    assert!(outcome.drained);
    assert_eq!(outcome.tally.ended.values().sum::<u64>(), 6);
}

#[test]
fn a_start_column_goes_with_an_end_column() {
    let error = "submit=a,start=b,service=c"
        .parse::<Columns>()
        .unwrap_err()
        .to_string();
    assert!(error.contains("start goes with end"), "{error}");
    // An end before its start is its own reason.
    let columns: Columns = "submit=s,start=b,end=e".parse().unwrap();
    let csv = "s,b,e\n0,10,5\n1,2,3\n";
    let error = import(csv.as_bytes(), &columns, TimeUnit::Seconds, 10, false)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("row 2: e is before b"), "{error}");
    let imported = import(csv.as_bytes(), &columns, TimeUnit::Seconds, 10, true).unwrap();
    assert_eq!(imported.tasks.len(), 1);
    assert_eq!(imported.skipped["e before b"], 1);
}
