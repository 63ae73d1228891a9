//! `sluice trace gen` and `sluice trace import` through the real binary: generated traces
//! replay from their seed, and a CSV the test writes imports through a column mapping.

use sluice_tests::*;

#[test]
fn trace_gen_replays_from_its_seed() {
    let generated = |seed: &str| {
        let args = [
            "trace", "gen", "--tasks", "3000", "--seed", seed, "--shape", "burst",
        ];
        succeeded(run_sluice(&args, &[]))
    };
    let first = generated("5");
    assert_eq!(first, generated("5"), "the same seed writes the same bytes");
    assert_ne!(first, generated("6"));
    let tasks: Vec<Value> = first
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(tasks.len(), 3000);
    let times: Vec<u64> = tasks
        .iter()
        .map(|t| t["submit_ms"].as_u64().unwrap())
        .collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "in submission order"
    );
    let refused = run_sluice(&["trace", "gen", "--tasks", "0"], &[]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--tasks must be"));
}

#[test]
fn trace_import_reads_a_csv_through_its_column_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("jobs.csv");
    std::fs::write(
        &csv,
        "job,submitted,ran_for,qos,team\n\
         j1,1700000100,20,high,vision\n\
         j2,1700000040,5.5,low,retina\n\
         j3,1700000040,1,mid,vision\n",
    )
    .unwrap();
    let out = dir.path().join("trace.jsonl");
    let columns =
        "submit=submitted,service=ran_for,priority=qos:high=urgent/mid=normal/low=low,tenant=team";
    let csv_arg = csv.to_str().unwrap();
    let out_arg = out.to_str().unwrap();
    let args = [
        "trace",
        "import",
        "--csv",
        csv_arg,
        "--columns",
        columns,
        "--out",
        out_arg,
    ];
    succeeded(run_sluice(&args, &[]));
    let trace = std::fs::read_to_string(&out).unwrap();
    let tasks: Vec<Value> = trace
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(u64, u64, &str, &str)> = tasks
        .iter()
        .map(|t| {
            (
                t["submit_ms"].as_u64().unwrap(),
                t["service_ms"].as_u64().unwrap(),
                t["priority"].as_str().unwrap(),
                t["tenant"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (0, 5_500, "low", "retina"),
            (0, 1_000, "normal", "vision"),
            (60_000, 20_000, "urgent", "vision")
        ]
    );
    // A value the map does not name is refused with its row.
    let unmapped = "submit=submitted,service=ran_for,priority=qos:high=urgent/low=low";
    let args = ["trace", "import", "--csv", csv_arg, "--columns", unmapped];
    let refused = run_sluice(&args, &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("row 4") && stderr.contains("\"mid\""),
        "{stderr}"
    );
}
