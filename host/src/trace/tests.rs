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
    let cases: [(&[u8], &str); 6] = [
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
    let tasks = import(CSV.as_bytes(), &columns(), TimeUnit::Seconds, 10).unwrap();
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
    let tasks = import(ends.as_bytes(), &by_end, TimeUnit::Millis, 10).unwrap();
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
    let error = import(CSV.as_bytes(), &missing, TimeUnit::Seconds, 10).unwrap_err();
    assert!(
        matches!(error, ImportError::NoColumn(ref c, _) if c == "start"),
        "{error}"
    );
    let unmapped = CSV.replace(",1,alice,\n", ",7,alice,\n");
    let error = import(unmapped.as_bytes(), &columns(), TimeUnit::Seconds, 10).unwrap_err();
    assert_eq!(
        error.to_string(),
        "row 4: priority \"7\" is not in the value map"
    );
    let negative = CSV.replace(",30,", ",-30,");
    let error = import(negative.as_bytes(), &columns(), TimeUnit::Seconds, 10).unwrap_err();
    assert!(error.to_string().starts_with("row 2: "), "{error}");
    let error = import(CSV.as_bytes(), &columns(), TimeUnit::Seconds, 2).unwrap_err();
    assert!(matches!(error, ImportError::TooMany(2)), "{error}");
}
